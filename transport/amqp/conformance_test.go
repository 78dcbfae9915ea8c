package amqp

import (
	"context"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// TestConformance runs the transport conformance suite on the real broker,
// with global QoS (Celery's, the default) and with per-queue prefetch
// (per-consumer QoS, asked for by strict and weighted queue order).
func TestConformance(t *testing.T) {
	t.Run("global-qos", func(t *testing.T) { conformance(t, false) })
	t.Run("per-queue-prefetch", func(t *testing.T) { conformance(t, true) })
}

func conformance(t *testing.T, perQueue bool) {
	url := transporttest.AMQPURL(t)
	a := newAdmin(t)
	skip := map[string]string{
		"Settle/RejectRequeueAtHead": "with global QoS (Celery's choice, the default) RabbitMQ 3.10 may free the " +
			"prefetch slot before the requeued message is back at the head and deliver the next one first " +
			"(about 1 in 25 on the test broker); the per-queue-prefetch run checks the exact order",
	}
	if perQueue {
		skip = map[string]string{
			"Prefetch/RaiseAndLower": "with per-consumer QoS RabbitMQ applies a new prefetch only to consumers " +
				"started after it, so SetPrefetch consumes again and the new window counts only later deliveries " +
				"(see consumer.SetPrefetch): the deliveries held at the call are outside it until settled",
		}
	}
	transporttest.Run(t, func(tb testing.TB) transport.Transport {
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		tr, err := Dial(ctx, Config{URL: url, ConnectionName: "at_conformance", ReconnectInitial: 20 * time.Millisecond, ReconnectStep: -1})
		if err != nil {
			tb.Fatalf("Dial: %v", err)
		}
		return tr
	}, transporttest.Features{
		QueuePrefix:            "at_tt_",
		Priority:               transporttest.PriorityHigherFirst,
		PriorityQueueArguments: map[string]any{"x-max-priority": 10},
		RequeueAtHead:          true,
		PerQueuePrefetch:       perQueue,
		Skip:                   skip,
		// The dead-letter store reads queue+".dlq" (Config.DeadLetterQueue's
		// default); the queue dead-letters into it through the default
		// exchange.
		DeadLetterQueueArguments: func(queue string) map[string]any {
			a.declare(queue+".dlq", nil)
			return map[string]any{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue + ".dlq"}
		},
		RejectDeadLetters: true,
		Topics:            transporttest.TopicAMQP,
		Cleanup: func(tb testing.TB, queues, exchanges []string) {
			// Consume declares an exchange named after each queue.
			for _, q := range queues {
				_ = a.do(func(ch *amqp091.Channel) error { _, err := ch.QueueDelete(q+".dlq", false, false, false); return err })
				_ = a.do(func(ch *amqp091.Channel) error { return ch.ExchangeDelete(q, false, false) })
			}
			for _, x := range exchanges {
				_ = a.do(func(ch *amqp091.Channel) error { return ch.ExchangeDelete(x, false, false) })
			}
		},
	})
}
