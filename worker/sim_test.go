package worker_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/backendtest"
	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/transport/transporttest"
	"github.com/celeriac/celeriac/worker"
)

// The simulation runs the worker core against generated schedules in a
// synctest bubble: virtual time makes a 2-hour task instant, and a schedule
// is a pure function of its seed, so any failure replays exactly with
//
//	go test ./worker -run TestSimulation -seed N
//
// Each schedule mixes task lengths from 1 ms to 2 h and every outcome
// (success, error, automatic and explicit retry, panic, soft and hard time
// limits, ignore_result, Reject, revoke before start and revoke with
// terminate, handlers that ignore their context), early and late acks, ETA
// tasks, a second delivery of an id while it runs, broker and backend
// faults, pools of 1 to 5 000 slots, and a warm or cold shutdown at a random
// instant. After Run returns the invariants of checkSim must hold.
var (
	simSeed      = flag.Uint64("seed", 0, "TestSimulation: replay only this schedule")
	simSchedules = flag.Int("schedules", 0, "TestSimulation: how many schedules (default 1000, CI runs 10000; 500 with -short)")
)

func TestSimulation(t *testing.T) {
	if *simSeed != 0 {
		runSim(t, *simSeed)
		return
	}
	n := *simSchedules
	if n == 0 {
		n = 1000
		if testing.Short() {
			n = 500
		}
	}
	if env := os.Getenv("CELERIAC_SIM_SCHEDULES"); env != "" && *simSchedules == 0 {
		fmt.Sscan(env, &n)
	}
	base := uint64(time.Now().UnixNano())
	if env := os.Getenv("CELERIAC_SIM_BASE"); env != "" {
		fmt.Sscan(env, &base)
	}
	start := time.Now()
	failed := 0
	for i := 0; i < n && failed < 3; i++ {
		seed := base + uint64(i)
		if seed == 0 {
			continue
		}
		began := time.Now()
		ok := t.Run(fmt.Sprint(seed), func(t *testing.T) { runSim(t, seed) })
		if d := time.Since(began); d > 500*time.Millisecond && testing.Verbose() {
			t.Logf("slow schedule %d: %v", seed, d)
		}
		if !ok {
			failed++
			t.Errorf("schedule %d failed; replay: go test ./worker -run TestSimulation -seed=%d -v", seed, seed)
		}
	}
	t.Logf("SIMULATION: %d schedules (seeds %d..%d) in %v: %s", n, base, base+uint64(n)-1,
		time.Since(start).Round(time.Millisecond), simTotals.String())
}

// simOutcome is what a task's handler does.
type simOutcome int

const (
	simSucceed       simOutcome = iota
	simError                    // a permanent error: FAILURE
	simAutoRetry                // errors that autoretry_for retries, then succeeds
	simExplicitRetry            // retry.After with a countdown, then succeeds
	simPanic
	simSoftLimit  // runs past its soft time limit, honours ctx
	simHardLimit  // runs past its hard time limit, ignores ctx
	simIgnore     // succeeds with ignore_result
	simReject     // Reject(requeue) on the first delivery, then succeeds
	simRejectDead // Reject without requeue: dead-lettered
	simStubborn   // succeeds, ignoring its context throughout
	simOutcomes
)

var simOutcomeNames = [...]string{"succeed", "error", "autoretry", "explicit-retry", "panic", "soft-limit",
	"hard-limit", "ignore-result", "reject-requeue", "reject-dead", "stubborn"}

type simTask struct {
	id        string
	outcome   simOutcome
	dur       time.Duration
	acksLate  bool
	countdown time.Duration // ETA, when > 0
	sendAt    time.Duration
	duplicate time.Duration // a second delivery of the id this long after the first (0: none)
	revokeAt  time.Duration // a revoke this long after sending (0: none)
	terminate bool
}

