package transporttest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// A broker outage as a test stages it on the in-process broker: failed
// publishes, a pause during which Publish waits, and a dropped connection
// that takes back an unsettled delivery, which comes again marked
// redelivered while the first copy's ack goes stale.
func ExampleFaulty_DropConnection() {
	ctx := context.Background()
	ft := transporttest.NewFaulty(memory.New(memory.Config{}))
	defer ft.Close()
	c, err := ft.Consume(ctx, []transport.Queue{{Name: "celery"}}, transport.ConsumeOptions{Prefetch: 4})
	if err != nil {
		log.Fatal(err)
	}
	p := &transport.Publishing{RoutingKey: "celery", Message: protocol.Message{Body: []byte("task")}}

	ft.FailNext(transporttest.OpPublish, 2, nil) // the next two publishes fail
	fmt.Println(ft.Publish(ctx, p) != nil, ft.Publish(ctx, p) != nil)

	ft.Pause() // deliveries stop, Publish waits
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	fmt.Println(ft.Publish(short, p))
	cancel()
	ft.Resume()
	fmt.Println(ft.Publish(ctx, p))

	d := <-c.Deliveries()
	n := ft.DropConnection(ctx) // unsettled deliveries come back; their acks go stale
	fmt.Println(n, errors.Is(d.Ack(ctx), transport.ErrStaleDelivery))
	d = <-c.Deliveries()
	fmt.Println(d.Redelivered, d.Ack(ctx))
	// Output:
	// true true
	// transporttest: publish during outage: context deadline exceeded
	// <nil>
	// 1 true
	// true <nil>
}
