package amqp

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/transporttest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitBound bounds every wait for the broker in these tests. It is a
// deadline against hangs, never an assertion about speed.
const waitBound = 60 * time.Second

// harness is a transport under test with its raw connections (for fault
// injection), its logs and a broker admin connection for setup and checks.
type harness struct {
	t    testing.TB
	tr   *Transport
	logs *observer.ObservedLogs
	name string // unique prefix for queue and exchange names

	mu    sync.Mutex
	conns map[string][]*tagFixConn // by role, newest last
}

// newHarness dials a transport named after the test; cfg.URL defaults to
// the test broker.
func newHarness(t testing.TB, cfg Config) *harness {
	t.Helper()
	if cfg.URL == "" && len(cfg.URLs) == 0 {
		cfg.URL = transporttest.AMQPURL(t)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	if cfg.Logger == nil {
		cfg.Logger = zap.New(core)
	}
	h := &harness{t: t, logs: logs, name: uniqueName(t), conns: map[string][]*tagFixConn{}}
	if cfg.ConnectionName == "" {
		cfg.ConnectionName = h.name
	}
	if cfg.ReconnectInitial == 0 {
		// Tests break connections on purpose: pause 20 ms, doubling,
		// rather than Celery's 2 s steps.
		cfg.ReconnectInitial = 20 * time.Millisecond
		if cfg.ReconnectStep == 0 {
			cfg.ReconnectStep = -1
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	tr, err := dial(ctx, cfg, func(role string, c *tagFixConn) {
		h.mu.Lock()
		h.conns[role] = append(h.conns[role], c)
		h.mu.Unlock()
	})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	h.tr = tr
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

// uniqueName is "at_<test>_<random>", safe as a queue name.
func uniqueName(t testing.TB) string {
	id, err := uuid4()
	if err != nil {
		t.Fatal(err)
	}
	n := strings.NewReplacer("/", "_", " ", "_", "#", "_").Replace(t.Name())
	if len(n) > 60 {
		n = n[:60]
	}
	return "at_" + n + "_" + id[:8]
}

// q returns a queue name for this test.
func (h *harness) q(suffix string) string { return h.name + "_" + suffix }

// kill drops the current raw connection of a role ("consumer" or
// "publisher"), as a network failure would.
func (h *harness) kill(role string) {
	h.t.Helper()
	h.mu.Lock()
	cs := h.conns[role]
	h.mu.Unlock()
	if len(cs) == 0 {
		h.t.Fatalf("no %s connection", role)
	}
	_ = cs[len(cs)-1].Conn.Close()
}

// dials returns how many connections a role has opened.
func (h *harness) dials(role string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns[role])
}

// admin is a plain amqp091 connection for test setup and inspection.
type admin struct {
	t    testing.TB
	conn *amqp091.Connection
}

func newAdmin(t testing.TB) *admin {
	t.Helper()
	conn, err := amqp091.DialConfig(transporttest.AMQPURL(t), amqp091.Config{
		Properties: amqp091.Table{"connection_name": "at_admin " + t.Name()},
	})
	if err != nil {
		t.Fatalf("admin dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &admin{t: t, conn: conn}
}

// do runs fn on a fresh channel and returns its error.
func (a *admin) do(fn func(ch *amqp091.Channel) error) error {
	a.t.Helper()
	ch, err := a.conn.Channel()
	if err != nil {
		a.t.Fatalf("admin channel: %v", err)
	}
	defer func() {
		if !ch.IsClosed() {
			_ = ch.Close()
		}
	}()
	return fn(ch)
}

// must runs fn and fails the test on error.
func (a *admin) must(fn func(ch *amqp091.Channel) error) {
	a.t.Helper()
	if err := a.do(fn); err != nil {
		a.t.Fatalf("admin: %v", err)
	}
}

// cleanup deletes queues and exchanges when the test ends.
func (a *admin) cleanup(queues, exchanges []string) {
	a.t.Cleanup(func() {
		conn, err := amqp091.Dial(transporttest.AMQPURL(a.t))
		if err != nil {
			a.t.Errorf("cleanup dial: %v", err)
			return
		}
		defer conn.Close()
		for _, q := range queues {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(q, false, false, false)
				_ = ch.Close()
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

// declare creates a durable queue with arguments, as Python would have.
func (a *admin) declare(name string, args amqp091.Table) {
	a.t.Helper()
	a.must(func(ch *amqp091.Channel) error {
		_, err := ch.QueueDeclare(name, true, false, false, false, args)
		return err
	})
}

// counts returns a queue's ready message count.
func (a *admin) ready(name string) int {
	a.t.Helper()
	var n int
	a.must(func(ch *amqp091.Channel) error {
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	return n
}

// waitConsumers polls until queue exists with exactly n consumers.
func (a *admin) waitConsumers(ctx context.Context, queue string, n int) {
	a.t.Helper()
	for {
		var got int
		err := a.do(func(ch *amqp091.Channel) error {
			q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			got = q.Consumers
			return err
		})
		if err == nil && got == n {
			return
		}
		select {
		case <-ctx.Done():
			a.t.Fatalf("queue %s: %d consumers (%v), want %d", queue, got, err, n)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// publishRaw publishes with amqp091 directly (as another client would).
func (a *admin) publishRaw(exchange, key string, p amqp091.Publishing) {
	a.t.Helper()
	a.must(func(ch *amqp091.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		dc, err := ch.PublishWithDeferredConfirm(exchange, key, false, false, p)
		if err != nil {
			return err
		}
		dc.Wait()
		return nil
	})
}

// taskMessage is a small Celery-like task message.
func taskMessage(id string, priority int) protocol.Message {
	return protocol.Message{
		ContentType:     protocol.ContentTypeJSON,
		ContentEncoding: "utf-8",
		Headers:         map[string]any{"lang": "py", "task": "tasks.add", "id": id, "retries": int64(0)},
		Properties:      protocol.Properties{CorrelationID: id, DeliveryMode: 2, Priority: priority},
		Body:            []byte(`[[2, 3], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]`),
	}
}

// recv takes the next delivery or fails the test.
func recv(t testing.TB, ch <-chan *transport.Delivery) *transport.Delivery {
	t.Helper()
	select {
	case d, ok := <-ch:
		if !ok {
			t.Fatal("deliveries closed")
		}
		return d
	case <-time.After(waitBound):
		t.Fatal("no delivery")
	}
	return nil
}

// ctx returns a context bounded by waitBound.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	t.Cleanup(cancel)
	return ctx
}

// amqpPublishing is a task message as another AMQP client would publish it.
func amqpPublishing(id string) amqp091.Publishing {
	return amqp091.Publishing{
		ContentType: "application/json", DeliveryMode: 2,
		Headers: amqp091.Table{"task": "tasks.add", "id": id},
		Body:    []byte(`[[], {}, {}]`),
	}
}
