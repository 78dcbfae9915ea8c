package integration

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/protocol"
)

// The tests in this file prove celeriac's encoder against the real thing:
// a TaskMessage encoded by protocol.EncodeTask (and, on Redis,
// protocol.EncodeEnvelope) is executed by a Python Celery 5.2 worker, and
// the result meta it stores is read back with protocol.DecodeResult.

// itProtoDB is the Redis db of these tests (broker and result backend).
const itProtoDB = 12

// protoCase is one message to run through a Python worker.
type protoCase struct {
	name string
	task protocol.TaskMessage
	opts protocol.EncodeOptions
	// etaIn, when set, makes the message due that long after it is sent
	// (with a +05:30 offset) and expire an hour later.
	etaIn time.Duration
	check func(t *testing.T, sent *protocol.TaskMessage, meta *protocol.ResultMeta)
}

// setTimes applies etaIn just before the message is encoded.
func (tc *protoCase) setTimes(now time.Time) {
	if tc.etaIn == 0 {
		return
	}
	tc.task.ETA = now.Add(tc.etaIn).Truncate(time.Microsecond).In(time.FixedZone("IST", 5*3600+1800))
	tc.task.Expires = now.Add(time.Hour).Truncate(time.Microsecond)
}

func protoCases() []protoCase {
	id := func(n int) string { return fmt.Sprintf("%08x-0000-4000-8000-%012d", os.Getpid(), n) }
	success := func(want any) func(*testing.T, *protocol.TaskMessage, *protocol.ResultMeta) {
		return func(t *testing.T, _ *protocol.TaskMessage, meta *protocol.ResultMeta) {
			t.Helper()
			if diff := cmp.Diff(want, meta.Result, bigIntComparer()); diff != "" {
				t.Errorf("result mismatch (-want +got):\n%s", diff)
			}
		}
	}
	big70 := new(big.Int).Lsh(big.NewInt(1), 70)
	return []protoCase{
		{
			name:  "json",
			task:  protocol.TaskMessage{ID: id(1), Name: "it_proto.add", Args: []any{int64(2), int64(3)}},
			check: success(int64(5)),
		},
		{
			name: "msgpack",
			task: protocol.TaskMessage{ID: id(2), Name: "it_proto.types",
				Args:   []any{[]byte{0, 0xff}, "три", int64(-7), 1.5, nil, true, []any{int64(1)}},
				Kwargs: map[string]any{"m": map[string]any{"k": "v"}}},
			opts: protocol.EncodeOptions{ContentType: protocol.ContentTypeMsgpack},
			check: success(map[string]any{
				"args":   []any{"bytes", "str", "int", "float", "NoneType", "bool", "list"},
				"kwargs": map[string]any{"m": "dict"},
			}),
		},
		{
			name:  "zlib",
			task:  protocol.TaskMessage{ID: id(3), Name: "it_proto.add", Args: []any{int64(40), int64(2)}},
			opts:  protocol.EncodeOptions{Compression: protocol.CompressionZlib},
			check: success(int64(42)),
		},
		{
			name:  "msgpack+zlib",
			task:  protocol.TaskMessage{ID: id(4), Name: "it_proto.add", Args: []any{"a", "b"}},
			opts:  protocol.EncodeOptions{ContentType: protocol.ContentTypeMsgpack, Compression: protocol.CompressionZlib},
			check: success("ab"),
		},
		{
			name: "unicode and nested kwargs",
			task: protocol.TaskMessage{ID: id(5), Name: "it_proto.echo",
				Args: []any{"héllo ☃ 日本語 😀", "a\"b\\c\n\x00"},
				Kwargs: map[string]any{
					"ключ":   "значение",
					"nested": map[string]any{"list": []any{int64(1), []any{nil, false}, map[string]any{"deep": 2.5}}},
					"big":    big70,
					"empty":  map[string]any{},
				}},
			check: success(map[string]any{
				"args": []any{"héllo ☃ 日本語 😀", "a\"b\\c\n\x00"},
				"kwargs": map[string]any{
					"ключ":   "значение",
					"nested": map[string]any{"list": []any{int64(1), []any{nil, false}, map[string]any{"deep": 2.5}}},
					"big":    big70,
					"empty":  map[string]any{},
				},
			}),
		},
		{
			// The worker holds the message until the eta (sent with a
			// +05:30 offset), and sees every header we set.
			name:  "eta and headers",
			etaIn: 2 * time.Second,
			task: protocol.TaskMessage{ID: id(6), Name: "it_proto.request", Args: []any{int64(1)},
				RootID: id(60), ParentID: id(61), Group: id(62), Retries: 2,
				TimeLimit: 30 * time.Second, SoftTimeLimit: 20500 * time.Millisecond,
				Origin: "celeriac@test", Headers: map[string]any{"x-it": "v", "x-num": int64(1700000000000)}},
			check: func(t *testing.T, sent *protocol.TaskMessage, meta *protocol.ResultMeta) {
				t.Helper()
				got, ok := meta.Result.(map[string]any)
				if !ok {
					t.Fatalf("result %#v, want an object", meta.Result)
				}
				ranAt, _ := got["ran_at"].(float64)
				delete(got, "ran_at")
				want := map[string]any{
					"id": sent.ID, "root_id": sent.RootID, "parent_id": sent.ParentID, "group": sent.Group,
					"retries": int64(2), "timelimit": []any{int64(30), 20.5},
					"eta": protocol.FormatTime(sent.ETA), "expires": protocol.FormatTime(sent.Expires),
					"origin": "celeriac@test", "custom": map[string]any{"x-it": "v", "x-num": int64(1700000000000)},
					"args": []any{int64(1)}, "kwargs": map[string]any{},
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("request seen by Python mismatch (-want +got):\n%s", diff)
				}
				// Not a timing budget: the worker must not run the task
				// before its eta.
				if etaUnix := float64(sent.ETA.UnixMicro()) / 1e6; ranAt < etaUnix {
					t.Errorf("task ran at %f, before its eta %f", ranAt, etaUnix)
				}
			},
		},
	}
}

