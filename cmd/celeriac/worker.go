package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/examples/demotasks"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
	"github.com/celeriac/celeriac/worker/otelenv"
	"github.com/celeriac/celeriac/worker/prommetrics"
)

// ping checks the broker and result backend connections, for /readyz.
func ping(ctx context.Context, conn *connect.Conn) error {
	type pinger interface{ Ping(context.Context) error }
	if p, ok := conn.Transport.(pinger); ok {
		if err := p.Ping(ctx); err != nil {
			return fmt.Errorf("broker: %w", err)
		}
	}
	if p, ok := conn.Backend.(pinger); ok {
		if err := p.Ping(ctx); err != nil {
			return fmt.Errorf("result backend: %w", err)
		}
	}
	return nil
}

type workerFlags struct {
	queues             string
	concurrency        int
	hostname           string
	taskEvents         bool
	prefetchMultiplier int
	withoutHeartbeat   bool
	withoutGossip      bool
	withoutMingle      bool
	queueOrder         string
	queueWeights       string
	acksLate           bool
	timeLimit          float64
	softTimeLimit      float64
	shutdownTimeout    time.Duration
	maxMessageSize     int
	maxNestingDepth    int
	resultExtended     bool
	trackStarted       bool
	visibilityTimeout  float64
	globalKeyPrefix    string
	etaTaskLimit       int
	metricsAddr        string
	rateLimits         []string
	globalRateLimits   []string
	globalRateBurst    int
	rateLimitURL       string
	waitReplicas       int
	waitTimeout        time.Duration
	cpuProfile         string
	memProfile         string
}

func newWorkerCmd(g *globalFlags) *cobra.Command {
	f := &workerFlags{}
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker for the example tasks (examples/demotasks)",
		Long: `Run a celeriac worker with the example tasks of examples/demotasks
(tasks.add, tasks.mul, tasks.tsum, tasks.echo, tasks.wordcount, tasks.sha256,
tasks.primes, tasks.fail, tasks.sleep, tasks.noop, tasks.flaky), consuming the given queues.

Flags win over the config file's settings (worker_concurrency,
worker_prefetch_multiplier, task_queues, task_acks_late, ...), which win over
the defaults.

The first SIGTERM or SIGINT starts a warm shutdown: no new tasks, running
tasks finish (up to --shutdown-timeout), unstarted ones go back to the broker.
A second signal is a cold shutdown. The shutdown control command is a warm
shutdown too.

With --metrics-addr the worker serves Prometheus metrics on /metrics,
/healthz (the process is up) and /readyz (the broker and result backend
answer; 503 otherwise).`,
		Example: `  CELERY_BROKER_URL=redis://localhost:6379/0 CELERY_RESULT_BACKEND=redis://localhost:6379/1 \
    celeriac worker -Q celery -c 8 -E
  celeriac worker -b amqp://guest:guest@localhost// -n web1@%h --metrics-addr :9808 --log-format json`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return runWorker(cmd, g, f) },
	}
	f.register(cmd)
	return cmd
}

