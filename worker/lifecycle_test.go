package worker_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/backendtest"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/transporttest"
	"github.com/celeriac/celeriac/worker"
)

// These tests run in synctest bubbles: time is virtual, so a 35 s task or
// a 30 s settle budget costs nothing, and synctest.Wait says "everything
// that can happen has happened" exactly instead of a sleep guessing it.

// TestLongTaskSettles: the settle budget starts when settling starts, not
// when the task started, so a task longer than the budget still stores its
// result, publishes its retry or next chain step, and acknowledges.
func TestLongTaskSettles(t *testing.T) {
	const long = 35 * time.Second
	for _, acksLate := range []bool{false, true} {
		t.Run(fmt.Sprintf("acks_late=%t", acksLate), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, worker.Config{AcksLate: acksLate})
				h.waitLimit = time.Hour
				h.mux.HandleFunc("tasks.slow", func(ctx context.Context, t *worker.Task) (any, error) {
					time.Sleep(long)
					var mode string
					_ = t.Bind(&mode)
					switch {
					case mode == "fail":
						return nil, errors.New("slow failure")
					case mode == "retry" && t.Retries == 0:
						return nil, retry.After(5*time.Second, errBoom)
					}
					return "done " + mode, nil
				})
				h.mux.HandleFunc("tasks.echo", func(ctx context.Context, t *worker.Task) (any, error) { return t.Args, nil })
				h.start()
				ok := h.send("tasks.slow", []any{"ok"}, nil)
				fail := h.send("tasks.slow", []any{"fail"}, nil)
				again := h.send("tasks.slow", []any{"retry"}, nil)
				stepID := protocol.NewID()
				step := protocol.Signature{Task: "tasks.echo", Options: map[string]any{"task_id": stepID}}
				h.send("tasks.slow", []any{"chain"}, nil, client.Link(step))

				if m := h.wait(ok); m.Status != protocol.StateSuccess || m.Result != "done ok" {
					t.Fatalf("35 s task: %s %v, want SUCCESS", m.Status, m.Result)
				}
				if m := h.wait(fail); m.Status != protocol.StateFailure {
					t.Fatalf("35 s failing task: %s, want FAILURE", m.Status)
				}
				start := time.Now()
				if m := h.wait(again); m.Status != protocol.StateSuccess || m.Result != "done retry" {
					t.Fatalf("35 s retried task: %s %v, want SUCCESS after the retry", m.Status, m.Result)
				}
				if took := time.Since(start); took < long {
					t.Fatalf("the retry finished %v after the first run, want at least another %v run", took, long)
				}
				if m := h.wait(stepID); m.Status != protocol.StateSuccess || fmt.Sprint(m.Result) != "[done chain]" {
					t.Fatalf("callback after a 35 s task: %s %v, want SUCCESS", m.Status, m.Result)
				}
				synctest.Wait()
				if st := h.tr.Broker().Stats(); st.Unacked != 0 || st.Ready != 0 {
					t.Fatalf("broker after the run: %+v, want nothing ready or unacknowledged", st)
				}
				if err := h.stop(); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// TestSettleRidesOutABackendOutage: a backend that is down when the task
// ends is tried again within the result budget; the result is not lost.
// One that stays down past the budget is logged and counted.
func TestSettleRidesOutABackendOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, worker.Config{AcksLate: true})
		h.waitLimit = time.Hour
		fb := backendtest.NewFaulty(h.be)
		lost := &lossCounter{}
		h.cfg.Backend = fb.Chords().(backend.Backend)
		h.cfg.Observer = lost
		core, logs := observer.New(zapcore.InfoLevel)
		h.cfg.Logger = zap.New(core)
		h.mux.HandleFunc("tasks.add", add)
		h.start()

		down := time.Now().Add(20 * time.Second)
		fb.SetFault(func(c backendtest.Call) error {
			if time.Now().Before(down) {
				return errors.New("connection refused")
			}
			return nil
		})
		id := h.send("tasks.add", []any{int64(2), int64(3)}, nil)
		if m := h.wait(id); m.Result != int64(5) {
			t.Fatalf("got %v", m.Result)
		}
		if fb.Calls(backendtest.OpStore) < 5 {
			t.Fatalf("%d store calls; the write was not tried again", fb.Calls(backendtest.OpStore))
		}

		// Down for longer than a budget (ResultTimeout, 5 minutes): tried
		// again with a warning every 30 s meanwhile, then given up, logged,
		// counted, and the acks_late message is still acknowledged (the
		// task ran).
		fb.SetFault(func(backendtest.Call) error { return errors.New("connection refused") })
		id = h.send("tasks.add", []any{int64(1), int64(1)}, nil)
		time.Sleep(4 * time.Minute)
		synctest.Wait()
		if lost.n.Load() != 0 {
			t.Fatalf("results lost = %d within the budget, want 0", lost.n.Load())
		}
		if st := h.tr.Broker().Stats(); st.Unacked != 1 {
			t.Fatalf("broker: %+v, want the message held while its result is tried", st)
		}
		if n := logs.FilterMessage("the result backend failed a result write; trying again").FilterField(zap.String("task_id", id)).Len(); n < 7 || n > 9 {
			t.Fatalf("%d warnings in 4 minutes of retries, want one per 30 s", n)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if lost.n.Load() != 1 {
			t.Fatalf("results lost = %d, want 1", lost.n.Load())
		}
		if n := logs.FilterMessage("storing the task state failed").FilterField(zap.String("task_id", id)).Len(); n != 1 {
			t.Fatalf("%d log lines for the lost result, want 1", n)
		}
		if st := h.tr.Broker().Stats(); st.Unacked != 0 {
			t.Fatalf("broker: %+v, want nothing unacknowledged", st)
		}
		fb.SetFault(nil)
	})
}

