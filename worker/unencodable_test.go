package worker_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/transporttest"
	"github.com/celeriac/celeriac/worker"
)

// TestCallbackUnencodable: a callback whose message no transport can carry
// (a NaN header, from the signature's options) fails the task, as Celery's
// tracer fails it on an EncodeError, instead of requeueing it to run again
// and fail again forever (acks_late) or storing SUCCESS with the callback
// silently lost.
func TestCallbackUnencodable(t *testing.T) {
	for _, acksLate := range []bool{false, true} {
		t.Run(fmt.Sprintf("acks_late=%v", acksLate), func(t *testing.T) {
			h := newHarness(t, worker.Config{})
			var runs, callbacks atomic.Int32
			h.mux.HandleFunc("tasks.add", func(ctx context.Context, t *worker.Task) (any, error) {
				runs.Add(1)
				return int64(3), nil
			}, worker.AcksLate(acksLate))
			h.mux.HandleFunc("tasks.cb", func(ctx context.Context, t *worker.Task) (any, error) {
				callbacks.Add(1)
				return nil, nil
			})
			h.start()
			cb := protocol.Signature{Task: "tasks.cb", Options: map[string]any{"headers": map[string]any{"x": math.NaN()}}}
			m := h.wait(h.send("tasks.add", nil, nil, client.Link(cb)))
			if m.Status != protocol.StateFailure {
				t.Fatalf("result %s %v, want FAILURE", m.Status, m.Result)
			}
			if got := fmt.Sprint(m.Result); !strings.Contains(got, "cannot encode") {
				t.Errorf("result %s, want the encoding error", got)
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("the task ran %d times, want once", n)
			}
			if n := callbacks.Load(); n != 0 {
				t.Errorf("the callback ran %d times, want never", n)
			}
		})
	}
}

// TestRetryUnencodable: a retry the transport refuses as unencodable fails
// the task at once: it is not tried again within the settle budget, nor
// (acks_late) requeued to run and fail again.
func TestRetryUnencodable(t *testing.T) {
	h := newHarness(t, worker.Config{})
	var retries atomic.Int32 // publishes of the retry
	h.wrap = func(tr transport.Transport) transport.Transport {
		ft := transporttest.NewFaulty(tr)
		ft.SetFault(transporttest.OpPublish, func(c transporttest.Call) error {
			if c.Publishing.RoutingKey == "q" {
				retries.Add(1)
				return fmt.Errorf("test: %w: header \"x\" is NaN", protocol.ErrUnencodable)
			}
			return nil
		})
		return ft
	}
	var runs atomic.Int32
	h.mux.HandleFunc("tasks.flaky", func(ctx context.Context, t *worker.Task) (any, error) {
		runs.Add(1)
		return nil, retry.Now(errBoom)
	}, worker.AcksLate(true))
	h.start()
	m := h.wait(h.send("tasks.flaky", nil, nil))
	if m.Status != protocol.StateFailure {
		t.Fatalf("result %s %v, want FAILURE", m.Status, m.Result)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the task ran %d times, want once", n)
	}
	if n := retries.Load(); n != 1 {
		t.Errorf("the retry was published %d times, want once", n)
	}
}
