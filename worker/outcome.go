package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

func (w *Worker) succeed(r *run, result any, runtime time.Duration) {
	m := r.p.m
	children, err := w.applyCanvasOnSuccess(r, result)
	switch {
	case errors.Is(err, protocol.ErrUnencodable):
		// A callback or chain step no transport can carry (a header value
		// such as NaN) fails the same way on every run: the task fails, as
		// Celery's tracer fails it on an EncodeError, and the remaining
		// chain steps with it, so that whoever waits on them wakes up.
		w.fail(r, err, "callback-publish-failed")
		return
	case err != nil:
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
		w.chordPartReturn(r, partOf(m), protocol.StateSuccess, result)
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
			c.groupID = protocol.NewID()
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
	// steps fail too, so that a client waiting on the chain's last id wakes up,
	// and a step that is a chord part (the last step of a chain in a chord's
	// header) counts its part, or the chord would wait for it for ever.
	// Each is stored as Celery stores it, with the step's own options as
	// the request (Context(chain_elem) updated with its options): on rpc://
	// the failure goes to the step's reply_to, where its client waits.
	for _, s := range m.Embed.Chain {
		id, _ := s.Options["task_id"].(string)
		if id != "" && w.cfg.Backend != nil {
			replyTo, _ := s.Options["reply_to"].(string)
			w.storeMeta(r, &protocol.ResultMeta{TaskID: id, Status: protocol.StateFailure, Result: ex, Traceback: tb,
				Children: []any{}, DateDone: time.Now().UTC(), ParentID: m.ID}, replyTo)
		}
		if part, ok := chainPartOf(s, id); ok {
			w.chordPartReturn(r, part, protocol.StateFailure, ex)
		}
	}
	if m.Embed.Chord != nil && m.Group != "" {
		w.chordPartReturn(r, partOf(m), protocol.StateFailure, ex)
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
	c := callOptions{parentID: m.ID, rootID: root, groupID: protocol.NewID(), queue: queue, span: span}
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

// chordPart is a chord header task: the task that runs (partOf) or a
// chain step it fails on behalf of (chainPartOf).
type chordPart struct {
	id, group string
	index     *int
	body      protocol.Signature
}

func partOf(m *protocol.TaskMessage) chordPart {
	return chordPart{id: m.ID, group: m.Group, index: m.GroupIndex, body: *m.Embed.Chord}
}

// chainPartOf reads the chord part a chain step's options make it.
func chainPartOf(s protocol.Signature, id string) (chordPart, bool) {
	if s.Options["chord"] == nil || s.GroupID() == "" || id == "" {
		return chordPart{}, false
	}
	body, err := protocol.DecodeSignature(s.Options["chord"])
	if err != nil {
		return chordPart{}, false
	}
	p := chordPart{id: id, group: s.GroupID(), body: body}
	if i, ok := publish.ToInt(s.Options["group_index"]); ok {
		p.index = &i
	}
	return p, true
}

// chordPartReturn counts a chord header task and, if it completed the
// chord, sends the body (or fails it when a part failed).
func (w *Worker) chordPartReturn(r *run, p chordPart, state protocol.State, result any) {
	m := r.p.m
	chords, ok := backend.ChordsOf(w.cfg.Backend)
	if !ok {
		if _, ok := w.cfg.Backend.(backend.ChordUnlocker); ok {
			// celery.chord_unlock completes the chord (Celery's database
			// backends do nothing on a part's return either).
			return
		}
		r.logAt(zap.ErrorLevel, "task is part of a chord but the result backend cannot count chord parts")
		return
	}
	var res backend.ChordResult
	err := w.persist(func(ctx context.Context) error {
		var err error
		res, err = chords.ChordPartReturn(ctx, backend.ChordPart{
			GroupID: p.group, GroupIndex: p.index, TaskID: p.id, State: state, Result: result,
		})
		return err
	})
	if err != nil {
		r.logAt(zap.ErrorLevel, "chord part return failed", zap.String("group_id", p.group), zap.Error(err))
		return
	}
	if !res.Ready {
		return
	}
	body := p.body
	bodyID, _ := body.Options["task_id"].(string)
	values := make([]any, 0, len(res.Results))
	for _, part := range res.Results {
		if part.State == protocol.StateFailure || part.State == protocol.StateRevoked {
			w.chordError(r, p.group, body, bodyID, part)
			return
		}
		values = append(values, part.Result)
	}
	root := m.RootID
	if root == "" {
		root = m.ID
	}
	if _, err := w.applySignature(body, []any{values}, callOptions{parentID: m.ID, rootID: root, queue: r.p.d.Queue, span: r.span}); err != nil {
		r.logAt(zap.ErrorLevel, "sending the chord body failed", zap.String("group_id", p.group), zap.Error(err))
	}
}

// chordError fails the chord body the way Celery does:
// ChordError("Dependency <id> raised <repr>") stored for the body's id, then
// the body's errbacks.
func (w *Worker) chordError(r *run, group string, body protocol.Signature, bodyID string, culprit backend.ChordPart) {
	repr := fmt.Sprint(culprit.Result)
	if ex, ok := culprit.Result.(*protocol.ExceptionInfo); ok {
		repr = excRepr(ex)
	}
	ex := &protocol.ExceptionInfo{Type: "ChordError", Module: moduleCelery,
		Message: []any{fmt.Sprintf("Dependency %s raised %s", culprit.TaskID, repr)}}
	r.logAt(zap.ErrorLevel, "chord failed", zap.String("group_id", group), zap.String("body_id", bodyID), zap.String("culprit", culprit.TaskID))
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
	// Celery's consumer sends task-failed for it (on_unknown_task), so that
	// Flower and the dashboard show the task and why it failed.
	w.events.task("task-failed", map[string]any{"uuid": m.ID, "exception": fmt.Sprintf("NotRegistered(%s)", protocol.Repr(m.Name))})
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
// configured. The write gets its own budget (ResultTimeout) and is tried
// again within it; a write that still fails is logged and counted
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
	ctx, cancel := context.WithTimeout(w.settleBase, w.cfg.ResultTimeout)
	defer cancel()
	start := time.Now()
	var warned time.Time
	err := persistWithin(ctx, func(ctx context.Context) error {
		err := w.cfg.Backend.Store(ctx, req)
		// An operator watching a stalled worker must see why, without a
		// line per attempt.
		if err != nil && retryable(err) && ctx.Err() == nil && time.Since(warned) >= resultWarnEvery {
			warned = time.Now()
			w.log.Warn("the result backend failed a result write; trying again", zap.String("task_id", meta.TaskID),
				zap.String("state", string(meta.Status)), zap.Duration("for", time.Since(start)),
				zap.Duration("budget", w.cfg.ResultTimeout), zap.Error(err))
		}
		return err
	})
	if err != nil {
		w.log.Error("storing the task state failed", zap.String("task_id", meta.TaskID),
			zap.String("state", string(meta.Status)), zap.Error(err))
		w.resultLost(meta.Status)
	}
}

// resultWarnEvery spaces the warnings of a result write tried again.
const resultWarnEvery = 30 * time.Second

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
