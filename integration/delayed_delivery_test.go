package integration

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/worker"
)

// delayedLevels are the names of Celery 5.5's native delayed delivery
// topology (kombu's native_delayed_delivery).
func delayedLevels() (queues, exchanges []string) {
	for level := 0; level < 28; level++ {
		n := "celery_delayed_" + strconv.Itoa(level)
		queues = append(queues, n)
		exchanges = append(exchanges, n)
	}
	return queues, append(exchanges, "celery_delayed_delivery")
}

// cleanupDelayedTopology removes the delayed-delivery topology when the
// test ends if it did not exist before: on a shared broker, Python workers
// may own it, and then it stays. Queues that hold messages stay too.
func cleanupDelayedTopology(t *testing.T, url string) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if ch.ExchangeDeclarePassive("celery_delayed_27", "topic", true, false, false, false, nil) == nil {
		_ = ch.Close()
		return
	}
	t.Cleanup(func() {
		conn, err := amqp091.Dial(url)
		if err != nil {
			t.Errorf("cleanup dial: %v", err)
			return
		}
		defer conn.Close()
		queues, exchanges := delayedLevels()
		for _, q := range queues {
			// Quorum queues refuse delete's if-empty flag: look first.
			if ch, err := conn.Channel(); err == nil {
				if st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err == nil && st.Messages == 0 {
					_, _ = ch.QueueDelete(q, false, false, false)
				}
				if !ch.IsClosed() {
					_ = ch.Close()
				}
			}
		}
		for _, x := range exchanges {
			if ch, err := conn.Channel(); err == nil {
				_ = ch.ExchangeDelete(x, false, false)
				_ = ch.Close()
			}
		}
	})
}

// waitConsumed waits until a queue exists and has a consumer.
func waitConsumed(t *testing.T, url, q string) {
	t.Helper()
	waitConsumers(t, url, q, 1)
}

// deaths lists the "queue/reason" pairs of a message's x-death header.
func deaths(h map[string]any) []string {
	var out []string
	list, _ := h["x-death"].([]any)
	for _, e := range list {
		if m, ok := e.(map[string]any); ok {
			q, _ := m["queue"].(string)
			r, _ := m["reason"].(string)
			out = append(out, q+"/"+r)
		}
	}
	return out
}

// delayedCountdown reads the countdown a delayed-delivery routing key
// carries, and the key after it.
func delayedCountdown(key string) (n int64, rest string, ok bool) {
	parts := strings.SplitN(key, ".", 29)
	if len(parts) != 29 {
		return 0, key, false
	}
	for _, p := range parts[:28] {
		switch p {
		case "0":
			n <<= 1
		case "1":
			n = n<<1 | 1
		default:
			return 0, key, false
		}
	}
	return n, parts[28], true
}