func bigIntComparer() cmp.Option {
	return cmp.Comparer(func(a, b *big.Int) bool {
		if a == nil || b == nil {
			return a == b
		}
		return a.Cmp(b) == 0
	})
}

// TestProtocolEncoderRedis: celeriac-encoded envelopes LPUSHed to Redis
// are executed by a Python Celery 5.2 worker.
func TestProtocolEncoderRedis(t *testing.T) {
	redisURL := redisDBURL(t, itProtoDB)
	opt, err := goredis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	ctx := t.Context()
	if err := rdb.Ping(ctx).Err(); err != nil {
		unavailable(t, "redis %s: %v", redisURL, err)
	}
	queue := fmt.Sprintf("it_proto_redis_%d", os.Getpid())
	t.Cleanup(func() {
		// db 12 belongs to these tests; the worker has stopped by now
		// (cleanups run last-in first-out).
		_ = rdb.FlushDB(context.Background()).Err()
	})
	startPythonWorker(t, map[string]string{"IT_PROTO_BROKER": redisURL, "IT_PROTO_BACKEND": redisURL},
		"it_proto_tasks", "--pool=solo", "-Q", queue, "-n", queue+"@%h",
		"--without-gossip", "--without-mingle", "--without-heartbeat")

	for i, tc := range protoCases() {
		t.Run(tc.name, func(t *testing.T) {
			tc.setTimes(time.Now())
			msg, err := protocol.EncodeTask(&tc.task, tc.opts)
			if err != nil {
				t.Fatalf("EncodeTask: %v", err)
			}
			env := &protocol.Envelope{
				Message:      *msg,
				BodyEncoding: protocol.BodyEncodingBase64,
				DeliveryTag:  fmt.Sprintf("%08x-0000-4000-9000-%012d", os.Getpid(), i),
				DeliveryInfo: protocol.DeliveryInfo{RoutingKey: queue},
			}
			data, err := protocol.EncodeEnvelope(env)
			if err != nil {
				t.Fatalf("EncodeEnvelope: %v", err)
			}
			if err := rdb.LPush(ctx, queue, data).Err(); err != nil {
				t.Fatal(err)
			}
			meta := waitResult(t, rdb, tc.task.ID)
			checkMeta(t, &tc, meta)
		})
	}
}

