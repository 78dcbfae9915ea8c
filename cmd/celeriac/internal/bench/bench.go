// Package bench is celeriac bench: celeriac, Python Celery's worker pools
// and a bare consume loop (the ceiling) drain the same messages, published
// by Python Celery, on the same brokers in the same run, and the results
// are printed as Markdown tables with the ratios between them.
//
// Every worker runs as a process of its own, so that its CPU time and
// resident memory are its own: `celeriac worker` (this binary), `celeriac
// bench ceiling` (this binary) and `python3 -m celery worker`.
package bench

import (
	"context"
	"embed"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/internal/redact"
)

//go:embed python/*.py
var pythonFiles embed.FS

// Kind names a worker the benchmark measures.
type Kind string

// The workers.
const (
	Celeriac Kind = "celeriac"        // celeriac worker
	Ceiling  Kind = "ceiling"         // the bare consume-and-ack loop (RunCeiling), kombu's commands per message
	Batched  Kind = "ceiling-batched" // the same loop with the fewest commands per batch
	Prefork  Kind = "prefork"         // Python Celery, -P prefork -c 2
	Threads  Kind = "threads"         // Python Celery, -P threads -c 8
	Solo     Kind = "solo"            // Python Celery, -P solo
	// Traced is celeriac worker with OpenTelemetry tracing on (sample ratio
	// 1.0), exporting over OTLP/HTTP to a sink the benchmark runs, which
	// reads and discards what it gets: what tracing costs a worker.
	Traced Kind = "celeriac-traced"
	// Staged is celeriac worker with the staged Redis pop
	// (CELERIAC_REDIS_STAGED_POP=1; on RabbitMQ the same as celeriac).
	Staged Kind = "celeriac-staged"
)

// Kinds lists the workers a run measures by default, in the order the
// tables show them.
var Kinds = []Kind{Celeriac, Ceiling, Batched, Prefork, Threads, Solo}

// AllKinds lists every worker the benchmark knows.
var AllKinds = append(slices.Clone(Kinds), Traced, Staged)

func (k Kind) python() bool { return k == Prefork || k == Threads || k == Solo }

func (k Kind) ceiling() bool { return k == Ceiling || k == Batched }

// label is the worker as the tables name it.
func (k Kind) label(celeriacC int) string {
	switch k {
	case Celeriac:
		return fmt.Sprintf("celeriac -c %d", celeriacC)
	case Traced:
		return fmt.Sprintf("celeriac -c %d, tracing on", celeriacC)
	case Staged:
		return fmt.Sprintf("celeriac -c %d, staged pop", celeriacC)
	case Ceiling:
		return "ceiling: bare loop"
	case Batched:
		return "ceiling: bare loop, batched"
	case Prefork:
		return "Python prefork -c 2"
	case Threads:
		return "Python threads -c 8"
	case Solo:
		return "Python solo"
	}
	return string(k)
}

// Task is a task the benchmark drains.
type Task struct {
	Label string // as the tables name it
	Name  string // the Celery task name, which both celeriac and benchapp.py register
	Args  string // preload.py's ARGS_JSON: "i" for [i], else a JSON list
}

// The tasks.
var (
	Noop    = Task{Label: "no-op", Name: "tasks.noop", Args: "i"}
	Sleep1  = Task{Label: "1 ms sleep", Name: "tasks.sleep", Args: "[0.001]"}
	AllTask = []Task{Noop, Sleep1}
)

// Options configure a benchmark run. The zero value of a field means its
// default.
type Options struct {
	RedisURL string // Redis server, without a database (default redis://127.0.0.1:6379)
	AMQPURL  string // RabbitMQ (default amqp://guest:guest@127.0.0.1:5672//)
	Python   string // interpreter with Celery (default /usr/bin/python3)
	// PostgresURL is the server of PostgresResults (default the test
	// database of .ci/setup); the benchmark uses its database celeriac_bench.
	PostgresURL string
	Exe         string // the celeriac binary (default this process's executable)
	// RedisBrokerDB and RedisResultDB are the databases of RedisURL the
	// benchmark uses as the Redis broker and the result backend, which it
	// empties between runs and at the end: the caller names them, and a
	// run refuses to start when either holds a key (checkUnused). They
	// must differ.
	RedisBrokerDB, RedisResultDB int

	N           int           // tasks per drain (default 20 000)
	Reps        int           // repetitions of every measurement (default 3)
	Brokers     []string      // "redis", "amqp" (default both)
	Results     []ResultStore // none, redis, postgres (default none and redis)
	Tasks       []Task        // default Noop and Sleep1
	Workers     []Kind        // default Kinds
	Concurrency int           // celeriac's -c in the drain and latency tables (default 100)
	Sweep       []int         // concurrency levels of the sweep table (default 1, 10, 100, 1000); none when empty after defaults
	NoSweep     bool          // skip the sweep
	SweepN      int           // tasks per sweep drain (default N)
	LatencyN    int           // round trips per latency measurement (default 1000; <0 skips)
	ETAN        int           // held ETA tasks (default 10 000; <0 skips)
	Stall       time.Duration // a drain that makes no progress this long has stalled (default 20 s)
	Timeout     time.Duration // a drain not done this long after its first message is abandoned (default 180 s)
	Poll        time.Duration // how often the queue is polled (default 5 ms)
	Queue       string        // default bench_q
	ProfileDir  string        // when set, celeriac writes a CPU profile of each drain here

	Log io.Writer // progress lines (default io.Discard)
}

