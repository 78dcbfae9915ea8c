package redis

import (
	"context"
	"testing"
	"time"

	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// TestConformance runs the transport conformance suite on db 10, under a
// global key prefix of its own, with the prefetch shared by the queues
// (kombu's) and per queue.
func TestConformance(t *testing.T) {
	for _, perQueue := range []bool{false, true} {
		name := "shared-prefetch"
		if perQueue {
			name = "per-queue-prefetch"
		}
		t.Run(name, func(t *testing.T) { conformance(t, perQueue, false) })
	}
	// The staged pop (Config.StagedPop) must pass the same suite.
	t.Run("staged", func(t *testing.T) { conformance(t, false, true) })
	t.Run("staged-per-queue-prefetch", func(t *testing.T) { conformance(t, true, true) })
}

func conformance(t *testing.T, perQueue, staged bool) {
	e := newEnv(t)
	transporttest.Run(t, func(tb testing.TB) transport.Transport {
		cfg := e.config()
		cfg.Logger = nil
		cfg.StagedPop = staged
		tr, err := Dial(context.Background(), cfg)
		if err != nil {
			tb.Fatalf("Dial: %v", err)
		}
		return tr
	}, transporttest.Features{
		QueuePrefix:      "rt_",
		Priority:         transporttest.PriorityLowerFirstBands,
		ExtraProperties:  true,
		PerQueuePrefetch: perQueue,
		DeadLetterReason: true,
		Topics:           transporttest.TopicPrefix,
		Quiet:            300 * time.Millisecond,
	})
}