func (f *workerFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVarP(&f.queues, "queues", "Q", "", "comma-separated queues to consume (default: task_queues, else task_default_queue, else \"celery\")")
	fl.IntVarP(&f.concurrency, "concurrency", "c", 0, "tasks run at once (default: worker_concurrency, else the number of CPUs)")
	fl.StringVarP(&f.hostname, "hostname", "n", "", "node name, with %h %n %d expanded (default celery@%h)")
	fl.BoolVarP(&f.taskEvents, "task-events", "E", false, "send task events for Flower and celery events (worker_send_task_events)")
	fl.IntVar(&f.prefetchMultiplier, "prefetch-multiplier", 4, "worker_prefetch_multiplier; 0 means unlimited")
	fl.BoolVar(&f.withoutHeartbeat, "without-heartbeat", false, "do not send worker heartbeat events")
	fl.BoolVar(&f.withoutGossip, "without-gossip", false, "accepted for Celery compatibility (celeriac does not gossip)")
	fl.BoolVar(&f.withoutMingle, "without-mingle", false, "accepted for Celery compatibility (celeriac does not mingle)")
	fl.StringVar(&f.queueOrder, "queue-order", "", `how a free slot picks a queue: "" (arrival order, as Celery), strict (first -Q queue with work), weighted`)
	fl.StringVar(&f.queueWeights, "queue-weights", "", "weights of --queue-order weighted: NAME=N,... (high=3,low=1; default 1 each)")
	fl.BoolVar(&f.acksLate, "acks-late", false, "acknowledge after the task ran (task_acks_late)")
	fl.Float64Var(&f.timeLimit, "time-limit", 0, "hard time limit in seconds (task_time_limit)")
	fl.Float64Var(&f.softTimeLimit, "soft-time-limit", 0, "soft time limit in seconds (task_soft_time_limit)")
	fl.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long a warm shutdown waits for running tasks")
	fl.IntVar(&f.maxMessageSize, "max-message-size", 0, "largest accepted message body in bytes (default 64 MiB); larger ones are dead-lettered")
	fl.IntVar(&f.maxNestingDepth, "max-nesting-depth", 0, "deepest accepted nesting of arrays and maps in a body (default 256); deeper ones are dead-lettered")
	fl.BoolVar(&f.resultExtended, "result-extended", false, "store name, args, kwargs, worker, retries and queue with results (result_extended)")
	fl.BoolVar(&f.trackStarted, "track-started", false, "store STARTED when a task starts (task_track_started)")
	fl.Float64Var(&f.visibilityTimeout, "visibility-timeout", 0, "Redis visibility_timeout in seconds (default 3600)")
	fl.StringVar(&f.globalKeyPrefix, "global-keyprefix", "", "Redis global_keyprefix")
	fl.IntVar(&f.etaTaskLimit, "eta-task-limit", 0, "worker_eta_task_limit (default 10000)")
	fl.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics, /healthz and /readyz on this address (e.g. :9808)")
	fl.StringArrayVar(&f.rateLimits, "rate-limit", nil, "per-worker rate limit of a task, as Celery's rate_limit: NAME=RATE (tasks.sleep=10/s); repeatable")
	fl.StringArrayVar(&f.globalRateLimits, "global-rate-limit", nil, "rate limit of a task across all workers: NAME=RATE[@BUCKET] (tasks.sleep=5/s@api: tasks naming one bucket share it); repeatable")
	fl.IntVar(&f.globalRateBurst, "global-rate-burst", 1, "bucket size of --global-rate-limit: how many starts may come at once")
	fl.StringVar(&f.cpuProfile, "cpu-profile", "", "write a Go CPU profile of the whole run to this file (for celeriac bench --profile)")
	_ = fl.MarkHidden("cpu-profile")
	fl.StringVar(&f.memProfile, "mem-profile", "", "write a Go allocation profile to this file at exit")
	_ = fl.MarkHidden("mem-profile")
	fl.IntVar(&f.waitReplicas, "wait-replicas", 0, "Redis: wait (WAIT) until this many replicas have each ack, publish and result write; unreplicated ones are logged and counted")
	fl.DurationVar(&f.waitTimeout, "wait-timeout", time.Second, "how long --wait-replicas waits")
	fl.StringVar(&f.rateLimitURL, "rate-limit-url", "", "Redis for --global-rate-limit (default $CELERIAC_RATE_LIMIT_URL, else the result backend when it is Redis)")
}

