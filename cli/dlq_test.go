package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/transporttest"
	"github.com/celeriac/celeriac/worker/connect"
)

// redisDB is the Redis database of the dlq command tests (the retries
// scope's db); queue names start with rt6_.
const redisDB = 5

// waitBound bounds every wait for a broker: a guard against hangs, never
// an assertion about speed.
const waitBound = 60 * time.Second

func TestMain(m *testing.M) {
	if os.Getenv("CELERIAC_FAKE_WORKER") != "" {
		fakeWorker() // the test binary as multi's worker (multi_test.go)
		return
	}
	goleak.VerifyTestMain(m)
}

// cli runs the celeriac command line in-process and returns its output and
// exit code.
func cli(t *testing.T, a ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(t.Context(), append([]string{"--loglevel", "error"}, a...), &out, &errb)
	return out.String(), errb.String(), code
}

// mustCLI runs the command line and fails the test unless it exits 0.
func mustCLI(t *testing.T, a ...string) string {
	t.Helper()
	out, errs, code := cli(t, a...)
	if code != exitOK {
		t.Fatalf("celeriac %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(a, " "), code, out, errs)
	}
	return out
}

// dlqEnv is one broker with a task queue of the test's own.
type dlqEnv struct {
	t      *testing.T
	broker string
	queue  string
	conn   *connect.Conn
	store  transport.DeadLetterStore
	qargs  map[string]any // declaration arguments of the task queue
}

func newDLQEnv(t *testing.T, broker string) *dlqEnv {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	e := &dlqEnv{t: t, broker: broker, queue: "rt6_cli_" + hex.EncodeToString(b)}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	conn, err := connect.Open(ctx, connect.Options{BrokerURL: broker, ConnectionName: e.queue})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	e.conn = conn
	e.store = conn.Transport.(transport.DeadLetterStore)
	t.Cleanup(func() {
		conn.Close()
		e.deleteAll()
	})
	return e
}

// deleteAll removes everything the test created on the broker.
func (e *dlqEnv) deleteAll() {
	q := e.queue
	switch connect.Scheme(e.broker) {
	case "amqp":
		conn, err := amqp091.Dial(e.broker)
		if err != nil {
			e.t.Errorf("cleanup: %v", err)
			return
		}
		defer conn.Close()
		for _, name := range []string{q, q + ".dlq"} {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(name, false, false, false)
				_ = ch.Close()
			}
		}
		for _, name := range []string{q, q + ".dlx"} {
			if ch, err := conn.Channel(); err == nil {
				_ = ch.ExchangeDelete(name, false, false)
				_ = ch.Close()
			}
		}
	case "redis":
		rdb := e.redis()
		defer rdb.Close()
		ctx := context.Background()
		keys, _ := rdb.Keys(ctx, "*"+q+"*").Result()
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	}
}

func (e *dlqEnv) redis() *goredis.Client {
	opt, err := goredis.ParseURL(e.broker)
	if err != nil {
		e.t.Fatal(err)
	}
	return goredis.NewClient(opt)
}

func (e *dlqEnv) ctx() context.Context {
	ctx, cancel := context.WithTimeout(e.t.Context(), waitBound)
	e.t.Cleanup(cancel)
	return ctx
}

// declare declares the task queue with its arguments, as a worker does when
// it starts consuming. Publishing first would declare it without them.
func (e *dlqEnv) declare() {
	e.t.Helper()
	c, err := e.conn.Transport.Consume(e.ctx(), []transport.Queue{{Name: e.queue, Arguments: e.qargs}}, transport.ConsumeOptions{Prefetch: 1})
	if err != nil {
		e.t.Fatalf("declare %s: %v", e.queue, err)
	}
	if err := c.Stop(e.ctx()); err != nil {
		e.t.Fatal(err)
	}
}

// publish sends task messages with the given ids (retries 2) to the queue.
func (e *dlqEnv) publish(ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		m, err := protocol.EncodeTask(&protocol.TaskMessage{
			ID: id, Name: "rt6.charge", Args: []any{id}, Kwargs: map[string]any{}, Retries: 2,
		}, protocol.EncodeOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		if err := e.conn.Transport.Publish(e.ctx(), &transport.Publishing{RoutingKey: e.queue, Message: *m}); err != nil {
			e.t.Fatalf("publish %s: %v", id, err)
		}
	}
}

