package worker_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/worker"
)

// TestAutoscale: Celery's autoscaler semantics on virtual time. The pool
// starts at min, grows to the reserved tasks (at most max) as they
// arrive, keeps its size for the keepalive after growing, then shrinks to
// min; control autoscale moves both bounds (and the prefetch), and stats
// reports them as Celery's "autoscaler" does.
func TestAutoscale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, worker.Config{AutoscaleMax: 4, AutoscaleMin: 1, AutoscaleKeepalive: 30 * time.Second, PrefetchMultiplier: 2})
		var running, peak atomic.Int32
		var mu sync.Mutex
		release := make(chan struct{})
		h.mux.HandleFunc("tasks.hold", func(ctx context.Context, _ *worker.Task) (any, error) {
			n := running.Add(1)
			mu.Lock()
			peak.Store(max(peak.Load(), n))
			mu.Unlock()
			<-release
			running.Add(-1)
			return nil, nil
		}, worker.IgnoreResult(true))
		h.start()
		synctest.Wait()
		if s := h.w.Stats(); s.Concurrency != 1 || s.Prefetch != 8 {
			t.Fatalf("at start: concurrency %d, prefetch %d; want min 1 and max×multiplier 8", s.Concurrency, s.Prefetch)
		}
		for range 10 {
			h.send("tasks.hold", nil, nil)
		}
		synctest.Wait()
		if s := h.w.Stats(); s.Concurrency != 4 || peak.Load() != 4 {
			t.Fatalf("with 8 reserved: concurrency %d, %d ran at once; want max 4", s.Concurrency, peak.Load())
		}
		close(release)
		synctest.Wait()
		if s := h.w.Stats(); s.Concurrency != 4 || s.Running != 0 {
			t.Fatalf("idle within the keepalive: concurrency %d, running %d; want 4, 0", s.Concurrency, s.Running)
		}
		time.Sleep(61 * time.Second) // two keepalive ticks: the second is past the keepalive
		synctest.Wait()
		if s := h.w.Stats(); s.Concurrency != 1 {
			t.Fatalf("idle past the keepalive: concurrency %d, want min 1", s.Concurrency)
		}

		ctl := client.NewControl(h.tr)
		one := client.ControlOptions{Limit: 1, Timeout: 5 * time.Second}
		r, err := ctl.Call(context.Background(), "autoscale", map[string]any{"max": int64(6), "min": int64(3)}, one)
		if err != nil || len(r) != 1 {
			t.Fatalf("autoscale: %v %v", r, err)
		}
		if d := cmp.Diff(map[string]any{"ok": "autoscale now max=6 min=3"}, r[0].Value); d != "" {
			t.Errorf("autoscale reply (-want +got):\n%s", d)
		}
		synctest.Wait()
		if s := h.w.Stats(); s.Concurrency != 3 || s.Prefetch != 12 {
			t.Errorf("after autoscale 6 3: concurrency %d, prefetch %d; want 3 and 12", s.Concurrency, s.Prefetch)
		}
		r, err = ctl.Call(context.Background(), "stats", nil, one)
		if err != nil || len(r) != 1 {
			t.Fatalf("stats: %v %v", r, err)
		}
		st, _ := r[0].Value.(map[string]any)
		want := map[string]any{"max": int64(6), "min": int64(3), "current": int64(3), "qty": int64(0)}
		if d := cmp.Diff(want, st["autoscaler"]); d != "" {
			t.Errorf("stats autoscaler (-want +got):\n%s", d)
		}
	})
}

// TestAutoscaleNotEnabled: control autoscale on a fixed pool is Celery's
// error reply, and stats has no autoscaler.
func TestAutoscaleNotEnabled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, worker.Config{Concurrency: 2})
		h.start()
		synctest.Wait()
		ctl := client.NewControl(h.tr)
		one := client.ControlOptions{Limit: 1, Timeout: 5 * time.Second}
		r, err := ctl.Call(context.Background(), "autoscale", map[string]any{"max": int64(6)}, one)
		if err != nil || len(r) != 1 {
			t.Fatalf("autoscale: %v %v", r, err)
		}
		if d := cmp.Diff(map[string]any{"error": "ValueError('Autoscale not enabled')"}, r[0].Value); d != "" {
			t.Errorf("reply (-want +got):\n%s", d)
		}
		r, err = ctl.Call(context.Background(), "stats", nil, one)
		if err != nil || len(r) != 1 {
			t.Fatalf("stats: %v %v", r, err)
		}
		if st, _ := r[0].Value.(map[string]any); st["autoscaler"] != nil {
			t.Errorf("stats autoscaler %v on a fixed pool", st["autoscaler"])
		}
		if s := h.w.Stats(); s.Concurrency != 2 {
			t.Errorf("concurrency %d, want 2", s.Concurrency)
		}
	})
}
