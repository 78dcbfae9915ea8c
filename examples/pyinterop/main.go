// Command pyinterop is a celeriac worker that Python code talks to: it runs
// the demo tasks (tasks.add, tasks.wordcount, ...) on the queues Python
// Celery publishes to. client.py, next to this file, is the Python side.
//
//	export CELERY_BROKER_URL=redis://localhost:6379/0     # or amqp://guest:guest@localhost:5672//
//	export CELERY_RESULT_BACKEND=redis://localhost:6379/1
//	go run ./examples/pyinterop &
//	/usr/bin/python3 examples/pyinterop/client.py
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/examples/demotasks"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pyinterop:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, err := zap.NewDevelopment()
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // stderr

	o := connect.FromEnv(connect.Options{Logger: log})
	if o.BrokerURL == "" {
		return fmt.Errorf("set CELERY_BROKER_URL (and CELERY_RESULT_BACKEND) to the broker your Python code uses")
	}
	conn, err := connect.Open(ctx, o)
	if err != nil {
		return err
	}
	defer conn.Close()

	mux := worker.NewMux()
	demotasks.Register(mux)
	queue := os.Getenv("CELERY_QUEUE")
	if queue == "" {
		queue = "celery"
	}
	w, err := worker.New(conn.Transport, mux, worker.Config{
		Queues:         []string{queue},
		Backend:        conn.Backend,
		SendTaskEvents: true,
		Logger:         log,
	})
	if err != nil {
		return err
	}
	return w.Run(ctx) // until SIGINT/SIGTERM, then a graceful shutdown
}
