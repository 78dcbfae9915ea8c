package worker_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/celeriac/celeriac/backend"
	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/worker"
)

func TestSuccessStoresResult(t *testing.T) {
	h := newHarness(t, worker.Config{ResultExtended: true})
	h.mux.HandleFunc("tasks.add", add)
	h.start()
	id := h.send("tasks.add", []any{int64(2), int64(3)}, nil)
	m := h.wait(id)
	if m.Status != protocol.StateSuccess || m.Result != int64(5) {
		t.Fatalf("got %s %v, want SUCCESS 5", m.Status, m.Result)
	}
	if m.DateDone.IsZero() || m.Name != "tasks.add" || m.Worker != h.w.Hostname() || m.Queue != "q" {
		t.Errorf("extended fields: date_done=%v name=%q worker=%q queue=%q", m.DateDone, m.Name, m.Worker, m.Queue)
	}
}

func TestBindErrorIsTypeErrorAndNotRetried(t *testing.T) {
	h := newHarness(t, worker.Config{Retry: retry.Policy{AutoRetryFor: []retry.Matcher{retry.OnAny()}}})
	h.mux.HandleFunc("tasks.add", add, worker.AcksLate(true))
	h.start()
	id := h.send("tasks.add", []any{"two", int64(3)}, nil)
	m := h.wait(id)
	if m.Status != protocol.StateFailure || exc(t, m).Type != "TypeError" {
		t.Fatalf("got %s %+v, want FAILURE TypeError", m.Status, m.Result)
	}
}

func TestUnknownTaskIsDeadLetteredWithFailure(t *testing.T) {
	h := newHarness(t, worker.Config{})
	h.mux.HandleFunc("tasks.add", add)
	h.start()
	id := h.send("tasks.nope", nil, nil)
	m := h.wait(id)
	ex := exc(t, m)
	if m.Status != protocol.StateFailure || ex.Type != "NotRegistered" || ex.Module != "celery.exceptions" {
		t.Fatalf("got %s %+v", m.Status, ex)
	}
	dead := waitDead(t, h, "q", 1)
	if dead[0].Reason.Reason != "not-registered" || dead[0].Reason.TaskID != id {
		t.Fatalf("dead letter reason = %+v", dead[0].Reason)
	}
	// The worker keeps working.
	if m := h.wait(h.send("tasks.add", []any{int64(1), int64(1)}, nil)); m.Result != int64(2) {
		t.Fatalf("after an unknown task: %v", m.Result)
	}
}

