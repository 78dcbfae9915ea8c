package worker

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// dispatch starts ready tasks while slots are free.
//
// Tasks run on a pool of long-lived goroutines, one per slot in use, that
// go back to the pool when their task ends: a fresh goroutine per task
// would grow (copy) its stack through the deep execute path every time.
func (l *loop) dispatch() {
	var now time.Time
	for l.running < l.concurrency {
		p := l.ready.pop()
		if p == nil {
			return
		}
		if now.IsZero() {
			now = time.Now()
		}
		if l.staleToken(p, now) {
			if ce := l.w.log.Check(zap.DebugLevel, "global rate-limit token went stale before the task could start; reserving again"); ce != nil {
				ce.Write(append(taskFields(p.m, p.d), zap.Duration("late", now.Sub(p.tokenAt)))...)
			}
			p.tokenAt = time.Time{}
			l.reserveGlobal(context.Background(), p, p.opts.globalRate)
			continue
		}
		l.running++
		l.tasks.add()
		var s *slot
		if n := len(l.idle); n > 0 {
			s, l.idle = l.idle[n-1], l.idle[:n-1]
		} else {
			s = &slot{work: make(chan *pending, 1)}
			l.slots = append(l.slots, s)
			l.poolWG.Add(1)
			go l.serve(s)
		}
		s.work <- p
	}
}

// slot is a pooled task goroutine.
type slot struct {
	work chan *pending
}

func (l *loop) serve(s *slot) {
	defer l.poolWG.Done()
	for p := range s.work {
		l.w.execute(p)
		l.tasks.done()
		// Once the loop has stopped (shutdown) nobody takes the slot back:
		// wait for the pool to close instead, however many slots there are.
		select {
		case l.slotDone <- s:
		case <-l.done:
		}
	}
}

// closePool ends the pooled goroutines and, when no task is left running,
// waits for them, so that none outlives Run; a goroutine still stuck in an
// abandoned handler exits when that handler returns.
func (l *loop) closePool() {
	for _, s := range l.slots {
		close(s.work)
	}
	l.slots, l.idle = nil, nil
	select {
	case <-l.tasks.idle():
		l.poolWG.Wait()
	default:
	}
}

// tally counts work in progress and tells when there is none, so that a
// shutdown can wait for it with a deadline (a WaitGroup cannot be waited on
// with one without a goroutine that outlives the wait).
type tally struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed while n == 0
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (t *tally) add() {
	t.mu.Lock()
	if t.n == 0 {
		t.zero = make(chan struct{})
	}
	t.n++
	t.mu.Unlock()
}

func (t *tally) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 {
		close(t.zero)
	}
	t.mu.Unlock()
}

// idle returns a channel that is closed once nothing is in progress. It
// may be closed already; a later add does not reopen it.
func (t *tally) idle() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		return closedChan
	}
	return t.zero
}

func (t *tally) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}
