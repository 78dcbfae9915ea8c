package integration

import (
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestWarmShutdownKeepsHeartbeats: Celery 5.6 fixed a worker that stopped
// answering AMQP heartbeats during its warm shutdown, so that RabbitMQ
// closed the connection under a task still running and the task's ack
// was lost (celery/celery#9986). A celeriac worker with a 2 s heartbeat
// gets a warm shutdown (SIGTERM) while a task sleeps 10 s, over twice the
// broker's give-up time: the connection must live until the task ends,
// the ack must land (nothing left in the queue, ready or unacked), and the
// Python client must read the result written over the same connection
// (rpc://).
func TestWarmShutdownKeepsHeartbeats(t *testing.T) {
	broker := amqpURL(t)
	sep := "?"
	if strings.Contains(broker, "?") {
		sep = "&"
	}
	hbBroker := broker + sep + "heartbeat=2"
	q := itAMQPName(t)
	deleteAMQP(t, q)
	w := startProc(t, "celeriac worker", "./cmd/celeriac", procOptions{Stop: syscall.SIGTERM},
		"worker", "--broker", hbBroker, "--result-backend", "rpc://", "-Q", q, "-c", "1",
		"-n", "hb-"+q+"@%h", "-l", "debug", "--shutdown-timeout", "60s",
		"--without-heartbeat", "--without-mingle", "--without-gossip")

	var wg sync.WaitGroup
	var out string
	wg.Go(func() {
		out = runPython(t, 90*time.Second, map[string]string{"IT_BROKER": broker, "IT_QUEUE": q}, `
import os, celery
app = celery.Celery(broker=os.environ["IT_BROKER"], backend="rpc://")
r = app.send_task("tasks.sleep", args=[10], queue=os.environ["IT_QUEUE"])
print("RESULT", r.get(timeout=80))
`)
	})
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(w.Log(), "task started") {
		if time.Now().After(deadline) {
			t.Fatalf("the task did not start:\n%s", w.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	start := time.Now()
	w.signalAndWait(t, syscall.SIGTERM, 60*time.Second)
	wg.Wait()
	if !strings.Contains(out, "RESULT 10") {
		t.Errorf("the Python client read %q, want RESULT 10", out)
	}
	if took := time.Since(start); took < 5*time.Second {
		t.Errorf("the worker exited %v after SIGTERM: it did not wait for the task (the test proves nothing)", took)
	}
	// A lost connection or a failed ack is logged at warn or error level.
	for _, line := range strings.Split(w.Log(), "\n") {
		if strings.Contains(line, "\tWARN\t") || strings.Contains(line, "\tERROR\t") {
			t.Errorf("worker log during the warm shutdown: %s", line)
		}
	}
	if ready, _ := queueCounts(t, q); ready != 0 {
		t.Errorf("%d messages back in the queue after the warm shutdown: the ack was lost", ready)
	}
}