func waitDead(t *testing.T, h *harness, queue string, n int) []transport.DeadMessage {
	t.Helper()
	var dead []transport.DeadMessage
	eventually(t, "dead letters", func() bool {
		var err error
		dead, err = h.tr.DeadLetters(context.Background(), queue, 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(dead) >= n
	})
	return dead
}

func TestPoisonMessagesAreDeadLettered(t *testing.T) {
	h := newHarness(t, worker.Config{MaxMessageSize: 1 << 20})
	h.mux.HandleFunc("tasks.add", add)
	h.start()
	base := protocol.Message{
		ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
		Headers: map[string]any{"task": "tasks.add", "id": "poison-1", "lang": "py"},
		Body:    []byte(`[[1, 2], {}, null]`),
	}
	cases := map[string]func(m *protocol.Message){
		"invalid json": func(m *protocol.Message) { m.Body = []byte(`[[1, 2], {`) },
		"pickle":       func(m *protocol.Message) { m.ContentType = protocol.ContentTypePickle; m.Body = []byte{0x80, 0x04} },
		"unknown type": func(m *protocol.Message) { m.ContentType = "application/x-foo" },
		"compression":  func(m *protocol.Message) { m.Headers["compression"] = "application/x-snappy" },
		"no id":        func(m *protocol.Message) { delete(m.Headers, "id") },
		"too large":    func(m *protocol.Message) { m.Body = []byte(`[["` + strings.Repeat("x", 2<<20) + `"], {}, null]`) },
		"kwargs list":  func(m *protocol.Message) { m.Body = []byte(`[[1, 2], [3], null]`) },
		"bad eta":      func(m *protocol.Message) { m.Headers["eta"] = "tomorrow" },
		"deep": func(m *protocol.Message) {
			m.Body = []byte("[" + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + ", {}, null]")
		},
	}
	for name, mutate := range cases {
		m := base
		m.Headers = map[string]any{}
		for k, v := range base.Headers {
			m.Headers[k] = v
		}
		m.Headers["id"] = "poison-" + strings.ReplaceAll(name, " ", "-")
		if name == "no id" {
			delete(m.Headers, "id")
		}
		mutate(&m)
		if err := h.tr.Publish(context.Background(), &transport.Publishing{RoutingKey: "q", Message: m}); err != nil {
			t.Fatal(err)
		}
	}
	dead := waitDead(t, h, "q", len(cases))
	reasons := map[string]bool{}
	for _, d := range dead {
		if d.Reason.Reason == "" || d.Reason.Error == "" {
			t.Errorf("dead letter without a reason: %+v", d.Reason)
		}
		reasons[d.Reason.Reason] = true
	}
	for _, want := range []string{"content-type", "compression", "too-large", "too-deep", "invalid"} {
		if !reasons[want] {
			t.Errorf("no dead letter with reason %q (got %v)", want, reasons)
		}
	}
	// A poison message with an id gets a FAILURE a Python client can read.
	m := h.wait("poison-pickle")
	if m.Status != protocol.StateFailure {
		t.Errorf("poison-pickle state %s", m.Status)
	}
	if m := h.wait(h.send("tasks.add", []any{int64(1), int64(2)}, nil)); m.Result != int64(3) {
		t.Fatalf("worker stuck after poison: %v", m.Result)
	}
}

func TestPanicIsRecoveredIntoFailure(t *testing.T) {
	h := newHarness(t, worker.Config{})
	h.mux.HandleFunc("tasks.panic", func(ctx context.Context, t *worker.Task) (any, error) { panic("kaboom") })
	h.mux.HandleFunc("tasks.add", add)
	h.start()
	m := h.wait(h.send("tasks.panic", nil, nil))
	if m.Status != protocol.StateFailure || exc(t, m).Type != "RuntimeError" {
		t.Fatalf("got %s %+v", m.Status, m.Result)
	}
	if !strings.Contains(m.Traceback, "kaboom") || !strings.Contains(m.Traceback, "worker_test.go") {
		t.Errorf("traceback lacks the panic value or stack:\n%s", m.Traceback)
	}
	if m := h.wait(h.send("tasks.add", []any{int64(1), int64(2)}, nil)); m.Result != int64(3) {
		t.Fatalf("worker stuck after panic: %v", m.Result)
	}
}

func TestChosenExceptionType(t *testing.T) {
	h := newHarness(t, worker.Config{})
	h.mux.HandleFunc("tasks.fail", func(ctx context.Context, t *worker.Task) (any, error) {
		return nil, worker.NewException("ValueError", "bad thing")
	})
	h.mux.HandleFunc("tasks.plain", func(ctx context.Context, t *worker.Task) (any, error) {
		return nil, errBoom
	})
	h.start()
	m := h.wait(h.send("tasks.fail", nil, nil))
	if ex := exc(t, m); ex.Type != "ValueError" || ex.Module != "builtins" || len(ex.Message) != 1 || ex.Message[0] != "bad thing" {
		t.Fatalf("got %+v", ex)
	}
	if !strings.HasSuffix(m.Traceback, "ValueError: bad thing\n") {
		t.Errorf("traceback tail: %q", m.Traceback)
	}
	m = h.wait(h.send("tasks.plain", nil, nil))
	if ex := exc(t, m); ex.Type != "Exception" || ex.Message[0] != "boom" {
		t.Fatalf("plain error: %+v", ex)
	}
}

func TestCountdownStartsNoEarlier(t *testing.T) {
	h := newHarness(t, worker.Config{})
	var started atomic.Int64
	h.mux.HandleFunc("tasks.stamp", func(ctx context.Context, t *worker.Task) (any, error) {
		started.Store(time.Now().UnixNano())
		return nil, nil
	})
	h.start()
	sent := time.Now()
	id := h.send("tasks.stamp", nil, nil, client.Countdown(300*time.Millisecond))
	h.wait(id)
	if got := time.Unix(0, started.Load()).Sub(sent); got < 300*time.Millisecond {
		t.Fatalf("countdown=300ms task started after %v", got)
	}
}

func TestETATasksDoNotBlockOthers(t *testing.T) {
	// Prefetch 1 (concurrency 1, multiplier 1): without Celery's per-ETA
	// prefetch increment the held task would starve the queue.
	h := newHarness(t, worker.Config{Concurrency: 1, PrefetchMultiplier: 1})
	h.mux.HandleFunc("tasks.add", add)
	h.start()
	var later []string
	for i := 0; i < 5; i++ {
		later = append(later, h.send("tasks.add", []any{int64(i), int64(0)}, nil, client.Countdown(time.Hour)))
	}
	if m := h.wait(h.send("tasks.add", []any{int64(1), int64(2)}, nil)); m.Result != int64(3) {
		t.Fatalf("got %v", m.Result)
	}
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	// Held ETA tasks go back to the broker on shutdown.
	if n, _ := h.tr.Len(context.Background(), "q"); n != len(later) {
		t.Fatalf("queue has %d messages after shutdown, want the %d held ones", n, len(later))
	}
}

func TestExpiredTaskIsRevokedNotRun(t *testing.T) {
	h := newHarness(t, worker.Config{})
	var ran atomic.Bool
	h.mux.HandleFunc("tasks.add", func(ctx context.Context, t *worker.Task) (any, error) {
		ran.Store(true)
		return nil, nil
	})
	h.start()
	id := h.send("tasks.add", nil, nil, client.Expires(time.Now().Add(-time.Second)))
	m := h.wait(id)
	if m.Status != protocol.StateRevoked || exc(t, m).Type != "TaskRevokedError" || exc(t, m).Message[0] != "expired" {
		t.Fatalf("got %s %+v", m.Status, m.Result)
	}
	if ran.Load() {
		t.Fatal("expired task ran")
	}
}

func TestExplicitRetryThenSuccess(t *testing.T) {
	h := newHarness(t, worker.Config{})
	var attempts []int
	var mu sync.Mutex
	h.mux.HandleFunc("tasks.flaky", func(ctx context.Context, t *worker.Task) (any, error) {
		mu.Lock()
		attempts = append(attempts, t.Retries)
		mu.Unlock()
		if t.Retries < 2 {
			return nil, retry.After(10*time.Millisecond, worker.NewException("KeyError", "boom"))
		}
		return "ok", nil
	}, worker.AcksLate(true))
	h.start()
	id := h.send("tasks.flaky", nil, nil)
	m := h.wait(id)
	if m.Status != protocol.StateSuccess || m.Result != "ok" {
		t.Fatalf("got %s %v", m.Status, m.Result)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != 3 || attempts[0] != 0 || attempts[2] != 2 {
		t.Fatalf("attempts (retries seen) = %v, want [0 1 2]", attempts)
	}
	if n, _ := h.tr.Len(context.Background(), "q"); n != 0 {
		t.Fatalf("%d messages left", n)
	}
}

// TestRetryMessageKeepsTheTask: the message a retry publishes is the same
// task — id, name, args, kwargs, routing, priority, time limits, expiry,
// callbacks, errbacks, chain, custom headers — with retries + 1, an eta, and
// the parent/root ids Celery sets (parent = the task itself).
func TestRetryMessageKeepsTheTask(t *testing.T) {
	h := newHarness(t, worker.Config{Queues: []string{"q", "other"}})
	var (
		mu    sync.Mutex
		seen  []*protocol.TaskMessage
		queue []string
	)
	h.mux.HandleFunc("tasks.once", func(ctx context.Context, t *worker.Task) (any, error) {
		mu.Lock()
		seen = append(seen, t.Message)
		queue = append(queue, t.DeliveryInfo.Queue)
		mu.Unlock()
		if t.Retries == 0 {
			return nil, retry.After(10*time.Millisecond, errBoom)
		}
		return "ok", nil
	}, worker.AcksLate(true))
	h.mux.HandleFunc("tasks.cb", add)
	h.start()
	cb := protocol.Signature{Task: "tasks.cb", Args: []any{int64(1)}, Options: map[string]any{}}
	eb := protocol.Signature{Task: "tasks.eb", Options: map[string]any{}}
	id := h.send("tasks.once", []any{int64(7), "x", []any{1.5, nil}}, map[string]any{"k": map[string]any{"n": true}},
		client.Queue("other"), client.Priority(3), client.TimeLimit(time.Hour, 30*time.Minute),
		client.Expires(time.Now().Add(time.Hour)), client.Link(cb), client.LinkError(eb),
		client.Headers(map[string]any{"tenant": "acme"}), client.Parent("parent-1", "root-1"))
	if m := h.wait(id); m.Status != protocol.StateSuccess {
		t.Fatalf("got %s %v", m.Status, m.Result)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("%d attempts, want 2", len(seen))
	}
	first, second := seen[0], seen[1]
	if queue[1] != "other" {
		t.Errorf("retry delivered from %q, want the original queue other", queue[1])
	}
	if second.Retries != 1 || second.ETA.IsZero() || second.ETA.Before(time.Now().Add(-time.Minute)) {
		t.Errorf("retry: retries %d eta %v, want 1 and a fresh eta", second.Retries, second.ETA)
	}
	if second.ParentID != id || second.RootID != "root-1" {
		t.Errorf("retry ids: parent %q root %q, want %q and root-1", second.ParentID, second.RootID, id)
	}
	// Everything else is the same task.
	ignore := cmpopts.IgnoreFields(protocol.TaskMessage{}, "Retries", "ETA", "ParentID", "Origin", "ArgsRepr", "KwargsRepr",
		"Expiration") // the AMQP TTL left until expires, recomputed at each publish
	if diff := cmp.Diff(first, second, ignore, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("the retry message differs from the original (-first +retry):\n%s", diff)
	}
	if first.Priority != 3 || first.TimeLimit != time.Hour || first.Headers["tenant"] != "acme" || len(first.Embed.Callbacks) != 1 {
		t.Errorf("the original lacks what the test sent: %+v", first)
	}
}

// TestRetryPublishFailureRequeuesTheOriginal: when the broker refuses the
// retry message, the original (acks_late, unacknowledged) goes back to the
// queue instead of being acked: the retry is not lost, and it is tried
// again with the same retry count.
// TestHandlerReject: worker.Reject(err, false) dead-letters the message
// (Celery's Reject(requeue=False)); Reject(err, true) puts it back on the
// queue, where it runs again.
func TestHandlerReject(t *testing.T) {
	h := newHarness(t, worker.Config{})
	var runs atomic.Int32
	h.mux.HandleFunc("tasks.refuse", func(ctx context.Context, t *worker.Task) (any, error) {
		return nil, worker.Reject(errors.New("not for us"), false)
	}, worker.AcksLate(true))
	h.mux.HandleFunc("tasks.later", func(ctx context.Context, t *worker.Task) (any, error) {
		if runs.Add(1) == 1 {
			return nil, worker.Reject(errors.New("not yet"), true)
		}
		return "ran", nil
	}, worker.AcksLate(true))
	h.start()
	refused := h.send("tasks.refuse", nil, nil)
	dead := waitDead(t, h, "q", 1)
	if dead[0].Reason.TaskID != refused {
		t.Fatalf("dead letter %+v, want task %s", dead[0].Reason, refused)
	}
	later := h.send("tasks.later", nil, nil)
	if m := h.wait(later); m.Status != protocol.StateSuccess || m.Result != "ran" || runs.Load() != 2 {
		t.Fatalf("requeued task: %s %v after %d runs, want SUCCESS after 2", m.Status, m.Result, runs.Load())
	}
}

func TestAutoRetryExhaustedFailsWithOriginalAndDeadLetters(t *testing.T) {
	h := newHarness(t, worker.Config{})
	var calls atomic.Int32
	h.mux.HandleFunc("tasks.down", func(ctx context.Context, t *worker.Task) (any, error) {
		calls.Add(1)
		return nil, worker.AsException(errBoom, "ConnectionError")
	}, worker.AcksLate(true), worker.Retry(retry.Policy{
		AutoRetryFor: []retry.Matcher{retry.On(errBoom)},
		MaxRetries:   retry.Limited(2),
		Countdown:    retry.NoDelay,
	}))
	h.start()
	id := h.send("tasks.down", nil, nil)
	m := h.wait(id)
	if m.Status != protocol.StateFailure || exc(t, m).Type != "ConnectionError" {
		t.Fatalf("got %s %+v", m.Status, m.Result)
	}
	if calls.Load() != 3 {
		t.Fatalf("ran %d times, want 3 (1 + 2 retries)", calls.Load())
	}
	dead := waitDead(t, h, "q", 1)
	if dead[0].Reason.Reason != "max-retries" {
		t.Fatalf("dead letter reason %+v", dead[0].Reason)
	}
	if r := dead[0].Message.Headers["retries"]; r != int64(2) {
		t.Fatalf("dead message retries header = %v, want 2", r)
	}
}

func TestPermanentErrorNotRetried(t *testing.T) {
	h := newHarness(t, worker.Config{})
	var calls atomic.Int32
	h.mux.HandleFunc("tasks.bad", func(ctx context.Context, t *worker.Task) (any, error) {
		calls.Add(1)
		return nil, retry.Skip(errBoom)
	}, worker.Retry(retry.Policy{AutoRetryFor: []retry.Matcher{retry.OnAny()}}))
	h.start()
	m := h.wait(h.send("tasks.bad", nil, nil))
	if m.Status != protocol.StateFailure || calls.Load() != 1 {
		t.Fatalf("got %s after %d calls", m.Status, calls.Load())
	}
}

func TestSoftTimeLimitCancelsWithCause(t *testing.T) {
	h := newHarness(t, worker.Config{})
	causes := make(chan error, 1)
	h.mux.HandleFunc("tasks.slow", func(ctx context.Context, t *worker.Task) (any, error) {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, ctx.Err()
	}, worker.TimeLimit(0, 50*time.Millisecond))
	h.start()
	m := h.wait(h.send("tasks.slow", nil, nil))
	if cause := <-causes; !errors.Is(cause, worker.ErrSoftTimeLimitExceeded) {
		t.Fatalf("cause = %v", cause)
	}
	if ex := exc(t, m); ex.Type != "SoftTimeLimitExceeded" || ex.Module != "billiard.exceptions" {
		t.Fatalf("got %+v", ex)
	}
}

func TestHardTimeLimitFreesTheSlot(t *testing.T) {
	h := newHarness(t, worker.Config{Concurrency: 1})
	release := make(chan struct{})
	h.mux.HandleFunc("tasks.stuck", func(ctx context.Context, t *worker.Task) (any, error) {
		<-release // ignores ctx on purpose
		return nil, nil
	})
	h.mux.HandleFunc("tasks.add", add)
	h.start()
	defer close(release)
	id := h.send("tasks.stuck", nil, nil, client.TimeLimit(100*time.Millisecond, 0))
	m := h.wait(id)
	if ex := exc(t, m); ex.Type != "TimeLimitExceeded" || ex.Module != "billiard.exceptions" {
		t.Fatalf("got %+v", ex)
	}
	// Concurrency 1: the next task runs only if the slot was given back.
	if m := h.wait(h.send("tasks.add", []any{int64(1), int64(2)}, nil)); m.Result != int64(3) {
		t.Fatalf("got %v", m.Result)
	}
}

func TestConcurrencyIsBounded(t *testing.T) {
	const conc = 3
	h := newHarness(t, worker.Config{Concurrency: conc})
	var running, peak atomic.Int32
	h.mux.HandleFunc("tasks.work", func(ctx context.Context, t *worker.Task) (any, error) {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		running.Add(-1)
		return nil, nil
	})
	h.start()
	var ids []string
	for i := 0; i < 40; i++ {
		ids = append(ids, h.send("tasks.work", nil, nil))
	}
	for _, id := range ids {
		h.wait(id)
	}
	if p := peak.Load(); p > conc || p < 2 {
		t.Fatalf("peak concurrency %d, want 2..%d", p, conc)
	}
}

func TestGracefulShutdownFinishesRunningAndReturnsTheRest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, worker.Config{Concurrency: 2, PrefetchMultiplier: 4})
		release := make(chan struct{})
		var started, finished atomic.Int32
		h.mux.HandleFunc("tasks.work", func(ctx context.Context, t *worker.Task) (any, error) {
			started.Add(1)
			<-release
			finished.Add(1)
			return nil, nil
		}, worker.AcksLate(true))
		h.start()
		const total = 20
		for i := 0; i < total; i++ {
			h.send("tasks.work", nil, nil)
		}
		synctest.Wait()
		if started.Load() != 2 {
			t.Fatalf("%d started, want 2", started.Load())
		}
		stopped := h.stopAsync()
		// The two running tasks finish after the shutdown began.
		synctest.Wait()
		close(release)
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
		n, _ := h.tr.Len(context.Background(), "q")
		if int(finished.Load()) != 2 || n != total-2 {
			t.Fatalf("finished %d, left on the broker %d; want 2 and %d", finished.Load(), n, total-2)
		}
	})
}

