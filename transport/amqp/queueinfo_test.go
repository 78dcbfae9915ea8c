package amqp

import (
	"context"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// TestQueueInfo: counts and x-max-priority of queues with and without
// priorities, and of a queue that does not exist (which the probe must not
// create).
func TestQueueInfo(t *testing.T) {
	h := newHarness(t, Config{})
	a := newAdmin(t)
	prio, plain, missing, dead := h.q("prio"), h.q("plain"), h.q("missing"), h.q("dead")
	deadPlain := h.q("deadplain")
	a.cleanup([]string{prio, plain, missing, dead, deadPlain}, nil)
	a.must(func(ch *amqp091.Channel) error {
		if _, err := ch.QueueDeclare(prio, true, false, false, false, amqp091.Table{"x-max-priority": int32(10)}); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(plain, true, false, false, false, nil); err != nil {
			return err
		}
		// Other arguments than x-max-priority make RabbitMQ name those
		// first: the probe learns them.
		if _, err := ch.QueueDeclare(dead, true, false, false, false, amqp091.Table{
			"x-dead-letter-exchange": dead + ".dlx", "x-message-ttl": int32(60000), "x-max-priority": int32(3)}); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(deadPlain, true, false, false, false, amqp091.Table{"x-dead-letter-exchange": "dlx"}); err != nil {
			return err
		}
		for range 3 {
			if err := ch.PublishWithContext(context.Background(), "", prio, false, false, amqp091.Publishing{Body: []byte("x"), Priority: 5}); err != nil {
				return err
			}
		}
		return nil
	})
	ctx := context.Background()
	for _, tc := range []struct {
		queue string
		want  QueueInfo
	}{
		{prio, QueueInfo{Exists: true, Messages: 3, MaxPriority: 10}},
		{plain, QueueInfo{Exists: true, MaxPriority: 0}},
		{missing, QueueInfo{MaxPriority: 0}},
		{dead, QueueInfo{Exists: true, MaxPriority: 3}},
		{deadPlain, QueueInfo{Exists: true, MaxPriority: 0}},
	} {
		// Publishes are confirmed by the broker only eventually for the
		// count: wait until the messages are counted.
		var got QueueInfo
		for range 50 {
			var err error
			got, err = h.tr.QueueInfo(ctx, tc.queue)
			if err != nil {
				t.Fatalf("QueueInfo(%s): %v", tc.queue, err)
			}
			if got == tc.want {
				break
			}
		}
		if got != tc.want {
			t.Errorf("QueueInfo(%s) = %+v, want %+v", tc.queue, got, tc.want)
		}
	}
	if err := a.do(func(ch *amqp091.Channel) error {
		_, err := ch.QueueDeclarePassive(missing, true, false, false, false, nil)
		return err
	}); err == nil {
		t.Error("QueueInfo created the missing queue")
	}
}
