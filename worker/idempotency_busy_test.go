package worker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/celeriac/celeriac/backend"
	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/worker"
)

// busyCounter counts the claims that found the key held elsewhere.
type busyCounter struct {
	backend.IdempotencyStore
	busy atomic.Int32
}

func (s *busyCounter) Claim(ctx context.Context, key, owner string, lease time.Duration) (backend.Claim, error) {
	c, err := s.IdempotencyStore.Claim(ctx, key, owner, lease)
	if c.State == backend.Busy {
		s.busy.Add(1)
	}
	return c, err
}

// TestIdempotentBusyRetriesKeepTheRetryBudget: a duplicate that waits for
// the holder of its key is not a failed attempt. However many times it
// found the key busy, the run it makes afterwards has its full max_retries
// for real failures.
func TestIdempotentBusyRetriesKeepTheRetryBudget(t *testing.T) {
	h := newHarness(t, worker.Config{Concurrency: 2})
	store := &busyCounter{IdempotencyStore: membackend.NewIdempotency()}
	ctx := context.Background()
	// Another worker holds the order until the test lets go.
	if c, err := store.IdempotencyStore.Claim(ctx, "payments.charge:order-7", "elsewhere", time.Minute); err != nil || c.State != backend.Claimed {
		t.Fatalf("claim: %+v %v", c, err)
	}
	errTransient := errors.New("gateway timeout")
	var mu sync.Mutex
	var retries []int
	h.mux.Use(worker.Idempotent(worker.IdempotencyOptions{
		Store:     store,
		BusyRetry: 5 * time.Millisecond,
		Key:       func(*worker.Task) (string, error) { return "order-7", nil },
	}))
	h.mux.HandleFunc("payments.charge", func(ctx context.Context, t *worker.Task) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		retries = append(retries, t.Retries)
		if len(retries) == 1 {
			return nil, errTransient // one real failure, retried once
		}
		return "ch_1", nil
	}, worker.Retry(retry.Policy{
		AutoRetryFor: []retry.Matcher{retry.On(errTransient)},
		MaxRetries:   retry.Limited(1),
		Countdown:    retry.NoDelay,
	}))
	h.start()
	id := h.send("payments.charge", nil, nil)
	eventually(t, "five busy duplicates", func() bool { return store.busy.Load() >= 5 })
	if err := store.IdempotencyStore.Release(ctx, "payments.charge:order-7", "elsewhere"); err != nil {
		t.Fatal(err)
	}
	m := h.wait(id)
	if m.Status != protocol.StateSuccess || m.Result != "ch_1" {
		t.Fatalf("after %d busy retries: %s %v, want SUCCESS ch_1 (busy retries used up max_retries)", store.busy.Load(), m.Status, m.Result)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(retries) != 2 || retries[0] != 0 || retries[1] != 1 {
		t.Fatalf("the handler ran with retries %v, want [0 1]", retries)
	}
}
