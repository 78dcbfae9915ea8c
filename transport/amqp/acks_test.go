package amqp

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/transport"
)

// TestTagLedgerModel settles the tags 1..n in random batches of acks and
// single rejects, in random order, and checks every multiple ack against a
// plain set of settled tags: it may cover only tags that are settled or in
// its batch, each ack of the batch is sent exactly once (by the multiple
// ack or on its own), and the ledger holds no more runs than there are unsettled tags.
func TestTagLedgerModel(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 7))
		n := 1 + r.IntN(500)
		order := r.Perm(n)
		var l tagLedger
		l.low = 1
		settled := make([]bool, n+2) // by tag
		acked := make([]int, n+2)    // times each tag is covered by an ack frame
		rejected := make([]bool, n+2)
		for len(order) > 0 {
			k := min(len(order), 1+r.IntN(8))
			if r.IntN(5) == 0 {
				// A reject, recorded once its frame is written.
				tag := uint64(order[0] + 1)
				order = order[1:]
				rejected[tag] = true
				settled[tag] = true
				l.add(tag)
				continue
			}
			q := make([]uint64, k)
			for i, o := range order[:k] {
				q[i] = uint64(o + 1)
			}
			order = order[k:]
			slices.Sort(q)
			in := map[uint64]bool{}
			for _, tag := range q {
				in[tag] = true
			}
			upto, rest := l.coalesce(slices.Clone(q))
			if upto != 0 {
				if !in[upto] {
					t.Fatalf("seed %d: multiple ack of %d, not in the batch %v", seed, upto, q)
				}
				// What RabbitMQ does: every outstanding tag up to upto.
				for tag := uint64(1); tag <= upto; tag++ {
					switch {
					case in[tag]:
						acked[tag]++
					case !settled[tag]:
						t.Fatalf("seed %d: multiple ack of %d covers outstanding tag %d", seed, upto, tag)
					}
				}
			}
			for _, tag := range rest {
				if upto != 0 && tag <= upto {
					t.Fatalf("seed %d: tag %d acked by the multiple ack of %d and on its own", seed, tag, upto)
				}
				acked[tag]++
			}
			for _, tag := range q {
				settled[tag] = true
			}
			// Runs are separated by unsettled tags.
			if len(l.runs) > len(order) {
				t.Fatalf("seed %d: %d runs with %d tags unsettled", seed, len(l.runs), len(order))
			}
		}
		for tag := 1; tag <= n; tag++ {
			if want := map[bool]int{true: 0, false: 1}[rejected[tag]]; acked[tag] != want {
				t.Fatalf("seed %d: tag %d acked %d times, want %d", seed, tag, acked[tag], want)
			}
		}
		if l.low != uint64(n+1) || len(l.runs) != 0 {
			t.Fatalf("seed %d: everything settled, ledger low %d runs %v", seed, l.low, l.runs)
		}
	}
}

// TestTagLedgerHeld keeps tag 1 unsettled while 100 000 later tags settle:
// the ledger holds one run, not one entry a tag, and nothing is acked with
// multiple past the held tag until it settles.
func TestTagLedgerHeld(t *testing.T) {
	var l tagLedger
	l.low = 1
	for tag := uint64(2); tag <= 100_001; tag++ {
		if upto, _ := l.coalesce([]uint64{tag}); upto != 0 {
			t.Fatalf("multiple ack of %d past the held tag 1", upto)
		}
	}
	if len(l.runs) != 1 || l.runs[0] != (tagRun{2, 100_001}) {
		t.Fatalf("runs %v", l.runs)
	}
	if upto, rest := l.coalesce([]uint64{1}); upto != 1 || len(rest) != 0 || l.low != 100_002 || len(l.runs) != 0 {
		t.Fatalf("upto %d rest %v low %d runs %v", upto, rest, l.low, l.runs)
	}
}

// TestAcksCoalescedWithRejects settles 3 000 deliveries from 64 goroutines
// at once, so that acks are written in batches with multiple set, while
// every 7th delivery is rejected (dropped) and every 11th requeued (and
// acked when it comes back). A multiple ack that reached an outstanding
// delivery, or a tag settled twice, would make RabbitMQ close the channel
// (PRECONDITION_FAILED: unknown delivery tag): every settlement must
// succeed, nothing may stay in the queue, and the channel must never have
// been reopened.
func TestAcksCoalescedWithRejects(t *testing.T) {
	t.Run("classic", func(t *testing.T) { testAcksCoalesced(t, nil) })
	// Quorum queues take per-consumer QoS, and requeue with a delivery
	// count.
	t.Run("quorum", func(t *testing.T) { testAcksCoalesced(t, amqp091.Table{"x-queue-type": "quorum"}) })
}

func testAcksCoalesced(t *testing.T, args amqp091.Table) {
	h := newHarness(t, Config{})
	q := h.q("coalesce")
	a := newAdmin(t)
	a.cleanup([]string{q}, []string{q})
	a.declare(q, args)
	const n = 3000
	preload(t, q, n)
	ctx := context.Background()
	c, err := h.tr.Consume(ctx, []transport.Queue{{Name: q, Arguments: args}}, transport.ConsumeOptions{Prefetch: 256})
	if err != nil {
		t.Fatal(err)
	}
	var acked, dropped atomic.Int64
	slots := make(chan struct{}, 64)
	var wg sync.WaitGroup
	deadline := time.Now().Add(waitBound)
	for seen := 0; acked.Load()+dropped.Load() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d acked, %d dropped, %d deliveries seen", acked.Load(), n, dropped.Load(), seen)
		}
		var d *transport.Delivery
		select {
		case d = <-c.Deliveries():
		case <-time.After(10 * time.Millisecond):
			continue
		}
		seen++
		k := seen
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			var err error
			switch {
			case k <= n && k%7 == 0:
				if err = d.Reject(ctx, false); err == nil {
					dropped.Add(1)
				}
			case k <= n && k%11 == 0:
				err = d.Reject(ctx, true)
			default:
				var wait func(context.Context) error
				if wait, err = d.AckAsync(ctx); err == nil {
					err = wait(ctx)
				}
				if err == nil {
					acked.Add(1)
				}
			}
			if err != nil {
				t.Errorf("delivery %d (tag %s): %v", k, d.Tag, err)
			}
		})
	}
	wg.Wait()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := a.ready(q); n != 0 {
		t.Errorf("%d messages left in the queue", n)
	}
	if m := h.logs.FilterMessageSnippet("channel closed").Len(); m != 0 {
		t.Errorf("the consumer's channel was closed %d times", m)
	}
}
