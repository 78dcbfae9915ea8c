package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Report is a benchmark run's measurements.
type Report struct {
	Options Options
	Command string // the command line, for the report's header
	Machine string
	Start   time.Time
	End     time.Time
	Drains  []DrainGroup
	Latency []LatencyGroup
	Sweeps  []SweepGroup
	ETA     []ETAGroup
}

// machine describes the machine and the software measured.
func (h *harness) machine(ctx context.Context) string {
	parts := machineBase()
	if info, err := h.results.Info(ctx, "server").Result(); err == nil {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				parts = append(parts, "Redis "+v)
			}
		}
	}
	if k, ok := h.kits["amqp"].(*amqpKit); ok && k.conn != nil {
		if v, ok := k.conn.Properties["version"].(string); ok {
			parts = append(parts, "RabbitMQ "+v)
		}
	}
	if out, err := h.python(ctx, "", NoResults, "-c", "import celery, kombu; print(celery.__version__, kombu.__version__)"); err == nil {
		if f := strings.Fields(out); len(f) == 2 {
			parts = append(parts, fmt.Sprintf("Python Celery %s (kombu %s)", f[0], f[1]))
		}
	}
	return strings.Join(parts, "; ")
}

// machineBase describes the machine: CPU, memory, kernel, load, Go.
func machineBase() []string {
	var parts []string
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	parts = append(parts, fmt.Sprintf("%s, %d cores", model, runtime.NumCPU()))
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			parts = append(parts, fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20)))
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		parts = append(parts, "Linux "+strings.TrimSpace(string(b)))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		parts = append(parts, "load average at start "+strings.Join(strings.Fields(string(b))[:3], " "))
	}
	return append(parts, runtime.Version())
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

type pstats struct{ p50, p90, p99, max float64 }

// percentiles uses the nearest rank: the p-th percentile of n sorted
// values is the ceil(p*n)-th.
func percentiles(ms []float64) pstats {
	if len(ms) == 0 {
		return pstats{math.NaN(), math.NaN(), math.NaN(), math.NaN()}
	}
	s := slices.Clone(ms)
	slices.Sort(s)
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return pstats{rank(0.50), rank(0.90), rank(0.99), s[len(s)-1]}
}

// summary is the median and range of one figure over the valid runs.
type summary struct {
	med, lo, hi float64
	valid, all  int
}

func summarize[T any](runs []T, ok func(T) bool, f func(T) float64) summary {
	var xs []float64
	for _, r := range runs {
		if ok(r) {
			xs = append(xs, f(r))
		}
	}
	s := summary{valid: len(xs), all: len(runs), med: math.NaN(), lo: math.NaN(), hi: math.NaN()}
	if len(xs) > 0 {
		s.med, s.lo, s.hi = median(xs), slices.Min(xs), slices.Max(xs)
	}
	return s
}

func validDrain(d Drain) bool { return d.Stalled == "" }

// fmtRange writes "median (min–max)" with the given precision.
func (s summary) fmtRange(prec int) string {
	if s.valid == 0 {
		return "—"
	}
	if s.all == 1 || s.lo == s.hi {
		return fmt.Sprintf("%.*f", prec, s.med)
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, s.med, prec, s.lo, prec, s.hi)
}

func (s summary) fmt(prec int) string {
	if s.valid == 0 {
		return "—"
	}
	return fmt.Sprintf("%.*f", prec, s.med)
}

// thousands formats a whole number with thin spaces between thousands,
// as the README's tables do.
func thousands(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	s := fmt.Sprintf("%.0f", x)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			b.WriteString(" ")
		}
		b.WriteRune(c)
	}
	return b.String()
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func stalledNote(s summary) string {
	if s.valid == s.all {
		return ""
	}
	return fmt.Sprintf(" (%d of %d runs stalled)", s.all-s.valid, s.all)
}

func mb(x float64) float64 { return x / 1e6 }

