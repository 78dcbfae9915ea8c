package redis_test

import (
	"context"
	"log"
	"time"

	"github.com/celeriac/celeriac/transport"
	redistransport "github.com/celeriac/celeriac/transport/redis"
)

// Consume Celery's default queue next to Python workers on the same Redis
// database: same visibility timeout, same key prefix.
func ExampleDial() {
	ctx := context.Background()
	tr, err := redistransport.Dial(ctx, redistransport.Config{
		URL:               "redis://127.0.0.1:6379/0",
		VisibilityTimeout: time.Hour, // broker_transport_options["visibility_timeout"]
	})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close() // restores whatever is still held

	c, err := tr.Consume(ctx, []transport.Queue{{Name: "celery"}}, transport.ConsumeOptions{Prefetch: 16})
	if err != nil {
		log.Fatal(err)
	}
	for d := range c.Deliveries() {
		log.Printf("%s %v", d.Message.Headers["task"], d.Message.Headers["id"])
		if err := d.Ack(ctx); err != nil {
			log.Print(err)
		}
	}
}

// Dead letters are kept per queue; list them and put them back.
func ExampleTransport_Replay() {
	ctx := context.Background()
	tr, err := redistransport.Dial(ctx, redistransport.Config{URL: "redis://127.0.0.1:6379/0"})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	dead, err := tr.DeadLetters(ctx, "celery", 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range dead {
		log.Printf("%s: %s %s", m.ID, m.Reason.Reason, m.Reason.Error)
	}
	n, err := tr.Replay(ctx, "celery", nil, transport.ReplayOptions{ResetRetries: true})
	log.Print(n, err)
}
