package amqp

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

func TestPublishConsumeAck(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	q := h.q("tasks")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)

	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 4})
	if err != nil {
		t.Fatal(err)
	}
	msg := taskMessage("id-1", 0)
	msg.Headers["x-custom"] = int64(1700000000000)
	msg.Headers["nested"] = map[string]any{"list": []any{int64(1), "two", nil}}
	msg.Properties.ReplyTo = "oid"
	msg.Properties.Expiration = "60000"
	if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: msg}); err != nil {
		t.Fatal(err)
	}
	d := recv(t, c.Deliveries())
	if diff := cmp.Diff(msg, d.Message); diff != "" {
		t.Errorf("delivered message mismatch (-want +got):\n%s", diff)
	}
	if d.Queue != q || d.Exchange != "" || d.RoutingKey != q || d.Redelivered || d.Tag != "1" || d.ReceivedAt.IsZero() {
		t.Errorf("delivery fields: queue %q exchange %q key %q redelivered %v tag %q", d.Queue, d.Exchange, d.RoutingKey, d.Redelivered, d.Tag)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Ack(ctx); !errors.Is(err, transport.ErrAlreadyAcknowledged) {
		t.Errorf("second Ack = %v, want ErrAlreadyAcknowledged", err)
	}
	if err := d.Reject(ctx, true); !errors.Is(err, transport.ErrAlreadyAcknowledged) {
		t.Errorf("Reject after Ack = %v, want ErrAlreadyAcknowledged", err)
	}

	// Published through the named exchange Celery declares, with routing
	// key = queue name: the binding exists.
	if err := h.tr.Publish(ctx, &transport.Publishing{Exchange: q, RoutingKey: q, Message: taskMessage("id-2", 0)}); err != nil {
		t.Fatal(err)
	}
	d = recv(t, c.Deliveries())
	if d.Exchange != q || d.Message.Headers["id"] != "id-2" {
		t.Errorf("via exchange: exchange %q id %v", d.Exchange, d.Message.Headers["id"])
	}
	if err := d.Reject(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-c.Deliveries(); ok {
		t.Error("Deliveries open after Stop")
	}
	if c.Err() != nil {
		t.Errorf("Err after Stop = %v", c.Err())
	}
	if n, err := h.tr.Len(ctx, q); err != nil || n != 0 {
		t.Errorf("Len = %d, %v; want 0", n, err)
	}
}

func TestTopologyAsCelery(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	q := h.q("celery")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	// Celery's declaration must be accepted as equivalent: durable direct
	// exchange, durable non-exclusive non-auto-delete queue, no arguments.
	a.must(func(ch *amqp091.Channel) error {
		return ch.ExchangeDeclarePassive(q, "direct", true, false, false, false, nil)
	})
	a.must(func(ch *amqp091.Channel) error {
		if err := ch.ExchangeDeclare(q, "direct", true, false, false, false, nil); err != nil {
			return err
		}
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		return err
	})
	want := []transport.Queue{{Name: q, Exchange: q, ExchangeType: "direct", RoutingKey: q}}
	if diff := cmp.Diff(want, c.Queues()); diff != "" {
		t.Errorf("Queues() mismatch (-want +got):\n%s", diff)
	}
}

func TestTopologyMismatch(t *testing.T) {
	tests := []struct {
		name     string
		existing amqp091.Table
		argument string
		current  string
	}{
		{"max priority", amqp091.Table{"x-max-priority": int32(10)}, "x-max-priority", "10"},
		{"dead letter exchange", amqp091.Table{"x-dead-letter-exchange": "at_dlx"}, "x-dead-letter-exchange", "at_dlx"},
		{"quorum", amqp091.Table{"x-queue-type": "quorum"}, "x-queue-type", "quorum"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAdmin(t)
			// A quorum queue turns delayed delivery on, and its topology
			// is declared.
			delayedTopologyCleanup(t, a)
			strict := newHarness(t, Config{StrictTopology: true})
			q := strict.q("q")
			a.cleanup([]string{q}, []string{q})
			a.declare(q, tt.existing)
			ctx := testCtx(t)

			_, err := strict.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 2})
			var mm *MismatchError
			if !errors.Is(err, transport.ErrTopologyMismatch) || !errors.As(err, &mm) {
				t.Fatalf("strict Consume error = %v, want a MismatchError", err)
			}
			if mm.Argument != tt.argument || mm.Current != tt.current || mm.DeclaredSet {
				t.Errorf("mismatch = %+v", mm)
			}

			h := newHarness(t, Config{})
			c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 2})
			if err != nil {
				t.Fatalf("lenient Consume: %v", err)
			}
			defer c.Stop(ctx)
			warn := h.logs.FilterMessageSnippet("exists with other arguments").FilterFieldKey("argument").All()
			if len(warn) != 1 || warn[0].ContextMap()["argument"] != tt.argument || warn[0].Level.String() != "warn" {
				t.Errorf("warnings = %+v", warn)
			}
			for i := range 3 {
				if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage(strconv.Itoa(i), 0)}); err != nil {
					t.Fatal(err)
				}
			}
			for range 3 {
				if err := recv(t, c.Deliveries()).Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// The quorum queue cannot be consumed with global QoS; the
			// mismatch taught the consumer to use per-consumer QoS.
			wantGlobal := tt.argument != "x-queue-type"
			if got := c.(*consumer).cs.global; got != wantGlobal {
				t.Errorf("global QoS = %v, want %v", got, wantGlobal)
			}
		})
	}
}

