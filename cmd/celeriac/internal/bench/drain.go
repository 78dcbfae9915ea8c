package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// Drain is one drain: N preloaded messages consumed by one worker.
type Drain struct {
	Seconds  float64       // from the first message taken to the last acked (and stored, with results)
	CPU      time.Duration // the worker's user+system time over that span
	PeakRSS  int64         // bytes, largest sum over the worker's process tree
	AckLag   time.Duration // AMQP: how long after the queue emptied rabbitmqctl still saw unacked messages
	Stalled  string        // why the drain was abandoned; the figures are then not valid
	N        int
	StartRSS int64 // RSS when the first message was taken (the worker at rest)
	// BrokerCPU is the broker server's CPU time over the drain (and the
	// result Redis's, when it is another server); -1 when unknown.
	BrokerCPU time.Duration
	// DBCPU is the PostgreSQL server's CPU time over the drain, with
	// PostgreSQL results (also part of BrokerCPU); -1 otherwise.
	DBCPU time.Duration
}

// Rate is tasks per second.
func (d Drain) Rate() float64 {
	if d.Seconds <= 0 {
		return 0
	}
	return float64(d.N) / d.Seconds
}

// CPUPerTask is the worker's CPU time per task.
func (d Drain) CPUPerTask() time.Duration {
	if d.N == 0 {
		return 0
	}
	return d.CPU / time.Duration(d.N)
}

// DrainRow is one worker's repetitions of a drain.
type DrainRow struct {
	Kind        Kind
	Label       string
	Concurrency int
	Runs        []Drain
}

// DrainGroup is every worker draining the same messages: one broker, one
// result setting, one task.
type DrainGroup struct {
	Broker  string
	Results ResultStore
	Task    Task
	N       int
	Rows    []DrainRow
}

func (h *harness) drainGroup(ctx context.Context, b string, results ResultStore, t Task) (DrainGroup, error) {
	g := DrainGroup{Broker: h.kits[b].Name(), Results: results, Task: t, N: h.o.N}
	msgs, err := h.messages(ctx, b, t, results, 0, h.o.N)
	if err != nil {
		return g, err
	}
	for _, k := range h.o.Workers {
		if k.ceiling() && results == PostgresResults {
			continue // the ceiling writes Redis results only
		}
		g.Rows = append(g.Rows, DrainRow{Kind: k, Label: k.label(h.o.Concurrency)})
	}
	// Repetitions go round the workers (A B C A B C ...) so that a slow
	// spell of the machine hits them all alike.
	for rep := 1; rep <= h.o.Reps; rep++ {
		for i := range g.Rows {
			row := &g.Rows[i]
			s := spec{kind: row.Kind, broker: h.kits[b], results: results}
			if row.Kind == Celeriac && h.o.ProfileDir != "" {
				s.profile = filepath.Join(h.o.ProfileDir, fmt.Sprintf("%s-%s-%s-%d.pprof", b, resultsWord(results), strings.ReplaceAll(t.Label, " ", ""), rep))
			}
			d, err := h.drain(ctx, s, msgs)
			if err != nil {
				return g, fmt.Errorf("%s, %s, %s, %s: %w", g.Broker, resultsWord(results), t.Label, row.Label, err)
			}
			h.logf("%s %s %s: %s rep %d: %s", g.Broker, resultsWord(results), t.Label, row.Label, rep, d)
			row.Runs = append(row.Runs, d)
		}
	}
	return g, nil
}

func resultsWord(results ResultStore) string {
	if results.on() {
		return string(results) + "-results"
	}
	return "no-results"
}

func (d Drain) String() string {
	if d.Stalled != "" {
		return "stalled: " + d.Stalled
	}
	s := fmt.Sprintf("%.3f s, %.0f tasks/s, %.0f µs CPU/task, peak RSS %.1f MB", d.Seconds, d.Rate(), float64(d.CPUPerTask())/1e3, float64(d.PeakRSS)/1e6)
	if d.BrokerCPU >= 0 {
		s += fmt.Sprintf(", broker %.0f µs CPU/task", float64(d.BrokerCPU)/1e3/float64(d.N))
	}
	if d.DBCPU > 0 {
		s += fmt.Sprintf(" (PostgreSQL %.0f)", float64(d.DBCPU)/1e3/float64(d.N))
	}
	if d.AckLag > 0 {
		s += fmt.Sprintf(", ack lag %.1f s", d.AckLag.Seconds())
	}
	return s
}

