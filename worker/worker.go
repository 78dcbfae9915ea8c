package worker

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
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
	bg       sync.WaitGroup // control and event goroutines
	shutdown chan struct{}  // remote shutdown request
	shutOnce sync.Once

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
	// Strict and weighted order choose among the queues, so what the worker
	// holds must follow what it takes, not the broker's refill order.
	perQueue := w.cfg.QueueOrder == QueueOrderStrict || w.cfg.QueueOrder == QueueOrderWeighted
	cons, err := w.tr.Consume(ctx, w.cfg.queues(), transport.ConsumeOptions{Prefetch: w.cfg.prefetch(), PerQueuePrefetch: perQueue})
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

// pending is a received task waiting to run: held for its ETA, or ready.
type pending struct {
	d        *transport.Delivery
	m        *protocol.TaskMessage
	h        Handler
	opts     TaskOptions
	due      time.Time
	seq      uint64
	queueIdx int
	index    int // in the ETA heap
	eta      bool
	stage    stage
	// tokenAt is when the task's global rate-limit token came due (zero:
	// no global limit); a task that starts much later re-reserves.
	tokenAt time.Time
}

// stage is how far a received task got on its way to the ready queue:
// countdown/ETA first, then the per-worker rate limit, then the global one.
type stage uint8

const (
	stageNew stage = iota
	stageETA
	stageLocalRate
	stageGlobalRate
)

// loop is the worker's single-threaded event loop: it owns the ready queue,
// the ETA heap and the concurrency count, so none of them needs a lock.
type loop struct {
	w        *Worker
	cons     transport.Consumer
	queueIdx map[string]int

	held    etaHeap
	ready   readyQueue
	running int
	seq     uint64

	heldETA     int
	prefetch    int
	prefetchSet int

	slotDone    chan *slot
	slots       []*slot // every pooled goroutine
	idle        []*slot // those waiting for a task
	poolWG      sync.WaitGroup
	concurrency int
	timer       *time.Timer
	// tasks counts running tasks and background settle work.
	tasks tally

	rates rateLimits
	// calls runs functions on the loop goroutine: results of background
	// work (global rate-limit reservations) and remote-control requests.
	calls chan func()
	done  chan struct{}
	// awaiting holds tasks whose global rate-limit reservation is in flight,
	// so that a shutdown can return them to the broker.
	awaiting map[*pending]struct{}
}

func newLoop(w *Worker, cons transport.Consumer) *loop {
	l := &loop{
		w:           w,
		cons:        cons,
		queueIdx:    make(map[string]int, len(w.cfg.Queues)),
		slotDone:    make(chan *slot),
		concurrency: w.cfg.Concurrency,
		prefetch:    w.cfg.prefetch(),
		prefetchSet: w.cfg.prefetch(),
		calls:       make(chan func()),
		done:        make(chan struct{}),
		awaiting:    make(map[*pending]struct{}),
	}
	for i, q := range w.cfg.Queues {
		l.queueIdx[q] = i
	}
	l.ready.init(len(w.cfg.Queues), w.cfg.QueueOrder, w.cfg.weights())
	return l
}

func (l *loop) run(ctx context.Context) error {
	deliveries := l.cons.Deliveries()
	var consumeErr error
	for {
		l.dispatch()
		l.applyPrefetch(ctx)
		select {
		case d, ok := <-deliveries:
			if !ok {
				consumeErr = l.cons.Err()
				if consumeErr == nil {
					consumeErr = errors.New("worker: consumer stopped")
				}
				l.w.log.Error("consumer closed; shutting down", zap.Error(consumeErr))
				return errors.Join(consumeErr, l.shutdown(false))
			}
			l.receive(ctx, d)
		case <-l.timerC():
			l.timer = nil
			l.promote(time.Now())
		case s := <-l.slotDone:
			l.running--
			l.idle = append(l.idle, s)
		case f := <-l.calls:
			f()
		case <-ctx.Done():
			return l.shutdown(false)
		case <-l.w.shutdown:
			return l.shutdown(false)
		case <-l.w.cold:
			return l.shutdown(true)
		}
	}
}

