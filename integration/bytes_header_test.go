package integration

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/worker"
)

// TestAMQPBytesHeaderRoundTrip: py-amqp writes a Python bytes header as an
// AMQP long string ('S'), and reads back as bytes one that is not valid
// UTF-8 (as str one that is). Such a header reaches the Go handler as
// []byte, and the retry celeriac publishes carries it so that Python reads
// the same bytes again (golden bytes_header.amqp.json and
// result_rpc_reqinfo_bytes.amqp.json: what a Python worker sees).
func TestAMQPBytesHeaderRoundTrip(t *testing.T) {
	bc := brokerCase{"rabbitmq", amqpURL(t), redisDBURL(t, workerRedisDB)}
	q := uniqueQueue(t, bc)
	var (
		mu    sync.Mutex
		seen  map[string]any
		first = make(chan struct{})
	)
	gw := startGoWorker(t, bc, q, worker.Config{Concurrency: 1}, func(m *worker.Mux) {
		m.HandleFunc("hdr.see", func(ctx context.Context, t *worker.Task) (any, error) {
			mu.Lock()
			defer mu.Unlock()
			if seen == nil {
				seen = t.Headers
				close(first)
			}
			// Held by the worker until it stops, then back in the queue
			// for Python to read.
			return nil, retry.After(time.Hour, errors.New("to the queue"))
		})
	})
	runPython(t, time.Minute, pyClientEnv(bc, q), pyClientPrelude+`
app.signature("hdr.see").apply_async(headers={"x-bin": b"\xff\x00raw", "x-utf8": b"ok"})
`)
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the Go handler did not run")
	}
	gw.stop(t) // the retry was confirmed before the original was acked
	mu.Lock()
	bin, _ := seen["x-bin"].([]byte)
	utf8, _ := seen["x-utf8"].(string)
	mu.Unlock()
	if string(bin) != "\xff\x00raw" || utf8 != "ok" {
		t.Errorf("handler saw x-bin %#v (%T), x-utf8 %#v (%T); want []byte(\"\\xff\\x00raw\") and \"ok\"",
			seen["x-bin"], seen["x-bin"], seen["x-utf8"], seen["x-utf8"])
	}
	out := runPython(t, time.Minute, pyClientEnv(bc, q), pyClientPrelude+`
import time
with app.connection_for_read() as conn:
    deadline = time.time() + 30
    while True:
        m = conn.default_channel.basic_get(app.conf.task_default_queue, no_ack=True)
        if m is not None or time.time() > deadline:
            break
        time.sleep(0.05)
    h = m.headers
    print(h["retries"], type(h["x-bin"]).__name__, repr(h["x-bin"]), type(h["x-utf8"]).__name__, repr(h["x-utf8"]))
`)
	if got, want := strings.TrimSpace(out), `1 bytes b'\xff\x00raw' str 'ok'`; got != want {
		t.Errorf("python read the retry's headers as %q, want %q", got, want)
	}
}
