package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap/zaptest"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// The client tests (issue 20) drive Python Celery workers and celeriac
// workers from the Go client (package client) on both brokers, with results
// in the Redis backend (db 15, the worker tests' own; unique it_w_ queues).
// The Python worker runs testdata/py/it_client_app.py; the celeriac worker
// registers the same task names with worker.Func and worker.FuncKwargs
// (clientTasks), so one suite (runClientSuite) checks both.

// clientWait bounds every wait: a deadline against hangs, not an
// assertion about speed.
const clientWait = 60 * time.Second

// areaArgs are the keyword arguments of tasks.area.
type areaArgs struct {
	Width  int    `json:"width"`
	Height int    `json:"height"`
	Unit   string `json:"unit,omitempty"`
}

// areaResult is what tasks.area returns.
type areaResult struct {
	Area int    `json:"area"`
	Unit string `json:"unit"`
}

// clientTasks registers, on a celeriac worker, the tasks of
// it_client_app.py through the typed handlers.
func clientTasks(m *worker.Mux) {
	worker.Func(m, "tasks.add", func(ctx context.Context, x, y int) (int, error) { return x + y, nil })
	worker.Func(m, "tasks.mul", func(ctx context.Context, x, y int) (int, error) { return x * y, nil })
	worker.Func(m, "tasks.tsum", func(ctx context.Context, xs []int) (int, error) {
		s := 0
		for _, x := range xs {
			s += x
		}
		return s, nil
	})
	worker.Func(m, "tasks.fail", func(ctx context.Context, msg string) error {
		return worker.NewException("ValueError", msg)
	})
	worker.Func(m, "tasks.slow_id", func(ctx context.Context, i int, secs float64) (int, error) {
		t := time.NewTimer(time.Duration(secs * float64(time.Second)))
		defer t.Stop()
		select {
		case <-t.C:
			return i, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	})
	worker.FuncKwargs(m, "tasks.area", func(ctx context.Context, a areaArgs) (areaResult, error) {
		if a.Unit == "" {
			a.Unit = "m"
		}
		return areaResult{Area: a.Width * a.Height, Unit: a.Unit + "2"}, nil
	})
}

// immutable is s.si(): the parent's result is not prepended to its args.
func immutable(s client.Signature) client.Signature {
	s.Immutable = true
	return s
}

// clientConn opens the Go client's own connections to bc (its transport
// and result backend) and a Redis client on the result backend, for the
// test's observations. defaultQueue receives tasks sent without a queue.
func clientConn(t *testing.T, bc brokerCase, defaultQueue string) (*client.Client, *goredis.Client, *connect.Conn) {
	t.Helper()
	conn, err := connect.Open(t.Context(), connect.Options{BrokerURL: bc.broker, ResultBackend: bc.backend, RedisStagedPop: itStagedPop(),
		Logger: zaptest.NewLogger(t), ConnectionName: "it-client-" + defaultQueue})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	opt, err := goredis.ParseURL(bc.backend)
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(opt)
	t.Cleanup(func() {
		rdb.Close()
		conn.Close()
	})
	return client.New(conn.Transport, client.Config{Backend: conn.Backend, DefaultQueue: defaultQueue}), rdb, conn
}

// startClientPyWorker starts a Python worker of it_client_app on queue
// (threads pool, 10 threads: a group of 10 runs at once).
func startClientPyWorker(t *testing.T, bc brokerCase, queue string) {
	t.Helper()
	env := map[string]string{"IT_BROKER": pyBrokerURL(bc.broker), "IT_BACKEND": bc.backend, "IT_QUEUE": queue}
	startPythonWorker(t, env, "it_client_app", "-Q", queue, "-P", "threads", "-c", "10",
		"-n", "py-"+queue+"@%h", "--without-mingle", "--without-gossip")
}

// TestClientPythonWorker: the Go client sends tasks and canvases to a
// Python Celery worker and reads their results, on both brokers.
func TestClientPythonWorker(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		startClientPyWorker(t, bc, q)
		c, rdb, conn := clientConn(t, bc, q)
		runClientSuite(t, "python", c, rdb, conn)
	})
}