func (l *loop) timerC() <-chan time.Time {
	if len(l.held) == 0 {
		if l.timer != nil {
			l.timer.Stop()
			l.timer = nil
		}
		return nil
	}
	next := l.held[0].due
	if l.timer == nil {
		l.timer = time.NewTimer(time.Until(next))
	} else {
		l.timer.Reset(time.Until(next))
	}
	return l.timer.C
}

// receive decodes and classifies one delivery.
func (l *loop) receive(ctx context.Context, d *transport.Delivery) {
	w := l.w
	m, err := protocol.DecodeTask(&d.Message, protocol.DecodeOptions{
		Accept:      w.cfg.Accept,
		MaxBodySize: w.cfg.MaxMessageSize,
		MaxDepth:    w.cfg.MaxNestingDepth,
	})
	if err != nil {
		l.background(func() { w.rejectInvalid(d, err) })
		return
	}
	h, opts, ok := w.mux.lookup(m.Name)
	if !ok {
		h, opts, ok = w.builtin(m.Name)
	}
	if !ok {
		l.background(func() { w.rejectUnknown(d, m) })
		return
	}
	now := time.Now()
	w.cfg.Observer.TaskReceived(m.Name)
	if w.events.taskOn() {
		w.events.task("task-received", taskReceivedFields(m))
	}
	if w.revoked.contains(now, m.ID) {
		l.background(func() { w.revoke(d, m, "revoked") })
		return
	}
	if !m.Expires.IsZero() && now.After(m.Expires) {
		l.background(func() { w.revoke(d, m, "expired") })
		return
	}
	l.seq++
	p := &pending{d: d, m: m, h: h, opts: opts, seq: l.seq, queueIdx: l.queueIdx[d.Queue]}
	l.advance(ctx, p, now)
}

// advance moves a task through its stages: held until its ETA, then until
// its per-worker rate limit allows it, then until the global rate limit
// does, then ready. Waiting never takes a concurrency slot.
func (l *loop) advance(ctx context.Context, p *pending, now time.Time) {
	w := l.w
	if p.stage < stageETA {
		p.stage = stageETA
		if eta := p.m.ETA; !eta.IsZero() && eta.After(now) {
			p.eta = true
			l.heldETA++
			l.wantPrefetch()
			due := eta
			if exp := p.m.Expires; !exp.IsZero() && exp.Before(eta) {
				// It will expire before it may run: wake up at the expiry to
				// report REVOKED then, not at the ETA.
				due = exp
			}
			l.hold(p, due)
			w.cfg.Observer.TaskWaiting(p.m.Name, WaitETA, eta.Sub(now))
			w.log.Debug("task held until eta", taskFields(p.m, p.d)...)
			return
		}
	}
	if p.stage < stageLocalRate {
		p.stage = stageLocalRate
		if rate := p.opts.rate; !rate.IsZero() {
			if at := l.rates.reserve(p.m.Name, rate, now); at.After(now) {
				l.hold(p, at)
				w.cfg.Observer.TaskWaiting(p.m.Name, WaitRateLimit, at.Sub(now))
				w.log.Debug("task waits for its rate limit", append(taskFields(p.m, p.d),
					zap.String("rate_limit", rate.String()), zap.Duration("wait", at.Sub(now)))...)
				return
			}
		}
	}
	if p.stage < stageGlobalRate {
		p.stage = stageGlobalRate
		if rate := p.opts.globalRate; !rate.IsZero() && w.cfg.GlobalRateLimiter != nil {
			l.reserveGlobal(ctx, p, rate)
			return
		}
	}
	l.ready.push(p)
}

func (l *loop) hold(p *pending, due time.Time) {
	p.due = due
	heap.Push(&l.held, p)
}

