package transporttest

import (
	"context"
	"errors"
	"testing"

	"github.com/celeriac/celeriac/transport"
)

func settleTests() []testCase {
	return []testCase{
		{"AckRemoves", testAckRemoves},
		{"AckAsync", testAckAsync},
		{"RejectRequeue", testRejectRequeue},
		{"RejectRequeueAtHead", testRejectRequeueAtHead},
		{"RejectDrops", testRejectDrops},
		{"SettleTwice", testSettleTwice},
		{"SharedQueue", testSharedQueue},
	}
}

func testAckRemoves(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	c := e.consume(tr, 1, transport.Queue{Name: q})
	e.publish(tr, q, msg("ack-1"))
	e.ack(e.recv(c))
	e.none(c, "the only message was acked")
	e.waitLen(tr, q, 0)

	// Nor does another connection get it once this one is gone.
	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	tr2 := e.transport()
	c2 := e.consume(tr2, 1, transport.Queue{Name: q})
	e.none(c2, "an acked message must not come back after Close")
}

// testAckAsync: an ack started with AckAsync settles the delivery at once
// and, once waited for, has removed the message like Ack.
func testAckAsync(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	c := e.consume(tr, 2, transport.Queue{Name: q})
	e.publishN(tr, q, "async", 2)
	ds := e.recvN(c, 2)
	waits := make([]func(context.Context) error, len(ds))
	for i, d := range ds {
		w, err := d.AckAsync(e.ctx)
		if err != nil {
			t.Fatalf("AckAsync: %v", err)
		}
		waits[i] = w
		if err := d.Ack(e.ctx); !errors.Is(err, transport.ErrAlreadyAcknowledged) {
			t.Errorf("Ack after AckAsync: %v, want ErrAlreadyAcknowledged", err)
		}
		if _, err := d.AckAsync(e.ctx); !errors.Is(err, transport.ErrAlreadyAcknowledged) {
			t.Errorf("second AckAsync: %v, want ErrAlreadyAcknowledged", err)
		}
	}
	for _, w := range waits {
		if err := w(e.ctx); err != nil {
			t.Errorf("waiting for the ack: %v", err)
		}
	}
	e.none(c, "both messages were acked")
	e.waitLen(tr, q, 0)
	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	tr2 := e.transport()
	c2 := e.consume(tr2, 2, transport.Queue{Name: q})
	e.none(c2, "an acked message must not come back after Close")
}

func testRejectRequeue(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	c := e.consume(tr, 1, transport.Queue{Name: q})
	want := richMessage("requeue-1")
	e.publish(tr, q, want)
	d := e.recv(c)
	if err := d.Reject(e.ctx, true); err != nil {
		t.Fatalf("Reject(requeue): %v", err)
	}
	d2 := e.recv(c)
	if diff := diffMessage(want, d2.Message, redeliveryKey, e.f.ExtraProperties); diff != "" {
		t.Errorf("requeued message differs:\n%s", diff)
	}
	if !e.f.NoRedelivered && !d2.Redelivered {
		t.Error("Redelivered is false for a message delivered before")
	}
	if d2.Queue != q {
		t.Errorf("Queue = %q, want %q", d2.Queue, q)
	}
	e.ack(d2)
	e.none(c, "the message was acked after its redelivery")
}

func testRejectRequeueAtHead(t *testing.T, e *env) {
	if !e.f.RequeueAtHead {
		t.Skip("Features.RequeueAtHead is false")
	}
	tr := e.transport()
	q := e.queue()
	e.declare(tr, transport.Queue{Name: q})
	e.publishN(tr, q, "m", 3)
	e.waitLen(tr, q, 3)
	c := e.consume(tr, 1, transport.Queue{Name: q})
	d := e.recv(c)
	if id := msgID(d.Message); id != "m-00" {
		t.Fatalf("first delivery %s, want m-00", id)
	}
	if err := d.Reject(e.ctx, true); err != nil {
		t.Fatalf("Reject(requeue): %v", err)
	}
	var got []string
	for range 3 {
		d := e.recv(c)
		got = append(got, msgID(d.Message))
		e.ack(d)
	}
	if got[0] != "m-00" {
		t.Errorf("after requeueing m-00 the order is %v; want m-00 first", got)
	}
}

