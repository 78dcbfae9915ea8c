package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/transport"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// The retry tests use Redis db 5 (broker on Redis, result backend on both
// brokers, fault switches) and queues named it_rt6_*.
const rt6RedisDB = 5

// rt6Bound bounds every wait: a guard against hangs, never an assertion
// about speed.
const rt6Bound = 90 * time.Second

// outage is the transient error of the Go tasks: the policies retry it.
type outage struct{ what string }

func (e *outage) Error() string { return e.what + " is down" }

// badRequest is a permanent error: excluded from automatic retries.
type badRequest struct{ why string }

func (e *badRequest) Error() string { return "bad request: " + e.why }

// asPython makes Python see err as the builtin exception pyType.
func asPython(pyType string, err error) error {
	return &worker.Exception{Type: pyType, Err: err}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newTaskID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// attempt is one run of a Go handler.
type attempt struct {
	retries int
	at      time.Time
}

// rt6Env is one retry test on one broker: a queue of its own, the Redis
// client of db 5, the attempts the Go handlers saw and the worker's logs.
type rt6Env struct {
	t     *testing.T
	bc    brokerCase
	queue string
	rdb   *goredis.Client
	logs  *observer.ObservedLogs

	mu       sync.Mutex
	attempts map[string][]attempt // by task id
	ids      []string             // task ids whose result keys to delete
}

func rt6Brokers(t *testing.T) []brokerCase {
	redisURL := redisDBURL(t, rt6RedisDB)
	return []brokerCase{
		{"redis", redisURL, redisURL},
		{"rabbitmq", amqpURL(t), redisURL},
	}
}

func eachRT6Broker(t *testing.T, f func(t *testing.T, bc brokerCase)) {
	for _, bc := range rt6Brokers(t) {
		t.Run(bc.name, func(t *testing.T) { f(t, bc) })
	}
}

func isAMQP(bc brokerCase) bool { return connect.Scheme(bc.broker) == "amqp" }

// newRT6 makes the environment of one test and deletes everything it
// created on the brokers when the test ends.
func newRT6(t *testing.T, bc brokerCase, name string) *rt6Env {
	t.Helper()
	opt, err := goredis.ParseURL(bc.backend)
	if err != nil {
		t.Fatal(err)
	}
	e := &rt6Env{t: t, bc: bc, queue: "it_rt6_" + name + "_" + randomHex(4), rdb: goredis.NewClient(opt),
		attempts: map[string][]attempt{}}
	t.Cleanup(func() {
		e.deleteQueue(e.queue)
		ctx := context.Background()
		keys, _ := e.rdb.Keys(ctx, "*"+e.queue+"*").Result()
		e.mu.Lock()
		for _, id := range e.ids {
			keys = append(keys, "celery-task-meta-"+id)
		}
		e.mu.Unlock()
		if len(keys) > 0 {
			e.rdb.Del(ctx, keys...)
		}
		e.rdb.Close()
	})
	return e
}

// deleteQueue removes a task queue with its exchange, dead-letter exchange
// and dead-letter queue (RabbitMQ), or its Redis keys.
func (e *rt6Env) deleteQueue(q string) {
	if !isAMQP(e.bc) {
		ctx := context.Background()
		if keys, _ := e.rdb.Keys(ctx, "*"+q+"*").Result(); len(keys) > 0 {
			e.rdb.Del(ctx, keys...)
		}
		return
	}
	conn, err := amqp091.Dial(e.bc.broker)
	if err != nil {
		return
	}
	defer conn.Close()
	for _, name := range []string{q, q + ".dlq"} {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
			_ = ch.Close()
		}
	}
	for _, name := range []string{q, q + ".dlx"} {
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(name, false, false)
			_ = ch.Close()
		}
	}
}

func (e *rt6Env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(e.t.Context(), rt6Bound)
	e.t.Cleanup(cancel)
	return ctx
}

// newID returns a task id whose result key is deleted after the test.
func (e *rt6Env) newID() string {
	id := newTaskID()
	e.mu.Lock()
	e.ids = append(e.ids, id)
	e.mu.Unlock()
	return id
}

// record notes an attempt of a task and returns how many there were
// before it.
func (e *rt6Env) record(t *worker.Task) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := len(e.attempts[t.ID])
	e.attempts[t.ID] = append(e.attempts[t.ID], attempt{retries: t.Retries, at: time.Now()})
	return n
}

