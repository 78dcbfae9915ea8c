package worker

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/retry"
)

// decideRetry applies the task's retry policy (or the worker's) to a
// handler error.
func (w *Worker) decideRetry(r *run, err error) retry.Decision {
	var be *bindError
	if errors.As(err, &be) {
		// Arguments that do not bind will not bind next time either.
		err = retry.Skip(err)
	}
	p := w.cfg.Retry
	if r.p.opts.Retry != nil {
		p = *r.p.opts.Retry
	}
	d := p.Decide(err, r.p.m.Retries, time.Now(), rand.IntN)
	var mre *retry.MaxRetriesExceededError
	if errors.As(d.Err, &mre) {
		m := r.p.m
		mre.TaskName, mre.TaskID = m.Name, m.ID
		mre.Args, mre.Kwargs = protocol.ReprArgs(m.Args), protocol.ReprKwargs(m.Kwargs)
	}
	if !d.Retry && d.Err == nil {
		d.Err = err
	}
	return d
}

// retryTask records RETRY, then publishes the retry as Celery's Task.retry
// does — same id, retries+1, an eta, everything else carried over — and
// settles the original. The original (acks_late) is acknowledged only after
// the broker confirmed the new message, so a crash in between leaves a
// duplicate at worst, never a loss.
func (w *Worker) retryTask(r *run, d retry.Decision) {
	m := r.p.m
	next := *m
	next.Retries = m.Retries + 1
	if errors.Is(d.Err, ErrDuplicateInProgress) {
		// A duplicate waiting for the holder of its idempotency key made no
		// attempt: it keeps its retries budget for real failures.
		next.Retries = m.Retries
	}
	next.ETA = d.ETA
	// Celery sends the retry from inside the task, so the new message's
	// parent is the task itself (captured from Celery 5.2).
	next.ParentID = m.ID
	if next.RootID == "" {
		next.RootID = m.ID
	}
	next.Origin = w.cfg.Hostname
	next.Headers = stripDeathHeaders(m.Headers)
	next.Expiration = ""
	if !m.Expires.IsZero() {
		next.Expiration = publish.Expiration(m.Expires, time.Now())
	}
	next.Compression = m.Compression
	dest := publish.Destination{Exchange: r.p.d.Exchange, RoutingKey: r.p.d.RoutingKey}
	if dest.Exchange == "" {
		// Came through the default exchange: go back to the same queue.
		dest.RoutingKey = r.p.d.Queue
		if dest.RoutingKey == "" {
			dest.RoutingKey = r.p.d.RoutingKey
		}
	}
	ct := m.ContentType
	if ct == "" {
		ct = protocol.ContentTypeJSON
	}
	// RETRY is stored and task-retried sent before the new message exists:
	// once published, it can run and succeed at once (here or on another
	// worker), and a RETRY after its SUCCESS would leave monitors (Celery's
	// State, Flower) showing the task as retrying for good.
	var ex *protocol.ExceptionInfo
	var tb string
	if d.Err != nil {
		ex = exceptionOf(d.Err)
		tb = traceback(r.t, d.Err, ex)
	}
	if r.span != nil && r.span.IsRecording() {
		reason := d.Reason.String()
		if d.Err != nil {
			reason = d.Err.Error()
		}
		r.span.SetAttributes(attribute.String(attrRetryReason, reason))
		endRun(r.span, string(protocol.StateRetry), nil, "")
	}
	if !w.ignoreResult(r) {
		var result any
		if ex != nil {
			result = ex
		}
		w.store(r, protocol.StateRetry, result, tb, []any{protocol.ChildTuple(m.ID)})
	}
	evExc, evTb := "", ""
	if ex != nil {
		evExc, evTb = excRepr(ex), tb
	}
	if w.events.taskOn() {
		w.events.task("task-retried", map[string]any{"uuid": m.ID, "exception": evExc, "traceback": evTb})
	}
	if err := w.persist(func(ctx context.Context) error {
		return w.producer.Publish(withSpan(ctx, r.span), &next, dest, ct, m.Compression)
	}); err != nil {
		// A retry the transport cannot encode (a header value no broker
		// carries) would fail the same way after every redelivery: the task
		// fails, as in Celery, where Task.retry raises the EncodeError.
		if !r.acked && !errors.Is(err, protocol.ErrUnencodable) {
			r.logAt(zap.ErrorLevel, "publishing the retry failed", zap.Error(err))
			// The original is still ours: give it back rather than lose it.
			w.cfg.Observer.TaskFinished(m.Name, OutcomeRejected, r.runtime)
			w.settle(r, settleRequeue)
			return
		}
		w.fail(r, errors.Join(d.Err, err), "retry-publish-failed")
		return
	}
	w.retried.Add(1)
	w.cfg.Observer.TaskFinished(m.Name, OutcomeRetried, r.runtime)
	fields := []zap.Field{zap.Int("next_retries", next.Retries), zap.Duration("countdown", d.Countdown), zap.String("reason", d.Reason.String())}
	if d.Err != nil {
		fields = append(fields, zap.Error(d.Err))
	}
	r.logAt(zap.InfoLevel, "task retry scheduled", fields...)
	w.settle(r, settleAck)
}

// failReason names a terminal failure for logs and dead-letter records.
func failReason(d retry.Decision) string {
	switch {
	case d.Exhausted:
		return "max-retries"
	case d.Reason == retry.ReasonSkip || d.Reason == retry.ReasonExcluded:
		return "permanent"
	}
	return "failed"
}