func testRejectDrops(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	c := e.consume(tr, 1, transport.Queue{Name: q})
	e.publish(tr, q, msg("drop-1"))
	e.publish(tr, q, msg("keep-2"))
	d := e.recv(c)
	if err := d.Reject(e.ctx, false); err != nil {
		t.Fatalf("Reject(no requeue): %v", err)
	}
	d2 := e.recv(c)
	if msgID(d2.Message) != "keep-2" {
		t.Fatalf("after rejecting %s got %s, want keep-2", msgID(d.Message), msgID(d2.Message))
	}
	e.ack(d2)
	e.none(c, "a message rejected without requeue must not come back")
	e.waitLen(tr, q, 0)
	if ds, ok := tr.(transport.DeadLetterStore); ok {
		dead, err := ds.DeadLetters(e.ctx, q, 0)
		if err != nil {
			t.Fatalf("DeadLetters: %v", err)
		}
		if len(dead) != 0 {
			t.Errorf("a reject without requeue on a queue without dead-letter arguments kept %d dead letters", len(dead))
		}
	}
}

func testSettleTwice(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	c := e.consume(tr, 0, transport.Queue{Name: q})
	e.publishN(tr, q, "m", 3)
	ds := e.recvN(c, 3)
	if err := ds[0].Ack(e.ctx); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if err := ds[1].Reject(e.ctx, false); err != nil {
		t.Fatalf("Reject: %v", err)
	}
	if err := ds[2].DeadLetter(e.ctx, transport.DeadLetterReason{Reason: "permanent"}); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	for _, d := range ds {
		id := msgID(d.Message)
		if err := d.Ack(e.ctx); !errors.Is(err, transport.ErrAlreadyAcknowledged) {
			t.Errorf("%s: second settlement Ack: %v, want ErrAlreadyAcknowledged", id, err)
		}
		if err := d.Reject(e.ctx, true); !errors.Is(err, transport.ErrAlreadyAcknowledged) {
			t.Errorf("%s: second settlement Reject(requeue): %v, want ErrAlreadyAcknowledged", id, err)
		}
		if err := d.DeadLetter(e.ctx, transport.DeadLetterReason{Reason: "permanent"}); !errors.Is(err, transport.ErrAlreadyAcknowledged) {
			t.Errorf("%s: second settlement DeadLetter: %v, want ErrAlreadyAcknowledged", id, err)
		}
	}
	e.none(c, "no settlement after the first may requeue anything")
}

// testSharedQueue: two consumers of one queue share its messages, and each
// has its own prefetch bound.
func testSharedQueue(t *testing.T, e *env) {
	tr1, tr2 := e.transport(), e.transport()
	q := e.queue()
	e.declare(tr1, transport.Queue{Name: q})
	e.publishN(tr1, q, "m", 4)
	e.waitLen(tr1, q, 4)
	c1 := e.consume(tr1, 1, transport.Queue{Name: q})
	d1 := e.recv(c1)
	c2 := e.consume(tr2, 1, transport.Queue{Name: q})
	d2 := e.recv(c2)
	if msgID(d1.Message) == msgID(d2.Message) {
		t.Fatalf("both consumers got %s", msgID(d1.Message))
	}
	e.none(c1, "consumer 1 has prefetch 1 and 1 unsettled")
	e.ack(d1)
	e.ack(d2)
	// Receive from both before acking, so neither can take both.
	d3, d4 := e.recv(c1), e.recv(c2)
	seen := map[string]bool{}
	for _, d := range []*transport.Delivery{d1, d2, d3, d4} {
		seen[msgID(d.Message)] = true
	}
	e.ack(d3)
	e.ack(d4)
	if len(seen) != 4 {
		t.Errorf("messages seen: %v, want 4 distinct", seen)
	}
}
