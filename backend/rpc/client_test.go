package rpc_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/rpc"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
)

// newClient returns a client on tr, closed when the test ends.
func newClient(t *testing.T, tr transport.Transport, cfg rpc.ClientConfig) *rpc.Client {
	t.Helper()
	c, err := rpc.NewClient(t.Context(), tr, cfg)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newWorkerSide returns the worker's side of the backend on tr.
func newWorkerSide(t *testing.T, tr transport.Transport, cfg rpc.Config) *rpc.Backend {
	t.Helper()
	be, err := rpc.New(tr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = be.Close() })
	return be
}

// reply sends a task's state to the reply queue as a worker does.
func reply(t *testing.T, be *rpc.Backend, replyTo, id string, st protocol.State, result any) {
	t.Helper()
	m := &protocol.ResultMeta{TaskID: id, Status: st, Result: result}
	if err := be.Store(context.Background(), backend.StoreRequest{Meta: m, ReplyTo: replyTo, CorrelationID: id}); err != nil {
		t.Fatalf("Store %s %s: %v", id, st, err)
	}
}

type waitResult struct {
	m   *protocol.ResultMeta
	err error
}

// waitAsync starts a Wait and returns where its outcome arrives.
func waitAsync(ctx context.Context, c *rpc.Client, id string) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		m, err := c.Wait(ctx, id)
		ch <- waitResult{m, err}
	}()
	return ch
}

// returned reports whether the Wait has returned, once every goroutine of
// the bubble is blocked.
func returned(ch <-chan waitResult) (waitResult, bool) {
	synctest.Wait()
	select {
	case r := <-ch:
		return r, true
	default:
		return waitResult{}, false
	}
}

// TestClientRouting: states reach the Wait of their own task, states that
// are not ready wake nobody, and Get follows the latest state.
func TestClientRouting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		c := newClient(t, tr, rpc.ClientConfig{})
		if c.Kind() != rpc.TransientQueue {
			t.Errorf("Kind() = %v on the memory transport, want transient", c.Kind())
		}
		be := newWorkerSide(t, tr, rpc.Config{})
		a, b := waitAsync(t.Context(), c, "a"), waitAsync(t.Context(), c, "b")

		reply(t, be, c.ReplyTo(), "b", protocol.StateStarted, map[string]any{"pid": int64(1), "hostname": "w"})
		reply(t, be, c.ReplyTo(), "a", protocol.StateRetry, &protocol.ExceptionInfo{Type: "ConnectionError", Message: []any{"x"}, Module: "builtins"})
		if _, ok := returned(a); ok {
			t.Fatal("Wait(a) returned on RETRY")
		}
		if _, ok := returned(b); ok {
			t.Fatal("Wait(b) returned on STARTED")
		}
		if m, err := c.Get(t.Context(), "b"); err != nil || m.Status != protocol.StateStarted || m.TaskID != "b" {
			t.Fatalf("Get(b) = %+v, %v; want STARTED", m, err)
		}

		reply(t, be, c.ReplyTo(), "b", protocol.StateSuccess, int64(7))
		r, ok := returned(b)
		if !ok || r.err != nil || r.m.Status != protocol.StateSuccess || r.m.Result != int64(7) {
			t.Fatalf("Wait(b) = %+v (returned %v), want SUCCESS 7", r, ok)
		}
		if _, ok := returned(a); ok {
			t.Fatal("Wait(a) returned on b's SUCCESS")
		}
		reply(t, be, c.ReplyTo(), "a", protocol.StateFailure, &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"nope"}, Module: "builtins"})
		r, ok = returned(a)
		if !ok || r.err != nil || r.m.Status != protocol.StateFailure {
			t.Fatalf("Wait(a) = %+v (returned %v), want FAILURE", r, ok)
		}
		want := &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"nope"}, Module: "builtins"}
		if d := cmp.Diff(any(want), r.m.Result); d != "" {
			t.Errorf("FAILURE result (-want +got):\n%s", d)
		}
	})
}

