package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/celeriac/celeriac/backend/redis"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/transport"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	redistransport "github.com/celeriac/celeriac/transport/redis"
	"github.com/celeriac/celeriac/worker"
)

// The I/O-bound benchmark (issue 31): what real Celery tasks mostly do is
// wait, on an HTTP API, a database, S3. Each task here GETs a URL of an
// HTTP server the benchmark runs on loopback, which answers after a delay
// (50 ms by default; every 100th request 1 s, the long tail). The server
// is also the clock: the task's URL carries its publish time, so the
// server sees each task's queue wait (publish to request) and end to end
// (publish to answer) without a result backend in the way. Every worker,
// celeriac at -c 100 to 5000 and Python Celery's prefork, threads and
// gevent pools, drains the same number of tasks (closed loop: throughput,
// CPU per task, peak RSS, Redis CPU per task), then takes open-loop
// arrivals (Poisson) at fractions of the capacity it showed, where a drain
// hides queueing delay and this does not.

// IOWorker is one worker of the I/O benchmark: a kind and its concurrency.
type IOWorker struct {
	Kind        string // "celeriac", "celeriac-staged", "prefork", "threads", "gevent"
	Concurrency int
	N           int // tasks of its drain; 0: IOOptions.N
	// Celery is the Celery version of a Python worker ("5.6"), found in
	// IOOptions.CeleryPaths; empty: IOOptions.PythonPath or the system's.
	Celery string
}

func (w IOWorker) String() string {
	if w.celeriac() {
		return fmt.Sprintf("%s -c %d", w.Kind, w.Concurrency)
	}
	if w.Celery != "" {
		return fmt.Sprintf("Python %s -c %d (Celery %s)", w.Kind, w.Concurrency, w.Celery)
	}
	return fmt.Sprintf("Python %s -c %d", w.Kind, w.Concurrency)
}

// celeriac reports whether the worker is celeriac's; "celeriac-staged" is
// celeriac on the staged Redis pop (transport/redis.Config.StagedPop).
func (w IOWorker) celeriac() bool { return w.Kind == "celeriac" || w.Kind == "celeriac-staged" }

// ParseIOWorkers reads "celeriac:100,prefork:16:1000,threads@5.6:100,...":
// kind (with the Celery version of a Python worker), concurrency and,
// optionally, the tasks of its drain (a slow pool's drain need not be as
// long as a fast one's to be measured).
func ParseIOWorkers(s string) ([]IOWorker, error) {
	var out []IOWorker
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		f := strings.Split(part, ":")
		kind, version, versioned := strings.Cut(f[0], "@")
		if versioned && (version == "" || strings.HasPrefix(kind, "celeriac")) {
			return nil, fmt.Errorf("worker %q: a Celery version goes with a Python pool (threads@5.6:100)", part)
		}
		var n, tasks int
		var err error
		if len(f) >= 2 {
			n, err = strconv.Atoi(f[1])
		}
		if len(f) == 3 && err == nil {
			if tasks, err = strconv.Atoi(f[2]); err == nil && tasks < 1 {
				err = errors.New("no tasks")
			}
		}
		if len(f) < 2 || len(f) > 3 || err != nil || n < 1 {
			return nil, fmt.Errorf("worker %q: want KIND[@CELERY]:CONCURRENCY[:TASKS] (celeriac:1000, gevent:500:2000, threads@5.6:100)", part)
		}
		switch kind {
		case "celeriac", "celeriac-staged", "prefork", "threads", "gevent", "solo":
		default:
			return nil, fmt.Errorf("worker %q: kind is celeriac, celeriac-staged, prefork, threads, gevent or solo", part)
		}
		out = append(out, IOWorker{Kind: kind, Concurrency: n, N: tasks, Celery: version})
	}
	if len(out) == 0 {
		return nil, errors.New("no worker")
	}
	return out, nil
}

// IOOptions configure the I/O benchmark.
type IOOptions struct {
	// Broker is "redis" (default: the database RedisDB of RedisURL) or
	// "amqp" (the queue bench_io of AMQPURL, on this machine's RabbitMQ,
	// whose CPU is its beam.smp process's).
	Broker   string
	AMQPURL  string // default amqp://guest:guest@127.0.0.1:5672//
	RedisURL string // server, without a database (default redis://127.0.0.1:6379)
	// RedisDB is the broker's database on Redis, and the results' with
	// Results: must be empty; emptied after. Unused (-1) on RabbitMQ
	// without results.
	RedisDB int
	Python  string // default /usr/bin/python3
	// PythonPath is put first on PYTHONPATH for the Python workers (Celery
	// 5.6.3 unpacked by .ci/setup, say); empty runs the system's Celery.
	PythonPath string
	// CeleryPaths maps a Celery version of IOWorker.Celery to the folder
	// put first on PYTHONPATH for it.
	CeleryPaths map[string]string
	Exe         string // the celeriac binary (default this executable)
	Workers     []IOWorker
	// Fleet are the workers run again as FleetProcesses processes each
	// (drain only), to check that the broker's CPU per task, from which a
	// fleet's size per broker core is projected, holds as processes are
	// added.
	Fleet          []IOWorker
	FleetProcesses []int         // default 1, 2, 4
	N              int           // tasks per drain (default 20 000)
	Delay          time.Duration // the server's answer delay (default 50 ms)
	TailEvery      int           // every TailEvery-th request waits Tail instead (default 100; 0: none)
	Tail           time.Duration // default 1 s
	Loads          []float64     // open-loop arrival rates as fractions of the drain's throughput (default 0.25, 0.5, 0.9)
	LoadFor        time.Duration // arrivals per load level (default 20 s)
	Timeout        time.Duration // a drain or load not done this long after its last publish is abandoned (default 5 min)
	Seed           uint64        // of the arrival times (default 31)
	// Results turns results on: every worker stores them in Redis (the
	// database RedisDB, the broker's on Redis), and each open-loop task is awaited with the Go
	// client's Get, which measures publish to result as a caller sees it.
	Results bool
	// PythonCallers is, with Results, the most open-loop arrivals a second
	// that a Python client publishes and awaits with Celery's
	// AsyncResult.get() (a thread per call in flight), beside the Go
	// client's share of the same Poisson rate (default 50; negative:
	// none). A Python client cannot publish and await thousands of tasks a
	// second on the benchmark's cores, so at higher rates it samples them:
	// Poisson arrivals see the same latencies as the rest.
	PythonCallers float64
	// PostgresURL, when set, makes every task also INSERT a row into
	// PostgreSQL (the table bench_io_rows of the database celeriac_bench
	// on that server), as a task that records what it fetched would.
	PostgresURL string
	Log         io.Writer
}

