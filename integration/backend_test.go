package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/backend"
	redisbackend "github.com/celeriac/celeriac/backend/redis"
	"github.com/celeriac/celeriac/backend/rpc"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	memtransport "github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
)

// Python Celery 5.2.6 is the client of celeriac's result backends here. The
// tests use Redis db 14 and names starting with it_backend_, and delete what
// they wrote.
const backendDB = 14

func itID(kind string) string {
	return "it_backend_" + kind + "_" + strings.ToLower(rand.Text()[:16])
}

// backendEnv is the Python environment for a Celery app on the Redis
// backend (and broker) of db 14.
func backendEnv(t *testing.T, extra map[string]string) map[string]string {
	t.Helper()
	u := redisDBURL(t, backendDB)
	env := map[string]string{"IT_BACKEND": u, "IT_BROKER": u}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// newRedisBackend returns a celeriac Redis backend and a raw client on db 14;
// keys of the test's ids are removed at the end (Python writes plain
// celery-task-meta-<id> keys, so ids carry the it_backend_ prefix).
func newRedisBackend(t *testing.T, cfg redisbackend.Config) (*redisbackend.Backend, *goredis.Client) {
	t.Helper()
	u := redisDBURL(t, backendDB)
	cfg.URL = u
	be, err := redisbackend.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	opt, err := goredis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	raw := goredis.NewClient(opt)
	t.Cleanup(func() {
		_ = be.Close()
		ctx := context.Background()
		for _, pattern := range []string{"*it_backend_*", "_kombu.binding.it_backend_*"} {
			iter := raw.Scan(ctx, 0, pattern, 1000).Iterator()
			for iter.Next(ctx) {
				raw.Del(ctx, iter.Val())
			}
		}
		raw.Close()
	})
	return be, raw
}

// pyCall runs one function of testdata/py/it_backend.py to completion and
// returns the JSON lines it printed.
func pyCall(t *testing.T, timeout time.Duration, env map[string]string, fn string, args ...string) []map[string]any {
	t.Helper()
	out := runPython(t, timeout, env, "import sys, it_backend; getattr(it_backend, sys.argv[1])(*sys.argv[2:])", append([]string{fn}, args...)...)
	return parseLines(t, out)
}

func parseLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("python printed %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	return lines
}

// pyProc is a Python helper running in the background while the test acts.
type pyProc struct {
	cmd    *exec.Cmd
	lines  chan map[string]any
	done   chan struct{}
	stderr bytes.Buffer
	err    error
}

func pyStart(t *testing.T, env map[string]string, fn string, args ...string) *pyProc {
	t.Helper()
	argv := append([]string{"-c", "import sys, it_backend; getattr(it_backend, sys.argv[1])(*sys.argv[2:])", fn}, args...)
	p := &pyProc{cmd: exec.Command(pythonBin(t), argv...), lines: make(chan map[string]any, 16), done: make(chan struct{})}
	p.cmd.Env = pyEnv(env)
	p.cmd.Stderr = &p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				p.lines <- m
			}
		}
		p.err = p.cmd.Wait()
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// next returns the next line the process printed.
func (p *pyProc) next(t *testing.T, timeout time.Duration) map[string]any {
	t.Helper()
	select {
	case m, ok := <-p.lines:
		if !ok {
			<-p.done
			t.Fatalf("python exited (%v) without the expected output:\n%s", p.err, p.stderr.String())
		}
		return m
	case <-time.After(timeout):
		t.Fatalf("no output from python within %v:\n%s", timeout, p.stderr.String())
	}
	return nil
}

// wait waits for the process to exit successfully.
func (p *pyProc) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("python still running after %v:\n%s", timeout, p.stderr.String())
	}
	if p.err != nil {
		t.Fatalf("python failed: %v\n%s", p.err, p.stderr.String())
	}
}

func mustBig(s string) *big.Int {
	b, ok := new(big.Int).SetString(s, 10)
	if !ok {
		panic(s)
	}
	return b
}

