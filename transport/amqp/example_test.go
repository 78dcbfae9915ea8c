package amqp_test

import (
	"context"
	"errors"
	"log"

	"github.com/celeriac/celeriac/transport"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
)

// A worker's consuming loop over the queue Python's Celery publishes to.
// (It needs a broker, so it only compiles.)
func ExampleDial() {
	ctx := context.Background()
	tr, err := amqptransport.Dial(ctx, amqptransport.Config{
		// Celery's failover form: tried in order.
		URL: "amqp://guest:guest@rabbit-a:5672//;amqp://guest:guest@rabbit-b:5672//",
		// Must equal what Python declares (task_queue_max_priority = 10).
		QueueArguments: map[string]any{"x-max-priority": 10},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()

	c, err := tr.Consume(ctx, []transport.Queue{{Name: "celery"}}, transport.ConsumeOptions{Prefetch: 16})
	if err != nil {
		log.Fatal(err)
	}
	for d := range c.Deliveries() {
		log.Printf("task %v id %v", d.Message.Headers["task"], d.Message.Headers["id"])
		if err := d.Ack(ctx); errors.Is(err, transport.ErrStaleDelivery) {
			// The connection was lost: the broker delivers it again.
			continue
		}
	}
	log.Print(c.Err())
}

// Publishing a task message as Celery does: default exchange, the queue as
// routing key, waiting for the broker's confirm.
func ExampleTransport_Publish() {
	ctx := context.Background()
	tr, err := amqptransport.Dial(ctx, amqptransport.Config{URL: "amqp://guest:guest@localhost:5672//"})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	var msg transport.Publishing // built with protocol.EncodeTask
	msg.RoutingKey = "celery"
	if err := tr.Publish(ctx, &msg); err != nil {
		log.Fatal(err)
	}
}

// Giving a task queue a dead-letter exchange: declare the exchange and the
// .dlq queue, then declare the task queue with the returned argument (Python
// must declare it with the same queue_arguments), or attach the exchange with
// a RabbitMQ policy instead. (It needs a broker, so it only compiles.)
func ExampleTransport_DeclareDeadLetter() {
	ctx := context.Background()
	tr, err := amqptransport.Dial(ctx, amqptransport.Config{URL: "amqp://guest:guest@localhost:5672//"})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	args, err := tr.DeclareDeadLetter(ctx, "celery") // celery.dlx → celery.dlq
	if err != nil {
		log.Fatal(err)
	}
	c, err := tr.Consume(ctx, []transport.Queue{{Name: "celery", Arguments: args}}, transport.ConsumeOptions{Prefetch: 16})
	if err != nil {
		log.Fatal(err)
	}
	for d := range c.Deliveries() {
		// A message this worker gives up on goes to celery.dlq, with x-death.
		_ = d.DeadLetter(ctx, transport.DeadLetterReason{Reason: "permanent"})
	}
}

// Consuming a quorum queue behind a topic exchange, as a Celery 5.5 app with
// task_default_queue_type = "quorum" and task_default_exchange_type =
// "topic" declares it. DelayedAuto (the default) sees the quorum queue,
// declares the celery_delayed_* levels and binds the queue to them, so
// countdown tasks from Python 5.5 producers come out here; a countdown task
// published to the "celery" exchange goes through the levels too. (It needs
// a broker, so it only compiles.)
func ExampleConfig_delayedDelivery() {
	ctx := context.Background()
	tr, err := amqptransport.Dial(ctx, amqptransport.Config{
		URL:              "amqp://guest:guest@localhost:5672//",
		DelayedDelivery:  amqptransport.DelayedAuto,
		DelayedQueueType: "quorum", // broker_native_delayed_delivery_queue_type
	})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	c, err := tr.Consume(ctx, []transport.Queue{{
		Name: "celery", Exchange: "celery", ExchangeType: transport.Topic, RoutingKey: "celery",
		Arguments: map[string]any{"x-queue-type": "quorum"},
	}}, transport.ConsumeOptions{Prefetch: 16})
	if err != nil {
		log.Fatal(err)
	}
	for d := range c.Deliveries() {
		// A task out of the levels arrives through a celery_delayed_*
		// exchange, its routing key prefixed with the countdown's bits.
		log.Printf("task %v via %s", d.Message.Headers["id"], d.Exchange)
		_ = d.Ack(ctx)
	}
}

// A RabbitMQ cluster behind Celery's failover URLs: the node in use is
// logged and reported by Node, for metrics.
func ExampleTransport_Node() {
	ctx := context.Background()
	tr, err := amqptransport.Dial(ctx, amqptransport.Config{
		URL:              "amqp://guest:guest@rabbit-a//;amqp://guest:guest@rabbit-b//;amqp://guest:guest@rabbit-c//",
		FailoverStrategy: amqptransport.FailoverRoundRobin, // broker_failover_strategy
	})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	log.Printf("consuming from %s (%d failovers so far)", tr.Node(), tr.Failovers())
}
