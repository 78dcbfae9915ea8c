package redis_test

import (
	"context"
	"fmt"
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

// How long a killed worker's messages wait: the visibility timeout plus one
// sweep period.
func ExampleConfig_SweepPeriod() {
	for _, vt := range []time.Duration{5 * time.Second, time.Minute, time.Hour} {
		c := redistransport.Config{VisibilityTimeout: vt}
		fmt.Printf("visibility_timeout %v: sweep every %v\n", vt, c.SweepPeriod())
	}
	// Output:
	// visibility_timeout 5s: sweep every 1s
	// visibility_timeout 1m0s: sweep every 6s
	// visibility_timeout 1h0m0s: sweep every 1m40s
}

// The staged pop costs Redis about two thirds of the script's CPU a task.
// A worker that also puts back what dead staged consumers left can be run
// by hand with SweepStaged, and StagedLen counts what staging lists hold.
func ExampleConfig_stagedPop() {
	ctx := context.Background()
	tr, err := redistransport.Dial(ctx, redistransport.Config{
		URL:       "redis://127.0.0.1:6379/0",
		StagedPop: true, // broker_transport_options["celeriac_staged_pop"]
	})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	n, err := tr.SweepStaged(ctx)
	log.Printf("put back %d staged messages of dead consumers (%v)", n, err)
}