// reserveGlobal asks the shared limiter for a token off the loop and comes
// back to the loop with the answer.
func (l *loop) reserveGlobal(ctx context.Context, p *pending, rate Rate) {
	w := l.w
	key := p.opts.GlobalRateKey
	if key == "" {
		key = p.m.Name
	}
	burst := max(p.opts.GlobalRateBurst, 1)
	l.awaiting[p] = struct{}{}
	l.background(func() {
		wait, err := w.cfg.GlobalRateLimiter.Reserve(ctx, key, rate.N, rate.Per, burst)
		l.call(func() {
			if _, ok := l.awaiting[p]; !ok {
				return // returned to the broker by a shutdown
			}
			delete(l.awaiting, p)
			now := time.Now()
			if err != nil {
				// Fail open, loudly: a limiter outage must not stop the
				// worker, and the per-worker limit still applies.
				w.log.Error("global rate limiter unavailable; running the task without it",
					append(taskFields(p.m, p.d), zap.String("key", key), zap.Error(err))...)
				l.ready.push(p)
				return
			}
			p.tokenAt = now.Add(wait)
			if wait > 0 {
				w.cfg.Observer.TaskWaiting(p.m.Name, WaitGlobalRate, wait)
				w.log.Debug("task waits for its global rate limit", append(taskFields(p.m, p.d),
					zap.String("key", key), zap.Duration("wait", wait))...)
				l.hold(p, p.tokenAt)
				return
			}
			l.ready.push(p)
		})
	})
}

// call runs f on the loop goroutine, unless the loop has exited.
func (l *loop) call(f func()) bool {
	select {
	case l.calls <- f:
		return true
	case <-l.done:
		return false
	}
}

// promote moves held tasks that are due on to their next stage.
func (l *loop) promote(now time.Time) {
	for len(l.held) > 0 && !l.held[0].due.After(now) {
		p := heap.Pop(&l.held).(*pending)
		if p.eta {
			l.heldETA--
			p.eta = false
			l.wantPrefetch()
		}
		if exp := p.m.Expires; !exp.IsZero() && now.After(exp) {
			l.background(func() { l.w.revoke(p.d, p.m, "expired") })
			continue
		}
		if l.w.revoked.contains(now, p.m.ID) {
			l.background(func() { l.w.revoke(p.d, p.m, "revoked") })
			continue
		}
		l.advance(context.Background(), p, now)
	}
}

// wantPrefetch recomputes the prefetch Celery's way: one more per held ETA
// task, up to ETATaskLimit.
func (l *loop) wantPrefetch() {
	base := l.w.cfg.prefetch()
	if base == 0 {
		return
	}
	extra := l.heldETA
	if lim := l.w.cfg.ETATaskLimit; lim > 0 && extra > lim {
		extra = lim
	}
	l.prefetch = base + extra
}

// applyPrefetch sends the prefetch to the broker when it changed; changes
// are coalesced over one loop iteration, like Celery's lazy QoS updates.
func (l *loop) applyPrefetch(ctx context.Context) {
	if l.prefetch == l.prefetchSet {
		return
	}
	if err := l.cons.SetPrefetch(l.prefetch); err != nil {
		l.w.log.Warn("cannot change prefetch", zap.Int("prefetch", l.prefetch), zap.Error(err))
		return
	}
	l.prefetchSet = l.prefetch
}

// minStaleToken is the least lateness that makes a global token stale (see
// staleToken); below it, scheduling noise would waste tokens.
const minStaleToken = 50 * time.Millisecond

// staleToken reports whether p's global rate-limit token is too old to
// start on. The limiter spaces tokens, not starts: a task that could not
// start when its token came due (every slot busy, or the process stalled)
// would start together with the tasks whose tokens came due meanwhile, and
// that bunch breaks the cap. A task later than one token interval takes a
// new token instead, so that in any window the starts exceed the rate by
// at most the burst plus one token.
func (l *loop) staleToken(p *pending, now time.Time) bool {
	if p.tokenAt.IsZero() {
		return false
	}
	return now.Sub(p.tokenAt) > max(p.opts.globalRate.Interval(), minStaleToken)
}