func (o *IOOptions) defaults() {
	if o.Broker == "" {
		o.Broker = "redis"
	}
	if o.AMQPURL == "" {
		o.AMQPURL = "amqp://guest:guest@127.0.0.1:5672//"
	}
	if o.RedisURL == "" {
		o.RedisURL = "redis://127.0.0.1:6379"
	}
	if o.Python == "" {
		o.Python = "/usr/bin/python3"
	}
	if o.Exe == "" {
		o.Exe, _ = os.Executable()
	}
	if o.N <= 0 {
		o.N = 20000
	}
	if o.Delay <= 0 {
		o.Delay = 50 * time.Millisecond
	}
	if o.TailEvery == 0 {
		o.TailEvery = 100
	}
	if o.Tail <= 0 {
		o.Tail = time.Second
	}
	if len(o.Loads) == 0 {
		o.Loads = []float64{0.25, 0.5, 0.9}
	}
	if o.LoadFor <= 0 {
		o.LoadFor = 20 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Seed == 0 {
		o.Seed = 31
	}
	if len(o.FleetProcesses) == 0 {
		o.FleetProcesses = []int{1, 2, 4}
	}
	if o.PythonCallers == 0 {
		o.PythonCallers = 50
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
}

// IOResult is one worker's figures.
type IOResult struct {
	Worker     IOWorker
	N          int // tasks drained
	Err        string
	Throughput float64 // tasks/s over the drain
	// Queue wait and end to end of the drain's tasks: publish to the
	// server's request, publish to its answer.
	Wait, E2E  Percentiles
	CPUPerTask time.Duration // the worker's process tree
	// RedisCPU is the broker's CPU per task: Redis' (INFO cpu), or with
	// IOOptions.Broker "amqp" RabbitMQ's (its beam.smp process).
	RedisCPU time.Duration
	// PostgresCPU is the local PostgreSQL's CPU per task, with
	// IOOptions.PostgresURL.
	PostgresCPU time.Duration
	PeakRSS     int64
	Loads       []IOLoad
}

// IOLoad is one open-loop level.
type IOLoad struct {
	Fraction float64
	Rate     float64 // arrivals/s
	N        int
	E2E      Percentiles
	// Result is publish to the Go client's AsyncResult.Get's return, with
	// IOOptions.Results, of the GoN arrivals the Go client published.
	Result Percentiles
	GoN    int
	// PyResult is publish to Python's AsyncResult.get()'s return, of the
	// PyN arrivals the Python client published (IOOptions.PythonCallers).
	PyResult Percentiles
	PyN      int
	PyLate   time.Duration // how late the Python client's latest call started
	Err      string
}

// IOFleet is a fleet run: Processes processes of one worker draining N
// tasks together.
type IOFleet struct {
	Worker     IOWorker
	Processes  int
	N          int
	Throughput float64
	CPUPerTask time.Duration // all the processes'
	RedisCPU   time.Duration // the broker's, as IOResult.RedisCPU
	// Rate is the open-loop arrival rate every process count of the
	// worker serves (half the one-process drain's throughput), and Load the
	// figures there: unlike the drain, which saturates the machine's cores
	// once processes are added, it shows the broker's cost per task of a
	// fleet sharing a fixed load.
	Rate float64
	Load IOFleetLoad
	Err  string
}

// IOFleetLoad is a fleet's open-loop leg.
type IOFleetLoad struct {
	N          int
	CPUPerTask time.Duration
	RedisCPU   time.Duration
	E2E        Percentiles
}

// IOReport is a run of the I/O benchmark, for WriteIOReport and
// WriteIOPlot.
type IOReport struct {
	Options    IOOptions
	Command    string
	Machine    string
	Start, End time.Time
	Results    []IOResult
	Fleet      []IOFleet
}

// Percentiles of a latency sample.
type Percentiles struct{ P50, P99, P999 time.Duration }

func percentilesOf(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) time.Duration {
		i := int(math.Ceil(q*float64(len(s)))) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return Percentiles{P50: at(0.50), P99: at(0.99), P999: at(0.999)}
}

// ioServer is the slow API the tasks call, and the benchmark's clock.
type ioServer struct {
	o   *IOOptions
	ln  net.Listener
	srv *http.Server
	mu  sync.Mutex
	run string // the current run's tag: requests of another are counted apart
	got map[int]ioHit
	// pids are the worker processes seen in the current run (the task
	// adds its process id to the URL): a fleet is warm when each has
	// run a task.
	pids map[string]bool
}

type ioHit struct{ wait, e2e time.Duration }

func newIOServer(o *IOOptions) (*ioServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &ioServer{o: o, ln: ln, got: map[int]ioHit{}, pids: map[string]bool{}}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *ioServer) url(run string, i int, published time.Time) string {
	return fmt.Sprintf("%s&i=%d&p=%d", s.prefix(run), i, published.UnixNano())
}

// prefix is the URL of run's tasks up to their number.
func (s *ioServer) prefix(run string) string {
	return fmt.Sprintf("http://%s/io?r=%s", s.ln.Addr(), run)
}

func (s *ioServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	q := r.URL.Query()
	i, _ := strconv.Atoi(q.Get("i"))
	p, _ := strconv.ParseInt(q.Get("p"), 10, 64)
	delay := s.o.Delay
	if s.o.TailEvery > 0 && i%s.o.TailEvery == s.o.TailEvery-1 {
		delay = s.o.Tail
	}
	select {
	case <-time.After(delay):
	case <-r.Context().Done():
		return
	}
	_, _ = io.WriteString(w, "ok")
	done := time.Now()
	s.mu.Lock()
	if q.Get("r") == s.run {
		if w := q.Get("w"); w != "" && len(s.pids) < 10000 {
			s.pids[w] = true
		}
		if _, dup := s.got[i]; !dup {
			pub := time.Unix(0, p)
			s.got[i] = ioHit{wait: arrived.Sub(pub), e2e: done.Sub(pub)}
		}
	}
	s.mu.Unlock()
}

// reset starts counting a new run's requests.
func (s *ioServer) reset(run string) {
	s.mu.Lock()
	s.run, s.got, s.pids = run, map[int]ioHit{}, map[string]bool{}
	s.mu.Unlock()
}

// processes is how many worker processes ran a task of the current run.
func (s *ioServer) processes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pids)
}

func (s *ioServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

func (s *ioServer) hits() []ioHit { return s.hitsBelow(math.MaxInt) }

// hitsBelow are the current run's hits of the tasks numbered below n.
func (s *ioServer) hitsBelow(n int) []ioHit {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ioHit, 0, min(n, len(s.got)))
	for i, h := range s.got {
		if i < n {
			out = append(out, h)
		}
	}
	return out
}

func (s *ioServer) close() { _ = s.srv.Close() }

// ioQueue is the benchmark's queue.
const ioQueue = "bench_io"

// RunIO runs the I/O benchmark: each worker's figures, then the fleet's.
func RunIO(ctx context.Context, o IOOptions) (IOReport, error) {
	o.defaults()
	rep := IOReport{Options: o, Start: time.Now()}
	res, fleet, err := runIO(ctx, &o, &rep)
	rep.Results, rep.Fleet = res, fleet
	rep.End = time.Now()
	return rep, err
}

