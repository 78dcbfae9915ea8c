package transporttest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
	"testing"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

func publishTests() []testCase {
	return []testCase{
		{"RoundTrip", testRoundTrip},
		{"NoAliasing", testNoAliasing},
		{"GoValues", testGoValues},
		{"Unencodable", testUnencodable},
		{"NonFiniteHeader", testNonFiniteHeader},
		{"FIFO", testFIFO},
		{"SeveralQueues", testSeveralQueues},
		{"DirectExchange", testDirectExchange},
		{"TopicExchange", testTopicExchange},
		{"LargeBody", testLargeBody},
		{"NoConfirm", testNoConfirm},
	}
}

// richMessage exercises every value type a header can carry on every broker,
// unicode, and a body with every byte value.
func richMessage(id string) protocol.Message {
	body := make([]byte, 256)
	for i := range body {
		body[i] = byte(i)
	}
	return protocol.Message{
		ContentType:     protocol.ContentTypeData,
		ContentEncoding: "binary",
		Headers: map[string]any{
			"lang":          "go",
			"task":          "transporttest.roundtrip",
			"id":            id,
			"retries":       int64(3),
			"negative":      int64(-42),
			"large":         int64(1) << 62,
			"max":           int64(math.MaxInt64),
			"min":           int64(math.MinInt64),
			"float":         1.5,
			"float_neg":     -0.25,
			"float_whole":   float64(2), // must stay a float, not become 2
			"true":          true,
			"false":         false,
			"null":          nil,
			"empty":         "",
			"unicode":       "héllo wörld ✓ 日本語 🎉",
			"ключ":          "значение",
			"timelimit":     []any{nil, nil},
			"list":          []any{int64(1), "two", 3.5, nil, true, []any{int64(4)}, map[string]any{"k": "v"}},
			"map":           map[string]any{"nested": map[string]any{"deep": []any{"x", int64(-1), false}}, "n": nil},
			"empty_list":    []any{},
			"empty_map":     map[string]any{},
			"x-custom":      int64(1),
			"argsrepr":      "(2, 3)",
			"ignore_result": false,
		},
		Properties: protocol.Properties{
			CorrelationID: id,
			ReplyTo:       "reply-" + id,
			DeliveryMode:  2,
			Expiration:    "3600000",
			Extra:         map[string]any{"origin": "gen1@transporttest"},
		},
		Body: body,
	}
}

func testRoundTrip(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	c := e.consume(tr, 1, transport.Queue{Name: q})
	want := richMessage("rt-1")
	e.publish(tr, q, want)
	d := e.recv(c)
	if diff := diffMessage(want, d.Message, nil, e.f.ExtraProperties); diff != "" {
		t.Errorf("delivered message differs from the published one:\n%s", diff)
	}
	if d.Queue != q {
		t.Errorf("Delivery.Queue = %q, want %q", d.Queue, q)
	}
	if d.Exchange != "" || d.RoutingKey != q {
		t.Errorf("Delivery.Exchange, RoutingKey = %q, %q; want %q, %q (default exchange)", d.Exchange, d.RoutingKey, "", q)
	}
	if d.Redelivered {
		t.Error("Delivery.Redelivered is true on the first delivery")
	}
	if d.Tag == "" {
		t.Error("Delivery.Tag is empty")
	}
	if d.ReceivedAt.IsZero() {
		t.Error("Delivery.ReceivedAt is zero")
	}
	if d.Acknowledger == nil {
		t.Fatal("Delivery.Acknowledger is nil for a task queue delivery")
	}
	e.ack(d)
	e.waitLen(tr, q, 0)
}

