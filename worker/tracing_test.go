package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/worker"
)

// A traceparent as a Python producer with opentelemetry-instrumentation-celery
// sends it.
const (
	pyTraceID    = "4bf92f3577b34da6a3ce929d0e0e4736"
	pySpanID     = "00f067aa0ba902b7"
	pyTraceparen = "00-" + pyTraceID + "-" + pySpanID + "-01"
)

func tracedHarness(t *testing.T, cfg worker.Config) (*harness, *tracetest.SpanRecorder, *observer.ObservedLogs) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	core, logs := observer.New(zapcore.DebugLevel)
	cfg.TracerProvider = tp
	cfg.Logger = zap.New(core)
	return newHarness(t, cfg), rec, logs
}

func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// waitSpans waits until n spans named name have ended.
func waitSpans(t *testing.T, rec *tracetest.SpanRecorder, name string, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	var got []sdktrace.ReadOnlySpan
	eventually(t, name+" spans", func() bool {
		got = spansNamed(rec, name)
		return len(got) >= n
	})
	return got
}

// TestTracingRunSpanContinuesThePythonTrace: a message carrying a Python
// producer's traceparent runs in a CONSUMER span "run/<name>" of that
// trace, child of the producer's span, with the Python instrumentation's
// attributes; log lines carry trace_id and span_id.
func TestTracingRunSpanContinuesThePythonTrace(t *testing.T) {
	h, rec, logs := tracedHarness(t, worker.Config{})
	h.mux.HandleFunc("tasks.add", add)
	h.start()
	id := h.send("tasks.add", []any{int64(2), int64(3)}, nil, client.Headers(map[string]any{"traceparent": pyTraceparen}))
	h.wait(id)
	s := waitSpans(t, rec, "run/tasks.add", 1)[0]
	if s.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("kind %v, want consumer", s.SpanKind())
	}
	if s.SpanContext().TraceID().String() != pyTraceID || s.Parent().SpanID().String() != pySpanID || !s.Parent().IsRemote() {
		t.Errorf("trace %s parent %s (remote %t), want trace %s parent %s", s.SpanContext().TraceID(), s.Parent().SpanID(),
			s.Parent().IsRemote(), pyTraceID, pySpanID)
	}
	for k, want := range map[string]string{"celery.action": "run", "celery.task_name": "tasks.add", "celery.state": "SUCCESS",
		"messaging.message.id": id, "messaging.destination": "q", "celery.hostname": h.w.Hostname()} {
		if got := attr(s, k).String(); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if s.Status().Code == codes.Error {
		t.Errorf("status %v on success", s.Status())
	}
	lines := logs.FilterMessage("task succeeded").FilterField(zap.String("trace_id", pyTraceID)).All()
	if len(lines) != 1 {
		t.Fatalf("%d 'task succeeded' lines with the trace id, want 1", len(lines))
	}
	if got := lines[0].ContextMap()["span_id"]; got != s.SpanContext().SpanID().String() {
		t.Errorf("log span_id %v, want the run span's %s", got, s.SpanContext().SpanID())
	}
}

// TestTracingFailureAndRetry: a failure sets status Error and records an
// exception event; a retry stays in the trace, one run span per attempt,
// the second a grandchild of the first through the retry's apply_async span.
func TestTracingFailureAndRetry(t *testing.T) {
	h, rec, _ := tracedHarness(t, worker.Config{})
	h.mux.HandleFunc("tasks.fail", func(ctx context.Context, t *worker.Task) (any, error) {
		return nil, worker.NewException("ValueError", "bad thing")
	})
	h.mux.HandleFunc("tasks.again", func(ctx context.Context, t *worker.Task) (any, error) {
		if t.Retries == 0 {
			return nil, retry.After(10*time.Millisecond, errors.New("not yet"))
		}
		return "done", nil
	})
	h.start()
	h.wait(h.send("tasks.fail", nil, nil, client.Headers(map[string]any{"traceparent": pyTraceparen})))
	f := waitSpans(t, rec, "run/tasks.fail", 1)[0]
	if f.Status().Code != codes.Error || attr(f, "celery.state").AsString() != "FAILURE" {
		t.Errorf("failed run: status %v, state %v", f.Status(), attr(f, "celery.state").String())
	}
	var exc *sdktrace.Event
	for i, e := range f.Events() {
		if e.Name == "exception" {
			exc = &f.Events()[i]
		}
	}
	if exc == nil {
		t.Fatal("no exception event on the failed run")
	}
	for _, kv := range exc.Attributes {
		if kv.Key == "exception.type" && kv.Value.AsString() != "ValueError" {
			t.Errorf("exception.type %q, want ValueError", kv.Value.AsString())
		}
	}

	id := h.send("tasks.again", nil, nil, client.Headers(map[string]any{"traceparent": pyTraceparen}))
	if m := h.wait(id); m.Status != protocol.StateSuccess {
		t.Fatalf("retried task: %s", m.Status)
	}
	runs := waitSpans(t, rec, "run/tasks.again", 2)
	first, second := runs[0], runs[1]
	if attr(first, "celery.state").AsString() != "RETRY" || attr(first, "celery.retry.reason").AsString() != "not yet" {
		t.Errorf("first attempt: state %v, reason %v", attr(first, "celery.state").String(), attr(first, "celery.retry.reason").String())
	}
	pubs := spansNamed(rec, "apply_async/tasks.again")
	if len(pubs) != 1 || pubs[0].SpanKind() != trace.SpanKindProducer || pubs[0].Parent().SpanID() != first.SpanContext().SpanID() {
		t.Fatalf("retry publish spans %v, want one PRODUCER child of the first run", pubs)
	}
	if second.SpanContext().TraceID().String() != pyTraceID || second.Parent().SpanID() != pubs[0].SpanContext().SpanID() {
		t.Errorf("second attempt: trace %s parent %s, want trace %s under the retry's publish span", second.SpanContext().TraceID(),
			second.Parent().SpanID(), pyTraceID)
	}
}

