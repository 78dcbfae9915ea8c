package memory_test

import (
	"context"
	"testing"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
)

// benchMessage is a task message with the headers Celery 5.2 sends.
func benchMessage() protocol.Message {
	return protocol.Message{
		ContentType:     protocol.ContentTypeJSON,
		ContentEncoding: "utf-8",
		Headers: map[string]any{
			"lang": "py", "task": "tasks.add", "id": "11111111-1111-1111-1111-111111111111",
			"shadow": nil, "eta": nil, "expires": nil, "group": nil, "group_index": nil,
			"retries": int64(0), "timelimit": []any{nil, nil},
			"root_id": "11111111-1111-1111-1111-111111111111", "parent_id": nil,
			"argsrepr": "(2, 3)", "kwargsrepr": "{}", "origin": "gen8098@vm", "ignore_result": false,
		},
		Properties: protocol.Properties{CorrelationID: "11111111-1111-1111-1111-111111111111", ReplyTo: "2731d639-4e7d-349f-9ccc-abfd40bea425", DeliveryMode: 2},
		Body:       []byte(`[[2, 3], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]`),
	}
}

// BenchmarkPublishConsumeAck measures one producer goroutine and one
// consumer (the benchmark loop) moving messages through one queue, each
// message published, delivered and acked: the embedded demo's hot path.
func BenchmarkPublishConsumeAck(b *testing.B) {
	for _, bc := range []struct {
		name     string
		prefetch int
		msg      protocol.Message
	}{
		{"celery-headers/prefetch=256", 256, benchMessage()},
		{"celery-headers/prefetch=8", 8, benchMessage()},
		{"small/prefetch=256", 256, protocol.Message{Headers: map[string]any{"id": "x"}, Body: []byte("[[], {}, null]")}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			tr := memory.New(memory.Config{})
			defer tr.Close()
			c, err := tr.Consume(ctx, []transport.Queue{{Name: "q"}}, transport.ConsumeOptions{Prefetch: bc.prefetch})
			if err != nil {
				b.Fatal(err)
			}
			p := &transport.Publishing{RoutingKey: "q", Message: bc.msg}
			errc := make(chan error, 1)
			b.ReportAllocs()
			b.ResetTimer()
			go func() {
				for range b.N {
					if err := tr.Publish(ctx, p); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			for range b.N {
				d := <-c.Deliveries()
				if err := d.Ack(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
		})
	}
}

// BenchmarkDrain measures consuming and acking a queue preloaded with b.N
// messages, the way broker throughput is usually quoted (and the way the
// Redis and RabbitMQ adapters are benchmarked).
func BenchmarkDrain(b *testing.B) {
	ctx := context.Background()
	tr := memory.New(memory.Config{})
	defer tr.Close()
	p := &transport.Publishing{RoutingKey: "q", Message: benchMessage()}
	for range b.N {
		if err := tr.Publish(ctx, p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	c, err := tr.Consume(ctx, []transport.Queue{{Name: "q"}}, transport.ConsumeOptions{Prefetch: 256})
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		d := <-c.Deliveries()
		if err := d.Ack(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
}

// BenchmarkPublish measures publishing alone.
func BenchmarkPublish(b *testing.B) {
	ctx := context.Background()
	tr := memory.New(memory.Config{})
	defer tr.Close()
	p := &transport.Publishing{RoutingKey: "q", Message: benchMessage()}
	b.ReportAllocs()
	for i := range b.N {
		if err := tr.Publish(ctx, p); err != nil {
			b.Fatal(err)
		}
		if i%4096 == 4095 { // keep the heap small: measure publishing, not GC of a growing queue
			b.StopTimer()
			if _, err := tr.Purge(ctx, "q"); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
}
