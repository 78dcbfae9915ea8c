package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
)

// BenchmarkDrain measures the worker's own cost per task: a queue of
// Python-shaped no-op tasks drained through the in-memory transport (so
// broker round trips are out of the picture), with and without results.
//
// BenchmarkDrainTracing is the same drain (with results) with tracing off and
// on at sample ratio 1.0 (spans batched to an exporter that discards them):
// off must cost what BenchmarkDrain costs.
func BenchmarkDrain(b *testing.B) {
	for _, results := range []bool{false, true} {
		b.Run(fmt.Sprintf("results=%t", results), func(b *testing.B) { benchDrain(b, results, nil) })
	}
}

func BenchmarkDrainTracing(b *testing.B) {
	b.Run("tracing=off", func(b *testing.B) { benchDrain(b, true, nil) })
	b.Run("tracing=on", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.TraceIDRatioBased(1.0)),
			sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		defer tp.Shutdown(context.Background())
		benchDrain(b, true, tp)
	})
}

func benchDrain(b *testing.B, results bool, tp trace.TracerProvider) {
	{
		{
			tr := memory.New(memory.Config{})
			defer tr.Close()
			be := membackend.New()
			defer be.Close()
			done := make(chan struct{}, 1024)
			mux := worker.NewMux()
			mux.HandleFunc("bench.noop", func(ctx context.Context, t *worker.Task) (any, error) {
				done <- struct{}{}
				return nil, nil
			})
			cfg := worker.Config{Queues: []string{"bench"}, Concurrency: 8, PrefetchMultiplier: 4, WithoutHeartbeat: true, WithoutControl: true,
				TracerProvider: tp}
			if results {
				cfg.Backend = be
			}
			w, err := worker.New(tr, mux, cfg)
			if err != nil {
				b.Fatal(err)
			}
			p := client.New(tr, client.Config{DefaultQueue: "bench"})
			m, dest := sampleMessage(b, p)
			for i := 0; i < b.N; i++ {
				if err := tr.Publish(context.Background(), &transport.Publishing{RoutingKey: dest, Message: m}); err != nil {
					b.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			b.ResetTimer()
			go func() { errc <- w.Run(ctx) }()
			for i := 0; i < b.N; i++ {
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					b.Fatalf("stuck after %d of %d", i, b.N)
				}
			}
			b.StopTimer()
			cancel()
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
		}
	}
}

// sampleMessage encodes one bench.noop(1) message as a Python 5.2 producer
// would lay it out.
func sampleMessage(b *testing.B, p *client.Client) (protocol.Message, string) {
	m := &protocol.TaskMessage{Protocol: 2, ID: protocol.NewID(), Name: "bench.noop", Lang: "py",
		Args: []any{int64(1)}, Kwargs: map[string]any{}, DeliveryMode: 2, ReplyTo: protocol.NewID(), Origin: "gen1@host"}
	m.RootID, m.CorrelationID = m.ID, m.ID
	msg, err := protocol.EncodeTask(m, protocol.EncodeOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return *msg, "bench"
}
