package transporttest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/celeriac/celeriac/transport"
)

func concurrencyTests() []testCase {
	return []testCase{
		{"ManyPublishersAndConsumers", testManyPublishersAndConsumers},
	}
}

// testManyPublishersAndConsumers: four publishers and three consumers on
// two connections move Features.Messages messages through two queues, all
// acked at once; every message arrives exactly once.
func testManyPublishersAndConsumers(t *testing.T, e *env) {
	const (
		publishers = 4
		prefetch   = 10
	)
	n := e.f.Messages
	tr1, tr2 := e.transport(), e.transport()
	q1, q2 := e.queue(), e.queue()
	queues := []transport.Queue{{Name: q1}, {Name: q2}}
	e.declare(tr1, queues...)
	consumers := []transport.Consumer{
		e.consume(tr1, prefetch, queues...),
		e.consume(tr2, prefetch, queues...),
		e.consume(tr2, prefetch, queues[1]),
	}

	var (
		mu       sync.Mutex
		seen     = make(map[string]int, n)
		received int
		problems []string
	)
	allIn := make(chan struct{})
	finish := make(chan struct{})
	var wg sync.WaitGroup
	for ci, c := range consumers {
		wg.Go(func() {
			for {
				select {
				case <-finish:
					return
				case d, ok := <-c.Deliveries():
					if !ok {
						mu.Lock()
						problems = append(problems, fmt.Sprintf("consumer %d: Deliveries closed early (Err: %v)", ci, c.Err()))
						mu.Unlock()
						return
					}
					if err := d.Ack(e.ctx); err != nil {
						mu.Lock()
						problems = append(problems, fmt.Sprintf("consumer %d: Ack(%s): %v", ci, msgID(d.Message), err))
						mu.Unlock()
					}
					mu.Lock()
					seen[msgID(d.Message)]++
					received++
					if received == n {
						close(allIn)
					}
					mu.Unlock()
				}
			}
		})
	}
	for p := range publishers {
		tr := tr1
		if p%2 == 1 {
			tr = tr2
		}
		wg.Go(func() {
			for i := p; i < n; i += publishers {
				q := queues[i%2].Name
				if err := tr.Publish(e.ctx, &transport.Publishing{RoutingKey: q, Message: msg(fmt.Sprintf("c-%05d", i))}); err != nil {
					mu.Lock()
					problems = append(problems, fmt.Sprintf("publisher %d: %v", p, err))
					mu.Unlock()
					return
				}
			}
		})
	}

	// Progress, not total time, bounds the wait: a slow broker is fine, a
	// stuck one is not.
	last := -1
	for done := false; !done; {
		select {
		case <-allIn:
			done = true
		case <-time.After(e.f.Timeout):
			mu.Lock()
			r := received
			mu.Unlock()
			if r == last {
				close(finish)
				wg.Wait()
				t.Fatalf("stuck: %d of %d messages received, none in the last %v; problems: %v", r, n, e.f.Timeout, problems)
			}
			last = r
		}
	}
	for _, c := range consumers {
		e.none(c, "every message was received")
	}
	close(finish)
	wg.Wait()
	for _, p := range problems {
		t.Error(p)
	}
	if len(seen) != n {
		t.Errorf("%d distinct messages received, want %d", len(seen), n)
	}
	for id, k := range seen {
		if k != 1 {
			t.Errorf("message %s received %d times", id, k)
		}
	}
}