// Markdown writes the report as Markdown tables.
func (r *Report) Markdown(w io.Writer) {
	o := r.Options
	fmt.Fprintf(w, "# celeriac bench, %s\n\n", r.Start.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(w, "Machine: %s.\n\n", r.Machine)
	if r.Command != "" {
		fmt.Fprintf(w, "Command: `%s` (%.0f min).\n\n", r.Command, r.End.Sub(r.Start).Minutes())
	}
	fmt.Fprintf(w, "Every worker is a process of its own on this machine, sharing its cores with the brokers. "+
		"Messages are published by Python Celery's `send_task` (JSON, protocol 2) once per variant, taken out and put back byte for byte before every run. "+
		"Figures are medians of %d runs, min–max in brackets; runs go round the workers (A B C A B C) so that ratios compare runs of the same moments. "+
		"Drain time runs from the first message taken until the queue is empty, nothing is unacknowledged (Redis: kombu's `unacked` hash) and, with results, every result is stored; start-up is excluded. "+
		"CPU is the worker's user+system time over the drain (all its processes); RSS is the peak sum over its processes, start-up included. "+
		"Python workers: `celery worker -P <pool> --without-gossip --without-mingle --without-heartbeat`, prefetch multiplier 4, early ack, remote control off; "+
		"celeriac: `celeriac worker -c %d --without-heartbeat` (early ack, prefetch multiplier 4, remote control on).\n\n", o.Reps, o.Concurrency)

	if len(r.Drains) > 0 {
		r.drainTables(w)
	}
	if len(r.Latency) > 0 {
		r.latencyTable(w)
	}
	if len(r.Sweeps) > 0 {
		r.sweepTable(w)
	}
	if len(r.ETA) > 0 {
		r.etaTable(w)
	}
}

func (r *Report) drainTables(w io.Writer) {
	fmt.Fprintf(w, "## Drain\n\n")
	fmt.Fprintf(w, "| broker | results | task | worker | drain s | tasks/s | CPU µs/task | broker CPU µs/task | peak RSS MB | ack lag s |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, g := range r.Drains {
		for _, row := range g.Rows {
			secs := summarize(row.Runs, validDrain, func(d Drain) float64 { return d.Seconds })
			rate := summarize(row.Runs, validDrain, Drain.Rate)
			cpu := summarize(row.Runs, validDrain, func(d Drain) float64 { return float64(d.CPUPerTask()) / 1e3 })
			rss := summarize(row.Runs, func(Drain) bool { return true }, func(d Drain) float64 { return mb(float64(d.PeakRSS)) })
			bcpu := summarize(row.Runs, func(d Drain) bool { return validDrain(d) && d.BrokerCPU >= 0 }, func(d Drain) float64 { return float64(d.BrokerCPU) / 1e3 / float64(d.N) })
			lag := "—"
			if g.Broker == "RabbitMQ" {
				lag = summarize(row.Runs, validDrain, func(d Drain) float64 { return d.AckLag.Seconds() }).fmt(1)
			}
			fmt.Fprintf(w, "| %s | %s | %s ×%s | %s | %s | %s | %s | %s | %s | %s |\n",
				g.Broker, resultsLabel(g.Results), g.Task.Label, thousands(float64(g.N)), row.Label,
				secs.fmtRange(3)+stalledNote(secs), thousands(rate.med), cpu.fmt(0), bcpu.fmt(1), rss.fmt(0), lag)
		}
	}
	fmt.Fprintf(w, "\nRatios, from the medians above:\n\n")
	fmt.Fprintf(w, "| broker | results | task | celeriac tasks/s | best Python tasks/s | ceiling tasks/s | batched ceiling tasks/s | celeriac / best Python | celeriac / ceiling | celeriac / batched ceiling |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, g := range r.Drains {
		var cel, ceil, batched, best float64 = math.NaN(), math.NaN(), math.NaN(), math.NaN()
		bestLabel := ""
		for _, row := range g.Rows {
			rate := summarize(row.Runs, validDrain, Drain.Rate)
			switch {
			case row.Kind == Celeriac:
				cel = rate.med
			case row.Kind == Ceiling:
				ceil = rate.med
			case row.Kind == Batched:
				batched = rate.med
			case row.Kind.python() && rate.valid > 0 && (math.IsNaN(best) || rate.med > best):
				best, bestLabel = rate.med, strings.TrimPrefix(row.Label, "Python ")
			}
		}
		bestCol := thousands(best)
		if bestLabel != "" {
			bestCol += " (" + bestLabel + ")"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | **%s** | **%s** | %s |\n", g.Broker, resultsLabel(g.Results), g.Task.Label,
			thousands(cel), bestCol, thousands(ceil), thousands(batched), ratio(cel, best), ratio(cel, ceil), ratio(cel, batched))
	}
	fmt.Fprintln(w)
}

func resultsLabel(results ResultStore) string {
	switch results {
	case RedisResults:
		return "Redis"
	case PostgresResults:
		return "PostgreSQL"
	}
	return "none"
}

func (r *Report) latencyTable(w io.Writer) {
	fmt.Fprintf(w, "## Round trip\n\n")
	fmt.Fprintf(w, "A Python client sends `tasks.noop` with `send_task` %d times after %d warm-up calls, one at a time, against an idle worker, and waits for the result (Redis backend). "+
		"**AsyncResult.get()** is Celery's own client, what an application sees. **Own subscriber** waits on a pub/sub subscription made before the send instead: "+
		"Celery 5.2's client fetches an already stored result with a GET, and after such fast calls stale subscribe/unsubscribe confirmations pile up on its connection, to be drained by a later call one per read, "+
		"so its p99 grows with the worker's speed; the own-subscriber figures are the worker's and the brokers' share. "+
		"Percentiles are per run, then the median over runs.\n\n", r.Latency[0].Calls, latencyWarmup)
	fmt.Fprintf(w, "| broker | client | worker | p50 ms | p90 ms | p99 ms | max ms | p50 / ceiling p50 | p99 / best Python p99 |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, g := range r.Latency {
		type agg struct{ p50, p90, p99, max float64 }
		aggs := make([]agg, len(g.Rows))
		ceil50, bestPy99 := math.NaN(), math.NaN()
		for i, row := range g.Rows {
			var p50, p90, p99, mx []float64
			for _, run := range row.Runs {
				st := percentiles(run)
				p50, p90, p99, mx = append(p50, st.p50), append(p90, st.p90), append(p99, st.p99), append(mx, st.max)
			}
			aggs[i] = agg{median(p50), median(p90), median(p99), median(mx)}
			if row.Kind == Ceiling {
				ceil50 = aggs[i].p50
			}
			if row.Kind.python() && (math.IsNaN(bestPy99) || aggs[i].p99 < bestPy99) {
				bestPy99 = aggs[i].p99
			}
		}
		client := "AsyncResult.get()"
		if g.Mode == ModePubSub {
			client = "own subscriber"
		}
		for i, row := range g.Rows {
			a := aggs[i]
			r50, r99 := "", ""
			if row.Kind != Ceiling {
				r50 = ratio(a.p50, ceil50)
			}
			if !row.Kind.python() && !row.Kind.ceiling() {
				r99 = ratio(a.p99, bestPy99)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %s | %s |\n", g.Broker, client, row.Label, a.p50, a.p90, a.p99, a.max, r50, r99)
		}
	}
	fmt.Fprintln(w)
}

func (r *Report) sweepTable(w io.Writer) {
	fmt.Fprintf(w, "## Concurrency\n\n")
	fmt.Fprintf(w, "The 1 ms task (`tasks.sleep(0.001)`), %s tasks, Redis results (so that the drain ends when every task has run, also on RabbitMQ), at each concurrency: goroutines for celeriac, threads for Python.\n\n", thousands(float64(r.Sweeps[0].N)))
	fmt.Fprintf(w, "| broker | worker | concurrency | tasks/s | CPU µs/task | peak RSS MB |\n|---|---|---|---|---|---|\n")
	for _, g := range r.Sweeps {
		for _, row := range g.Rows {
			rate := summarize(row.Runs, validDrain, Drain.Rate)
			cpu := summarize(row.Runs, validDrain, func(d Drain) float64 { return float64(d.CPUPerTask()) / 1e3 })
			rss := summarize(row.Runs, func(Drain) bool { return true }, func(d Drain) float64 { return mb(float64(d.PeakRSS)) })
			label := "celeriac"
			if row.Kind == Threads {
				label = "Python threads"
			}
			rateCol := thousands(rate.med)
			if rate.valid < rate.all {
				if rate.valid == 0 {
					rateCol = "stalled"
				} else {
					rateCol += stalledNote(rate)
				}
			}
			fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s |\n", g.Broker, label, row.Concurrency, rateCol, cpu.fmt(0), rss.fmt(0))
		}
	}
	fmt.Fprintln(w)
}

func (r *Report) etaTable(w io.Writer) {
	fmt.Fprintf(w, "## Held ETA tasks\n\n")
	fmt.Fprintf(w, "%s tasks with `countdown=3600` published by Python into the queue of an idle worker, which takes and holds them all. Memory per task = (RSS holding them − RSS idle) / count.\n\n", thousands(float64(r.ETA[0].N)))
	fmt.Fprintf(w, "| broker | worker | idle RSS MB | RSS holding MB | bytes per held task | s to take them all |\n|---|---|---|---|---|---|\n")
	for _, g := range r.ETA {
		for _, row := range g.Rows {
			ok := func(e ETARun) bool { return e.Stalled == "" }
			idle := summarize(row.Runs, ok, func(e ETARun) float64 { return mb(float64(e.IdleRSS)) })
			held := summarize(row.Runs, ok, func(e ETARun) float64 { return mb(float64(e.HeldRSS)) })
			per := summarize(row.Runs, ok, func(e ETARun) float64 { return e.PerTask(g.N) })
			took := summarize(row.Runs, ok, func(e ETARun) float64 { return e.Took.Seconds() })
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", g.Broker, row.Label, idle.fmt(1), held.fmt(1)+stalledNote(held), thousands(per.med), took.fmt(1))
		}
	}
	fmt.Fprintln(w)
}
