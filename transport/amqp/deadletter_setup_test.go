package amqp

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/transport"
)

// TestDeclareDeadLetter declares the dead-letter topology, attaches it with
// the returned queue arguments, and checks that a dead-lettered task lands
// in the dead-letter queue where DeadLetters finds it.
func TestDeclareDeadLetter(t *testing.T) {
	a := newAdmin(t)
	h := newHarness(t, Config{})
	id, err := uuid4()
	if err != nil {
		t.Fatal(err)
	}
	q := "rt6_dlx_" + id[:8]
	dlx, dlq := q+".dlx", q+".dlq"
	a.cleanup([]string{q, dlq}, []string{q, dlx})
	ctx := testCtx(t)

	if _, err := h.tr.DeclareDeadLetter(ctx, ""); err == nil {
		t.Error("DeclareDeadLetter(\"\") succeeded")
	}
	want := map[string]any{"x-dead-letter-exchange": dlx}
	for range 2 { // idempotent
		args, err := h.tr.DeclareDeadLetter(ctx, q)
		if err != nil {
			t.Fatalf("DeclareDeadLetter: %v", err)
		}
		if diff := cmp.Diff(want, args); diff != "" {
			t.Fatalf("DeclareDeadLetter() arguments mismatch (-want +got):\n%s", diff)
		}
	}
	if got := DeadLetterExchange(q); got != dlx {
		t.Errorf("DeadLetterExchange(%q) = %q", q, got)
	}
	// The exchange is a durable fanout: a passive declare with other flags
	// would still pass, so declare it actively with the expected ones.
	a.must(func(ch *amqp091.Channel) error {
		return ch.ExchangeDeclare(dlx, amqp091.ExchangeFanout, true, false, false, false, nil)
	})
	if n := a.ready(dlq); n != 0 {
		t.Fatalf("new dead-letter queue holds %d messages", n)
	}

	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q, Arguments: want}}, transport.ConsumeOptions{Prefetch: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	// Published through the queue's own exchange, as Python does, so the
	// fanout must route a routing key other than the queue name.
	if err := h.tr.Publish(ctx, &transport.Publishing{Exchange: q, RoutingKey: q, Message: taskMessage("dead-1", 0)}); err != nil {
		t.Fatal(err)
	}
	d := recv(t, c.Deliveries())
	if err := d.DeadLetter(ctx, transport.DeadLetterReason{Reason: "max-retries", TaskID: "dead-1"}); err != nil {
		t.Fatal(err)
	}
	for a.ready(dlq) < 1 {
		// Dead-lettering is asynchronous in the broker.
		if ctx.Err() != nil {
			t.Fatal("the dead letter did not arrive")
		}
	}
	dead, err := h.tr.DeadLetters(ctx, q, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].ID != "dead-1" || dead[0].Queue != q || dead[0].Reason.Reason != "rejected" || dead[0].Reason.Time.IsZero() {
		t.Fatalf("DeadLetters = %+v, want dead-1 rejected from %s", dead, q)
	}
	if _, ok := dead[0].Message.Headers["x-death"]; !ok {
		t.Errorf("dead letter has no x-death header: %v", dead[0].Message.Headers)
	}
}