type simSchedule struct {
	seed        uint64
	concurrency int
	acksLate    bool
	shutdownAt  time.Duration
	cold        bool
	graceTime   time.Duration
	tasks       []simTask
	// faults
	backendDown  [2]time.Duration // [from, to) offsets of a backend outage
	publishDown  [2]time.Duration // [from, to) the broker refuses publishes
	ackFailures  int              // the next n acks/rejects fail
	dropConnAt   time.Duration    // lose the connection at (0: never)
	invalidCount int              // undecodable messages among the tasks
}

// durationBetween picks a duration log-uniformly in [lo, hi].
func durationBetween(r *rand.Rand, lo, hi time.Duration) time.Duration {
	l, h := math.Log(float64(lo)), math.Log(float64(hi))
	return time.Duration(math.Exp(l + r.Float64()*(h-l)))
}

func genSchedule(seed uint64) simSchedule {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := simSchedule{seed: seed, acksLate: r.IntN(2) == 0}
	switch x := r.IntN(20); {
	case x == 0:
		s.concurrency = 1025 + r.IntN(4000)
	case x == 1:
		s.concurrency = 5000
	case x < 6:
		s.concurrency = 1
	default:
		s.concurrency = 1 + r.IntN(16)
	}
	n := 1 + r.IntN(12)
	var horizon time.Duration
	for i := 0; i < n; i++ {
		tk := simTask{
			id:      fmt.Sprintf("sim-%d-%d", seed, i),
			outcome: simOutcome(r.IntN(int(simOutcomes))),
			dur:     durationBetween(r, time.Millisecond, 2*time.Hour),
			sendAt:  time.Duration(r.Int64N(int64(time.Minute))),
		}
		tk.acksLate = s.acksLate
		if r.IntN(4) == 0 {
			tk.acksLate = !tk.acksLate
		}
		if r.IntN(5) == 0 {
			tk.countdown = durationBetween(r, time.Second, time.Hour)
		}
		if r.IntN(6) == 0 {
			tk.duplicate = durationBetween(r, time.Millisecond, tk.dur+time.Second)
		}
		if r.IntN(8) == 0 {
			tk.revokeAt = durationBetween(r, time.Millisecond, tk.countdown+tk.dur+time.Second)
			tk.terminate = r.IntN(2) == 0
		}
		horizon = max(horizon, tk.sendAt+tk.countdown+tk.dur)
		s.tasks = append(s.tasks, tk)
	}
	s.invalidCount = r.IntN(3) / 2
	// The shutdown comes anywhere from the start to a little past the
	// natural end of everything.
	s.shutdownAt = time.Duration(r.Int64N(int64(horizon + horizon/4 + time.Second)))
	s.cold = r.IntN(4) == 0
	s.graceTime = durationBetween(r, time.Second, 2*time.Hour)
	if r.IntN(4) == 0 {
		from := time.Duration(r.Int64N(int64(horizon + time.Second)))
		s.backendDown = [2]time.Duration{from, from + durationBetween(r, time.Second, 2*time.Minute)}
	}
	if r.IntN(5) == 0 {
		from := time.Duration(r.Int64N(int64(horizon + time.Second)))
		s.publishDown = [2]time.Duration{from, from + durationBetween(r, time.Second, 2*time.Minute)}
	}
	if r.IntN(5) == 0 {
		s.ackFailures = 1 + r.IntN(3)
	}
	if r.IntN(8) == 0 {
		s.dropConnAt = time.Duration(r.Int64N(int64(horizon + time.Second)))
	}
	return s
}

