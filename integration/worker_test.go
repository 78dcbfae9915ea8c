package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap/zaptest"

	"github.com/celeriac/celeriac/examples/demotasks"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// Redis db 15 is the worker integration tests' own.
const workerRedisDB = 15

// brokerCase is one broker + result backend combination the worker tests
// run on.
type brokerCase struct {
	name    string
	broker  string
	backend string
}

func workerBrokers(t *testing.T) []brokerCase {
	redisURL := redisDBURL(t, workerRedisDB)
	return []brokerCase{
		{"redis", redisURL, redisURL},
		{"rabbitmq", amqpURL(t), redisURL},
	}
}

// uniqueQueue returns a queue name no other test uses, and removes the
// queue from the broker when the test ends.
func uniqueQueue(t *testing.T, bc brokerCase) string {
	t.Helper()
	q := fmt.Sprintf("it_w_%s_%d", strings.ToLower(strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())), time.Now().UnixNano()%1e9)
	if len(q) > 120 {
		q = q[len(q)-120:]
	}
	t.Cleanup(func() { deleteQueue(t, bc, q) })
	return q
}

func deleteQueue(t *testing.T, bc brokerCase, q string) {
	switch connect.Scheme(bc.broker) {
	case "amqp":
		conn, err := amqp091.Dial(bc.broker)
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(q, false, false, false)
		_ = ch.ExchangeDelete(q, false, false)
	case "redis":
		opt, err := goredis.ParseURL(bc.broker)
		if err != nil {
			return
		}
		rdb := goredis.NewClient(opt)
		defer rdb.Close()
		ctx := context.Background()
		keys := []string{q, q + "\x06\x163", q + "\x06\x166", q + "\x06\x169", "_kombu.binding." + q}
		rdb.Del(ctx, keys...)
	}
}

// goWorker is a celeriac worker running inside the test process.
type goWorker struct {
	w      *worker.Worker
	conn   *connect.Conn
	cancel context.CancelFunc
	done   chan error

	mu   sync.Mutex
	runs map[string]int // executions by task name
}

// startGoWorker runs a worker with the demo tasks (plus extra handlers) on
// queue, until the test ends.
func startGoWorker(t *testing.T, bc brokerCase, queue string, cfg worker.Config, extra func(*worker.Mux)) *goWorker {
	t.Helper()
	ctx := context.Background()
	conn, err := connect.Open(ctx, connect.Options{BrokerURL: bc.broker, ResultBackend: bc.backend,
		Logger: zaptest.NewLogger(t), ConnectionName: "it-" + queue, RedisStagedPop: itStagedPop()})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	gw := &goWorker{conn: conn, runs: map[string]int{}}
	mux := worker.NewMux()
	if extra != nil {
		extra(mux)
	}
	registered := map[string]bool{}
	for _, n := range mux.Names() {
		registered[n] = true
	}
	for _, dt := range demotasks.Tasks() {
		if !registered[dt.Name] {
			mux.Handle(dt.Name, dt.Handler, dt.Options...)
		}
	}
	mux.Use(func(next worker.Handler) worker.Handler {
		return worker.HandlerFunc(func(ctx context.Context, task *worker.Task) (any, error) {
			gw.mu.Lock()
			gw.runs[task.Name]++
			gw.mu.Unlock()
			return next.HandleTask(ctx, task)
		})
	})
	if len(cfg.Queues) == 0 {
		cfg.Queues = []string{queue}
	}
	cfg.Backend = conn.Backend
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	if cfg.Hostname == "" {
		cfg.Hostname = "go-" + queue + "@%h"
	}
	w, err := worker.New(conn.Transport, mux, cfg)
	if err != nil {
		t.Fatal(err)
	}
	gw.w = w
	runCtx, cancel := context.WithCancel(ctx)
	gw.cancel = cancel
	gw.done = make(chan error, 1)
	go func() { gw.done <- w.Run(runCtx) }()
	t.Cleanup(func() {
		gw.stop(t)
		conn.Close()
	})
	return gw
}

