package integration

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap/zaptest"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/rpc"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// The Go caller's side of rpc:// (backend/rpc's Client): Go sends tasks
// with reply_to = the client's queue, a worker (Python Celery 5.2, or
// celeriac) sends the states there, and client.AsyncResult.Get returns as
// the reply arrives. On RabbitMQ the reply queue is Celery's transient
// queue; on Redis (db 14, the result backends' db) the list workers LPUSH
// to.

// rpcBrokers are the brokers of the rpc:// tests, with the queue kind the
// client must find on each.
func rpcBrokers(t *testing.T) []struct {
	bc   brokerCase
	kind rpc.QueueKind
} {
	return []struct {
		bc   brokerCase
		kind rpc.QueueKind
	}{
		{brokerCase{name: "rabbitmq", broker: amqpURL(t), backend: "rpc://"}, rpc.TransientQueue},
		{brokerCase{name: "redis", broker: redisDBURL(t, backendDB), backend: "rpc://"}, rpc.ListQueue},
	}
}

// openRPCClient connects to the broker and opens an rpc.Client on it; both
// are closed when the test ends.
func openRPCClient(t *testing.T, bc brokerCase, want rpc.QueueKind) (*rpc.Client, transport.Transport) {
	t.Helper()
	ctx := t.Context()
	conn, err := connect.Open(ctx, connect.Options{BrokerURL: bc.broker, Logger: zaptest.NewLogger(t), ConnectionName: "it-rpcwait"})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	start := time.Now()
	c, err := rpc.NewClient(ctx, conn.Transport, rpc.ClientConfig{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Logf("reply queue %s (%v) ready after %v", c.ReplyTo(), c.Kind(), time.Since(start))
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if connect.Scheme(bc.broker) == "redis" {
			deleteRedisReplyQueue(t, bc.broker, c.ReplyTo())
		}
	})
	if c.Kind() != want {
		t.Fatalf("Kind() = %v, want %v", c.Kind(), want)
	}
	return c, conn.Transport
}

// checkRPCResults sends tasks to queue with reply_to = c's queue and checks
// what Get returns: values, a failure, a retried task, and results that
// arrive before anyone waits for them.
func checkRPCResults(t *testing.T, c *rpc.Client, tr transport.Transport, queue string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cl := client.New(tr, client.Config{Backend: c, DefaultQueue: queue}) // reply_to = c.ReplyTo()
	send := func(name string, args ...any) *client.AsyncResult {
		t.Helper()
		r, err := cl.Send(ctx, name, args, nil)
		if err != nil {
			t.Fatalf("send %s: %v", name, err)
		}
		return r
	}

	if v, err := send("tasks.add", 2, 3).Get(ctx); err != nil || v != int64(5) {
		t.Fatalf("add(2, 3) = %v, %v", v, err)
	}
	_, err := send("tasks.fail", "rpc boom").Get(ctx)
	var te *client.TaskError
	if !errors.As(err, &te) || te.Type != "ValueError" || te.Message() != "rpc boom" || te.Traceback == "" {
		t.Fatalf("fail() = %v, want ValueError: rpc boom with a traceback", err)
	}
	// A RETRY state comes first; Get waits for the SUCCESS.
	if v, err := send("tasks.flaky", 1).Get(ctx); err != nil || v != "succeeded after 1 retries" {
		t.Fatalf("flaky(1) = %v, %v", v, err)
	}
	// Most of these results arrive before their Get, which finds them kept.
	rs := make([]*client.AsyncResult, 20)
	for i := range rs {
		rs[i] = send("tasks.add", i, i)
	}
	for i := len(rs) - 1; i >= 0; i-- {
		if v, err := rs[i].Get(ctx); err != nil || v != int64(2*i) {
			t.Fatalf("add(%d, %d) = %v, %v", i, i, v, err)
		}
	}
	if st, err := rs[0].State(ctx); err != nil || st != protocol.StateSuccess {
		t.Errorf("State() = %v, %v", st, err)
	}
}

// TestRPCWaitPythonWorker: a Python Celery worker with result_backend =
// "rpc://" runs the tasks; the Go client's Get wakes on its replies.
func TestRPCWaitPythonWorker(t *testing.T) {
	for _, b := range rpcBrokers(t) {
		t.Run(b.bc.name, func(t *testing.T) {
			q := uniqueQueue(t, b.bc)
			env := map[string]string{"IT_BROKER": pyBrokerURL(b.bc.broker), "IT_BACKEND": "rpc://", "IT_QUEUE": q}
			startPythonWorker(t, env, "it_cli_app", "-Q", q, "-n", "rpcwait-"+q+"@%h", "-P", "threads", "-c", "4",
				"--without-mingle", "--without-gossip", "--without-heartbeat")
			c, tr := openRPCClient(t, b.bc, b.kind)
			checkRPCResults(t, c, tr, q)
		})
	}
}

