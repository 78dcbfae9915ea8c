package worker

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// Tracing follows opentelemetry-instrumentation-celery (the Python
// instrumentation, instrumentation/opentelemetry-instrumentation-celery in
// open-telemetry/opentelemetry-python-contrib), so that one trace runs
// through Python and Go workers alike:
//
//   - a producer injects the W3C context (traceparent, tracestate, baggage)
//     into the task message's headers, as its before_task_publish hook does
//     with the propagator's inject(headers), inside a PRODUCER span named
//     "apply_async/<task name>";
//   - a worker extracts it from the message headers (the task request's
//     attributes, in Python) and runs the task in a CONSUMER span named
//     "run/<task name>", with the celery.* and messaging.* attributes the
//     Python instrumentation sets, an exception event and status Error on
//     failure, and celery.retry.reason on a retry.
//
// docs/tracing.md lists the names and where each comes from.

// Span attribute keys, as the Python instrumentation names them.
const (
	attrAction         = publish.AttrAction
	attrTaskName       = publish.AttrTaskName
	attrState          = "celery.state"
	attrRetryReason    = "celery.retry.reason"
	attrHostname       = "celery.hostname"
	attrRetries        = "celery.retries"
	attrPriority       = "celery.priority"
	attrReplyTo        = "celery.reply_to"
	attrDeliveryInfo   = "celery.delivery_info"
	attrETA            = "celery.eta"
	attrExpires        = "celery.expires"
	attrTimelimit      = "celery.timelimit"
	attrMessageID      = publish.AttrMessageID
	attrConversationID = "messaging.conversation_id"
	attrDestination    = publish.AttrDestination
)

// tracing is the OpenTelemetry state of a worker; nil when tracing is
// off, so that the untraced path costs one nil check.
type tracing = publish.Tracing

// startRun starts the CONSUMER span of one run, a child of the context the
// message carries.
func startRun(tr *tracing, ctx context.Context, m *protocol.TaskMessage, d *transport.Delivery, hostname string) (context.Context, trace.Span) {
	if len(m.Headers) > 0 {
		ctx = tr.Prop.Extract(ctx, publish.HeaderCarrier(m.Headers))
	}
	ctx, span := tr.Tracer.Start(ctx, "run/"+m.Name, trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		span.SetAttributes(runAttributes(m, d, hostname)...)
	}
	return ctx, span
}

// runAttributes are those the Python instrumentation takes from the task
// request at postrun.
func runAttributes(m *protocol.TaskMessage, d *transport.Delivery, hostname string) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		attribute.String(attrAction, "run"),
		attribute.String(attrTaskName, m.Name),
		attribute.String(attrMessageID, m.ID),
		attribute.String(attrHostname, hostname),
		attribute.String(attrDestination, d.RoutingKey),
		attribute.Int(attrPriority, m.Priority),
		attribute.String(attrDeliveryInfo, protocol.Repr(map[string]any{
			"exchange": d.Exchange, "routing_key": d.RoutingKey, "priority": int64(m.Priority), "redelivered": d.Redelivered,
		})),
	}
	if m.CorrelationID != "" {
		attrs = append(attrs, attribute.String(attrConversationID, m.CorrelationID))
	}
	if m.Retries > 0 {
		attrs = append(attrs, attribute.Int(attrRetries, m.Retries))
	}
	if m.ReplyTo != "" {
		attrs = append(attrs, attribute.String(attrReplyTo, m.ReplyTo))
	}
	if !m.ETA.IsZero() {
		attrs = append(attrs, attribute.String(attrETA, protocol.FormatTime(m.ETA)))
	}
	if !m.Expires.IsZero() {
		attrs = append(attrs, attribute.String(attrExpires, protocol.FormatTime(m.Expires)))
	}
	if m.TimeLimit > 0 || m.SoftTimeLimit > 0 {
		attrs = append(attrs, attribute.StringSlice(attrTimelimit, []string{limitString(m.TimeLimit), limitString(m.SoftTimeLimit)}))
	}
	return attrs
}

// limitString is one element of Python's timelimit attribute: the number of
// seconds, or "" for none.
func limitString(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return fmt.Sprint(d.Seconds())
}

// endRun records the run's final state on its span. ex is the exception a
// failure stored (nil otherwise), tb its traceback.
func endRun(span trace.Span, state string, ex *protocol.ExceptionInfo, tb string) {
	if span == nil || !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.String(attrState, state))
	if ex != nil {
		// Python's span.record_exception(einfo): an "exception" event.
		span.AddEvent("exception", trace.WithAttributes(
			attribute.String("exception.type", ex.Type),
			attribute.String("exception.message", protocol.ExceptionMessage(ex.Message)),
			attribute.String("exception.stacktrace", tb),
		))
		span.SetStatus(codes.Error, excRepr(ex))
	}
}

// withSpan puts span into ctx (a settle budget's context), so that what is
// published in it joins the run's trace; a nil span leaves ctx as it is.
func withSpan(ctx context.Context, span trace.Span) context.Context {
	if span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, span)
}

// traceFields are the log fields of a run's span: trace_id and span_id, so
// that log lines join their trace.
func traceFields(span trace.Span) []zap.Field {
	if span == nil {
		return nil
	}
	sc := span.SpanContext()
	if !sc.IsValid() {
		return nil
	}
	return []zap.Field{zap.String("trace_id", sc.TraceID().String()), zap.String("span_id", sc.SpanID().String())}
}