// testNoAliasing: the publisher's message, the delivered message and the
// broker's copy are independent, which an in-process transport must take
// care of and a networked one gets for free.
func testNoAliasing(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	c := e.consume(tr, 1, transport.Queue{Name: q})
	want := richMessage("alias-1")
	pub := richMessage("alias-1")
	e.publish(tr, q, pub)
	// Scribble over everything the publisher still holds.
	pub.Headers["id"] = "scribbled"
	pub.Headers["list"].([]any)[0] = "scribbled"
	pub.Headers["map"].(map[string]any)["nested"] = "scribbled"
	pub.Body[0] = 0xff
	pub.Properties.Extra["origin"] = "scribbled"

	d := e.recv(c)
	if diff := diffMessage(want, d.Message, nil, e.f.ExtraProperties); diff != "" {
		t.Fatalf("publisher's changes after Publish reached the delivery:\n%s", diff)
	}
	// Scribble over the delivery, then get the message again.
	d.Message.Headers["id"] = "scribbled"
	d.Message.Headers["list"].([]any)[1] = "scribbled"
	d.Message.Headers["map"].(map[string]any)["n"] = "scribbled"
	d.Message.Body[1] = 0xff
	if err := d.Reject(e.ctx, true); err != nil {
		t.Fatalf("Reject(requeue): %v", err)
	}
	d2 := e.recv(c)
	if diff := diffMessage(want, d2.Message, redeliveryKey, e.f.ExtraProperties); diff != "" {
		t.Fatalf("consumer's changes to a delivery reached the redelivered message:\n%s", diff)
	}
	e.ack(d2)
}

// testGoValues: header values of plain Go types (the narrower integers,
// float32, []string, map[string]string) arrive as the protocol's value
// types, the same on every broker. A float32 arrives as the float64 with
// its shortest digits, 0.1 and not 0.10000000149011612: that is what the
// Redis envelope's JSON carries, what the AMQP adapter writes, and what a
// Python consumer reads from either.
func testGoValues(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	c := e.consume(tr, 1, transport.Queue{Name: q})
	m := msg("go-values")
	give := map[string]any{
		"int":        5,
		"int8":       int8(-3),
		"int32":      int32(-70000),
		"uint16":     uint16(60000),
		"uint32":     uint32(4000000000),
		"big_small":  big.NewInt(42),
		"f32":        float32(0.1),
		"f32_whole":  float32(2), // must stay a float, not become 2
		"f32_list":   []any{float32(0.25), float32(0.1)},
		"f32_map":    map[string]any{"f": float32(0.1)},
		"strings":    []string{"a", "b"},
		"string_map": map[string]string{"k": "v"},
	}
	want := map[string]any{
		"int":        int64(5),
		"int8":       int64(-3),
		"int32":      int64(-70000),
		"uint16":     int64(60000),
		"uint32":     int64(4000000000),
		"big_small":  int64(42),
		"f32":        0.1,
		"f32_whole":  2.0,
		"f32_list":   []any{0.25, 0.1},
		"f32_map":    map[string]any{"f": 0.1},
		"strings":    []any{"a", "b"},
		"string_map": map[string]any{"k": "v"},
	}
	for k, v := range give {
		m.Headers[k] = v
	}
	e.publish(tr, q, m)
	d := e.recv(c)
	for _, line := range diffMap("header ", want, d.Message.Headers, func(k string) bool { _, ok := want[k]; return !ok }) {
		t.Error(line)
	}
	e.ack(d)
}

// testUnencodable: a header value no broker can carry (a channel, a func, a
// complex number) makes Publish fail, and nothing is enqueued.
func testUnencodable(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	c := e.consume(tr, 1, transport.Queue{Name: q})
	for _, v := range []any{make(chan int), func() {}, complex(1, 2), []any{"ok", make(chan int)}} {
		m := msg(fmt.Sprintf("unencodable-%T", v))
		m.Headers["bad"] = v
		if err := tr.Publish(e.ctx, &transport.Publishing{RoutingKey: q, Message: m}); !errors.Is(err, protocol.ErrUnencodable) {
			t.Errorf("Publish with a %T header: %v, want an error wrapping protocol.ErrUnencodable", v, err)
		}
	}
	// The queue is FIFO: had a refused message been enqueued, it would come
	// first.
	e.publish(tr, q, msg("after"))
	d := e.recv(c)
	if got := msgID(d.Message); got != "after" {
		t.Errorf("first delivery is %s, want the message published after the refused ones", got)
	}
	e.ack(d)
	e.waitLen(tr, q, 0)
}

