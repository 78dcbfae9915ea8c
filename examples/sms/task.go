package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/examples/sms/smsapi"
	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/worker"
)

// TaskName is the Celery name Python producers send to.
const TaskName = "sms.send"

// taskConfig is how sms.send is registered.
type taskConfig struct {
	// Rate is the cap in Celery's syntax ("5/s"). Global spreads it over
	// every worker through the shared limiter under Bucket (with Burst
	// starts allowed at once); otherwise it is Celery's per-worker
	// rate_limit, which N workers multiply by N.
	Rate   string
	Global bool
	Bucket string
	Burst  int
	// MaxRetries bounds the retries of transient failures (503, timeouts),
	// backed off exponentially (1 s, 2 s, 4 s, ... up to BackoffMax) with
	// full jitter.
	MaxRetries int
	BackoffMax time.Duration
	// RateLimitedRetries bounds the retries a message may reach by 429s.
	// The provider's Retry-After sets their delay, not our backoff. Celery
	// keeps one retries count per task, so 429s use up MaxRetries too: a
	// 503 after many 429s may be the last straw.
	RateLimitedRetries int
	// Store deduplicates sends by message_id across deliveries.
	Store backend.IdempotencyStore
	// Client talks to the provider.
	Client *smsapi.Client
	Logger *zap.Logger
}

// register adds sms.send to mux.
func register(mux *worker.Mux, c taskConfig) {
	h := worker.Idempotent(worker.IdempotencyOptions{
		Store: c.Store,
		// The producer's message_id, not the task id: a message sent twice
		// by the producer (two tasks) is still one SMS.
		Key: func(t *worker.Task) (string, error) {
			var k struct {
				MessageID string `celery:"message_id,required"`
			}
			if err := t.BindKwargs(&k); err != nil {
				return "", err
			}
			if k.MessageID == "" {
				return "", errors.New("empty message_id")
			}
			return k.MessageID, nil
		},
		Logger: c.Logger,
	})(worker.HandlerFunc(func(ctx context.Context, t *worker.Task) (any, error) {
		return send(ctx, c, t)
	}))
	opts := []worker.TaskOption{
		// The message stays unacknowledged until the SMS is sent or given
		// up on: a crash mid-send brings it back (and Idempotent makes the
		// second delivery harmless), and a message that fails for good is
		// dead-lettered instead of acknowledged.
		worker.AcksLate(true),
		worker.AcksOnFailure(false),
		worker.Retry(retry.Policy{
			AutoRetryFor: []retry.Matcher{retry.OnFunc(smsapi.Transient)},
			MaxRetries:   retry.Limited(c.MaxRetries),
			Backoff:      1,
			BackoffMax:   c.BackoffMax,
			// Jitter: the zero value is Celery's default, on.
		}),
	}
	if c.Global {
		opts = append(opts, worker.GlobalRateLimit(c.Rate, c.Bucket, c.Burst))
	} else {
		opts = append(opts, worker.RateLimit(c.Rate))
	}
	mux.Handle(TaskName, h, opts...)
}

// send calls the provider once and says what the worker should do next.
func send(ctx context.Context, c taskConfig, t *worker.Task) (any, error) {
	var m struct {
		MessageID string `celery:"message_id,required"`
		To        string `celery:"to,required"`
		Body      string `celery:"body"`
	}
	if err := t.BindKwargs(&m); err != nil {
		return nil, err // a TypeError for Python; never retried
	}
	r, err := c.Client.Send(ctx, smsapi.Message{MessageID: m.MessageID, To: m.To, Body: m.Body}, worker.IdempotencyKey(ctx))
	var se *smsapi.StatusError
	switch {
	case err == nil:
		return map[string]any{"message_id": m.MessageID, "sid": r.SID, "replayed": r.Replayed}, nil
	case errors.As(err, &se) && se.Status == http.StatusTooManyRequests:
		// The provider says when: obey Retry-After rather than backing off.
		return nil, retry.AfterHeader(se.RetryAfter, err).WithMaxRetries(c.RateLimitedRetries)
	case smsapi.Transient(err):
		return nil, err // the policy retries it with backoff and jitter
	default:
		// 400 (a bad number) and other 4xx fail identically every time.
		return nil, retry.Skip(fmt.Errorf("message %s to %s: %w", m.MessageID, m.To, err))
	}
}