func runIO(ctx context.Context, o *IOOptions, rep *IOReport) ([]IOResult, []IOFleet, error) {
	var rdb *goredis.Client
	var resultURL string
	if o.Broker == "redis" || o.Results {
		if o.RedisDB < 0 {
			return nil, nil, errors.New("the benchmark needs a Redis database of its own (it empties it)")
		}
		resultURL = withDB(o.RedisURL, o.RedisDB)
		opt, err := goredis.ParseURL(resultURL)
		if err != nil {
			return nil, nil, err
		}
		rdb = goredis.NewClient(opt)
		defer rdb.Close()
		if n, err := rdb.DBSize(ctx).Result(); err != nil {
			return nil, nil, fmt.Errorf("redis: %w", err)
		} else if n > 0 {
			return nil, nil, fmt.Errorf("redis database %d holds %d keys: the benchmark empties its database, so it takes an empty one (--redis-db)", o.RedisDB, n)
		}
		defer rdb.FlushDB(context.WithoutCancel(ctx))
	}
	var broker ioBroker
	var brokerURL string
	var tr transport.Transport
	switch o.Broker {
	case "redis":
		broker, brokerURL = redisIOBroker{rdb}, resultURL
		rt, err := redistransport.Dial(ctx, redistransport.Config{URL: brokerURL})
		if err != nil {
			return nil, nil, err
		}
		tr = rt
	case "amqp":
		ab, err := newAMQPIOBroker(o.AMQPURL)
		if err != nil {
			return nil, nil, err
		}
		defer ab.Close(context.WithoutCancel(ctx))
		broker, brokerURL = ab, o.AMQPURL
		at, err := amqptransport.Dial(ctx, amqptransport.Config{URL: brokerURL})
		if err != nil {
			return nil, nil, err
		}
		tr = at
	default:
		return nil, nil, fmt.Errorf("unknown broker %q (redis, amqp)", o.Broker)
	}
	defer tr.Close()
	srv, err := newIOServer(o)
	if err != nil {
		return nil, nil, err
	}
	defer srv.close()
	ccfg := client.Config{DefaultQueue: ioQueue}
	if o.Results {
		be, err := redisbackend.New(redisbackend.Config{URL: resultURL})
		if err != nil {
			return nil, nil, err
		}
		defer be.Close()
		ccfg.Backend = be
	}
	pub := client.New(tr, ccfg)
	pyDir, err := os.MkdirTemp("", "celeriac-bench-io-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(pyDir)
	if err := os.WriteFile(filepath.Join(pyDir, "benchio.py"), []byte(benchIOApp), 0o644); err != nil {
		return nil, nil, err
	}
	caller, err := pythonFiles.ReadFile("python/iocaller.py")
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(pyDir, "iocaller.py"), caller, 0o644); err != nil {
		return nil, nil, err
	}
	rep.Machine = ioMachine(ctx, o, broker)
	env := &ioEnv{o: o, srv: srv, pub: pub, broker: broker, brokerURL: brokerURL, resultURL: resultURL, pyDir: pyDir}
	if o.PostgresURL != "" {
		if env.rows, err = newIORows(ctx, o.PostgresURL); err != nil {
			return nil, nil, err
		}
		defer env.rows.close(context.WithoutCancel(ctx))
	}
	var out []IOResult
	for _, w := range o.Workers {
		fmt.Fprintf(o.Log, "bench io: %s\n", w)
		r := env.runWorker(ctx, w)
		if r.Err != "" {
			fmt.Fprintf(o.Log, "bench io: %s: %s\n", w, r.Err)
		}
		out = append(out, r)
		env.empty(ctx)
		if ctx.Err() != nil {
			return out, nil, ctx.Err()
		}
	}
	var fleet []IOFleet
	for _, w := range o.Fleet {
		rate := 0.0
		for _, p := range o.FleetProcesses {
			fmt.Fprintf(o.Log, "bench io: fleet of %d × %s\n", p, w)
			f := env.runFleet(ctx, w, p, rate)
			if rate == 0 {
				rate = f.Rate
			}
			if f.Err != "" {
				fmt.Fprintf(o.Log, "bench io: fleet of %d × %s: %s\n", p, w, f.Err)
			}
			fleet = append(fleet, f)
			env.empty(ctx)
			if ctx.Err() != nil {
				return out, fleet, ctx.Err()
			}
		}
	}
	return out, fleet, nil
}

// ioMachine describes the machine, the broker and each Celery measured.
func ioMachine(ctx context.Context, o *IOOptions, b ioBroker) string {
	parts := machineBase()
	if v := b.Version(ctx); v != "" {
		parts = append(parts, v)
	}
	seen := map[string]bool{}
	for _, w := range slices.Concat(o.Workers, o.Fleet) {
		if w.celeriac() || seen[w.Celery] {
			continue
		}
		seen[w.Celery] = true
		if celery, kombu, err := o.celeryVersion(ctx, w); err == nil {
			parts = append(parts, fmt.Sprintf("Python Celery %s (kombu %s)", celery, kombu))
		}
	}
	return strings.Join(parts, "; ")
}

// celeryVersion is the Celery and kombu that w's Python imports.
func (o *IOOptions) celeryVersion(ctx context.Context, w IOWorker) (celery, kombu string, err error) {
	cmd := exec.CommandContext(ctx, o.Python, "-c", "import celery, kombu; print(celery.__version__, kombu.__version__)")
	cmd.Env = childEnv()
	if pp := o.pythonPath(w); pp != "" {
		cmd.Env = append(cmd.Env, "PYTHONPATH="+pp)
	}
	b, err := cmd.Output()
	if err != nil {
		return "", "", err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return "", "", fmt.Errorf("unexpected versions %q", b)
	}
	return f[0], f[1], nil
}

// pythonPath is what goes first on PYTHONPATH for w's Celery.
func (o *IOOptions) pythonPath(w IOWorker) string {
	if w.Celery != "" {
		return o.CeleryPaths[w.Celery]
	}
	return o.PythonPath
}

// ioEnv is what every run of the benchmark shares.
type ioEnv struct {
	o         *IOOptions
	srv       *ioServer
	pub       *client.Client
	broker    ioBroker
	brokerURL string
	resultURL string // Redis, with IOOptions.Results
	pyDir     string
	rows      *ioRows // with IOOptions.PostgresURL
}

// empty removes what a worker's runs left in the broker and the results.
func (e *ioEnv) empty(ctx context.Context) {
	_ = e.broker.Empty(ctx)
	if e.resultURL != "" && e.broker.Name() != "Redis" {
		if opt, err := goredis.ParseURL(e.resultURL); err == nil {
			rdb := goredis.NewClient(opt)
			_ = rdb.FlushDB(ctx).Err()
			_ = rdb.Close()
		}
	}
}

// maxPGConns bounds each worker process's PostgreSQL connections.
const maxPGConns = 40

// ioProcs are the processes of one worker: one, or a fleet's.
type ioProcs struct {
	cmds   []*exec.Cmd
	outs   []*tailBuffer
	rss    []*rssWatch
	dones  []chan struct{} // each closed when its process has exited
	exited chan struct{}   // closed when the first process exits
}