func (s simSchedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: concurrency %d, acks_late %t, shutdown at %v (cold %t, timeout %v)",
		s.seed, s.concurrency, s.acksLate, s.shutdownAt, s.cold, s.graceTime)
	if s.backendDown[1] > 0 {
		fmt.Fprintf(&b, ", backend down %v..%v", s.backendDown[0], s.backendDown[1])
	}
	if s.publishDown[1] > 0 {
		fmt.Fprintf(&b, ", publishes refused %v..%v", s.publishDown[0], s.publishDown[1])
	}
	if s.ackFailures > 0 {
		fmt.Fprintf(&b, ", %d failing settles", s.ackFailures)
	}
	if s.dropConnAt > 0 {
		fmt.Fprintf(&b, ", connection lost at %v", s.dropConnAt)
	}
	for _, tk := range s.tasks {
		fmt.Fprintf(&b, "\n  %s %s %v acks_late=%t send@%v", tk.id, simOutcomeNames[tk.outcome], tk.dur, tk.acksLate, tk.sendAt)
		if tk.countdown > 0 {
			fmt.Fprintf(&b, " countdown=%v", tk.countdown)
		}
		if tk.duplicate > 0 {
			fmt.Fprintf(&b, " duplicate+%v", tk.duplicate)
		}
		if tk.revokeAt > 0 {
			fmt.Fprintf(&b, " revoke+%v terminate=%t", tk.revokeAt, tk.terminate)
		}
	}
	return b.String()
}

// simRecord is what the handlers, the ledger and the observer saw.
type simRecord struct {
	mu        sync.Mutex
	running   int
	calls     int
	completed map[string][]simOutcome // handler returns, by id, that nothing interrupted
	startedAt []time.Time
	runEnded  time.Time // when Run returned (zero before)
}

func runSim(t *testing.T, seed uint64) {
	s := genSchedule(seed)
	synctest.Test(t, func(t *testing.T) {
		checkSim(t, s)
	})
}

