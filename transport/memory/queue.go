package memory

// entry is one message held by the broker: the broker's own copy of the
// message, which nothing outside the broker ever sees (consumers get deep
// copies), plus where it came from.
type entry struct {
	// s is shared by the entries of one publication (fanout) and never
	// modified.
	s          *stored
	exchange   string
	routingKey string
	// priority is the effective priority after clamping to the queue's
	// x-max-priority; it picks the level in readyQueue.
	priority    int
	redelivered bool
}

// deque is a ring buffer of entries. The zero value is empty and usable.
type deque struct {
	buf  []*entry
	head int
	n    int
}

func (d *deque) grow() {
	size := len(d.buf) * 2
	if size == 0 {
		size = 16
	}
	buf := make([]*entry, size)
	for i := 0; i < d.n; i++ {
		buf[i] = d.buf[(d.head+i)%len(d.buf)]
	}
	d.buf, d.head = buf, 0
}

func (d *deque) pushBack(e *entry) {
	if d.n == len(d.buf) {
		d.grow()
	}
	d.buf[(d.head+d.n)%len(d.buf)] = e
	d.n++
}

func (d *deque) pushFront(e *entry) {
	if d.n == len(d.buf) {
		d.grow()
	}
	d.head = (d.head - 1 + len(d.buf)) % len(d.buf)
	d.buf[d.head] = e
	d.n++
}

func (d *deque) popFront() *entry {
	if d.n == 0 {
		return nil
	}
	e := d.buf[d.head]
	d.buf[d.head] = nil // let the message be collected
	d.head = (d.head + 1) % len(d.buf)
	d.n--
	return e
}

// clear empties the deque, keeping a small buffer for reuse.
func (d *deque) clear() {
	if len(d.buf) > 64 {
		d.buf = nil
	} else {
		clear(d.buf)
	}
	d.head, d.n = 0, 0
}

// level is the FIFO of one priority value.
type level struct {
	priority int
	q        deque
}

// readyQueue holds a queue's ready messages: FIFO within a priority, higher
// priority first. Levels are created on first use and kept sorted by
// descending priority; there are at most maxPriority+1 of them.
type readyQueue struct {
	levels []*level
	n      int
}

func (r *readyQueue) level(priority int) *level {
	i := 0
	for ; i < len(r.levels); i++ {
		if r.levels[i].priority == priority {
			return r.levels[i]
		}
		if r.levels[i].priority < priority {
			break
		}
	}
	l := &level{priority: priority}
	r.levels = append(r.levels, nil)
	copy(r.levels[i+1:], r.levels[i:])
	r.levels[i] = l
	return l
}

// pushBack appends e behind every ready message of its priority.
func (r *readyQueue) pushBack(e *entry) {
	r.level(e.priority).q.pushBack(e)
	r.n++
}

// pushFront puts e before every ready message of its priority: where a
// message returned to the queue goes.
func (r *readyQueue) pushFront(e *entry) {
	r.level(e.priority).q.pushFront(e)
	r.n++
}

// pop takes the oldest message of the highest priority, or nil.
func (r *readyQueue) pop() *entry {
	if r.n == 0 {
		return nil
	}
	for _, l := range r.levels {
		if e := l.q.popFront(); e != nil {
			r.n--
			return e
		}
	}
	return nil
}

func (r *readyQueue) len() int { return r.n }

// clear drops every ready message and returns how many there were.
func (r *readyQueue) clear() int {
	n := r.n
	for _, l := range r.levels {
		l.q.clear()
	}
	r.n = 0
	return n
}
