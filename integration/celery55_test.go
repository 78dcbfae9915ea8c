package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// Native delayed delivery against a real Celery 5.5 producer and a real
// Celery 5.5 worker (it_ndd55_app), on RabbitMQ quorum queues. "On time" is
// within a second of the due time, the resolution of Celery's countdown
// (send_task truncates it to whole seconds, and the levels hold a message
// whole seconds).

const nddLateness = time.Second

// nddInfo is what ndd.when and ndd.retry_once report, on either side.
type nddInfo struct {
	worker     string
	at         time.Time
	retries    int
	routingKey string
}

// nddConfig is a celeriac worker on a quorum queue behind a topic exchange,
// as it_ndd55_app declares it.
func nddConfig(q string) worker.Config {
	return worker.Config{
		Concurrency:    4,
		ExchangeType:   "topic",
		QueueArguments: map[string]map[string]any{q: {"x-queue-type": "quorum"}},
	}
}

// nddGoHandlers registers the Go side of ndd.when and ndd.retry_once; the
// first run of ndd.retry_once retries it after retryIn.
func nddGoHandlers(retryIn time.Duration, ran func()) func(m *worker.Mux) {
	info := func(t *worker.Task) map[string]any {
		return map[string]any{
			"at": float64(time.Now().UnixNano()) / 1e9, "worker": "go", "retries": t.Retries,
			"routing_key": t.DeliveryInfo.RoutingKey, "stamps": t.Message.Stamps,
		}
	}
	return func(m *worker.Mux) {
		m.HandleFunc("ndd.when", func(ctx context.Context, t *worker.Task) (any, error) {
			return info(t), nil
		})
		m.HandleFunc("ndd.retry_once", func(ctx context.Context, t *worker.Task) (any, error) {
			if ran != nil {
				defer ran()
			}
			if t.Retries == 0 {
				return nil, retry.After(retryIn, errors.New("once more"))
			}
			return info(t), nil
		})
	}
}

// nddEnv is it_ndd55_app's environment.
func nddEnv(bc brokerCase, q string) map[string]string {
	return map[string]string{"IT_BROKER": pyBrokerURL(bc.broker), "IT_BACKEND": bc.backend, "IT_QUEUE": q}
}

// nddPrelude defines report(): it prints a result as a RAN line for
// parseRan, with the time the task was due (a Unix time). It first sends a
// task without delay and waits for it, so that the producer's connection
// and the result backend's subscription exist before any due time is
// taken: a countdown starts when the message reaches the levels.
const nddPrelude = `import time, datetime
from it_ndd55_app import app, when, retry_once
def report(label, info, due):
    print("RAN", label, info["worker"], repr(info["at"]), repr(due), info["retries"], info["routing_key"])
when.delay("warm-up").get(timeout=60)
`

// parseRan reads the RAN lines: label → info and due time.
func parseRan(t *testing.T, out string) map[string]struct {
	info nddInfo
	due  time.Time
} {
	t.Helper()
	unix := func(s string) time.Time {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("bad time %q in %q", s, out)
		}
		return time.Unix(0, int64(f*1e9))
	}
	got := map[string]struct {
		info nddInfo
		due  time.Time
	}{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 7 || f[0] != "RAN" {
			continue
		}
		n, _ := strconv.Atoi(f[5])
		got[f[1]] = struct {
			info nddInfo
			due  time.Time
		}{nddInfo{worker: f[2], at: unix(f[3]), retries: n, routingKey: f[6]}, unix(f[4])}
	}
	return got
}