func checkSim(t *testing.T, s simSchedule) {
	defer func() {
		if t.Failed() {
			t.Logf("schedule:\n%s", s)
		}
	}()
	epoch := time.Now()
	byID := map[string]*simTask{}
	for i := range s.tasks {
		byID[s.tasks[i].id] = &s.tasks[i]
	}
	rec := &simRecord{completed: map[string][]simOutcome{}}
	obs := &simObserver{}
	core, logs := observer.New(zapcore.InfoLevel)

	mt := memory.New(memory.Config{})
	faulty := transporttest.NewFaulty(mt)
	led := newLedger(faulty)
	mb := membackend.New()
	fb := backendtest.NewFaulty(mb)
	be := fb.Chords().(backend.Backend)
	defer led.Close()
	defer mb.Close()

	within := func(w [2]time.Duration) bool {
		off := time.Since(epoch)
		return w[1] > 0 && off >= w[0] && off < w[1]
	}
	fb.SetFault(func(backendtest.Call) error {
		if within(s.backendDown) {
			return errors.New("sim: backend down")
		}
		return nil
	})
	var ackFailures atomic.Int32
	ackFailures.Store(int32(s.ackFailures))
	settleFault := func(transporttest.Call) error {
		if ackFailures.Add(-1) >= 0 {
			return errors.New("sim: settle refused")
		}
		return nil
	}
	faulty.SetFault(transporttest.OpAck, settleFault)
	faulty.SetFault(transporttest.OpReject, settleFault)
	faulty.SetFault(transporttest.OpDeadLetter, settleFault)
	faulty.SetFault(transporttest.OpPublish, func(c transporttest.Call) error {
		if c.Publishing.RoutingKey == "sim" && within(s.publishDown) {
			return errors.New("sim: publish refused")
		}
		return nil
	})

	mux := worker.NewMux()
	handler := func(ctx context.Context, tk *worker.Task) (any, error) {
		st := byID[tk.ID]
		rec.mu.Lock()
		rec.running++
		rec.calls++
		rec.startedAt = append(rec.startedAt, time.Now())
		rec.mu.Unlock()
		interrupted := false
		defer func() {
			rec.mu.Lock()
			rec.running--
			if !interrupted {
				rec.completed[tk.ID] = append(rec.completed[tk.ID], st.outcome)
			}
			rec.mu.Unlock()
		}()
		sleep := func(d time.Duration, honour bool) error {
			if !honour {
				time.Sleep(d)
				return nil
			}
			timer := time.NewTimer(d)
			defer timer.Stop()
			select {
			case <-timer.C:
				return nil
			case <-ctx.Done():
				if c := context.Cause(ctx); errors.Is(c, worker.ErrShutdown) || errors.Is(c, worker.ErrRevoked) || errors.Is(c, worker.ErrTimeLimitExceeded) {
					interrupted = true
				}
				return ctx.Err()
			}
		}
		honour := st.outcome != simHardLimit && st.outcome != simStubborn
		if err := sleep(st.dur, honour); err != nil {
			return nil, err
		}
		switch st.outcome {
		case simError:
			return nil, retry.Skip(errors.New("sim: permanent failure"))
		case simAutoRetry:
			if tk.Retries < 2 {
				return nil, errSimTransient
			}
		case simExplicitRetry:
			if tk.Retries == 0 {
				return nil, retry.After(time.Duration(1+len(tk.ID)%7)*time.Second, errors.New("sim: later"))
			}
		case simPanic:
			panic("sim: panic")
		case simReject:
			if !tk.DeliveryInfo.Redelivered && tk.Retries == 0 {
				return nil, worker.Reject(errors.New("sim: not now"), true)
			}
		case simRejectDead:
			return nil, worker.Reject(errors.New("sim: never"), false)
		}
		return "ok", nil
	}
	autoRetry := retry.Policy{AutoRetryFor: []retry.Matcher{retry.On(errSimTransient)}, MaxRetries: retry.Limited(3)}
	mux.HandleFunc("sim.early", handler, worker.Retry(autoRetry), worker.AcksLate(false))
	mux.HandleFunc("sim.late", handler, worker.Retry(autoRetry), worker.AcksLate(true))

	cfg := worker.Config{
		Queues:          []string{"sim"},
		Concurrency:     s.concurrency,
		AcksLate:        s.acksLate,
		Backend:         be,
		ShutdownTimeout: s.graceTime,
		Logger:          zap.New(core),
		Observer:        obs,
		Hostname:        "sim@test",
		// Heartbeats every 2 s of a 2-hour virtual schedule would read
		// /proc/loadavg thousands of times; they are not under test here.
		WithoutHeartbeat: true,
	}
	w, err := worker.New(led, mux, cfg)
	if err != nil {
		t.Fatal(err)
	}
	prod := client.New(mt, client.Config{DefaultQueue: "sim"})
	ctrl := client.NewControl(mt)
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() {
		err := w.Run(ctx)
		rec.mu.Lock()
		rec.runEnded = time.Now()
		abandonedAtReturn := rec.running
		rec.mu.Unlock()
		obs.abandonedAtReturn.Store(int32(abandonedAtReturn))
		obs.runReturned.Store(true)
		runDone <- err
	}()

	// The schedule's events, each in its own goroutine at its virtual time.
	var events sync.WaitGroup
	at := func(d time.Duration, f func()) {
		events.Go(func() {
			time.Sleep(d)
			f()
		})
	}
	for i := range s.tasks {
		tk := &s.tasks[i]
		send := func() {
			opts := []client.SendOption{client.TaskID(tk.id)}
			if tk.countdown > 0 {
				opts = append(opts, client.Countdown(tk.countdown))
			}
			switch tk.outcome {
			case simSoftLimit:
				opts = append(opts, client.TimeLimit(0, tk.dur/2+time.Millisecond))
			case simHardLimit:
				opts = append(opts, client.TimeLimit(tk.dur/2+time.Millisecond, 0))
			case simIgnore:
				opts = append(opts, client.IgnoreResult(true))
			}
			name := "sim.early"
			if tk.acksLate {
				name = "sim.late"
			}
			// Publishing straight to the memory transport: the producer's
			// side is not under test and must not see the faults.
			if _, err := prod.Send(context.Background(), name, nil, nil, opts...); err != nil {
				t.Errorf("send %s: %v", tk.id, err)
			}
		}
		at(tk.sendAt, send)
		if tk.duplicate > 0 {
			at(tk.sendAt+tk.countdown+tk.duplicate, send)
		}
		if tk.revokeAt > 0 {
			at(tk.sendAt+tk.revokeAt, func() {
				_ = ctrl.Cast(context.Background(), "revoke", map[string]any{"task_id": tk.id, "terminate": tk.terminate}, client.ControlOptions{})
			})
		}
	}
	for i := 0; i < s.invalidCount; i++ {
		at(time.Duration(i)*time.Second, func() {
			_ = mt.Publish(context.Background(), &transport.Publishing{RoutingKey: "sim", Message: protocol.Message{
				ContentType: "application/json", ContentEncoding: "utf-8",
				Headers: map[string]any{"id": fmt.Sprintf("sim-%d-bad-%d", s.seed, i), "task": "sim.early"},
				Body:    []byte("{not json"),
			}})
		})
	}
	if s.dropConnAt > 0 {
		at(s.dropConnAt, func() { faulty.DropConnection(context.Background()) })
	}
	at(s.shutdownAt, func() {
		cancel()
		if s.cold {
			w.Close()
		}
	})
	events.Wait()
	err = <-runDone
	cancel()

	// Run has returned. Let every abandoned handler end (virtual time), so
	// the bubble empties; nothing the worker owns may act any more.
	callsAtReturn := rec.calls
	ledgerAtReturn := led.snapshot()
	time.Sleep(3 * time.Hour)
	synctest.Wait()

	// Invariant: nothing runs after Run returns, and Run says so when
	// something did.
	abandoned := int(obs.abandonedAtReturn.Load())
	var se *worker.ShutdownError
	switch {
	case err == nil:
		if abandoned != 0 {
			t.Errorf("Run returned nil with %d handlers still running", abandoned)
		}
	case errors.As(err, &se):
		if se.Abandoned != abandoned {
			t.Errorf("Run reported %d abandoned, %d handlers were running when it returned", se.Abandoned, abandoned)
		}
	default:
		t.Errorf("Run = %v", err)
	}
	rec.mu.Lock()
	for _, st := range rec.startedAt {
		if st.After(rec.runEnded) {
			t.Errorf("a handler started at %v, after Run returned at %v", st.Sub(epoch), rec.runEnded.Sub(epoch))
		}
	}
	if n := obs.late.Load(); n > 0 {
		t.Errorf("the worker reported %d task events after Run returned", n)
	}
	if rec.calls != callsAtReturn {
		t.Errorf("%d handler calls after Run returned", rec.calls-callsAtReturn)
	}
	completed := rec.completed
	rec.mu.Unlock()
	if after := led.snapshot(); !after.equal(ledgerAtReturn) {
		t.Errorf("deliveries were settled after Run returned:\nat return %v\nnow       %v", ledgerAtReturn, after)
	}

	// Invariant: every delivery is settled exactly once, or left to the
	// broker with a log line saying so (settle refused past its budget, a
	// lost connection, an abandoned run).
	logged := func(id string, snippets ...string) bool {
		for _, e := range logs.FilterField(zap.String("task_id", id)).All() {
			for _, sn := range snippets {
				if strings.Contains(e.Message, sn) {
					return true
				}
			}
		}
		return false
	}
	for _, d := range led.all() {
		switch {
		case d.extra > 0:
			t.Errorf("delivery %s of %s: settled again after it was settled (%d more calls)", d.tag, d.id, d.extra)
		case d.settled > 1:
			t.Errorf("delivery %s of %s: settled %d times", d.tag, d.id, d.settled)
		case d.settled == 0 && !d.dropped:
			if abandoned > 0 {
				continue // an abandoned run leaves its message to the broker
			}
			if !logged(d.id, "failed; the broker will deliver it again", "returning a message to the broker failed",
				"early ack failed", "abandoned") {
				t.Errorf("delivery %s of %s (%s): never settled, and no log line says why", d.tag, d.id, d.tagInfo)
			}
		}
	}

	// Invariant: a task whose handler finished has its state stored, unless
	// ignore_result says not to or the loss was logged and counted.
	for id, outs := range completed {
		tk := byID[id]
		m, gerr := mb.Get(context.Background(), id)
		stored := protocol.State("PENDING")
		if gerr == nil {
			stored = m.Status
		}
		if stored != "PENDING" || tk.outcome == simIgnore {
			if tk.outcome == simSucceed && stored != protocol.StateSuccess && stored != protocol.StateRevoked {
				t.Errorf("%s succeeded %d times but is stored %s", id, len(outs), stored)
			}
			continue
		}
		if tk.outcome == simReject || tk.outcome == simRejectDead {
			continue // Reject stores nothing, as Celery
		}
		if !logged(id, "storing the task state failed", "after the worker abandoned it") {
			t.Errorf("%s: handler finished (%v) but nothing is stored and no loss was logged", id, outs)
		}
	}
	if lost, lines := obs.lost.Load(), logs.FilterMessage("storing the task state failed").Len(); int(lost) != lines {
		t.Errorf("observer counted %d lost results, the log has %d", lost, lines)
	}

	settled := 0
	for _, d := range led.all() {
		settled += d.settled
	}
	simTotals.add(rec.calls, len(led.all()), settled, int(obs.lost.Load()), se != nil, abandoned > 0, rec.runEnded.Sub(epoch))

	// Invariant: the observer and the logs agree with what happened.
	startedObs := int(obs.started.Load())
	if startedObs != rec.calls {
		t.Errorf("observer saw %d starts, handlers were called %d times", startedObs, rec.calls)
	}
	for _, c := range []struct {
		outcome worker.Outcome
		lines   int
	}{
		{worker.OutcomeSucceeded, logs.FilterMessage("task succeeded").Len()},
		{worker.OutcomeRetried, logs.FilterMessage("task retry scheduled").Len()},
	} {
		if got := obs.count(c.outcome); got != c.lines {
			t.Errorf("observer: %d %s, log lines: %d", got, c.outcome, c.lines)
		}
	}
	if failed, lines := obs.count(worker.OutcomeFailed)+obs.count(worker.OutcomeDeadLettered)-
		logs.FilterMessage("task rejected, dead-lettered").Len(),
		logs.FilterMessage("task failed").Len(); failed != lines {
		t.Errorf("observer: %d failed, log lines: %d", failed, lines)
	}
	// Runs Run gave up on report no outcome (their handlers ended after
	// Run returned, logging so); every other run and every message that
	// never ran reports exactly one.
	notRun := logs.FilterMessage("task revoked, not running it").Len() + logs.FilterMessageSnippet("early ack failed; not running").Len()
	gaveUp := logs.FilterMessageSnippet("after the worker abandoned it").Len()
	if finished := obs.total(); finished+gaveUp != startedObs+notRun {
		t.Errorf("observer: %d finished + %d given up, want %d started + %d never run", finished, gaveUp, startedObs, notRun)
	}
}