// TestColdShutdownReturnsInterruptedTasks: a cold shutdown cancels the
// running tasks; the acks_late ones go back to the broker (not FAILURE, not
// dead-lettered), the early-acked ones are recorded as failed, and the
// unstarted ones go back too.
func TestColdShutdownReturnsInterruptedTasks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, worker.Config{Concurrency: 2, PrefetchMultiplier: 4, ShutdownTimeout: time.Minute})
		block := func(ctx context.Context, t *worker.Task) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		h.mux.HandleFunc("tasks.late", block, worker.AcksLate(true))
		h.mux.HandleFunc("tasks.early", block)
		h.start()
		late := h.send("tasks.late", nil, nil)
		early := h.send("tasks.early", nil, nil)
		const unstarted = 5
		for i := 0; i < unstarted; i++ {
			h.send("tasks.late", nil, nil)
		}
		synctest.Wait()
		stopped := h.stopAsync()
		time.Sleep(time.Second) // the warm shutdown has begun and waits
		h.w.Close()
		begin := time.Now()
		err := <-stopped
		var se *worker.ShutdownError
		if !errors.As(err, &se) || se.Cancelled != 2 || se.Abandoned != 0 {
			t.Fatalf("Run = %v, want a ShutdownError: 2 cancelled, none abandoned", err)
		}
		if took := time.Since(begin); took != 0 {
			t.Fatalf("the cold shutdown took %v after Close; the cancelled tasks return at once", took)
		}
		if n, _ := h.tr.Len(context.Background(), "q"); n != unstarted+1 {
			t.Fatalf("%d messages on the broker, want %d (the unstarted ones and the interrupted acks_late one)", n, unstarted+1)
		}
		if m, err := h.be.Get(context.Background(), late); err == nil && m.Status != protocol.StatePending {
			t.Fatalf("interrupted acks_late task recorded %s; it should run again", m.Status)
		}
		if m, _ := h.be.Get(context.Background(), early); m == nil || m.Status != protocol.StateFailure {
			t.Fatalf("interrupted early-acked task: %+v, want FAILURE", m)
		}
		if dead, _ := h.tr.DeadLetters(context.Background(), "q", 0); len(dead) != 0 {
			t.Fatalf("%d dead letters after a cold shutdown, want none", len(dead))
		}
	})
}