type lossCounter struct {
	worker.Observer
	n atomic.Int32
}

func (*lossCounter) TaskReceived(string)                                {}
func (*lossCounter) TaskWaiting(string, string, time.Duration)          {}
func (*lossCounter) TaskStarted(string)                                 {}
func (*lossCounter) TaskFinished(string, worker.Outcome, time.Duration) {}
func (*lossCounter) MessageRejected(string)                             {}
func (l *lossCounter) ResultLost(protocol.State)                        { l.n.Add(1) }

// TestRetryPublishFailure: a broker that refuses the retry's publish for a
// moment is ridden out; one that refuses it past the budget gets the
// original (acks_late) back, so the task runs again rather than vanishing.
func TestRetryPublishFailure(t *testing.T) {
	for _, tc := range []struct {
		name     string
		down     time.Duration
		attempts []int
	}{
		{"brief", 3 * time.Second, []int{0, 1}},
		{"past the budget", 45 * time.Second, []int{0, 0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, worker.Config{})
				h.waitLimit = time.Hour
				var until time.Time
				h.wrap = func(tr transport.Transport) transport.Transport {
					ft := transporttest.NewFaulty(tr)
					ft.SetFault(transporttest.OpPublish, func(c transporttest.Call) error {
						if c.Publishing.RoutingKey == "q" && time.Now().Before(until) {
							return errors.New("broker refused the message")
						}
						return nil
					})
					return ft
				}
				var attempts []int
				h.mux.HandleFunc("tasks.flaky", func(ctx context.Context, t *worker.Task) (any, error) {
					attempts = append(attempts, t.Retries)
					if t.Retries == 0 {
						if len(attempts) == 1 {
							until = time.Now().Add(tc.down)
						}
						return nil, retry.Now(errBoom)
					}
					return "ok", nil
				}, worker.AcksLate(true))
				h.start()
				if m := h.wait(h.send("tasks.flaky", nil, nil)); m.Status != protocol.StateSuccess {
					t.Fatalf("result %s %v; want SUCCESS", m.Status, m.Result)
				}
				if fmt.Sprint(attempts) != fmt.Sprint(tc.attempts) {
					t.Fatalf("attempts (retries seen) %v, want %v", attempts, tc.attempts)
				}
			})
		})
	}
}

// TestRedeliveryWhileRunning: two deliveries of one task id run side by
// side (a redelivery while the first run still runs). Each is its own
// run: when the first ends, the second is still known, so a shutdown
// cancels it and Run waits for it.
func TestRedeliveryWhileRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, worker.Config{Concurrency: 2, AcksLate: true, ShutdownTimeout: time.Minute})
		var running atomic.Int32
		h.mux.HandleFunc("tasks.work", func(ctx context.Context, t *worker.Task) (any, error) {
			running.Add(1)
			defer running.Add(-1)
			var d float64
			_ = t.Bind(&d)
			select {
			case <-time.After(time.Duration(d) * time.Second):
				return nil, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		h.start()
		id := protocol.NewID()
		h.send("tasks.work", []any{1.0}, nil, client.TaskID(id))
		h.send("tasks.work", []any{3600.0}, nil, client.TaskID(id))
		time.Sleep(2 * time.Second) // the first copy is done, the second runs
		synctest.Wait()
		if running.Load() != 1 {
			t.Fatalf("%d runs, want the second copy running", running.Load())
		}
		stopped := h.stopAsync()
		time.Sleep(time.Second)
		h.w.Close()
		err := <-stopped
		var se *worker.ShutdownError
		if !errors.As(err, &se) || se.Cancelled != 1 || se.Abandoned != 0 {
			t.Fatalf("Run = %v, want a ShutdownError with 1 cancelled and none abandoned", err)
		}
		if n := running.Load(); n != 0 {
			t.Fatalf("%d handlers still running after Run returned", n)
		}
		if n, _ := h.tr.Len(context.Background(), "q"); n != 1 {
			t.Fatalf("%d messages back on the broker, want the interrupted copy", n)
		}
	})
}