func (e *rt6Env) attemptsOf(id string) []attempt {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.attempts[id])
}

func retriesOf(as []attempt) []int {
	out := make([]int, len(as))
	for i, a := range as {
		out[i] = a.retries
	}
	return out
}

// dlqSetup declares the RabbitMQ dead-letter exchange and queue of q and
// returns the queue arguments that attach them (nil on Redis).
func (e *rt6Env) dlqSetup(q string) map[string]any {
	e.t.Helper()
	if !isAMQP(e.bc) {
		return nil
	}
	tr, err := amqptransport.Dial(e.ctx(), amqptransport.Config{URL: e.bc.broker, ConnectionName: "it-rt6-setup"})
	if err != nil {
		e.t.Fatal(err)
	}
	defer tr.Close()
	args, err := tr.DeclareDeadLetter(e.ctx(), q)
	if err != nil {
		e.t.Fatal(err)
	}
	return args
}

// startWorker runs a celeriac worker on the env's queue with the rt6
// handlers, its logs observed. With qargs the queue is declared with them.
func (e *rt6Env) startWorker(qargs map[string]any, extra func(*worker.Mux)) *goWorker {
	e.t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	e.logs = logs
	cfg := worker.Config{
		Concurrency: 4,
		Logger:      zap.New(zapcore.NewTee(zaptest.NewLogger(e.t).Core(), core)),
	}
	if qargs != nil {
		cfg.QueueArguments = map[string]map[string]any{e.queue: qargs}
	}
	return startGoWorker(e.t, e.bc, e.queue, cfg, func(m *worker.Mux) {
		e.register(m)
		if extra != nil {
			extra(m)
		}
	})
}

// register adds the Go implementations of it_rt6_app's stubs.
func (e *rt6Env) register(m *worker.Mux) {
	transient := retry.Policy{
		AutoRetryFor: []retry.Matcher{retry.OnType[*outage]()},
		MaxRetries:   retry.Limited(3),
		Backoff:      1,
		Jitter:       retry.JitterOff,
	}
	// retry_backoff=True, retry_jitter=False: 1 s, then 2 s.
	m.HandleFunc("rt6.flaky", func(ctx context.Context, t *worker.Task) (any, error) {
		if e.record(t) < 2 {
			return nil, asPython("ConnectionError", &outage{"inventory service"})
		}
		return map[string]any{"ok": true, "retries": t.Retries}, nil
	}, worker.AcksLate(true), worker.Retry(transient))

	// A permanent outage: every attempt fails; 3 retries 200 ms apart.
	quick := transient
	quick.Backoff, quick.Countdown = 0, 200*time.Millisecond
	m.HandleFunc("rt6.down", func(ctx context.Context, t *worker.Task) (any, error) {
		e.record(t)
		return nil, asPython("ConnectionError", &outage{"payment API"})
	}, worker.AcksLate(true), worker.Retry(quick))

	// retry.Skip wins over an AutoRetryFor that matches everything.
	everything := retry.Policy{AutoRetryFor: []retry.Matcher{retry.OnAny()}, MaxRetries: retry.Limited(3),
		Countdown: 200 * time.Millisecond}
	m.HandleFunc("rt6.permanent", func(ctx context.Context, t *worker.Task) (any, error) {
		e.record(t)
		return nil, retry.Skip(asPython("ValueError", errors.New("card declined")))
	}, worker.AcksLate(true), worker.Retry(everything))

	// dont_autoretry_for wins over autoretry_for.
	excluded := everything
	excluded.DontAutoRetryFor = []retry.Matcher{retry.OnType[*badRequest]()}
	m.HandleFunc("rt6.excluded", func(ctx context.Context, t *worker.Task) (any, error) {
		e.record(t)
		return nil, asPython("ValueError", &badRequest{"amount must be positive"})
	}, worker.AcksLate(true), worker.Retry(excluded))

	// A 429 with Retry-After: 3 on the first attempt; the policy's backoff
	// would have waited 1 s.
	m.HandleFunc("rt6.throttled", func(ctx context.Context, t *worker.Task) (any, error) {
		if e.record(t) == 0 {
			return nil, retry.AfterHeader("3", asPython("ConnectionError", &outage{"rate-limited API (429)"}))
		}
		return "sent", nil
	}, worker.AcksLate(true), worker.Retry(transient))

	// Fails while the queue's fault switch in Redis is on.
	m.HandleFunc("rt6.switch", func(ctx context.Context, t *worker.Task) (any, error) {
		e.record(t)
		on, err := e.rdb.Get(ctx, e.faultKey()).Result()
		if err != nil && !errors.Is(err, goredis.Nil) {
			return nil, err
		}
		if on == "on" {
			return nil, asPython("ConnectionError", &outage{"ledger"})
		}
		return map[string]any{"ok": true, "retries": t.Retries}, nil
	}, worker.AcksLate(true), worker.Retry(quick))
}

