package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
)

// Integration tests of transport/amqp against real RabbitMQ and real Python
// Celery 5.2 (py-amqp 5.1.1). Queue names start with it_amqp_.

// itAMQPName returns a unique "it_amqp_<test>_<random>" name.
func itAMQPName(t testing.TB) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	n := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return "it_amqp_" + n + "_" + hex.EncodeToString(b[:])
}

// amqpTransport dials the transport with logs observed; it is closed when
// the test ends.
func amqpTransport(t testing.TB, cfg amqptransport.Config) (*amqptransport.Transport, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	cfg.URL = amqpURL(t)
	cfg.Logger = zap.New(core)
	if cfg.ConnectionName == "" {
		cfg.ConnectionName = itAMQPName(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := amqptransport.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr, logs
}

// deleteAMQP deletes queues and exchanges (named alike) when the test ends.
func deleteAMQP(t testing.TB, names ...string) {
	t.Helper()
	url := amqpURL(t)
	t.Cleanup(func() {
		conn, err := amqp091.Dial(url)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer conn.Close()
		for _, n := range names {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(n, false, false, false)
				_ = ch.ExchangeDelete(n, false, false)
				_ = ch.Close()
			}
		}
	})
}

// queueCounts returns a queue's ready and consumer counts.
func queueCounts(t testing.TB, name string) (ready, consumers int) {
	t.Helper()
	conn, err := amqp091.Dial(amqpURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("queue %s: %v", name, err)
	}
	return q.Messages, q.Consumers
}

// pyAMQP runs a function of testdata/py/it_amqp.py and decodes its JSON
// output into out.
func pyAMQP(t testing.TB, queue string, maxPriority int, call string, out any) {
	t.Helper()
	env := map[string]string{"BROKER": amqpURL(t), "QUEUE": queue, "MAX_PRIORITY": strconv.Itoa(maxPriority)}
	stdout := runPython(t, 3*time.Minute, env, "import it_amqp; it_amqp."+call)
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		t.Fatalf("python output %q: %v", stdout, err)
	}
}