// workerSetup resolves the worker's configuration and connection options:
// a flag given on the command line wins over the config file's setting,
// which wins over the flag's default.
func workerSetup(fl *pflag.FlagSet, g *globalFlags, f *workerFlags) (worker.Config, connect.Options, error) {
	file := g.file
	set := fl.Changed
	cfg := worker.Config{
		Hostname:         f.hostname,
		WithoutHeartbeat: f.withoutHeartbeat,
		QueueOrder:       worker.QueueOrder(f.queueOrder),
		ShutdownTimeout:  f.shutdownTimeout,
		MaxMessageSize:   f.maxMessageSize,
		MaxNestingDepth:  f.maxNestingDepth,
		DefaultQueue:     file.TaskDefaultQueue,
		QueueArguments:   file.QueueArguments,
		ExchangeType:     file.TaskDefaultExchangeType,
		Logger:           g.log,
	}
	switch file.TaskDefaultQueueType {
	case "", "classic":
	case "quorum":
		// Celery 5.5: every queue declared with x-queue-type quorum,
		// unless celeriac_queue_arguments says otherwise (worker.Config
		// lays a queue's own arguments over "*").
		all := map[string]any{"x-queue-type": "quorum"}
		maps.Copy(all, file.QueueArguments["*"])
		cfg.QueueArguments = maps.Clone(file.QueueArguments)
		if cfg.QueueArguments == nil {
			cfg.QueueArguments = map[string]map[string]any{}
		}
		cfg.QueueArguments["*"] = all
	default:
		return cfg, connect.Options{}, usagef("config: task_default_queue_type %q: want classic or quorum", file.TaskDefaultQueueType)
	}
	if set("queues") {
		for _, q := range strings.Split(f.queues, ",") {
			if q = strings.TrimSpace(q); q != "" {
				cfg.Queues = append(cfg.Queues, q)
			}
		}
		if len(cfg.Queues) == 0 {
			return cfg, connect.Options{}, usagef("-Q/--queues names no queue")
		}
	} else {
		cfg.Queues = file.TaskQueues
	}
	if set("queue-weights") {
		if cfg.QueueOrder != worker.QueueOrderWeighted {
			return cfg, connect.Options{}, usagef("--queue-weights needs --queue-order weighted")
		}
		w, err := parseQueueWeights(f.queueWeights)
		if err != nil {
			return cfg, connect.Options{}, usageError{err}
		}
		cfg.QueueWeights = w
	}
	cfg.Concurrency = pick(set("concurrency"), f.concurrency, file.WorkerConcurrency)
	if cfg.Concurrency < 0 {
		return cfg, connect.Options{}, usagef("--concurrency must not be negative")
	}
	pm := pick(set("prefetch-multiplier"), f.prefetchMultiplier, file.WorkerPrefetchMult)
	switch {
	case pm < 0:
		return cfg, connect.Options{}, usagef("--prefetch-multiplier must not be negative")
	case pm == 0:
		cfg.PrefetchMultiplier = -1 // Celery: 0 means unlimited
	default:
		cfg.PrefetchMultiplier = pm
	}
	cfg.SendTaskEvents = pick(set("task-events"), f.taskEvents, file.WorkerSendTaskEvents)
	cfg.AcksLate = pick(set("acks-late"), f.acksLate, file.TaskAcksLate)
	if file.TaskAcksOnFailure != nil {
		// Celery acknowledges a failed acks_late message (true, its
		// default); celeriac's default dead-letters it.
		cfg.AcksOnFailure = *file.TaskAcksOnFailure
	}
	cfg.ResultExtended = pick(set("result-extended"), f.resultExtended, file.ResultExtended)
	cfg.TrackStarted = pick(set("track-started"), f.trackStarted, file.TaskTrackStarted)
	cfg.TimeLimit = seconds(pick(set("time-limit"), f.timeLimit, file.TaskTimeLimit))
	cfg.SoftTimeLimit = seconds(pick(set("soft-time-limit"), f.softTimeLimit, file.TaskSoftTimeLimit))
	cfg.ETATaskLimit = pick(set("eta-task-limit"), f.etaTaskLimit, file.WorkerEtaTaskLimit)
	if len(file.TaskRoutes) > 0 {
		cfg.Routes = map[string]string{}
		for name, r := range file.TaskRoutes {
			switch r := r.(type) {
			case string:
				cfg.Routes[name] = r
			case map[string]any:
				if q, ok := r["queue"].(string); ok {
					cfg.Routes[name] = q
					continue
				}
				return cfg, connect.Options{}, usagef("config: task_routes[%q] has no \"queue\"", name)
			default:
				return cfg, connect.Options{}, usagef("config: task_routes[%q] must be a queue name or {\"queue\": ...}", name)
			}
		}
	}
	if err := cfg.Validate(); err != nil {
		return cfg, connect.Options{}, usageError{err}
	}

	o := g.options()
	o.ResultExtended = cfg.ResultExtended
	if set("visibility-timeout") {
		o.VisibilityTimeout = seconds(f.visibilityTimeout)
	}
	if set("global-keyprefix") {
		o.GlobalKeyPrefix = f.globalKeyPrefix
	}
	if f.rateLimitURL != "" {
		o.RateLimitURL = f.rateLimitURL
	}
	if f.waitReplicas < 0 {
		return cfg, connect.Options{}, usagef("--wait-replicas must not be negative")
	}
	o.WaitReplicas, o.WaitTimeout = f.waitReplicas, f.waitTimeout
	if cfg.QueueOrder == worker.QueueOrderStrict && o.QueueOrderStrategy == "" {
		o.QueueOrderStrategy = "priority" // Redis pops in -Q order too
	}
	return cfg, o, nil
}

