package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/internal/publish"
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

type settleAction int

const (
	settleAck settleAction = iota
	settleDeadLetter
	settleRequeue
)

func (a settleAction) String() string {
	switch a {
	case settleAck:
		return "ack"
	case settleDeadLetter:
		return "dead-letter"
	}
	return "requeue"
}

// settle acknowledges, dead-letters or requeues a still-held message. An
// early-acknowledged message is already settled. A settlement the broker
// refuses is tried again within one settle budget; after that the message
// stays unacknowledged and the broker delivers it again.
func (w *Worker) settle(r *run, a settleAction, reason ...transport.DeadLetterReason) {
	if r.acked {
		return
	}
	r.acked = true
	var why transport.DeadLetterReason
	if len(reason) > 0 {
		why = reason[0]
	}
	if err := w.settleDelivery(r.p.d, a, why); err != nil {
		r.logAt(zap.ErrorLevel, "settling the message failed; the broker will deliver it again",
			zap.Stringer("action", a), zap.Error(err))
	}
}

// settleDelivery carries out one settlement within its own budget.
func (w *Worker) settleDelivery(d *transport.Delivery, a settleAction, why transport.DeadLetterReason) error {
	return w.persist(func(ctx context.Context) error {
		switch a {
		case settleAck:
			return d.Ack(ctx)
		case settleRequeue:
			return d.Reject(ctx, true)
		default:
			return d.DeadLetter(ctx, why)
		}
	})
}

// settleTimeout is the budget of one settle step (a result write, one
// publish, an acknowledgement). Each step gets its own, starting when the
// step starts, so neither a long task nor an earlier slow step uses it up.
const settleTimeout = 30 * time.Second

// settleCtx returns the budget of one settle step. It is not cancelled by
// the shutdown's start, only when Run gives up waiting (see Run).
func (w *Worker) settleCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(w.settleBase, settleTimeout)
}

// persist runs op until it succeeds, its budget (settleTimeout, from now)
// runs out, or it fails in a way another try cannot mend. A broker or
// backend that is briefly down is thus ridden out instead of losing a
// result or leaving a message for redelivery.
func (w *Worker) persist(op func(context.Context) error) error {
	ctx, cancel := w.settleCtx()
	defer cancel()
	return persistWithin(ctx, op)
}

// persistWithin is persist with the budget ctx.
func persistWithin(ctx context.Context, op func(context.Context) error) error {
	backoff := persistFirstBackoff
	for {
		err := op(ctx)
		if err == nil || !retryable(err) {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (gave up: %w)", err, context.Cause(ctx))
		case <-t.C:
		}
		backoff = min(2*backoff, persistMaxBackoff)
	}
}

const (
	persistFirstBackoff = 50 * time.Millisecond
	persistMaxBackoff   = 2 * time.Second
)

// retryable says whether trying a settle step again can help: not when the
// delivery is settled or gone, the transport or backend is closed, the
// value cannot be encoded, or the budget was cancelled.
func retryable(err error) bool {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, transport.ErrStaleDelivery), errors.Is(err, transport.ErrAlreadyAcknowledged),
		errors.Is(err, transport.ErrClosed), errors.Is(err, transport.ErrTopologyMismatch),
		errors.Is(err, backend.ErrClosed), errors.Is(err, protocol.ErrUnencodable):
		return false
	}
	return true
}

func (w *Worker) succeed(r *run, result any, runtime time.Duration) {
	m := r.p.m
	children, err := w.applyCanvasOnSuccess(r, result)
	if err != nil {
		// A lost chain step or callback is worse than a re-run: with
		// acks_late the message comes back and the task runs again.
		r.logAt(zap.ErrorLevel, "publishing callbacks or the next chain step failed", zap.Error(err))
		if !r.acked {
			w.cfg.Observer.TaskFinished(m.Name, OutcomeRejected, runtime)
			w.settle(r, settleRequeue)
			return
		}
	}
	w.succeeded.Add(1)
	endRun(r.span, string(protocol.StateSuccess), nil, "")
	if !w.ignoreResult(r) {
		w.store(r, protocol.StateSuccess, result, "", children)
	}
	if m.Embed.Chord != nil && m.Group != "" {
		w.chordPartReturn(r, protocol.StateSuccess, result)
	}
	r.logAt(zap.InfoLevel, "task succeeded", zap.Duration("runtime", runtime))
	w.cfg.Observer.TaskFinished(m.Name, OutcomeSucceeded, runtime)
	if w.events.taskOn() {
		w.events.task("task-succeeded", map[string]any{"uuid": m.ID, "result": protocol.Repr(result), "runtime": runtime.Seconds()})
	}
	w.settle(r, settleAck)
}