func (o *Options) defaults() {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&o.RedisURL, "redis://127.0.0.1:6379")
	def(&o.AMQPURL, "amqp://guest:guest@127.0.0.1:5672//")
	def(&o.Python, "/usr/bin/python3")
	def(&o.Queue, "bench_q")
	def(&o.PostgresURL, "postgres://celeriac:celeriac@127.0.0.1:5432/celeriac")
	if o.Exe == "" {
		o.Exe, _ = os.Executable()
	}
	if o.N <= 0 {
		o.N = 20000
	}
	if o.Reps <= 0 {
		o.Reps = 3
	}
	if len(o.Brokers) == 0 {
		o.Brokers = []string{"redis", "amqp"}
	}
	if len(o.Results) == 0 {
		o.Results = []ResultStore{NoResults, RedisResults}
	}
	if len(o.Tasks) == 0 {
		o.Tasks = AllTask
	}
	if len(o.Workers) == 0 {
		o.Workers = Kinds
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 100
	}
	if len(o.Sweep) == 0 {
		o.Sweep = []int{1, 10, 100, 1000}
	}
	if o.SweepN <= 0 {
		o.SweepN = o.N
	}
	if o.LatencyN == 0 {
		o.LatencyN = 1000
	}
	if o.ETAN == 0 {
		o.ETAN = 10000
	}
	if o.Stall <= 0 {
		o.Stall = 20 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 180 * time.Second
	}
	if o.Poll <= 0 {
		o.Poll = 5 * time.Millisecond
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
}

// harness holds what a run shares: the brokers, the result database, the
// Python files and the captured messages.
type harness struct {
	o       Options
	pyDir   string
	sink    *otlpSink // started by the first traced worker
	results *goredis.Client
	pg      *pgResults // nil unless PostgresResults is measured
	kits    map[string]kit
	capture map[captureKey][]message
}

type captureKey struct {
	broker    string
	task      Task
	results   ResultStore
	countdown float64
	n         int
}

