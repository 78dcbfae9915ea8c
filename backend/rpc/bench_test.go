package rpc_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/rpc"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// BenchmarkWaitWake measures how long after a worker starts sending a
// task's SUCCESS (Store: publish, and on RabbitMQ the broker's confirm) a
// Wait that was blocked on it returns: the wake-up latency of a Go
// caller's .get() on the RPC backend. The Redis broker's figure is
// measured in integration (BenchmarkRPCWaitWake), where a Redis db is
// assigned to this kind of test.
func BenchmarkWaitWake(b *testing.B) {
	b.Run("memory", func(b *testing.B) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		benchWake(b, tr)
	})
	b.Run("rabbitmq", func(b *testing.B) {
		tr, err := amqptransport.Dial(context.Background(), amqptransport.Config{URL: transporttest.AMQPURL(b)})
		if err != nil {
			b.Fatal(err)
		}
		defer tr.Close()
		benchWake(b, tr)
	})
}

func benchWake(b *testing.B, tr transport.Transport) {
	ctx := context.Background()
	c, err := rpc.NewClient(ctx, tr, rpc.ClientConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	be, err := rpc.New(tr, rpc.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	var total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := "wake-" + strconv.Itoa(i)
		woke := make(chan time.Time, 1)
		go func() {
			_, _ = c.Wait(ctx, id)
			woke <- time.Now()
		}()
		time.Sleep(time.Millisecond) // let the Wait block
		start := time.Now()
		err := be.Store(ctx, backend.StoreRequest{
			Meta:    &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess, Result: int64(i), Children: []any{}},
			ReplyTo: c.ReplyTo(), CorrelationID: id,
		})
		if err != nil {
			b.Fatal(err)
		}
		total += (<-woke).Sub(start)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-wake/op")
}
