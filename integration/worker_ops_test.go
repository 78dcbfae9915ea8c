package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// celeriacBin builds cmd/celeriac once per test binary.
func celeriacBin(t testing.TB) string { return buildBin(t, "./cmd/celeriac") }

// workerProc is a `celeriac worker` subprocess.
type workerProc = proc

// startWorkerProc starts `celeriac worker` on bc's broker and backend and
// waits until it consumes; the test's end kills it.
func startWorkerProc(t *testing.T, bc brokerCase, args ...string) *workerProc {
	t.Helper()
	return startProc(t, "celeriac worker", "./cmd/celeriac", procOptions{},
		append([]string{"worker", "--broker", bc.broker, "--result-backend", bc.backend}, args...)...)
}

// outputIDs returns the task ids a Python client printed on its "IDS" line.
func outputIDs(out string) []string {
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "IDS "); ok {
			return strings.Fields(rest)
		}
	}
	return nil
}

// resultStates reads the stored state of each task that has one.
func resultStates(t *testing.T, bc brokerCase, ids []string) map[string]string {
	t.Helper()
	conn, err := connect.Open(context.Background(), connect.Options{BrokerURL: "memory://", ResultBackend: bc.backend})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	states := map[string]string{}
	for _, id := range ids {
		if m, err := conn.Backend.Get(context.Background(), id); err == nil {
			states[id] = string(m.Status)
		}
	}
	return states
}

// readyMessages counts the messages waiting in a queue.
func readyMessages(t *testing.T, bc brokerCase, q string) int {
	t.Helper()
	ctx := context.Background()
	switch connect.Scheme(bc.broker) {
	case "amqp":
		conn, err := amqp091.Dial(bc.broker)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return st.Messages
	default:
		opt, err := goredis.ParseURL(bc.broker)
		if err != nil {
			t.Fatal(err)
		}
		rdb := goredis.NewClient(opt)
		defer rdb.Close()
		n := 0
		for _, k := range []string{q, q + "\x06\x163", q + "\x06\x166", q + "\x06\x169"} {
			l, err := rdb.LLen(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			n += int(l)
		}
		return n
	}
}

// TestWorkerSIGTERMFinishesRunningLeavesTheRest: a warm shutdown during
// work finishes the running tasks and returns every unstarted one to the
// broker, counted.
func TestWorkerSIGTERMFinishesRunningLeavesTheRest(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		const total = 10
		const held = 3 // ETA tasks the worker holds when the signal comes
		p := startWorkerProc(t, bc, "-Q", q, "-c", "2", "--track-started", "-n", "sigterm-"+q+"@%h")
		out := pyClient(t, bc, q, fmt.Sprintf(`
# Held for an hour: back on the broker after the shutdown. Expired on
# arrival: not run, REVOKED, and acknowledged (so not back on the broker).
for _ in range(%d):
    add.apply_async((1, 1), countdown=3600)
exp = add.apply_async((1, 1), expires=datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=5))
deadline = time.time() + 20
while exp.state != "REVOKED" and time.time() < deadline:
    time.sleep(0.05)
assert exp.state == "REVOKED", exp.state
ids = [sleep.delay(2).id for _ in range(%d)]
wait_started(ids, 2)
print("IDS", " ".join(ids))
print("OK")
`, held, total))
		ids := outputIDs(out)
		p.signalAndWait(t, syscall.SIGTERM, 30*time.Second)
		succeeded := 0
		for _, st := range resultStates(t, bc, ids) {
			if st == "SUCCESS" {
				succeeded++
			}
		}
		left := readyMessages(t, bc, q)
		t.Logf("after SIGTERM: %d succeeded, %d back on the broker, of %d and %d held for their ETA", succeeded, left, total, held)
		if succeeded != 2 || left != total-2+held {
			t.Fatalf("succeeded %d, left on the broker %d; want 2 and %d\n%s", succeeded, left, total-2+held, p.Log())
		}
	})
}

