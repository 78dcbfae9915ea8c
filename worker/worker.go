package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// Worker consumes task messages from a transport and runs them with the
// handlers of a Mux.
type Worker struct {
	tr       transport.Transport
	mux      *Mux
	cfg      Config
	log      *zap.Logger
	producer *publish.Producer
	tracing  *tracing // nil: tracing off

	started   atomic.Bool
	cold      chan struct{}
	closeOnce sync.Once

	mu     sync.Mutex
	active map[*activeTask]struct{} // one entry per running delivery
	totals map[string]int64         // tasks run, by name (stats)
	cur    *loop                    // the running loop, for remote control

	// settleBase is what settle budgets derive from: never cancelled by
	// the start of a shutdown, only by abortSettle when Run gives up on
	// what still runs, so that nothing of the worker acts after Run.
	settleBase  context.Context
	abortSettle context.CancelFunc
	// handlers counts handler calls still running, also those a hard time
	// limit or the shutdown gave up on.
	handlers tally

	clock    *clock
	events   *events
	revoked  *revokedSet
	bg       sync.WaitGroup // control, event and watchdog goroutines
	shutdown chan struct{}  // remote shutdown request
	shutOnce sync.Once
	// consumerErr is set while the watchdog rebuilds a stalled consumer
	// (ConsumerHealth).
	consumerErr atomic.Pointer[error]

	// stats
	processed atomic.Int64
	succeeded atomic.Int64
	failed    atomic.Int64
	retried   atomic.Int64
	startedAt time.Time
}

// activeTask is one running delivery of a task, for remote control and
// cancellation.
type activeTask struct {
	task       *Task
	delivery   *transport.Delivery
	started    time.Time
	acked      bool
	terminated atomic.Bool // revoked with terminate
	abandoned  atomic.Bool // Run returned without waiting for it
	cancel     context.CancelCauseFunc
}

// New returns a worker that consumes from tr and dispatches to mux. The
// worker does not own tr: close it after Run returns.
func New(tr transport.Transport, mux *Mux, cfg Config) (*Worker, error) {
	if tr == nil {
		return nil, errors.New("worker: nil transport")
	}
	if mux == nil {
		return nil, errors.New("worker: nil mux")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	w := &Worker{
		tr:       tr,
		mux:      mux,
		cfg:      cfg,
		log:      cfg.Logger.With(zap.String("hostname", cfg.Hostname)),
		cold:     make(chan struct{}),
		active:   make(map[*activeTask]struct{}),
		totals:   make(map[string]int64),
		clock:    &clock{},
		revoked:  newRevokedSet(defaultRevokesMax, defaultRevokeExpires),
		shutdown: make(chan struct{}),
	}
	routes := make(map[string]string, len(cfg.Routes))
	for k, v := range cfg.Routes {
		routes[k] = v
	}
	for _, name := range mux.Names() {
		o, _ := mux.options(name)
		if o.Queue != "" {
			if _, ok := routes[name]; !ok {
				routes[name] = o.Queue
			}
		}
		if !o.globalRate.IsZero() && cfg.GlobalRateLimiter == nil {
			// Not an error, so that a single-process setup still runs, but
			// a cap that silently does nothing must show up in the log.
			w.log.Warn("task has a global rate limit but Config.GlobalRateLimiter is nil: the limit is not enforced",
				zap.String("task_name", name), zap.String("global_rate_limit", o.GlobalRateLimit))
		}
	}
	w.tracing = publish.NewTracing(cfg.TracerProvider, cfg.Propagator)
	w.producer = publish.New(tr, publish.Config{
		DefaultQueue:   cfg.DefaultQueue,
		Routes:         routes,
		Origin:         cfg.Hostname,
		TracerProvider: cfg.TracerProvider,
		Propagator:     cfg.Propagator,
	})
	w.events = newEvents(w, tr, w.clock)
	return w, nil
}

// requestShutdown starts a warm shutdown, as a SIGTERM would.
func (w *Worker) requestShutdown() { w.shutOnce.Do(func() { close(w.shutdown) }) }

// inLoop runs f on the loop goroutine and returns its result, or nil when
// the worker is not running.
func (w *Worker) inLoop(f func(*loop) any) any {
	w.mu.Lock()
	l := w.cur
	w.mu.Unlock()
	if l == nil {
		return nil
	}
	res := make(chan any, 1)
	if !l.call(func() { res <- f(l) }) {
		return nil
	}
	select {
	case r := <-res:
		return r
	case <-l.done:
		return nil
	}
}

func (w *Worker) concurrency() int {
	if n, ok := w.inLoop(func(l *loop) any { return l.concurrency }).(int); ok {
		return n
	}
	return w.cfg.Concurrency
}

// Hostname returns the worker's node name.
func (w *Worker) Hostname() string { return w.cfg.Hostname }

// Close requests a cold shutdown: running tasks' contexts are cancelled
// (cause ErrShutdown) at once, and Run returns after returning unstarted
// messages to the broker. It is what a second SIGTERM/SIGINT should do.
func (w *Worker) Close() error {
	w.closeOnce.Do(func() { close(w.cold) })
	return nil
}

// Run consumes and runs tasks until ctx is done, then shuts down
// gracefully: it stops fetching, returns held (ETA) and unstarted messages to
// the broker, waits up to Config.ShutdownTimeout for running tasks, cancels
// those still running and returns.
//
// It returns nil after a clean shutdown: every task that started ran to its
// end and was settled. When the shutdown timeout (or Close) cut running
// tasks short, it returns a *ShutdownError saying how many were cancelled
// and how many were still running when Run gave up on them, as
// http.Server.Shutdown reports connections it could not close. Run returns
// ErrWorkerClosed when called twice.
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return ErrWorkerClosed
	}
	w.startedAt = time.Now()
	w.settleBase, w.abortSettle = context.WithCancel(context.WithoutCancel(w.cfg.BaseContext()))
	defer w.abortSettle()
	cons, err := w.tr.Consume(ctx, w.cfg.queues(), transport.ConsumeOptions{Prefetch: w.cfg.prefetch(), PerQueuePrefetch: w.perQueue()})
	if err != nil {
		return fmt.Errorf("worker: consume %v: %w", w.cfg.Queues, err)
	}
	w.log.Info("worker ready",
		zap.Strings("queues", w.cfg.Queues),
		zap.Int("concurrency", w.cfg.Concurrency),
		zap.Int("prefetch", w.cfg.prefetch()),
		zap.Strings("tasks", w.mux.Names()))
	l := newLoop(w, cons)
	w.mu.Lock()
	w.cur = l
	w.mu.Unlock()
	w.events.start()
	var ctl *control
	if !w.cfg.WithoutControl {
		if ctl, err = w.startControl(ctx); err != nil {
			w.log.Error("remote control unavailable", zap.Error(err))
		}
	}
	err = l.run(ctx)
	if ctl != nil {
		ctl.close()
	}
	w.events.close()
	w.bg.Wait()
	w.mu.Lock()
	w.cur = nil
	w.mu.Unlock()
	return err
}

// perQueue says whether the prefetch window applies per queue: strict and
// weighted order choose among the queues, so what the worker holds must
// follow what it takes, not the broker's refill order.
func (w *Worker) perQueue() bool {
	return w.cfg.QueueOrder == QueueOrderStrict || w.cfg.QueueOrder == QueueOrderWeighted
}

func taskFields(m *protocol.TaskMessage, d *transport.Delivery) []zap.Field {
	return []zap.Field{
		zap.String("task_id", m.ID),
		zap.String("task_name", m.Name),
		zap.Int("retries", m.Retries),
		zap.String("queue", d.Queue),
	}
}
