package main

import (
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/celeriac/celeriac/cmd/celeriac/internal/bench"
)

func newBenchCeilingCmd() *cobra.Command {
	var o bench.CeilingOptions
	cmd := &cobra.Command{
		Use:    "ceiling",
		Short:  "Run the bare consume-and-ack loop that celeriac bench measures as the ceiling",
		Hidden: true,
		Args:   args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return bench.RunCeiling(ctx, o)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.BrokerURL, "broker-url", "", "redis:// or amqp:// URL")
	fl.StringVar(&o.Queue, "queue", "bench_q", "queue to drain")
	fl.StringVar(&o.ResultURL, "result-url", "", "Redis URL for result writes (none when empty)")
	fl.IntVar(&o.Batch, "batch", 256, "Redis pop size and AMQP prefetch")
	fl.BoolVar(&o.Batched, "batched", false, "the fewest commands per batch instead of kombu's per message")
	return cmd
}

type benchFlags struct {
	n, reps, concurrency, latency, eta, sweepN  int
	brokers, results, tasks, workers, sweep     string
	redis, redisDBs, amqp, python, out, profile string
	pg                                          string
	stall, timeout                              time.Duration
}

func newBenchCmd() *cobra.Command {
	f := &benchFlags{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark celeriac against Python Celery and the raw broker ceiling",
		Long: `Benchmark celeriac against Python Celery's worker pools and a bare
consume-and-ack loop (the ceiling), on the same messages, brokers and
machine, in one run.

Python Celery (--python) publishes the tasks with send_task; each worker
then drains them: celeriac worker, the ceiling (celeriac bench ceiling: the
same Go client libraries, kombu's unacked bookkeeping on Redis, a result
write when results are on, nothing else) and Python's prefork -c 2,
threads -c 8 and solo pools. Then: round trips from a Python client
(apply_async then .get()), a concurrency sweep with a 1 ms task, and the
memory of held ETA tasks.

It prints Markdown tables (medians of --reps runs, with the ratios
celeriac / best Python and celeriac / ceiling) on stdout and progress on
stderr. The Redis broker and the results are the two databases of --redis
that --redis-dbs names, and the queue is bench_q: all are emptied before
every run and at the end, so the benchmark refuses to start when either
database holds a key or bench_q holds a message (it deletes only what it
created). With --results postgres, results go through Celery's SQLAlchemy
backend into the database celeriac_bench of --postgres (created when
missing, emptied before every run; refused when its result tables hold
rows); the broker CPU column then includes PostgreSQL's.

A full run takes about 45 minutes on 2 cores; narrow it with the flags.`,
		Example: `  celeriac bench --redis-dbs 8,4 > bench.md
  celeriac bench --redis-dbs 8,4 --brokers redis --results none --tasks noop --workers celeriac,ceiling --reps 5
  celeriac bench --redis-dbs 8,4 -n 2000 --reps 1 --latency 100 --eta 1000 --sweep 1,100`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return runBench(cmd, f) },
	}
	fl := cmd.Flags()
	fl.IntVarP(&f.n, "tasks-per-run", "n", 20000, "tasks per drain")
	fl.IntVar(&f.reps, "reps", 3, "repetitions of every measurement (the tables show medians)")
	fl.StringVar(&f.brokers, "brokers", "redis,amqp", "brokers: redis, amqp")
	fl.StringVar(&f.results, "results", "none,redis", "result settings: none, redis, postgres (Celery's db+postgresql:// backend)")
	fl.StringVar(&f.tasks, "tasks", "noop,sleep1ms", "tasks: noop (tasks.noop), sleep1ms (tasks.sleep(0.001))")
	fl.StringVar(&f.workers, "workers", "celeriac,ceiling,ceiling-batched,prefork,threads,solo", "workers to measure")
	fl.IntVarP(&f.concurrency, "concurrency", "c", 100, "celeriac's concurrency in the drain, round-trip and ETA tables")
	fl.IntVar(&f.latency, "latency", 1000, "round trips per latency measurement (0 skips them)")
	fl.StringVar(&f.sweep, "sweep", "1,10,100,1000", "concurrency levels of the sweep (\"\" skips it)")
	fl.IntVar(&f.sweepN, "sweep-tasks", 0, "tasks per sweep drain (default --tasks-per-run)")
	fl.IntVar(&f.eta, "eta", 10000, "held ETA tasks (0 skips them)")
	fl.DurationVar(&f.stall, "stall", 20*time.Second, "a run without progress for this long has stalled")
	fl.DurationVar(&f.timeout, "timeout", 180*time.Second, "a drain not done this long after its first message is abandoned")
	fl.StringVar(&f.redis, "redis", "redis://127.0.0.1:6379", "Redis server, without a database (see --redis-dbs)")
	fl.StringVar(&f.redisDBs, "redis-dbs", "", "BROKER,RESULTS: two empty databases of --redis the benchmark may use and empty (required, e.g. 8,4)")
	fl.StringVar(&f.amqp, "amqp", "amqp://guest:guest@127.0.0.1:5672//", "RabbitMQ broker")
	fl.StringVar(&f.pg, "postgres", "postgres://celeriac:celeriac@127.0.0.1:5432/celeriac", "PostgreSQL server of --results postgres (its database celeriac_bench is created and used)")
	fl.StringVar(&f.python, "python", "", "Python interpreter with Celery (default $CELERIAC_PYTHON, else /usr/bin/python3)")
	fl.StringVarP(&f.out, "output", "o", "", "also write the report to this file")
	fl.StringVar(&f.profile, "profile", "", "directory for CPU profiles of celeriac's drains (go tool pprof)")
	cmd.AddCommand(newBenchCeilingCmd(), newBenchIOWorkerCmd(), newBenchIOCmd())
	return cmd
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// benchOptions turns the flags into bench.Options.
func benchOptions(f *benchFlags) (bench.Options, error) {
	o := bench.Options{
		RedisURL: f.redis, AMQPURL: f.amqp, Python: f.python, PostgresURL: f.pg,
		N: f.n, Reps: f.reps, Concurrency: f.concurrency, SweepN: f.sweepN, Stall: f.stall, Timeout: f.timeout,
		LatencyN: f.latency, ETAN: f.eta, ProfileDir: f.profile,
	}
	if o.Python == "" {
		o.Python = os.Getenv("CELERIAC_PYTHON")
	}
	if f.redisDBs == "" {
		return o, usagef("--redis-dbs: name two empty Redis databases the benchmark may use and empty, e.g. --redis-dbs 8,4 (it refuses databases that hold keys)")
	}
	dbs := splitList(f.redisDBs)
	if len(dbs) != 2 {
		return o, usagef("--redis-dbs: want BROKER,RESULTS, e.g. 8,4; got %q", f.redisDBs)
	}
	for i, s := range dbs {
		db, err := strconv.Atoi(s)
		if err != nil || db < 0 {
			return o, usagef("--redis-dbs: %q is not a database number", s)
		}
		if i == 0 {
			o.RedisBrokerDB = db
		} else {
			o.RedisResultDB = db
		}
	}
	if o.RedisBrokerDB == o.RedisResultDB {
		return o, usagef("--redis-dbs: the broker and result databases must differ")
	}
	if f.n <= 0 || f.reps <= 0 || f.concurrency <= 0 || f.latency < 0 || f.eta < 0 || f.sweepN < 0 {
		return o, usagef("counts must be positive (--latency, --eta, --sweep-tasks may be 0)")
	}
	if f.latency == 0 {
		o.LatencyN = -1
	}
	if f.eta == 0 {
		o.ETAN = -1
	}
	for _, b := range splitList(f.brokers) {
		if b != "redis" && b != "amqp" {
			return o, usagef("--brokers: unknown broker %q (redis, amqp)", b)
		}
		o.Brokers = append(o.Brokers, b)
	}
	for _, r := range splitList(f.results) {
		if !slices.Contains(bench.ResultStores, bench.ResultStore(r)) {
			return o, usagef("--results: unknown setting %q (none, redis, postgres)", r)
		}
		o.Results = append(o.Results, bench.ResultStore(r))
	}
	for _, t := range splitList(f.tasks) {
		switch t {
		case "noop":
			o.Tasks = append(o.Tasks, bench.Noop)
		case "sleep1ms":
			o.Tasks = append(o.Tasks, bench.Sleep1)
		default:
			return o, usagef("--tasks: unknown task %q (noop, sleep1ms)", t)
		}
	}
	for _, w := range splitList(f.workers) {
		k := bench.Kind(w)
		if !slices.Contains(bench.AllKinds, k) {
			return o, usagef("--workers: unknown worker %q (celeriac, celeriac-traced, ceiling, ceiling-batched, prefork, threads, solo)", w)
		}
		o.Workers = append(o.Workers, k)
	}
	if len(o.Brokers) == 0 || len(o.Results) == 0 || len(o.Tasks) == 0 || len(o.Workers) == 0 {
		return o, usagef("--brokers, --results, --tasks and --workers must each name at least one")
	}
	levels := splitList(f.sweep)
	if len(levels) == 0 {
		o.NoSweep = true
	}
	for _, l := range levels {
		c, err := strconv.Atoi(l)
		if err != nil || c <= 0 {
			return o, usagef("--sweep: %q is not a positive concurrency", l)
		}
		o.Sweep = append(o.Sweep, c)
	}
	return o, nil
}

func runBench(cmd *cobra.Command, f *benchFlags) error {
	o, err := benchOptions(f)
	if err != nil {
		return err
	}
	if f.profile != "" {
		if err := os.MkdirAll(f.profile, 0o755); err != nil {
			return err
		}
	}
	o.Log = cmd.ErrOrStderr()
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	rep, err := bench.Run(ctx, o)
	if err != nil {
		return err
	}
	rep.Command = "celeriac " + strings.Join(os.Args[1:], " ")
	rep.Markdown(cmd.OutOrStdout())
	if f.out != "" {
		file, err := os.Create(f.out)
		if err != nil {
			return err
		}
		rep.Markdown(file)
		if err := file.Close(); err != nil {
			return fmt.Errorf("--output: %w", err)
		}
	}
	return nil
}