// consume receives n messages from the queue and settles each with fn.
func (e *dlqEnv) consume(n int, fn func(d *transport.Delivery) error) []*transport.Delivery {
	e.t.Helper()
	ctx := e.ctx()
	c, err := e.conn.Transport.Consume(ctx, []transport.Queue{{Name: e.queue, Arguments: e.qargs}}, transport.ConsumeOptions{Prefetch: n})
	if err != nil {
		e.t.Fatalf("consume: %v", err)
	}
	defer c.Stop(ctx)
	var got []*transport.Delivery
	for len(got) < n {
		select {
		case d, ok := <-c.Deliveries():
			if !ok {
				e.t.Fatalf("deliveries closed: %v", c.Err())
			}
			if err := fn(d); err != nil {
				e.t.Fatalf("settle: %v", err)
			}
			got = append(got, d)
		case <-ctx.Done():
			e.t.Fatalf("received %d of %d messages", len(got), n)
		}
	}
	return got
}

// kill dead-letters n messages of the queue as the worker does when retries
// run out.
func (e *dlqEnv) kill(n int) {
	e.t.Helper()
	e.consume(n, func(d *transport.Delivery) error {
		id, _ := d.Message.Headers["id"].(string)
		return d.DeadLetter(e.ctx(), transport.DeadLetterReason{Reason: "max-retries",
			Error: "ConnectionError('payment API down')", TaskID: id, TaskName: "rt6.charge", Time: time.Now()})
	})
}