// parseQueueWeights reads --queue-weights: NAME=N pairs, comma-separated,
// each N a whole number of at least 1.
func parseQueueWeights(spec string) (map[string]int, error) {
	w := map[string]int{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, n, ok := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		v, err := strconv.Atoi(strings.TrimSpace(n))
		if !ok || name == "" || err != nil || v < 1 {
			return nil, fmt.Errorf("--queue-weights %q: want NAME=N with N a whole number >= 1, as in high=3,low=1", part)
		}
		w[name] = v
	}
	if len(w) == 0 {
		return nil, fmt.Errorf("--queue-weights names no queue")
	}
	return w, nil
}

// pick returns the flag's value when it was given, else the file's setting
// when present, else the flag's default.
func pick[T any](flagSet bool, flag T, file *T) T {
	if !flagSet && file != nil {
		return *file
	}
	return flag
}

func runWorker(cmd *cobra.Command, g *globalFlags, f *workerFlags) error {
	cfg, o, err := workerSetup(cmd.Flags(), g, f)
	if err != nil {
		return err
	}
	tasks, err := rateLimitedTasks(demotasks.Tasks(), f.rateLimits, f.globalRateLimits, f.globalRateBurst)
	if err != nil {
		return usageError{err}
	}
	if os.Getenv("GOGC") == "" {
		// A worker's live heap is small (a few MB: the messages in flight)
		// while it allocates several KB per message, so at Go's default the
		// collector runs every couple of MB, a few hundred times a second at
		// full speed. Doubling the headroom cut the CPU per task by a fifth
		// in celeriac bench for about 3 MB of RSS. GOGC in the environment
		// overrides it (GOGC=100 is Go's default).
		debug.SetGCPercent(200)
	}
	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err != nil {
			return usagef("--cpu-profile: %v", err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if f.memProfile != "" {
		defer func() {
			if pf, err := os.Create(f.memProfile); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(pf, 0)
				pf.Close()
			}
		}()
	}

	// Signals: the first one cancels ctx (warm shutdown); the second closes
	// the worker (cold shutdown).
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	// The metrics address is checked before connecting: a typo in it is a
	// usage error, whatever the broker does.
	var ln net.Listener
	if f.metricsAddr != "" {
		ln, err = net.Listen("tcp", f.metricsAddr)
		if err != nil {
			return usagef("--metrics-addr: %v", err)
		}
		defer ln.Close()
	}
	if strings.TrimSpace(o.BrokerURL) == "" {
		// A typo in the environment must not start a worker that consumes
		// nothing and looks healthy; memory:// asks for that explicitly.
		return usagef("no broker: give --broker, set CELERY_BROKER_URL or broker_url in --config (memory:// for an in-process broker)")
	}
	if connect.Scheme(o.BrokerURL) == "memory" {
		g.log.Warn("in-process broker (memory://): nothing outside this process can reach it")
	}
	conn, err := connect.Open(ctx, o)
	if err != nil {
		return err
	}
	defer conn.Close()
	cfg.Backend = conn.Backend
	// Tracing follows the standard OTEL_* variables; off unless they ask.
	tp, err := otelenv.New(ctx, "celeriac-worker")
	if err != nil {
		return err
	}
	if tp != nil {
		g.log.Info("tracing on: spans are exported over OTLP (OTEL_* settings)")
		cfg.TracerProvider = tp
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := tp.Shutdown(sctx); err != nil {
				g.log.Warn("flushing the last spans failed", zap.Error(err))
			}
		}()
	}
	cfg.GlobalRateLimiter = conn.RateLimiter
	if len(f.globalRateLimits) > 0 && conn.RateLimiter == nil {
		return usagef("--global-rate-limit needs a shared limiter: --rate-limit-url, $CELERIAC_RATE_LIMIT_URL or a redis:// result backend")
	}

	mux := worker.NewMux()
	for _, t := range tasks {
		mux.Handle(t.Name, t.Handler, t.Options...)
	}
	var metrics *prommetrics.Metrics
	if ln != nil {
		metrics = prommetrics.New(nil)
		cfg.Observer = metrics
	}
	w, err := worker.New(conn.Transport, mux, cfg)
	if err != nil {
		return err
	}
	// Every goroutine started here ends before runWorker returns.
	var wg sync.WaitGroup
	defer wg.Wait()
	if metrics != nil {
		metrics.Watch(w)
		metrics.WatchBroker(conn.Transport)
		metrics.WatchBackend(conn.Backend)
		srv := &http.Server{Handler: metrics.Handler(func(ctx context.Context) error {
			return ping(ctx, conn)
		}), ReadHeaderTimeout: 5 * time.Second}
		wg.Go(func() { _ = srv.Serve(ln) })
		defer srv.Close()
		g.log.Info("serving metrics", zap.String("addr", ln.Addr().String()))
	}
	g.log.Info("celeriac worker starting",
		zap.String("broker", connect.Redact(o.BrokerURL)),
		zap.String("result_backend", connect.Redact(o.ResultBackend)),
		zap.String("hostname", w.Hostname()))
	stopped := make(chan struct{})
	defer close(stopped)
	wg.Go(func() {
		select {
		case s := <-sigs:
			g.log.Info("warm shutdown requested (send the signal again for a cold shutdown)", zap.String("signal", s.String()))
			cancel()
		case <-ctx.Done():
		case <-stopped:
			return
		}
		select {
		case s := <-sigs:
			g.log.Warn("cold shutdown requested", zap.String("signal", s.String()))
			w.Close()
		case <-stopped:
		}
	})
	err = w.Run(ctx)
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	var se *worker.ShutdownError
	if errors.As(err, &se) && se.Abandoned == 0 {
		// Cut short on request (cold shutdown, or the shutdown timeout):
		// every cancelled task was settled, its acks_late message returned
		// to the broker. Only handlers still running are a failure.
		g.log.Warn("shutdown interrupted running tasks", zap.Int("cancelled", se.Cancelled))
		err = nil
	}
	if err == nil {
		g.log.Info("celeriac worker stopped", zap.String("hostname", w.Hostname()))
	}
	return err
}

