package integration

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/transport"
	redistransport "github.com/celeriac/celeriac/transport/redis"
)

// redisTransportDB is the Redis database of the Redis transport interop
// tests (docs/testing.md: integration uses 12-15).
const redisTransportDB = 13

// redisIT is one test's isolated slice of db 13: kombu's global_keyprefix
// (which covers every key, unacked included) and a queue of its own, shared
// by the Python and Go sides.
type redisIT struct {
	t      *testing.T
	url    string
	prefix string
	queue  string
	vt     time.Duration
	raw    *goredis.Client
}

func newRedisIT(t *testing.T, vt time.Duration) *redisIT {
	t.Helper()
	pythonBin(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	r := &redisIT{t: t, url: redisDBURL(t, redisTransportDB), prefix: "it_redis_" + id + ":", queue: "it_redis_q_" + id, vt: vt}
	opt, err := goredis.ParseURL(r.url)
	if err != nil {
		t.Fatal(err)
	}
	r.raw = goredis.NewClient(opt)
	t.Cleanup(func() {
		ctx := context.Background()
		iter := r.raw.Scan(ctx, 0, r.prefix+"*", 1000).Iterator()
		var ks []string
		for iter.Next(ctx) {
			ks = append(ks, iter.Val())
		}
		if len(ks) > 0 {
			r.raw.Del(ctx, ks...)
		}
		r.raw.Close()
	})
	return r
}

// env is the environment of the Python app and the Go helper process.
func (r *redisIT) env(extra ...string) map[string]string {
	m := map[string]string{
		"IT_REDIS_URL":    r.url,
		"IT_REDIS_PREFIX": r.prefix,
		"IT_REDIS_QUEUE":  r.queue,
		"IT_REDIS_VT":     strconv.FormatFloat(r.vt.Seconds(), 'f', -1, 64),
	}
	for i := 0; i+1 < len(extra); i += 2 {
		m[extra[i]] = extra[i+1]
	}
	return m
}

func (r *redisIT) config() redistransport.Config {
	return redistransport.Config{
		URL:               r.url,
		GlobalKeyPrefix:   r.prefix,
		VisibilityTimeout: r.vt,
		ClientName:        "celeriac-" + strings.TrimSuffix(r.prefix, ":"),
		StagedPop:         itStagedPop(),
	}
}

func (r *redisIT) dial(cfg redistransport.Config) *redistransport.Transport {
	r.t.Helper()
	tr, err := redistransport.Dial(context.Background(), cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { tr.Close() })
	return tr
}

// publish sends it.<task>(i) with the given priorities from Python Celery
// (send_task and apply_async alternately).
func (r *redisIT) publish(task string, prios []int) {
	r.t.Helper()
	args := []string{task}
	for i, p := range prios {
		args = append(args, fmt.Sprintf("%d:%d", i, p))
	}
	script, err := os.ReadFile("testdata/py/it_redis_publish.py")
	if err != nil {
		r.t.Fatal(err)
	}
	runPython(r.t, 60*time.Second, r.env(), string(script), args...)
}

func (r *redisIT) key(name string) string { return r.prefix + name }

// waitFor polls cond until it holds or a generous deadline passes (a
// broken transport must fail the test, not hang it; no timing is asserted).
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func argOf(d *transport.Delivery) int {
	// Body [[i], {}, {...}]: read i without the protocol decoder.
	s := strings.TrimPrefix(string(d.Message.Body), "[[")
	n, _ := strconv.Atoi(s[:strings.IndexAny(s+"]", "],")])
	return n
}

// TestRedisPythonPrioritiesConsumedInBandOrder: Python Celery publishes with
// priorities 0..9 (send_task and apply_async); celeriac consumes in kombu's
// band order, FIFO inside a band.
func TestRedisPythonPrioritiesConsumedInBandOrder(t *testing.T) {
	r := newRedisIT(t, time.Hour)
	var prios []int
	for i := range 20 {
		prios = append(prios, (i*7)%10)
	}
	r.publish("it.record", prios)
	tr := r.dial(r.config())
	c, err := tr.Consume(context.Background(), []transport.Queue{{Name: r.queue}}, transport.ConsumeOptions{Prefetch: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	band := func(p int) int { return []int{0, 0, 0, 3, 3, 3, 6, 6, 6, 9}[p] }
	var want []int
	for _, b := range []int{0, 3, 6, 9} {
		for i, p := range prios {
			if band(p) == b {
				want = append(want, i)
			}
		}
	}
	var got []int
	for range prios {
		select {
		case d := <-c.Deliveries():
			if d.Message.Headers["task"] != "it.record" || d.Queue != r.queue {
				t.Fatalf("delivery %+v", d)
			}
			i := argOf(d)
			if d.Message.Properties.Priority != prios[i] {
				t.Fatalf("message %d has priority %d, want %d", i, d.Message.Properties.Priority, prios[i])
			}
			got = append(got, i)
			if err := d.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("got %d of %d messages", len(got), len(prios))
		}
	}
	if !slices.Equal(want, got) {
		t.Fatalf("consume order:\n got %v\nwant %v", got, want)
	}
}

// TestRedisHelperProcess is not a test: the mixed-fleet tests re-execute
// the test binary with IT_REDIS_HELPER set to run a celeriac consumer in a
// process of its own that they can kill -9. It takes IT_REDIS_HOLD
// deliveries, prints "got <i>" for each and "held" once it has them all,
// never acks, and renews their visibility until it is killed.
func TestRedisHelperProcess(t *testing.T) {
	if os.Getenv("IT_REDIS_HELPER") == "" {
		t.Skip("helper process for the mixed-fleet tests")
	}
	vt, _ := strconv.ParseFloat(os.Getenv("IT_REDIS_VT"), 64)
	hold, _ := strconv.Atoi(os.Getenv("IT_REDIS_HOLD"))
	cfg := redistransport.Config{
		URL:               os.Getenv("IT_REDIS_URL"),
		GlobalKeyPrefix:   os.Getenv("IT_REDIS_PREFIX"),
		VisibilityTimeout: time.Duration(vt * float64(time.Second)),
		DisableRestore:    true,
		ClientName:        "celeriac-it-redis-helper",
		StagedPop:         itStagedPop(),
	}
	tr, err := redistransport.Dial(context.Background(), cfg)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	c, err := tr.Consume(context.Background(), []transport.Queue{{Name: os.Getenv("IT_REDIS_QUEUE")}}, transport.ConsumeOptions{Prefetch: hold})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	n := 0
	for d := range c.Deliveries() {
		fmt.Println("got", argOf(d))
		if n++; n == hold {
			fmt.Println("held")
		}
	}
	os.Exit(2)
}

// goHolder is a celeriac consumer process started by startGoHolder.
type goHolder struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	got  []int
	held chan struct{}
	done chan struct{}
}

func startGoHolder(t *testing.T, env map[string]string, hold int) *goHolder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRedisHelperProcess$", "-test.count=1")
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "IT_REDIS_HELPER=1", "IT_REDIS_HOLD="+strconv.Itoa(hold))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &goHolder{cmd: cmd, held: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "got "); ok {
				i, _ := strconv.Atoi(v)
				h.mu.Lock()
				h.got = append(h.got, i)
				h.mu.Unlock()
			}
			if line == "held" {
				close(h.held)
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(h.kill)
	select {
	case <-h.held:
	case <-h.done:
		t.Fatal("celeriac helper exited before holding its messages")
	case <-time.After(60 * time.Second):
		t.Fatal("celeriac helper did not hold its messages within 60s")
	}
	return h
}

// kill sends SIGKILL: no Close, no restore at shutdown.
func (h *goHolder) kill() {
	_ = h.cmd.Process.Kill()
	<-h.done
}

func (r *redisIT) done() map[int]int {
	m := map[int]int{}
	for _, v := range r.raw.LRange(context.Background(), r.key("it_done"), 0, -1).Val() {
		i, _ := strconv.Atoi(v)
		m[i]++
	}
	return m
}

// TestRedisMixedFleetCeleriacKilled: a celeriac consumer holding unacked
// messages is killed with SIGKILL; with a short visibility timeout the
// Python worker on the same queue restores and runs them. Nothing is lost.
func TestRedisMixedFleetCeleriacKilled(t *testing.T) {
	r := newRedisIT(t, 3*time.Second)
	const n = 30
	r.publish("it.record", make([]int, n))
	env := r.env("IT_REDIS_SWEEP", "1")
	holder := startGoHolder(t, env, 10)
	ctx := context.Background()
	if got := r.raw.HLen(ctx, r.key("unacked")).Val(); got != 10 {
		t.Fatalf("unacked = %d while celeriac holds 10", got)
	}
	// The entries celeriac wrote are byte for byte what kombu writes for the
	// same message: json.dumps([payload, exchange, routing_key]).
	vals := r.raw.HVals(ctx, r.key("unacked")).Val()
	f := t.TempDir() + "/unacked.json"
	blob, _ := json.Marshal(vals)
	if err := os.WriteFile(f, blob, 0o600); err != nil {
		t.Fatal(err)
	}
	out := runPython(t, 30*time.Second, env, `
import json, sys
from kombu.utils.json import dumps, loads
vals = json.load(open(sys.argv[1]))
bad = [v for v in vals if dumps(loads(v)) != v or loads(v)[1:] != ["", loads(v)[0]["properties"]["delivery_info"]["routing_key"]]]
print("mismatch", len(bad), bad[:1])
`, f)
	if !strings.HasPrefix(out, "mismatch 0 ") {
		t.Fatalf("unacked entries differ from kombu's: %s", out)
	}
	holder.kill()
	startPythonWorker(t, env, "it_redis_app", "-Q", r.queue, "-P", "solo", "-c", "1",
		"--without-gossip", "--without-mingle", "--without-heartbeat")
	waitFor(t, "the Python worker to run every message", 90*time.Second, func() bool { return len(r.done()) == n })
	holder.mu.Lock()
	held := slices.Clone(holder.got)
	holder.mu.Unlock()
	done := r.done()
	for _, i := range held {
		if done[i] == 0 {
			t.Fatalf("message %d held by the killed celeriac was never run", i)
		}
	}
	waitFor(t, "unacked to drain", 30*time.Second, func() bool { return r.raw.HLen(ctx, r.key("unacked")).Val() == 0 })
	t.Logf("celeriac held %v; Python ran %d distinct messages", held, len(done))
}

// TestRedisMixedFleetPythonKilled: a Python worker holding acks_late
// messages is killed with SIGKILL; celeriac's restore sweep brings them
// back and celeriac consumes everything. Nothing is lost.
func TestRedisMixedFleetPythonKilled(t *testing.T) {
	r := newRedisIT(t, 2*time.Second)
	const n = 12
	r.publish("it.slow", make([]int, n))
	w := startPythonWorker(t, r.env(), "it_redis_app", "-Q", r.queue, "-P", "threads", "-c", "2",
		"--without-gossip", "--without-mingle", "--without-heartbeat")
	ctx := context.Background()
	// Two threads, prefetch 2 x 4: eight acks_late messages sit in unacked.
	waitFor(t, "the Python worker to prefetch", 60*time.Second, func() bool { return r.raw.HLen(ctx, r.key("unacked")).Val() == 8 })
	pyHeld := r.raw.HKeys(ctx, r.key("unacked")).Val()
	w.Kill()

	cfg := r.config()
	cfg.RestoreInterval = 200 * time.Millisecond
	cfg.RestoreThrottle = 1
	tr := r.dial(cfg)
	c, err := tr.Consume(ctx, []transport.Queue{{Name: r.queue}}, transport.ConsumeOptions{Prefetch: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	seen := map[int]bool{}
	redelivered := 0
	for len(seen) < n {
		select {
		case d := <-c.Deliveries():
			seen[argOf(d)] = true
			if d.Redelivered {
				redelivered++
				if !slices.Contains(pyHeld, d.Tag) {
					t.Fatalf("message %s redelivered but was not held by Python", d.Tag)
				}
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("celeriac got %d of %d messages (Python held %d)", len(seen), n, len(pyHeld))
		}
	}
	if redelivered != len(pyHeld) {
		t.Fatalf("%d redelivered, want the %d Python held", redelivered, len(pyHeld))
	}
	waitFor(t, "unacked to drain", 30*time.Second, func() bool { return r.raw.HLen(ctx, r.key("unacked")).Val() == 0 })
}

// TestRedisRenewedVisibilityNotRestored: while a live celeriac process
// holds messages past the visibility timeout, neither kombu's own sweep
// (run by Python) nor another celeriac's sweep restores them; once the
// holder is killed, they come back.
func TestRedisRenewedVisibilityNotRestored(t *testing.T) {
	r := newRedisIT(t, 2*time.Second)
	r.publish("it.record", make([]int, 3))
	holder := startGoHolder(t, r.env(), 3)
	heldAt := time.Now()
	ctx := context.Background()
	cfg := r.config()
	cfg.DisableRestore = true // swept by hand below
	other := r.dial(cfg)
	sweep, err := os.ReadFile("testdata/py/it_redis_sweep.py")
	if err != nil {
		t.Fatal(err)
	}
	// Let three visibility timeouts pass while the holder lives.
	for time.Since(heldAt) < 3*r.vt {
		time.Sleep(100 * time.Millisecond)
	}
	runPython(t, 60*time.Second, r.env(), string(sweep))
	if n, err := other.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("celeriac sweep restored %d (%v) while the holder lives", n, err)
	}
	if got := r.raw.HLen(ctx, r.key("unacked")).Val(); got != 3 {
		t.Fatalf("unacked = %d while the holder lives, want 3", got)
	}
	if got, _ := other.Len(ctx, r.queue); got != 0 {
		t.Fatalf("queue has %d ready messages while the holder lives", got)
	}

	holder.kill()
	waitFor(t, "the dead holder's messages to age past the visibility timeout", 30*time.Second, func() bool {
		max := strconv.FormatFloat(float64(time.Now().Add(-r.vt).UnixMicro())/1e6, 'f', 6, 64)
		return r.raw.ZCount(ctx, r.key("unacked_index"), "0", max).Val() == 3
	})
	runPython(t, 60*time.Second, r.env(), string(sweep))
	if got := r.raw.HLen(ctx, r.key("unacked")).Val(); got != 0 {
		t.Fatalf("unacked = %d after kombu's sweep, want 0", got)
	}
	c, err := other.Consume(ctx, []transport.Queue{{Name: r.queue}}, transport.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	seen := map[int]bool{}
	for len(seen) < 3 {
		select {
		case d := <-c.Deliveries():
			if !d.Redelivered {
				t.Fatalf("restored message %d not marked redelivered", argOf(d))
			}
			seen[argOf(d)] = true
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("got %d of 3 restored messages", len(seen))
		}
	}
}

// itStagedPop reports whether the suite runs celeriac's Redis consumers on
// the staged pop (transport/redis.Config.StagedPop): set
// CELERIAC_REDIS_STAGED_POP=1. Workers started through the CLI read the
// same variable (connect.FromEnv).
func itStagedPop() bool {
	v, _ := strconv.ParseBool(os.Getenv("CELERIAC_REDIS_STAGED_POP"))
	return v
}
