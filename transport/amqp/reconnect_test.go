package amqp

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/transporttest"
)

func TestConsumerReconnect(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	q := h.q("reconnect")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	for i := range 5 {
		if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage(strconv.Itoa(i), 0)}); err != nil {
			t.Fatal(err)
		}
	}
	held := []*transport.Delivery{recv(t, c.Deliveries()), recv(t, c.Deliveries())}
	if err := c.SetPrefetch(1); err != nil {
		t.Fatal(err)
	}

	h.kill("consumer")
	for _, d := range held {
		if err := d.Ack(ctx); !errors.Is(err, transport.ErrStaleDelivery) {
			t.Errorf("Ack of a delivery from the dead channel = %v, want ErrStaleDelivery", err)
		}
	}
	// Deliveries stays open; everything comes back, the held ones marked
	// redelivered, one at a time (the prefetch set before the loss). A
	// delivery that was on its way out of the dead channel may still be
	// handed out: its ack fails as stale and the broker sends it again.
	seen := map[string]bool{}
	for len(seen) < 5 {
		d := recv(t, c.Deliveries())
		id := d.Message.Headers["id"].(string)
		if err := d.Ack(ctx); errors.Is(err, transport.ErrStaleDelivery) {
			continue
		} else if err != nil {
			t.Fatalf("Ack after reconnect: %v", err)
		}
		if (id == held[0].Message.Headers["id"] || id == held[1].Message.Headers["id"]) && !d.Redelivered {
			t.Errorf("held message %s not marked redelivered", id)
		}
		seen[id] = true
		if n := a.ready(q); n > 5-len(seen) || n < 5-len(seen)-1 {
			t.Errorf("ready = %d after %d acks with prefetch 1", n, len(seen))
		}
	}
	if h.logs.FilterMessage("amqp connection lost; reconnecting").Len() == 0 ||
		h.logs.FilterMessage("amqp consumer resumed").Len() == 0 {
		t.Error("reconnection not logged")
	}
	if n := h.dials("consumer"); n != 2 {
		t.Errorf("consumer connections = %d, want 2", n)
	}
	if n := h.tr.Reconnects(); n != 1 {
		t.Errorf("Reconnects() = %d, want 1", n)
	}
	if c.Err() != nil {
		t.Errorf("Err = %v", c.Err())
	}
}

func TestPublishDuringOutage(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	q := h.q("outage")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)
	const workers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				if w == 0 && i%10 == 5 {
					h.kill("publisher")
				}
				id := fmt.Sprintf("%d-%d", w, i)
				if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage(id, 0)}); err != nil {
					errs <- fmt.Errorf("publish %s: %w", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Every confirmed message is in the queue; a message whose confirm was
	// lost with the connection may be there twice.
	total := a.ready(q)
	t.Logf("%d messages published and confirmed, %d in the queue", workers*each, total)
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	seen := map[string]int{}
	for ; len(seen) < workers*each; total-- {
		if total == 0 {
			t.Fatalf("queue drained with %d of %d messages", len(seen), workers*each)
		}
		d := recv(t, c.Deliveries())
		seen[d.Message.Headers["id"].(string)]++
		_ = d.Ack(ctx)
	}
	if n := h.dials("publisher"); n < 2 {
		t.Errorf("publisher connections = %d, want a reconnection", n)
	}
}

func TestFailover(t *testing.T) {
	broker := transporttest.AMQPURL(t)
	p := newProxy(t, broker, nil)
	dead := "amqp://guest:guest@127.0.0.1:1//"
	// The dead URL is skipped at dial; the proxy is used.
	h := newHarness(t, Config{URL: dead + ";" + p.url(broker, "amqp") + "; " + broker})
	sess, err := h.tr.con.current(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := sess.url.dial; got != p.url(broker, "amqp") {
		t.Errorf("connected to %s, want the proxy", got)
	}
	a := newAdmin(t)
	q := h.q("failover")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	redacted := func(raw string) string {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		return u.Redacted()
	}
	if got := h.tr.Node(); got != redacted(p.url(broker, "amqp")) {
		t.Errorf("Node() = %q, want the proxy", got)
	}
	// The proxy goes away: round-robin goes on with the URL after it.
	p.close()
	if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage("after", 0)}); err != nil {
		t.Fatal(err)
	}
	d := recv(t, c.Deliveries())
	if d.Message.Headers["id"] != "after" {
		t.Errorf("got %v", d.Message.Headers["id"])
	}
	_ = d.Ack(ctx)
	for _, l := range []*link{h.tr.con, h.tr.pub} {
		sess, err := l.current(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if sess.url.dial != broker {
			t.Errorf("%s reconnected to %s, want %s", l.role, sess.url.redacted, broker)
		}
	}
	if got := h.tr.Node(); got != redacted(broker) {
		t.Errorf("Node() = %q after failover, want %q", got, broker)
	}
	if n := h.tr.Failovers(); n != 2 {
		t.Errorf("Failovers() = %d, want 2 (consumer and publisher)", n)
	}
	if n := h.logs.FilterMessage("amqp failed over to another broker node").Len(); n != 2 {
		t.Errorf("%d failover log lines, want 2", n)
	}
}

func TestHeartbeatDetectsDeadPeer(t *testing.T) {
	broker := transporttest.AMQPURL(t)
	p := newProxy(t, broker, nil)
	h := newHarness(t, Config{URL: p.url(broker, "amqp"), Heartbeat: time.Second})
	a := newAdmin(t)
	q := h.q("heartbeat")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	// Silence without a close: only heartbeats can notice.
	p.freeze()
	a.publishRaw("", q, amqpPublishing("after-freeze"))
	d := recv(t, c.Deliveries())
	if d.Message.Headers["id"] != "after-freeze" {
		t.Errorf("got %v", d.Message.Headers["id"])
	}
	_ = d.Ack(ctx)
	if h.logs.FilterMessage("amqp connection lost; reconnecting").Len() == 0 {
		t.Error("the frozen connection was not detected")
	}
}

func TestTLS(t *testing.T) {
	broker := transporttest.AMQPURL(t)
	srv, cli := selfSigned(t)
	p := newProxy(t, broker, srv)
	h := newHarness(t, Config{URL: p.url(broker, "amqps"), TLS: cli})
	a := newAdmin(t)
	q := h.q("tls")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage("tls", 0)}); err != nil {
		t.Fatal(err)
	}
	if d := recv(t, c.Deliveries()); d.Message.Headers["id"] != "tls" {
		t.Errorf("got %v", d.Message.Headers["id"])
	} else {
		_ = d.Ack(ctx)
	}
	sess, err := h.tr.con.current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if state := sess.conn.ConnectionState(); !state.HandshakeComplete {
		t.Error("no TLS handshake on the consumer connection")
	}
	// Without the CA the handshake must fail.
	_, err = Dial(ctx, Config{URL: p.url(broker, "amqps")})
	if err == nil {
		t.Error("Dial trusted an unknown certificate")
	}
}