func TestRunTwice(t *testing.T) {
	h := newHarness(t, worker.Config{})
	h.mux.HandleFunc("tasks.add", add)
	h.start()
	h.wait(h.send("tasks.add", []any{int64(1), int64(1)}, nil)) // the first Run is running
	if err := h.w.Run(context.Background()); !errors.Is(err, worker.ErrWorkerClosed) {
		t.Fatalf("second Run = %v", err)
	}
}

func TestMuxPanicsOnBadRegistration(t *testing.T) {
	for name, f := range map[string]func(m *worker.Mux){
		"empty name": func(m *worker.Mux) { m.HandleFunc("", add) },
		"nil":        func(m *worker.Mux) { m.Handle("x", nil) },
		"duplicate":  func(m *worker.Mux) { m.HandleFunc("x", add); m.HandleFunc("x", add) },
		"bad rate":   func(m *worker.Mux) { m.HandleFunc("x", add, worker.RateLimit("ten/s")) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f(worker.NewMux())
		})
	}
}

func TestHeldTaskExpiringBeforeItsETAIsRevokedAtExpiry(t *testing.T) {
	h := newHarness(t, worker.Config{})
	var ran atomic.Bool
	h.mux.HandleFunc("tasks.add", func(ctx context.Context, t *worker.Task) (any, error) {
		ran.Store(true)
		return nil, nil
	})
	h.start()
	id := h.send("tasks.add", nil, nil, client.Countdown(time.Hour), client.Expires(time.Now().Add(100*time.Millisecond)))
	m := h.wait(id) // within the harness timeout, far less than the hour of countdown
	if m.Status != protocol.StateRevoked || exc(t, m).Message[0] != "expired" || ran.Load() {
		t.Fatalf("got %s %+v (ran=%v)", m.Status, m.Result, ran.Load())
	}
}