// TestProtocolEncoderAMQP: the same messages published with amqp091 to the
// default exchange are executed by a Python Celery 5.2 worker on RabbitMQ.
func TestProtocolEncoderAMQP(t *testing.T) {
	amqpAddr := amqpURL(t)
	redisURL := redisDBURL(t, itProtoDB)
	opt, err := goredis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	ctx := t.Context()
	if err := rdb.Ping(ctx).Err(); err != nil {
		unavailable(t, "redis %s: %v", redisURL, err)
	}
	conn, err := amqp091.Dial(amqpAddr)
	if err != nil {
		unavailable(t, "rabbitmq %s: %v", amqpAddr, err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := fmt.Sprintf("it_proto_amqp_%d", os.Getpid())
	// Declared as Celery declares a task queue, so the worker's own
	// declaration is equivalent.
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := conn.Channel()
		if err != nil {
			return
		}
		_, _ = c.QueueDelete(queue, false, false, false)
		_ = c.ExchangeDelete(queue, false, false) // declared by the worker (-Q)
		_ = c.Close()
		_ = rdb.FlushDB(context.Background()).Err()
	})
	startPythonWorker(t, map[string]string{"IT_PROTO_BROKER": amqpAddr, "IT_PROTO_BACKEND": redisURL},
		"it_proto_tasks", "--pool=solo", "-Q", queue, "-n", queue+"@%h",
		"--without-gossip", "--without-mingle", "--without-heartbeat")

	for _, tc := range protoCases() {
		t.Run(tc.name, func(t *testing.T) {
			tc.task.ID = "a" + tc.task.ID[1:] // distinct from the Redis run's ids
			tc.setTimes(time.Now())
			msg, err := protocol.EncodeTask(&tc.task, tc.opts)
			if err != nil {
				t.Fatalf("EncodeTask: %v", err)
			}
			headers, err := amqpTable(msg.Headers)
			if err != nil {
				t.Fatal(err)
			}
			p := amqp091.Publishing{
				Headers:         headers,
				ContentType:     msg.ContentType,
				ContentEncoding: msg.ContentEncoding,
				DeliveryMode:    msg.Properties.DeliveryMode,
				Priority:        uint8(msg.Properties.Priority),
				CorrelationId:   msg.Properties.CorrelationID,
				ReplyTo:         msg.Properties.ReplyTo,
				Expiration:      msg.Properties.Expiration,
				Body:            msg.Body,
			}
			if err := ch.PublishWithContext(ctx, "", queue, true, false, p); err != nil {
				t.Fatal(err)
			}
			meta := waitResult(t, rdb, tc.task.ID)
			checkMeta(t, &tc, meta)
		})
	}
}

// amqpTable converts protocol header values to the types amqp091 writes:
// objects become nested Tables.
func amqpTable(h map[string]any) (amqp091.Table, error) {
	t := amqp091.Table{}
	for k, v := range h {
		c, err := amqpValue(v)
		if err != nil {
			return nil, fmt.Errorf("header %q: %w", k, err)
		}
		t[k] = c
	}
	return t, t.Validate()
}

func amqpValue(v any) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		return amqpTable(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			c, err := amqpValue(e)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case *big.Int:
		return nil, errors.New("AMQP tables have no big integers")
	}
	return v, nil
}

// waitResult polls the Redis result backend until the task's meta is in a
// ready state, then decodes it. The deadline only bounds a hung worker.
func waitResult(t *testing.T, rdb *goredis.Client, id string) *protocol.ResultMeta {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		data, err := rdb.Get(ctx, "celery-task-meta-"+id).Bytes()
		if err == nil {
			meta, err := protocol.DecodeResult(data, protocol.ContentTypeJSON, protocol.DecodeOptions{})
			if err != nil {
				t.Fatalf("DecodeResult(%s): %v", data, err)
			}
			if meta.Status.Ready() {
				return meta
			}
		} else if !errors.Is(err, goredis.Nil) {
			t.Fatalf("GET result: %v", err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no ready result for task %s: %v", id, ctx.Err())
		case <-tick.C:
		}
	}
}

func checkMeta(t *testing.T, tc *protoCase, meta *protocol.ResultMeta) {
	t.Helper()
	if meta.Status != protocol.StateSuccess {
		t.Fatalf("status %s, result %v, traceback:\n%s", meta.Status, meta.Result, meta.Traceback)
	}
	if meta.TaskID != tc.task.ID || meta.DateDone.IsZero() {
		t.Errorf("meta task_id %q date_done %v, want %q and a date", meta.TaskID, meta.DateDone, tc.task.ID)
	}
	tc.check(t, &tc.task, meta)
}