func TestQuorumGlobalQoSRefused(t *testing.T) {
	// A quorum queue the transport cannot recognise in advance (declared
	// with no arguments, existing as quorum, and the mismatch ignored with
	// DeclareNone): the broker refuses global QoS, the transport learns it.
	h := newHarness(t, Config{Declare: DeclareNone})
	a := newAdmin(t)
	q := h.q("quorum")
	a.cleanup([]string{q}, nil)
	a.declare(q, amqp091.Table{"x-queue-type": "quorum"})
	ctx := testCtx(t)
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 3})
	if err != nil {
		t.Fatalf("Consume: %v", err)
	}
	defer c.Stop(ctx)
	if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage("1", 0)}); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, c.Deliveries()).Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if c.(*consumer).cs.global {
		t.Error("still global QoS")
	}
}

func TestPrefetch(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		t.Run(fmt.Sprintf("quorum=%v", quorum), func(t *testing.T) {
			cfg := Config{}
			if quorum {
				cfg.QueueArguments = map[string]any{"x-queue-type": "quorum"}
			}
			h := newHarness(t, cfg)
			a := newAdmin(t)
			delayedTopologyCleanup(t, a)
			q := h.q("prefetch")
			a.cleanup([]string{q}, []string{q})
			ctx := testCtx(t)
			c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Stop(ctx)
			for i := range 10 {
				if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage(strconv.Itoa(i), 0)}); err != nil {
					t.Fatal(err)
				}
			}
			var held []*transport.Delivery
			for range 2 {
				held = append(held, recv(t, c.Deliveries()))
			}
			// With 2 unacknowledged the broker holds the other 8.
			if n := a.ready(q); n != 8 {
				t.Errorf("ready = %d with prefetch 2, want 8", n)
			}
			if err := c.SetPrefetch(5); err != nil {
				t.Fatal(err)
			}
			// Global QoS: 5 in all, 3 more. Per consumer (quorum) the queue
			// is consumed again and the new window of 5 does not count the
			// 2 held under the old consumer tag (see SetPrefetch).
			more, wantReady := 3, 5
			if quorum {
				more, wantReady = 5, 3
			}
			for range more {
				held = append(held, recv(t, c.Deliveries()))
			}
			if n := a.ready(q); n != wantReady {
				t.Errorf("ready = %d after SetPrefetch(5), want %d", n, wantReady)
			}
			for _, d := range held {
				if err := d.Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for range wantReady {
				if err := recv(t, c.Deliveries()).Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestPriorities(t *testing.T) {
	h := newHarness(t, Config{QueueArguments: map[string]any{"x-max-priority": 10}})
	a := newAdmin(t)
	q := h.q("prio")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)
	// Declare by consuming once, then publish while nobody consumes.
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	prios := []int{0, 9, 3, 7, 1}
	for i, p := range prios {
		if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage(strconv.Itoa(i), p)}); err != nil {
			t.Fatal(err)
		}
	}
	c, err = h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	var got []int
	for range prios {
		d := recv(t, c.Deliveries())
		got = append(got, d.Message.Properties.Priority)
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

func TestStopKeepsHeldDeliveries(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	q := h.q("stop")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 5})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage(strconv.Itoa(i), 0)}); err != nil {
			t.Fatal(err)
		}
	}
	held := recv(t, c.Deliveries())
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for range c.Deliveries() {
		t.Error("delivery after Stop")
	}
	// The held one can still be acked; the four others went back.
	if err := held.Ack(ctx); err != nil {
		t.Fatalf("Ack after Stop: %v", err)
	}
	if n := a.ready(q); n != 4 {
		t.Errorf("ready after Stop = %d, want 4", n)
	}
	if err := c.SetPrefetch(3); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("SetPrefetch after Stop = %v, want ErrClosed", err)
	}
}