// TestClientEarlyArrival: a state that arrives before anyone waits is
// kept, so Wait returns at once; client.AsyncResult works on the client.
func TestClientEarlyArrival(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		c := newClient(t, tr, rpc.ClientConfig{})
		be := newWorkerSide(t, tr, rpc.Config{Serializer: "msgpack"})

		r := client.New(tr, client.Config{Backend: c}).AsyncResult("early")
		if st, err := r.State(t.Context()); err != nil || st != protocol.StatePending {
			t.Fatalf("State before any reply = %v, %v; want PENDING", st, err)
		}
		reply(t, be, c.ReplyTo(), "early", protocol.StateSuccess, map[string]any{"sum": int64(5)})
		synctest.Wait()
		v, err := r.Get(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(any(map[string]any{"sum": int64(5)}), v); d != "" {
			t.Errorf("Get (-want +got):\n%s", d)
		}
		// Every reader gets its own copy.
		v.(map[string]any)["sum"] = int64(0)
		if v2, _ := r.Get(t.Context()); v2.(map[string]any)["sum"] != int64(5) {
			t.Error("a caller's change to a result reached the next caller")
		}
		if _, err := c.Get(t.Context(), "nobody"); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("Get(nobody) = %v, want ErrNotFound", err)
		}
	})
}

// TestClientReadyIsFinal: once a task's state is ready, a later state that
// is not (a redelivered copy starting again) is ignored, and a SUCCESS is
// never replaced; a later ready state replaces another one.
func TestClientReadyIsFinal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		c := newClient(t, tr, rpc.ClientConfig{})
		be := newWorkerSide(t, tr, rpc.Config{})
		steps := []struct {
			st   protocol.State
			want protocol.State
		}{
			{protocol.StateStarted, protocol.StateStarted},
			{protocol.StateRetry, protocol.StateRetry},
			{protocol.StateStarted, protocol.StateStarted},
			{protocol.StateFailure, protocol.StateFailure},
			{protocol.StateStarted, protocol.StateFailure},
			{protocol.StateSuccess, protocol.StateSuccess},
			{protocol.StateFailure, protocol.StateSuccess},
			{protocol.StateRetry, protocol.StateSuccess},
		}
		for i, s := range steps {
			var result any
			if s.st == protocol.StateFailure || s.st == protocol.StateRetry {
				result = &protocol.ExceptionInfo{Type: "E", Message: []any{}}
			}
			reply(t, be, c.ReplyTo(), "t", s.st, result)
			synctest.Wait()
			m, err := c.Get(t.Context(), "t")
			if err != nil || m.Status != s.want {
				t.Fatalf("step %d (%s): Get = %v, %v; want %s", i, s.st, m, err, s.want)
			}
		}
	})
}

// TestClientMaxStates: states nobody waits for are bounded, the least
// recently used go first, and a waited-for task is never evicted.
func TestClientMaxStates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		c := newClient(t, tr, rpc.ClientConfig{MaxStates: 2})
		be := newWorkerSide(t, tr, rpc.Config{})
		w := waitAsync(t.Context(), c, "waited")
		synctest.Wait()
		reply(t, be, c.ReplyTo(), "waited", protocol.StateStarted, nil)
		for _, id := range []string{"t1", "t2"} {
			reply(t, be, c.ReplyTo(), id, protocol.StateSuccess, id)
		}
		synctest.Wait()
		if _, err := c.Get(t.Context(), "t1"); err != nil { // t1 is now more recent than t2
			t.Fatal(err)
		}
		reply(t, be, c.ReplyTo(), "t3", protocol.StateSuccess, "t3")
		synctest.Wait()
		for id, want := range map[string]bool{"t1": true, "t2": false, "t3": true, "waited": true} {
			_, err := c.Get(t.Context(), id)
			if got := err == nil; got != want {
				t.Errorf("Get(%s) err = %v, want kept %v", id, err, want)
			}
		}
		reply(t, be, c.ReplyTo(), "waited", protocol.StateSuccess, "w")
		if r, ok := returned(w); !ok || r.err != nil || r.m.Result != "w" {
			t.Fatalf("Wait(waited) = %+v (returned %v)", r, ok)
		}
	})
}

// TestClientWaitContext: a Wait ends with its context; another Wait for
// the same task still gets the state.
func TestClientWaitContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		c := newClient(t, tr, rpc.ClientConfig{})
		be := newWorkerSide(t, tr, rpc.Config{})
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if _, err := c.Wait(ctx, "slow"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait = %v, want the deadline", err)
		}
		w := waitAsync(t.Context(), c, "slow")
		reply(t, be, c.ReplyTo(), "slow", protocol.StateSuccess, true)
		if r, ok := returned(w); !ok || r.err != nil || r.m.Result != true {
			t.Fatalf("Wait = %+v (returned %v)", r, ok)
		}
	})
}

