package transporttest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// The broker refuses the next two publishes and loses one acknowledgement:
// the message stays unsettled, so the consumer can settle it again.
func ExampleFaulty() {
	ctx := context.Background()
	ft := transporttest.NewFaulty(memory.New(memory.Config{}))
	defer ft.Close()
	c, _ := ft.Consume(ctx, []transport.Queue{{Name: "celery"}}, transport.ConsumeOptions{Prefetch: 4})

	ft.FailNext(transporttest.OpPublish, 2, nil)
	p := &transport.Publishing{RoutingKey: "celery", Message: protocol.Message{Body: []byte("task")}}
	for attempt := 1; ; attempt++ {
		err := ft.Publish(ctx, p)
		fmt.Printf("publish attempt %d: %v\n", attempt, err)
		if err == nil {
			break
		}
	}

	ft.FailNext(transporttest.OpAck, 1, transport.ErrStaleDelivery)
	d := <-c.Deliveries()
	err := d.Ack(ctx)
	fmt.Println("first ack stale:", errors.Is(err, transport.ErrStaleDelivery))
	fmt.Println("second ack:", d.Ack(ctx))
	fmt.Println("acks tried:", ft.Calls(transporttest.OpAck))
	// Output:
	// publish attempt 1: transporttest: injected publish fault: transporttest: injected fault
	// publish attempt 2: transporttest: injected publish fault: transporttest: injected fault
	// publish attempt 3: <nil>
	// first ack stale: true
	// second ack: <nil>
	// acks tried: 2
}