var errSimTransient = errors.New("sim: transient")

// simStats sums what the schedules exercised, so that the CI log shows the
// simulation is not vacuous.
type simStats struct {
	mu                                                   sync.Mutex
	calls, deliveries, settled, lost, cutShort, abandons int
	virtual                                              time.Duration
}

var simTotals simStats

func (st *simStats) add(calls, deliveries, settled, lost int, cutShort, abandoned bool, virtual time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.calls += calls
	st.deliveries += deliveries
	st.settled += settled
	st.lost += lost
	st.virtual += virtual
	if cutShort {
		st.cutShort++
	}
	if abandoned {
		st.abandons++
	}
}

func (st *simStats) String() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	return fmt.Sprintf("%d handler calls, %d deliveries (%d settled), %d results lost to backend outages, "+
		"%d shutdowns cut tasks short, %d abandoned stubborn handlers, %v of virtual time",
		st.calls, st.deliveries, st.settled, st.lost, st.cutShort, st.abandons, st.virtual.Round(time.Hour))
}

// simObserver counts what the worker reports.
type simObserver struct {
	mu                sync.Mutex
	started           atomic.Int32
	lost              atomic.Int32
	abandonedAtReturn atomic.Int32
	runReturned       atomic.Bool
	late              atomic.Int32 // reports after Run returned
	finished          map[worker.Outcome]int
}