// next takes the next delivery or fails.
func next(t testing.TB, ctx context.Context, c transport.Consumer) *transport.Delivery {
	t.Helper()
	select {
	case d, ok := <-c.Deliveries():
		if !ok {
			t.Fatalf("deliveries closed: %v", c.Err())
		}
		return d
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	return nil
}

func TestAMQPPythonPriorities(t *testing.T) {
	q := itAMQPName(t)
	deleteAMQP(t, q)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	prios := []int{3, 0, 9, 5, 1, 7, 2, 8, 6, 4}
	var ids []string
	pyAMQP(t, q, 10, fmt.Sprintf("send(%d, priorities=%s)", len(prios), strings.Join(strings.Fields(fmt.Sprint(prios)), ", ")), &ids)
	if len(ids) != len(prios) {
		t.Fatalf("python sent %d", len(ids))
	}

	// Declaring with Celery's arguments is accepted as equivalent, even in
	// strict mode: the Go declaration matches Python's byte for byte.
	strict, _ := amqpTransport(t, amqptransport.Config{StrictTopology: true,
		QueueArguments: map[string]any{"x-max-priority": 10}})
	c, err := strict.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{})
	if err != nil {
		t.Fatalf("strict Consume of the Python-declared queue: %v", err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	// Without the argument the queue is consumed as it is, with a warning.
	tr, logs := amqpTransport(t, amqptransport.Config{})
	c, err = tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	if w := logs.FilterMessageSnippet("exists with other arguments").FilterField(zap.String("argument", "x-max-priority")); w.Len() != 1 {
		t.Errorf("no x-max-priority mismatch warning: %v", logs.All())
	}
	var got []int
	for range prios {
		d := next(t, ctx, c)
		got = append(got, d.Message.Properties.Priority)
		if d.Message.Headers["task"] != "tasks.add" {
			t.Errorf("task header %v", d.Message.Headers["task"])
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	want := slices.Clone(prios)
	slices.Sort(want)
	slices.Reverse(want)
	if !slices.Equal(got, want) {
		t.Errorf("consumed priorities %v, want %v", got, want)
	}
}

func TestAMQPPythonApplyAsync(t *testing.T) {
	q := itAMQPName(t)
	deleteAMQP(t, q)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tr, _ := amqpTransport(t, amqptransport.Config{QueueArguments: map[string]any{"x-max-priority": 10}})
	c, err := tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	var ids []string
	pyAMQP(t, q, 10, "apply_async_add(7)", &ids)
	d := next(t, ctx, c)
	defer d.Ack(ctx)
	m := d.Message
	h := m.Headers
	if d.Exchange != "" || d.RoutingKey != q || d.Queue != q {
		t.Errorf("exchange %q routing key %q queue %q; Celery publishes to the default exchange", d.Exchange, d.RoutingKey, d.Queue)
	}
	if h["task"] != "tasks.add" || h["id"] != ids[0] || h["root_id"] != ids[0] || h["lang"] != "py" ||
		h["argsrepr"] != "(2, 3)" || h["retries"] != int64(0) || h["parent_id"] != nil {
		t.Errorf("headers %v", h)
	}
	if tl, ok := h["timelimit"].([]any); !ok || len(tl) != 2 || tl[0] != nil || tl[1] != nil {
		t.Errorf("timelimit %#v", h["timelimit"])
	}
	for _, k := range []string{"eta", "expires"} {
		s, _ := h[k].(string)
		if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
			t.Errorf("%s = %#v: %v", k, h[k], err)
		}
	}
	p := m.Properties
	if p.Priority != 7 || p.CorrelationID != ids[0] || p.DeliveryMode != 2 || p.Expiration == "" || p.ReplyTo == "" {
		t.Errorf("properties %+v", p)
	}
	if m.ContentType != protocol.ContentTypeJSON || m.ContentEncoding != "utf-8" {
		t.Errorf("content type %q encoding %q", m.ContentType, m.ContentEncoding)
	}
	var body []any
	if err := json.Unmarshal(m.Body, &body); err != nil || len(body) != 3 || fmt.Sprint(body[0]) != "[2 3]" {
		t.Errorf("body %s (%v)", m.Body, err)
	}
}

// TestAMQPPythonBigIntHeader is the py-amqp 'L' tag case: Celery sends a
// header with an integer outside int32. Plain amqp091-go cannot parse the
// frame and loses its connection (the message goes back to the queue);
// celeriac reads it, with the value as int64.
func TestAMQPPythonBigIntHeader(t *testing.T) {
	q := itAMQPName(t)
	deleteAMQP(t, q)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var ids []string
	pyAMQP(t, q, 0, "send(1, headers={'ts': 1700000000000, 'neg': -5000000000, 'nested': {'big': 2**40, 'list': [1, 3000000000]}})", &ids)

	// The hazard, shown with amqp091-go alone.
	conn, err := amqp091.Dial(amqpURL(t))
	if err != nil {
		t.Fatal(err)
	}
	closed := conn.NotifyClose(make(chan *amqp091.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	dels, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d, ok := <-dels:
		if ok {
			t.Fatalf("plain amqp091-go parsed the 'L' header: %v", d.Headers)
		}
	case <-ctx.Done():
		t.Fatal("plain amqp091-go neither delivered nor failed")
	}
	if e := <-closed; e == nil {
		t.Error("plain amqp091-go: connection closed without an error")
	} else {
		t.Logf("plain amqp091-go: %v", e)
	}

	tr, logs := amqpTransport(t, amqptransport.Config{})
	c, err := tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	d := next(t, ctx, c)
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	h := d.Message.Headers
	if h["id"] != ids[0] || h["ts"] != int64(1700000000000) || h["neg"] != int64(-5000000000) {
		t.Errorf("headers id %v ts %#v neg %#v", h["id"], h["ts"], h["neg"])
	}
	nested, _ := h["nested"].(map[string]any)
	if nested["big"] != int64(1<<40) || fmt.Sprint(nested["list"]) != "[1 3000000000]" {
		t.Errorf("nested %#v", nested)
	}
	if !d.Redelivered {
		t.Error("not marked redelivered after the plain client's failure")
	}
	if n := logs.FilterMessageSnippet("connection lost").Len(); n != 0 {
		t.Errorf("celeriac's connection was lost %d times", n)
	}
}

// TestAMQPGoHeadersToPython checks the other direction: integer headers
// published by celeriac read back in py-amqp with the same values.
func TestAMQPGoHeadersToPython(t *testing.T) {
	q := itAMQPName(t)
	deleteAMQP(t, q)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr, _ := amqpTransport(t, amqptransport.Config{})
	m := protocol.Message{ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8", Body: []byte("[[], {}, {}]"),
		Headers: map[string]any{"task": "tasks.add", "id": "go-1", "ts": int64(1700000000000), "small": int64(-7),
			"f": 0.5, "list": []any{int64(1), "x", nil}, "table": map[string]any{"k": true}},
		Properties: protocol.Properties{DeliveryMode: 2}}
	if err := tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: m}); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	pyAMQP(t, q, 0, "get_headers()", &got)
	want := map[string]any{"task": "tasks.add", "id": "go-1", "ts": 1700000000000.0, "small": -7.0, "f": 0.5,
		"list": []any{1.0, "x", nil}, "table": map[string]any{"k": true}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("python read %v, want %v", got, want)
	}
}

// killOwnConnection closes, with rabbitmqctl, the broker connections whose
// connection_name is name, and returns how many it closed. Only this test's
// connections are touched.
func killOwnConnection(t testing.TB, name string) int {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "pid", "client_properties").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v\n%s", err, out)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		pid, props, ok := strings.Cut(line, "\t")
		if !ok || !strings.Contains(props, `{"connection_name","`+name+`"}`) {
			continue
		}
		if out, err := exec.Command("rabbitmqctl", "close_connection", pid, "celeriac integration test").CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl close_connection %s: %v\n%s", pid, err, out)
		}
		n++
	}
	return n
}

