package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

func storeState(t testing.TB, b *Backend, id string, st protocol.State, result any) {
	t.Helper()
	meta := &protocol.ResultMeta{TaskID: id, Status: st, Result: result, Children: []any{}}
	if st.Ready() {
		meta.DateDone = time.Now().UTC()
	}
	if err := b.Store(context.Background(), backend.StoreRequest{Meta: meta}); err != nil {
		t.Fatal(err)
	}
}

// TestWait: Wait returns a result stored before it subscribed, and wakes on
// the PUBLISH of one stored while it waits, skipping states that are not
// ready; a cancelled context ends it.
func TestWait(t *testing.T) {
	b, _ := newTest(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	storeState(t, b, "early", protocol.StateSuccess, int64(1))
	if m, err := b.Wait(ctx, "early"); err != nil || m.Result != int64(1) {
		t.Fatalf("Wait(early) = %v, %v", m, err)
	}

	got := make(chan *protocol.ResultMeta, 1)
	errc := make(chan error, 1)
	go func() {
		m, err := b.Wait(ctx, "late")
		got <- m
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond) // let it subscribe; a store before that is found by its read
	storeState(t, b, "late", protocol.StateStarted, nil)
	storeState(t, b, "late", protocol.StateRetry, nil)
	select {
	case m := <-got:
		t.Fatalf("Wait returned %s before the task was ready", m.Status)
	case <-time.After(100 * time.Millisecond):
	}
	storeState(t, b, "late", protocol.StateFailure, &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"x"}})
	if m := <-got; m == nil || m.Status != protocol.StateFailure {
		t.Fatalf("Wait(late) = %v, %v", m, <-errc)
	}

	short, stop := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer stop()
	if _, err := b.Wait(short, "never"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait(never) = %v, want the context's deadline", err)
	}
}

// BenchmarkWaitWake measures how long after a store (its PUBLISH) a
// waiting Wait returns: the wake-up latency of a Go caller's .get().
func BenchmarkWaitWake(b *testing.B) {
	be, _ := newTest(b, Config{})
	ctx := context.Background()
	var total time.Duration
	for i := 0; i < b.N; i++ {
		id := "wake-" + protocol.Repr(i)
		ready := make(chan struct{})
		woke := make(chan time.Time, 1)
		go func() {
			sub := be.client.Subscribe(ctx, be.TaskKey(id)) // a second subscriber: says when Wait's is in place
			defer sub.Close()
			_, _ = sub.Receive(ctx)
			close(ready)
			_, _ = be.Wait(ctx, id)
			woke <- time.Now()
		}()
		<-ready
		time.Sleep(time.Millisecond)
		start := time.Now()
		storeState(b, be, id, protocol.StateSuccess, int64(i))
		total += (<-woke).Sub(start)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-wake/op")
}
