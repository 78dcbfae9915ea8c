package memory_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
)

// These tests cover what is specific to the memory transport; the shared
// behaviour is in TestConformance.

func newTransport(t *testing.T, cfg memory.Config) *memory.Transport {
	t.Helper()
	tr := memory.New(cfg)
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func consume(t *testing.T, tr *memory.Transport, prefetch int, qs ...transport.Queue) transport.Consumer {
	t.Helper()
	c, err := tr.Consume(t.Context(), qs, transport.ConsumeOptions{Prefetch: prefetch})
	if err != nil {
		t.Fatalf("Consume: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return c
}

func message(id string, priority int) protocol.Message {
	return protocol.Message{
		Headers:    map[string]any{"id": id},
		Properties: protocol.Properties{Priority: priority},
		Body:       []byte(id),
	}
}

func publish(t *testing.T, tr *memory.Transport, p *transport.Publishing) {
	t.Helper()
	if err := tr.Publish(t.Context(), p); err != nil {
		t.Fatalf("Publish: %v", err)
	}
}

func recv(t *testing.T, c transport.Consumer) *transport.Delivery {
	t.Helper()
	select {
	case d, ok := <-c.Deliveries():
		if !ok {
			t.Fatalf("Deliveries closed (Err %v)", c.Err())
		}
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	return nil
}

func id(d *transport.Delivery) string { return d.Message.Headers["id"].(string) }

// recvIDs receives n deliveries, acks them and returns their ids.
func recvIDs(t *testing.T, c transport.Consumer, n int) []string {
	t.Helper()
	var out []string
	for range n {
		d := recv(t, c)
		out = append(out, id(d))
		if err := d.Ack(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestPriorityCap(t *testing.T) {
	tr := newTransport(t, memory.Config{})
	// x-max-priority 5: priorities 5, 9 and 200 are all 5, so FIFO among
	// them; a negative priority counts as 0.
	q := transport.Queue{Name: "q", Arguments: map[string]any{memory.ArgMaxPriority: 5}}
	c := consume(t, tr, 1, q)
	if err := c.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i, p := range []int{-3, 9, 0, 200, 5, 4} {
		publish(t, tr, &transport.Publishing{RoutingKey: "q", Message: message(fmt.Sprintf("p%d-%d", p, i), p)})
	}
	got := recvIDs(t, consume(t, tr, 1, q), 6)
	want := []string{"p9-1", "p200-3", "p5-4", "p4-5", "p-3-0", "p0-2"}
	if !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

func TestTopologyMismatch(t *testing.T) {
	tr := newTransport(t, memory.Config{})
	prio := transport.Queue{Name: "q", Arguments: map[string]any{memory.ArgMaxPriority: int64(10)}}
	// Publishing first creates the queue without arguments; the first
	// declaration sets them (a Celery client may publish before any worker
	// starts).
	publish(t, tr, &transport.Publishing{RoutingKey: "q", Message: message("early", 0)})
	consume(t, tr, 0, prio)
	// The same arguments with another Go integer type are the same.
	consume(t, tr, 0, transport.Queue{Name: "q", Arguments: map[string]any{memory.ArgMaxPriority: 10}})

	tests := []struct {
		name string
		q    transport.Queue
	}{
		{"other arguments", transport.Queue{Name: "q", Arguments: map[string]any{memory.ArgMaxPriority: 5}}},
		{"no arguments", transport.Queue{Name: "q"}},
		{"exchange type", transport.Queue{Name: "q2", Exchange: "q", ExchangeType: transport.Topic}},
	}
	for _, tt := range tests {
		_, err := tr.Consume(t.Context(), []transport.Queue{tt.q}, transport.ConsumeOptions{})
		if !errors.Is(err, transport.ErrTopologyMismatch) {
			t.Errorf("%s: Consume: %v, want ErrTopologyMismatch", tt.name, err)
		}
	}
	for _, bad := range []any{"10", -1, 256, 1.5} {
		_, err := tr.Consume(t.Context(), []transport.Queue{{Name: fmt.Sprint("bad", bad), Arguments: map[string]any{memory.ArgMaxPriority: bad}}}, transport.ConsumeOptions{})
		if err == nil {
			t.Errorf("x-max-priority %#v accepted", bad)
		}
	}
}

func TestPublishErrors(t *testing.T) {
	tr := newTransport(t, memory.Config{})
	if err := tr.Publish(t.Context(), &transport.Publishing{Message: message("x", 0)}); err == nil {
		t.Error("publish to the default exchange without a routing key succeeded")
	}
	m := message("x", 0)
	m.Headers["bad"] = struct{}{}
	if err := tr.Publish(t.Context(), &transport.Publishing{RoutingKey: "q", Message: m}); err == nil {
		t.Error("publish with a struct header succeeded")
	}
	if n, _ := tr.Len(t.Context(), "q"); n != 0 {
		t.Errorf("a failed publish left %d messages", n)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := tr.Publish(ctx, &transport.Publishing{RoutingKey: "q", Message: message("x", 0)}); !errors.Is(err, context.Canceled) {
		t.Errorf("publish with a cancelled context: %v", err)
	}
	if _, err := tr.Consume(t.Context(), nil, transport.ConsumeOptions{Prefetch: -1}); err == nil {
		t.Error("negative prefetch accepted")
	}
}

func TestHeaderValuesNormalised(t *testing.T) {
	tr := newTransport(t, memory.Config{})
	c := consume(t, tr, 0, transport.Queue{Name: "q"})
	m := message("x", 0)
	m.Headers["retries"] = 3
	m.Headers["stamped_headers"] = []string{"a"}
	publish(t, tr, &transport.Publishing{RoutingKey: "q", Message: m})
	d := recv(t, c)
	if v, ok := d.Message.Headers["retries"].(int64); !ok || v != 3 {
		t.Errorf("retries = %#v, want int64(3)", d.Message.Headers["retries"])
	}
	if v, ok := d.Message.Headers["stamped_headers"].([]any); !ok || len(v) != 1 || v[0] != "a" {
		t.Errorf("stamped_headers = %#v, want []any{\"a\"}", d.Message.Headers["stamped_headers"])
	}
}

func TestUnroutable(t *testing.T) {
	tr := newTransport(t, memory.Config{})
	publish(t, tr, &transport.Publishing{Exchange: "nowhere", RoutingKey: "k", Message: message("x", 0)})
	consume(t, tr, 0, transport.Queue{Name: "q", Exchange: "jobs", RoutingKey: "k"})
	publish(t, tr, &transport.Publishing{Exchange: "jobs", RoutingKey: "other", Message: message("x", 0)})
	if s := tr.Broker().Stats(); s.Unroutable != 2 {
		t.Errorf("Unroutable = %d, want 2", s.Unroutable)
	}
}

// TestStopReturnsUntaken: messages the consumer's goroutine took but never
// handed out go back unmarked and in order.
func TestStopReturnsUntaken(t *testing.T) {
	tr := newTransport(t, memory.Config{})
	c := consume(t, tr, 0, transport.Queue{Name: "q"})
	for i := range 5 {
		publish(t, tr, &transport.Publishing{RoutingKey: "q", Message: message(fmt.Sprint(i), 0)})
	}
	first := recv(t, c)
	if err := c.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	for d := range c.Deliveries() {
		t.Errorf("delivery %s after Stop", id(d))
	}
	c2 := consume(t, tr, 0, transport.Queue{Name: "q"})
	var got []string
	for range 4 {
		d := recv(t, c2)
		if d.Redelivered {
			t.Errorf("%s marked redelivered though never handed out", id(d))
		}
		got = append(got, id(d))
	}
	if !slices.Equal(got, []string{"1", "2", "3", "4"}) {
		t.Errorf("after Stop: %v, want [1 2 3 4]", got)
	}
	if err := first.Ack(t.Context()); err != nil {
		t.Errorf("Ack after Stop: %v", err)
	}
}

func TestCloseRequeuesInOrder(t *testing.T) {
	b := memory.NewBroker()
	tr := memory.New(memory.Config{Broker: b})
	c := consume(t, tr, 0, transport.Queue{Name: "q"})
	for i := range 4 {
		publish(t, tr, &transport.Publishing{RoutingKey: "q", Message: message(fmt.Sprint(i), 0)})
	}
	ds := []*transport.Delivery{recv(t, c), recv(t, c), recv(t, c)}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	err := ds[0].Ack(t.Context())
	if !errors.Is(err, transport.ErrClosed) || !errors.Is(err, transport.ErrStaleDelivery) {
		t.Errorf("Ack after Close: %v, want ErrClosed and ErrStaleDelivery", err)
	}
	tr2 := newTransport(t, memory.Config{Broker: b})
	c2 := consume(t, tr2, 0, transport.Queue{Name: "q"})
	var got []string
	for range 4 {
		d := recv(t, c2)
		got = append(got, fmt.Sprint(id(d), d.Redelivered))
	}
	want := []string{"0true", "1true", "2true", "3false"}
	if !slices.Equal(got, want) {
		t.Errorf("after Close: %v, want %v", got, want)
	}
	if err := c.Err(); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Err after Close = %v, want ErrClosed", err)
	}
}

func TestSettleHonoursContext(t *testing.T) {
	tr := newTransport(t, memory.Config{})
	c := consume(t, tr, 0, transport.Queue{Name: "q"})
	publish(t, tr, &transport.Publishing{RoutingKey: "q", Message: message("a", 0)})
	d := recv(t, c)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := d.Ack(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Ack with a cancelled context: %v", err)
	}
	if err := d.Ack(t.Context()); err != nil {
		t.Fatalf("Ack after a cancelled attempt: %v", err)
	}
}

func TestDeadLetterTimesAndClock(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tr := newTransport(t, memory.Config{Now: func() time.Time { return at }})
	q := transport.Queue{Name: "q", Arguments: map[string]any{memory.ArgDeadLetterExchange: ""}}
	c := consume(t, tr, 0, q)
	publish(t, tr, &transport.Publishing{RoutingKey: "q", Message: message("a", 0)})
	publish(t, tr, &transport.Publishing{RoutingKey: "q", Message: protocol.Message{Body: []byte("no headers")}})
	d := recv(t, c)
	if !d.ReceivedAt.Equal(at) {
		t.Errorf("ReceivedAt = %v, want the configured clock's %v", d.ReceivedAt, at)
	}
	if err := d.DeadLetter(t.Context(), transport.DeadLetterReason{Reason: "permanent"}); err != nil {
		t.Fatal(err)
	}
	// An x-dead-letter-exchange argument, even "" (RabbitMQ's default
	// exchange), keeps rejected messages.
	if err := recv(t, c).Reject(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	dead, err := tr.DeadLetters(t.Context(), "q", 0)
	if err != nil || len(dead) != 2 {
		t.Fatalf("DeadLetters = %d, %v", len(dead), err)
	}
	if !dead[0].Reason.Time.Equal(at) || dead[0].Reason.Reason != "permanent" {
		t.Errorf("reason %+v", dead[0].Reason)
	}
	if dead[1].Reason.Reason != "rejected" || !dead[1].Reason.Time.Equal(at) {
		t.Errorf("reject reason %+v", dead[1].Reason)
	}
	// Replaying a message that had no headers with ResetRetries adds them.
	if n, err := tr.Replay(t.Context(), "q", []string{dead[1].ID, "no-such-id"}, transport.ReplayOptions{ResetRetries: true}); n != 1 || err != nil {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	if r := recv(t, c).Message.Headers["retries"]; r != int64(0) {
		t.Errorf("retries = %#v", r)
	}
	// The listing is a copy.
	dead[0].Message.Headers["id"] = "changed"
	again, _ := tr.DeadLetters(t.Context(), "q", 0)
	if again[0].Message.Headers["id"] != "a" {
		t.Error("changing a listed dead message changed the store")
	}
}

func TestDeleteQueue(t *testing.T) {
	tr := newTransport(t, memory.Config{})
	c := consume(t, tr, 1, transport.Queue{Name: "q"}, transport.Queue{Name: "other"})
	publish(t, tr, &transport.Publishing{RoutingKey: "q", Message: message("a", 0)})
	publish(t, tr, &transport.Publishing{RoutingKey: "q", Message: message("b", 0)})
	d := recv(t, c)
	if err := tr.DeleteQueue(t.Context(), "q"); err != nil {
		t.Fatal(err)
	}
	if got := c.Queues(); len(got) != 1 || got[0].Name != "other" {
		t.Errorf("Queues after DeleteQueue = %v", got)
	}
	if s := tr.Broker().Stats(); s.Queues != 1 || s.Ready != 0 {
		t.Errorf("stats after DeleteQueue: %+v", s)
	}
	// Requeueing a delivery of a deleted queue recreates it.
	if err := d.Reject(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	if n, _ := tr.Len(t.Context(), "q"); n != 1 {
		t.Errorf("Len after requeue into a deleted queue = %d, want 1", n)
	}
	// Publishing to the default exchange still reaches "q"; the named
	// exchange "q" lost its binding.
	publish(t, tr, &transport.Publishing{Exchange: "q", RoutingKey: "q", Message: message("c", 0)})
	if n, _ := tr.Len(t.Context(), "q"); n != 1 {
		t.Errorf("Len = %d, want 1: exchange q should have no binding", n)
	}
}

func TestSubscriptionQueues(t *testing.T) {
	tr := newTransport(t, memory.Config{})
	// Two subscriptions on one named queue compete, as two consumers of a
	// RabbitMQ queue do; a third with its own queue gets everything.
	s1, err := tr.Subscribe(t.Context(), transport.Broadcast{Exchange: "celery.pidbox", Queue: "w1.pidbox"})
	if err != nil {
		t.Fatal(err)
	}
	s2, err := tr.Subscribe(t.Context(), transport.Broadcast{Exchange: "celery.pidbox", Queue: "w1.pidbox"})
	if err != nil {
		t.Fatal(err)
	}
	s3, err := tr.Subscribe(t.Context(), transport.Broadcast{Exchange: "celery.pidbox"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		publish(t, tr, &transport.Publishing{Exchange: "celery.pidbox", ExchangeType: transport.Fanout, Message: message(fmt.Sprint(i), 0)})
	}
	shared := 0
	for shared < 4 {
		select {
		case d := <-s1.Deliveries():
			if d.Acknowledger != nil {
				t.Error("a broadcast delivery has an Acknowledger")
			}
			shared++
		case <-s2.Deliveries():
			shared++
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of 4 on the shared queue", shared)
		}
	}
	for range 4 {
		select {
		case <-s3.Deliveries():
		case <-time.After(10 * time.Second):
			t.Fatal("own queue missed a broadcast")
		}
	}
	// The named queue is deleted with its last subscription.
	for _, s := range []transport.Subscription{s1, s2, s3} {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if s := tr.Broker().Stats(); s.Queues != 0 {
		t.Errorf("%d queues left after closing every subscription", s.Queues)
	}
	if _, err := tr.Subscribe(t.Context(), transport.Broadcast{}); err == nil {
		t.Error("Subscribe without an exchange succeeded")
	}
	if _, err := tr.Subscribe(t.Context(), transport.Broadcast{Exchange: "celery.pidbox", ExchangeType: transport.Topic}); !errors.Is(err, transport.ErrTopologyMismatch) {
		t.Errorf("Subscribe with another exchange type: %v", err)
	}
}

func TestConsumerRoundRobin(t *testing.T) {
	tr := newTransport(t, memory.Config{})
	qs := []transport.Queue{{Name: "a"}, {Name: "b"}}
	c := consume(t, tr, 1, qs...)
	if err := c.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		publish(t, tr, &transport.Publishing{RoutingKey: "a", Message: message(fmt.Sprint("a", i), 0)})
		publish(t, tr, &transport.Publishing{RoutingKey: "b", Message: message(fmt.Sprint("b", i), 0)})
	}
	got := recvIDs(t, consume(t, tr, 1, qs...), 6)
	want := []string{"a0", "b0", "a1", "b1", "a2", "b2"}
	if !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

func TestStoppedConsumer(t *testing.T) {
	tr := newTransport(t, memory.Config{})
	c := consume(t, tr, 1, transport.Queue{Name: "q"})
	if err := c.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := c.SetPrefetch(3); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("SetPrefetch after Stop: %v", err)
	}
	if err := c.AddQueue(t.Context(), transport.Queue{Name: "r"}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("AddQueue after Stop: %v", err)
	}
	if err := c.CancelQueue(t.Context(), "q"); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("CancelQueue after Stop: %v", err)
	}
	if err := c.SetPrefetch(-1); err == nil {
		t.Error("negative SetPrefetch accepted")
	}
}

func TestEmptyQueueName(t *testing.T) {
	tr := newTransport(t, memory.Config{})
	if _, err := tr.Consume(t.Context(), []transport.Queue{{Name: ""}}, transport.ConsumeOptions{}); err == nil {
		t.Fatal("Consume of a queue without a name succeeded")
	}
	if s := tr.Broker().Stats(); s.Queues != 0 {
		t.Errorf("a failed Consume left %d queues", s.Queues)
	}
	// The default exchange was not declared either: publishing to it still
	// routes by queue name.
	publish(t, tr, &transport.Publishing{RoutingKey: "q", Message: message("a", 0)})
	if n, _ := tr.Len(t.Context(), "q"); n != 1 {
		t.Errorf("Len = %d, want 1", n)
	}
}