// dispatch starts ready tasks while slots are free.
//
// Tasks run on a pool of long-lived goroutines, one per slot in use, that
// go back to the pool when their task ends: a fresh goroutine per task
// would grow (copy) its stack through the deep execute path every time.
func (l *loop) dispatch() {
	var now time.Time
	for l.running < l.concurrency {
		p := l.ready.pop()
		if p == nil {
			return
		}
		if now.IsZero() {
			now = time.Now()
		}
		if l.staleToken(p, now) {
			if ce := l.w.log.Check(zap.DebugLevel, "global rate-limit token went stale before the task could start; reserving again"); ce != nil {
				ce.Write(append(taskFields(p.m, p.d), zap.Duration("late", now.Sub(p.tokenAt)))...)
			}
			p.tokenAt = time.Time{}
			l.reserveGlobal(context.Background(), p, p.opts.globalRate)
			continue
		}
		l.running++
		l.tasks.add()
		var s *slot
		if n := len(l.idle); n > 0 {
			s, l.idle = l.idle[n-1], l.idle[:n-1]
		} else {
			s = &slot{work: make(chan *pending, 1)}
			l.slots = append(l.slots, s)
			l.poolWG.Add(1)
			go l.serve(s)
		}
		s.work <- p
	}
}

// slot is a pooled task goroutine.
type slot struct {
	work chan *pending
}

func (l *loop) serve(s *slot) {
	defer l.poolWG.Done()
	for p := range s.work {
		l.w.execute(p)
		l.tasks.done()
		// Once the loop has stopped (shutdown) nobody takes the slot back:
		// wait for the pool to close instead, however many slots there are.
		select {
		case l.slotDone <- s:
		case <-l.done:
		}
	}
}

// closePool ends the pooled goroutines and, when no task is left running,
// waits for them, so that none outlives Run; a goroutine still stuck in an
// abandoned handler exits when that handler returns.
func (l *loop) closePool() {
	for _, s := range l.slots {
		close(s.work)
	}
	l.slots, l.idle = nil, nil
	select {
	case <-l.tasks.idle():
		l.poolWG.Wait()
	default:
	}
}

// dropRevoked removes revoked tasks from the ETA heap and the ready queue
// at once, storing REVOKED, so a client sees the revoke without waiting for
// the task's ETA.
func (l *loop) dropRevoked() {
	now := time.Now()
	var drop []*pending
	kept := l.held[:0]
	for _, p := range l.held {
		if l.w.revoked.contains(now, p.m.ID) {
			drop = append(drop, p)
			if p.eta {
				l.heldETA--
			}
			continue
		}
		kept = append(kept, p)
	}
	l.held = kept
	heap.Init(&l.held)
	for i, q := range l.ready.qs {
		keptQ := q[:0]
		for _, p := range q {
			if l.w.revoked.contains(now, p.m.ID) {
				drop = append(drop, p)
				l.ready.n--
				continue
			}
			keptQ = append(keptQ, p)
		}
		l.ready.qs[i] = keptQ
	}
	l.wantPrefetch()
	for _, p := range drop {
		p := p
		l.background(func() { l.w.revoke(p.d, p.m, "revoked") })
	}
}

// addQueue starts consuming another queue (add_consumer).
func (l *loop) addQueue(name string) error {
	// The consumer, not queueIdx, says what is consumed: a queue cancelled
	// with cancel_consumer keeps its index (tasks of it may still be
	// ready) and must be consumed again when it is added back.
	if slices.ContainsFunc(l.cons.Queues(), func(q transport.Queue) bool { return q.Name == name }) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.cons.AddQueue(ctx, l.w.cfg.queue(name)); err != nil {
		return err
	}
	if _, ok := l.queueIdx[name]; ok {
		return nil
	}
	l.queueIdx[name] = len(l.ready.qs)
	l.ready.qs = append(l.ready.qs, nil)
	l.ready.weights = append(l.ready.weights, max(1, l.w.cfg.QueueWeights[name]))
	l.ready.current = append(l.ready.current, 0)
	return nil
}

// cancelQueue stops consuming a queue (cancel_consumer). Tasks already
// received from it still run.
func (l *loop) cancelQueue(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return l.cons.CancelQueue(ctx, name)
}

