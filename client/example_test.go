package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/transport"
	memtransport "github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// Sending a task and waiting for its result, as Python's
// add.delay(2, 3).get() does. The worker may be Python Celery or celeriac,
// on any broker; here a celeriac worker runs in the same process, on the
// in-process broker (see runWorker).
func Example() {
	broker := memtransport.New(memtransport.Config{})
	defer broker.Close()
	results := membackend.New()
	defer results.Close()
	defer runWorker(broker, results)()

	ctx := context.Background()
	c := client.New(broker, client.Config{Backend: results})
	r, err := c.Send(ctx, "tasks.add", []any{2, 3}, nil)
	if err != nil {
		log.Fatal(err)
	}
	sum, err := r.Get(ctx) // waits; a failed task is a *client.TaskError
	fmt.Println(sum, err)
	// Output: 5 <nil>
}

// apply_async's options are SendOptions. The broker and result backend
// come from Celery URLs (CELERY_BROKER_URL, CELERY_RESULT_BACKEND). (It
// needs a broker and a worker, so it only compiles.)
func ExampleClient_Send_options() {
	ctx := context.Background()
	conn, err := connect.Open(ctx, connect.FromEnv(connect.Options{}))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	c := client.New(conn.Transport, client.Config{Backend: conn.Backend})
	r, err := c.Send(ctx, "tasks.add", []any{2, 3}, nil,
		client.Countdown(10*time.Second), client.Queue("math"), client.Priority(5),
		client.Link(client.NewSignature("tasks.log_result", nil, nil)))
	if err != nil {
		log.Fatal(err)
	}
	sum, err := r.Get(ctx) // a failed task is a *client.TaskError
	log.Print(sum, err)
}

// chain(add.s(1, 2), add.s(3), add.s(4)): each step gets the previous
// result as its first argument; the chain's result is the last step's.
func ExampleChain() {
	broker := memtransport.New(memtransport.Config{})
	defer broker.Close()
	results := membackend.New()
	defer results.Close()
	defer runWorker(broker, results)()

	ctx := context.Background()
	c := client.New(broker, client.Config{Backend: results})
	r, err := c.Apply(ctx, client.Chain(
		client.NewSignature("tasks.add", []any{1, 2}, nil),
		client.NewSignature("tasks.add", []any{3}, nil),
		client.NewSignature("tasks.add", []any{4}, nil),
	))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.Get(ctx))
	// Output: 10 <nil>
}

// group(add.s(i, i) for i in range(4)): the tasks run in parallel, and the
// results come back in the group's order, whichever finished first.
func ExampleGroup() {
	broker := memtransport.New(memtransport.Config{})
	defer broker.Close()
	results := membackend.New()
	defer results.Close()
	defer runWorker(broker, results)()

	ctx := context.Background()
	c := client.New(broker, client.Config{Backend: results})
	var members []client.Signature
	for i := range 4 {
		members = append(members, client.NewSignature("tasks.add", []any{i, i}, nil))
	}
	g, err := c.ApplyGroup(ctx, client.Group(members...))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(g.Get(ctx))
	// Output: [0 2 4 6] <nil>
}

// chord([add.s(i, i) for i in range(4)], tsum.s()): the body runs once
// with the header's results, in order. The result backend completes the
// chord: backend/redis (or backend/memory, in one process) counts the
// header's parts; with backend/sql, celery.chord_unlock polls them.
func ExampleChord() {
	broker := memtransport.New(memtransport.Config{})
	defer broker.Close()
	results := membackend.New()
	defer results.Close()
	defer runWorker(broker, results)()

	ctx := context.Background()
	c := client.New(broker, client.Config{Backend: results})
	var header []client.Signature
	for i := range 4 {
		header = append(header, client.NewSignature("tasks.add", []any{i, i}, nil))
	}
	r, err := c.Apply(ctx, client.Chord(header, client.NewSignature("tasks.tsum", nil, nil)))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.Get(ctx))
	// Output: 12 <nil>
}

// OnError gives a whole chain an errback, as Python's
// chain(...).on_error(sig): whichever step fails, it is sent.
func ExampleOnError() {
	broker := memtransport.New(memtransport.Config{})
	defer broker.Close()
	results := membackend.New()
	defer results.Close()
	defer runWorker(broker, results)()

	ctx := context.Background()
	c := client.New(broker, client.Config{Backend: results})
	fail := client.NewSignature("tasks.fail", []any{"boom"}, nil)
	fail.Immutable = true
	cleanup := client.NewSignature("tasks.add", []any{40, 2}, nil, client.TaskID("cleanup-1"))
	cleanup.Immutable = true // else it gets the failed task's id as its first argument
	chain := client.Chain(client.NewSignature("tasks.add", []any{1, 1}, nil), fail)
	r, err := c.Apply(ctx, client.OnError(chain, cleanup))
	if err != nil {
		log.Fatal(err)
	}
	_, err = r.Get(ctx)
	fmt.Println(err)
	fmt.Println(c.AsyncResult("cleanup-1").Get(ctx))
	// Output:
	// ValueError: boom
	// 42 <nil>
}