func TestAddAndCancelQueue(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	q1, q2 := h.q("one"), h.q("two")
	a.cleanup([]string{q1, q2}, []string{q1, q2})
	ctx := testCtx(t)
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q1}}, transport.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	if err := c.AddQueue(ctx, transport.Queue{Name: q2}); err != nil {
		t.Fatal(err)
	}
	if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q2, Message: taskMessage("a", 0)}); err != nil {
		t.Fatal(err)
	}
	d := recv(t, c.Deliveries())
	if d.Queue != q2 {
		t.Errorf("delivery from %q, want %q", d.Queue, q2)
	}
	_ = d.Ack(ctx)
	if err := c.CancelQueue(ctx, q1); err != nil {
		t.Fatal(err)
	}
	if got := c.Queues(); len(got) != 1 || got[0].Name != q2 {
		t.Errorf("Queues() = %+v", got)
	}
	// q1 is no longer consumed: its message stays; q2's arrives.
	for _, q := range []string{q1, q2} {
		if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage(q, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	d = recv(t, c.Deliveries())
	if d.Queue != q2 {
		t.Errorf("delivery from %q after cancel, want %q", d.Queue, q2)
	}
	_ = d.Ack(ctx)
	if n := a.ready(q1); n != 1 {
		t.Errorf("cancelled queue holds %d, want 1", n)
	}
}

func TestBrokerCancelRedeclares(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	q := h.q("deleted")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	a.must(func(ch *amqp091.Channel) error { _, err := ch.QueueDelete(q, false, false, false); return err })
	// The broker cancels the consumer; the transport redeclares the queue
	// and consumes it again on the same channel.
	a.waitConsumers(ctx, q, 1)
	if h.logs.FilterMessageSnippet("broker cancelled the consumer").Len() != 1 {
		t.Errorf("no warning about the cancelled consumer")
	}
	if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage("x", 0)}); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, c.Deliveries()).Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSubscribe(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	fan, topic := h.name+".pidbox", h.q("ev")
	a.cleanup(nil, []string{fan, topic})
	ctx := testCtx(t)

	fs, err := h.tr.Subscribe(ctx, transport.Broadcast{Exchange: fan, Queue: h.q("w1.pidbox"),
		QueueArguments: map[string]any{"x-message-ttl": 300000, "x-expires": 10000}})
	if err != nil {
		t.Fatal(err)
	}
	ts, err := h.tr.Subscribe(ctx, transport.Broadcast{Exchange: topic, ExchangeType: transport.Topic, BindingKey: "worker.#"})
	if err != nil {
		t.Fatal(err)
	}
	// kombu's flags: pidbox fanout transient, events topic durable.
	a.must(func(ch *amqp091.Channel) error {
		return ch.ExchangeDeclarePassive(fan, "fanout", false, false, false, false, nil)
	})
	a.must(func(ch *amqp091.Channel) error {
		return ch.ExchangeDeclare(fan, "fanout", false, false, false, false, nil)
	})
	a.must(func(ch *amqp091.Channel) error {
		return ch.ExchangeDeclare(topic, "topic", true, false, false, false, nil)
	})

	ping := protocol.Message{ContentType: protocol.ContentTypeJSON, Body: []byte(`{"method": "ping"}`),
		Headers: map[string]any{"clock": int64(1)}, Properties: protocol.Properties{DeliveryMode: 1}}
	if err := h.tr.Publish(ctx, &transport.Publishing{Exchange: fan, ExchangeType: transport.Fanout, Message: ping, NoConfirm: true}); err != nil {
		t.Fatal(err)
	}
	d := recv(t, fs.Deliveries())
	if string(d.Message.Body) != `{"method": "ping"}` || d.Exchange != fan || d.Acknowledger != nil {
		t.Errorf("fanout delivery: %+v", d)
	}
	if err := d.Ack(ctx); err != nil {
		t.Errorf("Ack of a broadcast = %v, want nil", err)
	}
	// Topic: the unmatched key is published first; had it been routed it
	// would arrive first.
	for _, key := range []string{"task.succeeded", "worker.heartbeat"} {
		ev := ping
		ev.Body = []byte(key)
		if err := h.tr.Publish(ctx, &transport.Publishing{Exchange: topic, ExchangeType: transport.Topic, RoutingKey: key, Message: ev}); err != nil {
			t.Fatal(err)
		}
	}
	d = recv(t, ts.Deliveries())
	if d.RoutingKey != "worker.heartbeat" || string(d.Message.Body) != "worker.heartbeat" {
		t.Errorf("topic delivery key %q body %q", d.RoutingKey, d.Message.Body)
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-fs.Deliveries(); ok {
		t.Error("subscription deliveries open after Close")
	}
	// The auto-delete queue went away with its consumer.
	if err := a.do(func(ch *amqp091.Channel) error {
		_, err := ch.QueueDeclarePassive(h.q("w1.pidbox"), false, true, false, false, nil)
		return err
	}); !isNotFound(err) {
		t.Errorf("pidbox queue after Close: %v, want NOT_FOUND", err)
	}
}

func TestLenPurge(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	q := h.q("admin")
	a.cleanup([]string{q}, nil)
	ctx := testCtx(t)
	if n, err := h.tr.Len(ctx, q); n != 0 || err != nil {
		t.Errorf("Len of a missing queue = %d, %v", n, err)
	}
	a.declare(q, nil)
	for i := range 3 {
		a.publishRaw("", q, amqp091.Publishing{Body: []byte{byte(i)}})
	}
	if n, err := h.tr.Len(ctx, q); n != 3 || err != nil {
		t.Errorf("Len = %d, %v; want 3", n, err)
	}
	if n, err := h.tr.Purge(ctx, q); n != 3 || err != nil {
		t.Errorf("Purge = %d, %v; want 3", n, err)
	}
	if n, err := h.tr.Purge(ctx, h.q("missing")); n != 0 || err != nil {
		t.Errorf("Purge of a missing queue = %d, %v", n, err)
	}
}

func TestPublishDoesNotCreateReplyQueues(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	task, reply := h.q("task"), h.q("reply")
	a.cleanup([]string{task, reply}, []string{task})
	ctx := testCtx(t)
	// A persistent (task) message creates its queue as Celery does...
	if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: task, Message: taskMessage("1", 0)}); err != nil {
		t.Fatal(err)
	}
	if n := a.ready(task); n != 1 {
		t.Errorf("task queue holds %d, want 1", n)
	}
	// ...a transient one (a result or reply) never does.
	res := taskMessage("2", 0)
	res.Properties.DeliveryMode = 1
	if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: reply, Message: res}); err != nil {
		t.Fatal(err)
	}
	if err := a.do(func(ch *amqp091.Channel) error {
		_, err := ch.QueueDeclarePassive(reply, true, false, false, false, nil)
		return err
	}); !isNotFound(err) {
		t.Errorf("reply queue: %v, want NOT_FOUND", err)
	}
}