func (e *rt6Env) faultKey() string { return "it_rt6:fault:" + e.queue }

func (e *rt6Env) setFault(on bool) {
	e.t.Helper()
	var err error
	if on {
		err = e.rdb.Set(e.ctx(), e.faultKey(), "on", 0).Err()
	} else {
		err = e.rdb.Del(e.ctx(), e.faultKey()).Err()
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

// pyEnv is the environment of it_rt6_app for queue q; dlx names the
// RabbitMQ dead-letter exchange Python declares the queue with.
func (e *rt6Env) pyEnv(q, dlx string) map[string]string {
	env := map[string]string{"IT_BROKER": e.bc.broker, "IT_BACKEND": e.bc.backend, "IT_QUEUE": q}
	if dlx != "" {
		env["IT_DLX"] = dlx
	}
	return env
}

// python runs a client script with it_rt6_app's tasks in scope and
// sys.argv[1:] = args; it must print OK last.
func (e *rt6Env) python(env map[string]string, script string, args ...string) string {
	e.t.Helper()
	prelude := "import sys, time\nfrom celery.result import AsyncResult\nfrom it_rt6_app import *\n"
	out := runPython(e.t, 2*rt6Bound, env, prelude+script, args...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if lines[len(lines)-1] != "OK" {
		e.t.Fatalf("python checks failed:\n%s", out)
	}
	return out
}

// stateAt is one state written to the result backend.
type stateAt struct {
	status string
	result json.RawMessage
	at     time.Time
}

// stateWatch records every state the result backend publishes for a set of
// task ids (Celery's Redis backend PUBLISHes each document on the key's
// channel, which is also how AsyncResult.get learns of it).
type stateWatch struct {
	mu     sync.Mutex
	states map[string][]stateAt
	done   chan struct{}
}

// watchStates subscribes before anything is sent, so no state is missed.
func (e *rt6Env) watchStates(ids ...string) *stateWatch {
	e.t.Helper()
	chans := make([]string, len(ids))
	for i, id := range ids {
		chans[i] = "celery-task-meta-" + id
	}
	ps := e.rdb.Subscribe(e.ctx(), chans...)
	if _, err := ps.Receive(e.ctx()); err != nil {
		e.t.Fatalf("subscribe: %v", err)
	}
	w := &stateWatch{states: map[string][]stateAt{}, done: make(chan struct{})}
	ch := ps.Channel()
	go func() {
		defer close(w.done)
		for msg := range ch {
			var doc struct {
				Status string          `json:"status"`
				Result json.RawMessage `json:"result"`
			}
			if err := json.Unmarshal([]byte(msg.Payload), &doc); err != nil {
				doc.Status = "UNDECODABLE " + err.Error()
			}
			id := strings.TrimPrefix(msg.Channel, "celery-task-meta-")
			w.mu.Lock()
			w.states[id] = append(w.states[id], stateAt{status: doc.Status, result: doc.Result, at: time.Now()})
			w.mu.Unlock()
		}
	}()
	e.t.Cleanup(func() {
		ps.Close()
		<-w.done
	})
	return w
}

func (w *stateWatch) of(id string) []stateAt {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.states[id])
}

func statuses(ss []stateAt) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.status
	}
	return out
}

