// Package client is the Go caller's side of Celery tasks: it sends tasks
// and canvases (chains, groups, chords) that Python Celery workers and
// celeriac workers accept, waits for their results as Python's AsyncResult
// and GroupResult do, revokes them, and sends remote-control commands. It
// needs no worker: a Go service imports client with a transport and a
// result backend.
//
//	c := client.New(tr, client.Config{Backend: be})
//	r, err := c.Send(ctx, "tasks.add", []any{2, 3}, nil)
//	v, err := r.Get(ctx) // waits; a failed task is a *client.TaskError
//
// Get waits without polling on backends that can wait (backend/redis wakes
// on the result's PUBLISH, as Celery's client does; backend/rpc on the
// reply queue; backend/sql on PostgreSQL's NOTIFY; backend/memory), and
// polls with a growing delay (2 ms up to 200 ms) on the others.
package client

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// Config configures a Client. The zero value sends JSON to the "celery"
// queue and reads no results.
type Config struct {
	// Backend is the result backend the tasks' workers write to, which
	// AsyncResult reads. Nil: results cannot be read (ErrNoBackend).
	Backend backend.Backend
	// DefaultQueue receives tasks without a queue or route
	// (task_default_queue). Default "celery".
	DefaultQueue string
	// Routes maps task names to queues (a static task_routes).
	Routes map[string]string
	// Serializer is the content type of task bodies (task_serializer).
	// Default application/json.
	Serializer string
	// Compression is a compression MIME type (task_compression), or empty.
	Compression string
	// Origin is the origin header. Default "gen<pid>@<hostname>", as Python.
	Origin string
	// ReplyTo is the reply_to of every task sent, where the RPC result
	// backend sends its states. Default: the Backend's ReplyTo() when it
	// has one (backend/rpc's client side), else none.
	ReplyTo string
	// TracerProvider turns on tracing: each message is published in a
	// PRODUCER span "apply_async/<task name>", a child of the context given
	// to Send, and carries that span's context in its headers, where a
	// Python worker with opentelemetry-instrumentation-celery (or celeriac)
	// continues the trace. Nil, the default, is off.
	TracerProvider trace.TracerProvider
	// Propagator writes the context into headers. Default: W3C trace
	// context and baggage.
	Propagator propagation.TextMapPropagator
}

// ErrNoBackend: the Client has no result backend to read results from.
var ErrNoBackend = errors.New("client: no result backend configured")

// ErrNoChords: the result backend cannot count chord parts (only the Redis
// backend can), so a chord sent with it would never fire its body.
var ErrNoChords = publish.ErrNoChords

// Client sends tasks and reads their results. It is safe for concurrent
// use.
type Client struct {
	pub transport.Publisher
	be  backend.Backend
	p   *publish.Producer
	// clock is the Lamport clock of the control commands it sends.
	clock publish.Clock
}

// New returns a Client publishing through pub (any transport.Transport).
func New(pub transport.Publisher, cfg Config) *Client {
	if cfg.ReplyTo == "" {
		if r, ok := cfg.Backend.(interface{ ReplyTo() string }); ok {
			cfg.ReplyTo = r.ReplyTo()
		}
	}
	return &Client{pub: pub, be: cfg.Backend, p: publish.New(pub, publish.Config{
		DefaultQueue:   cfg.DefaultQueue,
		Routes:         cfg.Routes,
		Serializer:     cfg.Serializer,
		Compression:    cfg.Compression,
		Origin:         cfg.Origin,
		ReplyTo:        cfg.ReplyTo,
		TracerProvider: cfg.TracerProvider,
		Propagator:     cfg.Propagator,
	})}
}

// Send publishes task name with positional and keyword arguments, like
// Python's send_task / apply_async, and returns its result. It returns once
// the broker confirmed the message.
func (c *Client) Send(ctx context.Context, name string, args []any, kwargs map[string]any, opts ...SendOption) (*AsyncResult, error) {
	var o publish.Options
	for _, opt := range opts {
		opt(&o)
	}
	id, err := c.p.Send(ctx, name, args, kwargs, &o)
	if err != nil {
		return nil, err
	}
	return c.AsyncResult(id), nil
}

// AsyncResult returns the result of the task with id, as Python's
// AsyncResult(id).
func (c *Client) AsyncResult(id string) *AsyncResult { return &AsyncResult{ID: id, c: c} }

// GroupResult returns the result of a group whose tasks have ids, in the
// group's order.
func (c *Client) GroupResult(groupID string, ids ...string) *GroupResult {
	g := &GroupResult{ID: groupID}
	for _, id := range ids {
		g.Results = append(g.Results, c.AsyncResult(id))
	}
	return g
}

// Revoke revokes tasks on every worker, Python and celeriac alike, as
// app.control.revoke does: a task not started yet is discarded when it
// arrives; with terminate, a running one is stopped (its context is
// cancelled on celeriac; Python sends signal, SIGTERM by default).
func (c *Client) Revoke(ctx context.Context, terminate bool, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	args := map[string]any{"task_id": toAnys(ids), "terminate": terminate}
	if terminate {
		args["signal"] = "SIGTERM"
	}
	return publishControl(ctx, c.pub, &c.clock, "revoke", args, ControlOptions{}, "", "")
}

func toAnys(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// Wait blocks until the task is ready (SUCCESS, FAILURE or REVOKED) and
// returns its result document, like AsyncResult.get(propagate=False). It
// uses the backend's own Wait when it has one, and polls otherwise.
func Wait(ctx context.Context, be backend.Backend, taskID string) (*protocol.ResultMeta, error) {
	if be == nil {
		return nil, ErrNoBackend
	}
	if w, ok := be.(waiter); ok {
		return w.Wait(ctx, taskID)
	}
	delay := 2 * time.Millisecond
	for {
		m, err := be.Get(ctx, taskID)
		switch {
		case err == nil && m.Status.Ready():
			return m, nil
		case err != nil && !errors.Is(err, backend.ErrNotFound):
			return nil, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		delay = min(delay*2, 200*time.Millisecond)
	}
}

// waiter is implemented by backends that can wait for a task to be ready
// without polling.
type waiter interface {
	Wait(ctx context.Context, taskID string) (*protocol.ResultMeta, error)
}