// TestClientCeleriacWorker: the same suite against a celeriac worker whose
// tasks are typed handlers.
func TestClientCeleriacWorker(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		startGoWorker(t, bc, q, worker.Config{Concurrency: 10}, clientTasks)
		c, rdb, conn := clientConn(t, bc, q)
		runClientSuite(t, "celeriac", c, rdb, conn)
	})
}

// runClientSuite checks what issue 20 asks of the client against the
// worker consuming c's default queue.
func runClientSuite(t *testing.T, workerKind string, c *client.Client, rdb *goredis.Client, conn *connect.Conn) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*clientWait)
	defer cancel()

	t.Run("add", func(t *testing.T) {
		r, err := c.Send(ctx, "tasks.add", []any{2, 3}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if v, err := r.Get(ctx); err != nil || v != int64(5) {
			t.Fatalf("add(2, 3).Get = %#v, %v; want 5", v, err)
		}
		m, err := r.Meta(ctx)
		if err != nil || m.Status != protocol.StateSuccess || m.Result != int64(5) || m.TaskID != r.ID || m.DateDone.IsZero() {
			t.Fatalf("Meta = %+v, %v", m, err)
		}
		if st, err := r.State(ctx); err != nil || st != protocol.StateSuccess {
			t.Fatalf("State = %s, %v", st, err)
		}
		if ok, err := r.Ready(ctx); !ok || err != nil {
			t.Fatalf("Ready = %v, %v", ok, err)
		}
		if err := r.Forget(ctx); err != nil {
			t.Fatal(err)
		}
		if st, err := r.State(ctx); err != nil || st != protocol.StatePending {
			t.Fatalf("State after Forget = %s, %v; want PENDING", st, err)
		}
	})

	t.Run("typed", func(t *testing.T) {
		add := client.NewTyped[[2]int, int](c, "tasks.add")
		if got, err := add.Call(ctx, [2]int{2, 3}); err != nil || got != 5 {
			t.Fatalf("typed add.Call = %d, %v; want 5", got, err)
		}
		area := client.NewTyped[areaArgs, areaResult](c, "tasks.area")
		if got, err := area.Call(ctx, areaArgs{Width: 3, Height: 4}); err != nil || got != (areaResult{12, "m2"}) {
			t.Fatalf("typed area.Call = %+v, %v", got, err)
		}
		r, err := area.Send(ctx, areaArgs{Width: 5, Height: 6, Unit: "cm"})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := r.Get(ctx); err != nil || got != (areaResult{30, "cm2"}) {
			t.Fatalf("typed area.Send(...).Get = %+v, %v", got, err)
		}
		var sigs []client.Signature
		for i := 1; i <= 3; i++ {
			s, err := area.Signature(areaArgs{Width: i, Height: i})
			if err != nil {
				t.Fatal(err)
			}
			sigs = append(sigs, s)
		}
		sa, err := add.Signature([2]int{40, 2})
		if err != nil {
			t.Fatal(err)
		}
		g, err := c.ApplyGroup(ctx, client.Group(append(sigs, sa)...))
		if err != nil {
			t.Fatal(err)
		}
		got, err := g.Get(ctx)
		want := []any{
			map[string]any{"area": int64(1), "unit": "m2"},
			map[string]any{"area": int64(4), "unit": "m2"},
			map[string]any{"area": int64(9), "unit": "m2"},
			int64(42),
		}
		if err != nil || !cmp.Equal(got, want) {
			t.Fatalf("group of typed signatures = %#v, %v; want %#v", got, err, want)
		}
	})

	t.Run("chain", func(t *testing.T) {
		r, err := c.Apply(ctx, client.Chain(
			client.NewSignature("tasks.add", []any{2, 3}, nil),
			client.NewSignature("tasks.mul", []any{4}, nil),
			client.NewSignature("tasks.add", []any{1}, nil),
		))
		if err != nil {
			t.Fatal(err)
		}
		m, err := r.Meta(ctx)
		if err != nil || m.Status != protocol.StateSuccess || m.Result != int64(21) {
			t.Fatalf("chain(add(2, 3), mul(4), add(1)) = %+v, %v; want 21", m, err)
		}
		// The last step's parent is the second step, whose parent is the
		// first: the chain ran as a chain, not as three tasks.
		if m.ParentID == "" {
			t.Errorf("the last step has no parent_id: %+v", m)
		}
	})

	t.Run("group", func(t *testing.T) {
		const n = 10
		members := make([]client.Signature, n)
		for i := range members {
			// The first member sleeps longest: they finish in reverse order.
			members[i] = client.NewSignature("tasks.slow_id", []any{i, 0.1 * float64(n-1-i)}, nil)
		}
		g, err := c.ApplyGroup(ctx, client.Group(members...))
		if err != nil {
			t.Fatal(err)
		}
		got, err := g.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]any, n)
		for i := range want {
			want[i] = int64(i)
		}
		if !cmp.Equal(got, want) {
			t.Fatalf("group Get = %v; want %v", got, want)
		}
		first, err := g.Results[0].Meta(ctx)
		if err != nil {
			t.Fatal(err)
		}
		last, err := g.Results[n-1].Meta(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !last.DateDone.Before(first.DateDone) {
			t.Errorf("the members did not finish out of order: member 0 done %v, member %d done %v", first.DateDone, n-1, last.DateDone)
		}
		if first.GroupID != g.ID || g.ID == "" {
			t.Errorf("member 0's group_id = %q, want the group's %q", first.GroupID, g.ID)
		}
	})

	t.Run("chord", func(t *testing.T) {
		header := make([]client.Signature, 20)
		want := int64(0)
		for i := range header {
			header[i] = client.NewSignature("tasks.add", []any{i, i}, nil)
			want += int64(2 * i)
		}
		r, err := c.Apply(ctx, client.Chord(header, client.NewSignature("tasks.tsum", nil, nil)))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := r.Get(ctx); err != nil || v != want {
			t.Fatalf("chord(20 x add, tsum).Get = %#v, %v; want %d", v, err, want)
		}
	})

	t.Run("failure", func(t *testing.T) {
		r, err := c.Send(ctx, "tasks.fail", []any{"bad thing"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		v, err := r.Get(ctx)
		var te *client.TaskError
		if !errors.As(err, &te) {
			t.Fatalf("fail.Get = %#v, %v; want a *client.TaskError", v, err)
		}
		if te.Type != "ValueError" || te.Module != "builtins" || te.Message() != "bad thing" || te.State != protocol.StateFailure ||
			te.TaskID != r.ID || err.Error() != "ValueError: bad thing" || !strings.Contains(te.Traceback, "ValueError: bad thing") {
			t.Fatalf("fail.Get error = %#v", te)
		}
		t.Logf("%s traceback:\n%s", workerKind, te.Traceback)
	})

	t.Run("revoke", func(t *testing.T) {
		sent := time.Now()
		r, err := c.Send(ctx, "tasks.add", []any{1, 2}, nil, client.Countdown(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Revoke(ctx, false); err != nil {
			t.Fatal(err)
		}
		v, err := r.Get(ctx)
		var te *client.TaskError
		if !errors.As(err, &te) {
			t.Fatalf("revoked task's Get = %#v, %v; want a *client.TaskError", v, err)
		}
		// What Python 5.2 and 5.5 store for a task revoked before it ran
		// (Request._announce_revoked → mark_as_revoked(reason="revoked")):
		// REVOKED, TaskRevokedError("revoked") from celery.exceptions, no
		// traceback. Python stores it when the countdown is due, celeriac
		// when the revoke arrives.
		want := &client.TaskError{TaskID: r.ID, State: protocol.StateRevoked, Type: "TaskRevokedError",
			Module: "celery.exceptions", Args: []any{"revoked"}}
		if diff := cmp.Diff(want, te); diff != "" {
			t.Fatalf("revoked task's error mismatch (-want +got):\n%s", diff)
		}
		t.Logf("%s: REVOKED stored %v after the send", workerKind, time.Since(sent).Round(time.Millisecond))
		raw, err := rdb.Get(ctx, "celery-task-meta-"+r.ID).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: stored for a revoked countdown task: %s", workerKind, raw)
		var doc map[string]any
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		// Celery 5.2 and celeriac write date_done without an offset, 5.5
		// with +00:00.
		if _, err := protocol.ParseTime(fmt.Sprint(doc["date_done"])); err != nil {
			t.Errorf("date_done: %v", err)
		}
		delete(doc, "date_done")
		wantDoc := map[string]any{"status": "REVOKED", "traceback": nil, "children": []any{}, "task_id": r.ID,
			"result": map[string]any{"exc_type": "TaskRevokedError", "exc_message": []any{"revoked"}, "exc_module": "celery.exceptions"}}
		if workerKind == "python" && celeryVersion() == "5.6" {
			// Celery 5.6.2+ stores REVOKED from the revoke command itself
			// (control._revoke → mark_as_revoked without a request,
			// celery/celery#9869): no request, so children is null.
			wantDoc["children"] = nil
		}
		if diff := cmp.Diff(wantDoc, doc); diff != "" {
			t.Errorf("stored document mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("chain failure", func(t *testing.T) {
		// The worker marks the remaining steps failed too (Celery's
		// mark_as_failure), so Get on the chain's last step wakes up.
		r, err := c.Apply(ctx, client.Chain(
			client.NewSignature("tasks.add", []any{1, 2}, nil),
			immutable(client.NewSignature("tasks.fail", []any{"broken"}, nil)),
			client.NewSignature("tasks.add", []any{3}, nil),
		))
		if err != nil {
			t.Fatal(err)
		}
		var te *client.TaskError
		if _, err := r.Get(ctx); !errors.As(err, &te) || te.Type != "ValueError" || te.Message() != "broken" || te.TaskID != r.ID {
			t.Fatalf("Get of a chain whose second step fails = %v; want ValueError: broken", err)
		}
	})

	t.Run("group failure", func(t *testing.T) {
		g, err := c.ApplyGroup(ctx, client.Group(
			client.NewSignature("tasks.add", []any{1, 1}, nil),
			client.NewSignature("tasks.fail", []any{"member 1"}, nil),
		))
		if err != nil {
			t.Fatal(err)
		}
		var te *client.TaskError
		if _, err := g.Get(ctx); !errors.As(err, &te) || te.Type != "ValueError" || te.TaskID != g.Results[1].ID {
			t.Fatalf("Get of a group with a failing member = %v", err)
		}
	})

	t.Run("chord failure", func(t *testing.T) {
		r, err := c.Apply(ctx, client.Chord([]client.Signature{
			client.NewSignature("tasks.add", []any{1, 1}, nil),
			client.NewSignature("tasks.fail", []any{"header"}, nil),
		}, client.NewSignature("tasks.tsum", nil, nil)))
		if err != nil {
			t.Fatal(err)
		}
		var te *client.TaskError
		_, err = r.Get(ctx)
		if !errors.As(err, &te) || te.Type != "ChordError" || te.TaskID != r.ID || !strings.Contains(te.Message(), "ValueError('header')") {
			t.Fatalf("Get of a chord whose header fails = %v (%#v); want the body's ChordError", err, te)
		}
	})

	t.Run("nested canvas", func(t *testing.T) {
		// A group between two steps becomes a chord: each member gets the
		// first step's result, the last step their list.
		r, err := c.Apply(ctx, client.Chain(
			client.NewSignature("tasks.add", []any{1, 2}, nil),
			client.Group(client.NewSignature("tasks.add", []any{10}, nil), client.NewSignature("tasks.add", []any{20}, nil)),
			client.NewSignature("tasks.tsum", nil, nil),
		))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := r.Get(ctx); err != nil || v != int64(36) {
			t.Fatalf("chain(add(1, 2), group(add(10), add(20)), tsum) = %#v, %v; want 36", v, err)
		}
		// A chain in a chord's header counts as one part, with its last
		// step's result.
		r, err = c.Apply(ctx, client.Chord([]client.Signature{
			client.Chain(client.NewSignature("tasks.add", []any{1, 1}, nil), client.NewSignature("tasks.mul", []any{10}, nil)),
			client.NewSignature("tasks.add", []any{5, 5}, nil),
		}, client.NewSignature("tasks.tsum", nil, nil)))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := r.Get(ctx); err != nil || v != int64(30) {
			t.Fatalf("chord([chain(add(1, 1), mul(10)), add(5, 5)], tsum) = %#v, %v; want 30", v, err)
		}
		// A chain in a chord's header whose first step fails: the failure
		// reaches the chain's last step, which counts the part, so the body
		// fails (ChordError) instead of waiting for ever (Celery's
		// mark_as_failure calls on_chord_part_return for it).
		short, stop := context.WithTimeout(ctx, 20*time.Second)
		defer stop()
		r, err = c.Apply(short, client.Chord([]client.Signature{
			client.Chain(client.NewSignature("tasks.fail", []any{"first step"}, nil), client.NewSignature("tasks.mul", []any{10}, nil)),
			client.NewSignature("tasks.add", []any{5, 5}, nil),
		}, client.NewSignature("tasks.tsum", nil, nil)))
		if err != nil {
			t.Fatal(err)
		}
		var te *client.TaskError
		if _, err := r.Get(short); !errors.As(err, &te) || te.Type != "ChordError" || !strings.Contains(te.Message(), "first step") {
			t.Errorf("chord([chain(fail, mul(10)), add(5, 5)], tsum) = %v; want the body's ChordError", err)
		}
		// A chain in a group: the group's result is the chain's last step.
		g, err := c.ApplyGroup(ctx, client.Group(
			client.Chain(client.NewSignature("tasks.add", []any{1, 1}, nil), client.NewSignature("tasks.mul", []any{10}, nil)),
			client.NewSignature("tasks.add", []any{5, 5}, nil),
		))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := g.Get(ctx); err != nil || !cmp.Equal(v, []any{int64(20), int64(10)}) {
			t.Fatalf("group(chain(add(1, 1), mul(10)), add(5, 5)) = %v, %v; want [20 10]", v, err)
		}
		m, err := g.Results[0].Meta(ctx)
		if err != nil || m.GroupID != g.ID {
			t.Errorf("the chain's last step's group_id = %q (%v), want the group's %q", m.GroupID, err, g.ID)
		}
	})

	t.Run("link", func(t *testing.T) {
		cb := protocol.NewID()
		r, err := c.Send(ctx, "tasks.add", []any{2, 2}, nil,
			client.Link(client.NewSignature("tasks.add", []any{10}, nil, client.TaskID(cb))))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := r.Get(ctx); err != nil || v != int64(4) {
			t.Fatalf("add(2, 2) = %#v, %v", v, err)
		}
		if v, err := c.AsyncResult(cb).Get(ctx); err != nil || v != int64(14) {
			t.Fatalf("its link add(10) = %#v, %v; want 14", v, err)
		}
	})

	t.Run("wake", func(t *testing.T) {
		measureWake(t, ctx, workerKind, c, rdb, conn)
	})
}

// measureWake measures how soon AsyncResult.Get returns after the
// result's PUBLISH: for each task, a subscriber of the test's own notes
// when the PUBLISH of the ready state reaches it, and the difference with
// when Get returned is the client's wake-up delay (decoding included).
// Each task sleeps 30 ms, so that Get is already waiting on the channel.
func measureWake(t *testing.T, ctx context.Context, workerKind string, c *client.Client, rdb *goredis.Client, conn *connect.Conn) {
	const n = 50
	keyer, ok := conn.Backend.(interface{ TaskKey(string) string })
	if !ok {
		t.Fatalf("the result backend %T has no TaskKey", conn.Backend)
	}
	delays := make([]time.Duration, 0, n)
	for i := range n {
		id := protocol.NewID()
		sub := rdb.Subscribe(ctx, keyer.TaskKey(id))
		if _, err := sub.Receive(ctx); err != nil {
			t.Fatal(err)
		}
		published := make(chan time.Time, 1)
		go func() {
			defer close(published)
			for {
				msg, err := sub.ReceiveMessage(ctx)
				if err != nil {
					return
				}
				at := time.Now()
				var doc struct{ Status protocol.State }
				if json.Unmarshal([]byte(msg.Payload), &doc) == nil && doc.Status.Ready() {
					published <- at
					return
				}
			}
		}()
		r, err := c.Send(ctx, "tasks.slow_id", []any{i, 0.03}, nil, client.TaskID(id))
		if err != nil {
			t.Fatal(err)
		}
		v, err := r.Get(ctx)
		returned := time.Now()
		if err != nil || v != int64(i) {
			t.Fatalf("slow_id(%d).Get = %#v, %v", i, v, err)
		}
		at, ok := <-published
		sub.Close()
		if !ok {
			t.Fatalf("task %d: no PUBLISH of its result seen", i)
		}
		delays = append(delays, returned.Sub(at))
	}
	slices.Sort(delays)
	median, p95, worst := delays[n/2], delays[(n*95+99)/100-1], delays[n-1]
	line := fmt.Sprintf("CLIENT WAKE: %s worker, %s: Get returned after the result's PUBLISH: median %v, p95 %v, max %v, min %v (%d tasks)",
		workerKind, strings.SplitN(t.Name(), "/", 3)[1], median, p95, worst, delays[0], n)
	t.Log(line)
	fmt.Println(line)
	if median > 5*time.Millisecond {
		t.Errorf("median wake-up delay %v > 5ms", median)
	}
}

// TestClientMixedChain: a chain whose steps alternate between a Python
// worker and a celeriac worker (each on its own queue, named in the
// steps' options), and chords whose header runs on one and body on the
// other, on both brokers.
func TestClientMixedChain(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		pyQ, goQ := uniqueQueue(t, bc), uniqueQueue(t, bc)
		startClientPyWorker(t, bc, pyQ)
		startGoWorker(t, bc, goQ, worker.Config{Concurrency: 4}, clientTasks)
		c, _, _ := clientConn(t, bc, goQ)
		ctx, cancel := context.WithTimeout(t.Context(), clientWait)
		defer cancel()
		on := map[string]client.SendOption{"python": client.Queue(pyQ), "celeriac": client.Queue(goQ)}

		r, err := c.Apply(ctx, client.Chain(
			client.NewSignature("tasks.add", []any{1, 2}, nil, on["python"]),
			client.NewSignature("tasks.add", []any{10}, nil, on["celeriac"]),
			client.NewSignature("tasks.mul", []any{2}, nil, on["python"]),
			client.NewSignature("tasks.add", []any{5}, nil, on["celeriac"]),
		))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := r.Get(ctx); err != nil || v != int64(31) {
			t.Fatalf("mixed chain = %#v, %v; want ((1+2)+10)*2+5 = 31", v, err)
		}

		for _, k := range [][2]string{{"python", "celeriac"}, {"celeriac", "python"}} {
			header := make([]client.Signature, 5)
			for i := range header {
				header[i] = client.NewSignature("tasks.add", []any{i, i}, nil, on[k[0]])
			}
			r, err := c.Apply(ctx, client.Chord(header, client.NewSignature("tasks.tsum", nil, nil, on[k[1]])))
			if err != nil {
				t.Fatal(err)
			}
			if v, err := r.Get(ctx); err != nil || v != int64(20) {
				t.Fatalf("chord with its header on %s and its body on %s = %#v, %v; want 20", k[0], k[1], v, err)
			}
		}
	})
}