// applyCanvasOnSuccess publishes link callbacks and the next chain step,
// as Celery's tracer does, and returns the children ids.
func (w *Worker) applyCanvasOnSuccess(r *run, result any) ([]any, error) {
	m := r.p.m
	root := m.RootID
	if root == "" {
		root = m.ID
	}
	var children []any
	var errs []error
	if cbs := m.Embed.Callbacks; len(cbs) > 0 {
		c := callOptions{parentID: m.ID, rootID: root, queue: r.p.d.Queue, span: r.span}
		if len(cbs) > 1 {
			// Several callbacks are sent as a group: one fresh group id
			// shared by every plain signature (group_index stays null).
			c.groupID = publish.NewID()
		}
		for _, cb := range cbs {
			ids, err := w.applySignature(cb, []any{result}, c)
			for _, id := range ids {
				children = append(children, protocol.ChildTuple(id))
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	if ch := m.Embed.Chain; len(ch) > 0 {
		next := ch[len(ch)-1]
		rest := append([]protocol.Signature{}, ch[:len(ch)-1]...)
		ids, err := w.applySignature(next, []any{result}, callOptions{
			parentID: m.ID, rootID: root, chain: rest, hasChain: true, queue: r.p.d.Queue, span: r.span,
		})
		for _, id := range ids {
			children = append(children, protocol.ChildTuple(id))
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if children == nil {
		children = []any{}
	}
	return children, errors.Join(errs...)
}

// fail records a terminal failure and settles the message.
func (w *Worker) fail(r *run, err error, reason string) {
	m := r.p.m
	w.failed.Add(1)
	ex := exceptionOf(err)
	tb := traceback(r.t, err, ex)
	endRun(r.span, string(protocol.StateFailure), ex, tb)
	if !w.ignoreResult(r) || w.cfg.StoreErrorsEvenIfIgnored {
		w.store(r, protocol.StateFailure, ex, tb, nil)
	}
	// Celery's mark_as_failure: the pre-assigned ids of the remaining chain
	// steps fail too, so that a client waiting on the chain's last id wakes up.
	for _, s := range m.Embed.Chain {
		if id, _ := s.Options["task_id"].(string); id != "" && w.cfg.Backend != nil {
			w.storeMeta(r, &protocol.ResultMeta{TaskID: id, Status: protocol.StateFailure, Result: ex, Traceback: tb,
				Children: []any{}, DateDone: time.Now().UTC(), ParentID: m.ID}, "")
		}
	}
	if m.Embed.Chord != nil && m.Group != "" {
		w.chordPartReturn(r, protocol.StateFailure, ex)
	}
	w.callErrbacks(m, r.p.d.Queue, m.Embed.Errbacks, r.span)
	if w.events.taskOn() {
		w.events.task("task-failed", map[string]any{"uuid": m.ID, "exception": excRepr(ex), "traceback": tb})
	}
	r.logAt(zap.ErrorLevel, "task failed",
		zap.String("reason", reason),
		zap.String("exception", excRepr(ex)),
		zap.Error(err))
	outcome := OutcomeFailed
	if w.deadLetterOnFailure(r.p.opts) && !r.acked {
		outcome = OutcomeDeadLettered
	}
	w.cfg.Observer.TaskFinished(m.Name, outcome, r.runtime)
	if w.deadLetterOnFailure(r.p.opts) {
		w.settle(r, settleDeadLetter, transport.DeadLetterReason{
			Reason: reason, Error: excRepr(ex), TaskID: m.ID, TaskName: m.Name, Time: time.Now(),
		})
	} else {
		w.settle(r, settleAck)
	}
}

// callErrbacks sends link_error callbacks as Celery does for errbacks it
// cannot call inline: a group of messages with the failed task's id as
// their argument.
func (w *Worker) callErrbacks(m *protocol.TaskMessage, queue string, errbacks []protocol.Signature, span trace.Span) {
	if len(errbacks) == 0 {
		return
	}
	root := m.RootID
	if root == "" {
		root = m.ID
	}
	c := callOptions{parentID: m.ID, rootID: root, groupID: publish.NewID(), queue: queue, span: span}
	for _, eb := range errbacks {
		if _, err := w.applySignature(eb, []any{m.ID}, c); err != nil {
			w.log.Error("sending an error callback failed", zap.String("task_id", m.ID), zap.String("errback", eb.Task), zap.Error(err))
		}
	}
}

func (w *Worker) reject(r *run, rej *RejectError) {
	endRun(r.span, string(protocol.StateRejected), nil, "")
	if w.events.taskOn() {
		w.events.task("task-rejected", map[string]any{"uuid": r.p.m.ID, "requeue": rej.Requeue})
	}
	if r.acked {
		// Early ack: the broker forgot the message when the task started,
		// so there is nothing to requeue or dead-letter; say so.
		w.cfg.Observer.TaskFinished(r.p.m.Name, OutcomeRejected, r.runtime)
		r.logAt(zap.WarnLevel, "task rejected, but its message was acknowledged when the task started: nothing was requeued or dead-lettered",
			zap.Bool("requeue", rej.Requeue), zap.Error(rej.Err))
		return
	}
	if rej.Requeue {
		w.cfg.Observer.TaskFinished(r.p.m.Name, OutcomeRejected, r.runtime)
		r.logAt(zap.InfoLevel, "task rejected, requeued", zap.Error(rej.Err))
		w.settle(r, settleRequeue)
		return
	}
	w.cfg.Observer.TaskFinished(r.p.m.Name, OutcomeDeadLettered, r.runtime)
	r.logAt(zap.WarnLevel, "task rejected, dead-lettered", zap.Error(rej.Err))
	msg := ""
	if rej.Err != nil {
		msg = rej.Err.Error()
	}
	w.settle(r, settleDeadLetter, transport.DeadLetterReason{
		Reason: "rejected", Error: msg, TaskID: r.p.m.ID, TaskName: r.p.m.Name, Time: time.Now(),
	})
}

// chordPartReturn counts a chord header task and, if it completed the
// chord, sends the body (or fails it when a part failed).
func (w *Worker) chordPartReturn(r *run, state protocol.State, result any) {
	m := r.p.m
	chords, ok := w.cfg.Backend.(backend.Chords)
	if !ok {
		r.logAt(zap.ErrorLevel, "task is part of a chord but the result backend cannot count chord parts")
		return
	}
	var res backend.ChordResult
	err := w.persist(func(ctx context.Context) error {
		var err error
		res, err = chords.ChordPartReturn(ctx, backend.ChordPart{
			GroupID: m.Group, GroupIndex: m.GroupIndex, TaskID: m.ID, State: state, Result: result,
		})
		return err
	})
	if err != nil {
		r.logAt(zap.ErrorLevel, "chord part return failed", zap.String("group_id", m.Group), zap.Error(err))
		return
	}
	if !res.Ready {
		return
	}
	body := *m.Embed.Chord
	bodyID, _ := body.Options["task_id"].(string)
	values := make([]any, 0, len(res.Results))
	for _, part := range res.Results {
		if part.State == protocol.StateFailure || part.State == protocol.StateRevoked {
			w.chordError(r, body, bodyID, part)
			return
		}
		values = append(values, part.Result)
	}
	root := m.RootID
	if root == "" {
		root = m.ID
	}
	if _, err := w.applySignature(body, []any{values}, callOptions{parentID: m.ID, rootID: root, queue: r.p.d.Queue, span: r.span}); err != nil {
		r.logAt(zap.ErrorLevel, "sending the chord body failed", zap.String("group_id", m.Group), zap.Error(err))
	}
}

// chordError fails the chord body the way Celery does:
// ChordError("Dependency <id> raised <repr>") stored for the body's id, then
// the body's errbacks.
func (w *Worker) chordError(r *run, body protocol.Signature, bodyID string, culprit backend.ChordPart) {
	repr := fmt.Sprint(culprit.Result)
	if ex, ok := culprit.Result.(*protocol.ExceptionInfo); ok {
		repr = excRepr(ex)
	}
	ex := &protocol.ExceptionInfo{Type: "ChordError", Module: moduleCelery,
		Message: []any{fmt.Sprintf("Dependency %s raised %s", culprit.TaskID, repr)}}
	r.logAt(zap.ErrorLevel, "chord failed", zap.String("group_id", r.p.m.Group), zap.String("body_id", bodyID), zap.String("culprit", culprit.TaskID))
	if bodyID != "" && w.cfg.Backend != nil {
		w.storeMeta(r, &protocol.ResultMeta{TaskID: bodyID, Status: protocol.StateFailure, Result: ex,
			Children: []any{}, DateDone: time.Now().UTC()}, "")
	}
	errbacks, err := publish.SignatureList(body.Options["link_error"])
	if err != nil {
		r.logAt(zap.ErrorLevel, "chord body link_error unreadable", zap.Error(err))
		return
	}
	if len(errbacks) > 0 {
		fake := &protocol.TaskMessage{ID: bodyID, RootID: r.p.m.RootID}
		w.callErrbacks(fake, r.p.d.Queue, errbacks, r.span)
	}
}

// revoke records REVOKED for a task that will not run and acknowledges it.
// It runs off the loop and outside any task, so each step has its own
// settle budget rather than Run's context, which a shutdown cancels.
func (w *Worker) revoke(d *transport.Delivery, m *protocol.TaskMessage, why string) {
	log := w.log.With(taskFields(m, d)...)
	log.Info("task revoked, not running it", zap.String("reason", why))
	w.cfg.Observer.TaskFinished(m.Name, OutcomeRevoked, 0)
	if w.events.taskOn() {
		w.events.task("task-revoked", map[string]any{"uuid": m.ID, "terminated": false, "signum": nil, "expired": why == "expired"})
	}
	if w.cfg.Backend != nil {
		ex := exceptionOf(&revokedError{why: why})
		w.storeMeta(nil, &protocol.ResultMeta{TaskID: m.ID, Status: protocol.StateRevoked, Result: ex,
			Children: []any{}, DateDone: time.Now().UTC(), ParentID: m.ParentID, GroupID: m.Group}, m.ReplyTo)
	}
	if err := w.settleDelivery(d, settleAck, transport.DeadLetterReason{}); err != nil {
		log.Error("ack of a revoked task failed; the broker will deliver it again", zap.Error(err))
	}
}

// rejectInvalid handles a message that is not a decodable task: logged with
// its id when one can be found, FAILURE stored when it has an id, and
// dead-lettered — never crashing the worker and never silently dropped.
func (w *Worker) rejectInvalid(d *transport.Delivery, cause error) {
	id, _ := d.Message.Headers["id"].(string)
	name, _ := d.Message.Headers["task"].(string)
	if id == "" {
		id = d.Message.Properties.CorrelationID
	}
	reason := "invalid"
	var cte *protocol.ContentTypeError
	switch {
	case errors.As(cause, &cte):
		reason = "content-type"
	case errors.Is(cause, protocol.ErrTooLarge):
		reason = "too-large"
	case errors.Is(cause, protocol.ErrTooDeep):
		reason = "too-deep"
	case errors.Is(cause, protocol.ErrUnsupportedCompression):
		reason = "compression"
	}
	w.cfg.Observer.MessageRejected(reason)
	w.log.Error("invalid task message, dead-lettering it",
		zap.String("task_id", id), zap.String("task_name", name), zap.String("queue", d.Queue),
		zap.String("delivery_tag", d.Tag), zap.String("reason", reason), zap.Error(cause))
	if id != "" && w.cfg.Backend != nil {
		ex := &protocol.ExceptionInfo{Type: "InvalidTaskError", Module: moduleCelery, Message: []any{cause.Error()}}
		w.storeMeta(nil, &protocol.ResultMeta{TaskID: id, Status: protocol.StateFailure, Result: ex,
			Children: []any{}, DateDone: time.Now().UTC()}, d.Message.Properties.ReplyTo)
	}
	if err := w.settleDelivery(d, settleDeadLetter, transport.DeadLetterReason{
		Reason: reason, Error: cause.Error(), TaskID: id, TaskName: name, Time: time.Now(),
	}); err != nil {
		w.log.Error("dead-lettering an invalid message failed; the broker will deliver it again", zap.String("task_id", id), zap.Error(err))
	}
}

// rejectUnknown handles a task name with no handler, as Celery does:
// FAILURE (NotRegistered) stored and the message rejected to the
// dead-letter destination.
func (w *Worker) rejectUnknown(d *transport.Delivery, m *protocol.TaskMessage) {
	w.cfg.Observer.MessageRejected("not-registered")
	w.log.Error("received unregistered task, dead-lettering it", append(taskFields(m, d),
		zap.Strings("registered", w.mux.Names()))...)
	err := &notRegisteredError{name: m.Name}
	if w.cfg.Backend != nil {
		ex := exceptionOf(err)
		w.storeMeta(nil, &protocol.ResultMeta{TaskID: m.ID, Status: protocol.StateFailure, Result: ex,
			Children: []any{}, DateDone: time.Now().UTC(), ParentID: m.ParentID, GroupID: m.Group}, m.ReplyTo)
	}
	if derr := w.settleDelivery(d, settleDeadLetter, transport.DeadLetterReason{
		Reason: "not-registered", Error: fmt.Sprintf("NotRegistered(%s)", protocol.Repr(m.Name)), TaskID: m.ID, TaskName: m.Name, Time: time.Now(),
	}); derr != nil {
		w.log.Error("dead-lettering an unregistered task failed; the broker will deliver it again", zap.String("task_id", m.ID), zap.Error(derr))
	}
}

func (w *Worker) ignoreResult(r *run) bool {
	if w.cfg.Backend == nil {
		return true
	}
	if r.p.m.IgnoreResult != nil && *r.p.m.IgnoreResult {
		return true
	}
	if r.p.opts.IgnoreResult != nil {
		return *r.p.opts.IgnoreResult
	}
	return w.cfg.IgnoreResult
}

func (w *Worker) trackStarted(o TaskOptions) bool {
	if w.cfg.Backend == nil {
		return false
	}
	if o.TrackStarted != nil {
		return *o.TrackStarted
	}
	return w.cfg.TrackStarted
}

func (w *Worker) deadLetterOnFailure(o TaskOptions) bool {
	if o.AcksOnFailure != nil {
		return !*o.AcksOnFailure
	}
	return !w.cfg.AcksOnFailure
}

// store writes a state for the running task.
func (w *Worker) store(r *run, state protocol.State, result any, tb string, children []any) {
	m := r.p.m
	meta := &protocol.ResultMeta{
		TaskID:    m.ID,
		Status:    state,
		Result:    result,
		Traceback: tb,
		Children:  children,
		GroupID:   m.Group,
		ParentID:  m.ParentID,
	}
	if meta.Children == nil {
		meta.Children = []any{}
	}
	if state.Ready() {
		meta.DateDone = time.Now().UTC()
	}
	w.storeMeta(r, meta, m.ReplyTo)
}

// storeMeta writes a result document, adding the extended fields when
// configured. The write gets its own settle budget and is tried again
// within it; a write that still fails is logged and counted
// (LossObserver): a result write must not crash a task, but it must
// not disappear silently either.
func (w *Worker) storeMeta(r *run, meta *protocol.ResultMeta, replyTo string) {
	if w.cfg.Backend == nil {
		return
	}
	if w.cfg.ResultExtended && r != nil && meta.TaskID == r.p.m.ID {
		m := r.p.m
		meta.Extended = true
		meta.Name = m.Name
		meta.Args = m.Args
		meta.Kwargs = m.Kwargs
		meta.Worker = w.cfg.Hostname
		meta.Retries = m.Retries
		meta.Queue = r.p.d.RoutingKey
	}
	corr := meta.TaskID
	if r != nil && r.p.m.CorrelationID != "" && meta.TaskID == r.p.m.ID {
		corr = r.p.m.CorrelationID
	}
	req := backend.StoreRequest{Meta: meta, ReplyTo: replyTo, CorrelationID: corr}
	if err := w.persist(func(ctx context.Context) error { return w.cfg.Backend.Store(ctx, req) }); err != nil {
		w.log.Error("storing the task state failed", zap.String("task_id", meta.TaskID),
			zap.String("state", string(meta.Status)), zap.Error(err))
		w.resultLost(meta.Status)
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

// stripDeathHeaders removes RabbitMQ's dead-lettering headers before a
// message is published again, as Celery (main) does for retries: a retried
// message is a new message, not a dead letter.
func stripDeathHeaders(h map[string]any) map[string]any {
	if len(h) == 0 {
		return h
	}
	out := make(map[string]any, len(h))
	for k, v := range h {
		if k == "x-death" || strings.HasPrefix(k, "x-first-death") || strings.HasPrefix(k, "x-last-death") || k == "redelivered" {
			continue
		}
		out[k] = v
	}
	return out
}