// TestRevokeTerminateEndsEveryRunOfTheID: revoke(terminate=True) of an id
// that runs twice ends both runs, and each is recorded as terminated.
func TestRevokeTerminateEndsEveryRunOfTheID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, worker.Config{Concurrency: 2, AcksLate: true})
		var running atomic.Int32
		h.mux.HandleFunc("tasks.block", func(ctx context.Context, t *worker.Task) (any, error) {
			running.Add(1)
			defer running.Add(-1)
			<-ctx.Done()
			return nil, ctx.Err()
		})
		h.start()
		id := protocol.NewID()
		h.send("tasks.block", nil, nil, client.TaskID(id))
		h.send("tasks.block", nil, nil, client.TaskID(id))
		synctest.Wait()
		if running.Load() != 2 {
			t.Fatalf("%d runs, want 2", running.Load())
		}
		if err := client.NewControl(h.tr).Cast(context.Background(), "revoke", map[string]any{"task_id": id, "terminate": true}, client.ControlOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if running.Load() != 0 {
			t.Fatalf("%d runs still going after revoke(terminate=True)", running.Load())
		}
		if m := h.wait(id); m.Status != protocol.StateRevoked {
			t.Fatalf("state %s, want REVOKED", m.Status)
		}
		if st := h.tr.Broker().Stats(); st.Unacked != 0 || st.Ready != 0 {
			t.Fatalf("broker: %+v, want both deliveries settled", st)
		}
	})
}

// TestBigPoolShutsDownClean: concurrency far above the old 1024-slot
// channel; every slot that finishes during the shutdown exits, none leaks
// (synctest fails the test on a goroutine left blocked in the bubble).
func TestBigPoolShutsDownClean(t *testing.T) {
	for _, conc := range []int{1025, 5000} {
		t.Run(fmt.Sprint(conc), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, worker.Config{Concurrency: conc, PrefetchMultiplier: 1})
				var ran atomic.Int32
				h.mux.HandleFunc("tasks.nap", func(ctx context.Context, t *worker.Task) (any, error) {
					time.Sleep(10 * time.Second)
					ran.Add(1)
					return nil, nil
				}, worker.IgnoreResult(true))
				h.start()
				synctest.Wait()
				before := runtime.NumGoroutine() // the worker, idle: no slot yet
				for i := 0; i < conc; i++ {
					h.send("tasks.nap", nil, nil)
				}
				time.Sleep(5 * time.Second)
				synctest.Wait()
				if err := h.stop(); err != nil {
					t.Fatal(err)
				}
				// Run waits for its slots: none may outlive it. The count is
				// the whole process's, so goroutines of other tests may come
				// and go; without the wait, hundreds of slots are left.
				if after := runtime.NumGoroutine(); after > before+100 {
					t.Errorf("%d goroutines once Run returned, %d while the worker was idle: slots outlived Run", after, before)
				}
				if int(ran.Load()) != conc {
					t.Fatalf("%d tasks ran, want %d", ran.Load(), conc)
				}
			})
		})
	}
}

// TestUnstartedWorkSettlesAfterRunsContextEnds: messages settled off the
// loop (undecodable, unregistered, revoked) get their own settle budget,
// so cancelling Run's context while they settle does not abort them.
func TestUnstartedWorkSettlesAfterRunsContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, worker.Config{})
		release := make(chan struct{})
		var held atomic.Int32
		h.wrap = func(tr transport.Transport) transport.Transport {
			ft := transporttest.NewFaulty(tr)
			ft.SetFault(transporttest.OpDeadLetter, func(c transporttest.Call) error {
				held.Add(1)
				<-release // the dead-letter is under way when the shutdown begins
				return nil
			})
			return ft
		}
		h.start()
		h.send("tasks.nobody", nil, nil)
		synctest.Wait()
		if held.Load() != 1 {
			t.Fatal("the unregistered task was not being dead-lettered")
		}
		stopped := h.stopAsync()
		synctest.Wait()
		close(release)
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
		if dead, _ := h.tr.DeadLetters(context.Background(), "q", 0); len(dead) != 1 {
			t.Fatalf("%d dead letters, want the unregistered task's", len(dead))
		}
	})
}