// TestAMQPDrainUnderConnectionKills drains 5 000 Python-published messages
// while the consumer's connection is closed by the broker four times
// (rabbitmqctl close_connection, the fault close_all_connections causes).
// Every message must be processed; a message processed twice must have been
// redelivered by the broker.
func TestAMQPDrainUnderConnectionKills(t *testing.T) {
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		unavailable(t, "rabbitmqctl not found: the test closes its own connections with it")
	}
	const total = 5000
	q := itAMQPName(t)
	deleteAMQP(t, q)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var ids []string
	pyAMQP(t, q, 0, fmt.Sprintf("send(%d)", total), &ids)
	// py-amqp publishes without confirms, so the broker may still be
	// enqueueing the last messages when the script exits: wait for them.
	ready := 0
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if ready, _ = queueCounts(t, q); ready == total {
			break
		}
	}
	if ready != total || len(ids) != total {
		t.Fatalf("python published %d, queue holds %d", len(ids), ready)
	}

	name := itAMQPName(t)
	tr, logs := amqpTransport(t, amqptransport.Config{ConnectionName: name})
	c, err := tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 32})
	if err != nil {
		t.Fatal(err)
	}
	type record struct{ deliveries, acked, redelivered int }
	seen := make(map[string]*record, total)
	done, deliveries, stale, kills := 0, 0, 0, 0
	for done < total {
		d := next(t, ctx, c)
		deliveries++
		id, _ := d.Message.Headers["id"].(string)
		r := seen[id]
		if r == nil {
			r = &record{}
			seen[id] = r
		} else if !d.Redelivered {
			t.Errorf("message %s processed again without the broker's redelivered flag", id)
		}
		r.deliveries++
		if d.Redelivered {
			r.redelivered++
		}
		// Kill while this delivery and up to 31 more are held unacked.
		if kills < 4 && done >= (kills+1)*total/5 {
			if n := killOwnConnection(t, name+" consumer"); n != 1 {
				t.Fatalf("closed %d connections named %q, want 1", n, name+" consumer")
			}
			kills++
		}
		switch err := d.Ack(ctx); {
		case errors.Is(err, transport.ErrStaleDelivery):
			stale++
		case err != nil:
			t.Fatalf("Ack: %v", err)
		default:
			if r.acked == 0 {
				done++
			}
			r.acked++
		}
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if r := seen[id]; r == nil || r.acked == 0 {
			t.Errorf("message %s never processed", id)
		}
	}
	dups := deliveries - total
	t.Logf("%d messages, %d deliveries (%d duplicates, all redelivered by the broker), %d stale acks, %d kills, %d reconnections",
		total, deliveries, dups, stale, kills, logs.FilterMessage("amqp consumer resumed").Len())
	if kills != 4 || stale < kills {
		t.Errorf("kills %d, stale acks %d: the kills did not hit held deliveries", kills, stale)
	}
	if n := logs.FilterMessage("amqp consumer resumed").Len(); n < kills {
		t.Errorf("consumer resumed %d times after %d kills", n, kills)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	// An ack the broker never saw (written as the connection died) brings
	// its message back once more; one that came back after the last new
	// message was processed is still in the queue. Such leftovers must be
	// redelivered copies of processed messages, nothing else.
	left := drainLeftovers(t, q)
	for _, m := range left {
		if r := seen[m.id]; r == nil || r.acked == 0 || !m.redelivered {
			t.Errorf("left in the queue: %s (redelivered %v)", m.id, m.redelivered)
		}
	}
	if _, consumers := queueCounts(t, q); consumers != 0 {
		t.Errorf("queue left with %d consumers", consumers)
	}
}