func TestPublishWaitIsBoundedByCtx(t *testing.T) {
	broker := transporttest.AMQPURL(t)
	p := newProxy(t, broker, nil)
	h := newHarness(t, Config{URL: p.url(broker, "amqp")})
	p.close() // the only broker is gone for good
	ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
	defer cancel()
	err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: h.q("never"), Message: taskMessage("x", 0)})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Publish during an endless outage = %v, want the ctx's error", err)
	}
	if h.logs.FilterMessage("amqp reconnect failed").Len() == 0 {
		t.Error("failed reconnection rounds not logged")
	}
}

func TestPublishChannelError(t *testing.T) {
	h := newHarness(t, Config{Declare: DeclareNone})
	ctx := testCtx(t)
	missing := h.q("missing_exchange")
	err := h.tr.Publish(ctx, &transport.Publishing{Exchange: missing, RoutingKey: "k", Message: taskMessage("x", 0)})
	var ae *amqp091.Error
	if !errors.As(err, &ae) || ae.Code != amqp091.NotFound {
		t.Errorf("Publish to a missing exchange = %v, want NOT_FOUND", err)
	}
	// The publishing channel is replaced: the next publish works.
	a := newAdmin(t)
	q := h.q("after")
	a.cleanup([]string{q}, nil)
	a.declare(q, nil)
	if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: taskMessage("y", 0)}); err != nil {
		t.Fatal(err)
	}
	if n := a.ready(q); n != 1 {
		t.Errorf("ready = %d, want 1", n)
	}
}

func TestConsumerFailsForGood(t *testing.T) {
	broker := transporttest.AMQPURL(t)
	p := newProxy(t, broker, nil)
	h := newHarness(t, Config{URL: p.url(broker, "amqp"), StrictTopology: true})
	a := newAdmin(t)
	q := h.q("changed")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 1})
	if err != nil {
		t.Fatal(err)
	}
	// While the broker is unreachable someone recreates the queue with
	// other arguments; when it is back, the redeclaration is refused,
	// which retrying will not fix.
	p.refuse(true)
	p.drop()
	a.waitConsumers(ctx, q, 0)
	a.must(func(ch *amqp091.Channel) error { _, err := ch.QueueDelete(q, false, false, false); return err })
	a.declare(q, amqp091.Table{"x-max-priority": int32(5)})
	p.refuse(false)
	for range c.Deliveries() {
		t.Error("unexpected delivery")
	}
	var mm *MismatchError
	if !errors.As(c.Err(), &mm) || mm.Argument != "x-max-priority" {
		t.Errorf("Err = %v, want the mismatch", c.Err())
	}
	if err := c.Stop(ctx); err != nil {
		t.Errorf("Stop after failure = %v", err)
	}
}

func TestRequeueAtHeadPerConsumer(t *testing.T) {
	h := newHarness(t, Config{QoS: QoSPerConsumer})
	a := newAdmin(t)
	q := h.q("head")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)
	a.declare(q, nil)
	for round := range 20 {
		for i := range 3 {
			a.publishRaw("", q, amqpPublishing(strconv.Itoa(i)))
		}
		c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := recv(t, c.Deliveries()).Reject(ctx, true); err != nil {
			t.Fatal(err)
		}
		var got []any
		for range 3 {
			d := recv(t, c.Deliveries())
			got = append(got, d.Message.Headers["id"])
			_ = d.Ack(ctx)
		}
		if got[0] != "0" {
			t.Errorf("round %d: order after requeueing 0 is %v", round, got)
		}
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFailoverShuffle: with broker_failover_strategy "shuffle" the first
// connection goes to a random URL, so a fleet spreads over the nodes (with
// round-robin every transport starts on the first URL).
func TestFailoverShuffle(t *testing.T) {
	broker := transporttest.AMQPURL(t)
	ps := []*proxy{newProxy(t, broker, nil), newProxy(t, broker, nil), newProxy(t, broker, nil)}
	var urls []string
	for _, p := range ps {
		urls = append(urls, p.url(broker, "amqp"))
	}
	nodes := map[string]int{}
	for range 12 {
		h := newHarness(t, Config{URLs: urls, FailoverStrategy: FailoverShuffle})
		nodes[h.tr.Node()]++
		if err := h.tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// 12 transports all on one of 3 URLs by chance: 3 in 3^12.
	if len(nodes) < 2 {
		t.Errorf("12 shuffled transports all started on the same URL: %v", nodes)
	}
}