// TestWorkerColdShutdown: a second signal during the warm shutdown of
// `celeriac worker` cancels the running acks_late tasks at once, and their
// messages go back to the broker with the unstarted ones: nothing is
// recorded as failed or dead-lettered.
func TestWorkerColdShutdown(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		const total = 6
		p := startWorkerProc(t, bc, "-Q", q, "-c", "2", "--acks-late", "--track-started", "-n", "cold-"+q+"@%h")
		out := pyClient(t, bc, q, fmt.Sprintf(`
ids = [sleep.delay(60).id for _ in range(%d)]
print("IDS", " ".join(wait_started(ids, 2)))
print("OK")
`, total))
		started := outputIDs(out)
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // the warm shutdown waits for the 60 s tasks
		select {
		case <-p.done:
			t.Fatalf("worker exited before the second signal:\n%s", p.Log())
		default:
		}
		p.signalAndWait(t, syscall.SIGINT, 20*time.Second)
		if !strings.Contains(p.Log(), "cold shutdown requested") {
			t.Fatalf("no cold shutdown in the log:\n%s", p.Log())
		}
		for id, st := range resultStates(t, bc, started) {
			if st != "STARTED" {
				t.Errorf("interrupted task %s recorded %s; it should stay STARTED and run again", id, st)
			}
		}
		left := readyMessages(t, bc, q)
		t.Logf("after a cold shutdown: %d of %d back on the broker", left, total)
		if left != total {
			t.Fatalf("%d messages back on the broker, want all %d\n%s", left, total, p.Log())
		}
	})
}

// TestWorkerRemoteControlFromPython: Python's app.control and the celery
// command line see and steer a celeriac worker.
func TestWorkerRemoteControlFromPython(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		node := "rc-" + bc.name + "@celeriac"
		startGoWorker(t, bc, q, worker.Config{Concurrency: 2, Hostname: node}, nil)
		time.Sleep(300 * time.Millisecond) // the pidbox subscription is set up asynchronously
		pyClient(t, bc, q, fmt.Sprintf(`
from celery.exceptions import TaskRevokedError
node = %q
pong = app.control.ping(destination=[node], timeout=2)
assert pong == [{node: {"ok": "pong"}}], pong
insp = app.control.inspect(destination=[node], timeout=2)
reg = insp.registered()
assert "tasks.add" in reg[node], reg
s = sleep.delay(3)
deadline = time.time() + 10
active = {}
while time.time() < deadline:
    active = insp.active() or {}
    if any(t["id"] == s.id for t in active.get(node, [])):
        break
    time.sleep(0.1)
assert any(t["id"] == s.id and t["name"] == "tasks.sleep" for t in active.get(node, [])), active
stats = insp.stats()[node]
assert stats["pool"]["max-concurrency"] == 2, stats["pool"]
c = add.apply_async((1, 2), countdown=5)
deadline = time.time() + 10
while time.time() < deadline and not (insp.scheduled() or {}).get(node):
    time.sleep(0.1)
app.control.revoke(c.id)
try:
    c.get(timeout=10)
    raise SystemExit("revoked task ran")
except TaskRevokedError:
    pass
assert c.state == "REVOKED", c.state
assert c.id in (insp.revoked() or {}).get(node, []), insp.revoked()
print("OK")
`, node))
		env := map[string]string{"IT_BROKER": bc.broker, "IT_BACKEND": bc.backend, "IT_QUEUE": q}
		out := runPython(t, 60*time.Second, env, `
import subprocess, sys
r = subprocess.run([sys.executable, "-m", "celery", "-A", "it_worker_app", "inspect", "ping", "-d", sys.argv[1], "--timeout", "3"], capture_output=True, text=True)
print(r.stdout); print(r.stderr, file=sys.stderr); sys.exit(r.returncode)
`, node)
		if !strings.Contains(out, node) || !strings.Contains(out, "pong") {
			t.Fatalf("celery inspect ping output:\n%s", out)
		}
	})
}