// start starts n processes of w.
func (e *ioEnv) start(w IOWorker, n int, tag string) (*ioProcs, error) {
	o := e.o
	if w.Celery != "" {
		if o.CeleryPaths[w.Celery] == "" {
			return nil, fmt.Errorf("no folder for Celery %s (--celery-path %s=DIR)", w.Celery, w.Celery)
		}
		// A folder without Celery in it would measure the system's under
		// the other version's name.
		v, _, err := o.celeryVersion(context.Background(), w)
		if err != nil || !strings.HasPrefix(v, w.Celery+".") {
			return nil, fmt.Errorf("the folder for Celery %s, %s, imports Celery %q (%v)", w.Celery, o.CeleryPaths[w.Celery], v, err)
		}
	}
	p := &ioProcs{exited: make(chan struct{})}
	var once sync.Once
	for i := range n {
		var cmd *exec.Cmd
		if w.celeriac() {
			cmd = exec.Command(o.Exe, "bench", "ioworker", "--broker-url", e.brokerURL, "--queue", ioQueue, "-c", strconv.Itoa(w.Concurrency))
			if o.Results {
				cmd.Args = append(cmd.Args, "--result-backend", e.resultURL)
			}
			if e.rows != nil {
				cmd.Args = append(cmd.Args, "--postgres", e.rows.url)
			}
			cmd.Env = childEnv()
			if w.Kind == "celeriac-staged" {
				cmd.Env = childEnv("CELERIAC_REDIS_STAGED_POP=1")
			}
			if n > 1 {
				// Each process of a fleet gets its share of the cores, as
				// in a container with a CPU limit (which Go's GOMAXPROCS
				// follows): n runtimes sized for every core would spin
				// against each other on this one machine.
				cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(max(1, runtime.NumCPU()/n)))
			}
		} else {
			cmd = exec.Command(o.Python, "-m", "celery", "-A", "benchio", "worker", "-P", w.Kind, "-c", strconv.Itoa(w.Concurrency),
				"-Q", ioQueue, "-l", "warning", "--without-gossip", "--without-mingle", "--without-heartbeat",
				"-n", fmt.Sprintf("bench-io-%s-%s-%d@%%h", w.Kind, tag, i))
			e.python(cmd, w)
			if e.rows != nil {
				cmd.Env = append(cmd.Env, "BENCH_PG="+e.rows.url, "BENCH_PG_CONNS="+strconv.Itoa(min(w.Concurrency, maxPGConns)))
			}
		}
		out := &tailBuffer{max: 8 << 10}
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			p.stop()
			return nil, err
		}
		p.cmds, p.outs = append(p.cmds, cmd), append(p.outs, out)
		p.rss = append(p.rss, watchRSS(cmd.Process.Pid, 100*time.Millisecond))
		done := make(chan struct{})
		p.dones = append(p.dones, done)
		go func() {
			_ = cmd.Wait()
			close(done)
			once.Do(func() { close(p.exited) })
		}()
	}
	return p, nil
}

// cpu is the processes' CPU so far.
func (p *ioProcs) cpu() time.Duration {
	var d time.Duration
	for _, c := range p.cmds {
		d += sampleTree(c.Process.Pid).cpu
	}
	return d
}

