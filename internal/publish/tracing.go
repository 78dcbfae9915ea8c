package publish

import (
	"context"
	"reflect"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/celeriac/celeriac/protocol"
)

// TracerName is the instrumentation scope of celeriac's spans.
const TracerName = "github.com/celeriac/celeriac"

// Version is celeriac's version, reported as the instrumentation version
// and in worker hellos.
const Version = "0.1.0"

// Span attribute keys shared by the producer's and the worker's spans, as
// opentelemetry-instrumentation-celery names them.
const (
	AttrAction      = "celery.action"
	AttrTaskName    = "celery.task_name"
	AttrMessageID   = "messaging.message.id"
	AttrDestination = "messaging.destination"
)

// Tracing is the OpenTelemetry state of a producer or worker; nil when
// tracing is off, so that the untraced path costs one nil check.
type Tracing struct {
	Tracer trace.Tracer
	Prop   propagation.TextMapPropagator
}

// NewTracing returns nil when tp is nil (tracing off), a nil pointer in
// the interface included: otelenv.New returns a nil *TracerProvider when
// tracing is off, and assigning it to a Config makes a non-nil interface.
// The default propagator is W3C trace context plus baggage,
// OpenTelemetry's default OTEL_PROPAGATORS.
func NewTracing(tp trace.TracerProvider, prop propagation.TextMapPropagator) *Tracing {
	if tp == nil {
		return nil
	}
	if v := reflect.ValueOf(tp); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil
	}
	if prop == nil {
		prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return &Tracing{Tracer: tp.Tracer(TracerName, trace.WithInstrumentationVersion(Version)), Prop: prop}
}

// HeaderCarrier reads and writes trace context in task message headers.
// py-amqp may hand a header over as bytes; it is read as text.
type HeaderCarrier map[string]any

// Get returns the header as text.
func (c HeaderCarrier) Get(key string) string {
	switch v := c[key].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// Set sets a header.
func (c HeaderCarrier) Set(key, value string) { c[key] = value }

// Keys lists the headers, sorted.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// startPublish starts the PRODUCER span of one published message and
// injects the context into its headers, as the Python instrumentation's
// before_task_publish does. The headers map is replaced by a copy: the
// caller's map (send options, the original message of a retry) must not
// change.
func (tr *Tracing) startPublish(ctx context.Context, m *protocol.TaskMessage, dest Destination) trace.Span {
	ctx, span := tr.Tracer.Start(ctx, "apply_async/"+m.Name, trace.WithSpanKind(trace.SpanKindProducer))
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String(AttrAction, "apply_async"),
			attribute.String(AttrMessageID, m.ID),
			attribute.String(AttrTaskName, m.Name),
			attribute.String(AttrDestination, dest.RoutingKey),
		)
	}
	h := make(map[string]any, len(m.Headers)+3)
	for k, v := range m.Headers {
		h[k] = v
	}
	tr.Prop.Inject(ctx, HeaderCarrier(h))
	m.Headers = h
	return span
}