// waitRecorder is an Observer that counts waits by task and reason.
type waitRecorder struct {
	mu    sync.Mutex
	waits map[string]int // "task reason"
}

func (r *waitRecorder) TaskReceived(string) {}
func (r *waitRecorder) TaskWaiting(name, reason string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waits == nil {
		r.waits = map[string]int{}
	}
	r.waits[name+" "+reason]++
}
func (r *waitRecorder) TaskStarted(string)                                 {}
func (r *waitRecorder) TaskFinished(string, worker.Outcome, time.Duration) {}
func (r *waitRecorder) MessageRejected(string)                             {}

func (r *waitRecorder) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waits[key]
}

func TestGlobalRateLimitSpacesStartsWithoutHoldingSlots(t *testing.T) {
	limiter := membackend.NewRateLimiter()
	obs := &waitRecorder{}
	h := newHarness(t, worker.Config{Concurrency: 4, GlobalRateLimiter: limiter, Observer: obs})
	var mu sync.Mutex
	var starts []time.Time
	h.mux.HandleFunc("sms.send", func(ctx context.Context, t *worker.Task) (any, error) {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		return nil, nil
	}, worker.GlobalRateLimit("20/s", "sms-api", 1))
	h.mux.HandleFunc("tasks.add", add)
	h.start()
	var ids []string
	for i := 0; i < 10; i++ {
		ids = append(ids, h.send("sms.send", nil, nil))
	}
	// Rate-limited tasks wait without a slot: an unlimited task still runs
	// at once with all four slots free.
	if m := h.wait(h.send("tasks.add", []any{int64(1), int64(2)}, nil)); m.Result != int64(3) {
		t.Fatalf("got %v", m.Result)
	}
	for _, id := range ids {
		h.wait(id)
	}
	mu.Lock()
	defer mu.Unlock()
	// 10 starts at 20/s with a burst of 1 take at least 9 intervals of 50ms.
	if span := starts[len(starts)-1].Sub(starts[0]); span < 9*50*time.Millisecond-20*time.Millisecond {
		t.Fatalf("10 starts spanned %v, want >= ~450ms at 20/s", span)
	}
	// The waits are observable (celeriac_task_waits_total{reason="global-rate-limit"}):
	// with a burst of 1, at least 9 of the 10 waited for a token.
	if n := obs.count("sms.send " + worker.WaitGlobalRate); n < 9 {
		t.Fatalf("%d global rate-limit waits observed, want at least 9", n)
	}
}