// TestWorkerEventsFromPython: a Python event receiver sees the worker's
// online, heartbeat and offline events and every kind of task event, and
// Celery's State tracks the tasks to their final states.
func TestWorkerEventsFromPython(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		node := "ev-" + bc.name + "@celeriac"
		// The receiver listens before the worker starts, so that it sees
		// worker-online too: Python prints LISTENING, then the worker starts.
		script := pyEventReceiver + fmt.Sprintf(`
node = %q
print("LISTENING", flush=True)
def wait_for(what, cond, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with lock:
            if cond():
                return
        time.sleep(0.1)
    with lock:
        raise SystemExit("timed out waiting for %%s; seen %%s" %% (what, sorted(set(seen))))

wait_for("worker-online", lambda: ("worker-online", node) in seen, timeout=60)
ok = add.delay(2, 2)
bad = fail.delay("nope")
again = app.signature("it_ev.retry_once").delay()
rejected = app.signature("it_ev.reject").delay()
later = add.apply_async((1, 1), countdown=60)
assert ok.get(timeout=20) == 4
try:
    bad.get(timeout=20)
    raise SystemExit("no exception")
except ValueError:
    pass
assert again.get(timeout=20) == 1
wait_for("task-received of the countdown task", lambda: ("task-received", later.id) in seen)
app.control.revoke(later.id)
try:
    later.get(timeout=20)
    raise SystemExit("revoked task ran")
except Exception as e:
    assert type(e).__name__ == "TaskRevokedError", repr(e)

for typ, key in [("worker-heartbeat", node),
                 ("task-received", ok.id), ("task-started", ok.id), ("task-succeeded", ok.id),
                 ("task-failed", bad.id), ("task-retried", again.id), ("task-succeeded", again.id),
                 ("task-rejected", rejected.id), ("task-revoked", later.id)]:
    wait_for(typ + " " + key, lambda: (typ, key) in seen)
# (A task-rejected after task-started leaves State at STARTED: REJECTED
# ranks below STARTED in celery.states.precedence, which State applies to
# any worker's events; not checked here against a Python worker.)
wait_for("State", lambda: state.tasks.get(ok.id) is not None and state.tasks[ok.id].state == "SUCCESS"
         and state.tasks.get(bad.id) is not None and state.tasks[bad.id].state == "FAILURE"
         and state.tasks.get(again.id) is not None and state.tasks[again.id].state == "SUCCESS"
         and state.tasks.get(later.id) is not None and state.tasks[later.id].state == "REVOKED")
with lock:
    w = state.workers.get(node)
    assert w is not None and w.alive, list(state.workers)
    a = state.tasks[ok.id]
    assert a.name == "tasks.add" and a.result == "4" and a.worker.hostname == node, (a.name, a.result)
    assert "ValueError" in state.tasks[bad.id].exception, state.tasks[bad.id].exception

# worker-offline: Celery's State marks the worker gone.
app.control.shutdown(destination=[node])
wait_for("worker-offline", lambda: ("worker-offline", node) in seen)
with lock:
    assert not state.workers[node].alive
stop.set()
print("OK")
`, node)
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, pythonBin(t), "-c", pyClientPrelude+script)
		cmd.Env = pyEnv(pyClientEnv(bc, q))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(stdout)
		var out []string
		for lines.Scan() && lines.Text() != "LISTENING" {
			out = append(out, lines.Text())
		}
		gw := startGoWorker(t, bc, q, worker.Config{Concurrency: 2, Hostname: node, SendTaskEvents: true}, func(mux *worker.Mux) {
			mux.HandleFunc("it_ev.retry_once", func(ctx context.Context, task *worker.Task) (any, error) {
				if task.Retries == 0 {
					return nil, retry.Now(errors.New("first attempt fails"))
				}
				return task.Retries, nil
			})
			mux.HandleFunc("it_ev.reject", func(ctx context.Context, task *worker.Task) (any, error) {
				return nil, worker.Reject(errors.New("not for us"), false)
			})
		})
		for lines.Scan() {
			out = append(out, lines.Text())
		}
		if err := cmd.Wait(); err != nil || len(out) == 0 || out[len(out)-1] != "OK" {
			t.Fatalf("python checks failed: %v\nstdout:\n%s\nstderr:\n%s", err, strings.Join(out, "\n"), stderr.String())
		}
		select {
		case err := <-gw.done:
			gw.cancel()
			gw.cancel = nil
			if err != nil {
				t.Errorf("worker.Run after remote shutdown: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("the worker did not stop after the remote shutdown")
		}
	})
}