// checkOnTime fails unless label ran on worker ("go", "py" or "" for
// either), not before it was due and less than nddLateness after, having
// come out of the delay levels (its routing key carries a countdown) when
// viaLevels.
func checkOnTime(t *testing.T, runs map[string]struct {
	info nddInfo
	due  time.Time
}, label, worker string, viaLevels bool) nddInfo {
	t.Helper()
	r, ok := runs[label]
	if !ok {
		t.Errorf("%s: no result", label)
		return nddInfo{}
	}
	late := r.info.at.Sub(r.due)
	t.Logf("%s ran on %s %.3fs after it was due (key %s)", label, r.info.worker, late.Seconds(), r.info.routingKey)
	if worker != "" && r.info.worker != worker {
		t.Errorf("%s ran on %s, want %s", label, r.info.worker, worker)
	}
	if late < 0 || late >= nddLateness {
		t.Errorf("%s ran %v after it was due, want within [0, %v)", label, late, nddLateness)
	}
	if _, _, ok := delayedCountdown(r.info.routingKey); ok != viaLevels {
		t.Errorf("%s delivered with routing key %q: through the delay levels = %v, want %v", label, r.info.routingKey, ok, viaLevels)
	}
	return r.info
}

// TestCelery55NativeDelayedFromPythonProducer: Celery 5.5's apply_async
// with a countdown or an eta, on a quorum queue, publishes into
// celery_delayed_27; the celeriac worker declared the levels and bound the
// queue, and runs each task on time.
func TestCelery55NativeDelayedFromPythonProducer(t *testing.T) {
	requireCeleryAtLeast(t, "5.5", "native delayed delivery is Celery 5.5's")
	bc := brokerCase{"rabbitmq", amqpURL(t), redisDBURL(t, workerRedisDB)}
	cleanupDelayedTopology(t, bc.broker)
	q := uniqueQueue(t, bc)
	startGoWorker(t, bc, q, nddConfig(q), nddGoHandlers(time.Second, nil))
	waitConsumed(t, bc.broker, q)

	out := runPython(t, 120*time.Second, nddEnv(bc, q), nddPrelude+`
sent = time.time()
r1 = when.apply_async(countdown=3)
eta = app.now() + datetime.timedelta(seconds=4.5)
r2 = when.apply_async(eta=eta)
report("countdown", r1.get(timeout=60), sent + 3)
# send_task recomputes a countdown from the eta and truncates it (4 s): the
# levels hand it over early and the worker holds it until the eta.
report("eta", r2.get(timeout=60), eta.timestamp())
`)
	runs := parseRan(t, out)
	checkOnTime(t, runs, "countdown", "go", true)
	checkOnTime(t, runs, "eta", "go", true)
}

// TestCelery55NativeDelayedToPythonWorker: what celeriac publishes with a
// delay on a quorum queue, a retry of a task it ran and a countdown task of
// a Go producer, goes through the levels and a Celery 5.5 worker runs it on
// time.
func TestCelery55NativeDelayedToPythonWorker(t *testing.T) {
	requireCeleryAtLeast(t, "5.5", "native delayed delivery is Celery 5.5's")
	bc := brokerCase{"rabbitmq", amqpURL(t), redisDBURL(t, workerRedisDB)}
	cleanupDelayedTopology(t, bc.broker)
	q := uniqueQueue(t, bc)
	env := nddEnv(bc, q)

	// The retry: the Go worker runs the first attempt and publishes the
	// retry 6 s ahead, then stops; the Python worker, started meanwhile,
	// runs the retry when the levels hand it over.
	const retryIn = 6 * time.Second
	var once sync.Once
	var firstRun time.Time // when the handler returned the retry: the retry's eta is retryIn later
	ranFirst := make(chan struct{})
	gw := startGoWorker(t, bc, q, nddConfig(q), nddGoHandlers(retryIn, func() {
		once.Do(func() { firstRun = time.Now(); close(ranFirst) })
	}))
	waitConsumed(t, bc.broker, q)
	id := runPython(t, 60*time.Second, env, `from it_ndd55_app import retry_once
print(retry_once.delay().id)`)
	select {
	case <-ranFirst:
	case <-time.After(30 * time.Second):
		t.Fatal("the Go worker did not run ndd.retry_once")
	}
	gw.stop(t) // the retry was published (and confirmed) before the original was acked
	startPythonWorker(t, env, "it_ndd55_app", "-Q", q, "-P", "solo", "-c", "1", "-n", "ndd55-"+q+"@%h",
		"--without-gossip", "--without-mingle", "--without-heartbeat")

	// A Go producer's countdown task to the same queue's (topic) exchange.
	conn, err := connect.Open(context.Background(), connect.Options{BrokerURL: bc.broker, DelayedDelivery: "on",
		ConnectionName: "it-ndd-producer-" + q})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	p := client.New(conn.Transport, client.Config{})
	cdSent := time.Now()
	cd, err := p.Send(context.Background(), "ndd.when", nil, nil, client.Countdown(3*time.Second),
		client.Exchange(q, q, transport.Topic))
	if err != nil {
		t.Fatal(err)
	}
	cdID := cd.ID

	out := runPython(t, 120*time.Second, env, nddPrelude+fmt.Sprintf(`
from celery.result import AsyncResult
report("retry", AsyncResult(%q, app=app).get(timeout=60), %f)
report("countdown", AsyncResult(%q, app=app).get(timeout=60), %f)
`, strings.TrimSpace(id), float64(firstRun.UnixNano())/1e9+retryIn.Seconds(), cdID, float64(cdSent.UnixNano())/1e9+3))
	runs := parseRan(t, out)
	if r := checkOnTime(t, runs, "retry", "py", true); r.retries != 1 {
		t.Errorf("retry ran with retries=%d, want 1", r.retries)
	}
	checkOnTime(t, runs, "countdown", "py", true)
}

