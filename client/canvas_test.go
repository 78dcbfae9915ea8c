package client_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	mtransport "github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
)

// celeriacOnMemory runs a celeriac worker with typed handlers on the
// memory transport and backend, and returns a Client for it.
func celeriacOnMemory(t *testing.T) (*client.Client, *memory.Backend) {
	t.Helper()
	tr := mtransport.New(mtransport.Config{})
	be := memory.New()
	mux := worker.NewMux()
	worker.Func(mux, "tasks.add", func(_ context.Context, a, b int) (int, error) { return a + b, nil })
	worker.Func(mux, "tasks.tsum", func(_ context.Context, xs []int) (int, error) {
		s := 0
		for _, x := range xs {
			s += x
		}
		return s, nil
	})
	worker.Func(mux, "tasks.slow_echo", func(ctx context.Context, i int) (int, error) {
		// Later members finish first, so that order comes from the group.
		select {
		case <-time.After(time.Duration(10-i) * time.Millisecond):
		case <-ctx.Done():
		}
		return i, nil
	})
	worker.Func(mux, "tasks.fail", func(context.Context) error {
		return worker.NewException("ValueError", "bad thing")
	})
	type mulArgs struct {
		X int `json:"x"`
		Y int `json:"y"`
	}
	worker.FuncKwargs(mux, "tasks.mul", func(_ context.Context, a mulArgs) (int, error) { return a.X * a.Y, nil })
	w, err := worker.New(tr, mux, worker.Config{Queues: []string{"celery"}, Backend: be, Concurrency: 16, WithoutHeartbeat: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		be.Close()
		tr.Close()
	})
	return client.New(tr, client.Config{Backend: be}), be
}