func storeSuccess(t *testing.T, be backend.Backend, id string, result any) {
	t.Helper()
	err := be.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{
		TaskID: id, Status: protocol.StateSuccess, Result: result, DateDone: time.Now()}})
	if err != nil {
		t.Fatalf("Store(%s): %v", id, err)
	}
}

// TestBackendPythonGetsEveryValue: Go stores SUCCESS, then Python's
// AsyncResult(id).get() returns the same value with the same Python types.
func TestBackendPythonGetsEveryValue(t *testing.T) {
	cases := []struct {
		name string
		give any
		py   string // Python expression of what .get() must return
	}{
		{"int", int64(5), "5"},
		{"int64 min", int64(-9223372036854775808), "-9223372036854775808"},
		{"int64 max", int64(9223372036854775807), "9223372036854775807"},
		{"big int", mustBig("123456789012345678901234567890"), "123456789012345678901234567890"},
		{"big negative", mustBig("-1180591620717411303424"), "-(2**70)"},
		{"float", 1.5, "1.5"},
		{"float tenth", 0.1, "0.1"},
		{"float integral", 3.0, "3.0"},
		{"float huge", 1e300, "1e300"},
		{"float tiny", 5e-324, "5e-324"},
		{"true", true, "True"},
		{"false", false, "False"},
		{"none", nil, "None"},
		{"string", "plain", "'plain'"},
		{"empty string", "", "''"},
		{"unicode", "héllo ✓ 日本 😀", "'héllo ✓ 日本 \\U0001F600'"},
		{"escapes", "a\"b\\c\n\t\x00\u2028", "'a\"b\\\\c\\n\\t\\x00\\u2028'"},
		{"empty list", []any{}, "[]"},
		{"empty dict", map[string]any{}, "{}"},
		{"list", []any{int64(1), "two", 3.5, nil, true}, "[1, 'two', 3.5, None, True]"},
		{"nested", map[string]any{"a": []any{int64(1), map[string]any{"b": nil, "c": []any{}}}, "d": 2.5, "é": "ü"},
			"{'a': [1, {'b': None, 'c': []}], 'd': 2.5, 'é': 'ü'}"},
		{"1 MB string", strings.Repeat("x", 1<<20), "'x' * (1 << 20)"},
		{"1 MB list", slices.Repeat([]any{"abcdefghijklmnop"}, 1<<16), "['abcdefghijklmnop'] * (1 << 16)"},
	}
	be, _ := newRedisBackend(t, redisbackend.Config{})
	var pyCases [][2]string
	names := map[string]string{}
	for _, c := range cases {
		id := itID("val")
		storeSuccess(t, be, id, c.give)
		pyCases = append(pyCases, [2]string{id, c.py})
		names[id] = c.name
	}
	arg, _ := json.Marshal(pyCases)
	lines := pyCall(t, 2*time.Minute, backendEnv(t, nil), "check_values", string(arg))
	if len(lines) != len(cases) {
		t.Fatalf("python reported %d results, want %d: %v", len(lines), len(cases), lines)
	}
	for _, l := range lines {
		if l["ok"] != true {
			t.Errorf("%s: python got %v (%v) %v", names[l["id"].(string)], l["got"], l["type"], l["error"])
		}
	}
}

