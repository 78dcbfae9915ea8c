// Command sms is the "outbound SMS" challenge built on celeriac: a worker
// for the Celery task sms.send(message_id, to, body) that calls a flaky
// third-party SMS API capped at 5 requests per second.
//
//   - The cap holds across any number of workers: a global rate limit on
//     the named resource "sms-api", a token bucket in Redis.
//   - Transient errors (503, timeouts) are retried with exponential backoff
//     and jitter; a 400 (bad number) is never retried; a 429 waits what its
//     Retry-After says.
//   - A message is sent once: tasks are deduplicated by message_id, and the
//     id goes to the provider as its Idempotency-Key.
//   - A message that fails for good (retries exhausted, a bad number) is
//     dead-lettered, where `celeriac dlq` lists and replays it.
//
// See README.md for the commands. Configuration: CELERY_BROKER_URL,
// CELERY_RESULT_BACKEND (Redis: results, idempotency claims and, unless
// CELERIAC_RATE_LIMIT_URL names another Redis, the rate limit), plus the
// flags below.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/examples/sms/smsapi"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "sms:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("sms", flag.ContinueOnError)
	var (
		queue       = fs.String("queue", "sms", "queue to consume")
		concurrency = fs.Int("c", 4, "sends at once")
		hostname    = fs.String("n", "sms@%h", "node name")
		api         = fs.String("api", "http://127.0.0.1:8025/", "the SMS provider's URL (see ./fakeapi)")
		rate        = fs.String("rate", "5/s", "the provider's cap, in Celery's rate syntax")
		scope       = fs.String("scope", "global", `"global": the cap holds across all workers; "worker": Celery's per-worker rate_limit (N workers send N times as fast)`)
		bucket      = fs.String("bucket", "sms-api", "name of the global limit (tasks naming one bucket share it)")
		burst       = fs.Int("burst", 1, "sends the global limit allows at once")
		maxRetries  = fs.Int("max-retries", 8, "retries before a transient failure dead-letters the message (429s count too, as in Celery)")
		debug       = fs.Bool("debug", false, "log rate-limit waits and every task")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *scope != "global" && *scope != "worker" {
		return fmt.Errorf(`-scope %q: want "global" or "worker"`, *scope)
	}
	if r, err := worker.ParseRate(*rate); err != nil || r.IsZero() {
		return fmt.Errorf("-rate %q: want a positive rate such as 5/s", *rate)
	}

	logCfg := zap.NewDevelopmentConfig()
	logCfg.Level = zap.NewAtomicLevelAt(zap.InfoLevel)
	if *debug {
		logCfg.Level = zap.NewAtomicLevelAt(zap.DebugLevel)
	}
	logCfg.DisableStacktrace = true
	log, err := logCfg.Build()
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := connect.FromEnv(connect.Options{Logger: log})
	if o.BrokerURL == "" {
		return errors.New("set CELERY_BROKER_URL to the broker the Python producer uses")
	}
	conn, err := connect.Open(ctx, o)
	if err != nil {
		return err
	}
	defer conn.Close()
	if *scope == "global" && conn.RateLimiter == nil {
		return errors.New("-scope global needs a Redis shared by all workers: set CELERIAC_RATE_LIMIT_URL or a redis:// CELERY_RESULT_BACKEND")
	}
	if _, ok := conn.RateLimiter.(*membackend.RateLimiter); ok && *scope == "global" {
		log.Warn("the global rate limit is in-process (memory://): it holds for this worker only")
	}

	mux := worker.NewMux()
	register(mux, taskConfig{
		Rate: *rate, Global: *scope == "global", Bucket: *bucket, Burst: *burst,
		MaxRetries: *maxRetries, BackoffMax: time.Minute, RateLimitedRetries: 100,
		Store:  idempotencyStore(conn, log),
		Client: &smsapi.Client{URL: *api, HTTP: httpClient(*concurrency)},
		Logger: log,
	})
	w, err := worker.New(conn.Transport, mux, worker.Config{
		Queues:            []string{*queue},
		Concurrency:       *concurrency,
		Hostname:          *hostname,
		Backend:           conn.Backend,
		GlobalRateLimiter: conn.RateLimiter,
		Logger:            log,
	})
	if err != nil {
		return err
	}
	log.Info("sms worker", zap.String("queue", *queue), zap.String("rate", *rate), zap.String("scope", *scope),
		zap.String("bucket", *bucket), zap.String("api", *api))
	return w.Run(ctx)
}

// httpClient keeps a connection per concurrent send: the default pool
// keeps two, and opening a new connection mid-run delays a send by more
// than the spacing jitter the provider's sliding window tolerates.
func httpClient(concurrency int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = max(concurrency, 2)
	return &http.Client{Timeout: 10 * time.Second, Transport: tr}
}

// idempotencyStore is connect's store (the Redis result backend: shared
// by every worker), else an in-process one, which deduplicates only the
// deliveries this process sees.
func idempotencyStore(conn *connect.Conn, log *zap.Logger) backend.IdempotencyStore {
	if conn.Idempotency != nil {
		return conn.Idempotency
	}
	log.Warn("no redis:// result backend (CELERY_RESULT_BACKEND) to keep idempotency claims in: deduplicating by message_id within this process only")
	return membackend.NewIdempotency()
}
