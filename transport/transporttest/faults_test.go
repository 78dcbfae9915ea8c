package transporttest_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/transport/transporttest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestFaultyConformance: with no fault set, the wrapper is transparent.
func TestFaultyConformance(t *testing.T) {
	b := memory.NewBroker()
	transporttest.Run(t, func(testing.TB) transport.Transport {
		return transporttest.NewFaulty(memory.New(memory.Config{Broker: b}))
	}, transporttest.Features{
		Priority:          transporttest.PriorityHigherFirst,
		RequeueAtHead:     true,
		ExtraProperties:   true,
		RejectDeadLetters: true,
		DeadLetterReason:  true,
		DeadLetterQueueArguments: func(string) map[string]any {
			return map[string]any{memory.ArgDeadLetterExchange: "dlx"}
		},
		Topics: transporttest.TopicAMQP,
		Quiet:  50 * time.Millisecond,
	})
}

func newFaulty(t *testing.T) (*transporttest.Faulty, transport.Consumer) {
	t.Helper()
	ft := transporttest.NewFaulty(memory.New(memory.Config{}))
	t.Cleanup(func() { _ = ft.Close() })
	c, err := ft.Consume(t.Context(), []transport.Queue{{Name: "q"}}, transport.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	return ft, c
}

func pub(id string) *transport.Publishing {
	return &transport.Publishing{RoutingKey: "q", Message: protocol.Message{Headers: map[string]any{"id": id}}}
}

func recv(t *testing.T, ch <-chan *transport.Delivery) *transport.Delivery {
	t.Helper()
	select {
	case d, ok := <-ch:
		if !ok {
			t.Fatal("Deliveries closed")
		}
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	return nil
}

func TestFaultyFailNextPublish(t *testing.T) {
	ft, c := newFaulty(t)
	boom := errors.New("nack")
	ft.FailNext(transporttest.OpPublish, 2, boom)
	for i := range 2 {
		if err := ft.Publish(t.Context(), pub("x")); !errors.Is(err, boom) {
			t.Fatalf("publish %d: %v, want the injected error", i, err)
		}
	}
	if n, _ := ft.Len(t.Context(), "q"); n != 0 {
		t.Fatalf("failed publishes published %d messages", n)
	}
	if err := ft.Publish(t.Context(), pub("ok")); err != nil {
		t.Fatalf("third publish: %v", err)
	}
	if d := recv(t, c.Deliveries()); d.Message.Headers["id"] != "ok" {
		t.Errorf("got %v", d.Message.Headers["id"])
	}
	if got := ft.Calls(transporttest.OpPublish); got != 3 {
		t.Errorf("Calls(publish) = %d, want 3", got)
	}
}

func TestFaultyAckFaultLeavesUnsettled(t *testing.T) {
	ft, c := newFaulty(t)
	if err := ft.Publish(t.Context(), pub("a")); err != nil {
		t.Fatal(err)
	}
	d := recv(t, c.Deliveries())
	var seen []transporttest.Op
	ft.SetFault(transporttest.OpAck, func(call transporttest.Call) error {
		seen = append(seen, call.Op)
		if call.Delivery != d {
			t.Errorf("fault function got delivery %p, want %p", call.Delivery, d)
		}
		return transport.ErrStaleDelivery
	})
	if err := d.Ack(t.Context()); !errors.Is(err, transport.ErrStaleDelivery) {
		t.Fatalf("Ack: %v, want the injected ErrStaleDelivery", err)
	}
	ft.SetFault(transporttest.OpAck, nil)
	// The failed ack did not settle: settling again works, once.
	if err := d.Reject(t.Context(), true); err != nil {
		t.Fatalf("Reject after a failed Ack: %v", err)
	}
	d2 := recv(t, c.Deliveries())
	if !d2.Redelivered {
		t.Error("requeued message not marked redelivered")
	}
	if err := d2.Ack(t.Context()); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if err := d2.Ack(t.Context()); !errors.Is(err, transport.ErrAlreadyAcknowledged) {
		t.Fatalf("second Ack: %v", err)
	}
	if len(seen) != 1 {
		t.Errorf("fault function called %d times, want 1", len(seen))
	}
}

func TestFaultyFailNextDeadLetterAndReject(t *testing.T) {
	ft, c := newFaulty(t)
	for _, id := range []string{"a", "b"} {
		if err := ft.Publish(t.Context(), pub(id)); err != nil {
			t.Fatal(err)
		}
	}
	ft.FailNext(transporttest.OpDeadLetter, 1, nil)
	ft.FailNext(transporttest.OpReject, 1, nil)
	d := recv(t, c.Deliveries())
	if err := d.DeadLetter(t.Context(), transport.DeadLetterReason{Reason: "permanent"}); !errors.Is(err, transporttest.ErrInjected) {
		t.Fatalf("DeadLetter: %v, want ErrInjected", err)
	}
	if err := d.Reject(t.Context(), false); !errors.Is(err, transporttest.ErrInjected) {
		t.Fatalf("Reject: %v, want ErrInjected", err)
	}
	if err := d.DeadLetter(t.Context(), transport.DeadLetterReason{Reason: "permanent"}); err != nil {
		t.Fatalf("second DeadLetter: %v", err)
	}
	dead, err := ft.DeadLetters(t.Context(), "q", 0)
	if err != nil || len(dead) != 1 {
		t.Fatalf("DeadLetters = %d, %v; want 1", len(dead), err)
	}
}

// TestFaultyPause runs in a synctest bubble, so "Publish is still waiting"
// and "nothing was delivered" are exact checks (synctest.Wait), not timed.
func TestFaultyPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ft, c := newFaulty(t)
		ft.Pause()
		if !ft.Paused() {
			t.Fatal("Paused() = false after Pause")
		}

		// Publishing waits through the outage, bounded by its context.
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() { errc <- ft.Publish(ctx, pub("during")) }()
		synctest.Wait()
		select {
		case err := <-errc:
			t.Fatalf("Publish returned during the outage: %v", err)
		default:
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("Publish with a cancelled context: %v, want context.Canceled", err)
		}

		// Deliveries already at the broker are held.
		if err := ft.Unwrap().Publish(t.Context(), pub("held")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case d := <-c.Deliveries():
			t.Fatalf("delivery %v during the outage", d.Message.Headers["id"])
		default:
		}
		go func() { errc <- ft.Publish(t.Context(), pub("after")) }()
		synctest.Wait()
		ft.Resume()
		if err := <-errc; err != nil {
			t.Fatalf("Publish waiting through the outage: %v", err)
		}
		for _, want := range []string{"held", "after"} {
			d := <-c.Deliveries()
			if d.Message.Headers["id"] != want {
				t.Errorf("got %v, want %s", d.Message.Headers["id"], want)
			}
			if err := d.Ack(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		if err := ft.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFaultyCloseDuringOutage: Close ends waiting publishes and held
// deliveries; the held delivery goes back to the broker.
func TestFaultyCloseDuringOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memory.NewBroker()
		ft := transporttest.NewFaulty(memory.New(memory.Config{Broker: b}))
		c, err := ft.Consume(t.Context(), []transport.Queue{{Name: "q"}}, transport.ConsumeOptions{Prefetch: 1})
		if err != nil {
			t.Fatal(err)
		}
		ft.Pause()
		if err := ft.Unwrap().Publish(t.Context(), pub("held")); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- ft.Publish(t.Context(), pub("waiting")) }()
		synctest.Wait() // the forwarder holds "held", the publish waits
		if s := b.Stats(); s.Unacked != 1 {
			t.Fatalf("broker %+v; want the held message handed to the forwarder", s)
		}
		if err := ft.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := <-errc; !errors.Is(err, transport.ErrClosed) {
			t.Errorf("Publish waiting when Close came: %v, want ErrClosed", err)
		}
		if _, ok := <-c.Deliveries(); ok {
			t.Error("a held delivery was handed out after Close")
		}
		if s := b.Stats(); s.Ready != 1 || s.Unacked != 0 {
			t.Errorf("after Close the broker has %+v; want the held message ready again", s)
		}
		if err := ft.Publish(t.Context(), pub("late")); !errors.Is(err, transport.ErrClosed) {
			t.Errorf("Publish after Close: %v, want ErrClosed", err)
		}
	})
}

