package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"time"

	"go.opentelemetry.io/otel/trace"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// run describes one execution of a task: one delivery, from the slot that
// took it to its settlement. Two deliveries of one task id are two runs.
type run struct {
	p        *pending
	t        *Task
	a        *activeTask
	span     trace.Span // nil when tracing is off
	acksLate bool
	acked    bool
	runtime  time.Duration
	log      *zap.Logger
}

// logAt logs a task line with the task's id, name, retries and queue. The
// fields are only built when the level is enabled: at a high rate of tasks
// a logger.With per task would cost more than the task.
func (r *run) logAt(lvl zapcore.Level, msg string, fields ...zap.Field) {
	if ce := r.log.Check(lvl, msg); ce != nil {
		// A new slice, not fields: storing into the variadic argument would
		// make every caller's slice escape, an allocation per log call even
		// when the level is off.
		all := append(taskFields(r.p.m, r.p.d), fields...)
		if r.span != nil {
			all = append(all, traceFields(r.span)...)
		}
		ce.Write(all...)
	}
}

func deliveryInfo(d *transport.Delivery, m *protocol.TaskMessage) DeliveryInfo {
	return DeliveryInfo{
		Queue:       d.Queue,
		Exchange:    d.Exchange,
		RoutingKey:  d.RoutingKey,
		Priority:    m.Priority,
		Redelivered: d.Redelivered,
	}
}

