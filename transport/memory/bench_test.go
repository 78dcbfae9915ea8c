package memory_test

import (
	"context"
	"testing"
	"time"

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

func smallMessage() protocol.Message {
	return protocol.Message{Headers: map[string]any{"id": "x"}, Body: []byte("[[], {}, null]")}
}

// maxBacklog bounds how far the benchmark producer runs ahead of the
// consumer. Unbounded, the queue grows to b.N messages and the benchmark
// measures the garbage collector scanning that backlog, not the transport.
const maxBacklog = 1024

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
		{"small/prefetch=256", 256, smallMessage()},
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
			credit := make(chan struct{}, maxBacklog)
			for range maxBacklog {
				credit <- struct{}{}
			}
			errc := make(chan error, 1)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			go func() {
				for range b.N {
					<-credit
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
				credit <- struct{}{}
			}
			b.StopTimer()
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
			reportRates(b, cpu0)
		})
	}
}

// BenchmarkDrain measures consuming and acking a preloaded queue, the way
// broker throughput is usually quoted (and the Redis and RabbitMQ adapters
// are benchmarked): rounds of 10 000 messages published with the timer
// stopped, then drained.
func BenchmarkDrain(b *testing.B) {
	const round = 10000
	ctx := context.Background()
	tr := memory.New(memory.Config{})
	defer tr.Close()
	p := &transport.Publishing{RoutingKey: "q", Message: benchMessage()}
	c, err := tr.Consume(ctx, []transport.Queue{{Name: "q"}}, transport.ConsumeOptions{Prefetch: 256})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var cpu time.Duration
	for done := 0; done < b.N; {
		n := min(round, b.N-done)
		b.StopTimer()
		for range n {
			if err := tr.Publish(ctx, p); err != nil {
				b.Fatal(err)
			}
		}
		c, err := tr.Consume(ctx, []transport.Queue{{Name: "q"}}, transport.ConsumeOptions{Prefetch: 256})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		cpu0 := processCPU()
		for range n {
			d := <-c.Deliveries()
			if err := d.Ack(ctx); err != nil {
				b.Fatal(err)
			}
		}
		cpu += processCPU() - cpu0
		b.StopTimer()
		if err := c.Stop(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		done += n
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
	if cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/msg")
	}
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
		if i%maxBacklog == maxBacklog-1 {
			b.StopTimer()
			if _, err := tr.Purge(ctx, "q"); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
}

// reportRates reports messages per second of wall time and CPU time per
// message (all goroutines, GC included) since cpu0.
func reportRates(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
	if cpu := processCPU() - cpu0; cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/msg")
	}
}

// BenchmarkPublishGoTypes measures publishing a message whose headers hold
// plain Go types (int, float32, typed slices and maps) rather than the
// protocol's value types, which the transport converts on the way in.
func BenchmarkPublishGoTypes(b *testing.B) {
	ctx := context.Background()
	tr := memory.New(memory.Config{})
	defer tr.Close()
	m := benchMessage()
	m.Headers["retries"] = 3
	m.Headers["timelimit"] = []int{60, 30}
	m.Headers["x-ratio"] = float32(0.25)
	m.Headers["x-tags"] = []string{"a", "b"}
	m.Headers["x-counts"] = map[string]int{"a": 1, "b": 2}
	p := &transport.Publishing{RoutingKey: "q", Message: m}
	b.ReportAllocs()
	for i := range b.N {
		if err := tr.Publish(ctx, p); err != nil {
			b.Fatal(err)
		}
		if i%maxBacklog == maxBacklog-1 {
			b.StopTimer()
			if _, err := tr.Purge(ctx, "q"); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
}
