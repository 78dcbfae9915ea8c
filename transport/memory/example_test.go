package memory_test

import (
	"context"
	"fmt"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
)

// A task message goes through the "celery" queue: published to the default
// exchange, consumed with a prefetch bound, rejected once with requeue, then
// acknowledged.
func Example() {
	ctx := context.Background()
	tr := memory.New(memory.Config{})
	defer tr.Close()

	c, err := tr.Consume(ctx, []transport.Queue{{Name: "celery"}}, transport.ConsumeOptions{Prefetch: 8})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = tr.Publish(ctx, &transport.Publishing{
		RoutingKey: "celery",
		Message: protocol.Message{
			ContentType:     protocol.ContentTypeJSON,
			ContentEncoding: "utf-8",
			Headers:         map[string]any{"task": "tasks.add", "id": "t-1"},
			Body:            []byte(`[[2, 3], {}, null]`),
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	d := <-c.Deliveries()
	fmt.Println(d.Queue, d.Message.Headers["task"], string(d.Message.Body), d.Redelivered)
	_ = d.Reject(ctx, true)

	d = <-c.Deliveries()
	fmt.Println(d.Queue, d.Message.Headers["task"], string(d.Message.Body), d.Redelivered)
	fmt.Println(d.Ack(ctx), d.Ack(ctx))

	_ = c.Stop(ctx)
	fmt.Println(tr.Len(ctx, "celery"))
	// Output:
	// celery tasks.add [[2, 3], {}, null] false
	// celery tasks.add [[2, 3], {}, null] true
	// <nil> transport: delivery already acknowledged
	// 0 <nil>
}

// Two transports share one broker like two processes share RabbitMQ: what
// one leaves unacknowledged when it closes, the other receives, marked
// redelivered.
func ExampleConfig_sharedBroker() {
	ctx := context.Background()
	b := memory.NewBroker()
	first := memory.New(memory.Config{Broker: b})
	second := memory.New(memory.Config{Broker: b})
	defer second.Close()

	c1, _ := first.Consume(ctx, []transport.Queue{{Name: "jobs"}}, transport.ConsumeOptions{Prefetch: 1})
	_ = second.Publish(ctx, &transport.Publishing{RoutingKey: "jobs", Message: protocol.Message{Body: []byte("job 1")}})
	d := <-c1.Deliveries()
	fmt.Println("first got", string(d.Message.Body))
	_ = first.Close() // crash before the ack

	c2, _ := second.Consume(ctx, []transport.Queue{{Name: "jobs"}}, transport.ConsumeOptions{Prefetch: 1})
	d = <-c2.Deliveries()
	fmt.Println("second got", string(d.Message.Body), "redelivered:", d.Redelivered)
	_ = d.Ack(ctx)
	// Output:
	// first got job 1
	// second got job 1 redelivered: true
}
