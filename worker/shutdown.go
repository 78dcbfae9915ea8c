package worker

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/transport"
)

// shutdown stops fetching, returns what has not started to the broker and
// waits for running tasks: up to ShutdownTimeout (not at all when cold),
// then it cancels them and waits abandonGrace more, then gives up on what
// still runs.
func (l *loop) shutdown(cold bool) error {
	// Nothing is dispatched from here on: the pooled goroutines go as soon
	// as their current task ends, and Run waits for them unless it gave up
	// on a task (whose slot ends when its handler returns).
	defer l.closePool()
	l.stopWatchdog()
	w := l.w
	w.log.Info("worker shutting down", zap.Bool("cold", cold), zap.Int("running", l.running),
		zap.Int("held", len(l.held)), zap.Int("ready", l.ready.len()))
	// One budget for stopping and for returning every unstarted message:
	// this step starts now, whatever ran before.
	sctx, cancel := w.settleCtx()
	defer cancel()
	if err := l.cons.Stop(sctx); err != nil {
		w.log.Warn("stopping the consumer", zap.Error(err))
	}
	var requeue []*transport.Delivery
	// Deliveries already handed to the channel before Stop are ours too.
	for d := range l.cons.Deliveries() {
		requeue = append(requeue, d)
	}
	for _, p := range l.held {
		requeue = append(requeue, p.d)
	}
	l.held = nil
	for p := range l.awaiting {
		requeue = append(requeue, p.d)
	}
	clear(l.awaiting)
	close(l.done)
	for p := l.ready.pop(); p != nil; p = l.ready.pop() {
		requeue = append(requeue, p.d)
	}
	returned := 0
	for _, d := range requeue {
		if err := persistWithin(sctx, func(ctx context.Context) error { return d.Reject(ctx, true) }); err != nil {
			id, _ := d.Message.Headers["id"].(string)
			w.log.Warn("returning a message to the broker failed; the broker will deliver it again",
				zap.String("task_id", id), zap.String("delivery_tag", d.Tag), zap.Error(err))
			continue
		}
		returned++
	}
	if len(requeue) > 0 {
		w.log.Info("returned unstarted messages to the broker", zap.Int("count", returned), zap.Int("failed", len(requeue)-returned))
	}
	if l.timer != nil {
		l.timer.Stop()
	}

	grace := w.cfg.ShutdownTimeout
	if cold {
		grace = 0
	}
	if l.idleWithin(grace, w.cold) {
		return nil
	}
	cancelled := w.cancelActive(ErrShutdown)
	w.log.Warn("shutdown: cancelled running tasks", zap.Int("count", cancelled), zap.Bool("cold", cold))
	// Handlers that honour ctx return promptly; give them a moment.
	if !l.idleWithin(abandonGrace, nil) {
		// Give up on what still runs: settle steps in flight stop at once
		// (their acks_late messages stay unacknowledged and come back from
		// the broker), and a handler that ignores its context is left to
		// itself, its outcome unrecorded.
		w.markAbandoned()
		w.abortSettle()
		l.idleWithin(abandonGrace, nil)
	}
	abandoned := w.handlers.count()
	if abandoned > 0 {
		w.log.Error("shutdown: tasks still running after cancellation; abandoning them", zap.Int("count", abandoned))
	}
	return &ShutdownError{Cancelled: cancelled, Abandoned: abandoned}
}

// abandonGrace is how long a shutdown waits for cancelled tasks to return.
const abandonGrace = 5 * time.Second

// idleWithin waits until no task runs and no handler call is left, for at
// most d or until stop is closed, and reports whether that happened.
func (l *loop) idleWithin(d time.Duration, stop <-chan struct{}) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-l.tasks.idle():
		case <-timer.C:
			return false
		case <-stop:
			return false
		}
		select {
		case <-l.w.handlers.idle():
			return true
		case <-timer.C:
			return false
		case <-stop:
			return false
		}
	}
}

// cancelActive cancels every running task's context and returns how many
// runs there were.
func (w *Worker) cancelActive(cause error) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	for a := range w.active {
		a.cancel(cause)
	}
	return len(w.active)
}

// markAbandoned flags every run still active as given up on by Run.
func (w *Worker) markAbandoned() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for a := range w.active {
		a.abandoned.Store(true)
	}
}
