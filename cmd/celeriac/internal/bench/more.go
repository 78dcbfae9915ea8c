package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"
)

// Latency modes (latency.py): Celery's AsyncResult.get(), or send_task
// with the result awaited on the client's own pub/sub subscription.
const (
	ModeGet    = "get"
	ModePubSub = "pubsub"
)

// Latency is one worker's round trips: Python's apply_async then the
// result, one at a time, against an idle worker.
type Latency struct {
	Kind  Kind
	Label string
	Runs  [][]float64 // per repetition, every round trip in milliseconds
}

// LatencyGroup is every worker's round trips on one broker (results in
// Redis).
type LatencyGroup struct {
	Broker string
	Mode   string // ModeGet or ModePubSub
	Calls  int
	Rows   []Latency
}

const latencyWarmup = 50

func (h *harness) latencyGroup(ctx context.Context, b, mode string) (LatencyGroup, error) {
	k := h.kits[b]
	g := LatencyGroup{Broker: k.Name(), Mode: mode, Calls: h.o.LatencyN}
	for _, kind := range h.o.Workers {
		g.Rows = append(g.Rows, Latency{Kind: kind, Label: kind.label(h.o.Concurrency)})
	}
	for rep := 1; rep <= h.o.Reps; rep++ {
		for i := range g.Rows {
			row := &g.Rows[i]
			ms, err := h.latency(ctx, spec{kind: row.Kind, broker: k, results: RedisResults}, mode)
			if err != nil {
				return g, fmt.Errorf("%s latency (%s), %s: %w", k.Name(), mode, row.Label, err)
			}
			st := percentiles(ms)
			h.logf("%s latency (%s): %s rep %d: p50 %.2f ms p99 %.2f ms", k.Name(), mode, row.Label, rep, st.p50, st.p99)
			row.Runs = append(row.Runs, ms)
		}
	}
	return g, nil
}

func (h *harness) latency(ctx context.Context, s spec, mode string) ([]float64, error) {
	if err := h.prepare(ctx, s.broker, nil); err != nil {
		return nil, err
	}
	p, err := h.start(s)
	if err != nil {
		return nil, err
	}
	defer p.stop()
	out, err := h.python(ctx, s.broker.URL(), RedisResults, filepath.Join(h.pyDir, "latency.py"),
		mode, fmt.Sprint(h.o.LatencyN), fmt.Sprint(latencyWarmup), h.o.Queue)
	if err != nil {
		if perr := p.failed(); perr != nil {
			return nil, perr
		}
		return nil, fmt.Errorf("python latency client: %v\n%s", err, out)
	}
	var ms []float64
	if err := json.Unmarshal([]byte(out), &ms); err != nil {
		return nil, fmt.Errorf("python latency client printed %q: %w", out, err)
	}
	if len(ms) != h.o.LatencyN {
		return nil, fmt.Errorf("python latency client timed %d calls, want %d", len(ms), h.o.LatencyN)
	}
	return ms, nil
}

// SweepGroup is celeriac and Python's threads pool draining the 1 ms task
// at growing concurrency on one broker, with Redis results: on RabbitMQ an
// empty queue says nothing of the up to 4 x concurrency messages a worker
// holds, the stored results say when all ran.
type SweepGroup struct {
	Broker string
	N      int
	Levels []int
	Rows   []SweepRow
}

// SweepRow is one worker at one concurrency.
type SweepRow struct {
	Kind        Kind
	Concurrency int
	Runs        []Drain
}

// sweepKinds are the workers whose concurrency is a number of goroutines
// or threads; prefork at 1 000 processes would not fit a machine.
var sweepKinds = []Kind{Celeriac, Threads}

func (h *harness) sweepGroup(ctx context.Context, b string) (SweepGroup, error) {
	k := h.kits[b]
	g := SweepGroup{Broker: k.Name(), N: h.o.SweepN, Levels: h.o.Sweep}
	msgs, err := h.messages(ctx, b, Sleep1, RedisResults, 0, h.o.SweepN)
	if err != nil {
		return g, err
	}
	for _, kind := range sweepKinds {
		if !contains(h.o.Workers, kind) {
			continue
		}
		for _, c := range h.o.Sweep {
			g.Rows = append(g.Rows, SweepRow{Kind: kind, Concurrency: c})
		}
	}
	for rep := 1; rep <= h.o.Reps; rep++ {
		for i := range g.Rows {
			row := &g.Rows[i]
			if rep > 1 && row.Runs[0].Stalled != "" {
				continue // a configuration that stalls once is not worth the wait again
			}
			d, err := h.drain(ctx, spec{kind: row.Kind, concurrency: row.Concurrency, broker: k, results: RedisResults}, msgs)
			if err != nil {
				return g, fmt.Errorf("%s sweep, %s -c %d: %w", k.Name(), row.Kind, row.Concurrency, err)
			}
			h.logf("%s sweep: %s -c %d rep %d: %s", k.Name(), row.Kind, row.Concurrency, rep, d)
			row.Runs = append(row.Runs, d)
		}
	}
	return g, nil
}