// A typed reference to a task that takes keyword arguments: the worker
// side is worker.FuncKwargs with the same struct.
func ExampleNewTyped() {
	broker := memtransport.New(memtransport.Config{})
	defer broker.Close()
	results := membackend.New()
	defer results.Close()
	defer runWorker(broker, results)()

	ctx := context.Background()
	c := client.New(broker, client.Config{Backend: results})
	mul := client.NewTyped[mulArgs, int](c, "tasks.mul")
	product, err := mul.Call(ctx, mulArgs{A: 6, B: 7}) // tasks.mul.delay(a=6, b=7).get()
	fmt.Println(product, err)

	// An array or slice is sent as positional arguments: a worker.Func task.
	add := client.NewTyped[[2]int, int](c, "tasks.add")
	sum, err := add.Call(ctx, [2]int{2, 3}) // tasks.add.delay(2, 3).get()
	fmt.Println(sum, err)
	// Output:
	// 42 <nil>
	// 5 <nil>
}

// A task that failed raises in Python; in Go, Get returns a *TaskError
// with the exception's type, message and the remote traceback.
func ExampleTaskError() {
	broker := memtransport.New(memtransport.Config{})
	defer broker.Close()
	results := membackend.New()
	defer results.Close()
	defer runWorker(broker, results)()

	ctx := context.Background()
	c := client.New(broker, client.Config{Backend: results})
	r, err := c.Send(ctx, "tasks.fail", []any{"bad input"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	_, err = r.Get(ctx)
	var te *client.TaskError
	if errors.As(err, &te) {
		fmt.Println(te.State, te.Type, te.Message())
	}
	fmt.Println(err)
	// Output:
	// FAILURE ValueError bad input
	// ValueError: bad input
}

// Revoking a task that waits for its countdown: every worker drops it, and
// its result is REVOKED (Python raises TaskRevokedError).
func ExampleAsyncResult_Revoke() {
	broker := memtransport.New(memtransport.Config{})
	defer broker.Close()
	results := membackend.New()
	defer results.Close()
	defer runWorker(broker, results)()

	ctx := context.Background()
	c := client.New(broker, client.Config{Backend: results})
	r, err := c.Send(ctx, "tasks.add", []any{2, 3}, nil, client.Countdown(time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Revoke(ctx, false); err != nil {
		log.Fatal(err)
	}
	_, err = r.Get(ctx)
	var te *client.TaskError
	if errors.As(err, &te) {
		fmt.Println(te.State, te.Type)
	}
	// Output: REVOKED TaskRevokedError
}

// Remote control, as `celery inspect ping` does: every worker that
// answers within the timeout.
func ExampleControl_Call() {
	broker := memtransport.New(memtransport.Config{})
	defer broker.Close()
	results := membackend.New()
	defer results.Close()
	defer runWorker(broker, results)()

	ctl := client.NewControl(broker)
	// Limit: one worker runs here, so stop at its reply.
	replies, err := ctl.Call(context.Background(), "ping", nil, client.ControlOptions{Timeout: time.Second, Limit: 1})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range replies {
		fmt.Println(r.Value)
	}
	// Output: map[ok:pong]
}

// mulArgs are tasks.mul's keyword arguments.
type mulArgs struct {
	A int `json:"a"`
	B int `json:"b"`
}

// runWorker starts a celeriac worker with the examples' tasks on broker,
// storing results in results, and returns a function that stops it. It
// returns once the worker answers a ping, so that remote control (a
// revoke) reaches it. In production the workers are other processes, in
// Python or Go, on the same broker and result backend.
func runWorker(broker transport.Transport, results *membackend.Backend) (stop func()) {
	mux := worker.NewMux()
	worker.Func(mux, "tasks.add", func(ctx context.Context, a, b int) (int, error) { return a + b, nil })
	worker.Func(mux, "tasks.tsum", func(ctx context.Context, xs []int) (int, error) {
		sum := 0
		for _, x := range xs {
			sum += x
		}
		return sum, nil
	})
	worker.FuncKwargs(mux, "tasks.mul", func(ctx context.Context, a mulArgs) (int, error) { return a.A * a.B, nil })
	worker.Func(mux, "tasks.fail", func(ctx context.Context, msg string) error {
		return worker.NewException("ValueError", msg)
	})
	w, err := worker.New(broker, mux, worker.Config{Backend: results, WithoutHeartbeat: true})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	ctl := client.NewControl(broker)
	for {
		replies, err := ctl.Call(ctx, "ping", nil, client.ControlOptions{Timeout: 20 * time.Millisecond, Limit: 1})
		if err != nil {
			log.Fatal(err)
		}
		if len(replies) > 0 {
			break
		}
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			log.Print(err)
		}
	}
}