func (g *goWorker) stop(t *testing.T) {
	if g.cancel == nil {
		return
	}
	g.cancel()
	g.cancel = nil
	select {
	case err := <-g.done:
		if err != nil {
			t.Errorf("worker.Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Errorf("worker did not stop")
	}
}

func (g *goWorker) ran(name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.runs[name]
}

// pyClient runs a Python client script against the queue; the script has
// it_worker_app's tasks in scope (add, echo, fail, ...) and must print OK
// on its last line when its checks pass.
func pyClient(t *testing.T, bc brokerCase, queue, script string) string {
	t.Helper()
	out := runPython(t, 120*time.Second, pyClientEnv(bc, queue), pyClientPrelude+script)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if lines[len(lines)-1] != "OK" {
		t.Fatalf("python checks failed:\n%s", out)
	}
	return out
}

// pyClientEnv configures it_worker_app for the broker case and queue.
func pyClientEnv(bc brokerCase, queue string) map[string]string {
	return map[string]string{"IT_BROKER": pyBrokerURL(bc.broker), "IT_BACKEND": bc.backend, "IT_QUEUE": queue}
}

// pyClientPrelude puts it_worker_app's tasks and helpers in scope.
const pyClientPrelude = "import time, datetime, decimal, uuid\nfrom celery import chain, group, chord, signature\nfrom it_worker_app import *\n"

// pyBrokerURL converts a celeriac AMQP URL for kombu (same syntax; kept as a
// seam for URL differences).
func pyBrokerURL(u string) string { return u }

func eachBroker(t *testing.T, f func(t *testing.T, bc brokerCase)) {
	for _, bc := range workerBrokers(t) {
		t.Run(bc.name, func(t *testing.T) { f(t, bc) })
	}
}

func TestWorkerPythonClientBasics(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		startGoWorker(t, bc, q, worker.Config{Concurrency: 4}, nil)
		pyClient(t, bc, q, `
assert add.delay(2, 3).get(timeout=20) == 5
values = [None, True, False, 0, -1, 2**31, 2**63 - 1, 2**64, -(10**30), 1.5, -0.0, 1e300, "", "x",
          "ünïcödé ☃ 𝄞", [], {}, [1, [2, [3, [4]]]], {"a": {"b": [1, None, {"c": "d"}]}}, 1.0]
r = echo.delay(*values, kw=values, nested={"k": values})
got = r.get(timeout=20)
assert got["args"] == values, (got["args"], values)
assert got["kwargs"] == {"kw": values, "nested": {"k": values}}, got["kwargs"]
assert type(got["args"][-1]) is float and type(got["args"][3]) is int, got["args"]
big = "x" * (1 << 20)
assert echo.delay(big).get(timeout=30)["args"][0] == big
assert r.state == "SUCCESS" and r.successful()
print("OK")
`)
	})
}

func TestWorkerPythonFailuresAndBadTasks(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		gw := startGoWorker(t, bc, q, worker.Config{Concurrency: 2}, func(m *worker.Mux) {
			m.HandleFunc("tasks.panic", func(ctx context.Context, t *worker.Task) (any, error) { panic("kaboom") })
		})
		pyClient(t, bc, q, `
from celery.exceptions import NotRegistered
panic = app.signature("tasks.panic")
r = fail.delay("bad thing")
try:
    r.get(timeout=20)
    raise SystemExit("no exception")
except ValueError as e:
    assert str(e) == "bad thing", repr(e)
assert r.state == "FAILURE", r.state
assert "ValueError: bad thing" in r.traceback, r.traceback
assert isinstance(r.date_done, datetime.datetime), r.date_done
p = panic.delay()
try:
    p.get(timeout=20)
    raise SystemExit("panic did not fail")
except RuntimeError as e:
    assert "kaboom" in str(e), repr(e)
assert "kaboom" in p.traceback and "goroutine" in p.traceback, p.traceback
n = nope.delay()
try:
    n.get(timeout=20)
    raise SystemExit("unknown task did not fail")
except NotRegistered as e:
    assert "tasks.nope" in str(e), repr(e)
assert add.delay(20, 22).get(timeout=20) == 42
print("OK")
`)
		if gw.ran("tasks.panic") != 1 {
			t.Errorf("panic task ran %d times", gw.ran("tasks.panic"))
		}
	})
}