// TestBackendPublishWakesGet: Python is blocked in .get() before the result
// exists; the PUBLISH of Store is what wakes it. The control stores the
// same document with a plain SET and no PUBLISH: .get() then times out,
// which is the bug every Go peer shipped.
func TestBackendPublishWakesGet(t *testing.T) {
	be, raw := newRedisBackend(t, redisbackend.Config{})
	env := backendEnv(t, nil)
	ctx := t.Context()

	waitSubscribed := func(channel string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			n, err := raw.PubSubNumSub(ctx, channel).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n[channel] > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("python never subscribed to %s", channel)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// The control's SET must come after Python's one GET that follows its
	// SUBSCRIBE, or the GET finds it (CI, stop 34).
	waitPolled := func(p *pyProc) {
		t.Helper()
		if l := p.next(t, 30*time.Second); l["event"] != "polled" {
			t.Fatalf("python: %v, want its first read of the key", l)
		}
	}

	id := itID("wake")
	p := pyStart(t, env, "wait_one", id, "10")
	if l := p.next(t, 30*time.Second); l["event"] != "waiting" {
		t.Fatalf("python: %v", l)
	}
	waitSubscribed(be.TaskKey(id))
	waitPolled(p)
	storeSuccess(t, be, id, "woken")
	l := p.next(t, 30*time.Second)
	if l["ok"] != true || l["value"] != "woken" {
		t.Fatalf("python .get() after Store: %v\n%s", l, p.stderr.String())
	}
	t.Logf("python .get() returned %.3fs after it started waiting (timeout 10s)", l["elapsed"])
	p.wait(t, 30*time.Second)

	control := itID("nopub")
	p = pyStart(t, env, "wait_one", control, "2")
	if l := p.next(t, 30*time.Second); l["event"] != "waiting" {
		t.Fatalf("python: %v", l)
	}
	waitSubscribed(be.TaskKey(control))
	waitPolled(p)
	doc, err := protocol.EncodeResult(&protocol.ResultMeta{TaskID: control, Status: protocol.StateSuccess, Result: "silent"}, protocol.ContentTypeJSON)
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Set(ctx, be.TaskKey(control), doc, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if l := p.next(t, 30*time.Second); l["ok"] != false || l["error"] != "TimeoutError" {
		t.Fatalf("control without PUBLISH: python got %v, want a TimeoutError", l)
	}
	p.wait(t, 30*time.Second)
}

// TestBackendPythonReadsFailures: failures become Python exceptions, with
// state, traceback and date_done readable.
func TestBackendPythonReadsFailures(t *testing.T) {
	be, _ := newRedisBackend(t, redisbackend.Config{})
	env := backendEnv(t, nil)
	done := time.Date(2026, 11, 29, 13, 13, 55, 990025000, time.UTC)
	tb := "Traceback (most recent call last):\n  File \"handlers.go\", line 42, in add\nValueError: bad thing\n"
	tests := []struct {
		name  string
		state protocol.State
		exc   *protocol.ExceptionInfo
		tb    string
		want  map[string]any
	}{
		{"ValueError", protocol.StateFailure, &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad thing", int64(42)}, Module: "builtins"}, tb,
			map[string]any{"state": "FAILURE", "raised": "ValueError", "module": "builtins", "args": []any{"'bad thing'", "42"}, "is_value_error": true, "traceback": tb}},
		{"revoked", protocol.StateRevoked, &protocol.ExceptionInfo{Type: "TaskRevokedError", Message: []any{"expired"}, Module: "celery.exceptions"}, "",
			map[string]any{"state": "REVOKED", "raised": "TaskRevokedError", "module": "celery.exceptions", "args": []any{"'expired'"}, "traceback": nil}},
		{"unknown module", protocol.StateFailure, &protocol.ExceptionInfo{Type: "HandlerPanic", Message: []any{"nil map write"}, Module: "celeriac.handlers"}, "goroutine 1 [running]:\n",
			map[string]any{"state": "FAILURE", "raised": "HandlerPanic", "module": "celery.exceptions", "args": []any{"'nil map write'"}, "is_value_error": false}},
		{"custom builtin", protocol.StateFailure, &protocol.ExceptionInfo{Type: "KeyError", Message: []any{"missing"}, Module: "builtins"}, "",
			map[string]any{"state": "FAILURE", "raised": "KeyError", "module": "builtins", "args": []any{"'missing'"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := itID("exc")
			err := be.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{
				TaskID: id, Status: tt.state, Result: tt.exc, Traceback: tt.tb, DateDone: done}})
			if err != nil {
				t.Fatal(err)
			}
			lines := pyCall(t, time.Minute, env, "check_exception", id)
			if len(lines) != 1 {
				t.Fatalf("python printed %v", lines)
			}
			got := lines[0]
			for k, want := range tt.want {
				if g, _ := json.Marshal(got[k]); string(g) != mustJSON(want) {
					t.Errorf("%s = %s, want %s", k, g, mustJSON(want))
				}
			}
			if got["date_done"] != "2026-11-29T13:13:55.990025" {
				t.Errorf("date_done = %v", got["date_done"])
			}
		})
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestBackendPythonReadsExtendedMeta: result_extended fields and children.
func TestBackendPythonReadsExtendedMeta(t *testing.T) {
	be, _ := newRedisBackend(t, redisbackend.Config{})
	id, child := itID("ext"), itID("child")
	err := be.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{
		TaskID: id, Status: protocol.StateSuccess, Result: int64(5), DateDone: time.Now(),
		Children: []any{protocol.ChildTuple(child)}, Extended: true, Name: "tasks.add",
		Args: []any{int64(2), int64(3)}, Kwargs: map[string]any{"z": "é"}, Worker: "go@host", Retries: 2, Queue: "celery",
	}})
	if err != nil {
		t.Fatal(err)
	}
	lines := pyCall(t, time.Minute, backendEnv(t, nil), "check_meta", id)
	want := map[string]any{"state": "SUCCESS", "result": 5, "name": "tasks.add", "args": []any{2, 3}, "kwargs": map[string]any{"z": "é"},
		"worker": "go@host", "retries": 2, "queue": "celery", "children": []any{child}}
	for k, w := range want {
		if g := mustJSON(lines[0][k]); g != mustJSON(w) {
			t.Errorf("%s = %s, want %s", k, g, mustJSON(w))
		}
	}
}

// TestBackendMsgpackResultSerializer: with Serializer msgpack a Python app
// whose result_serializer is msgpack reads the results.
func TestBackendMsgpackResultSerializer(t *testing.T) {
	be, _ := newRedisBackend(t, redisbackend.Config{Serializer: "msgpack"})
	cases := []struct {
		give any
		py   string
	}{
		{int64(-9223372036854775808), "-9223372036854775808"},
		{1.25, "1.25"},
		{"héllo 😀", "'héllo \\U0001F600'"},
		{[]byte{0, 1, 255}, "b'\\x00\\x01\\xff'"},
		{map[string]any{"a": []any{int64(1), nil, true}}, "{'a': [1, None, True]}"},
		{nil, "None"},
	}
	var pyCases [][2]string
	for _, c := range cases {
		id := itID("mp")
		storeSuccess(t, be, id, c.give)
		pyCases = append(pyCases, [2]string{id, c.py})
	}
	arg, _ := json.Marshal(pyCases)
	for _, l := range pyCall(t, time.Minute, backendEnv(t, map[string]string{"IT_RESULT_SERIALIZER": "msgpack"}), "check_values", string(arg)) {
		if l["ok"] != true {
			t.Errorf("python got %v (%v) %v for %v", l["got"], l["type"], l["error"], l["id"])
		}
	}
}

// kombuMessage is what the test reads from a kombu Redis queue.
type kombuMessage struct {
	Body    string         `json:"body"`
	Headers map[string]any `json:"headers"`
}

func queueMessages(t *testing.T, raw *goredis.Client, queue string) []kombuMessage {
	t.Helper()
	items, err := raw.LRange(t.Context(), queue, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var msgs []kombuMessage
	for _, it := range items {
		var m kombuMessage
		if err := json.Unmarshal([]byte(it), &m); err != nil {
			t.Fatalf("queue %s: %v", queue, err)
		}
		msgs = append(msgs, m)
	}
	return msgs
}

// TestBackendChordFromPythonClient: Python applies a real chord (the client
// writes .s and publishes the header tasks); Go returns every header part
// from concurrent goroutines; exactly one completes the chord, with the
// results in order, and the body result it stores is what Python's .get()
// on the chord returns.
func TestBackendChordFromPythonClient(t *testing.T) {
	be, raw := newRedisBackend(t, redisbackend.Config{})
	env := backendEnv(t, nil)
	queue := itID("chordq")
	const size = 10
	lines := pyCall(t, time.Minute, env, "chord_apply", queue, fmt.Sprint(size))
	gid := lines[0]["group"].(string)
	body := lines[0]["body"].(string)
	var header []string
	for _, h := range lines[0]["header"].([]any) {
		header = append(header, h.(string))
	}
	t.Cleanup(func() { raw.Del(context.Background(), "celery-taskset-meta-"+gid+".s", "celery-task-meta-"+body) })
	if s, err := raw.Get(t.Context(), "celery-taskset-meta-"+gid+".s").Result(); err != nil || s != fmt.Sprint(size) {
		t.Fatalf("chord size key = %q, %v", s, err)
	}
	msgs := queueMessages(t, raw, queue)
	if len(msgs) != size {
		t.Fatalf("%d header messages in %s, want %d", len(msgs), queue, size)
	}
	byID := map[string]int{}
	for _, m := range msgs {
		if m.Headers["group"] != gid {
			t.Errorf("header message group %v, want %s", m.Headers["group"], gid)
		}
		byID[m.Headers["id"].(string)] = int(m.Headers["group_index"].(float64))
	}

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		ready []backend.ChordResult
	)
	for _, id := range header {
		idx := byID[id]
		wg.Go(func() {
			// add(i, i) as a worker would have run it.
			r, err := be.ChordPartReturn(context.Background(), backend.ChordPart{
				GroupID: gid, GroupIndex: &idx, TaskID: id, State: protocol.StateSuccess, Result: int64(2 * idx)})
			if err != nil {
				t.Errorf("ChordPartReturn: %v", err)
				return
			}
			if r.Ready {
				mu.Lock()
				ready = append(ready, r)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(ready) != 1 {
		t.Fatalf("%d parts completed the chord, want 1", len(ready))
	}
	var sum int64
	for i, p := range ready[0].Results {
		if p.TaskID != header[i] || *p.GroupIndex != i || p.Result != int64(2*i) {
			t.Errorf("result %d = %+v, want task %s result %d", i, p, header[i], 2*i)
		}
		sum += p.Result.(int64)
	}
	storeSuccess(t, be, body, sum)
	if got := pyCall(t, time.Minute, env, "chord_wait", body); got[0]["value"] != float64(90) {
		t.Fatalf("python chord .get() = %v, want 90", got[0]["value"])
	}
}

// TestBackendChordMixedWorkers: Python's on_chord_part_return returns the
// even parts and Go's the odd ones, alternating strictly (a Redis counter
// passes the turn). The chord fires exactly once in total, from whichever
// side returns the last part, with everyone's results in order.
func TestBackendChordMixedWorkers(t *testing.T) {
	for _, size := range []int{10, 9} { // last part by Go, then by Python
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			be, raw := newRedisBackend(t, redisbackend.Config{})
			env := backendEnv(t, nil)
			ctx := t.Context()
			gid, bodyQueue, turn := itID("mix"), itID("bodyq"), itID("turn")
			pyCall(t, time.Minute, env, "chord_set_size", gid, fmt.Sprint(size)) // .s written by Python
			var pyParts [][2]any
			for i := 0; i < size; i += 2 {
				pyParts = append(pyParts, [2]any{i, fmt.Sprintf("%s-part-%d", gid, i)})
			}
			p := pyStart(t, env, "chord_parts", gid, bodyQueue, mustJSON(pyParts), turn)

			var goReady []backend.ChordResult
			for i := 1; i < size; i += 2 {
				deadline := time.Now().Add(30 * time.Second)
				for {
					n, err := raw.Get(ctx, turn).Int()
					if err != nil && err != goredis.Nil {
						t.Fatal(err)
					}
					if n == i {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("turn %d never came:\n%s", i, p.stderr.String())
					}
					time.Sleep(time.Millisecond)
				}
				r, err := be.ChordPartReturn(ctx, backend.ChordPart{GroupID: gid, GroupIndex: &i,
					TaskID: fmt.Sprintf("%s-part-%d", gid, i), State: protocol.StateSuccess, Result: int64(10 * i)})
				if err != nil {
					t.Fatal(err)
				}
				if r.Ready {
					goReady = append(goReady, r)
				}
				if err := raw.Incr(ctx, turn).Err(); err != nil {
					t.Fatal(err)
				}
			}
			p.wait(t, time.Minute)

			bodies := queueMessages(t, raw, bodyQueue)
			if n := len(goReady) + len(bodies); n != 1 {
				t.Fatalf("chord fired %d times (Go %d, Python %d), want exactly once", n, len(goReady), len(bodies))
			}
			want := make([]int64, size)
			for i := range want {
				want[i] = int64(10 * i)
			}
			var got []int64
			if len(goReady) == 1 {
				if size%2 == 1 {
					t.Errorf("Go completed the chord but Python returned the last part")
				}
				for _, part := range goReady[0].Results {
					got = append(got, part.Result.(int64))
				}
			} else {
				if size%2 == 0 {
					t.Errorf("Python completed the chord but Go returned the last part")
				}
				if id := bodies[0].Headers["id"]; id != "body-"+gid {
					t.Errorf("body message id %v", id)
				}
				got = pythonBodyArgs(t, bodies[0])
			}
			if !slices.Equal(got, want) {
				t.Errorf("chord results %v, want %v", got, want)
			}
		})
	}
}

// pythonBodyArgs decodes the first argument of a chord body message Python
// sent: the list of header results.
func pythonBodyArgs(t *testing.T, m kombuMessage) []int64 {
	t.Helper()
	raw, err := base64Decode(m.Body)
	if err != nil {
		t.Fatal(err)
	}
	var body []json.RawMessage
	if err := json.Unmarshal(raw, &body); err != nil || len(body) != 3 {
		t.Fatalf("body message %s: %v", raw, err)
	}
	var args [][]int64
	if err := json.Unmarshal(body[0], &args); err != nil || len(args) != 1 {
		t.Fatalf("body args %s: %v", body[0], err)
	}
	return args[0]
}

// TestBackendChordMixedWorkersRace: many chords whose parts Go and Python
// return at the same time, in random orders: each chord fires exactly once.
func TestBackendChordMixedWorkersRace(t *testing.T) {
	be, raw := newRedisBackend(t, redisbackend.Config{})
	env := backendEnv(t, nil)
	const chords, size = 24, 6
	bodyQueue := itID("racebody")
	type part struct {
		gid   string
		index int
		id    string
	}
	var pyParts, goParts []part
	gids := make([]string, chords)
	for c := range gids {
		gids[c] = itID("race")
		if err := be.SetChordSize(t.Context(), gids[c], size); err != nil {
			t.Fatal(err)
		}
		for i := range size {
			p := part{gids[c], i, fmt.Sprintf("%s-%d", gids[c], i)}
			if i%2 == 0 {
				pyParts = append(pyParts, p)
			} else {
				goParts = append(goParts, p)
			}
		}
	}
	shuffle := func(ps []part) {
		for i := len(ps) - 1; i > 0; i-- {
			n, _ := randInt(i + 1)
			ps[i], ps[n] = ps[n], ps[i]
		}
	}
	shuffle(pyParts)
	shuffle(goParts)
	var pyArg [][3]any
	for _, p := range pyParts {
		pyArg = append(pyArg, [3]any{p.gid, p.index, p.id})
	}
	start := itID("start")
	proc := pyStart(t, env, "chord_parts_race", mustJSON(pyArg), bodyQueue, start)
	if l := proc.next(t, time.Minute); l["event"] != "ready" {
		t.Fatalf("python: %v", l)
	}
	if err := raw.Set(t.Context(), start, "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}

	fired := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for j := w; j < len(goParts); j += 4 {
				// Paced to Python's speed, so that both sides really
				// interleave instead of Go finishing first.
				time.Sleep(time.Millisecond)
				p := goParts[j]
				r, err := be.ChordPartReturn(context.Background(), backend.ChordPart{GroupID: p.gid, GroupIndex: &p.index,
					TaskID: p.id, State: protocol.StateSuccess, Result: int64(10 * p.index)})
				if err != nil {
					t.Errorf("ChordPartReturn: %v", err)
					return
				}
				if r.Ready {
					mu.Lock()
					fired[p.gid]++
					mu.Unlock()
					if len(r.Results) != size {
						t.Errorf("chord %s: %d results", p.gid, len(r.Results))
					}
				}
			}
		})
	}
	wg.Wait()
	proc.wait(t, 2*time.Minute)
	goFired := 0
	for _, n := range fired {
		goFired += n
	}
	for _, m := range queueMessages(t, raw, bodyQueue) {
		fired[strings.TrimPrefix(m.Headers["id"].(string), "body-")]++
	}
	for _, gid := range gids {
		if fired[gid] != 1 {
			t.Errorf("chord %s fired %d times, want 1", gid, fired[gid])
		}
	}
	t.Logf("of %d chords, Go completed %d and Python %d", chords, goFired, chords-goFired)
}

// amqpPublisher is the smallest rpc.Publisher over amqp091: what a
// transport does, without confirms.
type amqpPublisher struct{ ch *amqp091.Channel }

func (p amqpPublisher) Publish(ctx context.Context, pub *transport.Publishing) error {
	m := pub.Message
	return p.ch.PublishWithContext(ctx, pub.Exchange, pub.RoutingKey, false, false, amqp091.Publishing{
		ContentType: m.ContentType, ContentEncoding: m.ContentEncoding, Headers: amqp091.Table(m.Headers),
		DeliveryMode: m.Properties.DeliveryMode, CorrelationId: m.Properties.CorrelationID, Body: m.Body,
	})
}

// TestBackendRPC: Python sends a task with backend rpc:// to a queue nobody
// consumes; the test takes the message, stores the outcome through
// backend/rpc, and Python's .get() returns it (or raises).
func TestBackendRPC(t *testing.T) {
	url := amqpURL(t)
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	be, err := rpc.New(amqpPublisher{ch}, rpc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	env := map[string]string{"IT_BROKER": url, "IT_BACKEND": "rpc://"}

	tests := []struct {
		name  string
		meta  func(id string) *protocol.ResultMeta
		check func(l map[string]any) bool
	}{
		{"success", func(id string) *protocol.ResultMeta {
			return &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess, Result: map[string]any{"sum": int64(5), "s": "é"}}
		}, func(l map[string]any) bool { return l["ok"] == true && mustJSON(l["value"]) == `{"s":"é","sum":5}` }},
		{"failure", func(id string) *protocol.ResultMeta {
			return &protocol.ResultMeta{TaskID: id, Status: protocol.StateFailure, Traceback: "Traceback ...\nValueError: nope\n",
				Result: &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"nope"}, Module: "builtins"}}
		}, func(l map[string]any) bool {
			return l["ok"] == false && l["raised"] == "ValueError" && mustJSON(l["args"]) == `["'nope'"]` && l["state"] == "FAILURE"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			queue := itID("rpcq")
			t.Cleanup(func() {
				_, _ = ch.QueueDelete(queue, false, false, false)
				_ = ch.ExchangeDelete(queue, false, false)
			})
			p := pyStart(t, env, "rpc_send", queue, "[2, 3]", "30")
			sent := p.next(t, time.Minute)
			if sent["event"] != "sent" {
				t.Fatalf("python: %v", sent)
			}
			var d amqp091.Delivery
			deadline := time.Now().Add(20 * time.Second)
			for {
				msg, ok, err := ch.Get(queue, true)
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					d = msg
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no task message in %s", queue)
				}
				time.Sleep(5 * time.Millisecond)
			}
			id, _ := d.Headers["id"].(string)
			if id != sent["id"] || d.ReplyTo == "" {
				t.Fatalf("task message id %q reply_to %q, want id %v and a reply_to", id, d.ReplyTo, sent["id"])
			}
			err := be.Store(t.Context(), backend.StoreRequest{Meta: tt.meta(id), ReplyTo: d.ReplyTo, CorrelationID: d.CorrelationId})
			if err != nil {
				t.Fatal(err)
			}
			if l := p.next(t, time.Minute); !tt.check(l) {
				t.Fatalf("python .get(): %v\n%s", l, p.stderr.String())
			}
			p.wait(t, time.Minute)
		})
	}
}

