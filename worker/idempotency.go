package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/retry"
)

// Idempotency: at-least-once delivery and retries mean a task can run more
// than once; Idempotent makes its side effect happen once. Each run claims a
// stable key atomically (in Redis for a fleet: backend/redis implements
// IdempotencyStore); the first claim runs the handler and stores its result;
// later deliveries of the same key get that stored result back without
// running the handler. A claim is a lease renewed while the handler runs,
// so when its holder dies the lease expires and the next delivery runs.
// The store is a backend.IdempotencyStore: backend/redis for a fleet,
// backend/memory for one process.

// ErrDuplicateInProgress: another worker is running the same idempotency
// key. The duplicate is retried after the holder's lease, without using up
// the task's retries budget.
var ErrDuplicateInProgress = errors.New("worker: same idempotency key in progress elsewhere")

// IdempotencyOptions configure Idempotent.
type IdempotencyOptions struct {
	Store backend.IdempotencyStore
	// Key derives the idempotency key from the task (for a payment, the
	// order id). Default: the task id, which retries and redeliveries keep.
	Key func(*Task) (string, error)
	// Namespace prefixes keys; default the task name, so that two tasks do
	// not share keys by accident.
	Namespace string
	// Lease is how long a claim lives without renewal; it is renewed every
	// third of it while the handler runs. Default 1 minute.
	Lease time.Duration
	// Keep is how long a done key remembers its result. Default 24 hours.
	Keep time.Duration
	// BusyRetry is how soon a duplicate delivery that found the key held by
	// a live worker tries again (it then gets the stored result, or claims
	// the key if the holder gave up). Default 1 s; never longer than the
	// holder's remaining lease.
	BusyRetry time.Duration
	// Logger reports store problems; nil means none.
	Logger *zap.Logger
}

type idemKey struct{}

// IdempotencyKey returns the idempotency key of the running task (empty
// outside Idempotent): pass it on to downstream APIs (an Idempotency-Key
// HTTP header) so that their side effects are deduplicated too.
func IdempotencyKey(ctx context.Context) string {
	k, _ := ctx.Value(idemKey{}).(string)
	return k
}

// Idempotent returns middleware that runs a task's handler at most once per
// key to completion: see the package comment above IdempotencyStore.
func Idempotent(o IdempotencyOptions) Middleware {
	if o.Store == nil {
		panic("worker: Idempotent without a store")
	}
	if o.Lease <= 0 {
		o.Lease = time.Minute
	}
	if o.Keep <= 0 {
		o.Keep = 24 * time.Hour
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.BusyRetry <= 0 {
		o.BusyRetry = time.Second
	}
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, t *Task) (any, error) {
			key := t.ID
			if o.Key != nil {
				k, err := o.Key(t)
				if err != nil {
					return nil, retry.Skip(fmt.Errorf("worker: idempotency key: %w", err))
				}
				key = k
			}
			ns := o.Namespace
			if ns == "" {
				ns = t.Name
			}
			full := ns + ":" + key
			owner := t.Hostname + "/" + t.ID + "/" + protocol.NewID()
			c, err := o.Store.Claim(ctx, full, owner, o.Lease)
			if err != nil {
				// Without the store we cannot know; running could duplicate
				// the effect, so retry later instead.
				return nil, retry.After(5*time.Second, fmt.Errorf("worker: idempotency claim: %w", err)).WithMaxRetries(1 << 30)
			}
			switch c.State {
			case backend.Done:
				v, err := protocol.Unmarshal(protocol.ContentTypeJSON, c.Result, protocol.DecodeOptions{})
				if err != nil {
					return nil, fmt.Errorf("worker: idempotency: stored result of %q: %w", full, err)
				}
				return v, nil
			case backend.Busy:
				wait := min(max(c.Retry, time.Millisecond), o.BusyRetry)
				return nil, retry.After(wait, ErrDuplicateInProgress).WithMaxRetries(1 << 30)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(o.Lease / 3)
				defer tick.Stop()
				for {
					select {
					case <-tick.C:
						if err := o.Store.Extend(context.WithoutCancel(ctx), full, owner, o.Lease); err != nil {
							// The handler goes on; if the lease lapses a
							// duplicate may start, which the log must show.
							o.Logger.Warn("idempotency lease not renewed", zap.String("key", full),
								zap.String("task_id", t.ID), zap.Error(err))
						}
					case <-stop:
						return
					}
				}
			}()
			result, herr := next.HandleTask(context.WithValue(ctx, idemKey{}, key), t)
			close(stop)
			wg.Wait()
			sctx := context.WithoutCancel(ctx)
			if herr != nil {
				_ = o.Store.Release(sctx, full, owner)
				return result, herr
			}
			data, err := protocol.Marshal(protocol.ContentTypeJSON, result)
			if err != nil {
				_ = o.Store.Release(sctx, full, owner)
				return nil, fmt.Errorf("worker: idempotency: encode result: %w", err)
			}
			if err := o.Store.Complete(sctx, full, owner, data, o.Keep); err != nil {
				// The effect happened; only the record is missing. Report
				// success (the result is right) and say so loudly.
				o.Logger.Error("idempotency record not stored; a redelivery could repeat the effect",
					zap.String("key", full), zap.String("task_id", t.ID), zap.Error(err))
			}
			return result, nil
		})
	}
}
