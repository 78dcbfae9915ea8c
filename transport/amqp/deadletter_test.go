package amqp

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/transport"
)

func TestDeadLetterStore(t *testing.T) {
	a := newAdmin(t)
	probe := newHarness(t, Config{})
	q, other := probe.q("tasks"), probe.q("other")
	dlx, dlq := q+".dlx", q+".dlq"
	a.cleanup([]string{q, other, dlq}, []string{q, other, dlx})
	// One dead-letter exchange and queue shared by two task queues.
	a.must(func(ch *amqp091.Channel) error {
		if err := ch.ExchangeDeclare(dlx, "fanout", true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(dlq, "", dlx, false, nil)
	})
	h := newHarness(t, Config{
		QueueArguments:  map[string]any{"x-dead-letter-exchange": dlx},
		DeadLetterQueue: func(string) string { return dlq },
	})
	ctx := testCtx(t)
	if got, err := probe.tr.DeadLetters(ctx, probe.q("nothing"), 0); err != nil || len(got) != 0 {
		t.Fatalf("DeadLetters without a dead-letter queue = %v, %v", got, err)
	}
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q}, {Name: other}}, transport.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	for _, id := range []string{"a", "b", "c"} {
		m := taskMessage(id, 0)
		m.Headers["retries"] = int64(2)
		if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: q, Message: m}); err != nil {
			t.Fatal(err)
		}
		d := recv(t, c.Deliveries())
		if err := d.DeadLetter(ctx, transport.DeadLetterReason{Reason: "max-retries", TaskID: id}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.tr.Publish(ctx, &transport.Publishing{RoutingKey: other, Message: taskMessage("o", 0)}); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, c.Deliveries()).Reject(ctx, false); err != nil {
		t.Fatal(err)
	}
	for a.ready(dlq) < 4 {
		// Dead-lettering is asynchronous in the broker.
		if ctx.Err() != nil {
			t.Fatal("dead letters did not arrive")
		}
	}

	dead, err := h.tr.DeadLetters(ctx, q, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, dm := range dead {
		ids = append(ids, dm.ID)
		if dm.Queue != q || dm.Exchange != "" || dm.RoutingKey != q || dm.Reason.Reason != "rejected" ||
			dm.Reason.TaskID != dm.ID || dm.Reason.TaskName != "tasks.add" || dm.Reason.Time.IsZero() {
			t.Errorf("dead message %s: queue %q exchange %q key %q reason %+v", dm.ID, dm.Queue, dm.Exchange, dm.RoutingKey, dm.Reason)
		}
	}
	if !slices.Equal(ids, []string{"a", "b", "c"}) {
		t.Errorf("dead ids %v, want [a b c]", ids)
	}
	if two, err := h.tr.DeadLetters(ctx, q, 2); err != nil || len(two) != 2 {
		t.Errorf("DeadLetters(limit 2) = %d, %v", len(two), err)
	}
	if n := a.ready(dlq); n != 4 {
		t.Errorf("listing changed the dead-letter queue: %d, want 4", n)
	}

	if n, err := h.tr.Replay(ctx, q, []string{"b"}, transport.ReplayOptions{ResetRetries: true}); n != 1 || err != nil {
		t.Fatalf("Replay(b) = %d, %v", n, err)
	}
	d := recv(t, c.Deliveries())
	want := taskMessage("b", 0)
	want.Headers["retries"] = int64(0)
	if diff := cmp.Diff(want, d.Message); diff != "" {
		t.Errorf("replayed message mismatch (-want +got):\n%s", diff)
	}
	_ = d.Ack(ctx)
	if n, err := h.tr.PurgeDead(ctx, q, []string{"a"}); n != 1 || err != nil {
		t.Errorf("PurgeDead(a) = %d, %v", n, err)
	}
	if n, err := h.tr.Replay(ctx, q, nil, transport.ReplayOptions{}); n != 1 || err != nil {
		t.Errorf("Replay(all) = %d, %v", n, err)
	}
	d = recv(t, c.Deliveries())
	if d.Message.Headers["id"] != "c" || d.Message.Headers["retries"] != int64(2) {
		t.Errorf("replayed %v with retries %v, want c with 2", d.Message.Headers["id"], d.Message.Headers["retries"])
	}
	_ = d.Ack(ctx)
	// The other queue's dead letter is still there, and only it.
	if n := a.ready(dlq); n != 1 {
		t.Errorf("dead-letter queue holds %d, want 1", n)
	}
	if n, err := h.tr.PurgeDead(ctx, other, nil); n != 1 || err != nil {
		t.Errorf("PurgeDead(other) = %d, %v", n, err)
	}
}