// TestCelery55NativeDelayedMixedFleet: Celery 5.5 and celeriac workers on
// one quorum queue, the delayed-delivery topology declared first by one
// side and then again by the other (the declarations must agree, or the
// second is refused), and countdown tasks from both producers run on time
// on either worker.
func TestCelery55NativeDelayedMixedFleet(t *testing.T) {
	requireCeleryAtLeast(t, "5.5", "native delayed delivery is Celery 5.5's")
	for _, first := range []string{"python", "celeriac"} {
		t.Run(first+" first", func(t *testing.T) {
			bc := brokerCase{"rabbitmq", amqpURL(t), redisDBURL(t, workerRedisDB)}
			fresh := removeIdleDelayedTopology(t, bc.broker)
			cleanupDelayedTopology(t, bc.broker)
			q := uniqueQueue(t, bc)
			env := nddEnv(bc, q)
			var py *pyWorker
			startPy := func() {
				py = startPythonWorker(t, env, "it_ndd55_app", "-Q", q, "-P", "solo", "-c", "1", "-n", "ndd55-"+q+"@%h",
					"--without-gossip", "--without-mingle", "--without-heartbeat")
			}
			startGo := func() { startGoWorker(t, bc, q, nddConfig(q), nddGoHandlers(time.Second, nil)) }
			if first == "python" {
				startPy()
			} else {
				startGo()
			}
			waitConsumed(t, bc.broker, q)
			if fresh {
				if !delayedTopologyExists(t, bc.broker) {
					t.Fatalf("the %s worker consumes but declared no delayed-delivery topology", first)
				}
				t.Logf("the %s worker declared the topology", first)
			} else {
				t.Logf("the topology existed before the test (another fleet's): both sides declare it again")
			}
			if first == "python" {
				startGo()
			} else {
				startPy()
			}
			waitConsumers(t, bc.broker, q, 2)

			// Go producer's tasks go through the levels from the Go
			// worker's own connection (it knows the exchange is a topic).
			conn, err := connect.Open(context.Background(), connect.Options{BrokerURL: bc.broker, DelayedDelivery: "on",
				ConnectionName: "it-ndd-mixed-" + q})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			p := client.New(conn.Transport, client.Config{})
			var goIDs []string
			var goSent []time.Time
			for i := range 4 {
				goSent = append(goSent, time.Now())
				r, err := p.Send(context.Background(), "ndd.when", []any{i}, nil, client.Countdown(2*time.Second),
					client.Exchange(q, q, transport.Topic))
				if err != nil {
					t.Fatal(err)
				}
				goIDs = append(goIDs, r.ID)
			}
			var script strings.Builder
			// kombu's own declaration of the levels must agree with what is
			// there (celeriac's, when it came first): a different argument
			// is refused with PRECONDITION_FAILED.
			script.WriteString(nddPrelude + `from kombu.transport.native_delayed_delivery import declare_native_delayed_delivery_exchanges_and_queues
with app.connection_for_write() as c:
    declare_native_delayed_delivery_exchanges_and_queues(c, "quorum")
print("REDECLARED")
`)
			script.WriteString("from celery.result import AsyncResult\nrs = []\n")
			script.WriteString("for i in range(4):\n    rs.append((time.time() + 2, when.apply_async((i,), countdown=2)))\n")
			script.WriteString("for i, (due, r) in enumerate(rs):\n    report('py%d' % i, r.get(timeout=60), due)\n")
			for i, id := range goIDs {
				fmt.Fprintf(&script, "report('go%d', AsyncResult(%q, app=app).get(timeout=60), %f)\n", i, id, float64(goSent[i].UnixNano())/1e9+2)
			}
			out := runPython(t, 120*time.Second, env, script.String())
			if !strings.Contains(out, "REDECLARED") {
				t.Errorf("kombu could not declare the levels again:\n%s", out)
			}
			// The Python worker's DelayedDelivery bootstep only warns when
			// its declaration or binding fails.
			if log := py.Log(); strings.Contains(log, "Failed to") || strings.Contains(log, "delayed delivery will not") {
				t.Errorf("the Python worker could not set up delayed delivery:\n%s", log)
			}
			runs := parseRan(t, out)
			workers := map[string]int{}
			for i := range 4 {
				for _, label := range []string{"py" + strconv.Itoa(i), "go" + strconv.Itoa(i)} {
					workers[checkOnTime(t, runs, label, "", true).worker]++
				}
			}
			t.Logf("ran on: %v", workers)
		})
	}
}