// TestWorkerMixedFleetChord: a chord whose header tasks are split between
// a Python Celery worker and a celeriac worker on one queue fires its body
// exactly once with the results in order.
func TestWorkerMixedFleetChord(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		gw := startGoWorker(t, bc, q, worker.Config{Concurrency: 2, ResultExtended: true, PrefetchMultiplier: 1}, nil)
		env := map[string]string{"IT_BROKER": bc.broker, "IT_BACKEND": bc.backend, "IT_QUEUE": q}
		startPythonWorker(t, env, "it_worker_pyimpl", "-Q", q, "-c", "2", "--prefetch-multiplier", "1",
			"-n", "py-"+q+"@%h", "--without-gossip", "--without-mingle", "--without-heartbeat")
		out := pyClient(t, bc, q, `
from collections import Counter
tsum = app.signature("tasks.tsum")
workers = Counter()
for round in range(3):
    c = chord([add.s(i, i) for i in range(30)], tsum)()
    assert c.get(timeout=60) == sum(2 * i for i in range(30)), c.result
    for child in c.parent.results:
        workers[app.backend.get_task_meta(child.id).get("worker")] += 1
print("WORKERS", dict(workers))
assert len(workers) == 2, workers
print("OK")
`)
		t.Log(strings.TrimSpace(out))
		if gw.ran("tasks.add") == 0 {
			t.Fatal("the celeriac worker ran no header task")
		}
	})
}

// TestWorkerRPCBackend: a Python client with the rpc:// backend gets
// results and exceptions from a celeriac worker, over RabbitMQ and over
// Redis (kombu's virtual default exchange).
func TestWorkerRPCBackend(t *testing.T) {
	for _, bc := range []brokerCase{
		{name: "rabbitmq", broker: amqpURL(t), backend: "rpc://"},
		{name: "redis", broker: redisDBURL(t, workerRedisDB), backend: "rpc://"},
	} {
		t.Run(bc.name, func(t *testing.T) { testRPCBackend(t, bc) })
	}
}

func testRPCBackend(t *testing.T, bc brokerCase) {
	q := uniqueQueue(t, bc)
	startGoWorker(t, bc, q, worker.Config{Concurrency: 2}, nil)
	pyClient(t, bc, q, `
assert add.delay(2, 3).get(timeout=20) == 5
try:
    fail.delay("rpc boom").get(timeout=20)
    raise SystemExit("no exception")
except ValueError as e:
    assert str(e) == "rpc boom", repr(e)
rs = [add.delay(i, i) for i in range(20)]
assert [r.get(timeout=20) for r in rs] == [2 * i for i in range(20)]
print("OK")
`)
}

// pyEventReceiver, put before a test's Python script, captures every event
// in a thread of its own into seen ((type, uuid or hostname) -> the last
// such event) and Celery's own State, under lock, until stop is set; it
// returns once the receiver has seen an event of its own (worker-probe).
const pyEventReceiver = `
import threading
state = app.events.State()
seen = {}
lock = threading.Lock()
def on_event(ev):
    with lock:
        seen[(ev["type"], ev.get("uuid") or ev.get("hostname"))] = dict(ev)
        state.event(ev)
stop = threading.Event()
def capture():
    with app.connection() as conn:
        recv = app.events.Receiver(conn, handlers={"*": on_event})
        recv.should_stop = False
        def watch():
            stop.wait()
            recv.should_stop = True
        threading.Thread(target=watch, daemon=True).start()
        recv.capture(limit=None, timeout=None, wakeup=True)
threading.Thread(target=capture, daemon=True).start()
# Listening means an event sent now is seen: on Redis a fanout message
# published before the receiver's SUBSCRIBE reaches the server is lost, and
# a fixed sleep was too short on a loaded machine with kombu 5.6.
with app.events.default_dispatcher(hostname="probe@it") as probe:
    deadline = time.time() + 30
    while time.time() < deadline:
        probe.send("worker-probe")
        time.sleep(0.2)
        with lock:
            if any(typ == "worker-probe" for typ, _ in seen):
                break
    else:
        raise SystemExit("the event receiver never saw its own probe")
`

