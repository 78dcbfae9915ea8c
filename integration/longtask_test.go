package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// longTask is longer than the worker's 30 s settle budget: before the
// budget was per step, every result, retry, chain step and ack after such a
// task failed with "context deadline exceeded" and Python's .get() waited
// forever.
const longTask = 35 * time.Second

// TestWorkerLongTasks: Python Celery sends 35 s tasks to a celeriac worker
// on both brokers, with early acks and with acks_late (all four run side by
// side). Each result reaches .get(): a success, a FAILURE, a retry with a
// countdown that runs again, and a chain step after the long task. With
// acks_late each task runs exactly once (the retry twice), and once the
// worker has stopped nothing is left on the queue, so nothing was left
// unacknowledged.
func TestWorkerLongTasks(t *testing.T) {
	for _, bc := range workerBrokers(t) {
		for _, acksLate := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/acks_late=%t", bc.name, acksLate), func(t *testing.T) {
				t.Parallel()
				testLongTasks(t, bc, acksLate)
			})
		}
	}
}

func testLongTasks(t *testing.T, bc brokerCase, acksLate bool) {
	q := uniqueQueue(t, bc)
	var mu sync.Mutex
	runs := map[string]int{}
	gw := startGoWorker(t, bc, q, worker.Config{Concurrency: 4, AcksLate: acksLate}, func(m *worker.Mux) {
		m.HandleFunc("tasks.long", func(ctx context.Context, task *worker.Task) (any, error) {
			var mode string
			if err := task.Bind(&mode); err != nil {
				return nil, err
			}
			mu.Lock()
			runs[mode]++
			mu.Unlock()
			if mode == "retry" && task.Retries > 0 {
				return "done again", nil
			}
			select {
			case <-time.After(longTask):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			switch mode {
			case "fail":
				return nil, worker.NewException("ValueError", "slow failure")
			case "retry":
				return nil, retry.After(2*time.Second, fmt.Errorf("try again"))
			}
			return "done " + mode, nil
		})
	})
	pyClient(t, bc, q, `
long = app.signature("tasks.long")
t0 = time.time()
ok = long.clone(args=("ok",)).apply_async()
bad = long.clone(args=("fail",)).apply_async()
again = long.clone(args=("retry",)).apply_async()
chained = chain(long.clone(args=("chain",)), echo.s()).apply_async()
assert ok.get(timeout=100) == "done ok", ok.state
assert time.time() - t0 >= 34, time.time() - t0
try:
    bad.get(timeout=100)
    raise SystemExit("the failing task did not fail")
except ValueError as e:
    assert str(e) == "slow failure", repr(e)
assert bad.state == "FAILURE", bad.state
assert again.get(timeout=100) == "done again", again.state
got = chained.get(timeout=100)
assert got["args"] == ["done chain"], got
print("OK")
`)
	mu.Lock()
	want := map[string]int{"ok": 1, "fail": 1, "retry": 2, "chain": 1}
	if fmt.Sprint(runs) != fmt.Sprint(want) {
		t.Errorf("runs by mode %v, want %v (each once, the retry twice)", runs, want)
	}
	mu.Unlock()
	// Stop the worker and close its connection: a message it left
	// unacknowledged would now be back on the queue.
	gw.stop(t)
	gw.conn.Close()
	if n := queueLen(t, bc, q); n != 0 {
		t.Errorf("%d messages on %s after the worker stopped, want 0: something was left unacknowledged", n, q)
	}
}

// queueLen reads a queue's length through a fresh connection.
func queueLen(t *testing.T, bc brokerCase, q string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := connect.Open(ctx, connect.Options{BrokerURL: bc.broker, ConnectionName: "it-len-" + q})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin, ok := conn.Transport.(transport.Admin)
	if !ok {
		t.Fatalf("%s transport has no Admin", bc.name)
	}
	n, err := admin.Len(ctx, q)
	if err != nil && !strings.Contains(err.Error(), "NOT_FOUND") {
		t.Fatal(err)
	}
	return n
}
