package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/transport"
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
	resultTimeout      time.Duration
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
	celery             celeryWorker
}

func newWorkerCmd(g *globalFlags, mux *worker.Mux) *cobra.Command {
	f := &workerFlags{}
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker for the registered tasks",
		Long: `Run a celeriac worker with the registered tasks (` + strings.Join(mux.Names(), ", ") + `),
consuming the given queues.

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
		Args:        args(cobra.NoArgs),
		RunE:        func(cmd *cobra.Command, _ []string) error { return runWorker(cmd, g, f, mux) },
		Annotations: map[string]string{daemonAnnotation: "worker"},
	}
	f.register(cmd)
	g.refuse = f.celery.refusals
	fl := cmd.Flags()
	fl.StringVarP(&g.logfile, "logfile", "f", "", "append the log to this file (%n %h %d %i %I %p expanded, as Celery's) instead of stderr")
	// -n is read before the logger exists, for %n in --logfile.
	fl.Lookup("hostname").Value = nodeValue{fl.Lookup("hostname").Value, &g.node}
	if g.hooks != nil {
		for _, add := range g.hooks.workerFlags {
			add(fl)
		}
	}
	return cmd
}

func (f *workerFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVarP(&f.queues, "queues", "Q", "", "comma-separated queues to consume (default: task_queues, else task_default_queue, else \"celery\")")
	fl.IntVarP(&f.concurrency, "concurrency", "c", 0, "tasks run at once (default: worker_concurrency, else the number of CPUs)")
	fl.StringVarP(&f.hostname, "hostname", "n", "", "node name, with %h %n %d %i %I expanded as Celery does (default celery@%h; a name without @ gets celery@ in front)")
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
	fl.DurationVar(&f.resultTimeout, "result-timeout", 5*time.Minute, "how long a result write is tried again while the result backend does not answer; the task's slot stays busy meanwhile")
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
	f.celery.register(fl)
}

// nodeValue is the -n flag's value, copied where --logfile can see it.
type nodeValue struct {
	pflag.Value
	node *string
}

func (v nodeValue) Set(s string) error {
	*v.node = s
	return v.Value.Set(s)
}

// workerSetup resolves the worker's configuration and connection options:
// a flag given on the command line wins over the config file's setting,
// which wins over the flag's default.
func workerSetup(fl *pflag.FlagSet, g *globalFlags, f *workerFlags) (worker.Config, connect.Options, error) {
	file := g.file
	// A flag is set when the command line gives it, or when the program
	// set a default in code (cli.Defaults) — which the config file's
	// setting still overrides: pick takes changed, not set.
	changed := fl.Changed
	set := func(n string) bool { return changed(n) || g.codeDefaults[n] }
	cfg := worker.Config{
		Hostname:         celeryHostname(f.hostname),
		WithoutHeartbeat: f.withoutHeartbeat,
		QueueOrder:       worker.QueueOrder(f.queueOrder),
		ShutdownTimeout:  f.shutdownTimeout,
		ResultTimeout:    f.resultTimeout,
		MaxMessageSize:   f.maxMessageSize,
		MaxNestingDepth:  f.maxNestingDepth,
		DefaultQueue:     file.TaskDefaultQueue,
		QueueArguments:   file.QueueArguments,
		Logger:           g.log,
	}
	if changed("queues") || (g.codeDefaults["queues"] && len(file.TaskQueues) == 0) {
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
	if set("exclude-queues") {
		if len(cfg.Queues) == 0 {
			cfg.Queues = []string{cmp.Or(file.TaskDefaultQueue, "celery")}
		}
		for _, x := range strings.Split(f.celery.excludeQueues, ",") {
			cfg.Queues = slices.DeleteFunc(cfg.Queues, func(q string) bool { return q == strings.TrimSpace(x) })
		}
		if len(cfg.Queues) == 0 {
			return cfg, connect.Options{}, usagef("-X/--exclude-queues leaves no queue to consume")
		}
	}
	if err := queueTypes(&cfg, file); err != nil {
		return cfg, connect.Options{}, err
	}
	if set("queue-weights") {
		if cfg.QueueOrder != worker.QueueOrderWeighted {
			return cfg, connect.Options{}, usagef("--queue-weights needs --queue-order weighted")
		}
		w, err := parseQueueWeights(f.queueWeights)
		if err != nil {
			return cfg, connect.Options{}, UsageError{err}
		}
		cfg.QueueWeights = w
	}
	cfg.Concurrency = pick(changed("concurrency"), f.concurrency, file.WorkerConcurrency)
	if cfg.Concurrency < 0 {
		return cfg, connect.Options{}, usagef("--concurrency must not be negative")
	}
	if err := f.celery.apply(set, g.log, &cfg.Concurrency); err != nil {
		return cfg, connect.Options{}, err
	}
	if set("autoscale") {
		mx, mn, err := parseAutoscale(f.celery.autoscale)
		if err != nil {
			return cfg, connect.Options{}, UsageError{err}
		}
		if f.celery.pool == "solo" {
			g.log.Warn("-P solo runs one task at a time: --autoscale is ignored")
		} else {
			cfg.AutoscaleMax, cfg.AutoscaleMin = mx, mn
		}
		if v := os.Getenv("AUTOSCALE_KEEPALIVE"); v != "" {
			// Celery's environment variable (celery/worker/autoscale.py).
			k, err := strconv.ParseFloat(v, 64)
			if err != nil || k <= 0 {
				return cfg, connect.Options{}, usagef("AUTOSCALE_KEEPALIVE=%q: want a positive number of seconds", v)
			}
			cfg.AutoscaleKeepalive = seconds(k)
		}
	}
	if set("heartbeat-interval") {
		if f.celery.heartbeatInterval <= 0 {
			return cfg, connect.Options{}, usagef("--heartbeat-interval must be positive")
		}
		cfg.HeartbeatInterval = seconds(f.celery.heartbeatInterval)
	}
	pm := pick(changed("prefetch-multiplier"), f.prefetchMultiplier, file.WorkerPrefetchMult)
	switch {
	case pm < 0:
		return cfg, connect.Options{}, usagef("--prefetch-multiplier must not be negative")
	case pm == 0:
		cfg.PrefetchMultiplier = -1 // Celery: 0 means unlimited
	default:
		cfg.PrefetchMultiplier = pm
	}
	cfg.SendTaskEvents = pick(changed("task-events") || changed("events") || g.codeDefaults["task-events"] && file.WorkerSendTaskEvents == nil, f.taskEvents || f.celery.events, file.WorkerSendTaskEvents)
	cfg.AcksLate = pick(changed("acks-late"), f.acksLate, file.TaskAcksLate)
	if file.TaskAcksOnFailure != nil {
		// Celery acknowledges a failed acks_late message (true, its
		// default); celeriac's default dead-letters it.
		cfg.AcksOnFailure = *file.TaskAcksOnFailure
	}
	cfg.ResultExtended = pick(changed("result-extended"), f.resultExtended, file.ResultExtended)
	cfg.TrackStarted = pick(changed("track-started"), f.trackStarted, file.TaskTrackStarted)
	cfg.TimeLimit = seconds(pick(changed("time-limit"), f.timeLimit, file.TaskTimeLimit))
	cfg.SoftTimeLimit = seconds(pick(changed("soft-time-limit"), f.softTimeLimit, file.TaskSoftTimeLimit))
	cfg.ETATaskLimit = pick(changed("eta-task-limit"), f.etaTaskLimit, file.WorkerEtaTaskLimit)
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
		return cfg, connect.Options{}, UsageError{err}
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

func runWorker(cmd *cobra.Command, g *globalFlags, f *workerFlags, mux *worker.Mux) (err error) {
	cfg, o, err := workerSetup(cmd.Flags(), g, f)
	if err != nil {
		return err
	}
	if g.hooks != nil && g.hooks.dryRun != nil {
		g.hooks.dryRun(cfg, o)
		return nil
	}
	if err := rateLimitTasks(mux, f.rateLimits, f.globalRateLimits, f.globalRateBurst); err != nil {
		return UsageError{err}
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
	if f.celery.uid != "" || f.celery.gid != "" {
		// As Celery's worker: before the pid file, which then belongs to
		// the user and can be removed at exit; after the metrics port (one
		// below 1024 needs root) and the log file are opened.
		if err := dropPrivileges(f.celery.uid, f.celery.gid); err != nil {
			return err
		}
	}
	if f.celery.pidfile != "" {
		// Expanded as Celery's worker does (node_format): %n.pid.
		remove, err := writePidfile(nodeFormat(f.celery.pidfile, f.hostname))
		if err != nil {
			return err
		}
		defer remove()
	}

	// Every goroutine started here ends before runWorker returns.
	var wg sync.WaitGroup
	defer wg.Wait()
	var metrics *prommetrics.Metrics
	var connected atomic.Pointer[connect.Conn]
	var current atomic.Pointer[worker.Worker] // the run's; replaced on a --max-memory-per-child restart
	var attempt atomic.Int64
	if ln != nil {
		metrics = prommetrics.New(nil)
		cfg.Observer = metrics
		srv := &http.Server{Handler: metrics.Handler(func(ctx context.Context) error {
			conn := connected.Load()
			if conn == nil {
				return fmt.Errorf("starting: connecting to the broker and result backend (attempt %d)", attempt.Load())
			}
			if w := current.Load(); w != nil {
				if err := w.ConsumerHealth(); err != nil {
					return err // a stalled consumer being rebuilt (worker.Config.ConsumerWatchdog)
				}
			}
			return ping(ctx, conn)
		}), ReadHeaderTimeout: 5 * time.Second}
		wg.Go(func() { _ = srv.Serve(ln) })
		defer srv.Close()
		g.log.Info("serving metrics", zap.String("addr", ln.Addr().String()))
	}

	if h := g.hooks; h != nil && (len(h.onStart) > 0 || len(h.onStop) > 0) {
		// Stop hooks run once the worker is done (registered before
		// everything the worker uses, they run after it is closed), and
		// also when a start hook failed: it may have opened half of what
		// they close.
		defer runStop(g, h.onStop, &err)
		for _, start := range h.onStart {
			if err := start(ctx); err != nil {
				return fmt.Errorf("start hook: %w", err)
			}
		}
	}

	conn, err := connectRetry(ctx, g, o, &attempt)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for the broker
		}
		return err
	}
	defer conn.Close()
	connected.Store(conn)
	cfg.Backend = conn.Backend
	// Tracing follows the standard OTEL_* variables; off unless they ask.
	tp, err := otelenv.New(ctx, "celeriac-worker")
	if err != nil {
		return err
	}
	if tp != nil {
		g.log.Info("tracing on: spans are exported over OTLP (OTEL_* settings)")
		cfg.TracerProvider = tp
		cfg.Propagator = otelenv.Propagator()
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
	if f.celery.purge {
		if err := purgeQueues(ctx, g, conn, cfg.Queues, cfg.DefaultQueue); err != nil {
			return err
		}
	}
	if metrics != nil {
		metrics.WatchBroker(conn.Transport)
		metrics.WatchBackend(conn.Backend)
	}

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
			if w := current.Load(); w != nil {
				w.Close()
			}
		case <-stopped:
		}
	})
	limit := int64(f.celery.maxMemoryPerChild) * 1024
	for {
		w, err := worker.New(conn.Transport, mux, cfg)
		if err != nil {
			return err
		}
		current.Store(w)
		if metrics != nil {
			metrics.Watch(w)
		}
		g.log.Info("celeriac worker starting",
			zap.String("broker", connect.Redact(o.BrokerURL)),
			zap.String("result_backend", connect.Redact(o.ResultBackend)),
			zap.String("hostname", w.Hostname()))
		runCtx, stopRun := context.WithCancel(ctx)
		var over atomic.Int64
		if limit > 0 {
			wg.Go(func() { watchHeap(runCtx, g, limit, &over, stopRun) })
		}
		err = w.Run(runCtx)
		stopRun()
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
		if err != nil || ctx.Err() != nil || over.Load() == 0 {
			if err == nil {
				g.log.Info("celeriac worker stopped", zap.String("hostname", w.Hostname()))
			}
			return err
		}
		// --max-memory-per-child: the warm stop is done (unstarted
		// messages are back on the broker, running tasks finished).
		debug.FreeOSMemory()
		if heap := liveHeap(); heap > limit {
			return fmt.Errorf("--max-memory-per-child: the Go heap is %d KiB after a warm restart, still above %d KiB: "+
				"exiting so that the service manager starts a fresh process (no task was lost)", heap/1024, limit/1024)
		}
		g.log.Info("--max-memory-per-child: memory freed, consuming again", zap.Int64("heap_kib", liveHeap()/1024))
	}
}

// runStop runs stop hooks in reverse order; the first error becomes *err
// when *err is nil.
func runStop(g *globalFlags, hooks []func(context.Context) error, err *error) {
	for i := len(hooks) - 1; i >= 0; i-- {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		e := hooks[i](ctx)
		cancel()
		if e != nil {
			g.log.Error("stop hook failed", zap.Error(e))
			if *err == nil {
				*err = fmt.Errorf("stop hook: %w", e)
			}
		}
	}
}

// memCheckEvery is how often --max-memory-per-child looks at the heap.
var memCheckEvery = time.Second

// watchHeap stops the current run (a warm stop: running tasks finish,
// unstarted messages go back) when the live heap passes limit, as Celery
// replaces a pool child that passed --max-memory-per-child.
func watchHeap(ctx context.Context, g *globalFlags, limit int64, over *atomic.Int64, stop func()) {
	t := time.NewTicker(memCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if heap := liveHeap(); heap > limit {
			over.Store(heap)
			g.log.Warn("--max-memory-per-child: the Go heap is above the limit; taking no new tasks, restarting the consumer once the running ones finish",
				zap.Int64("heap_kib", heap/1024), zap.Int64("limit_kib", limit/1024))
			stop()
			return
		}
	}
}

// liveHeap is the heap in use: live objects and not yet swept garbage, as
// the Go runtime counts them (runtime/metrics).
func liveHeap() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64())
}

// purgeQueues is the worker's --purge: Celery's, before consuming.
func purgeQueues(ctx context.Context, g *globalFlags, conn *connect.Conn, queues []string, def string) error {
	admin, ok := conn.Transport.(transport.Admin)
	if !ok {
		return fmt.Errorf("--purge: the %s transport cannot purge", conn.BrokerScheme)
	}
	if len(queues) == 0 {
		queues = []string{cmp.Or(def, "celery")}
	}
	for _, q := range queues {
		n, err := admin.Purge(ctx, q)
		if err != nil {
			return fmt.Errorf("--purge %s: %w", q, err)
		}
		g.log.Warn("--purge: deleted the queue's waiting messages", zap.String("queue", q), zap.Int("messages", n))
	}
	return nil
}

// rateLimitTasks adds the --rate-limit and --global-rate-limit options
// (NAME=RATE, NAME=RATE@BUCKET) to the tasks of mux they name.
func rateLimitTasks(mux *worker.Mux, local, global []string, burst int) error {
	parse := func(flag, spec string) (string, string, string, error) {
		name, rate, ok := strings.Cut(spec, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return "", "", "", fmt.Errorf("--%s %q: want NAME=RATE", flag, spec)
		}
		rate, bucket, _ := strings.Cut(rate, "@")
		r, err := worker.ParseRate(rate)
		if err != nil {
			return "", "", "", fmt.Errorf("--%s %q: %w", flag, spec, err)
		}
		if r.IsZero() {
			return "", "", "", fmt.Errorf("--%s %q: the rate must be positive", flag, spec)
		}
		if _, ok := mux.Options(name); !ok {
			return "", "", "", fmt.Errorf("--%s %q: no task %q", flag, spec, name)
		}
		return name, strings.TrimSpace(rate), strings.TrimSpace(bucket), nil
	}
	// Everything is checked before the first change: a bad flag leaves
	// the Mux as it was.
	type change struct {
		name string
		opt  worker.TaskOption
	}
	var changes []change
	for _, spec := range local {
		name, rate, bucket, err := parse("rate-limit", spec)
		if err != nil {
			return err
		}
		if bucket != "" {
			return fmt.Errorf("--rate-limit %q: a per-worker limit has no bucket", spec)
		}
		changes = append(changes, change{name, worker.RateLimit(rate)})
	}
	if len(global) > 0 && burst < 1 {
		return fmt.Errorf("--global-rate-burst %d: want at least 1", burst)
	}
	for _, spec := range global {
		name, rate, bucket, err := parse("global-rate-limit", spec)
		if err != nil {
			return err
		}
		changes = append(changes, change{name, worker.GlobalRateLimit(rate, bucket, burst)})
	}
	for _, c := range changes {
		if err := mux.Configure(c.name, c.opt); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return nil
}

// connectRetry opens the broker and result backend, retrying while they
// cannot be reached as Celery does at start-up
// (broker_connection_retry_on_startup, default true;
// broker_connection_max_retries, default 100, 0 for ever): waits of 2, 4,
// 6 ... up to 30 s, kombu's, each attempt logged. Errors that are not
// about reaching a server (a bad URL, refused credentials) are not
// retried.
func connectRetry(ctx context.Context, g *globalFlags, o connect.Options, attempt *atomic.Int64) (*connect.Conn, error) {
	retry := true
	if v := g.file.BrokerConnectionRetryOnStartup; v != nil {
		retry = *v
	} else if v := g.file.BrokerConnectionRetry; v != nil {
		retry = *v
	}
	maxRetries := 100
	if v := g.file.BrokerConnectionMaxRetries; v != nil {
		maxRetries = *v
	}
	for n := 1; ; n++ {
		attempt.Store(int64(n))
		conn, err := connect.Open(ctx, o)
		if err == nil {
			if n > 1 {
				g.log.Info("connected after retrying", zap.Int("attempts", n))
			}
			return conn, nil
		}
		if !retry || !unreachable(err) || ctx.Err() != nil {
			return nil, err
		}
		if maxRetries > 0 && n > maxRetries {
			return nil, fmt.Errorf("giving up after %d retries (broker_connection_max_retries): %w", maxRetries, err)
		}
		wait := min(time.Duration(2*n)*time.Second, 30*time.Second)
		g.log.Error(fmt.Sprintf("cannot connect: %v; trying again in %s (%d/%s)", err, wait, n, retriesText(maxRetries)),
			zap.String("broker", connect.Redact(o.BrokerURL)), zap.String("result_backend", connect.Redact(o.ResultBackend)))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(connectWait(wait)):
		}
	}
}

// connectWait lets tests shorten the start-up retry waits.
var connectWait = func(d time.Duration) time.Duration { return d }

func retriesText(n int) string {
	if n <= 0 {
		return "forever"
	}
	return strconv.Itoa(n)
}

// unreachable reports whether err is about reaching a server (refused,
// reset, timed out, name not resolved): worth retrying at start-up.
func unreachable(err error) bool {
	var ne net.Error
	var oe *net.OpError
	var de *net.DNSError
	return errors.As(err, &oe) || errors.As(err, &de) || errors.As(err, &ne) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// queueTypes gives each consumed queue the queue and exchange types Celery
// declares it with, so that a celeriac worker and Python workers sharing a
// queue agree (RabbitMQ refuses a second declaration that differs with
// PRECONDITION_FAILED). Celery gives task_default_queue_type and
// task_default_exchange_type to its default queue only; a queue that -Q
// names and task_queues does not define is created "missing": classic on a
// direct exchange of its own name (Celery 5.2 to 5.5), or as Celery 5.6's
// task_create_missing_queue_type and task_create_missing_queue_exchange_type
// say. celeriac's task_queues are names, which cannot carry a kombu Queue's
// arguments: they are declared like the default queue. An x-queue-type in
// celeriac_queue_arguments (for the queue or "*") wins over all of this.
func queueTypes(cfg *worker.Config, file settings) error {
	for _, v := range []struct{ setting, value string }{
		{"task_default_queue_type", file.TaskDefaultQueueType},
		{"task_create_missing_queue_type", file.TaskCreateMissingQueueType},
	} {
		switch v.value {
		case "", "classic", "quorum":
		default:
			return usagef("config: %s %q: want classic or quorum", v.setting, v.value)
		}
	}
	for _, v := range []struct{ setting, value string }{
		{"task_default_exchange_type", file.TaskDefaultExchangeType},
		{"task_create_missing_queue_exchange_type", file.TaskCreateMissingQueueExchangeType},
	} {
		switch v.value {
		case "", transport.Direct, transport.Topic:
		default:
			return usagef("config: %s %q: want direct or topic", v.setting, v.value)
		}
	}
	defined := map[string]bool{cmp.Or(file.TaskDefaultQueue, "celery"): true}
	for _, q := range file.TaskQueues {
		defined[q] = true
	}
	consumed := cfg.Queues
	if len(consumed) == 0 {
		consumed = []string{cmp.Or(file.TaskDefaultQueue, "celery")}
	}
	// A queue added later by add_consumer gets what Celery's
	// add_task_queue gives it: a direct exchange, a classic queue.
	cfg.ExchangeType = ""
	_, userStar := file.QueueArguments["*"]["x-queue-type"]
	cloned := false
	for _, q := range consumed {
		queueType, exType := file.TaskCreateMissingQueueType, file.TaskCreateMissingQueueExchangeType
		if defined[q] {
			queueType, exType = file.TaskDefaultQueueType, file.TaskDefaultExchangeType
		}
		if exType != "" && exType != transport.Direct {
			if cfg.ExchangeTypes == nil {
				cfg.ExchangeTypes = map[string]string{}
			}
			cfg.ExchangeTypes[q] = exType
		}
		if _, own := file.QueueArguments[q]["x-queue-type"]; queueType != "quorum" || own || userStar {
			continue
		}
		args := map[string]any{"x-queue-type": "quorum"}
		maps.Copy(args, file.QueueArguments[q])
		if !cloned {
			// cfg.QueueArguments is the file's map: written to, a copy.
			cfg.QueueArguments, cloned = maps.Clone(cfg.QueueArguments), true
			if cfg.QueueArguments == nil {
				cfg.QueueArguments = map[string]map[string]any{}
			}
		}
		cfg.QueueArguments[q] = args
	}
	return nil
}