// waitDead waits until the queue has n dead letters (RabbitMQ dead-letters
// asynchronously) and returns them.
func (e *dlqEnv) waitDead(n int) []transport.DeadMessage {
	e.t.Helper()
	ctx := e.ctx()
	for {
		dead, err := e.store.DeadLetters(ctx, e.queue, 0)
		if err != nil {
			e.t.Fatalf("DeadLetters: %v", err)
		}
		if len(dead) == n {
			return dead
		}
		select {
		case <-ctx.Done():
			e.t.Fatalf("%d dead letters, want %d", len(dead), n)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ready returns the number of messages waiting in the task queue.
func (e *dlqEnv) ready() int {
	e.t.Helper()
	n, err := e.conn.Transport.(transport.Admin).Len(e.ctx(), e.queue)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func dlqBrokers(t *testing.T) map[string]string {
	return map[string]string{
		"rabbitmq": transporttest.AMQPURL(t),
		"redis":    transporttest.RedisURL(t, redisDB),
	}
}

func TestDLQCommands(t *testing.T) {
	for name, broker := range dlqBrokers(t) {
		t.Run(name, func(t *testing.T) {
			e := newDLQEnv(t, broker)
			q := e.queue
			setup := mustCLI(t, "-b", broker, "dlq", "setup", q)
			if name == "rabbitmq" {
				for _, want := range []string{
					"declared exchange " + q + ".dlx (fanout) and queue " + q + ".dlq",
					`{"celeriac_queue_arguments":{"` + q + `":{"x-dead-letter-exchange":"` + q + `.dlx"}}}`,
					"rabbitmqctl set_policy '" + q + "-dlx' '^" + q + "$' '{\"dead-letter-exchange\":\"" + q + ".dlx\"}' --apply-to queues",
				} {
					if !strings.Contains(setup, want) {
						t.Errorf("dlq setup output lacks %q:\n%s", want, setup)
					}
				}
				e.qargs = map[string]any{"x-dead-letter-exchange": q + ".dlx"}
			} else if !strings.Contains(setup, "nothing to set up") || !strings.Contains(setup, `"celeriac.dead.`+q+`"`) {
				t.Errorf("dlq setup on redis: %s", setup)
			}

			ids := []string{"rt6-a", "rt6-b", "rt6-c"}
			e.declare()
			e.publish(ids...)
			e.kill(3)
			dead := e.waitDead(3)

			list := mustCLI(t, "-b", broker, "dlq", "list", q)
			if !strings.Contains(list, "3 dead letter(s) in "+q) {
				t.Errorf("list:\n%s", list)
			}
			for _, id := range ids {
				if !strings.Contains(list, "task=rt6.charge id="+id+" retries=2") {
					t.Errorf("list does not show %s:\n%s", id, list)
				}
			}
			wantReason := map[string]string{"rabbitmq": "rejected", "redis": "max-retries"}[name]
			if !strings.Contains(list, "reason="+wantReason) {
				t.Errorf("list does not show reason %s:\n%s", wantReason, list)
			}
			if limited := mustCLI(t, "-b", broker, "dlq", "list", "--limit", "1", q); !strings.Contains(limited, "1 dead letter(s)") {
				t.Errorf("list --limit 1:\n%s", limited)
			}

			// show finds a dead letter by task id on both brokers, and by
			// the store's id (the delivery tag on Redis).
			for _, ref := range []string{"rt6-b", dead[1].ID} {
				var doc struct {
					ID      string         `json:"id"`
					Queue   string         `json:"queue"`
					Headers map[string]any `json:"headers"`
					Body    []any          `json:"body"`
					Reason  struct {
						TaskID string `json:"task_id"`
						Reason string `json:"reason"`
					} `json:"reason"`
				}
				if err := json.Unmarshal([]byte(mustCLI(t, "-b", broker, "dlq", "show", q, ref)), &doc); err != nil {
					t.Fatalf("show %s: %v", ref, err)
				}
				if doc.Headers["id"] != "rt6-b" || doc.Queue != q || doc.Reason.TaskID != "rt6-b" || len(doc.Body) != 3 || fmt.Sprint(doc.Body[0]) != "[rt6-b]" {
					t.Errorf("show %s = %+v", ref, doc)
				}
				if _, ok := doc.Headers["x-death"]; ok != (name == "rabbitmq") {
					t.Errorf("show %s: x-death present %v on %s", ref, ok, name)
				}
			}
			if _, errs, code := cli(t, "-b", broker, "dlq", "show", q, "nope"); code != exitError || !strings.Contains(errs, `no dead letter "nope"`) {
				t.Errorf("show nope: exit %d, %s", code, errs)
			}
			// An unknown id replays nothing, not everything.
			if _, errs, code := cli(t, "-b", broker, "dlq", "replay", q, "rt6-a", "nope"); code != exitError || !strings.Contains(errs, `no dead letter "nope"`) {
				t.Errorf("replay with an unknown id: exit %d, %s", code, errs)
			}
			e.waitDead(3)

			// Replay one, keeping its retries.
			if out := mustCLI(t, "-b", broker, "dlq", "replay", q, "rt6-a"); !strings.Contains(out, "replayed 1 message(s) to "+q) {
				t.Errorf("replay rt6-a: %s", out)
			}
			e.waitDead(2)
			got := e.consume(1, func(d *transport.Delivery) error { return d.Ack(e.ctx()) })
			if h := got[0].Message.Headers; h["id"] != "rt6-a" || fmt.Sprint(h["retries"]) != "2" || h["x-death"] != nil {
				t.Errorf("replayed message headers %v: want id rt6-a, retries 2, no x-death", h)
			}
			// Replay the rest with a new retry budget.
			if out := mustCLI(t, "-b", broker, "dlq", "replay", "--reset-retries", q); !strings.Contains(out, "replayed 2 message(s)") {
				t.Errorf("replay --reset-retries: %s", out)
			}
			e.waitDead(0)
			var back []string
			for _, d := range e.consume(2, func(d *transport.Delivery) error {
				return d.DeadLetter(e.ctx(), transport.DeadLetterReason{Reason: "permanent"})
			}) {
				id, _ := d.Message.Headers["id"].(string)
				back = append(back, id)
				if fmt.Sprint(d.Message.Headers["retries"]) != "0" {
					t.Errorf("%s replayed with --reset-retries has retries %v", id, d.Message.Headers["retries"])
				}
			}
			slices.Sort(back)
			if !slices.Equal(back, []string{"rt6-b", "rt6-c"}) {
				t.Errorf("replayed %v, want rt6-b and rt6-c", back)
			}

			// Purge one by task id, then the rest.
			e.waitDead(2)
			if out := mustCLI(t, "-b", broker, "dlq", "purge", q, "rt6-b"); !strings.Contains(out, "purged 1 dead letter(s) of "+q) {
				t.Errorf("purge rt6-b: %s", out)
			}
			if dead := e.waitDead(1); dead[0].Message.Headers["id"] != "rt6-c" {
				t.Errorf("after purging rt6-b: %+v", dead)
			}
			if out := mustCLI(t, "-b", broker, "dlq", "purge", q); !strings.Contains(out, "purged 1 dead letter(s)") {
				t.Errorf("purge all: %s", out)
			}
			if list := mustCLI(t, "-b", broker, "dlq", "list", q); !strings.Contains(list, "0 dead letter(s)") {
				t.Errorf("list after purge:\n%s", list)
			}
			if n := e.ready(); n != 0 {
				t.Errorf("%d messages left in %s", n, q)
			}
		})
	}
}

// TestDLQReplayFailureLosesNothing makes the broker refuse the replay half
// way and checks that every message is still somewhere: in its queue or
// still dead.
func TestDLQReplayFailureLosesNothing(t *testing.T) {
	t.Run("rabbitmq", func(t *testing.T) {
		e := newDLQEnv(t, transporttest.AMQPURL(t))
		q := e.queue
		mustCLI(t, "-b", e.broker, "dlq", "setup", q)
		// A queue that holds one ready message and refuses more: the
		// broker nacks the second replayed publish.
		e.qargs = map[string]any{"x-dead-letter-exchange": q + ".dlx", "x-max-length": int64(1), "x-overflow": "reject-publish"}
		e.declare()
		for _, id := range []string{"rt6-x", "rt6-y", "rt6-z"} {
			e.publish(id)
			e.kill(1)
		}
		e.waitDead(3)
		out, errs, code := cli(t, "-b", e.broker, "dlq", "replay", q)
		if code != exitError || !strings.Contains(out, "replayed 1 message(s)") || !strings.Contains(errs, "basic.nack") {
			t.Fatalf("replay into a full queue: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
		}
		if dead, ready := len(e.waitDead(2)), e.ready(); dead+ready != 3 || ready != 1 {
			t.Fatalf("after a failed replay: %d dead + %d ready, want 2 + 1", dead, ready)
		}
		e.consume(1, func(d *transport.Delivery) error { return d.Ack(e.ctx()) })
		if out := mustCLI(t, "-b", e.broker, "dlq", "replay", q, "rt6-y"); !strings.Contains(out, "replayed 1") {
			t.Errorf("replay after the queue drained: %s", out)
		}
		e.waitDead(1)
	})
	t.Run("redis", func(t *testing.T) {
		e := newDLQEnv(t, transporttest.RedisURL(t, redisDB))
		q := e.queue
		e.publish("rt6-x", "rt6-y")
		e.kill(2)
		e.waitDead(2)
		// The queue's list key holds a string: the push of a replay fails.
		rdb := e.redis()
		defer rdb.Close()
		if err := rdb.Set(e.ctx(), q, "not a list", 0).Err(); err != nil {
			t.Fatal(err)
		}
		out, errs, code := cli(t, "-b", e.broker, "dlq", "replay", q)
		if code != exitError || !strings.Contains(out, "replayed 0 message(s)") || !strings.Contains(errs, "WRONGTYPE") {
			t.Fatalf("replay onto a string key: exit %d\nstdout: %s\nstderr: %s", code, out, errs)
		}
		e.waitDead(2)
		if err := rdb.Del(e.ctx(), q).Err(); err != nil {
			t.Fatal(err)
		}
		if out := mustCLI(t, "-b", e.broker, "dlq", "replay", q); !strings.Contains(out, "replayed 2") {
			t.Errorf("replay after the key was fixed: %s", out)
		}
		e.waitDead(0)
		if n := e.ready(); n != 2 {
			t.Errorf("%d messages back in %s, want 2", n, q)
		}
	})
}

// TestWorkerConfigFileDeadLetterExchange runs `celeriac worker` with the
// queue argument that `dlq setup` prints in its --config file: a failed
// acks_late task ends in the dead-letter queue, unless Celery's
// task_acks_on_failure_or_timeout asks for a plain ack.
func TestWorkerConfigFileDeadLetterExchange(t *testing.T) {
	for _, tc := range []struct {
		name         string
		ackOnFailure any // task_acks_on_failure_or_timeout; nil: unset
		wantDead     bool
	}{
		{"default", nil, true},
		{"acks_on_failure_false", false, true},
		{"acks_on_failure_true", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newDLQEnv(t, transporttest.AMQPURL(t))
			q := e.queue
			backend := transporttest.RedisURL(t, redisDB)
			id := "rt6-cfg-" + q
			mustCLI(t, "-b", e.broker, "dlq", "setup", q)
			settings := map[string]any{
				"broker_url":               e.broker,
				"result_backend":           backend,
				"task_acks_late":           true,
				"celeriac_queue_arguments": map[string]any{q: map[string]any{"x-dead-letter-exchange": q + ".dlx"}},
			}
			if tc.ackOnFailure != nil {
				settings["task_acks_on_failure_or_timeout"] = tc.ackOnFailure
			}
			cfg, err := json.Marshal(settings)
			if err != nil {
				t.Fatal(err)
			}
			file := t.TempDir() + "/celeriac.json"
			if err := os.WriteFile(file, cfg, 0o600); err != nil {
				t.Fatal(err)
			}
			opt, err := goredis.ParseURL(backend)
			if err != nil {
				t.Fatal(err)
			}
			rdb := goredis.NewClient(opt)
			t.Cleanup(func() {
				rdb.Del(context.Background(), "celery-task-meta-"+id)
				rdb.Close()
			})

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := make(chan int, 1)
			var out, errb bytes.Buffer
			go func() {
				done <- run(ctx, []string{"--config", file, "--loglevel", "critical", "worker", "-Q", q, "-c", "1", "--without-heartbeat"}, &out, &errb)
			}()
			waitConsumer(t, e.broker, q)
			m, err := protocol.EncodeTask(&protocol.TaskMessage{ID: id, Name: "tasks.fail", Args: []any{"boom"}, Kwargs: map[string]any{}},
				protocol.EncodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.conn.Transport.Publish(e.ctx(), &transport.Publishing{RoutingKey: q, Message: *m}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(waitBound)
			for {
				doc, _ := rdb.Get(e.ctx(), "celery-task-meta-"+id).Result()
				if strings.Contains(doc, `"FAILURE"`) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no FAILURE stored for %s: %q", id, doc)
				}
				time.Sleep(20 * time.Millisecond)
			}
			// A warm shutdown waits for the task to be settled; a message
			// still unsettled would come back to the queue.
			cancel()
			if code := <-done; code != exitOK {
				t.Fatalf("worker exit %d: %s", code, errb.String())
			}
			if tc.wantDead {
				// Without the argument the broker would drop the rejected
				// message and this would wait in vain.
				dead := e.waitDead(1)
				if deaths, _ := dead[0].Message.Headers["x-death"].([]any); dead[0].ID != id || len(deaths) != 1 || dead[0].Reason.Reason != "rejected" {
					t.Errorf("dead letter %s: reason %q, x-death %v", dead[0].ID, dead[0].Reason.Reason, dead[0].Message.Headers["x-death"])
				}
			} else if dead := e.waitDead(0); len(dead) != 0 {
				t.Errorf("dead letters %v, want none (acknowledged)", dead)
			}
			if n := e.ready(); n != 0 {
				t.Errorf("%d messages left in %s", n, q)
			}
		})
	}
}

// waitConsumer waits until a RabbitMQ queue has a consumer.
func waitConsumer(t *testing.T, broker, q string) {
	t.Helper()
	conn, err := amqp091.Dial(broker)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deadline := time.Now().Add(waitBound)
	for {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err == nil {
			_ = ch.Close()
			if st.Consumers > 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no consumer on %s: %v", q, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