// TestClientClose: Close wakes waiters with ErrClosed and deletes the
// transient queue; every later call returns ErrClosed. The transport stays
// open.
func TestClientClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		before := tr.Broker().Stats().Queues
		c, err := rpc.NewClient(t.Context(), tr, rpc.ClientConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if n := tr.Broker().Stats().Queues; n != before+1 {
			t.Fatalf("%d queues after NewClient, want %d", n, before+1)
		}
		w := waitAsync(t.Context(), c, "t")
		synctest.Wait()
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if r, ok := returned(w); !ok || !errors.Is(r.err, backend.ErrClosed) {
			t.Fatalf("Wait after Close = %+v (returned %v), want ErrClosed", r, ok)
		}
		if n := tr.Broker().Stats().Queues; n != before {
			t.Errorf("%d queues after Close, want %d (the reply queue deleted)", n, before)
		}
		if _, err := c.Wait(t.Context(), "t"); !errors.Is(err, backend.ErrClosed) {
			t.Errorf("Wait = %v", err)
		}
		if _, err := c.Get(t.Context(), "t"); !errors.Is(err, backend.ErrClosed) {
			t.Errorf("Get = %v", err)
		}
		err = c.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "t", Status: protocol.StateSuccess}, ReplyTo: c.ReplyTo()})
		if !errors.Is(err, backend.ErrClosed) {
			t.Errorf("Store = %v", err)
		}
		if err := c.Close(); !errors.Is(err, backend.ErrClosed) {
			t.Errorf("second Close = %v", err)
		}
		if err := tr.Publish(t.Context(), &transport.Publishing{RoutingKey: "q", Message: protocol.Message{Body: []byte("{}")}}); err != nil {
			t.Errorf("the transport was closed: %v", err)
		}
	})
}

// TestClientTransportClosed: when the transport closes under it, waiters
// learn it; states already received stay readable.
func TestClientTransportClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		c := newClient(t, tr, rpc.ClientConfig{})
		be := newWorkerSide(t, tr, rpc.Config{})
		reply(t, be, c.ReplyTo(), "done", protocol.StateSuccess, int64(1))
		synctest.Wait()
		w := waitAsync(t.Context(), c, "pending")
		synctest.Wait()
		_ = tr.Close()
		if r, ok := returned(w); !ok || !errors.Is(r.err, transport.ErrClosed) {
			t.Fatalf("Wait = %+v (returned %v), want transport.ErrClosed", r, ok)
		}
		if m, err := c.Wait(t.Context(), "done"); err != nil || m.Result != int64(1) {
			t.Errorf("Wait(done) = %v, %v", m, err)
		}
		if _, err := c.Get(t.Context(), "pending"); !errors.Is(err, transport.ErrClosed) {
			t.Errorf("Get(pending) = %v, want transport.ErrClosed", err)
		}
	})
}

// TestClientOddReplies: a reply that is not a result is dropped; one whose
// body lacks task_id is routed by its correlation id.
func TestClientOddReplies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		c := newClient(t, tr, rpc.ClientConfig{})
		send := func(corr, body string) {
			t.Helper()
			err := tr.Publish(t.Context(), &transport.Publishing{RoutingKey: c.ReplyTo(), Message: protocol.Message{
				ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8", Headers: map[string]any{},
				Properties: protocol.Properties{CorrelationID: corr}, Body: []byte(body),
			}})
			if err != nil {
				t.Fatal(err)
			}
		}
		send("x", `not json`)
		send("x", `{"result": 1}`)
		send("old", `{"status": "SUCCESS", "result": 3, "traceback": null, "children": []}`)
		m, err := c.Wait(t.Context(), "old")
		if err != nil || m.Result != int64(3) || m.TaskID != "old" {
			t.Fatalf("Wait(old) = %+v, %v", m, err)
		}
		if _, err := c.Get(t.Context(), "x"); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("Get(x) = %v, want ErrNotFound", err)
		}
	})
}

// pubsubTransport makes Subscribe behave as on Redis, where a broadcast
// subscription is pub/sub: what workers send to the queue's name through
// the default exchange stays in the queue (here: the subscription reads
// another queue).
type pubsubTransport struct{ *memory.Transport }

func (p pubsubTransport) Subscribe(ctx context.Context, b transport.Broadcast) (transport.Subscription, error) {
	b.Queue += ".pubsub"
	return p.Transport.Subscribe(ctx, b)
}