func TestIgnoreResultStoresNothingOnSuccess(t *testing.T) {
	// Concurrency 1 and one FIFO queue: when the last task's result is
	// stored, the earlier ones have finished.
	h := newHarness(t, worker.Config{Concurrency: 1})
	h.mux.HandleFunc("tasks.quiet", func(ctx context.Context, t *worker.Task) (any, error) { return 1, nil }, worker.IgnoreResult(true))
	h.mux.HandleFunc("tasks.loud", func(ctx context.Context, t *worker.Task) (any, error) { return 1, nil })
	h.mux.HandleFunc("tasks.quietfail", func(ctx context.Context, t *worker.Task) (any, error) { return nil, errBoom }, worker.IgnoreResult(true))
	h.start()
	quiet := h.send("tasks.quiet", nil, nil)
	header := h.send("tasks.loud", nil, nil, client.IgnoreResult(true)) // the client's ignore_result=True
	failing := h.send("tasks.quietfail", nil, nil)
	h.wait(h.send("tasks.loud", nil, nil))
	for _, id := range []string{quiet, header, failing} {
		if m, err := h.be.Get(context.Background(), id); err == nil {
			t.Errorf("%s: state %s stored despite ignore_result", id, m.Status)
		}
	}
}

func TestStoreErrorsEvenIfIgnored(t *testing.T) {
	h := newHarness(t, worker.Config{StoreErrorsEvenIfIgnored: true})
	h.mux.HandleFunc("tasks.quietfail", func(ctx context.Context, t *worker.Task) (any, error) { return nil, errBoom }, worker.IgnoreResult(true))
	h.start()
	if m := h.wait(h.send("tasks.quietfail", nil, nil)); m.Status != protocol.StateFailure {
		t.Fatalf("got %s", m.Status)
	}
}

