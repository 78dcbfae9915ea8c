package rpc_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/rpc"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
)

// printer is a Publisher that prints instead of sending; a real program
// passes its transport.
type printer struct{}

func (printer) Publish(_ context.Context, p *transport.Publishing) error {
	fmt.Printf("to %q correlation_id %s delivery_mode %d\n", p.RoutingKey, p.Message.Properties.CorrelationID, p.Message.Properties.DeliveryMode)
	return nil
}

func Example() {
	be, _ := rpc.New(printer{}, rpc.Config{})
	defer be.Close()
	_ = be.Store(context.Background(), backend.StoreRequest{
		Meta:    &protocol.ResultMeta{TaskID: "t1", Status: protocol.StateSuccess, Result: int64(5)},
		ReplyTo: "3f0c0e6a-reply", CorrelationID: "t1",
	})
	// Output: to "3f0c0e6a-reply" correlation_id t1 delivery_mode 1
}

// A Go caller of Celery tasks with result_backend = "rpc://": the client's
// reply queue goes into every task message's reply_to, and the worker
// (here celeriac on the in-memory broker; Python Celery does the same)
// sends the result there.
func ExampleClient() {
	ctx := context.Background()
	tr := memory.New(memory.Config{})
	defer tr.Close()

	// The worker.
	be, _ := rpc.New(tr, rpc.Config{})
	mux := worker.NewMux()
	mux.HandleFunc("tasks.add", func(_ context.Context, t *worker.Task) (any, error) {
		var x, y int
		if err := t.Bind(&x, &y); err != nil {
			return nil, err
		}
		return x + y, nil
	})
	w, _ := worker.New(tr, mux, worker.Config{Queues: []string{"celery"}, Backend: be})
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error)
	go func() { ran <- w.Run(runCtx) }()
	defer func() { stop(); <-ran }()

	// The caller.
	c, err := rpc.NewClient(ctx, tr, rpc.ClientConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	cl := client.New(tr, client.Config{Backend: c}) // sends with reply_to = c.ReplyTo()
	r, err := cl.Send(ctx, "tasks.add", []any{2, 3}, nil)
	if err != nil {
		log.Fatal(err)
	}
	v, err := r.Get(ctx) // wakes on the reply, no polling
	fmt.Println(v, err)
	// Output: 5 <nil>
}

// The same against RabbitMQ, where Python Celery workers run the tasks. On
// Redis the client finds that replies are list entries and consumes the
// list (QueueKind). (It needs a broker, so it only compiles.)
func ExampleNewClient() {
	ctx := context.Background()
	tr, err := amqptransport.Dial(ctx, amqptransport.Config{URL: "amqp://guest:guest@localhost:5672//"})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	c, err := rpc.NewClient(ctx, tr, rpc.ClientConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	cl := client.New(tr, client.Config{Backend: c})
	r, err := cl.Send(ctx, "tasks.add", []any{2, 3}, nil)
	if err != nil {
		log.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	m, err := r.Meta(wctx)
	if err != nil {
		log.Fatal(err)
	}
	log.Print(m.Status, m.Result)
}
