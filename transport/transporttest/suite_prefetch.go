package transporttest

import (
	"fmt"
	"testing"

	"github.com/celeriac/celeriac/transport"
)

func prefetchTests() []testCase {
	return []testCase{
		{"Bound", testPrefetchBound},
		{"RaiseAndLower", testPrefetchRaiseAndLower},
		{"Unlimited", testPrefetchUnlimited},
		{"AcrossQueues", testPrefetchAcrossQueues},
	}
}

// publishN declares q and publishes n messages "<prefix>-<i>" to it.
func (e *env) publishN(tr transport.Transport, q, prefix string, n int) {
	e.t.Helper()
	for i := range n {
		e.publish(tr, q, msg(fmt.Sprintf("%s-%02d", prefix, i)))
	}
}

func testPrefetchBound(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	e.declare(tr, transport.Queue{Name: q})
	e.publishN(tr, q, "m", 10)
	e.waitLen(tr, q, 10)
	c := e.consume(tr, 3, transport.Queue{Name: q})
	held := e.recvN(c, 3)
	e.none(c, "prefetch 3 and 3 unsettled")
	// Each settlement, of any kind, frees exactly one slot.
	e.ack(held[0])
	held = append(held[1:], e.recv(c))
	e.none(c, "prefetch 3 and 3 unsettled after one ack")
	if err := held[0].Reject(e.ctx, false); err != nil {
		t.Fatalf("Reject: %v", err)
	}
	held = append(held[1:], e.recv(c))
	e.none(c, "prefetch 3 and 3 unsettled after one reject")
	for _, d := range held {
		e.ack(d)
	}
	rest := e.recvN(c, 3)
	e.none(c, "prefetch 3 and 3 unsettled after acking all")
	for _, d := range rest {
		e.ack(d)
	}
	for _, d := range e.recvN(c, 2) {
		e.ack(d)
	}
	e.none(c, "all 10 messages consumed")
}

func testPrefetchRaiseAndLower(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	e.declare(tr, transport.Queue{Name: q})
	e.publishN(tr, q, "m", 8)
	e.waitLen(tr, q, 8)
	c := e.consume(tr, 2, transport.Queue{Name: q})
	held := e.recvN(c, 2)
	e.none(c, "prefetch 2 and 2 unsettled")

	// Celery raises the prefetch by one per held ETA task, without acking.
	if err := c.SetPrefetch(4); err != nil {
		t.Fatalf("SetPrefetch(4): %v", err)
	}
	held = append(held, e.recvN(c, 2)...)
	e.none(c, "prefetch raised to 4 and 4 unsettled")

	if err := c.SetPrefetch(1); err != nil {
		t.Fatalf("SetPrefetch(1): %v", err)
	}
	for i := range 3 {
		e.ack(held[i])
	}
	e.none(c, "prefetch lowered to 1 and 1 still unsettled")
	e.ack(held[3])
	d := e.recv(c)
	e.none(c, "prefetch 1 and 1 unsettled")
	e.ack(d)
	d = e.recv(c)
	e.none(c, "prefetch 1 and 1 unsettled")
	e.ack(d)

	// Zero lifts the bound.
	if err := c.SetPrefetch(0); err != nil {
		t.Fatalf("SetPrefetch(0): %v", err)
	}
	rest := e.recvN(c, 2)
	for _, d := range rest {
		e.ack(d)
	}
	e.none(c, "all 8 messages consumed")
}

func testPrefetchUnlimited(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	e.declare(tr, transport.Queue{Name: q})
	const n = 25
	e.publishN(tr, q, "m", n)
	c := e.consume(tr, 0, transport.Queue{Name: q})
	ds := e.recvN(c, n) // none acked: no bound
	seen := map[string]bool{}
	for _, d := range ds {
		id := msgID(d.Message)
		if seen[id] {
			t.Errorf("message %s delivered twice", id)
		}
		seen[id] = true
		e.ack(d)
	}
	e.none(c, "all messages consumed")
}

// testPrefetchAcrossQueues: the bound is per consumer, not per queue
// (Celery's one channel with global QoS on RabbitMQ), or with
// Features.PerQueuePrefetch per queue, a settled message being replaced
// from its own queue.
func testPrefetchAcrossQueues(t *testing.T, e *env) {
	tr := e.transport()
	q1, q2 := e.queue(), e.queue()
	e.declare(tr, transport.Queue{Name: q1}, transport.Queue{Name: q2})
	e.publishN(tr, q1, "a", 3)
	e.publishN(tr, q2, "b", 3)
	e.waitLen(tr, q1, 3)
	e.waitLen(tr, q2, 3)
	c := e.consume(tr, 2, transport.Queue{Name: q1}, transport.Queue{Name: q2})
	if e.f.PerQueuePrefetch {
		held := e.recvN(c, 4)
		e.none(c, "prefetch 2 per queue and 2 unsettled from each")
		from := map[string]int{}
		for _, d := range held {
			from[d.Queue]++
		}
		if from[q1] != 2 || from[q2] != 2 {
			t.Fatalf("held per queue %v, want 2 from each", from)
		}
		// Settling a q2 message makes room in q2 only.
		var next *transport.Delivery
		for i, d := range held {
			if d.Queue == q2 {
				e.ack(d)
				held = append(held[:i], held[i+1:]...)
				break
			}
		}
		if next = e.recv(c); next.Queue != q2 {
			t.Fatalf("after settling a %s message the next came from %s", q2, next.Queue)
		}
		e.none(c, "q2 full again")
		for _, d := range append(held, next) {
			e.ack(d)
		}
		for _, d := range e.recvN(c, 1) { // the last of q1
			e.ack(d)
		}
		e.none(c, "all 6 messages consumed")
		return
	}
	held := e.recvN(c, 2)
	e.none(c, "prefetch 2 over two queues and 2 unsettled")
	got := len(held)
	for got < 6 {
		e.ack(held[0])
		held = append(held[1:], e.recv(c))
		got++
	}
	for _, d := range held {
		e.ack(d)
	}
	e.none(c, "all 6 messages consumed")
}