func TestWorkerPythonCountdownExpiresTimeLimits(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		var mu sync.Mutex
		starts := map[string]time.Time{}
		startGoWorker(t, bc, q, worker.Config{Concurrency: 4}, func(m *worker.Mux) {
			m.HandleFunc("tasks.stamp", func(ctx context.Context, t *worker.Task) (any, error) {
				now := time.Now()
				mu.Lock()
				starts[t.ID] = now
				mu.Unlock()
				return float64(now.UnixNano()) / 1e9, nil
			})
		})
		out := pyClient(t, bc, q, `
from celery.exceptions import TaskRevokedError, TimeLimitExceeded, SoftTimeLimitExceeded
stamp = app.signature("tasks.stamp")
sent = time.time()
r = stamp.apply_async(countdown=2)
started = r.get(timeout=30)
assert started - sent >= 2.0, ("countdown=2 started after", started - sent)
print("countdown_delay", started - sent)
e = stamp.apply_async(countdown=3, expires=1)
try:
    e.get(timeout=30)
    raise SystemExit("expired task ran")
except TaskRevokedError:
    pass
assert e.state == "REVOKED", e.state
h = sleep.apply_async(args=[30], time_limit=1)
try:
    h.get(timeout=30)
    raise SystemExit("hard limit did not fire")
except TimeLimitExceeded:
    pass
s = sleep.apply_async(args=[30], soft_time_limit=1)
try:
    s.get(timeout=30)
    raise SystemExit("soft limit did not fire")
except SoftTimeLimitExceeded:
    pass
print("OK")
`)
		t.Log(strings.TrimSpace(out))
		mu.Lock()
		defer mu.Unlock()
		if len(starts) != 1 {
			t.Errorf("stamp ran %d times, want 1 (the expired one must not run)", len(starts))
		}
	})
}

func TestWorkerPythonCanvas(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		startGoWorker(t, bc, q, worker.Config{Concurrency: 4}, nil)
		pyClient(t, bc, q, `
tsum = app.signature("tasks.tsum")
res = chain(add.s(1, 2), add.s(3), add.s(4))()
assert res.get(timeout=30) == 10
assert res.parent.get(timeout=5) == 6 and res.parent.parent.get(timeout=5) == 3
g = group(add.s(i, i) for i in range(10))()
assert g.get(timeout=30) == [2 * i for i in range(10)]
c = chord([add.s(i, i) for i in range(10)], tsum)()
assert c.get(timeout=30) == 90
l = add.apply_async((2, 2), link=add.s(10))
assert l.get(timeout=30) == 4
child = l.children[0] if l.children else None
assert child is not None and child.get(timeout=30) == 14, l.children
eb = fail.apply_async(("boom",), link_error=echo.s())
try:
    eb.get(timeout=30)
except ValueError:
    pass
# The errback receives the failed task's id, as Celery sends it.
wait_errback_called_with(eb.id)
bad = chord([add.s(1, 1), fail.s("x")], tsum)()
try:
    bad.get(timeout=30)
    raise SystemExit("chord with a failing header succeeded")
except ValueError as e:
    # As with a Python worker: get() re-raises the failed header task's error.
    assert str(e) == "x", repr(e)
body = app.AsyncResult(bad.id)
deadline = time.time() + 20
while body.state != "FAILURE" and time.time() < deadline:
    time.sleep(0.1)
assert body.state == "FAILURE", body.state
assert type(body.result).__name__ == "ChordError" and "Dependency" in str(body.result) and "ValueError('x')" in str(body.result), repr(body.result)
print("OK")
`)
	})
}