// testNonFiniteHeader: a header that is or holds a NaN or an infinity makes
// Publish fail at once with an error wrapping protocol.ErrUnencodable, and
// nothing is enqueued. RabbitMQ cannot parse such a float in a header table
// (it closes the connection); the Redis envelope could carry it, but a
// message must not work on one broker and fail on another. Each Publish is
// bounded by Features.Timeout, so that a transport that hangs on one fails
// the test instead of stalling the run.
func testNonFiniteHeader(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	c := e.consume(tr, 1, transport.Queue{Name: q})
	tests := []struct {
		name string
		v    any
	}{
		{"NaN", math.NaN()},
		{"float32-NaN", float32(math.NaN())},
		{"+Inf", math.Inf(1)},
		{"-Inf", math.Inf(-1)},
		{"float32-Inf", float32(math.Inf(-1))},
		{"in-a-list", []any{"ok", 1.5, math.NaN()}},
		{"in-a-map", map[string]any{"ok": 1.5, "f": math.Inf(1)}},
		{"typed-slice", []float64{0.5, math.NaN()}},
	}
	for _, tt := range tests {
		m := msg("non-finite-" + tt.name)
		m.Headers["bad"] = tt.v
		ctx, cancel := context.WithTimeout(e.ctx, e.f.Timeout)
		err := tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: m})
		cancel()
		if !errors.Is(err, protocol.ErrUnencodable) {
			t.Errorf("Publish, header %s: %v, want an error wrapping protocol.ErrUnencodable", tt.name, err)
		}
	}
	// Finite floats, NaN's neighbours, still go through.
	ok := msg("finite")
	ok.Headers["max"], ok.Headers["tiny"] = math.MaxFloat64, math.SmallestNonzeroFloat64
	e.publish(tr, q, ok)
	d := e.recv(c)
	if got := msgID(d.Message); got != "finite" {
		t.Errorf("first delivery is %s, want the message with finite floats, published after the refused ones", got)
	}
	if got := d.Message.Headers["max"]; got != math.MaxFloat64 {
		t.Errorf("header max = %v, want %v", got, math.MaxFloat64)
	}
	e.ack(d)
	e.waitLen(tr, q, 0)
}

func testFIFO(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	e.declare(tr, transport.Queue{Name: q})
	const n = 20
	var want []string
	for i := range n {
		id := fmt.Sprintf("fifo-%02d", i)
		want = append(want, id)
		e.publish(tr, q, msg(id))
	}
	e.waitLen(tr, q, n)
	c := e.consume(tr, 1, transport.Queue{Name: q})
	var got []string
	for range n {
		d := e.recv(c)
		got = append(got, msgID(d.Message))
		e.ack(d)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("delivery order:\n got %v\nwant %v", got, want)
	}
}

func testSeveralQueues(t *testing.T, e *env) {
	tr := e.transport()
	qs := []transport.Queue{{Name: e.queue()}, {Name: e.queue()}, {Name: e.queue()}}
	c := e.consume(tr, 0, qs...)
	if got := queueNames(c.Queues()); fmt.Sprint(got) != fmt.Sprint(queueNames(qs)) {
		t.Errorf("Queues() = %v, want %v", got, queueNames(qs))
	}
	for i, q := range qs {
		e.publish(tr, q.Name, msg(fmt.Sprintf("q%d", i)))
	}
	seen := map[string]string{}
	for range qs {
		d := e.recv(c)
		seen[msgID(d.Message)] = d.Queue
		e.ack(d)
	}
	for i, q := range qs {
		id := fmt.Sprintf("q%d", i)
		if seen[id] != q.Name {
			t.Errorf("message %s: delivered from %q, want %q (all: %v)", id, seen[id], q.Name, seen)
		}
	}
	e.none(c, "three messages were published and three delivered")
}