// waitFor polls cond until it holds; the bound only guards against hangs.
func (e *rt6Env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(rt6Bound)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitStates waits until the watch saw n states of id and returns them.
func (e *rt6Env) waitStates(w *stateWatch, id string, n int) []stateAt {
	e.t.Helper()
	e.waitFor(fmt.Sprintf("%d states of %s", n, id), func() bool { return len(w.of(id)) >= n })
	return w.of(id)
}

// deadLetters lists the queue's dead letters through the transport's
// DeadLetterStore (what `celeriac dlq` shows).
func (e *rt6Env) deadLetters(q string) []transport.DeadMessage {
	e.t.Helper()
	conn, err := connect.Open(e.ctx(), connect.Options{BrokerURL: e.bc.broker, ConnectionName: "it-rt6-dlq"})
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	dead, err := conn.Transport.(transport.DeadLetterStore).DeadLetters(e.ctx(), q, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return dead
}

// waitDead waits until q has n dead letters (RabbitMQ dead-letters
// asynchronously).
func (e *rt6Env) waitDead(q string, n int) []transport.DeadMessage {
	e.t.Helper()
	var dead []transport.DeadMessage
	e.waitFor(fmt.Sprintf("%d dead letters in %s", n, q), func() bool {
		dead = e.deadLetters(q)
		return len(dead) == n
	})
	return dead
}

// redisDeadItem is celeriac's Redis dead-letter record, read raw.
type redisDeadItem struct {
	Envelope struct {
		Headers map[string]any `json:"headers"`
	} `json:"envelope"`
	Queue    string `json:"queue"`
	Reason   string `json:"reason"`
	Error    string `json:"error"`
	TaskID   string `json:"task_id"`
	TaskName string `json:"task_name"`
	Time     string `json:"time"`
}

// redisDead reads the dead-letter list of q straight from Redis.
func (e *rt6Env) redisDead(q string) []redisDeadItem {
	e.t.Helper()
	raws, err := e.rdb.LRange(e.ctx(), "celeriac.dead."+q, 0, -1).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	out := make([]redisDeadItem, len(raws))
	for i, r := range raws {
		if err := json.Unmarshal([]byte(r), &out[i]); err != nil {
			e.t.Fatalf("dead item %q: %v", r, err)
		}
	}
	return out
}

// checkDead checks that the message of task id is dead in q as it should
// be on this broker: on RabbitMQ with RabbitMQ's x-death header (rejected
// from q once), on Redis in the dead-letter list with the reason, the
// exception and the time.
func (e *rt6Env) checkDead(q, id, reason, exception string, retries int) {
	e.t.Helper()
	if isAMQP(e.bc) {
		var dm *transport.DeadMessage
		for _, d := range e.deadLetters(q) {
			if d.ID == id {
				dm = &d
			}
		}
		if dm == nil {
			e.t.Fatalf("task %s is not in %s.dlq", id, q)
		}
		deaths, _ := dm.Message.Headers["x-death"].([]any)
		if len(deaths) != 1 {
			e.t.Fatalf("x-death of %s = %#v, want one entry", id, dm.Message.Headers["x-death"])
		}
		d, _ := deaths[0].(map[string]any)
		if d["reason"] != "rejected" || d["queue"] != q || fmt.Sprint(d["count"]) != "1" {
			e.t.Errorf("x-death of %s = %v, want rejected once from %s", id, d, q)
		}
		if _, ok := d["time"].(time.Time); !ok {
			e.t.Errorf("x-death of %s has no time: %v", id, d)
		}
		if got := fmt.Sprint(dm.Message.Headers["retries"]); got != fmt.Sprint(retries) {
			e.t.Errorf("dead %s has retries %s, want %d", id, got, retries)
		}
		return
	}
	for _, it := range e.redisDead(q) {
		if it.TaskID != id {
			continue
		}
		tm, err := time.Parse(time.RFC3339Nano, it.Time)
		if it.Reason != reason || !strings.Contains(it.Error, exception) || err != nil || tm.IsZero() ||
			it.TaskName == "" || it.Queue != q || it.Envelope.Headers["id"] != id {
			e.t.Errorf("dead item of %s = %+v, want reason %s, error with %q, a time", id, it, reason, exception)
		}
		if got := fmt.Sprint(it.Envelope.Headers["retries"]); got != fmt.Sprint(retries) {
			e.t.Errorf("dead %s has retries %s, want %d", id, got, retries)
		}
		return
	}
	e.t.Fatalf("task %s is not in celeriac.dead.%s", id, q)
}

// checkFailureLogged checks the worker's error-level record of a terminal
// failure: task id, name, retries and reason.
func (e *rt6Env) checkFailureLogged(id, name string, retries int, reason string) {
	e.t.Helper()
	for _, entry := range e.logs.FilterMessage("task failed").All() {
		f := entry.ContextMap()
		if f["task_id"] != id {
			continue
		}
		if entry.Level != zapcore.ErrorLevel || f["task_name"] != name || fmt.Sprint(f["retries"]) != fmt.Sprint(retries) || f["reason"] != reason {
			e.t.Errorf("terminal failure of %s logged as %s %v, want error with task_name %s, retries %d, reason %s",
				id, entry.Level, f, name, retries, reason)
		}
		return
	}
	e.t.Errorf("no \"task failed\" log entry for %s", id)
}

// TestRetryTransientThenSuccess: a task failing twice with a transient
// error records RETRY twice then SUCCESS, its attempts spaced by the
// backoff (factor 1, no jitter: at least 1 s, then 2 s).
func TestRetryTransientThenSuccess(t *testing.T) {
	eachRT6Broker(t, func(t *testing.T, bc brokerCase) {
		e := newRT6(t, bc, "flaky")
		e.startWorker(nil, nil)
		id := e.newID()
		w := e.watchStates(id)
		e.python(e.pyEnv(e.queue, ""), `
r = flaky.apply_async(task_id=sys.argv[1])
assert r.get(timeout=60) == {"ok": True, "retries": 2}, r.result
assert r.state == "SUCCESS"
print("OK")
`, id)
		states := e.waitStates(w, id, 3)
		if got := statuses(states); !slices.Equal(got, []string{"RETRY", "RETRY", "SUCCESS"}) {
			t.Fatalf("states = %v, want RETRY RETRY SUCCESS", got)
		}
		for _, s := range states[:2] {
			if !strings.Contains(string(s.result), `"exc_type": "ConnectionError"`) && !strings.Contains(string(s.result), `"exc_type":"ConnectionError"`) {
				t.Errorf("RETRY result %s, want the ConnectionError", s.result)
			}
		}
		as := e.attemptsOf(id)
		if got := retriesOf(as); !slices.Equal(got, []int{0, 1, 2}) {
			t.Fatalf("attempts saw retries %v, want 0 1 2", got)
		}
		for i, want := range []time.Duration{time.Second, 2 * time.Second} {
			if gap := as[i+1].at.Sub(as[i].at); gap < want {
				t.Errorf("attempt %d came %v after attempt %d, want at least %v", i+2, gap, i+1, want)
			}
		}
	})
}

// TestRetryExhaustedDeadLetters: max_retries=3 and a permanent outage end
// with FAILURE (the original exception for Python's .get()), the message
// dead (acks_late) and an error-level log record.
func TestRetryExhaustedDeadLetters(t *testing.T) {
	eachRT6Broker(t, func(t *testing.T, bc brokerCase) {
		e := newRT6(t, bc, "down")
		qargs := e.dlqSetup(e.queue)
		e.startWorker(qargs, nil)
		id := e.newID()
		w := e.watchStates(id)
		dlx, _ := qargs["x-dead-letter-exchange"].(string)
		e.python(e.pyEnv(e.queue, dlx), `
r = down.apply_async(("card-42",), task_id=sys.argv[1])
try:
    r.get(timeout=60)
    raise SystemExit("no exception")
except ConnectionError as exc:
    assert str(exc) == "payment API is down", repr(exc)
assert r.state == "FAILURE", r.state
print("OK")
`, id)
		if got := statuses(e.waitStates(w, id, 4)); !slices.Equal(got, []string{"RETRY", "RETRY", "RETRY", "FAILURE"}) {
			t.Fatalf("states = %v, want RETRY×3 FAILURE", got)
		}
		if got := retriesOf(e.attemptsOf(id)); !slices.Equal(got, []int{0, 1, 2, 3}) {
			t.Fatalf("attempts saw retries %v, want 0 1 2 3", got)
		}
		e.waitDead(e.queue, 1)
		e.checkDead(e.queue, id, "max-retries", "ConnectionError", 3)
		e.checkFailureLogged(id, "rt6.down", 3, "max-retries")
	})
}

// TestRetryPermanentNotRetried: retry.Skip and a DontAutoRetryFor match
// fail at the first attempt and dead-letter the message.
func TestRetryPermanentNotRetried(t *testing.T) {
	eachRT6Broker(t, func(t *testing.T, bc brokerCase) {
		e := newRT6(t, bc, "perm")
		qargs := e.dlqSetup(e.queue)
		e.startWorker(qargs, nil)
		skip, excl := e.newID(), e.newID()
		w := e.watchStates(skip, excl)
		dlx, _ := qargs["x-dead-letter-exchange"].(string)
		e.python(e.pyEnv(e.queue, dlx), `
for task, tid, msg in ((permanent, sys.argv[1], "card declined"), (excluded, sys.argv[2], "bad request: amount must be positive")):
    r = task.apply_async(task_id=tid)
    try:
        r.get(timeout=60)
        raise SystemExit("no exception")
    except ValueError as exc:
        assert str(exc) == msg, repr(exc)
print("OK")
`, skip, excl)
		e.waitDead(e.queue, 2)
		for _, c := range []struct{ id, name string }{{skip, "rt6.permanent"}, {excl, "rt6.excluded"}} {
			if got := statuses(w.of(c.id)); !slices.Equal(got, []string{"FAILURE"}) {
				t.Errorf("%s states = %v, want FAILURE only", c.name, got)
			}
			if got := retriesOf(e.attemptsOf(c.id)); !slices.Equal(got, []int{0}) {
				t.Errorf("%s attempts saw retries %v, want one attempt", c.name, got)
			}
			e.checkDead(e.queue, c.id, "permanent", "ValueError", 0)
			e.checkFailureLogged(c.id, c.name, 0, "permanent")
		}
	})
}

// TestRetryAfterWinsOverBackoff: a Retry-After of 3 s replaces the 1 s the
// backoff would have waited.
func TestRetryAfterWinsOverBackoff(t *testing.T) {
	eachRT6Broker(t, func(t *testing.T, bc brokerCase) {
		e := newRT6(t, bc, "429")
		e.startWorker(nil, nil)
		id := e.newID()
		w := e.watchStates(id)
		e.python(e.pyEnv(e.queue, ""), `
assert throttled.apply_async(task_id=sys.argv[1]).get(timeout=60) == "sent"
print("OK")
`, id)
		if got := statuses(e.waitStates(w, id, 2)); !slices.Equal(got, []string{"RETRY", "SUCCESS"}) {
			t.Fatalf("states = %v, want RETRY SUCCESS", got)
		}
		as := e.attemptsOf(id)
		if got := retriesOf(as); !slices.Equal(got, []int{0, 1}) {
			t.Fatalf("attempts saw retries %v, want 0 1", got)
		}
		if gap := as[1].at.Sub(as[0].at); gap < 3*time.Second {
			t.Errorf("the retry ran %v after the 429, want at least the Retry-After of 3s", gap)
		}
	})
}

// runCLI runs the built celeriac and returns its stdout; it must exit 0.
func (e *rt6Env) runCLI(bin string, args ...string) string {
	e.t.Helper()
	cmd := exec.CommandContext(e.ctx(), bin, append([]string{"-b", e.bc.broker, "--loglevel", "error"}, args...)...)
	cmd.Env = append(os.Environ(), "CELERY_BROKER_URL=", "CELERY_RESULT_BACKEND=")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		e.t.Fatalf("celeriac %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// TestRetryDLQReplay: dead messages come back with `celeriac dlq replay`.
// With their retries kept, a message that used up max_retries gets exactly
// one attempt (dead again while the fault lasts, done once it is gone);
// with --reset-retries it starts from 0.
func TestRetryDLQReplay(t *testing.T) {
	bin := celeriacBin(t)
	eachRT6Broker(t, func(t *testing.T, bc brokerCase) {
		e := newRT6(t, bc, "replay")
		var qargs map[string]any
		if isAMQP(bc) {
			// The documented path: dlq setup, then the printed arguments.
			out := e.runCLI(bin, "dlq", "setup", e.queue)
			if !strings.Contains(out, `"x-dead-letter-exchange":"`+e.queue+`.dlx"`) {
				t.Fatalf("dlq setup:\n%s", out)
			}
			qargs = map[string]any{"x-dead-letter-exchange": e.queue + ".dlx"}
		}
		e.setFault(true)
		e.startWorker(qargs, nil)
		kept, reset := e.newID(), e.newID()
		w := e.watchStates(kept, reset)
		dlx, _ := qargs["x-dead-letter-exchange"].(string)
		env := e.pyEnv(e.queue, dlx)
		e.python(env, `
for tid in sys.argv[1:]:
    switch.apply_async(task_id=tid)
print("OK")
`, kept, reset)
		e.waitDead(e.queue, 2)
		list := e.runCLI(bin, "dlq", "list", e.queue)
		for _, id := range []string{kept, reset} {
			if !strings.Contains(list, "task=rt6.switch id="+id+" retries=3") {
				t.Errorf("dlq list does not show %s with retries=3:\n%s", id, list)
			}
		}

		// Fault still on, retries kept: one attempt, dead again.
		if out := e.runCLI(bin, "dlq", "replay", e.queue, kept); !strings.Contains(out, "replayed 1 message(s)") {
			t.Fatalf("replay: %s", out)
		}
		e.waitFor("the replayed task to fail again", func() bool { return len(e.attemptsOf(kept)) == 5 })
		e.waitDead(e.queue, 2)
		if got := retriesOf(e.attemptsOf(kept)); !slices.Equal(got, []int{0, 1, 2, 3, 3}) {
			t.Fatalf("attempts of %s saw retries %v, want 0 1 2 3 3", kept, got)
		}

		// Fault gone: both succeed, one with its count, one from 0.
		e.setFault(false)
		if out := e.runCLI(bin, "dlq", "replay", e.queue, kept); !strings.Contains(out, "replayed 1 message(s)") {
			t.Fatalf("replay: %s", out)
		}
		if out := e.runCLI(bin, "dlq", "replay", "--reset-retries", e.queue, reset); !strings.Contains(out, "replayed 1 message(s)") {
			t.Fatalf("replay --reset-retries: %s", out)
		}
		for _, id := range []string{kept, reset} {
			e.waitFor("SUCCESS of "+id, func() bool {
				ss := w.of(id)
				return len(ss) > 0 && ss[len(ss)-1].status == "SUCCESS"
			})
		}
		e.waitDead(e.queue, 0)
		if got := retriesOf(e.attemptsOf(kept)); !slices.Equal(got, []int{0, 1, 2, 3, 3, 3}) {
			t.Errorf("attempts of %s saw retries %v, want 0 1 2 3 3 3", kept, got)
		}
		if got := retriesOf(e.attemptsOf(reset)); !slices.Equal(got, []int{0, 1, 2, 3, 0}) {
			t.Errorf("attempts of %s saw retries %v, want 0 1 2 3 0", reset, got)
		}
		e.python(env, `
assert AsyncResult(sys.argv[1], app=app).get(timeout=30) == {"ok": True, "retries": 3}
assert AsyncResult(sys.argv[2], app=app).get(timeout=30) == {"ok": True, "retries": 0}
print("OK")
`, kept, reset)
	})
}

// TestRetryCrossLanguage: the retries count survives a hand-over between
// celeriac and a Python worker, both ways.
func TestRetryCrossLanguage(t *testing.T) {
	eachRT6Broker(t, func(t *testing.T, bc brokerCase) {
		t.Run("go-to-python", func(t *testing.T) {
			e := newRT6(t, bc, "g2p")
			gw := e.startWorker(nil, func(m *worker.Mux) {
				m.HandleFunc("rt6.xlang", func(ctx context.Context, t *worker.Task) (any, error) {
					e.record(t)
					if t.Retries == 0 {
						return nil, retry.After(2*time.Second, errors.New("handing over to Python"))
					}
					return map[string]any{"by": "go", "retries": t.Retries}, nil
				})
			})
			id := e.newID()
			w := e.watchStates(id)
			env := e.pyEnv(e.queue, "")
			e.python(env, `
xlang.apply_async(task_id=sys.argv[1])
print("OK")
`, id)
			e.waitStates(w, id, 1)
			// celeriac published the retry (retries 1); stopping it returns
			// the held message to the broker for the Python worker.
			gw.stop(t)
			startPythonWorker(t, env, "it_rt6_app", "-Q", e.queue, "-P", "solo", "-c", "1", "-n", "py-"+e.queue+"@%h",
				"--without-gossip", "--without-mingle", "--without-heartbeat")
			e.python(env, `
r = AsyncResult(sys.argv[1], app=app)
assert r.get(timeout=60) == {"by": "python", "retries": 1}, r.result
print("OK")
`, id)
			if got := retriesOf(e.attemptsOf(id)); !slices.Equal(got, []int{0}) {
				t.Errorf("celeriac ran the task with retries %v, want only the first attempt", got)
			}
			if got := statuses(e.waitStates(w, id, 2)); !slices.Equal(got, []string{"RETRY", "SUCCESS"}) {
				t.Errorf("states = %v, want RETRY (celeriac) SUCCESS (Python)", got)
			}
		})
		t.Run("python-to-go", func(t *testing.T) {
			e := newRT6(t, bc, "p2g")
			pyQueue := e.queue + "_py"
			t.Cleanup(func() { e.deleteQueue(pyQueue) })
			e.startWorker(nil, func(m *worker.Mux) {
				m.HandleFunc("rt6.xlang", func(ctx context.Context, t *worker.Task) (any, error) {
					e.record(t)
					return map[string]any{"by": "go", "retries": t.Retries}, nil
				})
			})
			env := e.pyEnv(pyQueue, "")
			startPythonWorker(t, env, "it_rt6_app", "-Q", pyQueue, "-P", "solo", "-c", "1", "-n", "py-"+pyQueue+"@%h",
				"--without-gossip", "--without-mingle", "--without-heartbeat")
			id := e.newID()
			w := e.watchStates(id)
			e.python(env, `
r = xlang.apply_async(kwargs={"go_queue": sys.argv[2]}, task_id=sys.argv[1])
assert r.get(timeout=60) == {"by": "go", "retries": 1}, r.result
print("OK")
`, id, e.queue)
			as := e.attemptsOf(id)
			if got := retriesOf(as); !slices.Equal(got, []int{1}) {
				t.Errorf("celeriac ran the task with retries %v, want once with 1", got)
			}
			if got := statuses(e.waitStates(w, id, 2)); !slices.Equal(got, []string{"RETRY", "SUCCESS"}) {
				t.Errorf("states = %v, want RETRY (Python) SUCCESS (celeriac)", got)
			}
		})
	})
}

// TestRetryDeadLetterPolicy attaches the dead-letter exchange to an
// existing queue with a RabbitMQ policy: neither celeriac nor Python
// declares any queue argument, and the dead message still lands in
// <queue>.dlq with x-death.
func TestRetryDeadLetterPolicy(t *testing.T) {
	bc := brokerCase{"rabbitmq", amqpURL(t), redisDBURL(t, rt6RedisDB)}
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		unavailable(t, "rabbitmqctl not found: %v", err)
	}
	// rabbitmqctl manages the local node only.
	if u, err := url.Parse(bc.broker); err != nil {
		t.Fatalf("broker URL: %v", err)
	} else if h := u.Hostname(); h != "127.0.0.1" && h != "localhost" {
		t.Skipf("the broker %s is not the local node rabbitmqctl manages", u.Redacted())
	}
	e := newRT6(t, bc, "policy")
	e.dlqSetup(e.queue)
	e.startWorker(nil, nil) // the queue exists, without arguments
	policy := e.queue
	rabbitmqctl := func(args ...string) string {
		out, err := exec.CommandContext(e.ctx(), "rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "-q", "clear_policy", policy).Run() })
	rabbitmqctl("set_policy", policy, "^"+e.queue+"$", `{"dead-letter-exchange":"`+e.queue+`.dlx"}`,
		"--apply-to", "queues", "--priority", "50")
	e.waitFor("the policy to apply to "+e.queue, func() bool {
		for _, line := range strings.Split(rabbitmqctl("list_queues", "name", "policy"), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == e.queue && f[1] == policy {
				return true
			}
		}
		return false
	})
	id := e.newID()
	e.python(e.pyEnv(e.queue, ""), `
r = permanent.apply_async(task_id=sys.argv[1])
try:
    r.get(timeout=60)
    raise SystemExit("no exception")
except ValueError as exc:
    assert str(exc) == "card declined", repr(exc)
print("OK")
`, id)
	e.waitDead(e.queue, 1)
	e.checkDead(e.queue, id, "permanent", "ValueError", 0)
	e.checkFailureLogged(id, "rt6.permanent", 0, "permanent")
}