// Run runs the benchmark and returns its report.
func Run(ctx context.Context, o Options) (*Report, error) {
	o.defaults()
	// Before anything is created, so that a refusal leaves everything as
	// it was (close empties what the harness holds).
	if err := checkUnused(ctx, o); err != nil {
		return nil, err
	}
	h := &harness{o: o, kits: map[string]kit{}, capture: map[captureKey][]message{}}
	defer h.close()
	if err := h.setup(ctx); err != nil {
		return nil, err
	}
	rep := &Report{Options: o, Start: time.Now()}
	rep.Machine = h.machine(ctx)
	for _, b := range o.Brokers {
		for _, res := range o.Results {
			for _, t := range o.Tasks {
				g, err := h.drainGroup(ctx, b, res, t)
				if err != nil {
					return nil, err
				}
				rep.Drains = append(rep.Drains, g)
			}
		}
	}
	if o.LatencyN > 0 {
		for _, mode := range []string{ModeGet, ModePubSub} {
			for _, b := range o.Brokers {
				g, err := h.latencyGroup(ctx, b, mode)
				if err != nil {
					return nil, err
				}
				rep.Latency = append(rep.Latency, g)
			}
		}
	}
	if !o.NoSweep {
		for _, b := range o.Brokers {
			g, err := h.sweepGroup(ctx, b)
			if err != nil {
				return nil, err
			}
			rep.Sweeps = append(rep.Sweeps, g)
		}
	}
	if o.ETAN > 0 {
		for _, b := range o.Brokers {
			g, err := h.etaGroup(ctx, b)
			if err != nil {
				return nil, err
			}
			rep.ETA = append(rep.ETA, g)
		}
	}
	rep.End = time.Now()
	return rep, nil
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.o.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func (h *harness) setup(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "celeriac-bench-")
	if err != nil {
		return err
	}
	h.pyDir = dir
	ents, err := pythonFiles.ReadDir("python")
	if err != nil {
		return err
	}
	for _, e := range ents {
		b, err := pythonFiles.ReadFile("python/" + e.Name())
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	if out, err := h.python(ctx, "", NoResults, "-c", "import celery, kombu, redis, amqp"); err != nil {
		return fmt.Errorf("python celery is not usable via %s (apt-get install python3-celery python3-redis): %v\n%s", h.o.Python, err, out)
	}
	opt, err := goredis.ParseURL(h.resultURL())
	if err != nil {
		return fmt.Errorf("redis URL: %w", redact.Error(err))
	}
	h.results = goredis.NewClient(opt)
	if err := h.results.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis result backend: %w", err)
	}
	if slices.Contains(h.o.Results, PostgresResults) {
		if out, err := h.python(ctx, "", NoResults, "-c", "import sqlalchemy, psycopg2"); err != nil {
			return fmt.Errorf("PostgreSQL results need SQLAlchemy and psycopg2 for %s (apt-get install python3-sqlalchemy python3-psycopg2): %v\n%s", h.o.Python, err, out)
		}
		if h.pg, err = newPGResults(ctx, h.o.PostgresURL); err != nil {
			return err
		}
	}
	for _, b := range h.o.Brokers {
		var k kit
		switch b {
		case "redis":
			k, err = newRedisKit(h.o.RedisURL, h.o.RedisBrokerDB, h.o.Queue)
		case "amqp":
			k, err = newAMQPKit(h.o.AMQPURL, h.o.Queue)
		default:
			err = fmt.Errorf("unknown broker %q (redis, amqp)", b)
		}
		if err != nil {
			return err
		}
		h.kits[b] = k
	}
	return nil
}

func (h *harness) close() {
	if h.sink != nil {
		h.sink.close()
	}
	for _, k := range h.kits {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = k.Reset(ctx)
		cancel()
		k.Close()
	}
	if h.results != nil {
		_ = h.results.FlushDB(context.Background()).Err()
		h.results.Close()
	}
	if h.pg != nil {
		h.pg.close()
	}
	if h.pyDir != "" {
		os.RemoveAll(h.pyDir)
	}
}

func (h *harness) resultURL() string { return withDB(h.o.RedisURL, h.o.RedisResultDB) }

// childEnv is the environment of every process the benchmark starts:
// this one's, without Celery settings that would point a worker elsewhere.
func childEnv(extra ...string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "CELERY_") || strings.HasPrefix(kv, "CELERIAC_") || strings.HasPrefix(kv, "BENCH_")
	})
	return append(env, extra...)
}

// resultBackend is result_backend for res, "" for none.
func (h *harness) resultBackend(res ResultStore) string {
	switch res {
	case RedisResults:
		return h.resultURL()
	case PostgresResults:
		if h.pg != nil {
			return h.pg.backendURL()
		}
	}
	return ""
}

func (h *harness) pyEnv(broker string, results ResultStore) []string {
	backend := h.resultBackend(results)
	return childEnv("BENCH_BROKER="+broker, "BENCH_BACKEND="+backend,
		"PYTHONPATH="+h.pyDir, "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
}

// messages returns the n messages of task that Python's producer publishes
// on broker b, capturing them the first time.
func (h *harness) messages(ctx context.Context, b string, t Task, results ResultStore, countdown float64, n int) ([]message, error) {
	key := captureKey{b, t, results, countdown, n}
	if m, ok := h.capture[key]; ok {
		return m, nil
	}
	k := h.kits[b]
	if err := k.Reset(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	out, err := h.python(ctx, k.URL(), results, filepath.Join(h.pyDir, "preload.py"),
		fmt.Sprint(n), h.o.Queue, t.Name, t.Args, fmt.Sprint(countdown))
	if err != nil {
		return nil, fmt.Errorf("python preload: %v\n%s", err, out)
	}
	msgs, err := k.Capture(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("capture of the Python messages: %w", err)
	}
	h.logf("%s: Python published %d %s messages (countdown %v) in %.1f s", k.Name(), n, t.Name, countdown, time.Since(start).Seconds())
	h.capture[key] = msgs
	return msgs, nil
}