// waitConsumers waits until q has n consumers.
func waitConsumers(t *testing.T, url, q string, n int) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if !ch.IsClosed() {
			_ = ch.Close()
		}
		if err == nil && st.Consumers >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s has %d consumers after a minute, want %d: %v", q, st.Consumers, n, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// delayedTopologyExists reports whether celery_delayed_27 and
// celery_delayed_delivery exist.
func delayedTopologyExists(t *testing.T, url string) bool {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	for _, ex := range []string{"celery_delayed_27", "celery_delayed_delivery"} {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.ExchangeDeclarePassive(ex, "topic", true, false, false, false, nil); err != nil {
			return false
		}
		_ = ch.Close()
	}
	return true
}

// removeIdleDelayedTopology deletes the delayed-delivery topology when it
// exists and holds no message, so that the test sees which side declares
// it; it reports whether the topology is absent now. A topology holding
// messages belongs to someone else's delayed tasks and stays.
func removeIdleDelayedTopology(t *testing.T, url string) bool {
	t.Helper()
	if !delayedTopologyExists(t, url) {
		return true
	}
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	queues, exchanges := delayedLevels()
	for _, q := range queues {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err == nil && st.Messages > 0 {
			return false
		}
		if !ch.IsClosed() {
			_ = ch.Close()
		}
	}
	for _, q := range queues {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
			_ = ch.Close()
		}
	}
	for _, ex := range exchanges {
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(ex, false, false)
			_ = ch.Close()
		}
	}
	return !delayedTopologyExists(t, url)
}

