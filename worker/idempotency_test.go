package worker_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/celeriac/celeriac/backend"
	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/worker"
)

func TestIdempotentRunsTheEffectOncePerKey(t *testing.T) {
	h := newHarness(t, worker.Config{Concurrency: 4})
	store := membackend.NewIdempotency()
	var charges atomic.Int32
	var keys sync.Map
	h.mux.Use(worker.Idempotent(worker.IdempotencyOptions{
		Store:     store,
		BusyRetry: 10 * time.Millisecond,
		Key: func(t *worker.Task) (string, error) {
			var order struct {
				OrderID string `celery:"order_id,required"`
			}
			if err := t.BindKwargs(&order); err != nil {
				return "", err
			}
			return order.OrderID, nil
		},
	}))
	h.mux.HandleFunc("payments.charge", func(ctx context.Context, t *worker.Task) (any, error) {
		keys.Store(worker.IdempotencyKey(ctx), true)
		charges.Add(1)
		time.Sleep(20 * time.Millisecond)
		return map[string]any{"charge": "ch_" + worker.IdempotencyKey(ctx)}, nil
	})
	h.start()
	var ids []string
	for i := 0; i < 5; i++ { // five deliveries of the same order, some concurrent
		ids = append(ids, h.send("payments.charge", nil, map[string]any{"order_id": "order-42"}))
	}
	for _, id := range ids {
		m := h.wait(id)
		if m.Status != protocol.StateSuccess {
			t.Fatalf("%s: %s %v", id, m.Status, m.Result)
		}
		if got := m.Result.(map[string]any)["charge"]; got != "ch_order-42" {
			t.Fatalf("result %v", m.Result)
		}
	}
	if n := charges.Load(); n != 1 {
		t.Fatalf("charged %d times, want once", n)
	}
	if _, ok := keys.Load("order-42"); !ok {
		t.Fatal("IdempotencyKey(ctx) was not the order id")
	}
}

func TestIdempotentFailureReleasesTheKey(t *testing.T) {
	store := membackend.NewIdempotency()
	ctx := context.Background()
	c, err := store.Claim(ctx, "k", "a", time.Minute)
	if err != nil || c.State != backend.Claimed {
		t.Fatalf("first claim: %+v %v", c, err)
	}
	if c, _ := store.Claim(ctx, "k", "b", time.Minute); c.State != backend.Busy || c.Retry <= 0 {
		t.Fatalf("second claim while held: %+v", c)
	}
	if err := store.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	if c, _ := store.Claim(ctx, "k", "b", time.Minute); c.State != backend.Claimed {
		t.Fatalf("claim after release: %+v", c)
	}
	if err := store.Complete(ctx, "k", "b", []byte(`{"ok": 1}`), time.Hour); err != nil {
		t.Fatal(err)
	}
	if c, _ := store.Claim(ctx, "k", "c", time.Minute); c.State != backend.Done || string(c.Result) != `{"ok": 1}` {
		t.Fatalf("claim after complete: %+v", c)
	}
}

func TestIdempotentDeadHolderLeaseExpires(t *testing.T) {
	store := membackend.NewIdempotency()
	ctx := context.Background()
	if c, _ := store.Claim(ctx, "k", "dead", 30*time.Millisecond); c.State != backend.Claimed {
		t.Fatal("first claim")
	}
	// The holder never completes (it was killed); once its lease runs out
	// the next delivery runs.
	time.Sleep(60 * time.Millisecond)
	if c, _ := store.Claim(ctx, "k", "next", time.Minute); c.State != backend.Claimed {
		t.Fatalf("claim after the holder's lease: %+v", c)
	}
}
