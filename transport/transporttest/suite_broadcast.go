package transporttest

import (
	"fmt"
	"slices"
	"sort"
	"testing"

	"github.com/celeriac/celeriac/transport"
)

func broadcastTests() []testCase {
	return []testCase{
		{"Fanout", testFanout},
		{"TopicPrefix", testTopicPrefix},
		{"TopicWildcards", testTopicWildcards},
	}
}

// subscribe subscribes and closes the subscription at the end of the test.
func (e *env) subscribe(tr transport.Transport, b transport.Broadcast) transport.Subscription {
	e.t.Helper()
	s, err := tr.Subscribe(e.ctx, b)
	if err != nil {
		e.t.Fatalf("Subscribe(%+v): %v", b, err)
	}
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

func (e *env) recvSub(s transport.Subscription) *transport.Delivery {
	e.t.Helper()
	return e.recvFrom(s.Deliveries(), nil)
}

func testFanout(t *testing.T, e *env) {
	tr1, tr2 := e.transport(), e.transport()
	x := e.exchange()
	subs := []transport.Subscription{
		e.subscribe(tr1, transport.Broadcast{Exchange: x, ExchangeType: transport.Fanout}),
		e.subscribe(tr1, transport.Broadcast{Exchange: x, ExchangeType: transport.Fanout}),
		e.subscribe(tr2, transport.Broadcast{Exchange: x, ExchangeType: transport.Fanout}),
	}
	want := richMessage("bc-1")
	e.publishTo(tr2, &transport.Publishing{Exchange: x, ExchangeType: transport.Fanout, Message: want, NoConfirm: true})
	e.publishTo(tr1, &transport.Publishing{Exchange: x, ExchangeType: transport.Fanout, Message: msg("bc-2"), NoConfirm: true})
	for i, s := range subs {
		d := e.recvSub(s)
		if diff := diffMessage(want, d.Message, nil, e.f.ExtraProperties); diff != "" {
			t.Errorf("subscription %d: broadcast message differs:\n%s", i, diff)
		}
		if d.Exchange != x {
			t.Errorf("subscription %d: Delivery.Exchange = %q, want %q", i, d.Exchange, x)
		}
		if d2 := e.recvSub(s); msgID(d2.Message) != "bc-2" {
			t.Errorf("subscription %d: second broadcast is %s, want bc-2", i, msgID(d2.Message))
		}
	}
	for i, s := range subs {
		e.noneFrom(s.Deliveries(), fmt.Sprintf("subscription %d got both broadcasts", i))
	}
	if err := subs[0].Close(); err != nil {
		t.Fatalf("Subscription.Close: %v", err)
	}
	if _, closed := drainFor(subs[0].Deliveries(), e.f.Timeout); !closed {
		t.Fatalf("Deliveries not closed within %v after Subscription.Close", e.f.Timeout)
	}
	if err := subs[0].Close(); err != nil {
		t.Errorf("second Subscription.Close: %v", err)
	}
	// The others still receive; publishing to no one more is fine.
	e.publishTo(tr1, &transport.Publishing{Exchange: x, ExchangeType: transport.Fanout, Message: msg("bc-3"), NoConfirm: true})
	for i, s := range subs[1:] {
		if d := e.recvSub(s); msgID(d.Message) != "bc-3" {
			t.Errorf("subscription %d: got %s, want bc-3", i+1, msgID(d.Message))
		}
	}
}

// topicRun subscribes one subscription per binding key, publishes one
// message per routing key, and checks who got what.
func (e *env) topicRun(bindings []string, keys []string, want map[string][]string) {
	e.t.Helper()
	tr := e.transport()
	x := e.exchange()
	subs := make([]transport.Subscription, len(bindings))
	for i, b := range bindings {
		subs[i] = e.subscribe(tr, transport.Broadcast{Exchange: x, ExchangeType: transport.Topic, BindingKey: b})
	}
	for _, k := range keys {
		e.publishTo(tr, &transport.Publishing{Exchange: x, ExchangeType: transport.Topic, RoutingKey: k, Message: msg(k), NoConfirm: true})
	}
	for i, b := range bindings {
		var got []string
		for range want[b] {
			d := e.recvSub(subs[i])
			got = append(got, msgID(d.Message))
			if d.RoutingKey != msgID(d.Message) {
				e.t.Errorf("binding %q: Delivery.RoutingKey = %q, want %q", b, d.RoutingKey, msgID(d.Message))
			}
		}
		e.noneFrom(subs[i].Deliveries(), fmt.Sprintf("binding %q got %v", b, got))
		sort.Strings(got)
		w := slices.Clone(want[b])
		sort.Strings(w)
		if !slices.Equal(got, w) {
			e.t.Errorf("binding %q received %v, want %v", b, got, w)
		}
	}
}

func testTopicPrefix(t *testing.T, e *env) {
	if e.f.Topics < TopicPrefix {
		t.Skip("Features.Topics is TopicNone")
	}
	e.topicRun(
		[]string{"worker.#", "task.#"},
		[]string{"worker.online", "task.sent", "worker.heartbeat", "other.thing", "workers.x"},
		map[string][]string{
			"worker.#": {"worker.online", "worker.heartbeat"},
			"task.#":   {"task.sent"},
		})
}

func testTopicWildcards(t *testing.T, e *env) {
	if e.f.Topics < TopicAMQP {
		t.Skip("Features.Topics is not TopicAMQP")
	}
	e.topicRun(
		[]string{"*.online", "a.*.c", "a.#.c", "#", "a.b.c"},
		[]string{"worker.online", "a.b.c", "a.c", "a.x.y.c", "x.worker.online", "a.b.c.d"},
		map[string][]string{
			"*.online": {"worker.online"},
			"a.*.c":    {"a.b.c"},
			"a.#.c":    {"a.b.c", "a.c", "a.x.y.c"},
			"#":        {"worker.online", "a.b.c", "a.c", "a.x.y.c", "x.worker.online", "a.b.c.d"},
			"a.b.c":    {"a.b.c"},
		})
}