// TestCelery55Stamping: stamps a Celery 5.5 client put on a task or canvas
// (stamp() with a visitor) reach the Go handler, and survive what celeriac
// publishes from it: a retry, the next steps of a chain, a link callback,
// and a chain step run by a Celery 5.5 worker, which sees them too. The
// 5.5 worker keeps them the same way (golden celery55/retried_stamped and
// chain_next_stamped).
func TestCelery55Stamping(t *testing.T) {
	requireCeleryAtLeast(t, "5.5", "the stamping API is Celery 5.3+'s")
	bc := brokerCase{"rabbitmq", amqpURL(t), redisDBURL(t, workerRedisDB)}
	cleanupDelayedTopology(t, bc.broker) // the Python worker's queue is a quorum queue
	g := uniqueQueue(t, bc)
	py := uniqueQueue(t, bc) + "_py"
	t.Cleanup(func() { deleteQueue(t, bc, py) })

	type seen struct {
		retries        int
		stampedHeaders []string
		stamps         map[string]any
	}
	var mu sync.Mutex
	got := map[string]seen{}
	record := func(t *worker.Task) string {
		label := fmt.Sprint(t.Args[len(t.Args)-1])
		sh := slices.Clone(t.Message.StampedHeaders)
		slices.Sort(sh)
		mu.Lock()
		got[label] = seen{t.Retries, sh, t.Message.Stamps}
		mu.Unlock()
		return label
	}
	startGoWorker(t, bc, g, worker.Config{Concurrency: 4}, func(m *worker.Mux) {
		m.HandleFunc("stamp.see", func(ctx context.Context, t *worker.Task) (any, error) {
			return record(t), nil
		})
		m.HandleFunc("stamp.flaky", func(ctx context.Context, t *worker.Task) (any, error) {
			if t.Retries == 0 {
				return nil, retry.After(100*time.Millisecond, errors.New("once more"))
			}
			return record(t), nil
		})
	})
	startPythonWorker(t, nddEnv(bc, py), "it_ndd55_app", "-Q", py, "-P", "solo", "-c", "1", "-n", "stamp55-"+py+"@%h",
		"--without-gossip", "--without-mingle", "--without-heartbeat")

	pyClient(t, bc, g, fmt.Sprintf(`
from celery.canvas import StampingVisitor
class V(StampingVisitor):
    def on_signature(self, sig, **headers):
        return {"monitoring_id": "mon-1", "tenant": ["acme", 7]}
S = app.signature
s = S("stamp.flaky", args=("retry",)); s.stamp(visitor=V())
assert s.apply_async().get(timeout=30) == "retry"
c = chain(S("stamp.see", args=("c1",)), S("stamp.see", args=("c2",)), S("stamp.see", args=("c3",))); c.stamp(visitor=V())
assert c.apply_async().get(timeout=30) == "c3"
s = S("stamp.see", args=("l1",)); s.link(S("stamp.see", args=("l2",))); s.stamp(visitor=V())
assert s.apply_async().get(timeout=30) == "l1"
c = chain(S("stamp.see", args=("p1",)), S("ndd.when").set(queue=%q)); c.stamp(visitor=V())
info = c.apply_async().get(timeout=60)
assert info["worker"] == "py" and info["stamps"] == {"monitoring_id": "mon-1", "tenant": ["acme", 7]}, info
print("OK")
`, py))

	want := seen{stampedHeaders: []string{"monitoring_id", "tenant"}, stamps: map[string]any{"monitoring_id": "mon-1", "tenant": []any{"acme", int64(7)}}}
	deadline := time.Now().Add(30 * time.Second) // l2, the callback, may still be running
	for {
		mu.Lock()
		_, ok := got["l2"]
		mu.Unlock()
		if ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, label := range []string{"retry", "c1", "c2", "c3", "l1", "l2", "p1"} {
		w := want
		if label == "retry" {
			w.retries = 1
		}
		s, ok := got[label]
		if !ok {
			t.Errorf("%s: the Go handler never saw it", label)
			continue
		}
		if diff := cmp.Diff(w, s, cmp.AllowUnexported(seen{})); diff != "" {
			t.Errorf("%s: stamps the handler saw mismatch (-want +got):\n%s", label, diff)
		}
	}
}