func TestQueueOrderStrictAndWeighted(t *testing.T) {
	run := func(t *testing.T, order worker.QueueOrder, weights map[string]int) []string {
		t.Helper()
		// Concurrency 1, prefetch large enough to hold everything: the order
		// of starts is the worker's choice between queues, not the broker's.
		h := newHarness(t, worker.Config{Queues: []string{"high", "low"}, QueueOrder: order, QueueWeights: weights,
			Concurrency: 1, PrefetchMultiplier: 100})
		var mu sync.Mutex
		var seen []string
		gate, gated := make(chan struct{}), make(chan struct{})
		h.mux.HandleFunc("tasks.gate", func(ctx context.Context, t *worker.Task) (any, error) {
			close(gated)
			<-gate
			return nil, nil
		})
		h.mux.HandleFunc("tasks.rec", func(ctx context.Context, t *worker.Task) (any, error) {
			mu.Lock()
			seen = append(seen, t.DeliveryInfo.Queue)
			mu.Unlock()
			return nil, nil
		})
		h.start()
		first := h.send("tasks.gate", nil, nil, client.Queue("low")) // holds the only slot
		<-gated
		var ids []string
		for i := 0; i < 12; i++ {
			ids = append(ids, h.send("tasks.rec", nil, nil, client.Queue("low")))
		}
		for i := 0; i < 6; i++ {
			ids = append(ids, h.send("tasks.rec", nil, nil, client.Queue("high")))
		}
		eventually(t, "all received", func() bool { return h.w.Stats().Ready == 18 })
		close(gate)
		h.wait(first)
		for _, id := range ids {
			h.wait(id)
		}
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
	t.Run("strict", func(t *testing.T) {
		seen := run(t, worker.QueueOrderStrict, nil)
		for i, q := range seen[:6] {
			if q != "high" {
				t.Fatalf("start %d from %s; strict order must run the 6 high tasks first: %v", i, q, seen)
			}
		}
	})
	t.Run("weighted", func(t *testing.T) {
		seen := run(t, worker.QueueOrderWeighted, map[string]int{"high": 2, "low": 1})
		high := 0
		for _, q := range seen[:9] {
			if q == "high" {
				high++
			}
		}
		if high != 6 {
			t.Fatalf("weighted 2:1: %d of the first 9 starts from high, want 6: %v", high, seen)
		}
	})
	t.Run("arrival", func(t *testing.T) {
		// The worker takes tasks in the order it received them, whatever
		// their queue: the high ones do not all jump ahead.
		seen := run(t, worker.QueueOrderArrival, nil)
		high := 0
		for _, q := range seen[:6] {
			if q == "high" {
				high++
			}
		}
		if high == 6 {
			t.Fatalf("arrival order ran all 6 high tasks first: %v", seen)
		}
	})
}

// replyRecorder is a backend that records the reply_to each result is
// stored with (the rpc:// backend sends it there).
type replyRecorder struct {
	*membackend.Backend
	mu      sync.Mutex
	replyTo map[string]string
}

func (b *replyRecorder) Store(ctx context.Context, req backend.StoreRequest) error {
	b.mu.Lock()
	b.replyTo[req.Meta.TaskID] = req.ReplyTo
	b.mu.Unlock()
	return b.Backend.Store(ctx, req)
}

// TestFailedChainStepsGoToTheirReplyTo: when a chain step fails, the
// remaining steps are stored as failed with each step's own reply_to, as
// Celery's mark_as_failure stores them with Context(chain_elem): on rpc://
// a client waiting on the chain's last step gets the failure.
func TestFailedChainStepsGoToTheirReplyTo(t *testing.T) {
	h := newHarness(t, worker.Config{})
	be := &replyRecorder{Backend: h.be, replyTo: map[string]string{}}
	h.cfg.Backend = be
	h.mux.HandleFunc("tasks.fail", func(context.Context, *worker.Task) (any, error) {
		return nil, worker.NewException("ValueError", "x")
	})
	h.mux.HandleFunc("tasks.add", add)
	h.start()
	first := client.NewSignature("tasks.fail", nil, nil, client.TaskID("first"), client.ReplyTo("rq"))
	last := client.NewSignature("tasks.add", []any{int64(1)}, nil, client.TaskID("last"), client.ReplyTo("rq"))
	if _, err := h.prod.Apply(context.Background(), client.Chain(first, last)); err != nil {
		t.Fatal(err)
	}
	if m := h.wait("last"); m.Status != protocol.StateFailure {
		t.Fatalf("the last step is %s, want FAILURE", m.Status)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.replyTo["last"] != "rq" {
		t.Errorf("the last step's failure was stored with reply_to %q, want rq", be.replyTo["last"])
	}
}