// stop ends every process (SIGTERM, then after 15 s SIGKILL to its
// group) and returns the sum of their peak RSS.
func (p *ioProcs) stop() int64 {
	for _, c := range p.cmds {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	var peak int64
	deadline := time.After(15 * time.Second)
	for i, c := range p.cmds {
		select {
		case <-p.dones[i]:
		case <-deadline:
		}
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		<-p.dones[i]
		peak += p.rss[i].Stop()
	}
	return peak
}

func (p *ioProcs) log() string {
	var b strings.Builder
	for _, o := range p.outs {
		b.WriteString(o.String())
	}
	return b.String()
}

// warm sends tasks until every one of n processes has run one.
func (e *ioEnv) warm(ctx context.Context, p *ioProcs, n int) error {
	e.srv.reset("warm")
	deadline := time.Now().Add(3 * time.Minute)
	for i := 0; e.srv.processes() < n; i++ {
		select {
		case <-p.exited:
			return errors.New("the worker exited before it ran a task")
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d worker processes ran a task within 3 minutes", e.srv.processes(), n)
		}
		if i%20 == 0 {
			for range n {
				if _, err := e.pub.Send(ctx, "bench.io", []any{e.srv.url("warm", i, time.Now())}, nil); err != nil {
					return err
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitIdle(ctx, e.broker, 30*time.Second)
	return nil
}

// drainFigures are a drain's throughput and costs per task.
type drainFigures struct {
	throughput           float64
	cpu, redis, postgres time.Duration // postgres: with IOOptions.PostgresURL
}

// drain publishes n tasks at once and waits until they ran (and, with
// PostgreSQL, wrote their rows).
func (e *ioEnv) drain(ctx context.Context, p *ioProcs, n int) (drainFigures, error) {
	var d drainFigures
	e.srv.reset("drain")
	var pg0 time.Duration
	if e.rows != nil {
		if err := e.rows.empty(ctx); err != nil {
			return drainFigures{}, err
		}
		pg0, _ = postgresCPU()
	}
	cpu0, redis0 := p.cpu(), e.broker.CPU(ctx)
	start := time.Now()
	if _, err := e.publish(ctx, "drain", n, nil, false); err != nil {
		return drainFigures{}, fmt.Errorf("publish: %w", err)
	}
	if err := waitCount(e.srv, n, e.o.Timeout, p.exited); err != nil {
		return drainFigures{}, fmt.Errorf("drain: %w", err)
	}
	elapsed := time.Since(start)
	cpu1, redis1 := p.cpu(), e.broker.CPU(ctx)
	d.throughput, d.cpu = float64(n)/elapsed.Seconds(), (cpu1-cpu0)/time.Duration(n)
	if redis0 >= 0 && redis1 >= redis0 {
		d.redis = (redis1 - redis0) / time.Duration(n)
	}
	if e.rows != nil {
		// A task answers the server before it writes its row: wait for
		// the rows, so that none is missing unnoticed (and their writes
		// are in PostgreSQL's CPU).
		deadline := time.Now().Add(time.Minute)
		for {
			got, err := e.rows.count(ctx)
			if err != nil {
				return drainFigures{}, err
			}
			if got >= n {
				break
			}
			if time.Now().After(deadline) {
				return drainFigures{}, fmt.Errorf("%d of %d rows written to PostgreSQL", got, n)
			}
			time.Sleep(50 * time.Millisecond)
		}
		pg1, _ := postgresCPU()
		d.postgres = (pg1 - pg0) / time.Duration(n)
	}
	return d, nil
}

// runFleet drains w's tasks with procs processes of it, then serves
// open-loop arrivals at rate (0: half the drain's throughput).
func (e *ioEnv) runFleet(ctx context.Context, w IOWorker, procs int, rate float64) (f IOFleet) {
	f = IOFleet{Worker: w, Processes: procs, N: e.o.N}
	if w.N > 0 {
		f.N = w.N
	}
	p, err := e.start(w, procs, fmt.Sprintf("fleet%d", procs))
	if err != nil {
		f.Err = err.Error()
		return f
	}
	defer p.stop()
	if err := e.warm(ctx, p, procs); err != nil {
		f.Err = fmt.Sprintf("%v\n%s", err, p.log())
		return f
	}
	d, err := e.drain(ctx, p, f.N)
	f.Throughput, f.CPUPerTask, f.RedisCPU = d.throughput, d.cpu, d.redis
	if err != nil {
		f.Err = fmt.Sprintf("%v\n%s", err, p.log())
		return f
	}
	fmt.Fprintf(e.o.Log, "bench io: fleet of %d × %s: %.0f tasks/s, %s %.1f µs per task\n", procs, w, f.Throughput, e.broker.Name(), us(f.RedisCPU))
	waitIdle(ctx, e.broker, 30*time.Second)
	f.Rate = rate
	if f.Rate == 0 {
		f.Rate = f.Throughput / 2
	}
	if f.Load, err = e.openLoop(ctx, p, f.Rate); err != nil {
		f.Err = fmt.Sprintf("%v\n%s", err, p.log())
		return f
	}
	fmt.Fprintf(e.o.Log, "bench io: fleet of %d × %s at %.0f/s: %s %.1f µs per task, e2e p99 %v\n", procs, w, f.Rate, e.broker.Name(), us(f.Load.RedisCPU), f.Load.E2E.P99)
	return f
}

// openLoop serves Poisson arrivals at rate for IOOptions.LoadFor and
// measures the costs per task.
func (e *ioEnv) openLoop(ctx context.Context, p *ioProcs, rate float64) (IOFleetLoad, error) {
	var l IOFleetLoad
	l.N = max(1, int(rate*e.o.LoadFor.Seconds()))
	rng := rand.New(rand.NewPCG(e.o.Seed, uint64(l.N)))
	gaps := make([]time.Duration, l.N)
	for i := range gaps {
		gaps[i] = time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
	}
	e.srv.reset("fleetload")
	cpu0, redis0 := p.cpu(), e.broker.CPU(ctx)
	if _, err := e.publish(ctx, "fleetload", l.N, gaps, false); err != nil {
		return l, fmt.Errorf("publish: %w", err)
	}
	if err := waitCount(e.srv, l.N, e.o.Timeout, p.exited); err != nil {
		return l, err
	}
	cpu1, redis1 := p.cpu(), e.broker.CPU(ctx)
	l.CPUPerTask = (cpu1 - cpu0) / time.Duration(l.N)
	if redis0 >= 0 && redis1 >= redis0 {
		l.RedisCPU = (redis1 - redis0) / time.Duration(l.N)
	}
	var e2e []time.Duration
	for _, h := range e.srv.hits() {
		e2e = append(e2e, h.e2e)
	}
	l.E2E = percentilesOf(e2e)
	return l, nil
}

func (e *ioEnv) runWorker(ctx context.Context, w IOWorker) (res IOResult) {
	o, srv := e.o, e.srv
	res.Worker = w
	p, err := e.start(w, 1, "solo")
	if err != nil {
		res.Err = err.Error()
		return res
	}
	exited := p.exited
	defer func() { res.PeakRSS = p.stop() }()
	failed := func(err error) IOResult {
		res.Err = fmt.Sprintf("%v\n%s", err, p.log())
		return res
	}
	if err := e.warm(ctx, p, 1); err != nil {
		return failed(err)
	}

	// Closed loop: N tasks at once, drained.
	n := o.N
	if w.N > 0 {
		n = w.N
	}
	res.N = n
	d, err := e.drain(ctx, p, n)
	if err != nil {
		return failed(err)
	}
	res.Throughput, res.CPUPerTask, res.RedisCPU, res.PostgresCPU = d.throughput, d.cpu, d.redis, d.postgres
	var waits, e2es []time.Duration
	for _, h := range srv.hits() {
		waits, e2es = append(waits, h.wait), append(e2es, h.e2e)
	}
	res.Wait, res.E2E = percentilesOf(waits), percentilesOf(e2es)
	fmt.Fprintf(o.Log, "bench io: %s: %.0f tasks/s, e2e p50 %v p99 %v\n", w, res.Throughput, res.E2E.P50, res.E2E.P99)

	// Open loop: Poisson arrivals at fractions of that throughput.
	rng := rand.New(rand.NewPCG(o.Seed, uint64(w.Concurrency)))
	for li, f := range o.Loads {
		l := IOLoad{Fraction: f, Rate: f * res.Throughput}
		run := fmt.Sprintf("load%d", li)
		srv.reset(run)
		// With results, a Python client takes up to PythonCallers of the
		// arrivals a second and the Go client the rest: two independent
		// Poisson streams, which together are one at l.Rate.
		pyRate := 0.0
		if o.Results && o.PythonCallers > 0 {
			pyRate = min(l.Rate, o.PythonCallers)
		}
		l.GoN = int((l.Rate - pyRate) * o.LoadFor.Seconds())
		l.PyN = int(pyRate * o.LoadFor.Seconds())
		if l.GoN+l.PyN == 0 {
			l.GoN = 1
		}
		l.N = l.GoN + l.PyN
		gaps := make([]time.Duration, l.GoN)
		if goRate := l.Rate - pyRate; goRate > 0 { // else the one forced arrival goes at once
			for i := range gaps {
				gaps[i] = time.Duration(rng.ExpFloat64() / goRate * float64(time.Second))
			}
		}
		var py *pyCaller
		if l.PyN > 0 {
			var err error
			if py, err = e.startCaller(ctx, w, run, l.GoN, l.PyN, pyRate, o.Seed+uint64(li)); err != nil {
				l.Err = err.Error()
				res.Loads = append(res.Loads, l)
				continue
			}
			py.begin()
		}
		got, err := e.publish(ctx, run, l.GoN, gaps, o.Results)
		if err != nil {
			l.Err = err.Error()
		} else if err := waitCount(srv, l.N, o.Timeout, exited); err != nil {
			l.Err = err.Error()
		}
		if got != nil {
			rs, err := got.wait(o.Timeout)
			if err != nil && l.Err == "" {
				l.Err = err.Error()
			}
			l.Result = percentilesOf(rs)
		}
		if py != nil {
			took, late, err := py.wait(o.LoadFor + o.Timeout)
			if err != nil && l.Err == "" {
				l.Err = err.Error()
			}
			l.PyResult, l.PyLate = percentilesOf(took), late
		}
		// End to end of the Go client's tasks only, when there are any: the
		// Python client takes its clock in a thread that may then wait for
		// the GIL before it publishes, which is its caller's latency
		// (PyResult), not the worker's.
		below := l.N
		if l.GoN > 0 {
			below = l.GoN
		}
		var e2e []time.Duration
		for _, h := range srv.hitsBelow(below) {
			e2e = append(e2e, h.e2e)
		}
		l.E2E = percentilesOf(e2e)
		res.Loads = append(res.Loads, l)
		fmt.Fprintf(o.Log, "bench io: %s: %.0f%% load (%.0f/s): e2e p50 %v p99 %v", w, 100*f, l.Rate, l.E2E.P50, l.E2E.P99)
		if o.Results && l.GoN > 0 {
			fmt.Fprintf(o.Log, ", result p50 %v p99 %v", l.Result.P50, l.Result.P99)
		}
		if l.PyN > 0 {
			fmt.Fprintf(o.Log, ", Python get (%d) p50 %v p99 %v, latest start %v late", l.PyN, l.PyResult.P50, l.PyResult.P99, l.PyLate)
		}
		fmt.Fprintln(o.Log)
		waitIdle(ctx, e.broker, 30*time.Second)
	}
	return res
}

// publish sends n tasks of run with publishTasks: one publish at a time
// on Redis, up to publishSenders on RabbitMQ, where every publish waits for
// its confirm, a round trip that one sender cannot overlap, so one sender
// would cap the drain (at about 700 tasks a second on the 2-core test
// machine) and fall behind the open loop's schedule.
func (e *ioEnv) publish(ctx context.Context, run string, n int, gaps []time.Duration, results bool) (*resultWaits, error) {
	senders := 1
	if e.o.Broker == "amqp" {
		senders = publishSenders
	}
	return publishTasks(ctx, e.pub, e.srv, run, n, gaps, results, senders)
}

// publishSenders bounds the publishes in flight on RabbitMQ.
const publishSenders = 64

// publishTasks sends n tasks of run, each after its gap (none: at once),
// on an open-loop schedule: a late publish does not delay the next one's
// due time. At most senders publishes are in flight; with 1, each starts
// once the one before is sent. With results, each task is awaited by a Get
// of its own from its publish on, as a caller of .delay().get() would.
func publishTasks(ctx context.Context, pub *client.Client, srv *ioServer, run string, n int, gaps []time.Duration, results bool, senders int) (*resultWaits, error) {
	var rw *resultWaits
	if results {
		rw = &resultWaits{ctx: ctx}
	}
	var mu sync.Mutex
	var first error
	slots := make(chan struct{}, senders)
	var wg sync.WaitGroup
	due := time.Now()
	for i := range n {
		if gaps != nil {
			due = due.Add(gaps[i])
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
		}
		slots <- struct{}{}
		mu.Lock()
		failed := first != nil
		mu.Unlock()
		if failed {
			<-slots
			break
		}
		at := time.Now()
		wg.Go(func() {
			defer func() { <-slots }()
			r, err := pub.Send(ctx, "bench.io", []any{srv.url(run, i, at)}, nil)
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				return
			}
			if rw != nil {
				rw.add(r, at)
			}
		})
	}
	wg.Wait()
	return rw, first
}

// callerThreads are the Python client's threads: calls in flight at once.
const callerThreads = 32

// pyCaller is the Python client of one open-loop level (iocaller.py).
type pyCaller struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // stdout, line by line; closed at its end
	out   *tailBuffer // stderr
}

// python makes cmd a Python process of the benchmark's app, on w's
// Celery: run in the app's folder, with its broker, and its result backend
// when results are on.
func (e *ioEnv) python(cmd *exec.Cmd, w IOWorker) {
	cmd.Dir = e.pyDir
	path := e.pyDir
	if pp := e.o.pythonPath(w); pp != "" {
		path = pp + string(os.PathListSeparator) + e.pyDir
	}
	cmd.Env = append(childEnv(), "PYTHONPATH="+path, "BENCH_BROKER="+e.brokerURL, "PYTHONDONTWRITEBYTECODE=1")
	if e.o.Results {
		cmd.Env = append(cmd.Env, "BENCH_BACKEND="+e.resultURL)
	}
}

// startCaller starts the Python client for n arrivals a second at rate,
// numbered from first on run, with w's Celery, and waits until its threads
// are connected.
func (e *ioEnv) startCaller(ctx context.Context, w IOWorker, run string, first, n int, rate float64, seed uint64) (*pyCaller, error) {
	cmd := exec.CommandContext(ctx, e.o.Python, "iocaller.py", e.srv.prefix(run), strconv.Itoa(first), strconv.Itoa(n),
		strconv.FormatFloat(rate, 'f', -1, 64), strconv.FormatUint(seed, 10), strconv.Itoa(callerThreads))
	e.python(cmd, w)
	c := &pyCaller{cmd: cmd, lines: make(chan string, 4), out: &tailBuffer{max: 8 << 10}}
	cmd.Stderr = c.out
	var err error
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 64<<20) // the JSON of every latency
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	select {
	case l, ok := <-c.lines:
		if ok && l == "ready" {
			return c, nil
		}
		c.kill()
		return nil, fmt.Errorf("python caller: %q\n%s", l, c.out.String())
	case <-time.After(time.Minute):
		c.kill()
		return nil, fmt.Errorf("python caller not ready within a minute\n%s", c.out.String())
	}
}

// begin starts the client's schedule.
func (c *pyCaller) begin() { _, _ = io.WriteString(c.stdin, "go\n") }

func (c *pyCaller) kill() {
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

// wait returns the client's latencies (publish to get()'s return) and how
// late its latest call started; an error when some calls failed, or when
// it has not reported within limit.
func (c *pyCaller) wait(limit time.Duration) ([]time.Duration, time.Duration, error) {
	var rep struct {
		Took   []float64 `json:"took"`
		Failed int       `json:"failed"`
		Errors []string  `json:"errors"`
		Late   float64   `json:"late_ms"`
	}
	select {
	case l, ok := <-c.lines:
		if !ok {
			_ = c.cmd.Wait()
			return nil, 0, fmt.Errorf("python caller ended without a report\n%s", c.out.String())
		}
		_ = c.cmd.Wait()
		if err := json.Unmarshal([]byte(l), &rep); err != nil {
			return nil, 0, fmt.Errorf("python caller: %w", err)
		}
	case <-time.After(limit):
		c.kill()
		return nil, 0, fmt.Errorf("python caller did not report within %v", limit)
	}
	took := make([]time.Duration, len(rep.Took))
	for i, ms := range rep.Took {
		took[i] = time.Duration(ms * float64(time.Millisecond))
	}
	late := time.Duration(rep.Late * float64(time.Millisecond))
	if rep.Failed > 0 {
		return took, late, fmt.Errorf("%d Python get() calls failed, e.g. %v", rep.Failed, rep.Errors)
	}
	return took, late, nil
}

// resultWaits are the Gets of one open-loop level.
type resultWaits struct {
	ctx  context.Context
	wg   sync.WaitGroup
	mu   sync.Mutex
	n    int // Gets started
	took []time.Duration
	errs int
	err  error
}

func (w *resultWaits) add(r *client.AsyncResult, published time.Time) {
	w.mu.Lock()
	w.n++
	w.mu.Unlock()
	w.wg.Go(func() {
		ctx, cancel := context.WithTimeout(w.ctx, 10*time.Minute)
		defer cancel()
		_, err := r.Get(ctx)
		took := time.Since(published)
		w.mu.Lock()
		defer w.mu.Unlock()
		if err != nil {
			w.errs++
			w.err = err
			return
		}
		w.took = append(w.took, took)
	})
}

// wait returns every Get's latency once all have returned; an error when
// some failed, or when they did not all return within limit (the ones
// that did are still returned).
func (w *resultWaits) wait(limit time.Duration) ([]time.Duration, error) {
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		w.mu.Lock()
		defer w.mu.Unlock()
		return slices.Clone(w.took), fmt.Errorf("%d results not read within %v", w.n-len(w.took)-w.errs, limit)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.errs > 0 {
		return w.took, fmt.Errorf("%d Gets failed, the last: %v", w.errs, w.err)
	}
	return w.took, nil
}

// waitCount waits until the server has answered n distinct tasks of the
// current run; no progress for timeout is an error.
func waitCount(srv *ioServer, n int, timeout time.Duration, exited <-chan struct{}) error {
	last, lastAt := -1, time.Now()
	for {
		c := srv.count()
		if c >= n {
			return nil
		}
		if c != last {
			last, lastAt = c, time.Now()
		}
		if time.Since(lastAt) > timeout {
			return fmt.Errorf("%d of %d tasks after %v without progress", c, n, timeout)
		}
		select {
		case <-exited:
			return fmt.Errorf("the worker exited after %d of %d tasks", c, n)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitIdle waits until the queue is empty and no message is unacked.
func waitIdle(ctx context.Context, b ioBroker, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if b.Idle(ctx) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// redisCPU reads Redis' used CPU (user + system), or -1.
func redisCPU(ctx context.Context, rdb *goredis.Client) time.Duration {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return -1
	}
	var total float64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// RunIOWorker is `celeriac bench ioworker`: a celeriac worker whose one
// task, bench.io, GETs its URL, as an I/O-bound Celery task would, until
// ctx ends.
func RunIOWorker(ctx context.Context, brokerURL, queue string, concurrency int, resultBackend, postgres string) error {
	var tr transport.Transport
	var err error
	if strings.HasPrefix(brokerURL, "amqp://") || strings.HasPrefix(brokerURL, "amqps://") {
		tr, err = amqptransport.Dial(ctx, amqptransport.Config{URL: brokerURL})
	} else {
		staged, _ := strconv.ParseBool(os.Getenv("CELERIAC_REDIS_STAGED_POP"))
		tr, err = redistransport.Dial(ctx, redistransport.Config{URL: brokerURL, StagedPop: staged})
	}
	if err != nil {
		return err
	}
	defer tr.Close()
	// One kept connection per slot: the server is the only host.
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		MaxIdleConns: concurrency, MaxIdleConnsPerHost: concurrency, IdleConnTimeout: time.Minute}}
	// The server counts the processes of a fleet by the pid in the URL.
	pidParam := "&w=" + strconv.Itoa(os.Getpid())
	var rows *ioRowWriter
	if postgres != "" {
		if rows, err = newIORowWriter(ctx, postgres, min(concurrency, maxPGConns)); err != nil {
			return err
		}
		defer rows.close()
	}
	mux := worker.NewMux()
	mux.HandleFunc("bench.io", func(ctx context.Context, t *worker.Task) (any, error) {
		var u string
		if err := t.Bind(&u); err != nil {
			return nil, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+pidParam, nil)
		if err != nil {
			return nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if _, err = io.Copy(io.Discard, resp.Body); err != nil || rows == nil {
			return nil, err
		}
		return nil, rows.write(ctx, u, t.Hostname)
	}, worker.IgnoreResult(resultBackend == ""))
	cfg := worker.Config{Queues: []string{queue}, Concurrency: concurrency,
		Hostname: "bench-io-celeriac@%h", WithoutHeartbeat: true, WithoutControl: true}
	if resultBackend != "" {
		be, err := redisbackend.New(redisbackend.Config{URL: resultBackend})
		if err != nil {
			return err
		}
		defer be.Close()
		cfg.Backend = be
	}
	w, err := worker.New(tr, mux, cfg)
	if err != nil {
		return err
	}
	return w.Run(ctx)
}

// benchIOApp is the Python side: the same task for every pool. Under
// -P gevent Celery patches the standard library first, so urllib's socket
// waits yield to other greenlets.
const benchIOApp = `"""celeriac bench io: the I/O-bound task, as a Celery app."""
import os
import urllib.request

from celery import Celery

app = Celery("benchio", broker=os.environ["BENCH_BROKER"], backend=os.environ.get("BENCH_BACKEND"))
app.conf.update(
    task_ignore_result="BENCH_BACKEND" not in os.environ,
    worker_prefetch_multiplier=4,
    worker_enable_remote_control=False,
    worker_send_task_events=False,
    broker_connection_retry_on_startup=True,
    task_default_queue="bench_io",
)


PG = os.environ.get("BENCH_PG")
if PG:
    import queue
    import threading

    import psycopg2

    # At most BENCH_PG_CONNS connections per worker process, shared by its
    # threads or greenlets (made lazily, so after prefork's fork).
    _idle = queue.LifoQueue()
    _made = [0]
    _lock = threading.Lock()

    def _conn():
        try:
            return _idle.get_nowait()
        except queue.Empty:
            pass
        with _lock:
            make = _made[0] < int(os.environ["BENCH_PG_CONNS"])
            if make:
                _made[0] += 1
        if make:
            c = psycopg2.connect(PG)
            c.autocommit = True
            return c
        return _idle.get()


@app.task(name="bench.io", bind=True)
def io(self, url):
    with urllib.request.urlopen(url + "&w=%d" % os.getpid(), timeout=60) as r:
        r.read()
    if PG:
        c = _conn()
        try:
            with c.cursor() as cur:
                cur.execute("INSERT INTO bench_io_rows (url, worker) VALUES (%s, %s)", (url, self.request.hostname))
        finally:
            _idle.put(c)
`

// WriteIOReport writes the I/O benchmark's report in Markdown: the
// machine and command, the drains, the open-loop levels and the fleet.
func WriteIOReport(w io.Writer, rep IOReport) {
	o := rep.Options
	o.defaults()
	bn := "Redis"
	if o.Broker == "amqp" {
		bn = "RabbitMQ"
	}
	fmt.Fprintf(w, "## I/O-bound tasks\n\n")
	if !rep.Start.IsZero() {
		fmt.Fprintf(w, "Run %s UTC (%v). Machine: %s.\n\n", rep.Start.UTC().Format("2006-01-02 15:04"), rep.End.Sub(rep.Start).Round(time.Second), rep.Machine)
	}
	if rep.Command != "" {
		fmt.Fprintf(w, "Command: `%s`.\n\n", rep.Command)
	}
	fmt.Fprintf(w, "Each task GETs a loopback HTTP server that answers after %v (every %dth request after %v); %d tasks per drain unless the worker says otherwise, from %s.\n\n",
		o.Delay, o.TailEvery, o.Tail, o.N, bn)
	pg := o.PostgresURL != ""
	if pg {
		fmt.Fprint(w, "Every task also INSERTs a row into PostgreSQL.\n\n")
	}
	fmt.Fprintf(w, "| worker | tasks | tasks/s | queue wait p50 / p99 | end to end p50 / p99 / p99.9 | CPU per task | peak RSS | %s CPU per task |", bn)
	if pg {
		fmt.Fprint(w, " PostgreSQL CPU per task |")
	}
	fmt.Fprint(w, "\n|---|---|---|---|---|---|---|---|")
	if pg {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	for _, r := range rep.Results {
		if r.Err != "" && r.Throughput == 0 {
			fmt.Fprintf(w, "| %s |  | failed: %s |  |  |  |  |  |", r.Worker, firstLine(r.Err))
			if pg {
				fmt.Fprint(w, "  |")
			}
			fmt.Fprintln(w)
			continue
		}
		fmt.Fprintf(w, "| %s | %d | %.0f | %s / %s ms | %s / %s / %s ms | %d µs | %.0f MB | %.1f µs |", r.Worker, r.N, r.Throughput,
			ms(r.Wait.P50), ms(r.Wait.P99), ms(r.E2E.P50), ms(r.E2E.P99), ms(r.E2E.P999),
			r.CPUPerTask.Microseconds(), float64(r.PeakRSS)/1e6, us(r.RedisCPU))
		if pg {
			fmt.Fprintf(w, " %.0f µs |", us(r.PostgresCPU))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nOpen loop: Poisson arrivals for %v at each fraction of the worker's own throughput above; end to end p50 / p99 ms", o.LoadFor)
	if o.Results && o.PythonCallers > 0 {
		fmt.Fprint(w, " (of the tasks the Go client published, where it published any)")
	}
	if o.Results {
		fmt.Fprint(w, "; result: publish to the return of the Go client's AsyncResult.Get, p50 / p99 ms")
		if o.PythonCallers > 0 {
			fmt.Fprintf(w, "; Python get: publish (send_task) to the return of Python Celery's AsyncResult.get(), p50 / p99 ms, of up to %.0f of the arrivals a second, which a Python client publishes and awaits with a thread per call in flight (the Go client publishes the rest; the number of calls in brackets)", o.PythonCallers)
		}
	}
	fmt.Fprint(w, ".\n\n")
	fmt.Fprint(w, "| worker |")
	for _, f := range o.Loads {
		fmt.Fprintf(w, " %.0f %% |", 100*f)
	}
	fmt.Fprint(w, "\n|---|")
	for range o.Loads {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	for _, r := range rep.Results {
		fmt.Fprintf(w, "| %s |", r.Worker)
		for i := range o.Loads {
			if i >= len(r.Loads) {
				fmt.Fprint(w, " - |")
				continue
			}
			l := r.Loads[i]
			if l.Err != "" {
				fmt.Fprintf(w, " %.0f/s: %s |", l.Rate, firstLine(l.Err))
				continue
			}
			fmt.Fprintf(w, " %.0f/s: %s / %s", l.Rate, ms(l.E2E.P50), ms(l.E2E.P99))
			if o.Results && l.GoN > 0 {
				fmt.Fprintf(w, "; result %s / %s", ms(l.Result.P50), ms(l.Result.P99))
			}
			if l.PyN > 0 {
				fmt.Fprintf(w, "; Python get %s / %s (%d)", ms(l.PyResult.P50), ms(l.PyResult.P99), l.PyN)
			}
			fmt.Fprint(w, " |")
		}
		fmt.Fprintln(w)
	}
	if len(rep.Fleet) == 0 {
		return
	}
	fmt.Fprintf(w, "\nFleet: 1 or more processes of a worker together, first draining the same tasks, then serving Poisson arrivals at one fixed rate (half the one-process drain's throughput) for --load-for. One %[1]s core sustains 1 s / (%[1]s CPU per task) tasks a second, whatever the fleet, as long as the CPU per task holds as processes are added. The drain saturates this machine's cores once processes are added, which inflates every process' CPU, the broker's included; the fixed rate does not.\n\n", bn)
	fmt.Fprintf(w, "| worker | processes | drain tasks/s | drain CPU per task | drain %[1]s CPU per task | fixed rate | CPU per task | %[1]s CPU per task | e2e p50 / p99 | tasks/s per %[1]s core |\n", bn)
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, f := range rep.Fleet {
		if f.Err != "" && f.Throughput == 0 {
			fmt.Fprintf(w, "| %s | %d | failed: %s |  |  |  |  |  |  |  |\n", f.Worker, f.Processes, firstLine(f.Err))
			continue
		}
		perCore, load := "—", "failed"
		if f.Err == "" {
			load = fmt.Sprintf("%.0f/s | %d µs | %.1f µs | %s / %s ms", f.Rate, f.Load.CPUPerTask.Microseconds(), us(f.Load.RedisCPU), ms(f.Load.E2E.P50), ms(f.Load.E2E.P99))
			if f.Load.RedisCPU > 0 {
				perCore = fmt.Sprintf("%.0f", float64(time.Second)/float64(f.Load.RedisCPU))
			}
		} else {
			load = "failed: " + firstLine(f.Err) + " |  |  | "
		}
		fmt.Fprintf(w, "| %s | %d | %.0f | %d µs | %.1f µs | %s | %s |\n", f.Worker, f.Processes, f.Throughput, f.CPUPerTask.Microseconds(), us(f.RedisCPU), load, perCore)
	}
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) }

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// WriteIOPlot draws p99 end to end against offered load (arrivals a
// second), one line per worker, both axes logarithmic, as an SVG.
func WriteIOPlot(w io.Writer, rep IOReport) {
	const (
		width, height          = 760, 440
		left, right, top, bott = 70, 250, 30, 50
	)
	type pt struct{ x, y float64 }
	var lines [][]pt
	var names []string
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, r := range rep.Results {
		var ps []pt
		for _, l := range r.Loads {
			if l.Err != "" || l.Rate <= 0 || l.E2E.P99 <= 0 {
				continue
			}
			p := pt{l.Rate, float64(l.E2E.P99) / 1e6}
			ps = append(ps, p)
			xmin, xmax, ymin, ymax = min(xmin, p.x), max(xmax, p.x), min(ymin, p.y), max(ymax, p.y)
		}
		if len(ps) > 0 {
			lines, names = append(lines, ps), append(names, r.Worker.String())
		}
	}
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(w, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(w, `<text x="%d" y="18" font-size="14">p99 end to end against offered load (I/O-bound tasks, 50 ms each)</text>`+"\n", left)
	if len(lines) == 0 {
		fmt.Fprintln(w, `<text x="70" y="60">no open-loop level completed</text></svg>`)
		return
	}
	// Whole decades around the data.
	lx0, lx1 := math.Floor(math.Log10(xmin)), math.Ceil(math.Log10(xmax))
	ly0, ly1 := math.Floor(math.Log10(ymin)), math.Ceil(math.Log10(ymax))
	if lx1 == lx0 {
		lx1++
	}
	if ly1 == ly0 {
		ly1++
	}
	pw, ph := float64(width-left-right), float64(height-top-bott)
	sx := func(x float64) float64 { return float64(left) + (math.Log10(x)-lx0)/(lx1-lx0)*pw }
	sy := func(y float64) float64 { return float64(top) + ph - (math.Log10(y)-ly0)/(ly1-ly0)*ph }
	fmt.Fprintf(w, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#888"/>`+"\n", left, top, pw, ph)
	for d := lx0; d <= lx1; d++ {
		x := sx(math.Pow(10, d))
		fmt.Fprintf(w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.0f" stroke="#ddd"/><text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n",
			x, top, x, float64(top)+ph, x, float64(top)+ph+16, strconv.FormatFloat(math.Pow(10, d), 'f', -1, 64))
	}
	for d := ly0; d <= ly1; d++ {
		y := sy(math.Pow(10, d))
		fmt.Fprintf(w, `<line x1="%d" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s ms</text>`+"\n",
			left, y, float64(left)+pw, y, left-6, y+4, strconv.FormatFloat(math.Pow(10, d), 'f', -1, 64))
	}
	fmt.Fprintf(w, `<text x="%.0f" y="%d" text-anchor="middle">offered load, tasks/s (Poisson arrivals)</text>`+"\n", float64(left)+pw/2, height-12)
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}
	for i, ps := range lines {
		// Past the palette, the colours come round again dashed, so that
		// no two lines look alike.
		c, dash := colors[i%len(colors)], ""
		if (i/len(colors))%2 == 1 {
			dash = ` stroke-dasharray="6 3"`
		}
		var pts []string
		for _, p := range ps {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", sx(p.x), sy(p.y)))
		}
		fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", c, dash, strings.Join(pts, " "))
		for _, p := range ps {
			fmt.Fprintf(w, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", sx(p.x), sy(p.y), c)
		}
		ly := top + 10 + 18*i
		fmt.Fprintf(w, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/><text x="%d" y="%d">%s</text>`+"\n",
			width-right+12, ly, width-right+32, ly, c, dash, width-right+38, ly+4, html.EscapeString(names[i]))
	}
	fmt.Fprintln(w, "</svg>")
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