func (o *simObserver) TaskReceived(string)                       {}
func (o *simObserver) TaskWaiting(string, string, time.Duration) {}
func (o *simObserver) TaskStarted(string)                        { o.started.Add(1); o.lateCheck() }
func (o *simObserver) MessageRejected(string)                    {}
func (o *simObserver) ResultLost(protocol.State)                 { o.lost.Add(1); o.lateCheck() }
func (o *simObserver) TaskFinished(_ string, out worker.Outcome, _ time.Duration) {
	o.lateCheck()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.finished == nil {
		o.finished = map[worker.Outcome]int{}
	}
	o.finished[out]++
}

func (o *simObserver) lateCheck() {
	if o.runReturned.Load() {
		o.late.Add(1)
	}
}

func (o *simObserver) count(out worker.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.finished[out]
}

func (o *simObserver) total() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, c := range o.finished {
		n += c
	}
	return n
}

// ledger wraps a transport and records every settlement of every delivery
// the worker was handed, to check that each is settled exactly once.
type ledger struct {
	transport.Transport
	mu   sync.Mutex
	recs []*ledgerEntry
}

type ledgerEntry struct {
	id, tag, tagInfo string
	settled          int  // successful settle calls
	extra            int  // calls after a successful one
	dropped          bool // taken back by a lost connection
}