// drain measures one drain of msgs by the worker s describes. The clock
// starts at the first poll that sees fewer than len(msgs) messages ready
// (start-up is excluded, as for every worker) and stops at the first poll
// that sees the queue empty, nothing unacknowledged (Redis) and every
// result stored.
func (h *harness) drain(ctx context.Context, s spec, msgs []message) (Drain, error) {
	n := len(msgs)
	d := Drain{N: n}
	k := s.broker
	if err := h.prepare(ctx, k, msgs); err != nil {
		return d, err
	}
	p, err := h.start(s)
	if err != nil {
		return d, err
	}
	defer func() {
		if p != nil {
			p.stop()
		}
	}()
	// A poll sees the queue at some moment during its round trip: its
	// midpoint. The drain starts between the last poll that saw every
	// message ready (or the worker's start) and the first that did not, and
	// ends between the last poll that saw work left and the first that saw
	// none; the midpoints of those intervals are the clock's readings, so a
	// drain shorter than a poll interval still measures more than zero.
	var t0, tEnd time.Time
	lastFull, lastBusy := time.Now(), time.Time{}
	var cpu0, bcpu0 time.Duration
	var bok, dok bool
	var dcpu0 time.Duration
	lastProgress, lastSeen := time.Now(), -1
	tick := time.NewTicker(h.o.Poll)
	defer tick.Stop()
	for {
		before := time.Now()
		ready, unacked, err := k.State(ctx)
		if err != nil {
			return d, fmt.Errorf("poll: %w", err)
		}
		stored, err := h.stored(ctx, s.results)
		if err != nil {
			return d, fmt.Errorf("poll results: %w", err)
		}
		now := time.Now()
		seen := before.Add(now.Sub(before) / 2)
		if t0.IsZero() {
			if ready < n {
				t0 = midpoint(lastFull, seen)
				st := sampleTree(p.pid())
				cpu0, d.StartRSS = st.cpu, st.rss
				bcpu0, bok = h.serverCPU(ctx, k, s.results)
				dcpu0, dok = postgresCPU()
			} else {
				lastFull = seen
			}
		}
		if ready == 0 && unacked <= 0 && (!s.results.on() || stored >= n) {
			if lastBusy.Before(t0) {
				lastBusy = t0
			}
			tEnd = midpoint(lastBusy, seen)
			break
		}
		if !t0.IsZero() {
			lastBusy = seen
		}
		if count := (n - ready) + stored + max(unacked, 0); count != lastSeen {
			lastSeen, lastProgress = count, now
		} else if now.Sub(lastProgress) > h.o.Stall {
			d.Stalled = fmt.Sprintf("no progress for %v: %d of %d taken, %d unacknowledged, %d results", h.o.Stall, n-ready, n, max(unacked, 0), stored)
			break
		}
		if !t0.IsZero() {
			if why := hopeless(now.Sub(t0), h.o.Timeout, progress(n, ready, unacked, stored, s.results.on()), n); why != "" {
				d.Stalled = fmt.Sprintf("%s: %d of %d taken, %d unacknowledged, %d results", why, n-ready, n, max(unacked, 0), stored)
				break
			}
		}
		if err := p.failed(); err != nil {
			return d, err
		}
		select {
		case <-ctx.Done():
			return d, ctx.Err()
		case <-tick.C:
		}
	}
	if d.Stalled == "" {
		d.CPU = sampleTree(p.pid()).cpu - cpu0
		d.BrokerCPU = -1
		if bcpu1, ok := h.serverCPU(ctx, k, s.results); ok && bok {
			d.BrokerCPU = bcpu1 - bcpu0
		}
		d.DBCPU = -1
		if dcpu1, ok := postgresCPU(); ok && dok && s.results == PostgresResults {
			d.DBCPU = dcpu1 - dcpu0
		}
		d.Seconds = tEnd.Sub(t0).Seconds()
		if lag, ok := h.ackLag(ctx, k); ok {
			d.AckLag = lag
		}
	}
	d.PeakRSS = p.stop()
	p = nil
	if d.Stalled != "" {
		return d, nil
	}
	return d, h.verify(ctx, k, s.results, n)
}

func midpoint(a, b time.Time) time.Time { return a.Add(b.Sub(a) / 2) }