// TestWorkerPythonNativeDelayedDelivery: a celeriac fleet on quorum queues
// does what Celery 5.5's DelayedDelivery bootstep does, so that a Python
// producer's countdown task, published into celery_delayed_27 exactly as
// Celery 5.5's send_task publishes it, is held by RabbitMQ and comes out at
// the Go worker on time; and a Go retry with a countdown goes through the
// levels too, with one routing-key prefix. Python 5.2.6 is the producer and
// reads the results; the 5.5 routing it lacks is the script's few lines
// (kombu's calculate_routing_key), taken from kombu's source.
func TestWorkerPythonNativeDelayedDelivery(t *testing.T) {
	requireCelery(t, "5.2", "it plays Celery 5.5's producer routing with 5.2; on 5.5 the TestCelery55NativeDelayed* tests use the real one")
	bc := brokerCase{"rabbitmq", amqpURL(t), redisDBURL(t, workerRedisDB)}
	cleanupDelayedTopology(t, bc.broker)
	q := uniqueQueue(t, bc)

	type run struct {
		exchange, key string
		retries       int
		deaths        []string
		at            time.Time
	}
	var mu sync.Mutex
	runs := map[string][]run{}
	record := func(t *worker.Task) {
		mu.Lock()
		defer mu.Unlock()
		runs[t.Name] = append(runs[t.Name], run{t.DeliveryInfo.Exchange, t.DeliveryInfo.RoutingKey, t.Retries, deaths(t.Headers), time.Now()})
	}
	startGoWorker(t, bc, q, worker.Config{
		Concurrency:    4,
		ExchangeType:   "topic",
		QueueArguments: map[string]map[string]any{q: {"x-queue-type": "quorum"}},
	}, func(m *worker.Mux) {
		m.HandleFunc("tasks.ndd_stamp", func(ctx context.Context, t *worker.Task) (any, error) {
			record(t)
			return float64(time.Now().UnixNano()) / 1e9, nil
		})
		m.HandleFunc("tasks.ndd_retry", func(ctx context.Context, t *worker.Task) (any, error) {
			record(t)
			if t.Retries == 0 {
				return nil, retry.After(2*time.Second, errors.New("not yet"))
			}
			return t.Retries, nil
		})
	})

	// The worker declares the levels before it consumes: until then, a
	// message published into them is unroutable and dropped, as it is
	// with Celery 5.5 before its first worker starts.
	waitConsumed(t, bc.broker, q)

	out := pyClient(t, bc, q, `
import os
from kombu import Exchange, Queue
q = os.environ["IT_QUEUE"]
# The queue as a Celery 5.5 app on quorum queues declares it.
app.conf.task_queues = [Queue(q, Exchange(q, type="topic"), routing_key=q, queue_arguments={"x-queue-type": "quorum"})]

def calculate_routing_key(countdown, routing_key):
    # kombu.transport.native_delayed_delivery.calculate_routing_key
    return ".".join(f"{countdown:028b}") + "." + routing_key

def apply_async_55(sig, countdown):
    # Celery 5.5's send_task for an eta on quorum queues: the countdown is
    # recomputed from the eta (and truncated), the message goes to
    # celery_delayed_27 with the bits in front of the routing key.
    eta = app.now() + datetime.timedelta(seconds=countdown)
    cd = int((eta - app.now()).total_seconds())
    return sig.apply_async(eta=eta, exchange=Exchange("celery_delayed_27", type="topic"),
                           routing_key=calculate_routing_key(cd, q))

stamp = app.signature("tasks.ndd_stamp")
sent = time.time()
r = apply_async_55(stamp, 3)
started = r.get(timeout=60)
assert started - sent >= 3.0, ("started after", started - sent)
print("stamp_delay", round(started - sent, 2))

r = app.signature("tasks.ndd_retry").apply_async()
assert r.get(timeout=60) == 1, r.result
print("OK")
`)
	t.Log(strings.TrimSpace(out))

	mu.Lock()
	defer mu.Unlock()
	stamps := runs["tasks.ndd_stamp"]
	if len(stamps) != 1 {
		t.Fatalf("tasks.ndd_stamp ran %d times, want 1", len(stamps))
	}
	s := stamps[0]
	n, rest, ok := delayedCountdown(s.key)
	if !ok || n != 2 || rest != q {
		t.Errorf("stamp delivered with key %q, want the 28 bits of 2 then %q", s.key, q)
	}
	// Level 1 (2 s) is the one bit of 2: the broker held it there until its
	// TTL expired, not the worker.
	if !strings.Contains(strings.Join(s.deaths, " "), "celery_delayed_1/expired") {
		t.Errorf("stamp deaths %v: want celery_delayed_1/expired", s.deaths)
	}

	tries := runs["tasks.ndd_retry"]
	if len(tries) != 2 {
		t.Fatalf("tasks.ndd_retry ran %d times, want 2", len(tries))
	}
	first, second := tries[0], tries[1]
	if first.exchange != q || first.key != q {
		t.Errorf("first run through %q key %q, want %q key %q", first.exchange, first.key, q, q)
	}
	n, rest, ok = delayedCountdown(second.key)
	if !ok || n < 1 || n > 2 || rest != q || second.retries != 1 {
		t.Errorf("retry delivered with key %q (retries %d), want one prefix of 1 or 2 s then %q", second.key, second.retries, q)
	}
	if len(second.deaths) == 0 {
		t.Error("the retry went through no level's queue")
	}
	if gap := second.at.Sub(first.at); gap < 2*time.Second {
		t.Errorf("retry ran %v after the first run, want at least 2 s", gap)
	}
}
