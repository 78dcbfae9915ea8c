package worker

import (
	"container/heap"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// pending is a received task waiting to run: held for its ETA, or ready.
type pending struct {
	d        *transport.Delivery
	m        *protocol.TaskMessage
	h        Handler
	opts     TaskOptions
	due      time.Time
	seq      uint64
	queueIdx int
	index    int // in the ETA heap
	eta      bool
	stage    stage
	// tokenAt is when the task's global rate-limit token came due (zero:
	// no global limit); a task that starts much later re-reserves.
	tokenAt time.Time
}

// stage is how far a received task got on its way to the ready queue:
// countdown/ETA first, then the per-worker rate limit, then the global one.
type stage uint8

const (
	stageNew stage = iota
	stageETA
	stageLocalRate
	stageGlobalRate
)

// loop is the worker's single-threaded event loop: it owns the ready queue,
// the ETA heap and the concurrency count, so none of them needs a lock.
type loop struct {
	w          *Worker
	cons       transport.Consumer
	deliveries <-chan *transport.Delivery // cons's
	// drained carries what consumers replaced by the watchdog still
	// deliver (retire).
	drained  chan *transport.Delivery
	wd       watchdog
	queueIdx map[string]int

	held    etaHeap
	ready   readyQueue
	running int
	seq     uint64

	heldETA     int
	prefetch    int
	prefetchSet int

	slotDone    chan *slot
	slots       []*slot // every pooled goroutine
	idle        []*slot // those waiting for a task
	poolWG      sync.WaitGroup
	concurrency int
	auto        *autoscaler // nil unless Config.AutoscaleMax
	timer       *time.Timer
	// tasks counts running tasks and background settle work.
	tasks tally

	rates rateLimits
	// calls runs functions on the loop goroutine: results of background
	// work (global rate-limit reservations) and remote-control requests.
	calls chan func()
	done  chan struct{}
	// awaiting holds tasks whose global rate-limit reservation is in flight,
	// so that a shutdown can return them to the broker.
	awaiting map[*pending]struct{}
}

func newLoop(w *Worker, cons transport.Consumer) *loop {
	l := &loop{
		w:           w,
		cons:        cons,
		deliveries:  cons.Deliveries(),
		drained:     make(chan *transport.Delivery),
		queueIdx:    make(map[string]int, len(w.cfg.Queues)),
		slotDone:    make(chan *slot),
		concurrency: w.cfg.Concurrency,
		auto:        newAutoscaler(w.cfg),
		prefetch:    w.cfg.prefetch(),
		prefetchSet: w.cfg.prefetch(),
		calls:       make(chan func()),
		done:        make(chan struct{}),
		awaiting:    make(map[*pending]struct{}),
	}
	for i, q := range w.cfg.Queues {
		l.queueIdx[q] = i
	}
	l.ready.init(len(w.cfg.Queues), w.cfg.QueueOrder, w.cfg.weights())
	return l
}

func (l *loop) run(ctx context.Context) error {
	var consumeErr error
	l.startWatchdog(time.Now())
	if l.auto != nil {
		defer func() {
			if l.auto.ticker != nil {
				l.auto.ticker.Stop()
			}
		}()
	}
	for {
		l.dispatch()
		l.applyPrefetch(ctx)
		select {
		case d, ok := <-l.deliveries:
			if !ok {
				consumeErr = l.cons.Err()
				if consumeErr == nil {
					consumeErr = errors.New("worker: consumer stopped")
				}
				l.w.log.Error("consumer closed; shutting down", zap.Error(consumeErr))
				return errors.Join(consumeErr, l.shutdown(false))
			}
			l.progressed(time.Now())
			l.receive(ctx, d)
			l.maybeScale(time.Now())
		case d := <-l.drained:
			l.progressed(time.Now())
			l.receive(ctx, d)
			l.maybeScale(time.Now())
		case now := <-l.watchdogC():
			l.checkProgress(now)
		case now := <-l.autoscaleTick():
			l.maybeScale(now)
		case <-l.timerC():
			l.timer = nil
			l.promote(time.Now())
		case s := <-l.slotDone:
			l.running--
			l.idle = append(l.idle, s)
		case f := <-l.calls:
			f()
		case <-ctx.Done():
			return l.shutdown(false)
		case <-l.w.shutdown:
			return l.shutdown(false)
		case <-l.w.cold:
			return l.shutdown(true)
		}
	}
}

func (l *loop) timerC() <-chan time.Time {
	if len(l.held) == 0 {
		if l.timer != nil {
			l.timer.Stop()
			l.timer = nil
		}
		return nil
	}
	next := l.held[0].due
	if l.timer == nil {
		l.timer = time.NewTimer(time.Until(next))
	} else {
		l.timer.Reset(time.Until(next))
	}
	return l.timer.C
}

// receive decodes and classifies one delivery.
func (l *loop) receive(ctx context.Context, d *transport.Delivery) {
	w := l.w
	m, err := protocol.DecodeTask(&d.Message, protocol.DecodeOptions{
		Accept:      w.cfg.Accept,
		MaxBodySize: w.cfg.MaxMessageSize,
		MaxDepth:    w.cfg.MaxNestingDepth,
	})
	if err != nil {
		l.background(func() { w.rejectInvalid(d, err) })
		return
	}
	h, opts, ok := w.mux.lookup(m.Name)
	if !ok {
		h, opts, ok = w.builtin(m.Name)
	}
	if !ok {
		l.background(func() { w.rejectUnknown(d, m) })
		return
	}
	now := time.Now()
	w.cfg.Observer.TaskReceived(m.Name)
	if w.events.taskOn() {
		w.events.task("task-received", taskReceivedFields(m))
	}
	if w.revoked.contains(now, m.ID) {
		l.background(func() { w.revoke(d, m, "revoked") })
		return
	}
	if !m.Expires.IsZero() && now.After(m.Expires) {
		l.background(func() { w.revoke(d, m, "expired") })
		return
	}
	l.seq++
	p := &pending{d: d, m: m, h: h, opts: opts, seq: l.seq, queueIdx: l.queueIdx[d.Queue]}
	l.advance(ctx, p, now)
}

// advance moves a task through its stages: held until its ETA, then until
// its per-worker rate limit allows it, then until the global rate limit
// does, then ready. Waiting never takes a concurrency slot.
func (l *loop) advance(ctx context.Context, p *pending, now time.Time) {
	w := l.w
	if p.stage < stageETA {
		p.stage = stageETA
		if eta := p.m.ETA; !eta.IsZero() && eta.After(now) {
			p.eta = true
			l.heldETA++
			l.wantPrefetch()
			due := eta
			if exp := p.m.Expires; !exp.IsZero() && exp.Before(eta) {
				// It will expire before it may run: wake up at the expiry to
				// report REVOKED then, not at the ETA.
				due = exp
			}
			l.hold(p, due)
			w.cfg.Observer.TaskWaiting(p.m.Name, WaitETA, eta.Sub(now))
			w.log.Debug("task held until eta", taskFields(p.m, p.d)...)
			return
		}
	}
	if p.stage < stageLocalRate {
		p.stage = stageLocalRate
		if rate := p.opts.rate; !rate.IsZero() {
			if at := l.rates.reserve(p.m.Name, rate, now); at.After(now) {
				l.hold(p, at)
				w.cfg.Observer.TaskWaiting(p.m.Name, WaitRateLimit, at.Sub(now))
				w.log.Debug("task waits for its rate limit", append(taskFields(p.m, p.d),
					zap.String("rate_limit", rate.String()), zap.Duration("wait", at.Sub(now)))...)
				return
			}
		}
	}
	if p.stage < stageGlobalRate {
		p.stage = stageGlobalRate
		if rate := p.opts.globalRate; !rate.IsZero() && w.cfg.GlobalRateLimiter != nil {
			l.reserveGlobal(ctx, p, rate)
			return
		}
	}
	l.ready.push(p)
}

func (l *loop) hold(p *pending, due time.Time) {
	p.due = due
	heap.Push(&l.held, p)
}

// reserveGlobal asks the shared limiter for a token off the loop and comes
// back to the loop with the answer.
func (l *loop) reserveGlobal(ctx context.Context, p *pending, rate Rate) {
	w := l.w
	key := p.opts.GlobalRateKey
	if key == "" {
		key = p.m.Name
	}
	burst := max(p.opts.GlobalRateBurst, 1)
	l.awaiting[p] = struct{}{}
	l.background(func() {
		wait, err := w.cfg.GlobalRateLimiter.Reserve(ctx, key, rate.N, rate.Per, burst)
		l.call(func() {
			if _, ok := l.awaiting[p]; !ok {
				return // returned to the broker by a shutdown
			}
			delete(l.awaiting, p)
			now := time.Now()
			if err != nil {
				// Fail open, loudly: a limiter outage must not stop the
				// worker, and the per-worker limit still applies.
				w.log.Error("global rate limiter unavailable; running the task without it",
					append(taskFields(p.m, p.d), zap.String("key", key), zap.Error(err))...)
				l.ready.push(p)
				return
			}
			p.tokenAt = now.Add(wait)
			if wait > 0 {
				w.cfg.Observer.TaskWaiting(p.m.Name, WaitGlobalRate, wait)
				w.log.Debug("task waits for its global rate limit", append(taskFields(p.m, p.d),
					zap.String("key", key), zap.Duration("wait", wait))...)
				l.hold(p, p.tokenAt)
				return
			}
			l.ready.push(p)
		})
	})
}

// call runs f on the loop goroutine, unless the loop has exited.
func (l *loop) call(f func()) bool {
	select {
	case l.calls <- f:
		return true
	case <-l.done:
		return false
	}
}

// promote moves held tasks that are due on to their next stage.
func (l *loop) promote(now time.Time) {
	for len(l.held) > 0 && !l.held[0].due.After(now) {
		p := heap.Pop(&l.held).(*pending)
		if p.eta {
			l.heldETA--
			p.eta = false
			l.wantPrefetch()
		}
		if exp := p.m.Expires; !exp.IsZero() && now.After(exp) {
			l.background(func() { l.w.revoke(p.d, p.m, "expired") })
			continue
		}
		if l.w.revoked.contains(now, p.m.ID) {
			l.background(func() { l.w.revoke(p.d, p.m, "revoked") })
			continue
		}
		l.advance(context.Background(), p, now)
	}
}

// wantPrefetch recomputes the prefetch Celery's way: one more per held ETA
// task, up to ETATaskLimit.
func (l *loop) wantPrefetch() {
	base := l.w.cfg.prefetch()
	if l.auto != nil && base > 0 {
		// control autoscale moves the max, and the prefetch with it.
		base = l.auto.max * l.w.cfg.PrefetchMultiplier
		if base > 65535 {
			base = 0
		}
	}
	if base == 0 {
		return
	}
	extra := l.heldETA
	if lim := l.w.cfg.ETATaskLimit; lim > 0 && extra > lim {
		extra = lim
	}
	l.prefetch = base + extra
}

// applyPrefetch sends the prefetch to the broker when it changed; changes
// are coalesced over one loop iteration, like Celery's lazy QoS updates.
func (l *loop) applyPrefetch(ctx context.Context) {
	if l.prefetch == l.prefetchSet {
		return
	}
	if err := l.cons.SetPrefetch(l.prefetch); err != nil {
		l.w.log.Warn("cannot change prefetch", zap.Int("prefetch", l.prefetch), zap.Error(err))
		return
	}
	l.prefetchSet = l.prefetch
}

// minStaleToken is the least lateness that makes a global token stale (see
// staleToken); below it, scheduling noise would waste tokens.
const minStaleToken = 50 * time.Millisecond

// staleToken reports whether p's global rate-limit token is too old to
// start on. The limiter spaces tokens, not starts: a task that could not
// start when its token came due (every slot busy, or the process stalled)
// would start together with the tasks whose tokens came due meanwhile, and
// that bunch breaks the cap. A task later than one token interval takes a
// new token instead, so that in any window the starts exceed the rate by
// at most the burst plus one token.
func (l *loop) staleToken(p *pending, now time.Time) bool {
	if p.tokenAt.IsZero() {
		return false
	}
	return now.Sub(p.tokenAt) > max(p.opts.globalRate.Interval(), minStaleToken)
}

// dropRevoked removes revoked tasks from the ETA heap and the ready queue
// at once, storing REVOKED, so a client sees the revoke without waiting for
// the task's ETA.
func (l *loop) dropRevoked() {
	now := time.Now()
	var drop []*pending
	kept := l.held[:0]
	for _, p := range l.held {
		if l.w.revoked.contains(now, p.m.ID) {
			drop = append(drop, p)
			if p.eta {
				l.heldETA--
			}
			continue
		}
		kept = append(kept, p)
	}
	l.held = kept
	heap.Init(&l.held)
	for i, q := range l.ready.qs {
		keptQ := q[:0]
		for _, p := range q {
			if l.w.revoked.contains(now, p.m.ID) {
				drop = append(drop, p)
				l.ready.n--
				continue
			}
			keptQ = append(keptQ, p)
		}
		l.ready.qs[i] = keptQ
	}
	l.wantPrefetch()
	for _, p := range drop {
		p := p
		l.background(func() { l.w.revoke(p.d, p.m, "revoked") })
	}
}

// addQueue starts consuming another queue (add_consumer).
func (l *loop) addQueue(name string) error {
	// The consumer, not queueIdx, says what is consumed: a queue cancelled
	// with cancel_consumer keeps its index (tasks of it may still be
	// ready) and must be consumed again when it is added back.
	if slices.ContainsFunc(l.cons.Queues(), func(q transport.Queue) bool { return q.Name == name }) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.cons.AddQueue(ctx, l.w.cfg.queue(name)); err != nil {
		return err
	}
	if _, ok := l.queueIdx[name]; ok {
		return nil
	}
	l.queueIdx[name] = len(l.ready.qs)
	l.ready.qs = append(l.ready.qs, nil)
	l.ready.weights = append(l.ready.weights, max(1, l.w.cfg.QueueWeights[name]))
	l.ready.current = append(l.ready.current, 0)
	return nil
}

// cancelQueue stops consuming a queue (cancel_consumer). Tasks already
// received from it still run.
func (l *loop) cancelQueue(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return l.cons.CancelQueue(ctx, name)
}

// background runs settle-only work (invalid, unknown, expired messages) off
// the loop. The prefetch bound limits how many can be in flight.
func (l *loop) background(f func()) {
	l.tasks.add()
	go func() {
		defer l.tasks.done()
		f()
	}()
}

// etaHeap orders held tasks by due time, then arrival.
type etaHeap []*pending

func (h etaHeap) Len() int { return len(h) }

func (h etaHeap) Less(i, j int) bool {
	if h[i].due.Equal(h[j].due) {
		return h[i].seq < h[j].seq
	}
	return h[i].due.Before(h[j].due)
}

func (h etaHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *etaHeap) Push(x any) {
	p := x.(*pending)
	p.index = len(*h)
	*h = append(*h, p)
}

func (h *etaHeap) Pop() any {
	old := *h
	n := len(old)
	p := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	p.index = -1
	return p
}

// readyQueue holds tasks ready to run, one FIFO per consumed queue. pop
// picks the queue by the configured order: the oldest task overall (Celery's
// behaviour), the first queue with work (strict), or smooth weighted
// round-robin between queues with work (weighted).
type readyQueue struct {
	qs      [][]*pending
	n       int
	order   QueueOrder
	weights []int
	current []int // smooth weighted round-robin state
}

func (r *readyQueue) init(n int, order QueueOrder, weights []int) {
	if n < 1 {
		n = 1
	}
	r.qs = make([][]*pending, n)
	r.order = order
	r.weights = make([]int, n)
	r.current = make([]int, n)
	for i := range r.weights {
		r.weights[i] = 1
		if i < len(weights) && weights[i] > 0 {
			r.weights[i] = weights[i]
		}
	}
}

func (r *readyQueue) len() int { return r.n }

func (r *readyQueue) push(p *pending) {
	i := p.queueIdx
	if i < 0 || i >= len(r.qs) {
		i = 0
	}
	r.qs[i] = append(r.qs[i], p)
	r.n++
}

func (r *readyQueue) pop() *pending {
	if r.n == 0 {
		return nil
	}
	best := -1
	switch r.order {
	case QueueOrderStrict:
		for i, q := range r.qs {
			if len(q) > 0 {
				best = i
				break
			}
		}
	case QueueOrderWeighted:
		total := 0
		for i, q := range r.qs {
			if len(q) == 0 {
				continue
			}
			r.current[i] += r.weights[i]
			total += r.weights[i]
			if best < 0 || r.current[i] > r.current[best] {
				best = i
			}
		}
		r.current[best] -= total
	default:
		for i, q := range r.qs {
			if len(q) > 0 && (best < 0 || q[0].seq < r.qs[best][0].seq) {
				best = i
			}
		}
	}
	q := r.qs[best]
	p := q[0]
	q[0] = nil
	r.qs[best] = q[1:]
	if len(r.qs[best]) == 0 {
		r.qs[best] = q[:0:0]
	}
	r.n--
	return p
}
