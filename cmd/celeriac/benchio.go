package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/celeriac/celeriac/cmd/celeriac/internal/bench"
)

func newBenchIOWorkerCmd() *cobra.Command {
	var broker, queue, results string
	var c int
	cmd := &cobra.Command{
		Use:    "ioworker",
		Short:  "Run the celeriac worker that celeriac bench io measures",
		Hidden: true,
		Args:   args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return bench.RunIOWorker(ctx, broker, queue, c, results)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&broker, "broker-url", "", "redis:// URL")
	fl.StringVar(&queue, "queue", "bench_io", "queue to consume")
	fl.IntVarP(&c, "concurrency", "c", 100, "slots")
	fl.StringVar(&results, "result-backend", "", "redis:// URL to store results in (default: results ignored)")
	return cmd
}

func newBenchIOCmd() *cobra.Command {
	var o bench.IOOptions
	var workers, loads, out string
	cmd := &cobra.Command{
		Use:   "io",
		Short: "Benchmark I/O-bound tasks: celeriac against Python Celery's prefork, threads and gevent pools",
		Long: `Every task GETs a URL of an HTTP server this command runs on loopback, which
answers after --delay (every --tail-every-th request after --tail): what a
task that calls an API does. Each worker drains --n such tasks from Redis
(throughput, queue wait and end to end p50/p99/p99.9, CPU per task, peak
RSS, Redis CPU per task), then takes Poisson arrivals at --loads fractions
of the throughput it showed, for --load-for each (end to end p50/p99).
With --results every worker stores results in Redis, and each open-loop
task is awaited by the Go client's AsyncResult.Get: publish to result as a
caller sees it.
Tasks are published by celeriac's client; the database --redis-db must be
empty and is emptied at the end.`,
		Example: `  celeriac bench io --redis-db 9 > io.md
  celeriac bench io --redis-db 9 --workers celeriac:1000,gevent:500 --n 2000
  celeriac bench io --redis-db 9 --results > io-results.md
  celeriac bench io --redis-db 9 --python-path ~/.cache/celeriac/celery-5.6   # Celery 5.6.3`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := bench.ParseIOWorkers(workers)
			if err != nil {
				return usagef("--workers: %v", err)
			}
			o.Workers = ws
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
			if o.RedisDB < 0 {
				return usagef("--redis-db: the benchmark needs a database of its own (it empties it)")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			o.Log = cmd.ErrOrStderr()
			res, err := bench.RunIO(ctx, o)
			var w io.Writer = cmd.OutOrStdout()
			if out != "" {
				f, ferr := os.Create(out)
				if ferr != nil {
					return ferr
				}
				defer f.Close()
				w = f
			}
			bench.WriteIOReport(w, o, res)
			if err != nil {
				return fmt.Errorf("bench io: %w", err)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.RedisURL, "redis", "redis://127.0.0.1:6379", "Redis server (without a database)")
	fl.IntVar(&o.RedisDB, "redis-db", -1, "the broker's database: must be empty, and is emptied at the end (required)")
	fl.StringVar(&o.Python, "python", "/usr/bin/python3", "interpreter with Celery")
	fl.StringVar(&o.PythonPath, "python-path", "", "put first on PYTHONPATH for the Python workers (another Celery version)")
	fl.StringVar(&workers, "workers", "celeriac:100,celeriac:1000,celeriac:5000,prefork:2:1000,prefork:16:2000,threads:100:1000,gevent:500:5000", "KIND:CONCURRENCY[:TASKS] list (TASKS: this worker's drain, default --n)")
	fl.IntVar(&o.N, "n", 20000, "tasks per drain")
	fl.DurationVar(&o.Delay, "delay", 50*time.Millisecond, "the server's answer delay")
	fl.IntVar(&o.TailEvery, "tail-every", 100, "every N-th request waits --tail instead")
	fl.DurationVar(&o.Tail, "tail", time.Second, "the long tail's delay")
	fl.StringVar(&loads, "loads", "0.25,0.5,0.9", "open-loop arrival rates, as fractions of each worker's throughput")
	fl.DurationVar(&o.LoadFor, "load-for", 20*time.Second, "arrivals per load level")
	fl.StringVar(&out, "out", "", "write the report here instead of stdout")
	fl.BoolVar(&o.Results, "results", false, "store results in Redis and await each open-loop task with the Go client's Get (publish to result latency)")
	return cmd
}