func TestClosed(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	q := h.q("closed")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage("1", 0)}); err != nil {
		t.Fatal(err)
	}
	held := recv(t, c.Deliveries())
	if err := h.tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.tr.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if _, ok := <-c.Deliveries(); ok {
		t.Error("Deliveries open after Close")
	}
	if err := held.Ack(ctx); !errors.Is(err, transport.ErrStaleDelivery) {
		t.Errorf("Ack after Close = %v, want ErrStaleDelivery", err)
	}
	if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage("2", 0)}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Publish after Close = %v", err)
	}
	if _, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Consume after Close = %v", err)
	}
	if _, err := h.tr.Subscribe(ctx, transport.Broadcast{Exchange: q + ".x"}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Subscribe after Close = %v", err)
	}
	if _, err := h.tr.Len(ctx, q); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Len after Close = %v", err)
	}
	// The message held at Close went back to the queue.
	if n := a.ready(q); n != 1 {
		t.Errorf("ready after Close = %d, want 1", n)
	}
}

func TestDeadLetter(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	q := h.q("dl")
	dlx, dlq := q+".dlx", q+".dlq"
	a.cleanup([]string{q, dlq}, []string{q, dlx})
	a.must(func(ch *amqp091.Channel) error {
		if err := ch.ExchangeDeclare(dlx, "direct", true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(dlq, q, dlx, false, nil)
	})
	h2 := newHarness(t, Config{QueueArguments: map[string]any{"x-dead-letter-exchange": dlx}})
	ctx := testCtx(t)
	c, err := h2.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage("dead", 0)}); err != nil {
		t.Fatal(err)
	}
	d := recv(t, c.Deliveries())
	if err := d.DeadLetter(ctx, transport.DeadLetterReason{Reason: "max-retries", TaskID: "dead", Error: "boom"}); err != nil {
		t.Fatal(err)
	}
	logged := h2.logs.FilterMessage("amqp message dead-lettered").All()
	if len(logged) != 1 || logged[0].ContextMap()["reason"] != "max-retries" || logged[0].ContextMap()["task_id"] != "dead" {
		t.Errorf("dead-letter log = %+v", logged)
	}
	var got amqp091.Delivery
	a.must(func(ch *amqp091.Channel) error {
		var ok bool
		var err error
		for !ok && err == nil && ctx.Err() == nil {
			got, ok, err = ch.Get(dlq, true)
		}
		return err
	})
	if got.Headers["id"] != "dead" {
		t.Errorf("dead-lettered headers = %v", got.Headers)
	}
	if _, ok := got.Headers["x-death"]; !ok {
		t.Error("no x-death header")
	}
}
