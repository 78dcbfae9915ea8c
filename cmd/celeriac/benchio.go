package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/celeriac/celeriac/cmd/celeriac/internal/bench"
)

func dirExists(dir string) bool {
	fi, err := os.Stat(dir)
	return err == nil && fi.IsDir()
}

func newBenchIOWorkerCmd() *cobra.Command {
	var broker, queue, results, postgres string
	var c int
	cmd := &cobra.Command{
		Use:    "ioworker",
		Short:  "Run the celeriac worker that celeriac bench io measures",
		Hidden: true,
		Args:   args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return bench.RunIOWorker(ctx, broker, queue, c, results, postgres)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&broker, "broker-url", "", "redis:// or amqp:// URL")
	fl.StringVar(&queue, "queue", "bench_io", "queue to consume")
	fl.IntVarP(&c, "concurrency", "c", 100, "slots")
	fl.StringVar(&results, "result-backend", "", "redis:// URL to store results in (default: results ignored)")
	fl.StringVar(&postgres, "postgres", "", "PostgreSQL URL: each task also INSERTs a row into bench_io_rows")
	return cmd
}

func newBenchIOCmd() *cobra.Command {
	var o bench.IOOptions
	var workers, fleet, fleetProcs, loads, out, plot string
	var celeryPaths []string
	cmd := &cobra.Command{
		Use:   "io",
		Short: "Benchmark I/O-bound tasks: celeriac against Python Celery's prefork, threads and gevent pools",
		Long: `Every task GETs a URL of an HTTP server this command runs on loopback, which
answers after --delay (every --tail-every-th request after --tail): what a
task that calls an API does. Each worker drains --n such tasks from Redis,
or with --broker amqp from RabbitMQ (throughput, queue wait and end to end
p50/p99/p99.9, CPU per task, peak RSS, the broker's CPU per task), then takes Poisson arrivals at --loads fractions
of the throughput it showed, for --load-for each (end to end p50/p99).
With --results every worker stores results in Redis, and each open-loop
task is awaited, from its publish, by the Go client's AsyncResult.Get or,
for up to --python-callers of the arrivals a second, by a Python client's
AsyncResult.get() (a thread per call in flight): publish to result as a
caller sees it.
Tasks are published by celeriac's client; the database --redis-db must be
empty and is emptied at the end (on RabbitMQ, the queue bench_io must hold
no message, and is deleted at the end).`,
		Example: `  celeriac bench io --redis-db 9 > io.md
  celeriac bench io --redis-db 9 --workers celeriac:1000,gevent:500 --n 2000
  celeriac bench io --redis-db 9 --results > io-results.md
  celeriac bench io --broker amqp --amqp amqp://guest:guest@127.0.0.1:5672/bench --workers celeriac:1000,threads:100:1000
  celeriac bench io --redis-db 9 --workers threads@5.6:100:1000,gevent@5.6:500:2000   # Celery 5.6.3's pools
  celeriac bench io --redis-db 9 --workers celeriac:1000,threads:100:1000,threads@5.6:100:1000 --fleet celeriac:1000,threads:100:1000 --plot io.svg`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := bench.ParseIOWorkers(workers)
			if err != nil {
				return usagef("--workers: %v", err)
			}
			o.Workers = ws
			if fleet != "" {
				if o.Fleet, err = bench.ParseIOWorkers(fleet); err != nil {
					return usagef("--fleet: %v", err)
				}
			}
			for _, s := range strings.Split(fleetProcs, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || n < 1 || n > 64 {
					return usagef("--fleet-processes: %q is not a number of processes (1 to 64)", s)
				}
				o.FleetProcesses = append(o.FleetProcesses, n)
			}
			o.CeleryPaths = map[string]string{}
			if home, err := os.UserHomeDir(); err == nil {
				for _, v := range []string{"5.5", "5.6"} {
					// Where .ci/setup unpacks Debian's packages.
					if dir := filepath.Join(home, ".cache", "celeriac", "celery-"+v, "root", "usr", "lib", "python3", "dist-packages"); dirExists(dir) {
						o.CeleryPaths[v] = dir
					}
				}
			}
			for _, cp := range celeryPaths {
				v, dir, ok := strings.Cut(cp, "=")
				if !ok || v == "" || dir == "" {
					return usagef("--celery-path: %q is not VERSION=DIR", cp)
				}
				o.CeleryPaths[v] = dir
			}
			for _, s := range strings.Split(loads, ",") {
				if s = strings.TrimSpace(s); s == "" {
					continue
				}
				f, err := strconv.ParseFloat(s, 64)
				if err != nil || f <= 0 || f > 2 {
					return usagef("--loads: %q is not a fraction of the throughput (0.25, 0.9)", s)
				}
				o.Loads = append(o.Loads, f)
			}
			switch {
			case o.Broker != "redis" && o.Broker != "amqp":
				return usagef("--broker: %q is neither redis nor amqp", o.Broker)
			case o.RedisDB < 0 && (o.Broker == "redis" || o.Results):
				return usagef("--redis-db: the benchmark needs a database of its own (it empties it)")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			o.Log = cmd.ErrOrStderr()
			rep, err := bench.RunIO(ctx, o)
			rep.Command = "celeriac " + strings.Join(os.Args[1:], " ")
			var w io.Writer = cmd.OutOrStdout()
			if out != "" {
				f, ferr := os.Create(out)
				if ferr != nil {
					return ferr
				}
				defer f.Close()
				w = f
			}
			bench.WriteIOReport(w, rep)
			if plot != "" {
				var b bytes.Buffer
				bench.WriteIOPlot(&b, rep)
				if perr := os.WriteFile(plot, b.Bytes(), 0o644); perr != nil && err == nil {
					err = perr
				}
			}
			if err != nil {
				return fmt.Errorf("bench io: %w", err)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Broker, "broker", "redis", "redis (the database --redis-db) or amqp (the queue bench_io of --amqp, a RabbitMQ on this machine: its CPU is read from its beam.smp process)")
	fl.StringVar(&o.AMQPURL, "amqp", "amqp://guest:guest@127.0.0.1:5672//", "RabbitMQ broker of --broker amqp: its queue bench_io must hold no message, and is deleted at the end")
	fl.StringVar(&o.RedisURL, "redis", "redis://127.0.0.1:6379", "Redis server (without a database)")
	fl.IntVar(&o.RedisDB, "redis-db", -1, "the broker's database, and the results' with --results: must be empty, and is emptied at the end (required, except with --broker amqp without --results)")
	fl.StringVar(&o.Python, "python", "/usr/bin/python3", "interpreter with Celery")
	fl.StringVar(&o.PythonPath, "python-path", "", "put first on PYTHONPATH for the Python workers (another Celery version)")
	fl.StringVar(&workers, "workers", "celeriac:100,celeriac:1000,celeriac:5000,prefork:2:1000,prefork:16:2000,threads:100:1000,gevent:500:5000", "KIND[@CELERY]:CONCURRENCY[:TASKS] list (CELERY: a Python worker's Celery version, see --celery-path; TASKS: this worker's drain, default --n)")
	fl.StringVar(&fleet, "fleet", "", "workers run again as --fleet-processes processes each (a drain, then Poisson arrivals at half the one-process drain's throughput): does Redis' CPU per task hold as processes are added (celeriac:1000,threads:100:1000)")
	fl.StringVar(&fleetProcs, "fleet-processes", "1,2,4", "process counts of --fleet")
	fl.StringArrayVar(&celeryPaths, "celery-path", nil, "VERSION=DIR: the folder put first on PYTHONPATH for KIND@VERSION workers (default 5.5 and 5.6 from ~/.cache/celeriac, where .ci/setup unpacks them)")
	fl.StringVar(&o.PostgresURL, "postgres", "", "PostgreSQL server (postgres://celeriac:celeriac@127.0.0.1:5432/celeriac, as .ci/setup makes it): every task also INSERTs a row into the table bench_io_rows of its database celeriac_bench")
	fl.StringVar(&plot, "plot", "", "also draw p99 end to end against offered load, for every worker, as an SVG file")
	fl.IntVar(&o.N, "n", 20000, "tasks per drain")
	fl.DurationVar(&o.Delay, "delay", 50*time.Millisecond, "the server's answer delay")
	fl.IntVar(&o.TailEvery, "tail-every", 100, "every N-th request waits --tail instead")
	fl.DurationVar(&o.Tail, "tail", time.Second, "the long tail's delay")
	fl.StringVar(&loads, "loads", "0.25,0.5,0.9", "open-loop arrival rates, as fractions of each worker's throughput")
	fl.DurationVar(&o.LoadFor, "load-for", 20*time.Second, "arrivals per load level")
	fl.StringVar(&out, "out", "", "write the report here instead of stdout")
	fl.BoolVar(&o.Results, "results", false, "store results in Redis and await each open-loop task with the Go client's Get or, for up to --python-callers of them a second, Python's AsyncResult.get() (publish to result latency)")
	fl.Float64Var(&o.PythonCallers, "python-callers", 50, "with --results, the most open-loop arrivals a second a Python client publishes and awaits with AsyncResult.get() (negative: none)")
	return cmd
}