// background runs settle-only work (invalid, unknown, expired messages) off
// the loop. The prefetch bound limits how many can be in flight.
func (l *loop) background(f func()) {
	l.tasks.add()
	go func() {
		defer l.tasks.done()
		f()
	}()
}

// shutdown stops fetching, returns what has not started to the broker and
// waits for running tasks: up to ShutdownTimeout (not at all when cold),
// then it cancels them and waits abandonGrace more, then gives up on what
// still runs.
func (l *loop) shutdown(cold bool) error {
	// Nothing is dispatched from here on: the pooled goroutines go as soon
	// as their current task ends, and Run waits for them unless it gave up
	// on a task (whose slot ends when its handler returns).
	defer l.closePool()
	w := l.w
	w.log.Info("worker shutting down", zap.Bool("cold", cold), zap.Int("running", l.running),
		zap.Int("held", len(l.held)), zap.Int("ready", l.ready.len()))
	// One budget for stopping and for returning every unstarted message:
	// this step starts now, whatever ran before.
	sctx, cancel := w.settleCtx()
	defer cancel()
	if err := l.cons.Stop(sctx); err != nil {
		w.log.Warn("stopping the consumer", zap.Error(err))
	}
	var requeue []*transport.Delivery
	// Deliveries already handed to the channel before Stop are ours too.
	for d := range l.cons.Deliveries() {
		requeue = append(requeue, d)
	}
	for _, p := range l.held {
		requeue = append(requeue, p.d)
	}
	l.held = nil
	for p := range l.awaiting {
		requeue = append(requeue, p.d)
	}
	clear(l.awaiting)
	close(l.done)
	for p := l.ready.pop(); p != nil; p = l.ready.pop() {
		requeue = append(requeue, p.d)
	}
	returned := 0
	for _, d := range requeue {
		if err := persistWithin(sctx, func(ctx context.Context) error { return d.Reject(ctx, true) }); err != nil {
			id, _ := d.Message.Headers["id"].(string)
			w.log.Warn("returning a message to the broker failed; the broker will deliver it again",
				zap.String("task_id", id), zap.String("delivery_tag", d.Tag), zap.Error(err))
			continue
		}
		returned++
	}
	if len(requeue) > 0 {
		w.log.Info("returned unstarted messages to the broker", zap.Int("count", returned), zap.Int("failed", len(requeue)-returned))
	}
	if l.timer != nil {
		l.timer.Stop()
	}

	grace := w.cfg.ShutdownTimeout
	if cold {
		grace = 0
	}
	if l.idleWithin(grace, w.cold) {
		return nil
	}
	cancelled := w.cancelActive(ErrShutdown)
	w.log.Warn("shutdown: cancelled running tasks", zap.Int("count", cancelled), zap.Bool("cold", cold))
	// Handlers that honour ctx return promptly; give them a moment.
	if !l.idleWithin(abandonGrace, nil) {
		// Give up on what still runs: settle steps in flight stop at once
		// (their acks_late messages stay unacknowledged and come back from
		// the broker), and a handler that ignores its context is left to
		// itself, its outcome unrecorded.
		w.markAbandoned()
		w.abortSettle()
		l.idleWithin(abandonGrace, nil)
	}
	abandoned := w.handlers.count()
	if abandoned > 0 {
		w.log.Error("shutdown: tasks still running after cancellation; abandoning them", zap.Int("count", abandoned))
	}
	return &ShutdownError{Cancelled: cancelled, Abandoned: abandoned}
}

// abandonGrace is how long a shutdown waits for cancelled tasks to return.
const abandonGrace = 5 * time.Second

// idleWithin waits until no task runs and no handler call is left, for at
// most d or until stop is closed, and reports whether that happened.
func (l *loop) idleWithin(d time.Duration, stop <-chan struct{}) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-l.tasks.idle():
		case <-timer.C:
			return false
		case <-stop:
			return false
		}
		select {
		case <-l.w.handlers.idle():
			return true
		case <-timer.C:
			return false
		case <-stop:
			return false
		}
	}
}