type leftover struct {
	id          string
	redelivered bool
}

// drainLeftovers takes every message left in a queue.
func drainLeftovers(t testing.TB, q string) []leftover {
	t.Helper()
	conn, err := amqp091.Dial(amqpURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var out []leftover
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		id, _ := d.Headers["id"].(string)
		out = append(out, leftover{id, d.Redelivered})
	}
}

// TestAMQPPidboxPing carries Celery's remote control over the transport: a
// Python client pings a node whose pidbox queue celeriac subscribes to, and
// celeriac's reply reaches it. Both sides declare the pidbox exchanges, so
// their flags must be equivalent to kombu's.
func TestAMQPPidboxPing(t *testing.T) {
	x := itAMQPName(t)
	node := "celeriac@" + x
	deleteAMQP(t, x+".pidbox", "reply."+x+".pidbox")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tr, _ := amqpTransport(t, amqptransport.Config{})
	sub, err := tr.Subscribe(ctx, transport.Broadcast{Exchange: x + ".pidbox", ExchangeType: transport.Fanout,
		Queue: node + "." + x + ".pidbox", QueueArguments: map[string]any{"x-message-ttl": 300000, "x-expires": 10000}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	errs := make(chan error, 1)
	go func() {
		errs <- func() error {
			var d *transport.Delivery
			select {
			case d = <-sub.Deliveries():
			case <-ctx.Done():
				return ctx.Err()
			}
			var req struct {
				Method      string   `json:"method"`
				Destination []string `json:"destination"`
				Ticket      string   `json:"ticket"`
				ReplyTo     struct {
					Exchange   string `json:"exchange"`
					RoutingKey string `json:"routing_key"`
				} `json:"reply_to"`
			}
			if err := json.Unmarshal(d.Message.Body, &req); err != nil {
				return fmt.Errorf("request %s: %w", d.Message.Body, err)
			}
			if req.Method != "ping" || len(req.Destination) != 1 || req.Destination[0] != node {
				return fmt.Errorf("request %s", d.Message.Body)
			}
			body, _ := json.Marshal(map[string]any{node: map[string]string{"ok": "pong"}})
			return tr.Publish(ctx, &transport.Publishing{
				Exchange: req.ReplyTo.Exchange, ExchangeType: transport.Direct, RoutingKey: req.ReplyTo.RoutingKey,
				NoConfirm: true,
				Message: protocol.Message{ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8", Body: body,
					Headers:    map[string]any{"ticket": req.Ticket, "clock": int64(1)},
					Properties: protocol.Properties{DeliveryMode: 1}},
			})
		}()
	}()
	var replies []map[string]map[string]string
	pyAMQP(t, "", 0, fmt.Sprintf("ping(%q, %q)", node, x), &replies)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if len(replies) != 1 || replies[0][node]["ok"] != "pong" {
		t.Errorf("python got replies %v", replies)
	}
}
