package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/worker"
)

// The trace a Python producer starts: the instrumentation would make these
// ids up; the test fixes them to follow them.
const (
	itTraceID = "0af7651916cd43dd8448eb211c80319c"
	itSpanID  = "b7ad6b7169203331"
)

// TestTracingAcrossPythonAndGo: on both brokers and both protocols, a
// Python producer's trace runs on through a celeriac worker and back into a
// Python worker.
//
//   - a celeriac run span has the producer's trace id and span as parent;
//   - chain(go_step, py_look): the Python worker running the second step
//     receives a traceparent of the same trace, whose parent is the span
//     celeriac published the step in;
//   - a retried task keeps the trace, one run span per attempt;
//   - a failing task's span has status Error and an exception event.
func TestTracingAcrossPythonAndGo(t *testing.T) {
	for _, bc := range workerBrokers(t) {
		for _, proto := range []int{2, 1} {
			t.Run(fmt.Sprintf("%s/protocol=%d", bc.name, proto), func(t *testing.T) {
				t.Parallel()
				testTracingAcross(t, bc, proto)
			})
		}
	}
}

func testTracingAcross(t *testing.T, bc brokerCase, proto int) {
	q := uniqueQueue(t, bc)
	pyq := uniqueQueue(t, bc)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	// The Go worker routes the Python step as the Python app's task_routes
	// do: a worker applies its own routes to what it publishes.
	cfg := worker.Config{Concurrency: 4, TracerProvider: tp, Routes: map[string]string{"trace.py_look": pyq}}
	startGoWorker(t, bc, q, cfg, func(m *worker.Mux) {
		m.HandleFunc("trace.go_step", func(ctx context.Context, t *worker.Task) (any, error) {
			var s string
			if err := t.Bind(&s); err != nil {
				return nil, err
			}
			return "go:" + s, nil
		})
		m.HandleFunc("trace.go_retry", func(ctx context.Context, t *worker.Task) (any, error) {
			if t.Retries == 0 {
				return nil, retry.Now(errors.New("once more"))
			}
			return "retried", nil
		})
		m.HandleFunc("trace.go_fail", func(ctx context.Context, t *worker.Task) (any, error) {
			return nil, worker.NewException("ValueError", "traced failure")
		})
	})
	env := map[string]string{"IT_BROKER": pyBrokerURL(bc.broker), "IT_BACKEND": bc.backend, "IT_QUEUE": q,
		"IT_PY_QUEUE": pyq, "IT_PROTOCOL": fmt.Sprint(proto)}
	startPythonWorker(t, env, "it_trace_app", "-Q", pyq, "-P", "solo", "-c", "1")
	env["IT_TRACEPARENT"] = "00-" + itTraceID + "-" + itSpanID + "-01"
	out := runPython(t, 2*time.Minute, env, `
import os
from celery import chain
from it_trace_app import *
tp = os.environ["IT_TRACEPARENT"]
h = {"traceparent": tp}
step = go_step.apply_async(args=("x",), headers=h)
assert step.get(timeout=30) == "go:x"
c = chain(go_step.s("y"), py_look.s()).apply_async(headers=h)
got = c.get(timeout=60)
assert got["value"] == "go:y", got
print("CHAIN", got["traceparent"])
r = go_retry.apply_async(headers=h)
assert r.get(timeout=30) == "retried"
f = go_fail.apply_async(headers=h)
try:
    f.get(timeout=30)
    raise SystemExit("no failure")
except ValueError as e:
    assert str(e) == "traced failure", repr(e)
print("IDS", step.id, f.id)
print("OK")
`)
	if !strings.HasSuffix(strings.TrimSpace(out), "OK") {
		t.Fatalf("python client:\n%s", out)
	}
	ids := outputIDs(out)
	if len(ids) != 2 {
		t.Fatalf("no ids in:\n%s", out)
	}

	// The run spans of the Go tasks, by name.
	runs := map[string][]sdktrace.ReadOnlySpan{}
	pubs := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		switch {
		case strings.HasPrefix(s.Name(), "run/"):
			runs[s.Name()] = append(runs[s.Name()], s)
		case strings.HasPrefix(s.Name(), "apply_async/"):
			pubs[s.Name()] = append(pubs[s.Name()], s)
		}
	}
	for name, n := range map[string]int{"run/trace.go_step": 2, "run/trace.go_retry": 2, "run/trace.go_fail": 1} {
		if len(runs[name]) != n {
			t.Fatalf("%d %s spans, want %d (spans: %v)", len(runs[name]), name, n, rec.Ended())
		}
		for _, s := range runs[name] {
			if s.SpanContext().TraceID().String() != itTraceID {
				t.Errorf("%s in trace %s, want the producer's %s", name, s.SpanContext().TraceID(), itTraceID)
			}
			if s.SpanKind() != trace.SpanKindConsumer {
				t.Errorf("%s kind %v", name, s.SpanKind())
			}
		}
	}
	for _, s := range runs["run/trace.go_step"] {
		if s.Parent().SpanID().String() != itSpanID {
			t.Errorf("run/trace.go_step parent %s, want the producer's span %s", s.Parent().SpanID(), itSpanID)
		}
	}

	// Python -> Go -> Python: the Python worker got celeriac's context.
	var chainTP string
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "CHAIN "); ok {
			chainTP = rest
		}
	}
	look := pubs["apply_async/trace.py_look"]
	if len(look) != 1 {
		t.Fatalf("%d apply_async/trace.py_look spans, want 1", len(look))
	}
	want := fmt.Sprintf("00-%s-%s-01", itTraceID, look[0].SpanContext().SpanID())
	if chainTP != want {
		t.Errorf("the Python worker received traceparent %q, want %q (celeriac's publish span)", chainTP, want)
	}

	// A retry: two attempts, the second under the retry's publish span.
	retries := pubs["apply_async/trace.go_retry"]
	if len(retries) != 1 {
		t.Fatalf("%d retry publish spans, want 1", len(retries))
	}
	parents := map[string]bool{}
	for _, s := range runs["run/trace.go_retry"] {
		parents[s.Parent().SpanID().String()] = true
	}
	if !parents[itSpanID] || !parents[retries[0].SpanContext().SpanID().String()] {
		t.Errorf("retry attempts' parents %v, want the producer's span and the retry's publish span", parents)
	}

	f := runs["run/trace.go_fail"][0]
	if f.Status().Code.String() != "Error" {
		t.Errorf("failed run status %v, want Error", f.Status())
	}
	found := false
	for _, e := range f.Events() {
		for _, kv := range e.Attributes {
			if e.Name == "exception" && kv.Key == "exception.type" && kv.Value.AsString() == "ValueError" {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("no exception event of type ValueError on the failed run: %v", f.Events())
	}
}
