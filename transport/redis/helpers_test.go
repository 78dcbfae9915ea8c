package redis

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// testDB is the Redis database this package's tests use (see docs/testing.md).
const testDB = 10

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// env is one test's isolated slice of db 10: a unique global key prefix and
// client name, so parallel tests never see each other's keys, bookkeeping
// or connections.
type env struct {
	t      testing.TB
	url    string
	prefix string
	name   string
	raw    *goredis.Client
}

func newEnv(t testing.TB) *env {
	t.Helper()
	url := transporttest.RedisURL(t, testDB)
	id := randHex(4)
	e := &env{t: t, url: url, prefix: "rt_" + id + ":", name: "celeriac-rt-" + id}
	opt, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opt.Protocol = 2
	opt.DisableIdentity = true
	e.raw = goredis.NewClient(opt)
	t.Cleanup(func() {
		ctx := context.Background()
		iter := e.raw.Scan(ctx, 0, e.prefix+"*", 1000).Iterator()
		var ks []string
		for iter.Next(ctx) {
			ks = append(ks, iter.Val())
		}
		if len(ks) > 0 {
			e.raw.Del(ctx, ks...)
		}
		e.raw.Close()
	})
	return e
}

// config returns a configuration for this env's prefix and client name.
func (e *env) config() Config {
	return Config{
		URL:             e.url,
		GlobalKeyPrefix: e.prefix,
		ClientName:      e.name,
		Logger:          zaptest.NewLogger(e.t),
		DisableRestore:  true,
	}
}

func (e *env) dial(cfg Config) *Transport {
	e.t.Helper()
	tr, err := Dial(context.Background(), cfg)
	if err != nil {
		e.t.Fatalf("Dial: %v", err)
	}
	e.t.Cleanup(func() { tr.Close() })
	return tr
}

// pyEnvelope is a task envelope formatted exactly as kombu 5.2 writes it
// (json.dumps separators), with a JSON body [[i], {}, {...}].
func pyEnvelope(tag, queue string, prio, i int) string {
	body := base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf(
		`[[%d], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]`, i)))
	id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
	return fmt.Sprintf(`{"body": "%s", "content-encoding": "utf-8", "content-type": "application/json", `+
		`"headers": {"lang": "py", "task": "tasks.add", "id": "%s", "shadow": null, "eta": null, "expires": null, `+
		`"group": null, "group_index": null, "retries": 0, "timelimit": [null, null], "root_id": "%s", "parent_id": null, `+
		`"argsrepr": "(%d,)", "kwargsrepr": "{}", "origin": "gen1@vm", "ignore_result": false}, `+
		`"properties": {"correlation_id": "%s", "reply_to": "2731d639-4e7d-349f-9ccc-abfd40bea425", "delivery_mode": 2, `+
		`"delivery_info": {"exchange": "", "routing_key": "%s"}, "priority": %d, "body_encoding": "base64", "delivery_tag": "%s"}}`,
		body, id, id, i, id, queue, prio, tag)
}

// push LPUSHes a kombu envelope onto the band list of queue, as a Python
// producer does.
func (e *env) push(queue string, prio int, envelope string) {
	e.t.Helper()
	k := keys{prefix: e.prefix, sep: DefaultSep, steps: []int{0, 3, 6, 9}}
	if err := e.raw.LPush(context.Background(), k.list(queue, prio), envelope).Err(); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) key(name string) string { return e.prefix + name }

// receive reads one delivery or fails the test after a generous timeout
// (a broken transport must not hang the suite; no timing is asserted).
func receive(t testing.TB, ch <-chan *transport.Delivery) *transport.Delivery {
	t.Helper()
	select {
	case d, ok := <-ch:
		if !ok {
			t.Fatal("deliveries closed")
		}
		return d
	case <-time.After(20 * time.Second):
		t.Fatal("no delivery within 20s")
	}
	return nil
}

// noDelivery asserts that nothing is delivered while the consumer polls a
// few more times.
func noDelivery(t testing.TB, ch <-chan *transport.Delivery, wait time.Duration) {
	t.Helper()
	select {
	case d := <-ch:
		t.Fatalf("unexpected delivery %s from %s", d.Tag, d.Queue)
	case <-time.After(wait):
	}
}

func taskID(d *transport.Delivery) string {
	s, _ := d.Message.Headers["id"].(string)
	return s
}

func idx(d *transport.Delivery) int {
	var n int
	fmt.Sscanf(strings.TrimPrefix(taskID(d), "00000000-0000-4000-8000-"), "%d", &n)
	return n
}

func consume(t testing.TB, tr *Transport, prefetch int, queues ...string) transport.Consumer {
	t.Helper()
	qs := make([]transport.Queue, len(queues))
	for i, q := range queues {
		qs[i] = transport.Queue{Name: q}
	}
	c, err := tr.Consume(context.Background(), qs, transport.ConsumeOptions{Prefetch: prefetch})
	if err != nil {
		t.Fatalf("Consume: %v", err)
	}
	t.Cleanup(func() { c.Stop(context.Background()) })
	return c
}