func base64Decode(s string) ([]byte, error) { return base64.StdEncoding.DecodeString(s) }

func randInt(n int) (int, error) {
	v, err := rand.Int(rand.Reader, big.NewInt(int64(n)))
	if err != nil {
		return 0, err
	}
	return int(v.Int64()), nil
}

// TestBackendWorkerChordRedis runs a chord of 10 through celeriac's worker
// (in-memory transport) with the Redis backend, as a Python client would
// have sent it: header messages with group, group_index and the body in
// embed.chord, .s set first. Python's AsyncResult.get() on the body id
// returns the body's result; with one failing header task it raises the
// ChordError Celery raises.
func TestBackendWorkerChordRedis(t *testing.T) {
	for _, failing := range []bool{false, true} {
		t.Run(fmt.Sprintf("failing=%v", failing), func(t *testing.T) {
			be, _ := newRedisBackend(t, redisbackend.Config{})
			tr := memtransport.New(memtransport.Config{})
			defer tr.Close()
			queue := itID("wq")
			mux := worker.NewMux()
			mux.HandleFunc("it_backend.add", func(ctx context.Context, task *worker.Task) (any, error) {
				var x, y int64
				if err := task.Bind(&x, &y); err != nil {
					return nil, err
				}
				if failing && x == 7 {
					return nil, worker.NewException("ValueError", "seven")
				}
				return x + y, nil
			})
			mux.HandleFunc("it_backend.tsum", func(ctx context.Context, task *worker.Task) (any, error) {
				var xs []int64
				if err := task.Bind(&xs); err != nil {
					return nil, err
				}
				var s int64
				for _, x := range xs {
					s += x
				}
				return s, nil
			})
			w, err := worker.New(tr, mux, worker.Config{Queues: []string{queue}, Concurrency: 8, Backend: be})
			if err != nil {
				t.Fatal(err)
			}
			ctx, stop := context.WithCancel(context.Background())
			runErr := make(chan error, 1)
			go func() { runErr <- w.Run(ctx) }()
			defer func() {
				stop()
				if err := <-runErr; err != nil {
					t.Errorf("worker Run: %v", err)
				}
			}()

			gid, bodyID := itID("wchord"), itID("wbody")
			body := protocol.Signature{Task: "it_backend.tsum", Args: []any{}, Kwargs: map[string]any{},
				Options: map[string]any{"task_id": bodyID, "queue": queue}}
			const size = 10
			if err := be.SetChordSize(t.Context(), gid, size); err != nil {
				t.Fatal(err)
			}
			for i := range size {
				idx := i
				id := fmt.Sprintf("%s-%d", gid, i)
				msg, err := protocol.EncodeTask(&protocol.TaskMessage{
					ID: id, Name: "it_backend.add", Args: []any{int64(i), int64(i)}, Kwargs: map[string]any{},
					Group: gid, GroupIndex: &idx, RootID: id, CorrelationID: id, DeliveryMode: 2,
					Embed: protocol.Embed{Chord: &body},
				}, protocol.EncodeOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if err := tr.Publish(t.Context(), &transport.Publishing{RoutingKey: queue, Message: *msg}); err != nil {
					t.Fatal(err)
				}
			}
			got := pyCall(t, time.Minute, backendEnv(t, nil), "check_exception", bodyID)[0]
			if failing {
				if got["state"] != "FAILURE" || got["raised"] != "ChordError" || !strings.Contains(mustJSON(got["args"]), "seven") {
					t.Fatalf("python on the chord body: %v, want ChordError naming the failed part", got)
				}
				return
			}
			if got["state"] != "SUCCESS" || got["raised"] != nil {
				t.Fatalf("python on the chord body: %v", got)
			}
			if v := pyCall(t, time.Minute, backendEnv(t, nil), "chord_wait", bodyID)[0]["value"]; v != float64(90) {
				t.Fatalf("python .get() on the chord body = %v, want 90", v)
			}
		})
	}
}
