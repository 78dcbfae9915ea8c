package transporttest

import (
	"errors"
	"fmt"
	"sort"
	"testing"

	"github.com/celeriac/celeriac/transport"
)

func lifecycleTests() []testCase {
	return []testCase{
		{"StopClosesDeliveries", testStopClosesDeliveries},
		{"SettleAfterStop", testSettleAfterStop},
		{"CloseReturnsUnsettled", testCloseReturnsUnsettled},
		{"AfterClose", testAfterClose},
	}
}

// stop stops c and waits for Deliveries to close; it returns whatever was
// still delivered on the way.
func (e *env) stop(c transport.Consumer) []*transport.Delivery {
	e.t.Helper()
	if err := c.Stop(e.ctx); err != nil {
		e.t.Fatalf("Stop: %v", err)
	}
	ds, closed := drainFor(c.Deliveries(), e.f.Timeout)
	if !closed {
		e.t.Fatalf("Deliveries not closed within %v after Stop", e.f.Timeout)
	}
	return ds
}

func testStopClosesDeliveries(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	e.declare(tr, transport.Queue{Name: q})
	e.publishN(tr, q, "m", 3)
	e.waitLen(tr, q, 3)
	c := e.consume(tr, 1, transport.Queue{Name: q})
	d := e.recv(c)
	if extra := e.stop(c); len(extra) > 0 {
		t.Errorf("prefetch 1 with 1 unsettled, yet %d more were delivered while stopping", len(extra))
	}
	if err := c.Err(); err != nil {
		t.Errorf("Err() after Stop = %v, want nil", err)
	}
	if err := c.Stop(e.ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	// The delivery handed out before Stop is still good.
	e.ack(d)
	// The two never delivered are still in the queue, for the next consumer.
	c2 := e.consume(tr, 0, transport.Queue{Name: q})
	got := ids(e.recvN(c2, 2))
	sort.Strings(got)
	if fmt.Sprint(got) != "[m-01 m-02]" {
		t.Errorf("a new consumer got %v, want [m-01 m-02]", got)
	}
	e.none(c2, "m-00 was acked after Stop")
}

func testSettleAfterStop(t *testing.T, e *env) {
	tr := e.transport()
	q := e.deadQueue()
	e.declare(tr, q)
	e.publishN(tr, q.Name, "m", 3)
	e.waitLen(tr, q.Name, 3)
	c := e.consume(tr, 3, q)
	ds := e.recvN(c, 3)
	e.stop(c)
	if err := ds[0].Ack(e.ctx); err != nil {
		t.Errorf("Ack after Stop: %v", err)
	}
	if err := ds[1].Reject(e.ctx, true); err != nil {
		t.Errorf("Reject(requeue) after Stop: %v", err)
	}
	if err := ds[2].DeadLetter(e.ctx, transport.DeadLetterReason{Reason: "permanent"}); err != nil {
		t.Errorf("DeadLetter after Stop: %v", err)
	}
	c2 := e.consume(tr, 0, transport.Queue{Name: q.Name, Arguments: q.Arguments})
	d := e.recv(c2)
	if msgID(d.Message) != msgID(ds[1].Message) {
		t.Errorf("after Stop, acking %s, requeueing %s and dead-lettering %s, a new consumer got %s",
			msgID(ds[0].Message), msgID(ds[1].Message), msgID(ds[2].Message), msgID(d.Message))
	}
	if !e.f.NoRedelivered && !d.Redelivered {
		t.Error("requeued message not marked Redelivered")
	}
	e.ack(d)
	e.none(c2, "only one message was requeued")
}

func testCloseReturnsUnsettled(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	e.declare(tr, transport.Queue{Name: q})
	e.publishN(tr, q, "m", 4)
	e.waitLen(tr, q, 4)
	c := e.consume(tr, 3, transport.Queue{Name: q})
	ds := e.recvN(c, 3)
	e.ack(ds[0])
	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, closed := drainFor(c.Deliveries(), e.f.Timeout); !closed {
		t.Fatalf("Deliveries not closed within %v after Close", e.f.Timeout)
	}
	if err := ds[1].Ack(e.ctx); err == nil {
		t.Error("Ack after Close succeeded; the message was returned to the broker")
	} else if !isClosedErr(err) {
		t.Errorf("Ack after Close: %v, want an error matching ErrClosed or ErrStaleDelivery", err)
	}

	tr2 := e.transport()
	c2 := e.consume(tr2, 0, transport.Queue{Name: q})
	got := e.recvN(c2, 3)
	byID := map[string]*transport.Delivery{}
	for _, d := range got {
		byID[msgID(d.Message)] = d
	}
	for _, d := range ds[1:] {
		id := msgID(d.Message)
		d2, ok := byID[id]
		if !ok {
			t.Errorf("unsettled %s not delivered on a new connection (got %v)", id, ids(got))
			continue
		}
		if !e.f.NoRedelivered && !d2.Redelivered {
			t.Errorf("%s, unsettled when its transport closed, is not marked Redelivered", id)
		}
	}
	if _, ok := byID[msgID(ds[0].Message)]; ok {
		t.Errorf("%s was acked before Close, yet delivered again", msgID(ds[0].Message))
	}
	for _, d := range got {
		e.ack(d)
	}
	e.none(c2, "every message was consumed")
}

func testAfterClose(t *testing.T, e *env) {
	tr := e.transport()
	q := e.queue()
	e.declare(tr, transport.Queue{Name: q})
	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := tr.Close(); err != nil && !errors.Is(err, transport.ErrClosed) {
		t.Errorf("second Close: %v, want nil or ErrClosed", err)
	}
	if err := tr.Publish(e.ctx, &transport.Publishing{RoutingKey: q, Message: msg("late")}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Publish after Close: %v, want ErrClosed", err)
	}
	if _, err := tr.Consume(e.ctx, []transport.Queue{{Name: q}}, transport.ConsumeOptions{}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Consume after Close: %v, want ErrClosed", err)
	}
	if _, err := tr.Subscribe(e.ctx, transport.Broadcast{Exchange: e.exchange()}); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Subscribe after Close: %v, want ErrClosed", err)
	}
	if a, ok := tr.(transport.Admin); ok {
		if _, err := a.Len(e.ctx, q); !errors.Is(err, transport.ErrClosed) {
			t.Errorf("Len after Close: %v, want ErrClosed", err)
		}
	}
}