// serverCPU is the CPU time of the broker server plus, with results, the
// result Redis when it is not the broker.
func (h *harness) serverCPU(ctx context.Context, k kit, results ResultStore) (time.Duration, bool) {
	cpu, ok := k.ServerCPU(ctx)
	if results == PostgresResults {
		pc, pok := postgresCPU()
		return cpu + pc, ok && pok
	}
	if _, isRedis := k.(*redisKit); results == RedisResults && !isRedis {
		rc, rok := redisServerCPU(ctx, h.results)
		cpu, ok = cpu+rc, ok && rok
	}
	return cpu, ok
}

// progress is how many of n tasks a drain has finished, as far as the
// broker can tell: taken and acknowledged where unacked is known, stored
// with results.
func progress(n, ready, unacked, stored int, results bool) int {
	if results {
		return stored
	}
	return n - ready - max(unacked, 0)
}

// hopeless says why a drain is not worth waiting for: it ran past timeout,
// or after ten seconds its rate so far would take it past timeout.
func hopeless(elapsed, timeout time.Duration, done, n int) string {
	if elapsed > timeout {
		return fmt.Sprintf("not done after %v", timeout.Round(time.Second))
	}
	if elapsed < 10*time.Second {
		return ""
	}
	if done <= 0 {
		return fmt.Sprintf("nothing done after %v", elapsed.Round(time.Second))
	}
	if projected := time.Duration(float64(elapsed) * float64(n) / float64(done)); projected > timeout {
		return fmt.Sprintf("too slow: %d done in %v, %v projected (limit %v)", done, elapsed.Round(time.Second), projected.Round(time.Second), timeout.Round(time.Second))
	}
	return ""
}

// prepare empties the queue and the result database and loads msgs.
func (h *harness) prepare(ctx context.Context, k kit, msgs []message) error {
	if err := k.Reset(ctx); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	if err := h.results.FlushDB(ctx).Err(); err != nil {
		return fmt.Errorf("flush results: %w", err)
	}
	if h.pg != nil {
		if err := h.pg.flush(ctx); err != nil {
			return fmt.Errorf("flush PostgreSQL results: %w", err)
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	if err := k.Restore(ctx, msgs); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	ready, _, err := k.State(ctx)
	if err != nil {
		return err
	}
	if ready != len(msgs) {
		return fmt.Errorf("restore: %d messages ready, want %d", ready, len(msgs))
	}
	return nil
}

// ackLag waits for the broker to report no unacknowledged messages, where
// it can say (RabbitMQ via rabbitmqctl, a few tenths of a second a call).
func (h *harness) ackLag(ctx context.Context, k kit) (time.Duration, bool) {
	if _, unacked, _ := k.State(ctx); unacked >= 0 {
		return 0, false // Redis: the poll already saw unacked empty
	}
	start := time.Now()
	for time.Since(start) < 30*time.Second {
		n, ok := k.Unacked(ctx)
		if !ok {
			return 0, false
		}
		if n == 0 {
			return time.Since(start), true
		}
	}
	return time.Since(start), true
}

// verify checks, after the worker has stopped, that every message was
// acknowledged (none came back to the queue) and every result stored.
func (h *harness) verify(ctx context.Context, k kit, results ResultStore, n int) error {
	ready, unacked, err := k.State(ctx)
	if err != nil {
		return err
	}
	if ready != 0 || unacked > 0 {
		return fmt.Errorf("after the worker stopped: %d messages ready, %d unacknowledged: not every message was acknowledged", ready, unacked)
	}
	switch results {
	case NoResults:
		return nil
	case PostgresResults:
		if h.pg == nil {
			return errNoPostgres
		}
		return h.pg.verify(ctx, n)
	}
	stored, err := h.results.DBSize(ctx).Result()
	if err != nil {
		return err
	}
	if int(stored) != n {
		return fmt.Errorf("%d results stored, want %d", stored, n)
	}
	key, err := h.results.RandomKey(ctx).Result()
	if err != nil {
		return err
	}
	doc, err := h.results.Get(ctx, key).Result()
	if err != nil {
		return err
	}
	if !strings.HasPrefix(key, "celery-task-meta-") || !strings.Contains(doc, `"status": "SUCCESS"`) {
		return errors.New("result " + key + " is not a SUCCESS: " + doc)
	}
	return nil
}

// stored counts the results stored so far.
func (h *harness) stored(ctx context.Context, res ResultStore) (int, error) {
	switch res {
	case RedisResults:
		n, err := h.results.DBSize(ctx).Result()
		return int(n), err
	case PostgresResults:
		if h.pg == nil {
			return 0, errNoPostgres
		}
		return h.pg.stored(ctx)
	}
	return 0, nil
}