func TestFaultyConsumeFault(t *testing.T) {
	ft := transporttest.NewFaulty(memory.New(memory.Config{}))
	defer ft.Close()
	ft.FailNext(transporttest.OpConsume, 1, nil)
	if _, err := ft.Consume(t.Context(), []transport.Queue{{Name: "q"}}, transport.ConsumeOptions{}); !errors.Is(err, transporttest.ErrInjected) {
		t.Fatalf("Consume: %v, want ErrInjected", err)
	}
	ft.FailNext(transporttest.OpSubscribe, 1, nil)
	if _, err := ft.Subscribe(t.Context(), transport.Broadcast{Exchange: "x"}); !errors.Is(err, transporttest.ErrInjected) {
		t.Fatalf("Subscribe: %v, want ErrInjected", err)
	}
	s, err := ft.Subscribe(t.Context(), transport.Broadcast{Exchange: "x"})
	if err != nil {
		t.Fatalf("Subscribe after the fault: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFaultyFailNextAfter: the broker carries the operation out, the caller
// sees an error: a retried publish duplicates, a retried ack finds the
// delivery settled.
func TestFaultyFailNextAfter(t *testing.T) {
	ft, c := newFaulty(t)
	ft.FailNextAfter(transporttest.OpPublish, 1, nil)
	if err := ft.Publish(t.Context(), pub("dup")); !errors.Is(err, transporttest.ErrInjected) {
		t.Fatalf("Publish: %v, want ErrInjected", err)
	}
	if err := ft.Publish(t.Context(), pub("dup")); err != nil {
		t.Fatalf("retried Publish: %v", err)
	}
	d1, d2 := recv(t, c.Deliveries()), recv(t, c.Deliveries())
	if d1.Message.Headers["id"] != "dup" || d2.Message.Headers["id"] != "dup" {
		t.Fatalf("got %v and %v, want the message twice", d1.Message.Headers["id"], d2.Message.Headers["id"])
	}
	ft.FailNextAfter(transporttest.OpAck, 1, transport.ErrStaleDelivery)
	if err := d1.Ack(t.Context()); !errors.Is(err, transport.ErrStaleDelivery) {
		t.Fatalf("Ack: %v, want the injected ErrStaleDelivery", err)
	}
	if err := d1.Ack(t.Context()); !errors.Is(err, transport.ErrAlreadyAcknowledged) {
		t.Fatalf("retried Ack: %v, want ErrAlreadyAcknowledged: the first one reached the broker", err)
	}
	if err := d2.Ack(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, _ := ft.Len(t.Context(), "q"); n != 0 {
		t.Errorf("Len = %d, want 0", n)
	}
}

func TestFaultyDropConnection(t *testing.T) {
	ft, c := newFaulty(t)
	for _, id := range []string{"a", "b", "c"} {
		if err := ft.Publish(t.Context(), pub(id)); err != nil {
			t.Fatal(err)
		}
	}
	ds := []*transport.Delivery{recv(t, c.Deliveries()), recv(t, c.Deliveries()), recv(t, c.Deliveries())}
	if err := ds[0].Ack(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := ft.DropConnection(t.Context()); n != 2 {
		t.Fatalf("DropConnection took back %d deliveries, want 2", n)
	}
	for _, d := range ds[1:] {
		if err := d.Ack(t.Context()); !errors.Is(err, transport.ErrStaleDelivery) {
			t.Errorf("Ack of %v after DropConnection: %v, want ErrStaleDelivery", d.Message.Headers["id"], err)
		}
	}
	got := map[any]bool{}
	for range 2 {
		d := recv(t, c.Deliveries())
		if !d.Redelivered {
			t.Errorf("%v not marked redelivered", d.Message.Headers["id"])
		}
		got[d.Message.Headers["id"]] = true
		if err := d.Ack(t.Context()); err != nil {
			t.Fatalf("Ack of the redelivery: %v", err)
		}
	}
	if !got["b"] || !got["c"] {
		t.Errorf("redelivered %v, want b and c", got)
	}
	if n := ft.DropConnection(t.Context()); n != 0 {
		t.Errorf("second DropConnection took back %d, want 0", n)
	}
}

// TestFaultyStopIgnoresFaults: deliveries the forwarder holds when its
// consumer stops go back to the broker whatever faults are set.
func TestFaultyStopIgnoresFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memory.NewBroker()
		ft := transporttest.NewFaulty(memory.New(memory.Config{Broker: b}))
		defer ft.Close()
		c, err := ft.Consume(t.Context(), []transport.Queue{{Name: "q"}}, transport.ConsumeOptions{Prefetch: 1})
		if err != nil {
			t.Fatal(err)
		}
		ft.Pause()
		if err := ft.Unwrap().Publish(t.Context(), pub("held")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if s := b.Stats(); s.Unacked != 1 {
			t.Fatalf("broker %+v; want the held message handed to the forwarder", s)
		}
		ft.FailNext(transporttest.OpReject, 5, nil)
		if err := c.Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
		if s := b.Stats(); s.Ready != 1 || s.Unacked != 0 {
			t.Errorf("after Stop the broker has %+v; want the held message ready", s)
		}
		if n := ft.Calls(transporttest.OpReject); n != 0 {
			t.Errorf("returning the held delivery counted %d Reject calls", n)
		}
		if n := ft.DropConnection(t.Context()); n != 0 {
			t.Errorf("DropConnection found %d deliveries; the held one was never handed out", n)
		}
	})
}
