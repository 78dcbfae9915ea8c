// Command quickstart is celeriac's demo: a worker doing real work.
//
//	go run ./examples/quickstart
//
// With no broker configured it embeds one (the in-memory transport and result
// backend), publishes a handful of tasks the way a Python producer would —
// sums, a word count, a prime sieve, a hash, a failing task, a flaky task that
// is retried with backoff, a countdown — and prints what comes back. Set
// CELERY_BROKER_URL (redis://... or amqp://...) and CELERY_RESULT_BACKEND
// (redis://...) to run the same demo against real brokers, next to Python
// Celery if you like; CELERY_QUEUE names the queue (default celery).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/celeriac/celeriac/backend"
	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/examples/demotasks"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
	celeryconnect "github.com/celeriac/celeriac/worker/connect"
)

const text = `It was the best of times, it was the worst of times, it was the age of
wisdom, it was the age of foolishness, it was the epoch of belief, it was the
epoch of incredulity, it was the season of Light, it was the season of Darkness.`

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// row is one demo task and what came back.
type row struct {
	label string
	meta  *protocol.ResultMeta
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rows, err := demo(ctx)
	if err != nil {
		return err
	}
	var table strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&table, "  %-46s %-8s %s\n", r.label, r.meta.Status, show(r.meta))
	}
	fmt.Printf("\nResults (as Python's AsyncResult.get() would see them):\n\n%s\n", table.String())
	return nil
}

// demo runs the worker, sends the demo tasks and collects their results.
func demo(ctx context.Context) ([]row, error) {
	logCfg := zap.NewDevelopmentConfig()
	logCfg.Level = zap.NewAtomicLevelAt(zapcore.InfoLevel)
	logCfg.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
	logCfg.DisableStacktrace = true
	log, err := logCfg.Build()
	if err != nil {
		return nil, err
	}
	defer log.Sync() //nolint:errcheck // stderr

	tr, be, waitResult, cleanup, err := connect(ctx, log)
	if err != nil {
		return nil, err
	}
	defer cleanup()

	queue := os.Getenv("CELERY_QUEUE")
	if queue == "" {
		queue = "celery" // Celery's default queue
	}
	mux := worker.NewMux()
	demotasks.Register(mux)
	w, err := worker.New(tr, mux, worker.Config{
		Queues:      []string{queue},
		Concurrency: 4,
		Backend:     be,
		Logger:      log,
	})
	if err != nil {
		return nil, err
	}
	runCtx, stopWorker := context.WithCancel(ctx)
	defer stopWorker()
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()

	// The producer side: what Python's send_task / apply_async would send.
	p := client.New(tr, client.Config{DefaultQueue: queue})
	type job struct {
		label string
		id    string
	}
	var jobs []job
	send := func(label, name string, args []any, opts ...client.SendOption) {
		r, err := p.Send(ctx, name, args, nil, opts...)
		if err != nil {
			log.Fatal("send", zap.Error(err))
		}
		jobs = append(jobs, job{label, r.ID})
	}
	send("add(2, 3)", "tasks.add", []any{2, 3})
	send("wordcount(text)", "tasks.wordcount", []any{text})
	send("primes(2_000_000)", "tasks.primes", []any{2_000_000})
	send("sha256('celeriac')", "tasks.sha256", []any{"celeriac"})
	send("fail('bad input')", "tasks.fail", []any{"bad input"})
	send("flaky(2): fails twice, retried with backoff", "tasks.flaky", []any{2})
	send("add(40, 2) with countdown=2s", "tasks.add", []any{40, 2}, client.Countdown(2*time.Second))

	var rows []row
	for _, j := range jobs {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		m, err := waitResult(wctx, j.id)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("waiting for %s: %w", j.label, err)
		}
		rows = append(rows, row{j.label, m})
	}
	stopWorker()
	return rows, <-done
}

func show(m *protocol.ResultMeta) string {
	if ex, ok := m.Result.(*protocol.ExceptionInfo); ok {
		parts := make([]string, len(ex.Message))
		for i, a := range ex.Message {
			parts[i] = protocol.Repr(a)
		}
		return ex.Type + "(" + strings.Join(parts, ", ") + ")"
	}
	return protocol.Repr(m.Result)
}

// connect returns the transport and backend: in-memory unless
// CELERY_BROKER_URL is set, then those URLs (CELERY_RESULT_BACKEND too).
func connect(ctx context.Context, log *zap.Logger) (transport.Transport, backend.Backend,
	func(context.Context, string) (*protocol.ResultMeta, error), func(), error) {
	o := celeryconnect.FromEnv(celeryconnect.Options{Logger: log})
	if o.BrokerURL == "" {
		log.Info("no CELERY_BROKER_URL: using the embedded in-memory broker and result backend")
		tr := memory.New(memory.Config{})
		be := membackend.New()
		return tr, be, be.Wait, func() { tr.Close(); be.Close() }, nil
	}
	if o.ResultBackend == "" {
		return nil, nil, nil, nil, errors.New("CELERY_BROKER_URL is set: set CELERY_RESULT_BACKEND too (redis://...), so the demo can read results")
	}
	log.Info("connecting", zap.String("broker", celeryconnect.Redact(o.BrokerURL)), zap.String("result_backend", celeryconnect.Redact(o.ResultBackend)))
	c, err := celeryconnect.Open(ctx, o)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	wait := func(ctx context.Context, id string) (*protocol.ResultMeta, error) {
		return client.Wait(ctx, c.Backend, id)
	}
	return c.Transport, c.Backend, wait, func() { c.Close() }, nil
}