// testDirectExchange: Celery's named direct exchange, and a queue bound to
// an exchange of another name with another routing key.
func testDirectExchange(t *testing.T, e *env) {
	tr := e.transport()
	q1 := e.queue() // exchange and routing key default to the queue name
	q2 := e.queue()
	x := e.exchange()
	c := e.consume(tr, 0, transport.Queue{Name: q1}, transport.Queue{Name: q2, Exchange: x, ExchangeType: transport.Direct, RoutingKey: "jobs"})

	e.publishTo(tr, &transport.Publishing{Exchange: q1, ExchangeType: transport.Direct, RoutingKey: q1, Message: msg("to-q1")})
	d := e.recv(c)
	if msgID(d.Message) != "to-q1" || d.Queue != q1 || d.Exchange != q1 || d.RoutingKey != q1 {
		t.Errorf("got %s from queue %q via %q/%q; want to-q1 from %q via %q/%q", msgID(d.Message), d.Queue, d.Exchange, d.RoutingKey, q1, q1, q1)
	}
	e.ack(d)

	e.publishTo(tr, &transport.Publishing{Exchange: x, ExchangeType: transport.Direct, RoutingKey: "other", Message: msg("unroutable")})
	e.publishTo(tr, &transport.Publishing{Exchange: x, ExchangeType: transport.Direct, RoutingKey: "jobs", Message: msg("to-q2")})
	d = e.recv(c)
	if msgID(d.Message) != "to-q2" || d.Queue != q2 || d.Exchange != x || d.RoutingKey != "jobs" {
		t.Errorf("got %s from queue %q via %q/%q; want to-q2 from %q via %q/%q", msgID(d.Message), d.Queue, d.Exchange, d.RoutingKey, q2, x, "jobs")
	}
	e.ack(d)
	e.none(c, "a message whose routing key matches no binding must go nowhere")
}

// testTopicExchange: a task queue bound to a topic exchange. Only patterns
// on which AMQP and kombu's regex translation agree are used.
func testTopicExchange(t *testing.T, e *env) {
	tr := e.transport()
	x := e.exchange()
	q1, q2 := e.queue(), e.queue()
	c := e.consume(tr, 0,
		transport.Queue{Name: q1, Exchange: x, ExchangeType: transport.Topic, RoutingKey: "jobs.*.high"},
		transport.Queue{Name: q2, Exchange: x, ExchangeType: transport.Topic, RoutingKey: "jobs.#"})
	pub := func(key string) {
		e.publishTo(tr, &transport.Publishing{Exchange: x, ExchangeType: transport.Topic, RoutingKey: key, Message: msg(key)})
	}
	pub("jobs.a.high") // both
	pub("jobs.a.low")  // q2
	pub("other.a.high")
	got := map[string][]string{}
	for range 3 {
		d := e.recv(c)
		got[d.Queue] = append(got[d.Queue], msgID(d.Message))
		e.ack(d)
	}
	e.none(c, "other.a.high matches no binding")
	if fmt.Sprint(got[q1]) != "[jobs.a.high]" {
		t.Errorf("queue bound with jobs.*.high got %v, want [jobs.a.high]", got[q1])
	}
	if len(got[q2]) != 2 {
		t.Errorf("queue bound with jobs.# got %v, want jobs.a.high and jobs.a.low", got[q2])
	}
}

// testLargeBody: a body of several AMQP frames (RabbitMQ's default frame is
// 128 KiB) and a long header survive.
func testLargeBody(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	c := e.consume(tr, 1, transport.Queue{Name: q})
	want := msg("large-1")
	want.ContentType = protocol.ContentTypeData
	want.ContentEncoding = "binary"
	want.Body = make([]byte, 1<<20+7)
	x := uint32(2463534242) // xorshift: incompressible, reproducible
	for i := range want.Body {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		want.Body[i] = byte(x)
	}
	want.Headers["argsrepr"] = strings.Repeat("é", 10000)
	e.publish(tr, q, want)
	d := e.recv(c)
	if diff := diffMessage(want, d.Message, nil, false); diff != "" {
		t.Errorf("large message differs:\n%s", diff)
	}
	e.ack(d)
}

// testNoConfirm: messages published without waiting for the broker's
// confirmation arrive all the same.
func testNoConfirm(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	c := e.consume(tr, 0, transport.Queue{Name: q})
	const n = 10
	for i := range n {
		e.publishTo(tr, &transport.Publishing{RoutingKey: q, Message: msg(fmt.Sprintf("nc-%02d", i)), NoConfirm: true})
	}
	seen := map[string]bool{}
	for _, d := range e.recvN(c, n) {
		seen[msgID(d.Message)] = true
		e.ack(d)
	}
	if len(seen) != n {
		t.Errorf("%d distinct messages of %d: %v", len(seen), n, seen)
	}
}