// idsTask returns the ids a task ran with, and its args, so that a Python
// client can check what a chain step or group member was sent with.
func idsTask(mux *worker.Mux) {
	mux.HandleFunc("it_cv.ids", func(ctx context.Context, task *worker.Task) (any, error) {
		return map[string]any{"id": task.ID, "parent_id": task.ParentID, "root_id": task.RootID,
			"group_id": task.GroupID, "args": task.Args}, nil
	})
}

// TestWorkerPythonCanvasDetails: the ids Celery sets on chain steps, group
// members and a chord body behind a chain step, group_id and parent_id in
// the result meta, and a chord's
// failure reaching the body's errback, with a Python client on both
// brokers.
func TestWorkerPythonCanvasDetails(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		startGoWorker(t, bc, q, worker.Config{Concurrency: 4}, idsTask)
		pyClient(t, bc, q, `
ids = app.signature("it_cv.ids")
tsum = app.signature("tasks.tsum")
# Chain: each step gets the previous result first, its pre-assigned id,
# parent_id = the previous step and root_id = the first step, as a Python
# worker sets them.
c = chain(ids.clone(), ids.clone(), ids.clone())()
last = c.get(timeout=30)
second, first = c.parent, c.parent.parent
assert last["id"] == c.id and last["parent_id"] == second.id and last["root_id"] == first.id, (last, c.id, second.id, first.id)
mid = last["args"][0]
assert mid["id"] == second.id and mid["parent_id"] == first.id and mid["root_id"] == first.id, mid
assert mid["args"][0]["id"] == first.id and mid["args"][0]["root_id"] == first.id, mid
# A step stores its result after sending the next step (Celery applies
# callbacks first, to fill in children), so the last step can finish before
# the one before it is stored: wait for each meta, as a client would.
def meta(task_id):
    deadline = time.time() + 20
    m = app.backend.get_task_meta(task_id)
    while m.get("status") != "SUCCESS" and time.time() < deadline:
        time.sleep(0.05)
        m = app.backend.get_task_meta(task_id)
    return m
assert meta(c.id).get("parent_id") == second.id, meta(c.id)
assert meta(second.id).get("parent_id") == first.id, meta(second.id)
# A chord behind a chain step: the worker that runs the step applies the
# chord, and chord.run gives the body that step as parent_id (and its
# root_id), whichever header task later completes the chord and sends the
# body (a Python worker gives the same).
c = chain(ids.clone(), chord([ids.clone(), ids.clone()], ids.clone()))()
body = c.get(timeout=30)
first = c.parent.parent
assert body["id"] == c.id and body["parent_id"] == first.id and body["root_id"] == first.id, (body, first.id)
for part in body["args"][0]:
    assert part["parent_id"] == first.id and part["root_id"] == first.id, (part, first.id)
# Group: every member knows its group, in the message and in the result meta.
g = group(ids.clone(args=(i,)) for i in range(5))()
got = g.get(timeout=30)
assert [r["args"] for r in got] == [[i] for i in range(5)], got
for child, r in zip(g.results, got):
    assert r["group_id"] == g.id and r["id"] == child.id, (r, g.id)
    assert app.backend.get_task_meta(child.id).get("group_id") == g.id, app.backend.get_task_meta(child.id)
# A chord whose header fails: the body's errback gets the body's id, as
# Celery's chord_error_from_stack sends it.
bad = chord([add.s(1, 1), fail.s("x")], tsum.clone().on_error(echo.s()))()
try:
    bad.get(timeout=30)
    raise SystemExit("chord with a failing header succeeded")
except ValueError:
    pass
wait_errback_called_with(bad.id)
# msgpack tasks, json results: the result follows result_serializer, not
# the task's serializer (the Redis backend stores no content type).
app.conf.task_serializer = "msgpack"
r = echo.delay(1, "two", [3.5, None], k={"x": True})
assert r.get(timeout=30) == {"args": [1, "two", [3.5, None]], "kwargs": {"k": {"x": True}}}, r.result
raw = app.backend.client.get(app.backend.get_key_for_task(r.id))
assert raw.startswith(b"{"), raw[:40]
print("OK")
`)
	})
}
