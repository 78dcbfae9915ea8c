package amqp

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// TestPublishNonFiniteHeader: a NaN or an infinity in a header is refused
// before it is sent (RabbitMQ would close the connection over it, see
// TestPublishBrokerClosesConnection), so the publishing connection
// survives and nothing is enqueued.
func TestPublishNonFiniteHeader(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	q := h.q("nonfinite")
	a.declare(q, nil)
	a.cleanup([]string{q}, nil)
	for _, v := range []any{float32(math.NaN()), math.NaN(), math.Inf(1), float32(math.Inf(-1)),
		[]any{1.5, math.NaN()}, map[string]any{"f": math.Inf(1)}} {
		m := taskMessage("nonfinite", 0)
		m.Headers["x"] = v
		err := h.tr.Publish(testCtx(t), &transport.Publishing{RoutingKey: q, Message: m})
		if !errors.Is(err, protocol.ErrUnencodable) {
			t.Errorf("Publish, header %v: %v, want an error wrapping protocol.ErrUnencodable", v, err)
		}
	}
	if err := h.tr.Publish(testCtx(t), &transport.Publishing{RoutingKey: q, Message: taskMessage("after", 0)}); err != nil {
		t.Fatalf("Publish after the refused messages: %v", err)
	}
	if n := h.dials("publisher"); n != 1 {
		t.Errorf("the publisher connected %d times, want 1: a refused message reached the broker", n)
	}
	if n := a.ready(q); n != 1 {
		t.Errorf("%d messages in the queue, want 1 (the one published after)", n)
	}
}

// TestPublishBrokerClosesConnection: a message the broker cannot parse
// makes it close the whole publishing connection before confirming
// (RabbitMQ's channel process crashes on a NaN in a header table, and the
// connection goes with 541 INTERNAL_ERROR). Publish must not send it again
// on every new connection until its ctx ends: after maxRefusals closes it
// returns the broker's error. The NaN goes through publish, past the
// conversion that refuses it in Publish.
func TestPublishBrokerClosesConnection(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	q := h.q("poison")
	a.declare(q, nil)
	a.cleanup([]string{q}, nil)
	msg := amqpPublishing("poison")
	msg.Headers["x"] = math.NaN()
	err := h.tr.publish(testCtx(t), &transport.Publishing{RoutingKey: q}, msg)
	var ae *amqp091.Error
	if !errors.As(err, &ae) || !ae.Server || ae.Code == amqp091.ConnectionForced {
		t.Fatalf("publish = %v, want the broker's connection.close error", err)
	}
	t.Logf("publish: %v", err)
	if n := h.dials("publisher"); n > 1+maxRefusals {
		t.Errorf("the publisher connected %d times, want at most %d: the message was sent again after %d refusals",
			n, 1+maxRefusals, maxRefusals)
	}
	if n := a.ready(q); n != 0 {
		t.Errorf("%d messages in the queue, want 0", n)
	}
	// The transport reconnects and publishes as before.
	if err := h.tr.Publish(testCtx(t), &transport.Publishing{RoutingKey: q, Message: taskMessage("after", 0)}); err != nil {
		t.Fatalf("Publish after the refused message: %v", err)
	}
	if n := a.ready(q); n != 1 {
		t.Errorf("%d messages in the queue, want 1", n)
	}
}

// fakeConfirm is a publisher confirm that arrives (or the channel closes)
// after a delay, or never.
type fakeConfirm struct {
	after time.Duration // 0: never
	ack   bool
}

func (f fakeConfirm) WaitContext(ctx context.Context) (bool, error) {
	var c <-chan time.Time
	if f.after > 0 {
		c = time.After(f.after)
	}
	select {
	case <-c:
		return f.ack, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// TestConfirmBudget: ConfirmTimeout bounds the confirm waits of one Publish
// together, so a message sent again after a connection loss waits only for
// what the earlier tries left.
func TestConfirmBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := confirmBudget{limit: 30 * time.Second}
		// The first send's channel closes after 20 s (a connection loss).
		if ack, err := b.wait(t.Context(), fakeConfirm{after: 20 * time.Second}); ack || err != nil {
			t.Fatalf("wait = %v, %v; want the nack of a closed channel", ack, err)
		}
		if b.spent() {
			t.Fatal("budget spent after 20 s of 30")
		}
		// The second send is never confirmed: 10 s are left, not 30.
		start := time.Now()
		if _, err := b.wait(t.Context(), fakeConfirm{}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("wait = %v, want context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d != 10*time.Second {
			t.Errorf("second wait took %v, want the 10 s left", d)
		}
		if !b.spent() {
			t.Error("budget not spent after 30 s of waits")
		}

		// Without a limit only ctx bounds the waits.
		nb := confirmBudget{}
		if ack, err := nb.wait(t.Context(), fakeConfirm{after: time.Hour, ack: true}); !ack || err != nil {
			t.Errorf("unlimited wait = %v, %v; want the ack", ack, err)
		}
		if nb.spent() {
			t.Error("an unlimited budget reports spent")
		}
	})
}