// execute runs one ready task from start to settlement. The handler's time
// and each settle step's budget are separate: a step's budget starts when
// that step starts (see persist), however long the handler ran.
func (w *Worker) execute(p *pending) {
	m := p.m
	t := newTask(m, deliveryInfo(p.d, m), w.cfg.Hostname)
	r := &run{p: p, t: t, log: w.log}
	r.acksLate = w.cfg.AcksLate
	if p.opts.AcksLate != nil {
		r.acksLate = *p.opts.AcksLate
	}

	if w.revoked.contains(time.Now(), m.ID) {
		w.revoke(p.d, m, "revoked")
		return
	}
	if !m.Expires.IsZero() && time.Now().After(m.Expires) {
		w.revoke(p.d, m, "expired")
		return
	}
	if !r.acksLate {
		// Early ack (Celery's default): once the task starts, a crash does
		// not bring the message back. An ack that cannot be sent leaves
		// the message to the broker, so the task does not run. The task
		// does not wait for the broker's answer, as in Celery's prefork
		// pool, where the parent acknowledges once a child has started the
		// task: on Redis that answer is a round trip (a third of an idle
		// worker's latency). The ack's budget starts with the ack, so a
		// long task does not use it up.
		ackCtx, cancelAck := w.settleCtx()
		defer cancelAck()
		ackWait, err := p.d.AckAsync(ackCtx)
		if err != nil {
			r.logAt(zap.WarnLevel, "early ack failed; not running the task, the broker will redeliver it", zap.Error(err))
			w.cfg.Observer.TaskFinished(m.Name, OutcomeRejected, 0)
			return
		}
		r.acked = true
		defer func() {
			if err := ackWait(ackCtx); err != nil {
				r.logAt(zap.WarnLevel, "early ack failed after the task started; the broker will deliver it again", zap.Error(err))
			}
		}()
	}

	hard, soft := w.limits(m, p.opts)
	ctx, cancel := context.WithCancelCause(context.WithValue(w.cfg.BaseContext(), taskKey{}, t))
	defer cancel(nil)
	if w.tracing != nil {
		// The span covers the run and its settlement, as Python's ends at
		// postrun, after the result is stored.
		ctx, r.span = startRun(w.tracing, ctx, m, p.d, w.cfg.Hostname)
		defer r.span.End()
	}
	if soft > 0 {
		var cancelSoft context.CancelFunc
		ctx, cancelSoft = context.WithTimeoutCause(ctx, soft, ErrSoftTimeLimitExceeded)
		defer cancelSoft()
	}
	r.a = w.setActive(t, p.d, r.acked, cancel)
	defer w.clearActive(r.a)
	w.countTotal(m.Name)
	if w.events.taskOn() {
		w.events.task("task-started", map[string]any{"uuid": m.ID})
	}
	w.cfg.Observer.TaskStarted(m.Name)

	if w.trackStarted(p.opts) {
		w.store(r, protocol.StateStarted, map[string]any{"pid": int64(os.Getpid()), "hostname": w.cfg.Hostname}, "", nil)
	}
	r.logAt(zap.DebugLevel, "task started")
	start := time.Now()
	result, err := w.invoke(ctx, p.h, t, r.a, hard)
	if err != nil && ctx.Err() != nil && context.Cause(ctx) != nil && errors.Is(err, ctx.Err()) {
		// The handler returned its context's error: report why the context
		// ended (soft time limit, revoke, shutdown), not "context canceled".
		err = fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	w.processed.Add(1)
	runtime := time.Since(start)
	r.runtime = runtime
	if w.abandoned(r.a) {
		// Run gave up on this task and has returned: nothing of the worker
		// may act any more. An acks_late message is still unacknowledged
		// and comes back from the broker.
		r.logAt(zap.WarnLevel, "task ended after the worker abandoned it at shutdown; its outcome is not recorded",
			zap.Bool("acked_early", r.acked), zap.Error(err))
		return
	}
	if err != nil && r.a.isTerminated() {
		endRun(r.span, string(protocol.StateRevoked), nil, "")
		w.terminated(r)
		return
	}
	if err != nil && !r.acked && errors.Is(err, ErrShutdown) {
		// A shutdown, not the task, ended the run: an unacknowledged
		// message goes back to the broker to run again elsewhere, rather
		// than being recorded as failed and dead-lettered.
		r.logAt(zap.WarnLevel, "task interrupted by the shutdown; returning it to the broker", zap.Error(err))
		w.cfg.Observer.TaskFinished(m.Name, OutcomeRejected, runtime)
		w.settle(r, settleRequeue)
		return
	}
	w.finish(r, result, err, runtime)
}

// terminated records a task stopped by revoke(terminate=True), as Celery
// does: REVOKED ("terminated") and a task-revoked event.
func (w *Worker) terminated(r *run) {
	m := r.p.m
	r.logAt(zap.InfoLevel, "task terminated by revoke")
	if w.cfg.Backend != nil {
		ex := exceptionOf(&revokedError{why: "terminated"})
		w.storeMeta(r, &protocol.ResultMeta{TaskID: m.ID, Status: protocol.StateRevoked, Result: ex,
			Children: []any{}, DateDone: time.Now().UTC(), ParentID: m.ParentID, GroupID: m.Group}, m.ReplyTo)
	}
	if w.events.taskOn() {
		w.events.task("task-revoked", map[string]any{"uuid": m.ID, "terminated": true, "signum": int64(15), "expired": false})
	}
	w.cfg.Observer.TaskFinished(m.Name, OutcomeRevoked, 0)
	w.settle(r, settleAck)
}

// limits resolves the hard and soft time limits: the message's timelimit
// header wins over the task's options, which win over the worker's.
func (w *Worker) limits(m *protocol.TaskMessage, o TaskOptions) (hard, soft time.Duration) {
	hard, soft = w.cfg.TimeLimit, w.cfg.SoftTimeLimit
	if o.TimeLimit > 0 {
		hard = o.TimeLimit
	}
	if o.SoftTimeLimit > 0 {
		soft = o.SoftTimeLimit
	}
	if m.TimeLimit > 0 {
		hard = m.TimeLimit
	}
	if m.SoftTimeLimit > 0 {
		soft = m.SoftTimeLimit
	}
	return hard, soft
}

// invoke calls the handler, recovering panics. With a hard time limit the
// handler runs in its own goroutine so that the slot can be reclaimed when
// the limit passes even if the handler ignores its context; the abandoned
// goroutine's result is discarded.
func (w *Worker) invoke(ctx context.Context, h Handler, t *Task, a *activeTask, hard time.Duration) (any, error) {
	if hard <= 0 {
		w.handlers.add()
		defer w.handlers.done()
		return callHandler(ctx, h, t)
	}
	type outcome struct {
		v   any
		err error
	}
	ch := make(chan outcome, 1)
	// The handler goroutine is counted until it returns, also when the
	// slot gives up on it: a shutdown must know what still runs.
	w.handlers.add()
	go func() {
		defer w.handlers.done()
		v, err := callHandler(ctx, h, t)
		ch <- outcome{v, err}
	}()
	timer := time.NewTimer(hard)
	defer timer.Stop()
	select {
	case o := <-ch:
		return o.v, o.err
	case <-timer.C:
		a.cancel(ErrTimeLimitExceeded)
		return nil, &timeLimitError{limit: hard.Seconds()}
	}
}

func callHandler(ctx context.Context, h Handler, t *Task) (v any, err error) {
	defer func() {
		if rec := recover(); rec != nil {
			v, err = nil, &PanicError{Value: rec, Stack: debug.Stack()}
		}
	}()
	return h.HandleTask(ctx, t)
}

// finish classifies the outcome and does what Celery does for it.
func (w *Worker) finish(r *run, result any, err error, runtime time.Duration) {
	var rej *RejectError
	switch {
	case err == nil:
		w.succeed(r, result, runtime)
	case errors.Is(err, ErrIgnore):
		endRun(r.span, "IGNORED", nil, "")
		r.logAt(zap.InfoLevel, "task ignored")
		w.cfg.Observer.TaskFinished(r.p.m.Name, OutcomeIgnored, runtime)
		w.settle(r, settleAck)
	case errors.As(err, &rej):
		w.reject(r, rej)
	default:
		d := w.decideRetry(r, err)
		if d.Retry {
			w.retryTask(r, d)
			return
		}
		w.fail(r, d.Err, failReason(d))
	}
}

// setActive records a run as active. Runs are kept per delivery, not per
// task id: a redelivered message can run while its first delivery still
// does, and each run must be cancelled, terminated and cleared on its own.
func (w *Worker) setActive(t *Task, d *transport.Delivery, acked bool, cancel context.CancelCauseFunc) *activeTask {
	a := &activeTask{task: t, delivery: d, acked: acked, started: time.Now(), cancel: cancel}
	w.mu.Lock()
	w.active[a] = struct{}{}
	w.mu.Unlock()
	return a
}

func (w *Worker) countTotal(name string) {
	w.mu.Lock()
	w.totals[name]++
	w.mu.Unlock()
}

// isTerminated reports whether the run was revoked with terminate.
func (a *activeTask) isTerminated() bool { return a.terminated.Load() }

func (w *Worker) clearActive(a *activeTask) {
	w.mu.Lock()
	delete(w.active, a)
	w.mu.Unlock()
}

// abandoned reports whether Run gave up on the run (see loop.shutdown).
func (w *Worker) abandoned(a *activeTask) bool { return a.abandoned.Load() }