// TestClientAutoList: on a broker whose subscriptions do not see the
// queue, AutoQueue consumes the queue as a list; the probe is not taken for
// a state, and Close purges the queue.
func TestClientAutoList(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New(memory.Config{})
		defer mem.Close()
		tr := pubsubTransport{mem}
		start := time.Now()
		c, err := rpc.NewClient(t.Context(), tr, rpc.ClientConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Kind() != rpc.ListQueue {
			t.Fatalf("Kind() = %v, want list", c.Kind())
		}
		if d := time.Since(start); d > 200*time.Millisecond {
			t.Errorf("the probe took %v", d)
		}
		be := newWorkerSide(t, tr, rpc.Config{})
		w := waitAsync(t.Context(), c, "t")
		reply(t, be, c.ReplyTo(), "t", protocol.StateSuccess, "ok")
		if r, ok := returned(w); !ok || r.err != nil || r.m.Result != "ok" {
			t.Fatalf("Wait = %+v (returned %v)", r, ok)
		}
		if n, _ := mem.Len(t.Context(), c.ReplyTo()); n != 0 {
			t.Errorf("%d messages left in the reply queue, want 0 (all acknowledged)", n)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		// A reply after Close stays in the queue, but nothing from before.
		reply(t, be, c.ReplyTo(), "late", protocol.StateSuccess, nil)
		if n, _ := mem.Len(t.Context(), c.ReplyTo()); n != 1 {
			t.Errorf("%d messages in the reply queue, want 1", n)
		}
	})
}

// lostProbe is a broker where the probe arrives nowhere the client can see.
type lostProbe struct{ pubsubTransport }

func (lostProbe) Len(context.Context, string) (int, error) { return 0, nil }

func TestClientProbeLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New(memory.Config{})
		defer mem.Close()
		start := time.Now()
		_, err := rpc.NewClient(t.Context(), lostProbe{pubsubTransport{mem}}, rpc.ClientConfig{})
		if err == nil {
			t.Fatal("NewClient succeeded")
		}
		if d := time.Since(start); d != 10*time.Second {
			t.Errorf("gave up after %v, want 10s", d)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if _, err := rpc.NewClient(ctx, lostProbe{pubsubTransport{mem}}, rpc.ClientConfig{}); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("NewClient = %v, want the context's deadline", err)
		}
	})
}

// TestClientListQueue: ListQueue chosen explicitly works on the memory
// transport too, with the queue's x-expires.
func TestClientListQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		c := newClient(t, tr, rpc.ClientConfig{Kind: rpc.ListQueue, Queue: "my-replies", Expires: time.Minute})
		if c.ReplyTo() != "my-replies" || c.Kind() != rpc.ListQueue {
			t.Fatalf("ReplyTo %q kind %v", c.ReplyTo(), c.Kind())
		}
		be := newWorkerSide(t, tr, rpc.Config{})
		reply(t, be, "my-replies", "t", protocol.StateRevoked, &protocol.ExceptionInfo{Type: "TaskRevokedError", Message: []any{"revoked"}, Module: "celery.exceptions"})
		m, err := c.Wait(t.Context(), "t")
		if err != nil || m.Status != protocol.StateRevoked {
			t.Fatalf("Wait = %+v, %v", m, err)
		}
	})
}

// TestClientStoreToItself: Store sends to a reply queue like the worker
// side, so a client's own queue receives what it stores.
func TestClientStoreToItself(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		c := newClient(t, tr, rpc.ClientConfig{})
		err := c.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "self", Status: protocol.StateSuccess, Result: "me"}, ReplyTo: c.ReplyTo()})
		if err != nil {
			t.Fatal(err)
		}
		if v, err := client.New(tr, client.Config{Backend: c}).AsyncResult("self").Get(t.Context()); err != nil || v != "me" {
			t.Fatalf("Get = %v, %v", v, err)
		}
	})
}

func TestNewClientErrors(t *testing.T) {
	if _, err := rpc.NewClient(t.Context(), nil, rpc.ClientConfig{}); err == nil {
		t.Error("NewClient accepted a nil transport")
	}
	tr := memory.New(memory.Config{})
	defer tr.Close()
	if _, err := rpc.NewClient(t.Context(), tr, rpc.ClientConfig{Kind: 7}); err == nil {
		t.Error("NewClient accepted an unknown kind")
	}
	if _, err := rpc.NewClient(t.Context(), tr, rpc.ClientConfig{Config: rpc.Config{Serializer: "pickle"}}); err == nil {
		t.Error("NewClient accepted pickle")
	}
}
