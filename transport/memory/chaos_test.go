package memory_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
)

// TestChaos drives one broker through connections that come and go while
// consumers ack, requeue, drop, dead-letter and hold messages at random,
// and then accounts for every message: exactly one final outcome each
// (acked, dropped or dead), nothing left ready or unacked, and no consumer
// ever past its prefetch.
func TestChaos(t *testing.T) {
	const (
		messages = 2000
		workers  = 4
		prefetch = 5
	)
	b := memory.NewBroker()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	q := []transport.Queue{{Name: "chaos"}, {Name: "chaos2", Arguments: map[string]any{memory.ArgMaxPriority: 3}}}

	var (
		mu       sync.Mutex
		outcome  = map[string]string{}
		problems []string
	)
	final := func(id, what string) {
		mu.Lock()
		defer mu.Unlock()
		if prev, ok := outcome[id]; ok {
			problems = append(problems, fmt.Sprintf("%s: %s after %s", id, what, prev))
		}
		outcome[id] = what
	}
	settled := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(outcome)
	}

	pub := memory.New(memory.Config{Broker: b})
	defer pub.Close()
	go func() {
		for i := range messages {
			m := protocol.Message{Headers: map[string]any{"id": fmt.Sprint(i)}, Properties: protocol.Properties{Priority: i % 5}}
			if err := pub.Publish(ctx, &transport.Publishing{RoutingKey: q[i%2].Name, Message: m}); err != nil {
				t.Errorf("Publish: %v", err)
				return
			}
		}
	}()

	// A lost message would keep the workers going forever: bound the run by
	// progress.
	go func() {
		last := -1
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				if n := settled(); n == last {
					mu.Lock()
					problems = append(problems, fmt.Sprintf("no progress for 10s at %d of %d settled", n, messages))
					mu.Unlock()
					cancel()
				} else {
					last = n
				}
			}
		}
	}()

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			// Each round is one connection's life: it consumes for a while,
			// then stops or closes with deliveries still held.
			for settled() < messages && ctx.Err() == nil {
				tr := memory.New(memory.Config{Broker: b})
				c, err := tr.Consume(ctx, q, transport.ConsumeOptions{Prefetch: prefetch})
				if err != nil {
					t.Errorf("Consume: %v", err)
					tr.Close()
					return
				}
				var held []*transport.Delivery
				for range 10 + rng.IntN(100) {
					var d *transport.Delivery
					select {
					case d = <-c.Deliveries():
					case <-time.After(2 * time.Millisecond):
					}
					if d == nil {
						continue
					}
					if len(held) >= prefetch {
						mu.Lock()
						problems = append(problems, fmt.Sprintf("worker %d holds %d deliveries with prefetch %d", w, len(held)+1, prefetch))
						mu.Unlock()
					}
					id := d.Message.Headers["id"].(string)
					switch r := rng.IntN(100); {
					case r < 60:
						if err := d.Ack(ctx); err == nil {
							final(id, "acked")
						} else {
							t.Errorf("Ack: %v", err)
						}
					case r < 75:
						if err := d.Reject(ctx, true); err != nil {
							t.Errorf("Reject(requeue): %v", err)
						}
					case r < 80:
						if err := d.Reject(ctx, false); err == nil {
							final(id, "dropped")
						} else {
							t.Errorf("Reject: %v", err)
						}
					case r < 85:
						if err := d.DeadLetter(ctx, transport.DeadLetterReason{Reason: "chaos"}); err == nil {
							final(id, "dead")
						} else {
							t.Errorf("DeadLetter: %v", err)
						}
					default:
						held = append(held, d)
					}
					// Settle some held ones late.
					if len(held) > 0 && rng.IntN(4) == 0 {
						d, held = held[0], held[1:]
						if err := d.Ack(ctx); err == nil {
							final(d.Message.Headers["id"].(string), "acked")
						} else {
							t.Errorf("late Ack: %v", err)
						}
					}
				}
				if rng.IntN(2) == 0 {
					// Stop first: held deliveries stay settleable.
					if err := c.Stop(ctx); err != nil {
						t.Errorf("Stop: %v", err)
					}
					for d := range c.Deliveries() {
						held = append(held, d)
					}
					for _, d := range held[:len(held)/2] {
						if err := d.Ack(ctx); err == nil {
							final(d.Message.Headers["id"].(string), "acked")
						} else {
							t.Errorf("Ack after Stop: %v", err)
						}
					}
				}
				// The rest go back to the broker with Close.
				tr.Close()
			}
		})
	}
	wg.Wait()
	cancel()
	for _, p := range problems {
		t.Error(p)
	}
	if got := settled(); got != messages {
		t.Fatalf("%d of %d messages reached a final outcome", got, messages)
	}
	dead := 0
	for _, o := range outcome {
		if o == "dead" {
			dead++
		}
	}
	if s := b.Stats(); s.Ready != 0 || s.Unacked != 0 || s.Dead != dead {
		t.Errorf("broker after the run: %+v; want nothing ready or unacked and %d dead", s, dead)
	}
}
