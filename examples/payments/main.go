// Command payments charges orders exactly once under at-least-once
// delivery: a celeriac worker runs payments.charge(order_id, amount), which
// Python producers call like any Celery task, against a fake payment gateway
// that deduplicates on an Idempotency-Key header, as Stripe does.
//
//	go run ./examples/payments gateway &                 # the fake gateway on 127.0.0.1:8099
//	export CELERY_BROKER_URL=redis://127.0.0.1:6379/0    # or amqp://guest:guest@127.0.0.1:5672//
//	export CELERY_RESULT_BACKEND=redis://127.0.0.1:6379/1
//	go run ./examples/payments worker &
//	/usr/bin/python3 examples/payments/producer.py
//
// The worker makes the task idempotent per order (worker.Idempotent with the
// Redis result backend as the shared store, key "order-<order_id>"), passes
// that key to the gateway, acknowledges late, retries transient gateway
// failures with exponential backoff and jitter, fails permanent 4xx at once,
// and dead-letters what fails for good (celeriac dlq list/replay). See
// README.md next to this file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: payments gateway|worker [flags] (-h for the flags)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "gateway":
		err = runGateway(ctx, os.Args[2:])
	case "worker":
		err = runWorker(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (gateway or worker)", os.Args[1])
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(1)
	}
}

func runGateway(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("payments gateway", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8099", "listen address (port 0: any free port)")
	var cfg GatewayConfig
	fs.DurationVar(&cfg.Latency, "latency", 50*time.Millisecond, "time to answer a charge (the charge is made when the request arrives)")
	fs.Float64Var(&cfg.FailRate, "fail-rate", 0.2, "fraction of requests answered 503 without charging")
	fs.Float64Var(&cfg.SlowRate, "slow-rate", 0.05, "fraction of charges answered only after -slow-delay")
	fs.DurationVar(&cfg.SlowDelay, "slow-delay", 5*time.Second, "extra delay of slow charges (longer than the worker's -http-timeout)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "random seed of the failures (0: random)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: NewGateway(cfg), ReadHeaderTimeout: 10 * time.Second}
	// The integration tests read the address from this line.
	fmt.Printf("gateway listening on http://%s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

func runWorker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("payments worker", flag.ContinueOnError)
	gateway := fs.String("gateway", "http://127.0.0.1:8099", "payment gateway URL")
	broker := fs.String("broker", "", "broker URL (default $CELERY_BROKER_URL)")
	resultBackend := fs.String("result-backend", "", "Redis result backend URL, also the idempotency store (default $CELERY_RESULT_BACKEND)")
	queue := fs.String("queue", "payments", "queue to consume")
	concurrency := fs.Int("c", 4, "charges run at once")
	hostname := fs.String("n", "payments@%h", "node name")
	lease := fs.Duration("lease", 30*time.Second, "idempotency lease: how long a dead worker's claim blocks a redelivery")
	maxRetries := fs.Int("max-retries", 5, "retries of transient gateway failures before the task is dead-lettered")
	httpTimeout := fs.Duration("http-timeout", 2*time.Second, "timeout of one gateway request")
	visibility := fs.Duration("visibility-timeout", 0, "Redis broker visibility_timeout: when a dead worker's messages come back (default 1h)")
	logLevel := fs.String("loglevel", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	lc := zap.NewDevelopmentConfig()
	lc.DisableStacktrace = true
	if err := lc.Level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("-loglevel: %w", err)
	}
	log, err := lc.Build()
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // stderr

	conn, err := connect.Open(ctx, connect.FromEnv(connect.Options{
		BrokerURL: *broker, ResultBackend: *resultBackend, VisibilityTimeout: *visibility,
		Logger: log, ConnectionName: "payments-worker",
	}))
	if err != nil {
		return err
	}
	defer conn.Close()
	if conn.Idempotency == nil {
		return errors.New("the idempotency store needs a Redis result backend (-result-backend or CELERY_RESULT_BACKEND=redis://...)")
	}
	if conn.BrokerScheme == "memory" {
		return errors.New("set the broker your Python producer uses (-broker or CELERY_BROKER_URL)")
	}

	mux := worker.NewMux()
	p := &Payments{Gateway: &Client{BaseURL: *gateway, Timeout: *httpTimeout}, Log: log}
	p.Register(mux, ChargeOptions{Store: conn.Idempotency, Lease: *lease, MaxRetries: *maxRetries})
	w, err := worker.New(conn.Transport, mux, worker.Config{
		Queues:      []string{*queue},
		Backend:     conn.Backend,
		Concurrency: *concurrency,
		Hostname:    *hostname,
		Logger:      log,
	})
	if err != nil {
		return err
	}
	return w.Run(ctx) // until SIGINT/SIGTERM, then a warm shutdown
}