func newLedger(inner transport.Transport) *ledger { return &ledger{Transport: inner} }

func (l *ledger) Consume(ctx context.Context, qs []transport.Queue, o transport.ConsumeOptions) (transport.Consumer, error) {
	c, err := l.Transport.Consume(ctx, qs, o)
	if err != nil {
		return nil, err
	}
	lc := &ledgerConsumer{Consumer: c, l: l, out: make(chan *transport.Delivery)}
	go lc.forward()
	return lc, nil
}

type ledgerConsumer struct {
	transport.Consumer
	l   *ledger
	out chan *transport.Delivery
}

func (c *ledgerConsumer) Deliveries() <-chan *transport.Delivery { return c.out }

func (c *ledgerConsumer) forward() {
	defer close(c.out)
	for d := range c.Consumer.Deliveries() {
		id, _ := d.Message.Headers["id"].(string)
		e := &ledgerEntry{id: id, tag: d.Tag, tagInfo: fmt.Sprintf("redelivered=%t", d.Redelivered)}
		c.l.mu.Lock()
		c.l.recs = append(c.l.recs, e)
		c.l.mu.Unlock()
		d.Acknowledger = &ledgerAck{inner: d.Acknowledger, e: e, l: c.l}
		c.out <- d
	}
}

type ledgerAck struct {
	inner transport.Acknowledger
	e     *ledgerEntry
	l     *ledger
}

func (a *ledgerAck) note(err error) error {
	a.l.mu.Lock()
	defer a.l.mu.Unlock()
	switch {
	case a.e.settled > 0:
		a.e.extra++
	case err == nil:
		a.e.settled++
	case errors.Is(err, transport.ErrStaleDelivery):
		a.e.dropped = true
	}
	return err
}

func (a *ledgerAck) Ack(ctx context.Context, d *transport.Delivery) error {
	return a.note(a.inner.Ack(ctx, d))
}

func (a *ledgerAck) Reject(ctx context.Context, d *transport.Delivery, requeue bool) error {
	return a.note(a.inner.Reject(ctx, d, requeue))
}

func (a *ledgerAck) DeadLetter(ctx context.Context, d *transport.Delivery, r transport.DeadLetterReason) error {
	return a.note(a.inner.DeadLetter(ctx, d, r))
}

type ledgerSnapshot []ledgerEntry

func (l *ledger) snapshot() ledgerSnapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(ledgerSnapshot, len(l.recs))
	for i, e := range l.recs {
		out[i] = *e
	}
	return out
}

func (s ledgerSnapshot) equal(o ledgerSnapshot) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i].settled != o[i].settled || s[i].extra != o[i].extra {
			return false
		}
	}
	return true
}

func (l *ledger) all() []*ledgerEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*ledgerEntry(nil), l.recs...)
}
