package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/examples/demotasks"
	"github.com/celeriac/celeriac/transport/transporttest"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// Redis db 1 and queue names starting with cli_ are this package's own.
const testDB = 1

// waitBound (dlq_test.go) bounds the waits, and TestMain there checks for
// leaked goroutines.

// syncBuffer is a bytes.Buffer that a worker's goroutines may write while
// the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// result is one celeriac invocation.
type result struct {
	code           int
	stdout, stderr string
}

// run executes the command line in-process with the demo tasks, as the
// celeriac command does, and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	mux := worker.NewMux()
	demotasks.Register(mux)
	return Run(ctx, mux, args, Output(stdout, stderr))
}

// celeriac runs the command line in-process.
func celeriac(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	var out, errb syncBuffer
	code := run(ctx, args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

func (r result) String() string {
	return "exit " + strconv.Itoa(r.code) + "\nstdout:\n" + r.stdout + "\nstderr:\n" + r.stderr
}

// bgWorker is `celeriac worker` running in-process.
type bgWorker struct {
	cancel context.CancelFunc
	done   chan int
	logs   *syncBuffer
	code   int
}

// startWorker runs `celeriac worker args...` until the test ends (or Stop).
func startWorker(t *testing.T, args ...string) *bgWorker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &bgWorker{cancel: cancel, done: make(chan int, 1), logs: &syncBuffer{}, code: -1}
	go func() { w.done <- run(ctx, append([]string{"worker"}, args...), &syncBuffer{}, w.logs) }()
	t.Cleanup(func() {
		w.Stop(t)
		if t.Failed() {
			t.Logf("worker log:\n%s", w.logs.String())
		}
	})
	return w
}

// Stop cancels the worker (a warm shutdown) and returns its exit code.
func (w *bgWorker) Stop(t *testing.T) int {
	t.Helper()
	if w.cancel == nil {
		return w.code
	}
	w.cancel()
	w.cancel = nil
	select {
	case w.code = <-w.done:
	case <-time.After(waitBound):
		t.Fatalf("worker did not stop:\n%s", w.logs.String())
	}
	return w.code
}

// waitLog waits until the worker's log contains s.
func (w *bgWorker) waitLog(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for !strings.Contains(w.logs.String(), s) {
		select {
		case code := <-w.done:
			w.done <- code
			t.Fatalf("worker exited (%d) before logging %q:\n%s", code, s, w.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker did not log %q:\n%s", s, w.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// brokerCase is a broker URL with the result backend the tests use with it.
type brokerCase struct {
	name, broker, backend string
}

// brokers returns Redis (db 1) and RabbitMQ, both with the Redis result
// backend on db 1.
func brokers(t *testing.T) []brokerCase {
	redis := transporttest.RedisURL(t, testDB)
	return []brokerCase{
		{"redis", redis, redis},
		{"rabbitmq", transporttest.AMQPURL(t), redis},
	}
}

func eachBroker(t *testing.T, f func(t *testing.T, bc brokerCase)) {
	for _, bc := range brokers(t) {
		t.Run(bc.name, func(t *testing.T) { f(t, bc) })
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// uniqueQueue returns a queue name of this package's own and deletes the
// queue when the test ends.
func uniqueQueue(t *testing.T, bc brokerCase) string {
	t.Helper()
	q := "cli_" + randHex(6)
	t.Cleanup(func() { deleteQueue(bc, q) })
	return q
}

func deleteQueue(bc brokerCase, q string) {
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	conn, err := connect.Open(ctx, connect.Options{BrokerURL: bc.broker})
	if err != nil {
		return
	}
	defer conn.Close()
	if d, ok := conn.Transport.(interface {
		DeleteQueue(context.Context, string) error
	}); ok {
		_ = d.DeleteQueue(ctx, q)
		return
	}
	if p, ok := conn.Transport.(interface {
		Purge(context.Context, string) (int, error)
	}); ok {
		_, _ = p.Purge(ctx, q)
	}
	// kombu's binding of the queue to its exchange.
	if opt, err := goredis.ParseURL(bc.broker); err == nil {
		rdb := goredis.NewClient(opt)
		defer rdb.Close()
		rdb.Del(ctx, "_kombu.binding."+q)
	}
}

func timeAfter(d time.Duration) <-chan time.Time { return time.After(d) }

// waitPong waits until node answers a ping.
func waitPong(t *testing.T, bc brokerCase, node string) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for {
		r := celeriac(t, "-b", bc.broker, "inspect", "ping", "-d", node, "-t", "0.5")
		if r.code == exitOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer:\n%s", node, r)
		}
	}
}