// TestRPCWaitCeleriacWorker: the same with a celeriac worker whose result
// backend is rpc://.
func TestRPCWaitCeleriacWorker(t *testing.T) {
	for _, b := range rpcBrokers(t) {
		t.Run(b.bc.name, func(t *testing.T) {
			q := uniqueQueue(t, b.bc)
			// The demo tasks: tasks.flaky retries after 1 s, as Python's.
			startGoWorker(t, b.bc, q, worker.Config{Concurrency: 4}, nil)
			c, tr := openRPCClient(t, b.bc, b.kind)
			checkRPCResults(t, c, tr, q)
		})
	}
}

// TestRPCWaitReplyQueue: on RabbitMQ the reply queue is declared as Celery
// 5.2's client declares it (non-durable, auto-delete, x-expires =
// result_expires) and is gone once the client closes.
func TestRPCWaitReplyQueue(t *testing.T) {
	url := amqpURL(t)
	conn, err := connect.Open(t.Context(), connect.Options{BrokerURL: url, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, err := rpc.NewClient(t.Context(), conn.Transport, rpc.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ac, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	declare := func(durable, autoDelete bool, args amqp091.Table) error {
		ch, err := ac.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		_, err = ch.QueueDeclare(c.ReplyTo(), durable, autoDelete, false, false, args)
		return err
	}
	// An equivalent declaration is accepted, any other refused.
	if err := declare(false, true, amqp091.Table{"x-expires": int64(86400000)}); err != nil {
		t.Errorf("Celery's declaration of the reply queue: %v", err)
	}
	if err := declare(true, true, amqp091.Table{"x-expires": int64(86400000)}); err == nil {
		t.Error("the reply queue is durable")
	}
	if err := declare(false, true, nil); err == nil {
		t.Error("the reply queue has no x-expires")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	ch, err := ac.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(c.ReplyTo(), false, true, false, false, nil); err == nil {
		t.Errorf("reply queue %s still exists after Close", c.ReplyTo())
		_, _ = ch.QueueDelete(c.ReplyTo(), false, false, false)
	}
}

// BenchmarkRPCWaitWake measures how long after a worker starts sending a
// task's SUCCESS (rpc.Backend.Store: publish and the broker's answer) the
// client's blocked Wait returns, on both brokers.
func BenchmarkRPCWaitWake(b *testing.B) {
	for _, bc := range []brokerCase{
		{name: "rabbitmq", broker: amqpURL(b)},
		{name: "redis", broker: redisDBURL(b, backendDB)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			conn, err := connect.Open(ctx, connect.Options{BrokerURL: bc.broker, ResultBackend: "rpc://"})
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			c, err := rpc.NewClient(ctx, conn.Transport, rpc.ClientConfig{})
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				_ = c.Close()
				if bc.name == "redis" {
					deleteRedisReplyQueue(b, bc.broker, c.ReplyTo())
				}
			}()
			var total time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id := "it_backend_wake_" + strconv.Itoa(i)
				woke := make(chan time.Time, 1)
				go func() {
					_, _ = c.Wait(ctx, id)
					woke <- time.Now()
				}()
				time.Sleep(time.Millisecond) // let the Wait block
				start := time.Now()
				err := conn.Backend.Store(ctx, backend.StoreRequest{
					Meta:    &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess, Result: int64(i), Children: []any{}},
					ReplyTo: c.ReplyTo(), CorrelationID: id,
				})
				if err != nil {
					b.Fatal(err)
				}
				total += (<-woke).Sub(start)
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-wake/op")
		})
	}
}

// deleteRedisReplyQueue deletes what a ListQueue client leaves on Redis:
// the list (empty unless a reply came after Close) and the binding set
// Consume added, as kombu keeps a task queue's binding.
func deleteRedisReplyQueue(t testing.TB, url, q string) {
	opt, err := goredis.ParseURL(url)
	if err != nil {
		t.Errorf("redis url: %v", err)
		return
	}
	rdb := goredis.NewClient(opt)
	defer rdb.Close()
	n, err := rdb.Del(context.Background(), q, "_kombu.binding."+q).Result()
	if err != nil {
		t.Errorf("delete reply queue %s: %v", q, err)
	}
	if n != 1 {
		t.Errorf("deleted %d keys of reply queue %s, want 1 (the binding set; the list was purged)", n, q)
	}
}
