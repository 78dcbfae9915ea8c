package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
)

// TestGlobalRateLimitWithoutLimiterWarns: a global limit the worker cannot
// enforce is named in the log when the worker is created.
func TestGlobalRateLimitWithoutLimiterWarns(t *testing.T) {
	for _, tt := range []struct {
		name    string
		limiter bool
		want    int
	}{
		{"no limiter", false, 1},
		{"limiter", true, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zap.WarnLevel)
			tr := memory.New(memory.Config{})
			defer tr.Close()
			mux := worker.NewMux()
			mux.HandleFunc("sms.send", add, worker.GlobalRateLimit("5/s", "sms-api", 1))
			mux.HandleFunc("tasks.add", add)
			cfg := worker.Config{Logger: zap.New(core)}
			if tt.limiter {
				cfg.GlobalRateLimiter = membackend.NewRateLimiter()
			}
			if _, err := worker.New(tr, mux, cfg); err != nil {
				t.Fatal(err)
			}
			got := logs.FilterMessageSnippet("global rate limit").FilterField(zap.String("task_name", "sms.send"))
			if got.Len() != tt.want || logs.Len() != tt.want {
				t.Errorf("%d warnings about sms.send (%d in all), want %d: %v", got.Len(), logs.Len(), tt.want, logs.All())
			}
		})
	}
}

// TestGlobalRateLimitStaleTokens: tasks whose tokens came due while every
// slot was busy take new tokens instead of starting together when a slot
// frees, so the cap still holds at the starts (within one token).
func TestGlobalRateLimitStaleTokens(t *testing.T) {
	h := newHarness(t, worker.Config{Concurrency: 1, GlobalRateLimiter: membackend.NewRateLimiter()})
	var mu sync.Mutex
	var starts []time.Time
	blocking := make(chan struct{})
	h.mux.HandleFunc("block", func(ctx context.Context, t *worker.Task) (any, error) {
		close(blocking)
		time.Sleep(300 * time.Millisecond)
		return nil, nil
	})
	h.mux.HandleFunc("limited", func(ctx context.Context, t *worker.Task) (any, error) {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		return nil, nil
	}, worker.GlobalRateLimit("20/s", "k", 1))
	h.start()
	block := h.send("block", nil, nil)
	<-blocking
	var ids []string
	for range 6 {
		// Their tokens come due 0, 50, ..., 250 ms from now, all while
		// the only slot is busy.
		ids = append(ids, h.send("limited", nil, nil))
	}
	h.wait(block)
	for _, id := range ids {
		h.wait(id)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(starts) != 6 {
		t.Fatalf("%d starts", len(starts))
	}
	// At 20/s with a burst of 1, plus the one token of lateness allowed,
	// any three consecutive starts span at least one interval (50 ms); a
	// bunch would start all six within a millisecond or two. The bound
	// keeps 20 ms of slack for the scheduler.
	for i := 0; i+2 < len(starts); i++ {
		if d := starts[i+2].Sub(starts[i]); d < 30*time.Millisecond {
			t.Errorf("starts %d..%d within %v: %v", i, i+2, d, starts)
		}
	}
}