// cancelActive cancels every running task's context and returns how many
// runs there were.
func (w *Worker) cancelActive(cause error) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	for a := range w.active {
		a.cancel(cause)
	}
	return len(w.active)
}

// markAbandoned flags every run still active as given up on by Run.
func (w *Worker) markAbandoned() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for a := range w.active {
		a.abandoned.Store(true)
	}
}

// tally counts work in progress and tells when there is none, so that a
// shutdown can wait for it with a deadline (a WaitGroup cannot be waited on
// with one without a goroutine that outlives the wait).
type tally struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed while n == 0
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (t *tally) add() {
	t.mu.Lock()
	if t.n == 0 {
		t.zero = make(chan struct{})
	}
	t.n++
	t.mu.Unlock()
}

func (t *tally) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 {
		close(t.zero)
	}
	t.mu.Unlock()
}

// idle returns a channel that is closed once nothing is in progress. It
// may be closed already; a later add does not reopen it.
func (t *tally) idle() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		return closedChan
	}
	return t.zero
}

func (t *tally) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// etaHeap orders held tasks by due time, then arrival.
type etaHeap []*pending

func (h etaHeap) Len() int { return len(h) }
func (h etaHeap) Less(i, j int) bool {
	if h[i].due.Equal(h[j].due) {
		return h[i].seq < h[j].seq
	}
	return h[i].due.Before(h[j].due)
}
func (h etaHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *etaHeap) Push(x any) {
	p := x.(*pending)
	p.index = len(*h)
	*h = append(*h, p)
}
func (h *etaHeap) Pop() any {
	old := *h
	n := len(old)
	p := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	p.index = -1
	return p
}

// readyQueue holds tasks ready to run, one FIFO per consumed queue. pop
// picks the queue by the configured order: the oldest task overall (Celery's
// behaviour), the first queue with work (strict), or smooth weighted
// round-robin between queues with work (weighted).
type readyQueue struct {
	qs      [][]*pending
	n       int
	order   QueueOrder
	weights []int
	current []int // smooth weighted round-robin state
}

func (r *readyQueue) init(n int, order QueueOrder, weights []int) {
	if n < 1 {
		n = 1
	}
	r.qs = make([][]*pending, n)
	r.order = order
	r.weights = make([]int, n)
	r.current = make([]int, n)
	for i := range r.weights {
		r.weights[i] = 1
		if i < len(weights) && weights[i] > 0 {
			r.weights[i] = weights[i]
		}
	}
}

func (r *readyQueue) len() int { return r.n }

func (r *readyQueue) push(p *pending) {
	i := p.queueIdx
	if i < 0 || i >= len(r.qs) {
		i = 0
	}
	r.qs[i] = append(r.qs[i], p)
	r.n++
}

func (r *readyQueue) pop() *pending {
	if r.n == 0 {
		return nil
	}
	best := -1
	switch r.order {
	case QueueOrderStrict:
		for i, q := range r.qs {
			if len(q) > 0 {
				best = i
				break
			}
		}
	case QueueOrderWeighted:
		total := 0
		for i, q := range r.qs {
			if len(q) == 0 {
				continue
			}
			r.current[i] += r.weights[i]
			total += r.weights[i]
			if best < 0 || r.current[i] > r.current[best] {
				best = i
			}
		}
		r.current[best] -= total
	default:
		for i, q := range r.qs {
			if len(q) > 0 && (best < 0 || q[0].seq < r.qs[best][0].seq) {
				best = i
			}
		}
	}
	q := r.qs[best]
	p := q[0]
	q[0] = nil
	r.qs[best] = q[1:]
	if len(r.qs[best]) == 0 {
		r.qs[best] = q[:0:0]
	}
	r.n--
	return p
}

func taskFields(m *protocol.TaskMessage, d *transport.Delivery) []zap.Field {
	return []zap.Field{
		zap.String("task_id", m.ID),
		zap.String("task_name", m.Name),
		zap.Int("retries", m.Retries),
		zap.String("queue", d.Queue),
	}
}
