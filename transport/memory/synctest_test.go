package memory_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
)

// TestInsideSynctestBubble: the worker tests time-dependent behaviour (ETA,
// backoff, shutdown timeouts) with testing/synctest, so the transport must
// work inside a bubble: its goroutines block durably on channels, and it
// reads the bubble's fake clock. synctest.Wait also makes "nothing more is
// delivered" an exact check instead of a timed one.
func TestInsideSynctestBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		c, err := tr.Consume(t.Context(), []transport.Queue{{Name: "q"}}, transport.ConsumeOptions{Prefetch: 1})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		time.Sleep(time.Hour)
		for _, id := range []string{"a", "b"} {
			if err := tr.Publish(t.Context(), &transport.Publishing{RoutingKey: "q", Message: message(id, 0)}); err != nil {
				t.Fatal(err)
			}
		}
		d := <-c.Deliveries()
		if got := d.ReceivedAt.Sub(start); got != time.Hour {
			t.Errorf("ReceivedAt is %v after the start, want the bubble's 1h", got)
		}
		synctest.Wait()
		select {
		case d := <-c.Deliveries():
			t.Fatalf("delivery %s past the prefetch", id(d))
		default:
		}
		if err := d.Ack(t.Context()); err != nil {
			t.Fatal(err)
		}
		if d := <-c.Deliveries(); id(d) != "b" {
			t.Errorf("got %s, want b", id(d))
		}
		if err := c.Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}