// TestRejectAfterEarlyAckSaysNothingWasRequeued: Reject from a handler
// whose message was acknowledged at start cannot requeue anything; the log
// must not claim it did.
func TestRejectAfterEarlyAckSaysNothingWasRequeued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		core, logs := observer.New(zapcore.InfoLevel)
		h := newHarness(t, worker.Config{Logger: zap.New(core)})
		h.mux.HandleFunc("tasks.early", func(ctx context.Context, t *worker.Task) (any, error) {
			return nil, worker.Reject(errBoom, true)
		})
		h.mux.HandleFunc("tasks.late", func(ctx context.Context, t *worker.Task) (any, error) {
			if t.DeliveryInfo.Redelivered {
				return nil, nil
			}
			return nil, worker.Reject(errBoom, true)
		}, worker.AcksLate(true))
		h.start()
		h.send("tasks.early", nil, nil)
		h.send("tasks.late", nil, nil)
		synctest.Wait()
		if n := logs.FilterMessage("task rejected, requeued").FilterField(zap.String("task_name", "tasks.early")).Len(); n != 0 {
			t.Fatal(`an early-acked task logged "requeued"`)
		}
		if n := logs.FilterMessageSnippet("nothing was requeued").FilterField(zap.String("task_name", "tasks.early")).Len(); n != 1 {
			t.Fatalf("%d lines saying nothing was requeued, want 1", n)
		}
		if n := logs.FilterMessage("task rejected, requeued").FilterField(zap.String("task_name", "tasks.late")).Len(); n != 1 {
			t.Fatalf("acks_late reject: %d requeued lines, want 1", n)
		}
		if n, _ := h.tr.Len(context.Background(), "q"); n != 0 {
			t.Fatalf("%d messages left; the requeued acks_late task should have run again", n)
		}
	})
}

// TestShutdownReportsAbandonedTasks: Run's error says how many tasks the
// shutdown timeout cut short and how many were still running.
func TestShutdownReportsAbandonedTasks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, worker.Config{Concurrency: 3, ShutdownTimeout: 10 * time.Second, AcksLate: true})
		release := make(chan struct{})
		h.mux.HandleFunc("tasks.polite", func(ctx context.Context, t *worker.Task) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		h.mux.HandleFunc("tasks.stubborn", func(ctx context.Context, t *worker.Task) (any, error) {
			<-release // ignores ctx
			return nil, nil
		})
		h.mux.HandleFunc("tasks.quick", func(ctx context.Context, t *worker.Task) (any, error) {
			time.Sleep(time.Second)
			return nil, nil
		})
		h.start()
		h.send("tasks.polite", nil, nil)
		h.send("tasks.stubborn", nil, nil)
		h.send("tasks.quick", nil, nil)
		synctest.Wait()
		begin := time.Now()
		err := h.stop()
		var se *worker.ShutdownError
		if !errors.As(err, &se) || se.Cancelled != 2 || se.Abandoned != 1 || !errors.Is(err, worker.ErrShutdown) {
			t.Fatalf("Run = %v, want 2 cancelled, 1 abandoned", err)
		}
		if took := time.Since(begin); took < 10*time.Second || took > 25*time.Second {
			t.Fatalf("shutdown took %v, want the 10 s timeout plus at most the grace periods", took)
		}
		close(release)
		synctest.Wait()
		// The abandoned task's acks_late message is still unacknowledged:
		// nothing settled it after Run returned.
		if st := h.tr.Broker().Stats(); st.Unacked != 1 {
			t.Fatalf("broker: %+v, want the abandoned task's message unacknowledged", st)
		}
	})
}

// TestPoolGrowTo5000: pool_grow takes a one-slot worker to 5 000 slots,
// every one of them runs a task at once, and the shutdown ends them all.
func TestPoolGrowTo5000(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const slots = 5000
		h := newHarness(t, worker.Config{Concurrency: 1, PrefetchMultiplier: -1})
		var running, peak atomic.Int32
		release := make(chan struct{})
		h.mux.HandleFunc("tasks.hold", func(ctx context.Context, t *worker.Task) (any, error) {
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			<-release
			running.Add(-1)
			return nil, nil
		}, worker.IgnoreResult(true))
		h.start()
		synctest.Wait()
		if err := client.NewControl(h.tr).Cast(context.Background(), "pool_grow", map[string]any{"n": int64(slots - 1)}, client.ControlOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := h.w.Stats().Concurrency; got != slots {
			t.Fatalf("concurrency after pool_grow = %d, want %d", got, slots)
		}
		for i := 0; i < slots+10; i++ {
			h.send("tasks.hold", nil, nil)
		}
		synctest.Wait()
		if p := peak.Load(); p != slots {
			t.Fatalf("%d tasks ran at once, want %d", p, slots)
		}
		stopped := h.stopAsync()
		synctest.Wait()
		close(release)
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
		if n, _ := h.tr.Len(context.Background(), "q"); n != 10 {
			t.Fatalf("%d messages back on the broker, want the 10 that found no slot", n)
		}
	})
}