// ETA is one worker holding the ETA tasks.
type ETA struct {
	Kind  Kind
	Label string
	Runs  []ETARun
}

// ETARun is one measurement of held ETA tasks.
type ETARun struct {
	IdleRSS int64         // bytes, before the tasks arrived
	HeldRSS int64         // bytes, once every task is held (one second after)
	Took    time.Duration // from the first task taken until all were held
	Stalled string
}

// PerTask is the memory a held task costs.
func (r ETARun) PerTask(n int) float64 { return float64(r.HeldRSS-r.IdleRSS) / float64(n) }

// ETAGroup is the held-ETA measurement on one broker.
type ETAGroup struct {
	Broker string
	N      int
	Rows   []ETA
}

// etaKinds hold ETA tasks; the ceiling loop does not know what one is.
var etaKinds = []Kind{Celeriac, Prefork, Threads, Solo}

func (h *harness) etaGroup(ctx context.Context, b string) (ETAGroup, error) {
	k := h.kits[b]
	g := ETAGroup{Broker: k.Name(), N: h.o.ETAN}
	msgs, err := h.messages(ctx, b, Noop, NoResults, 3600, h.o.ETAN)
	if err != nil {
		return g, err
	}
	for _, kind := range etaKinds {
		if contains(h.o.Workers, kind) {
			g.Rows = append(g.Rows, ETA{Kind: kind, Label: kind.label(h.o.Concurrency)})
		}
	}
	for rep := 1; rep <= h.o.Reps; rep++ {
		for i := range g.Rows {
			row := &g.Rows[i]
			r, err := h.eta(ctx, spec{kind: row.Kind, broker: k}, msgs)
			if err != nil {
				return g, fmt.Errorf("%s ETA, %s: %w", k.Name(), row.Label, err)
			}
			if r.Stalled != "" {
				h.logf("%s ETA: %s rep %d: stalled: %s", k.Name(), row.Label, rep, r.Stalled)
			} else {
				h.logf("%s ETA: %s rep %d: idle %.1f MB, holding %d: %.1f MB (%.0f B/task), %.1f s", k.Name(), row.Label, rep,
					float64(r.IdleRSS)/1e6, g.N, float64(r.HeldRSS)/1e6, r.PerTask(g.N), r.Took.Seconds())
			}
			row.Runs = append(row.Runs, r)
		}
	}
	return g, nil
}

// eta starts the worker on an empty queue, lets it settle, then loads the
// ETA tasks (an hour ahead) and waits until it holds them all.
func (h *harness) eta(ctx context.Context, s spec, msgs []message) (ETARun, error) {
	var r ETARun
	k := s.broker
	if err := h.prepare(ctx, k, nil); err != nil {
		return r, err
	}
	p, err := h.start(s)
	if err != nil {
		return r, err
	}
	defer p.stop()
	if err := sleepCtx(ctx, 3*time.Second); err != nil {
		return r, err
	}
	if err := p.failed(); err != nil {
		return r, err
	}
	r.IdleRSS = sampleTree(p.pid()).rss
	if err := k.Restore(ctx, msgs); err != nil {
		return r, err
	}
	n := len(msgs)
	start := time.Now()
	lastProgress, lastReady := time.Now(), -1
	for {
		ready, unacked, err := k.State(ctx)
		if err != nil {
			return r, err
		}
		// Redis counts held tasks as unacknowledged; AMQP cannot tell, and
		// an empty queue means every message is with the worker.
		if ready == 0 && (unacked < 0 || unacked >= n) {
			break
		}
		if ready != lastReady {
			lastReady, lastProgress = ready, time.Now()
		} else if time.Since(lastProgress) > h.o.Stall {
			r.Stalled = fmt.Sprintf("%d of %d still in the queue after %.0f s", ready, n, time.Since(start).Seconds())
			return r, nil
		}
		if why := hopeless(time.Since(start), h.o.Timeout, n-ready, n); why != "" {
			r.Stalled = fmt.Sprintf("%s: %d of %d still in the queue", why, ready, n)
			return r, nil
		}
		if err := p.failed(); err != nil {
			return r, err
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return r, err
		}
	}
	r.Took = time.Since(start)
	if err := sleepCtx(ctx, time.Second); err != nil {
		return r, err
	}
	r.HeldRSS = sampleTree(p.pid()).rss
	return r, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func contains[T comparable](s []T, v T) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