// TestTracingChainStepCarriesTheContext: the next chain step a traced run
// publishes carries the trace in its headers, so the step (here another
// celeriac run; in Python, a worker with the instrumentation) joins it.
func TestTracingChainStepCarriesTheContext(t *testing.T) {
	h, rec, _ := tracedHarness(t, worker.Config{})
	var stepHeaders map[string]any
	h.mux.HandleFunc("tasks.add", add)
	h.mux.HandleFunc("tasks.look", func(ctx context.Context, t *worker.Task) (any, error) {
		stepHeaders = t.Message.Headers
		return nil, nil
	})
	h.start()
	stepID := protocol.NewID()
	h.send("tasks.add", []any{int64(1), int64(2)}, nil, client.Headers(map[string]any{"traceparent": pyTraceparen}),
		client.Link(protocol.Signature{Task: "tasks.look", Options: map[string]any{"task_id": stepID}}))
	h.wait(stepID)
	step := waitSpans(t, rec, "run/tasks.look", 1)[0]
	if step.SpanContext().TraceID().String() != pyTraceID {
		t.Errorf("the chain step runs in trace %s, want %s", step.SpanContext().TraceID(), pyTraceID)
	}
	tp, _ := stepHeaders["traceparent"].(string)
	if len(tp) != 55 || tp[3:35] != pyTraceID || tp == pyTraceparen {
		t.Errorf("the step's traceparent header is %q, want the trace %s with a new parent", tp, pyTraceID)
	}
}

// TestTracingProducer: SendTask with tracing publishes in a PRODUCER span
// and injects its context, without changing the caller's headers map.
func TestTracingProducer(t *testing.T) {
	h, _, _ := tracedHarness(t, worker.Config{})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	var got map[string]any
	h.mux.HandleFunc("tasks.look", func(ctx context.Context, t *worker.Task) (any, error) {
		got = t.Message.Headers
		return nil, nil
	})
	h.start()
	prod := client.New(h.tr, client.Config{DefaultQueue: "q", TracerProvider: tp})
	mine := map[string]any{"x-mine": "kept"}
	r, err := prod.Send(context.Background(), "tasks.look", nil, nil, client.Headers(mine))
	if err != nil {
		t.Fatal(err)
	}
	id := r.ID
	h.wait(id)
	pubs := spansNamed(rec, "apply_async/tasks.look")
	if len(pubs) != 1 || pubs[0].SpanKind() != trace.SpanKindProducer || attr(pubs[0], "messaging.message.id").AsString() != id {
		t.Fatalf("producer spans %v", pubs)
	}
	want := "00-" + pubs[0].SpanContext().TraceID().String() + "-" + pubs[0].SpanContext().SpanID().String() + "-01"
	if got["traceparent"] != want || got["x-mine"] != "kept" {
		t.Errorf("headers %v, want traceparent %s and x-mine", got, want)
	}
	if len(mine) != 1 {
		t.Errorf("the caller's headers map changed: %v", mine)
	}
}

// TestTracingOffAddsNothing: without a TracerProvider nothing is injected.
func TestTracingOffAddsNothing(t *testing.T) {
	h := newHarness(t, worker.Config{})
	var got map[string]any
	h.mux.HandleFunc("tasks.add", add)
	h.mux.HandleFunc("tasks.look", func(ctx context.Context, t *worker.Task) (any, error) {
		got = t.Message.Headers
		return nil, nil
	})
	h.start()
	stepID := protocol.NewID()
	h.send("tasks.add", []any{int64(1), int64(2)}, nil, client.Link(protocol.Signature{Task: "tasks.look", Options: map[string]any{"task_id": stepID}}))
	h.wait(stepID)
	if _, ok := got["traceparent"]; ok {
		t.Errorf("tracing off, yet the step carries %v", got)
	}
}