// TestUnknownTaskEventAsCelery: a task nobody registered, sent to a Python
// Celery worker and to a celeriac worker, both with events on. Celery's
// consumer (on_unknown_task) marks it FAILURE with NotRegistered and sends
// task-failed with exception "NotRegistered('name')"; celeriac must send
// the same event, with the same fields, and store the same failure, so
// that Flower and celery events show both workers' alike.
func TestUnknownTaskEventAsCelery(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		qgo := uniqueQueue(t, bc)
		qpy := qgo + "_py"
		t.Cleanup(func() { deleteQueue(t, bc, qpy) })
		startGoWorker(t, bc, qgo, worker.Config{Concurrency: 2, Hostname: "unk-go@it", SendTaskEvents: true}, nil)
		startPythonWorker(t, pyClientEnv(bc, qpy), "it_worker_app", "-Q", qpy, "-E", "-P", "solo",
			"-n", "unk-py@it", "--without-gossip", "--without-mingle", "--without-heartbeat")
		out := pyClient(t, bc, qgo, pyEventReceiver+fmt.Sprintf(`
import json
queues = {"py": %q, "go": %q}
events = {}
for who, q in queues.items():
    r = app.send_task("it_unknown.nope", args=(1,), queue=q)
    try:
        r.get(timeout=30)
        raise SystemExit(who + ": no exception")
    except Exception as e:
        assert type(e).__name__ == "NotRegistered", (who, repr(e))
        assert str(e) == "'it_unknown.nope'", (who, str(e))
    deadline = time.time() + 30
    while time.time() < deadline:
        with lock:
            ev = seen.get(("task-failed", r.id))
        if ev:
            break
        time.sleep(0.1)
    else:
        raise SystemExit(who + ": no task-failed event")
    events[who] = ev
    print("EVENT", who, json.dumps(sorted(ev)), ev["exception"], ev["hostname"])
stop.set()
assert events["py"]["exception"] == events["go"]["exception"] == "NotRegistered('it_unknown.nope')", events
assert events["py"]["hostname"] == "unk-py@it" and events["go"]["hostname"] == "unk-go@it", events
assert set(events["py"]) == set(events["go"]), (sorted(events["py"]), sorted(events["go"]))
print("OK")
`, qpy, qgo))
		t.Log(strings.TrimSpace(out))
	})
}

// TestWorkerChainOfChords: a chain of chords built by Python Celery runs
// to the right result on a mixed fleet (a Python worker and a celeriac
// worker on one queue). Celery 5.6.3 (celery/celery#10171) stopped
// re-embedding the rest of the chain in every header task of each chord,
// so on 5.6 the rest travels with the chord's body only; in the 5.5/5.6
// passes this checks that celeriac continues such a chain wherever the
// body runs.
func TestWorkerChainOfChords(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		gw := startGoWorker(t, bc, q, worker.Config{Concurrency: 2, PrefetchMultiplier: 1}, nil)
		startPythonWorker(t, map[string]string{"IT_BROKER": bc.broker, "IT_BACKEND": bc.backend, "IT_QUEUE": q}, "it_worker_pyimpl",
			"-Q", q, "-c", "2", "--prefetch-multiplier", "1", "-n", "py-"+q+"@%h", "--without-gossip", "--without-mingle", "--without-heartbeat")
		out := pyClient(t, bc, q, `
import json
tsum = app.signature("tasks.tsum")
# c1 = 2 + 4 = 6; each later chord adds its k to the previous sum in every
# header task: sum(prev + k) over its ks.
steps = [chord([add.s(1, 1), add.s(2, 2)], tsum)]
want = 6
for ks in ([1, 2], [10, 20, 30], [5], [1, 1, 1, 1]):
    steps.append(chord([add.s(k) for k in ks], tsum))
    want = sum(want + k for k in ks)
r = chain(*steps).apply_async()
got = r.get(timeout=90)
assert got == want, (got, want)
print("RESULT", got)
print("OK")
`)
		t.Log(strings.TrimSpace(out))
		if gw.ran("tasks.add")+gw.ran("tasks.tsum") == 0 {
			t.Fatal("the celeriac worker ran no task of the chain")
		}
	})
}
