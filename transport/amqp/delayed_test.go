package amqp

import (
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// bits is kombu's '.'.join(f'{n:028b}'), spelt out by hand.
func bits(n int64) string {
	var b []string
	for i := 27; i >= 0; i-- {
		b = append(b, map[bool]string{true: "1", false: "0"}[n>>i&1 == 1])
	}
	return strings.Join(b, ".")
}

func TestDelayedRoutingKey(t *testing.T) {
	z := strings.Repeat("0.", 27)
	tests := []struct {
		countdown int64
		key       string
		want      string
	}{
		// calculate_routing_key(5, "celery"), as the spec's example gives it.
		{5, "celery", z[:len(z)-4] + "1.0.1.celery"},
		{1, "celery", z + "1.celery"},
		{2, "a.b", z[:len(z)-2] + "1.0.a.b"},
		{delayedMaxCountdown, "q", strings.Repeat("1.", 28) + "q"},
		{1 << 27, "q", "1." + z + "q"},
		// A key that already carries a prefix (a retried message) gets
		// the new one instead, not a second.
		{3, z + "1.celery", z[:len(z)-2] + "1.1.celery"},
		{3, bits(1<<27+9) + ".x", bits(3) + ".x"},
	}
	for _, tt := range tests {
		got := delayedRoutingKey(tt.countdown, tt.key)
		if got != tt.want {
			t.Errorf("delayedRoutingKey(%d, %q) = %q, want %q", tt.countdown, tt.key, got, tt.want)
		}
		if want := bits(tt.countdown) + "." + stripDelayedPrefix(tt.key); got != want {
			t.Errorf("delayedRoutingKey(%d, %q) = %q, kombu's formula gives %q", tt.countdown, tt.key, got, want)
		}
	}
}

func TestStripDelayedPrefix(t *testing.T) {
	z := strings.Repeat("0.", 28)
	tests := []struct{ key, want string }{
		{"celery", "celery"},
		{"", ""},
		{z + "celery", "celery"},
		{z, ""},
		{z[:len(z)-2] + "2.celery", z[:len(z)-2] + "2.celery"}, // not a bit
		{z[:len(z)-1] + "x" + "celery", z[:len(z)-1] + "xcelery"},
		{z[2:] + "celery", z[2:] + "celery"}, // 27 groups only
		{z + z + "q", z + "q"},               // one prefix at a time, as kombu
	}
	for _, tt := range tests {
		if got := stripDelayedPrefix(tt.key); got != tt.want {
			t.Errorf("stripDelayedPrefix(%q) = %q, want %q", tt.key, got, tt.want)
		}
	}
}

func FuzzStripDelayedPrefix(f *testing.F) {
	f.Add(int64(5), "celery")
	f.Add(int64(0), strings.Repeat("1.", 28)+"x")
	f.Add(int64(-1), "")
	f.Fuzz(func(t *testing.T, n int64, key string) {
		defer fuzzwatch.Watch(t, n, key)()
		s := stripDelayedPrefix(key)
		if !strings.HasSuffix(key, s) {
			t.Fatalf("stripDelayedPrefix(%q) = %q, not a suffix", key, s)
		}
		n &= delayedMaxCountdown
		k := delayedRoutingKey(n, key)
		if got := stripDelayedPrefix(k); got != s {
			t.Fatalf("strip(delayedRoutingKey(%d, %q)) = %q, want %q", n, key, got, s)
		}
		if len(k) != delayedKeyPrefixLen+len(s) {
			t.Fatalf("delayedRoutingKey(%d, %q) = %q: length %d", n, key, k, len(k))
		}
	})
}

func TestIsDelayedExchange(t *testing.T) {
	for name, want := range map[string]bool{
		"celery_delayed_0": true, "celery_delayed_27": true, "celery_delayed_delivery": true,
		"celery_delayed_28": false, "celery_delayed_": false, "celery_delayed_07": false,
		"celery_delayed_-1": false, "celery": false, "": false, "x_celery_delayed_1": false,
	} {
		if got := isDelayedExchange(name); got != want {
			t.Errorf("isDelayedExchange(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestDelayedQueueArgs(t *testing.T) {
	got := delayedQueueArgs(27, "quorum")
	want := amqp091.Table{
		"x-queue-type": "quorum", "x-overflow": "reject-publish", "x-message-ttl": int64(134217728000),
		"x-dead-letter-exchange": "celery_delayed_26", "x-dead-letter-strategy": "at-least-once",
	}
	if !tableEqual(got, want) {
		t.Errorf("level 27: %v, want %v", got, want)
	}
	got = delayedQueueArgs(0, "classic")
	want = amqp091.Table{
		"x-queue-type": "classic", "x-overflow": "reject-publish", "x-message-ttl": int64(1000),
		"x-dead-letter-exchange": "celery_delayed_delivery",
	}
	if !tableEqual(got, want) {
		t.Errorf("level 0: %v, want %v", got, want)
	}
}

func tableEqual(a, b amqp091.Table) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestDelayedRoute(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	eta := func(d time.Duration) protocol.Message {
		m := taskMessage("id", 0)
		m.Headers["eta"] = protocol.FormatTime(now.Add(d))
		return m
	}
	plainMsg := taskMessage("id", 0)
	tests := []struct {
		name        string
		mode        DelayedDeliveryMode
		quorum      bool
		p           transport.Publishing
		wantEx      string
		wantKey     string
		wantDelayed bool
	}{
		{"auto without quorum", DelayedAuto, false, transport.Publishing{Exchange: "tx", RoutingKey: "q", Message: eta(5 * time.Second)}, "tx", "q", false},
		{"auto with quorum", DelayedAuto, true, transport.Publishing{Exchange: "tx", RoutingKey: "q", Message: eta(5 * time.Second)}, "celery_delayed_27", bits(5) + ".q", true},
		{"on", DelayedOn, false, transport.Publishing{Exchange: "tx", RoutingKey: "q", Message: eta(5 * time.Second)}, "celery_delayed_27", bits(5) + ".q", true},
		{"off", DelayedOff, true, transport.Publishing{Exchange: "tx", RoutingKey: "q", Message: eta(5 * time.Second)}, "tx", "q", false},
		{"truncated to whole seconds", DelayedOn, false, transport.Publishing{Exchange: "tx", RoutingKey: "q", Message: eta(2999 * time.Millisecond)}, "celery_delayed_27", bits(2) + ".q", true},
		{"under a second", DelayedOn, false, transport.Publishing{Exchange: "tx", RoutingKey: "q", Message: eta(999 * time.Millisecond)}, "tx", "q", false},
		{"eta passed", DelayedOn, false, transport.Publishing{Exchange: "tx", RoutingKey: "q", Message: eta(-time.Hour)}, "tx", "q", false},
		{"no eta", DelayedOn, false, transport.Publishing{Exchange: "tx", RoutingKey: "q", Message: plainMsg}, "tx", "q", false},
		{"beyond 28 bits", DelayedOn, false, transport.Publishing{Exchange: "tx", RoutingKey: "q", Message: eta(1 << 28 * time.Second)}, "tx", "q", false},
		{"direct exchange", DelayedOn, false, transport.Publishing{Exchange: "dx", RoutingKey: "q", Message: eta(5 * time.Second)}, "dx", "q", false},
		{"unknown exchange", DelayedOn, false, transport.Publishing{Exchange: "other", RoutingKey: "q", Message: eta(5 * time.Second)}, "other", "q", false},
		{"topic named by the publisher", DelayedOn, false, transport.Publishing{Exchange: "other", ExchangeType: transport.Topic, RoutingKey: "q", Message: eta(5 * time.Second)}, "celery_delayed_27", bits(5) + ".q", true},
		{"key past 255 bytes with the prefix", DelayedOn, false, transport.Publishing{Exchange: "tx", RoutingKey: strings.Repeat("k", 200), Message: eta(5 * time.Second)}, "tx", strings.Repeat("k", 200), false},
		{"default exchange", DelayedOn, false, transport.Publishing{RoutingKey: "q", Message: eta(5 * time.Second)}, "", "q", false},
		{"retry out of the levels, delayed", DelayedOn, false, transport.Publishing{Exchange: "celery_delayed_0", RoutingKey: bits(7) + ".q", Message: eta(3 * time.Second)}, "celery_delayed_27", bits(3) + ".q", true},
		{"retry out of the levels, at once", DelayedOn, false, transport.Publishing{Exchange: "celery_delayed_3", RoutingKey: bits(7) + ".q", Message: plainMsg}, "celery_delayed_delivery", "q", false},
		{"retry out of the levels, delivery off", DelayedOff, false, transport.Publishing{Exchange: "celery_delayed_delivery", RoutingKey: bits(7) + ".q", Message: eta(3 * time.Second)}, "celery_delayed_delivery", "q", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := &Transport{s: &settings{Config: Config{DelayedDelivery: tt.mode}}}
			tr.exchangeKinds.Store("tx", transport.Topic)
			tr.exchangeKinds.Store("dx", transport.Direct)
			tr.quorumSeen.Store(tt.quorum)
			ex, key := plainRoute(&tt.p)
			dex, dkey, delayed := tr.delayedRoute(&tt.p, func() time.Time { return now })
			if delayed {
				ex, key = dex, dkey
			}
			if ex != tt.wantEx || key != tt.wantKey || delayed != tt.wantDelayed {
				t.Errorf("route = %q %q delayed=%v, want %q %q delayed=%v", ex, key, delayed, tt.wantEx, tt.wantKey, tt.wantDelayed)
			}
		})
	}
}

// delayedTopologyCleanup removes the delayed-delivery topology when the test
// ends, if it did not exist before (on a shared broker, Python workers may
// have declared it, and then it stays). Queues holding messages stay too.
func delayedTopologyCleanup(t *testing.T, a *admin) {
	t.Helper()
	if delayedTopologyExists(a) {
		return
	}
	var queues, exchanges []string
	for level := 0; level <= delayedMaxLevel; level++ {
		queues = append(queues, delayedLevel(level))
		exchanges = append(exchanges, delayedLevel(level))
	}
	a.cleanup(queues, append(exchanges, delayedDelivery))
}

// TestDelayedDeliveryOnBroker routes countdown tasks through the real
// celery_delayed_* topology of RabbitMQ: the broker, not the consumer,
// holds them, they come out at the queue of a quorum queue's topic
// exchange, and a retry out of the levels neither piles up prefixes nor
// keeps the delay it arrived with.
func TestDelayedDeliveryOnBroker(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	delayedTopologyCleanup(t, a)
	q, x := h.q("ndd"), h.q("ndd_x")
	a.cleanup([]string{q}, []string{x})
	ctx := testCtx(t)
	cons, err := h.tr.Consume(ctx, []transport.Queue{{
		Name: q, Exchange: x, ExchangeType: transport.Topic, RoutingKey: q,
		Arguments: map[string]any{"x-queue-type": "quorum"},
	}}, transport.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Stop(ctx)

	// The topology is Celery's: every level exists (a passive declare of
	// the queue with other arguments would still pass, so the arguments
	// are checked by what the levels do below).
	for level := 0; level <= delayedMaxLevel; level++ {
		a.must(func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclarePassive(delayedLevel(level), true, false, false, false, nil)
			return err
		})
	}

	send := func(id string, exchange, key string, countdown time.Duration) time.Time {
		t.Helper()
		m := taskMessage(id, 0)
		sent := time.Now()
		if countdown != 0 {
			m.Headers["eta"] = protocol.FormatTime(sent.Add(countdown))
		}
		if err := h.tr.Publish(ctx, &transport.Publishing{Exchange: exchange, RoutingKey: key, Message: m}); err != nil {
			t.Fatal(err)
		}
		return sent
	}
	take := func(id string) *transport.Delivery {
		t.Helper()
		d := recv(t, cons.Deliveries())
		if got, _ := d.Message.Headers["id"].(string); got != id {
			t.Fatalf("delivery %q, want %q", got, id)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		return d
	}

	// 2.5 s is 2 whole seconds: level 1 holds it 2 s, level 0 passes it on.
	sent := send("two", x, q, 2500*time.Millisecond)
	d := take("two")
	if held := d.ReceivedAt.Sub(sent); held < 2*time.Second {
		t.Errorf("countdown task delivered after %v: the broker did not hold it 2 s", held)
	}
	if !isDelayedExchange(d.Exchange) || d.RoutingKey != bits(2)+"."+q {
		t.Errorf("delivered through %q with key %q, want a delayed-delivery exchange and %q", d.Exchange, d.RoutingKey, bits(2)+"."+q)
	}
	if _, ok := d.Message.Headers["x-death"]; !ok {
		t.Error("no x-death header: the message did not go through a level's queue")
	}

	// A retry of that delivery, to where it came from, 1 s later: one
	// prefix (for 1 s), not two.
	sent = send("retry", d.Exchange, d.RoutingKey, 1500*time.Millisecond)
	r := take("retry")
	if held := r.ReceivedAt.Sub(sent); held < time.Second {
		t.Errorf("retry delivered after %v, want at least 1 s", held)
	}
	if r.RoutingKey != bits(1)+"."+q {
		t.Errorf("retry key %q, want %q", r.RoutingKey, bits(1)+"."+q)
	}

	// Retried at once: straight to the delivery exchange, key unprefixed,
	// not delayed again by the bits it came with.
	send("now", r.Exchange, r.RoutingKey, 0)
	n := take("now")
	if n.Exchange != delayedDelivery || n.RoutingKey != q {
		t.Errorf("immediate retry delivered through %q key %q, want %q key %q", n.Exchange, n.RoutingKey, delayedDelivery, q)
	}

	// Under a second, and without an eta: not through the levels.
	send("soon", x, q, 500*time.Millisecond)
	if s := take("soon"); s.Exchange != x || s.RoutingKey != q {
		t.Errorf("sub-second countdown delivered through %q key %q, want %q key %q", s.Exchange, s.RoutingKey, x, q)
	}
}

// TestDelayedDeliveryDirectExchange: a direct exchange cannot route the
// "#.<key>" pattern, so, as Celery, the queue is not bound, a warning says
// why, and its countdown tasks go to it directly for the worker to hold.
func TestDelayedDeliveryDirectExchange(t *testing.T) {
	h := newHarness(t, Config{DelayedDelivery: DelayedOn})
	a := newAdmin(t)
	delayedTopologyCleanup(t, a)
	q := h.q("nddd")
	a.cleanup([]string{q}, []string{q})
	ctx := testCtx(t)
	cons, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Stop(ctx)
	if n := h.logs.FilterMessageSnippet("native delayed delivery cannot route").Len(); n != 1 {
		t.Errorf("%d warnings about the direct exchange, want 1", n)
	}
	m := taskMessage("direct", 0)
	m.Headers["eta"] = protocol.FormatTime(time.Now().Add(30 * time.Second))
	if err := h.tr.Publish(ctx, &transport.Publishing{Exchange: q, RoutingKey: q, Message: m}); err != nil {
		t.Fatal(err)
	}
	d := recv(t, cons.Deliveries())
	if d.Exchange != q || d.RoutingKey != q {
		t.Errorf("delivered through %q key %q, want %q key %q (held by the worker, not the broker)", d.Exchange, d.RoutingKey, q, q)
	}
	_ = d.Ack(ctx)
}

// delayedTopologyExists reports whether the levels' entry exchange exists.
func delayedTopologyExists(a *admin) bool {
	return a.do(func(ch *amqp091.Channel) error {
		return ch.ExchangeDeclarePassive(delayedLevel(delayedMaxLevel), transport.Topic, true, false, false, false, nil)
	}) == nil
}

// TestDelayedDeliveryPublisherOnly: a transport that consumes nothing
// declares the levels itself before routing a countdown task into them,
// rather than publishing into missing exchanges.
func TestDelayedDeliveryPublisherOnly(t *testing.T) {
	a := newAdmin(t)
	if delayedTopologyExists(a) {
		t.Skip("the delayed-delivery topology exists on this broker already (Python workers?); this test needs it absent")
	}
	delayedTopologyCleanup(t, a)
	h := newHarness(t, Config{DelayedDelivery: DelayedOn})
	x := h.q("x")
	a.cleanup(nil, []string{x})
	m := taskMessage("later", 0)
	m.Headers["eta"] = protocol.FormatTime(time.Now().Add(100500 * time.Millisecond))
	ctx := testCtx(t)
	if err := h.tr.Publish(ctx, &transport.Publishing{Exchange: x, ExchangeType: transport.Topic, RoutingKey: "k", Message: m}); err != nil {
		t.Fatal(err)
	}
	// 100 s = 64 + 32 + 4: the highest bit's level, 6, holds it first.
	if n := a.ready(delayedLevel(6)); n != 1 {
		t.Errorf("%s holds %d messages, want 1", delayedLevel(6), n)
	}
}

// TestDelayedDeliveryUnavailable: with the levels missing and nothing
// declared (DeclarePassive), countdown tasks are published directly, and
// the reason is logged once for the connection, not once per message.
func TestDelayedDeliveryUnavailable(t *testing.T) {
	a := newAdmin(t)
	if delayedTopologyExists(a) {
		t.Skip("the delayed-delivery topology exists on this broker already (Python workers?); this test needs it absent")
	}
	h := newHarness(t, Config{DelayedDelivery: DelayedOn, Declare: DeclarePassive})
	x, q := h.q("x"), h.q("q")
	a.cleanup([]string{q}, []string{x})
	a.must(func(ch *amqp091.Channel) error {
		return ch.ExchangeDeclare(x, transport.Topic, true, false, false, false, nil)
	})
	a.declare(q, nil)
	a.must(func(ch *amqp091.Channel) error { return ch.QueueBind(q, "#", x, false, nil) })
	ctx := testCtx(t)
	for _, id := range []string{"a", "b"} {
		m := taskMessage(id, 0)
		m.Headers["eta"] = protocol.FormatTime(time.Now().Add(time.Minute))
		if err := h.tr.Publish(ctx, &transport.Publishing{Exchange: x, ExchangeType: transport.Topic, RoutingKey: q, Message: m}); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.ready(q); n != 2 {
		t.Errorf("%s holds %d messages, want both, published directly", q, n)
	}
	if n := h.logs.FilterMessageSnippet("native delayed delivery is not available").Len(); n != 1 {
		t.Errorf("%d warnings, want 1 for the connection", n)
	}
	if delayedTopologyExists(a) {
		t.Error("DeclarePassive declared the delayed-delivery topology")
	}
}
