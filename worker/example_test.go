package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/retry"
	memtransport "github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
)

// A worker for tasks.add on the in-process broker, called from Go the way
// Python's add.delay(2, 3).get() calls it. On RabbitMQ or Redis the
// transport and the result backend come from worker/connect instead
// (connect.Open), and the rest is the same.
func Example() {
	ctx := context.Background()
	broker := memtransport.New(memtransport.Config{})
	defer broker.Close()
	results := membackend.New()
	defer results.Close()

	mux := worker.NewMux()
	mux.HandleFunc("tasks.add", func(ctx context.Context, t *worker.Task) (any, error) {
		var x, y int64
		if err := t.Bind(&x, &y); err != nil {
			return nil, err // a TypeError in Python, never retried
		}
		return x + y, nil
	})
	w, err := worker.New(broker, mux, worker.Config{Queues: []string{"celery"}, Backend: results})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }() // until runCtx ends; then a graceful shutdown

	c := client.New(broker, client.Config{Backend: results})
	r, err := c.Send(ctx, "tasks.add", []any{2, 3}, nil)
	if err != nil {
		log.Fatal(err)
	}
	sum, err := r.Get(ctx)
	fmt.Println(sum, err)

	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output: 5 <nil>
}

// A handler is a plain function of a context and a task, so a unit test
// calls it directly, without a broker.
func ExampleHandlerFunc() {
	add := worker.HandlerFunc(func(ctx context.Context, t *worker.Task) (any, error) {
		var x, y int64
		if err := t.Bind(&x, &y); err != nil {
			return nil, err
		}
		return x + y, nil
	})
	mux := worker.NewMux()
	mux.Handle("tasks.add", add)

	ctx := context.Background()
	fmt.Println(add.HandleTask(ctx, &worker.Task{Name: "tasks.add", Args: []any{int64(2), int64(3)}}))
	fmt.Println(add.HandleTask(ctx, &worker.Task{Name: "tasks.add", Args: []any{"two", int64(3)}}))
	// Output:
	// 5 <nil>
	// <nil> protocol: arg 0: cannot bind string "two" to int64
}

// runOnMemory runs a worker serving mux on an in-process broker and result
// backend, and returns a client of it and a function that stops it all.
func runOnMemory(mux *worker.Mux) (*client.Client, func()) {
	broker := memtransport.New(memtransport.Config{})
	results := membackend.New()
	w, err := worker.New(broker, mux, worker.Config{Backend: results, WithoutHeartbeat: true, WithoutControl: true})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return client.New(broker, client.Config{Backend: results}), func() {
		cancel()
		if err := <-done; err != nil {
			log.Print(err)
		}
		broker.Close()
		results.Close()
	}
}

// A task called with keyword arguments, as Python's add.delay(a=2, b=3):
// they bind into the fields of a struct, named by celery or json tags.
func ExampleFuncKwargs() {
	type addArgs struct {
		A int `celery:"a,required"`
		B int `celery:"b"`
	}
	mux := worker.NewMux()
	worker.FuncKwargs(mux, "tasks.add", func(ctx context.Context, args addArgs) (int, error) {
		return args.A + args.B, nil
	})
	c, stop := runOnMemory(mux)
	defer stop()

	ctx := context.Background()
	for _, kwargs := range []map[string]any{{"a": 2, "b": 3}, {"b": 3}} {
		r, err := c.Send(ctx, "tasks.add", nil, kwargs)
		if err != nil {
			log.Fatal(err)
		}
		v, err := r.Get(ctx)
		var te *client.TaskError
		if errors.As(err, &te) {
			fmt.Println(kwargs, "->", te.Type) // a is required
			continue
		}
		fmt.Println(kwargs, "->", v)
	}
	// Output:
	// map[a:2 b:3] -> 5
	// map[b:3] -> TypeError
}

// Celery's task options sit next to the registration. charge and
// errTimeout stand for the application's handler and error; the
// idempotency store of a fleet is connect.Conn.Idempotency (the Redis
// result backend), and the global rate limiter Config.GlobalRateLimiter.
func ExampleTaskOption() {
	store := membackend.NewIdempotency()

	mux := worker.NewMux()
	mux.HandleFunc("payments.charge", charge,
		worker.AcksLate(true),                            // acks_late
		worker.TimeLimit(30*time.Second, 25*time.Second), // time_limit, soft_time_limit
		worker.RateLimit("10/s"),                         // rate_limit (per worker)
		worker.GlobalRateLimit("5/s", "gateway", 1),      // across every worker (Redis)
		worker.Retry(retry.Policy{ // autoretry_for, retry_backoff, max_retries ...
			AutoRetryFor: []retry.Matcher{retry.On(errTimeout)},
			Backoff:      1,
			MaxRetries:   retry.Limited(5),
		}),
		worker.IgnoreResult(false), worker.TrackStarted(true))
	mux.Use(worker.Idempotent(worker.IdempotencyOptions{Store: store})) // middleware, net/http style
	fmt.Println(mux.Names())
	// Output: [payments.charge]
}

var errTimeout = errors.New("gateway: timeout")

func charge(ctx context.Context, t *worker.Task) (any, error) {
	var order string
	if err := t.Bind(&order); err != nil {
		return nil, err
	}
	return "charged " + order, nil
}

// A task whose error is retried automatically (Celery's autoretry_for),
// then succeeds; the client sees only the final result. NoDelay retries at
// once so that the example runs quickly; Backoff: 1 would be
// retry_backoff=True (see the retry package for the delays).
func ExampleRetry() {
	errUnavailable := errors.New("gateway: 503 service unavailable")
	charge := func(ctx context.Context, t *worker.Task) (any, error) {
		if t.Retries < 2 {
			fmt.Printf("attempt %d: unavailable\n", t.Retries+1)
			return nil, errUnavailable
		}
		fmt.Printf("attempt %d: ok\n", t.Retries+1)
		return "charged", nil
	}
	p := retry.Policy{
		AutoRetryFor: []retry.Matcher{retry.On(errUnavailable)},
		MaxRetries:   retry.Limited(5),
		Countdown:    retry.NoDelay,
	}
	mux := worker.NewMux()
	mux.HandleFunc("payments.charge", charge, worker.AcksLate(true), worker.Retry(p))
	c, stop := runOnMemory(mux)
	defer stop()

	ctx := context.Background()
	r, err := c.Send(ctx, "payments.charge", []any{"order-17"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.Get(ctx))
	// Output:
	// attempt 1: unavailable
	// attempt 2: unavailable
	// attempt 3: ok
	// charged <nil>
}

// Middleware wraps every handler of a Mux, as net/http middleware does:
// here it records which tasks ran.
func ExampleMux_Use() {
	mux := worker.NewMux()
	worker.Func(mux, "tasks.add", func(ctx context.Context, a, b int) (int, error) { return a + b, nil })
	mux.Use(func(next worker.Handler) worker.Handler {
		return worker.HandlerFunc(func(ctx context.Context, t *worker.Task) (any, error) {
			v, err := next.HandleTask(ctx, t)
			fmt.Printf("%s%v = %v\n", t.Name, t.Args, v)
			return v, err
		})
	})
	c, stop := runOnMemory(mux)
	defer stop()

	ctx := context.Background()
	r, err := c.Send(ctx, "tasks.add", []any{2, 3}, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := r.Get(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: tasks.add[2 3] = 5
}
