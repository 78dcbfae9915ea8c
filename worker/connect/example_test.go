package connect_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// memory:// is an in-process broker and result backend: a worker and its
// callers in one process, for tests and demos. The same code runs on
// RabbitMQ or Redis with another URL.
func ExampleOpen() {
	ctx := context.Background()
	conn, err := connect.Open(ctx, connect.Options{BrokerURL: "memory://", ResultBackend: "memory://"})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	mux := worker.NewMux()
	worker.Func(mux, "tasks.add", func(ctx context.Context, a, b int) (int, error) { return a + b, nil })
	w, err := worker.New(conn.Transport, mux, worker.Config{Backend: conn.Backend})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()

	c := client.New(conn.Transport, client.Config{Backend: conn.Backend})
	r, err := c.Send(ctx, "tasks.add", []any{2, 3}, nil)
	if err != nil {
		log.Fatal(err)
	}
	sum, err := r.Get(ctx)
	fmt.Println(conn.BrokerScheme, sum, err)

	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output: memory 5 <nil>
}

// RabbitMQ as the broker and Redis for results, as a Python app's
// broker_url and result_backend name them. (It needs both, so it only
// compiles.)
func ExampleOpen_amqp() {
	ctx := context.Background()
	conn, err := connect.Open(ctx, connect.Options{
		BrokerURL:     "amqp://guest:guest@localhost:5672//",
		ResultBackend: "redis://localhost:6379/1",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	c := client.New(conn.Transport, client.Config{Backend: conn.Backend})
	r, err := c.Send(ctx, "tasks.add", []any{2, 3}, nil)
	if err != nil {
		log.Fatal(err)
	}
	sum, err := r.Get(ctx)
	log.Print(sum, err)
}

// Redis as broker and result backend, with kombu's transport options.
// (It needs Redis, so it only compiles.)
func ExampleOpen_redis() {
	ctx := context.Background()
	conn, err := connect.Open(ctx, connect.Options{
		BrokerURL:         "redis://localhost:6379/0",
		ResultBackend:     "redis://localhost:6379/1",
		VisibilityTimeout: 2 * time.Hour, // broker_transport_options visibility_timeout
	})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	mux := worker.NewMux()
	worker.Func(mux, "tasks.add", func(ctx context.Context, a, b int) (int, error) { return a + b, nil })
	w, err := worker.New(conn.Transport, mux, worker.Config{
		Backend:           conn.Backend,
		GlobalRateLimiter: conn.RateLimiter, // the Redis result backend's token buckets
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		log.Print(err)
	}
}

// A worker's main, configured as a Python Celery app is: from
// CELERY_BROKER_URL and CELERY_RESULT_BACKEND. SIGINT or SIGTERM starts a
// graceful shutdown. (It needs a broker, so it only compiles.)
func ExampleFromEnv() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	conn, err := connect.Open(ctx, connect.FromEnv(connect.Options{}))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	mux := worker.NewMux()
	worker.Func(mux, "tasks.add", func(ctx context.Context, a, b int) (int, error) { return a + b, nil })
	w, err := worker.New(conn.Transport, mux, worker.Config{Backend: conn.Backend})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(ctx); err != nil { // until a signal; then a graceful shutdown
		log.Print(err)
	}
}

// Client certificates as Celery's broker_use_ssl and redis_backend_use_ssl
// give them.
func ExampleSSLOptions() {
	c, err := connect.Open(context.Background(), connect.Options{
		BrokerURL:     "amqp://u:p@rabbit-a:5671//;amqp://u:p@rabbit-b:5671//", // TLS: BrokerSSL is set
		ResultBackend: "redis://redis:6380/1",                                  // rediss://, as BackendSSL is set
		BrokerSSL: &connect.SSLOptions{KeyFile: "/etc/celeriac/client.key", CertFile: "/etc/celeriac/client.pem",
			CACerts: "/etc/celeriac/ca.pem", CertReqs: "CERT_REQUIRED"},
		BackendSSL: &connect.SSLOptions{KeyFile: "/etc/celeriac/client.key", CertFile: "/etc/celeriac/client.pem",
			CACerts: "/etc/celeriac/ca.pem"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}