// rateLimitedTasks adds the --rate-limit and --global-rate-limit options
// (NAME=RATE, NAME=RATE@BUCKET) to the tasks they name.
func rateLimitedTasks(tasks []demotasks.Task, local, global []string, burst int) ([]demotasks.Task, error) {
	byName := make(map[string]int, len(tasks))
	for i, t := range tasks {
		byName[t.Name] = i
		tasks[i].Options = slices.Clone(t.Options)
	}
	parse := func(flag, spec string) (int, string, string, error) {
		name, rate, ok := strings.Cut(spec, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return 0, "", "", fmt.Errorf("--%s %q: want NAME=RATE", flag, spec)
		}
		rate, bucket, _ := strings.Cut(rate, "@")
		r, err := worker.ParseRate(rate)
		if err != nil {
			return 0, "", "", fmt.Errorf("--%s %q: %w", flag, spec, err)
		}
		if r.IsZero() {
			return 0, "", "", fmt.Errorf("--%s %q: the rate must be positive", flag, spec)
		}
		i, ok := byName[name]
		if !ok {
			return 0, "", "", fmt.Errorf("--%s %q: no task %q", flag, spec, name)
		}
		return i, strings.TrimSpace(rate), strings.TrimSpace(bucket), nil
	}
	for _, spec := range local {
		i, rate, bucket, err := parse("rate-limit", spec)
		if err != nil {
			return nil, err
		}
		if bucket != "" {
			return nil, fmt.Errorf("--rate-limit %q: a per-worker limit has no bucket", spec)
		}
		tasks[i].Options = append(tasks[i].Options, worker.RateLimit(rate))
	}
	if len(global) > 0 && burst < 1 {
		return nil, fmt.Errorf("--global-rate-burst %d: want at least 1", burst)
	}
	for _, spec := range global {
		i, rate, bucket, err := parse("global-rate-limit", spec)
		if err != nil {
			return nil, err
		}
		tasks[i].Options = append(tasks[i].Options, worker.GlobalRateLimit(rate, bucket, burst))
	}
	return tasks, nil
}
