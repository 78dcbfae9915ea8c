package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
)

// harness runs a worker on the in-memory transport and backend.
type harness struct {
	t    testing.TB
	tr   *memory.Transport
	be   *membackend.Backend
	mux  *worker.Mux
	w    *worker.Worker
	prod *client.Client
	cfg  worker.Config
	// wrap, when set before start, wraps the transport the worker uses
	// (a transporttest.Faulty, say); the producer still publishes to tr.
	wrap func(transport.Transport) transport.Transport

	// waitLimit bounds wait (default 20 s); tests in a synctest bubble,
	// where time is virtual, raise it past their longest task.
	waitLimit time.Duration

	cancel context.CancelFunc
	done   chan error
}

func newHarness(t testing.TB, cfg worker.Config) *harness {
	t.Helper()
	h := &harness{t: t, tr: memory.New(memory.Config{}), be: membackend.New(), mux: worker.NewMux()}
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	if cfg.Backend == nil {
		cfg.Backend = h.be
	}
	if len(cfg.Queues) == 0 {
		cfg.Queues = []string{"q"}
	}
	h.cfg = cfg
	h.prod = client.New(h.tr, client.Config{DefaultQueue: cfg.Queues[0]})
	t.Cleanup(func() {
		h.stop()
		h.tr.Close()
		h.be.Close()
	})
	return h
}

// start creates and runs the worker.
func (h *harness) start() {
	h.t.Helper()
	var tr transport.Transport = h.tr
	if h.wrap != nil {
		tr = h.wrap(tr)
	}
	w, err := worker.New(tr, h.mux, h.cfg)
	if err != nil {
		h.t.Fatalf("worker.New: %v", err)
	}
	h.w = w
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- w.Run(ctx) }()
}

// stop shuts the worker down gracefully and returns Run's error.
func (h *harness) stop() error {
	if h.cancel == nil {
		return nil
	}
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		return err
	case <-time.After(60 * time.Second):
		h.t.Fatalf("worker did not stop")
		return nil
	}
}

// stopAsync begins the graceful shutdown and returns where Run's error
// will arrive, so that a test can act while the worker shuts down.
func (h *harness) stopAsync() <-chan error {
	stopped := make(chan error, 1)
	go func() { stopped <- h.stop() }()
	return stopped
}

func (h *harness) send(name string, args []any, kwargs map[string]any, opts ...client.SendOption) string {
	h.t.Helper()
	r, err := h.prod.Send(context.Background(), name, args, kwargs, opts...)
	if err != nil {
		h.t.Fatalf("Send(%s): %v", name, err)
	}
	return r.ID
}

// wait waits for a ready state of id.
func (h *harness) wait(id string) *protocol.ResultMeta {
	h.t.Helper()
	limit := h.waitLimit
	if limit == 0 {
		limit = 20 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	m, err := h.be.Wait(ctx, id)
	if err != nil {
		h.t.Fatalf("waiting for %s: %v", id, err)
	}
	return m
}

// eventually polls cond until it holds or the test times out.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func exc(t testing.TB, m *protocol.ResultMeta) *protocol.ExceptionInfo {
	t.Helper()
	ex, ok := m.Result.(*protocol.ExceptionInfo)
	if !ok {
		t.Fatalf("result of %s (%s) is %T %v, want *ExceptionInfo", m.TaskID, m.Status, m.Result, m.Result)
	}
	return ex
}

func add(ctx context.Context, t *worker.Task) (any, error) {
	var a, b int64
	if err := t.Bind(&a, &b); err != nil {
		return nil, err
	}
	return a + b, nil
}

var errBoom = errors.New("boom")