func TestCanvasOnCeleriac(t *testing.T) {
	c, _ := celeriacOnMemory(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	add := func(args ...any) client.Signature { return client.NewSignature("tasks.add", args, nil) }

	t.Run("chain", func(t *testing.T) {
		r, err := c.Apply(ctx, client.Chain(add(1, 2), add(3), add(4)))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := r.Get(ctx); err != nil || fmt.Sprint(v) != "10" {
			t.Fatalf("chain = %v, %v; want 10", v, err)
		}
	})
	t.Run("immutable step", func(t *testing.T) {
		s := add(100, 1)
		s.Immutable = true
		r, err := c.Apply(ctx, client.Chain(add(1, 2), s))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := r.Get(ctx); err != nil || fmt.Sprint(v) != "101" {
			t.Fatalf("chain with .si() = %v, %v; want 101", v, err)
		}
	})
	t.Run("group", func(t *testing.T) {
		var members []client.Signature
		for i := range 10 {
			members = append(members, client.NewSignature("tasks.slow_echo", []any{i}, nil))
		}
		g, err := c.ApplyGroup(ctx, client.Group(members...))
		if err != nil {
			t.Fatal(err)
		}
		got, err := g.Get(ctx)
		if err != nil || fmt.Sprint(got) != "[0 1 2 3 4 5 6 7 8 9]" {
			t.Fatalf("group = %v, %v", got, err)
		}
	})
	t.Run("chord", func(t *testing.T) {
		var header []client.Signature
		for i := range 20 {
			header = append(header, add(i, 0))
		}
		r, err := c.Apply(ctx, client.Chord(header, client.NewSignature("tasks.tsum", nil, nil)))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := r.Get(ctx); err != nil || fmt.Sprint(v) != "190" {
			t.Fatalf("chord = %v, %v; want 190", v, err)
		}
	})
	t.Run("chain through a group becomes a chord", func(t *testing.T) {
		r, err := c.Apply(ctx, client.Chain(
			client.Group(add(1, 1), add(2, 2)),
			client.NewSignature("tasks.tsum", nil, nil),
			add(1000),
		))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := r.Get(ctx); err != nil || fmt.Sprint(v) != "1006" {
			t.Fatalf("chain(group, tsum, add) = %v, %v; want 1006", v, err)
		}
	})
	t.Run("chain in a chord header", func(t *testing.T) {
		// The chain's last step is the part: 12, not its first step's 2.
		r, err := c.Apply(ctx, client.Chord([]client.Signature{client.Chain(add(1, 1), add(10)), add(5, 5)},
			client.NewSignature("tasks.tsum", nil, nil)))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := r.Get(ctx); err != nil || fmt.Sprint(v) != "22" {
			t.Fatalf("chord([chain(add(1, 1), add(10)), add(5, 5)], tsum) = %v, %v; want 22", v, err)
		}
		// Its first step fails: the part is counted failed for the last
		// step, and the body fails instead of waiting.
		r, err = c.Apply(ctx, client.Chord([]client.Signature{
			client.Chain(client.NewSignature("tasks.fail", nil, nil), add(10)), add(5, 5),
		}, client.NewSignature("tasks.tsum", nil, nil)))
		if err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var te *client.TaskError
		if _, err := r.Get(short); !errors.As(err, &te) || te.Type != "ChordError" {
			t.Fatalf("chord whose header chain fails = %v; want ChordError", err)
		}
	})
	t.Run("link", func(t *testing.T) {
		cb := client.NewSignature("tasks.add", []any{10}, nil, client.TaskID("cb-"+protocol.NewID()))
		r, err := c.Send(ctx, "tasks.add", []any{1, 2}, nil, client.Link(cb))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Get(ctx); err != nil {
			t.Fatal(err)
		}
		if v, err := c.AsyncResult(cb.TaskID()).Get(ctx); err != nil || fmt.Sprint(v) != "13" {
			t.Fatalf("link = %v, %v; want 13", v, err)
		}
	})
	t.Run("failure", func(t *testing.T) {
		r, err := c.Send(ctx, "tasks.fail", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.Get(ctx)
		var te *client.TaskError
		if !errors.As(err, &te) || te.Type != "ValueError" || te.Message() != "bad thing" || te.State != protocol.StateFailure {
			t.Fatalf("Get of a failing task = %v", err)
		}
	})
	t.Run("typed", func(t *testing.T) {
		type mulArgs struct {
			X int `json:"x"`
			Y int `json:"y"`
		}
		mul := client.NewTyped[mulArgs, int](c, "tasks.mul")
		if v, err := mul.Call(ctx, mulArgs{X: 6, Y: 7}); err != nil || v != 42 {
			t.Fatalf("typed mul = %v, %v; want 42", v, err)
		}
		bad := client.NewTyped[mulArgs, string](c, "tasks.mul")
		if _, err := bad.Call(ctx, mulArgs{X: 1, Y: 1}); err == nil {
			t.Fatal("binding an int result into a string succeeded")
		}
		if _, err := client.NewTyped[int, int](c, "tasks.mul").Send(ctx, 5); err == nil {
			t.Fatal("non-object arguments were sent")
		}
	})
	t.Run("revoke countdown task", func(t *testing.T) {
		r, err := c.Send(ctx, "tasks.add", []any{1, 1}, nil, client.Countdown(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Revoke(ctx, false); err != nil {
			t.Fatal(err)
		}
		_, err = r.Get(ctx)
		var te *client.TaskError
		if !errors.As(err, &te) || te.State != protocol.StateRevoked || te.Type != "TaskRevokedError" {
			t.Fatalf("Get of a revoked task = %v", err)
		}
	})
	t.Run("forget", func(t *testing.T) {
		r, err := c.Send(ctx, "tasks.add", []any{1, 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Get(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.Forget(ctx); err != nil {
			t.Fatal(err)
		}
		if st, err := r.State(ctx); err != nil || st != protocol.StatePending {
			t.Fatalf("State after Forget = %s, %v; want PENDING", st, err)
		}
	})
	t.Run("group in Apply", func(t *testing.T) {
		if _, err := c.Apply(ctx, client.Group(add(1, 1))); err == nil {
			t.Fatal("Apply took a group")
		}
		if _, err := c.ApplyGroup(ctx, add(1, 1)); err == nil {
			t.Fatal("ApplyGroup took a plain signature")
		}
	})
}

func TestNoBackend(t *testing.T) {
	c := client.New(nil, client.Config{})
	if _, err := c.AsyncResult("x").Get(context.Background()); !errors.Is(err, client.ErrNoBackend) {
		t.Fatalf("Get without a backend = %v", err)
	}
}

// TestNestedCanvasOnCeleriac: the nested canvases Python Celery computes
// (5.2.6 and 5.5.2 give these results), on a celeriac worker.
func TestNestedCanvasOnCeleriac(t *testing.T) {
	c, _ := celeriacOnMemory(t)
	add := func(args ...any) client.Signature { return client.NewSignature("tasks.add", args, nil) }
	tsum := func() client.Signature { return client.NewSignature("tasks.tsum", nil, nil) }
	for _, tc := range []struct {
		name string
		sig  client.Signature
		want string
	}{
		// The inner chord is one part of the outer one: its body counts it.
		{"chord in a chord header", client.Chord([]client.Signature{client.Chord([]client.Signature{add(1, 1), add(2, 2)}, tsum()), add(3, 3)}, tsum()), "12"},
		// A chain ending in a chord: the chord's body stands for the chain.
		{"chain ending in a chord in a chord header", client.Chord([]client.Signature{client.Chain(add(1, 1), client.Chord([]client.Signature{add(2), add(3)}, tsum()))}, tsum()), "9"},
		// chain(g1, g2, s) is chord(g1, chord(g2, s)), as Celery's prepare_steps upgrades it.
		{"group then group in a chain", client.Chain(client.Group(add(1, 1), add(2, 2)), client.Group(tsum(), tsum()), tsum()), "12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := c.Apply(ctx, tc.sig)
			if err != nil {
				t.Fatal(err)
			}
			if v, err := r.Get(ctx); err != nil || fmt.Sprint(v) != tc.want {
				t.Fatalf("= %v, %v; want %s", v, err, tc.want)
			}
		})
	}
}

// TestGetFollowsParents: the result of chord([chord([a], fail), b],
// chord([c], d)) never gets a state (the outer chord's failure is stored
// on its body chord's id), and Python's get() raises the failed body
// from the header all the same, following the result's parents; so does
// Get (found by the differential canvas tester, where Get hung).
func TestGetFollowsParents(t *testing.T) {
	c, _ := celeriacOnMemory(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	add := func(args ...any) client.Signature { return client.NewSignature("tasks.add", args, nil) }
	fail := client.NewSignature("tasks.fail", nil, nil)
	fail.Immutable = true
	inner := client.Chord([]client.Signature{add(1, 1)}, fail)
	body := client.Chord([]client.Signature{add(4, 4)}, client.NewSignature("tasks.tsum", nil, nil))
	r, err := c.Apply(ctx, client.Chord([]client.Signature{inner, add(3, 3)}, body))
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Get(ctx)
	var te *client.TaskError
	if !errors.As(err, &te) || te.Type != "ValueError" {
		t.Fatalf("Get = %v; want the header chord body's ValueError", err)
	}
}
