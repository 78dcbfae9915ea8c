package redis

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/backendtest"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// testDB is this package's Redis database (see docs/testing.md).
const testDB = 11

// testPrefix returns a global key prefix no other test uses; every key the
// test writes starts with it, and they are deleted when the test ends.
func testPrefix(t testing.TB) string {
	t.Helper()
	return "bt_" + strings.ToLower(rand.Text()[:12]) + ":"
}

// rawClient is a plain client on the test database for checks and cleanup.
func rawClient(t testing.TB) *goredis.Client {
	t.Helper()
	opt, err := goredis.ParseURL(transporttest.RedisURL(t, testDB))
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// newTest returns a backend whose keys carry a unique global prefix, and a
// raw client. The keys are deleted at the end of the test.
func newTest(t testing.TB, cfg Config) (*Backend, *goredis.Client) {
	t.Helper()
	raw := rawClient(t)
	if cfg.URL == "" {
		cfg.URL = transporttest.RedisURL(t, testDB)
	}
	if cfg.GlobalKeyPrefix == "" {
		cfg.GlobalKeyPrefix = testPrefix(t)
	}
	prefix := cfg.GlobalKeyPrefix
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		_ = b.Close()
		deleteKeys(t, raw, prefix+"*")
	})
	return b, raw
}

func deleteKeys(t testing.TB, c *goredis.Client, pattern string) {
	t.Helper()
	ctx := context.Background()
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if len(keys) > 0 {
		if err := c.Del(ctx, keys...).Err(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		b, _ := newTest(t, Config{})
		return b
	}, backendtest.Features{Chords: true})
}

func TestConformanceMsgpackNoExpiryUnordered(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		b, _ := newTest(t, Config{Serializer: "msgpack", ResultExpires: NoExpiry, UnorderedChords: true, MaxBatch: 1})
		return b
	}, backendtest.Features{Chords: true, UnorderedChords: true})
}

func TestStoreWireFormat(t *testing.T) {
	for _, tt := range []struct {
		name    string
		cfg     Config
		wantTTL time.Duration
	}{
		{"default", Config{}, 24 * time.Hour},
		{"expires", Config{ResultExpires: 90 * time.Second}, 90 * time.Second},
		{"no expiry", Config{ResultExpires: NoExpiry}, -1},
		{"msgpack", Config{Serializer: protocol.ContentTypeMsgpack}, 24 * time.Hour},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, raw := newTest(t, tt.cfg)
			ctx := t.Context()
			id := "wire-" + rand.Text()
			key := b.TaskKey(id)
			if !strings.HasSuffix(key, "_celery-task-meta-"+id) && !strings.HasSuffix(key, ":celery-task-meta-"+id) {
				t.Fatalf("TaskKey = %q", key)
			}
			sub := raw.Subscribe(ctx, key)
			defer sub.Close()
			if _, err := sub.Receive(ctx); err != nil { // the subscription confirmation
				t.Fatal(err)
			}
			meta := &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess, Result: "héllo", DateDone: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)}
			if err := b.Store(ctx, backend.StoreRequest{Meta: meta}); err != nil {
				t.Fatal(err)
			}
			got, err := raw.Get(ctx, key).Bytes()
			if err != nil {
				t.Fatal(err)
			}
			dec, err := protocol.DecodeResult(got, b.s.contentType, protocol.DecodeOptions{})
			if err != nil {
				t.Fatalf("stored document does not decode as %s: %v", b.s.contentType, err)
			}
			if d := cmp.Diff(meta, dec, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("stored document (-want +got):\n%s", d)
			}
			msg, err := sub.ReceiveMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if msg.Channel != key || msg.Payload != string(got) {
				t.Errorf("published %q on %q, want the stored document on %q", msg.Payload, msg.Channel, key)
			}
			ttl, err := raw.TTL(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantTTL < 0 {
				if ttl != -1 {
					t.Errorf("TTL = %v, want none", ttl)
				}
			} else if ttl <= tt.wantTTL-time.Minute || ttl > tt.wantTTL {
				t.Errorf("TTL = %v, want %v", ttl, tt.wantTTL)
			}
		})
	}
}

// TestStoreKeepsPythonSuccess: documents written by Python workers (json
// with Python's separators, or msgpack) are read by the store script.
func TestStoreKeepsStoredSuccess(t *testing.T) {
	deep := strings.Repeat("[", 1200) + strings.Repeat("]", 1200)
	for _, tt := range []struct {
		name     string
		cfg      Config
		stored   string
		wantKept bool
	}{
		{"python json success", Config{}, `{"status": "SUCCESS", "result": 5, "traceback": null, "children": [], "date_done": "2026-11-29T13:13:55.990025", "task_id": "x"}`, true},
		{"python json failure", Config{}, `{"status": "FAILURE", "result": {"exc_type": "ValueError", "exc_message": ["SUCCESS"], "exc_module": "builtins"}, "traceback": null, "children": [], "date_done": null, "task_id": "x"}`, false},
		{"status later", Config{}, `{"result": {"status": "SUCCESS"}, "status": "RETRY"}`, false},
		{"too deep for cjson", Config{}, `{"status": "SUCCESS", "result": ` + deep + `}`, true},
		{"not json", Config{}, `SUCCESS?`, false},
		{"msgpack success", Config{Serializer: "msgpack"}, "\x82\xa6status\xa7SUCCESS\xa6result\x05", true},
		{"msgpack started", Config{Serializer: "msgpack"}, "\x82\xa6status\xa7STARTED\xa6result\xa7SUCCESS", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, raw := newTest(t, tt.cfg)
			ctx := t.Context()
			id := "keep-" + rand.Text()
			if err := raw.Set(ctx, b.TaskKey(id), tt.stored, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			err := b.Store(ctx, backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: id, Status: protocol.StateFailure,
				Result: &protocol.ExceptionInfo{Type: "KeyError", Message: []any{"k"}, Module: "builtins"}}})
			if err != nil {
				t.Fatal(err)
			}
			got, err := raw.Get(ctx, b.TaskKey(id)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if kept := got == tt.stored; kept != tt.wantKept {
				t.Errorf("stored document kept = %v, want %v (now %.80q)", kept, tt.wantKept, got)
			}
		})
	}
}

func TestStoreTooLargeAndClosed(t *testing.T) {
	b, _ := newTest(t, Config{})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Ping(t.Context()); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Ping after Close: %v", err)
	}
}

func TestStoreScriptFlushed(t *testing.T) {
	b, raw := newTest(t, Config{})
	ctx := t.Context()
	store := func(n int) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				m := &protocol.ResultMeta{TaskID: fmt.Sprintf("flush-%d", i), Status: protocol.StateSuccess, Result: int64(i)}
				if err := b.Store(ctx, backend.StoreRequest{Meta: m}); err != nil {
					t.Errorf("Store: %v", err)
				}
			})
		}
		wg.Wait()
	}
	store(4)
	// Another test process may be using the script cache too: a flush only
	// costs them one EVAL.
	if err := raw.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	store(8)
	for i := range 8 {
		if _, err := b.Get(ctx, fmt.Sprintf("flush-%d", i)); err != nil {
			t.Errorf("Get after SCRIPT FLUSH: %v", err)
		}
	}
}

// queued returns the number of stores waiting for a round trip.
func (b *Backend) queued() int {
	b.commitMu.Lock()
	defer b.commitMu.Unlock()
	return len(b.pending)
}

// blockHook holds the first command or pipeline the backend sends until
// release is closed, so that a test can queue stores behind it.
type blockHook struct {
	once    sync.Once
	entered chan struct{}
	release chan struct{}
	mu      sync.Mutex
	sizes   []int // stores (script keys) per round trip
}

func (h *blockHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *blockHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.wait([]goredis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (h *blockHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.wait(cmds)
		return next(ctx, cmds)
	}
}

// wait records round trips of the store script (not the commands that set
// up new connections), as the number of results they store, and blocks the
// first.
func (h *blockHook) wait(cmds []goredis.Cmder) {
	n := 0
	for _, c := range cmds {
		if name := c.Name(); name == "evalsha" || name == "eval" {
			// EVALSHA sha numkeys key...
			if keys, ok := c.Args()[2].(int); ok {
				n += keys
			}
		}
	}
	if n == 0 {
		return
	}
	h.mu.Lock()
	h.sizes = append(h.sizes, n)
	h.mu.Unlock()
	h.once.Do(func() {
		close(h.entered)
		<-h.release
	})
}

// TestGroupCommit: stores that arrive while a round trip is in flight are
// written together in the next one, and each caller gets its own outcome.
func TestGroupCommit(t *testing.T) {
	b, raw := newTest(t, Config{})
	ctx := t.Context()
	h := &blockHook{entered: make(chan struct{}), release: make(chan struct{})}
	b.client.AddHook(h)

	var wg sync.WaitGroup
	errs := make(chan error, 100)
	storeAsync := func(id string, st protocol.State) {
		wg.Go(func() {
			err := b.Store(ctx, backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: id, Status: st, Result: id}})
			if err != nil {
				errs <- fmt.Errorf("%s: %w", id, err)
			}
		})
	}
	storeAsync("first", protocol.StateSuccess)
	<-h.entered // the committer is now blocked in its first round trip
	const n = 40
	for i := range n {
		storeAsync(fmt.Sprintf("batched-%d", i), protocol.StateSuccess)
	}
	// One of them fails: a key holding a list makes GET fail (WRONGTYPE).
	if err := raw.RPush(ctx, b.TaskKey("wrongtype"), "x").Err(); err != nil {
		t.Fatal(err)
	}
	var wrong error
	wg.Go(func() {
		wrong = b.Store(ctx, backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "wrongtype", Status: protocol.StateSuccess}})
	})
	for b.queued() < n+1 {
		time.Sleep(time.Millisecond) // waiting for goroutines to queue, not for time to pass
	}
	close(h.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if wrong == nil || !strings.Contains(wrong.Error(), "WRONGTYPE") {
		t.Errorf("store over a list: err = %v, want WRONGTYPE", wrong)
	}
	h.mu.Lock()
	sizes := append([]int(nil), h.sizes...)
	h.mu.Unlock()
	if len(sizes) != 2 || sizes[0] != 1 || sizes[1] != n+1 {
		t.Errorf("round trips carried %v stores, want [1 %d]", sizes, n+1)
	}
	for i := range n {
		if _, err := b.Get(ctx, fmt.Sprintf("batched-%d", i)); err != nil {
			t.Errorf("Get: %v", err)
		}
	}
}

func TestStoreContextCanceledWhileQueued(t *testing.T) {
	b, raw := newTest(t, Config{})
	h := &blockHook{entered: make(chan struct{}), release: make(chan struct{})}
	b.client.AddHook(h)
	done := make(chan error, 1)
	go func() {
		done <- b.Store(context.Background(), backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "a", Status: protocol.StateSuccess}})
	}()
	<-h.entered
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		errc <- b.Store(ctx, backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "b", Status: protocol.StateSuccess}})
	}()
	for b.queued() < 1 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("Store with canceled ctx: %v", err)
	}
	close(h.release)
	if err := <-done; err != nil {
		t.Errorf("first Store: %v", err)
	}
	// The canceled store had reached the queue: it is written, at the
	// latest when Close stops the committer.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if n := raw.Exists(t.Context(), b.TaskKey("b")).Val(); n != 1 {
		t.Errorf("the canceled but queued store was not written")
	}
}

func TestSetChordSizeWire(t *testing.T) {
	b, raw := newTest(t, Config{ResultExpires: time.Hour})
	ctx := t.Context()
	key := b.groupKey("g1", ".s")
	sub := raw.Subscribe(ctx, key)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.SetChordSize(ctx, "g1", 12); err != nil {
		t.Fatal(err)
	}
	if got, err := raw.Get(ctx, key).Result(); err != nil || got != "12" {
		t.Errorf("GET .s = %q, %v; want \"12\"", got, err)
	}
	if ttl := raw.TTL(ctx, key).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Errorf("TTL .s = %v", ttl)
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil || msg.Payload != "12" {
		t.Errorf("published %v, %v; want 12", msg, err)
	}
}

// TestChordWire checks the member encoding, scores and key TTLs against
// what Celery writes, and that Python-written members are read back.
func TestChordWire(t *testing.T) {
	b, raw := newTest(t, Config{ResultExpires: time.Hour})
	ctx := t.Context()
	gid := "g-" + rand.Text()
	jkey := b.groupKey(gid, ".j")
	// A part stored by a Python worker (json.dumps separators) and one
	// without group_index.
	py := `[1, "py-0", "SUCCESS", {"a": [1, 2.5, null, "\u00e9"]}]`
	if err := raw.ZAdd(ctx, jkey, goredis.Z{Score: 0, Member: py}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.SetChordSize(ctx, gid, 3); err != nil {
		t.Fatal(err)
	}
	r, err := b.ChordPartReturn(ctx, backend.ChordPart{GroupID: gid, TaskID: "go-x", State: protocol.StateFailure,
		Result: &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad"}, Module: "builtins"}})
	if err != nil || r.Ready {
		t.Fatalf("second part: %+v, %v", r, err)
	}
	zs, err := raw.ZRangeWithScores(ctx, jkey, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(zs) != 2 || zs[1].Score != posInf() {
		t.Fatalf("ZRANGE = %+v, want the Go part with score +inf", zs)
	}
	var member []any
	if err := json.Unmarshal([]byte(zs[1].Member.(string)), &member); err != nil {
		t.Fatal(err)
	}
	want := []any{1.0, "go-x", "FAILURE", map[string]any{"exc_type": "ValueError", "exc_message": []any{"bad"}, "exc_module": "builtins"}}
	if d := cmp.Diff(want, member); d != "" {
		t.Errorf("member (-want +got):\n%s", d)
	}
	for _, k := range []string{".j", ".s"} {
		if ttl := raw.TTL(ctx, b.groupKey(gid, k)).Val(); ttl <= 59*time.Minute {
			t.Errorf("TTL %s = %v, want about an hour", k, ttl)
		}
	}
	one := 1
	r, err = b.ChordPartReturn(ctx, backend.ChordPart{GroupID: gid, GroupIndex: &one, TaskID: "go-1", State: protocol.StateSuccess, Result: int64(7)})
	if err != nil || !r.Ready {
		t.Fatalf("last part: %+v, %v", r, err)
	}
	zero := 0
	wantParts := []backend.ChordPart{
		{GroupID: gid, GroupIndex: &zero, TaskID: "py-0", State: protocol.StateSuccess, Result: map[string]any{"a": []any{int64(1), 2.5, nil, "é"}}},
		{GroupID: gid, GroupIndex: &one, TaskID: "go-1", State: protocol.StateSuccess, Result: int64(7)},
		{GroupID: gid, TaskID: "go-x", State: protocol.StateFailure, Result: &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad"}, Module: "builtins"}},
	}
	if d := cmp.Diff(wantParts, r.Results); d != "" {
		t.Errorf("results (-want +got):\n%s", d)
	}
	if n := raw.Exists(ctx, jkey, b.groupKey(gid, ".s"), b.groupKey(gid, ".t")).Val(); n != 0 {
		t.Errorf("%d chord keys left after completion", n)
	}
}

func posInf() float64 { var z float64; return 1 / z }

// TestChordReplacedTasks: Task.replace INCRs .t; the chord then needs that
// many more parts.
func TestChordReplacedTasks(t *testing.T) {
	b, raw := newTest(t, Config{})
	ctx := t.Context()
	gid := "g-" + rand.Text()
	if err := raw.IncrBy(ctx, b.groupKey(gid, ".t"), 2).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.SetChordSize(ctx, gid, 2); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		r, err := b.ChordPartReturn(ctx, backend.ChordPart{GroupID: gid, GroupIndex: &i, TaskID: fmt.Sprint("t", i), State: protocol.StateSuccess})
		if err != nil {
			t.Fatal(err)
		}
		if r.Ready != (i == 3) {
			t.Fatalf("part %d: Ready = %v", i, r.Ready)
		}
	}
}

func TestChordComplexHeader(t *testing.T) {
	b, raw := newTest(t, Config{})
	ctx := t.Context()
	gid := "g-" + rand.Text()
	if err := raw.Set(ctx, b.groupKey(gid, ""), `{"result": [["x", null], []]}`, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.SetChordSize(ctx, gid, 1); err != nil {
		t.Fatal(err)
	}
	r, err := b.ChordPartReturn(ctx, backend.ChordPart{GroupID: gid, TaskID: "t", State: protocol.StateSuccess, Result: "v"})
	if err != nil || !r.Ready || len(r.Results) != 2 || r.Results[0].State != protocol.StateFailure || r.Results[1].TaskID != "t" {
		t.Fatalf("ChordPartReturn = %+v, %v; want Ready with a failed part first", r, err)
	}
}

func TestChordBadMember(t *testing.T) {
	b, raw := newTest(t, Config{})
	ctx := t.Context()
	gid := "g-" + rand.Text()
	if err := raw.ZAdd(ctx, b.groupKey(gid, ".j"), goredis.Z{Score: 0, Member: "not json"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.SetChordSize(ctx, gid, 2); err != nil {
		t.Fatal(err)
	}
	one := 1
	r, err := b.ChordPartReturn(ctx, backend.ChordPart{GroupID: gid, GroupIndex: &one, TaskID: "t", State: protocol.StateSuccess})
	if err != nil || !r.Ready || len(r.Results) != 2 || r.Results[0].State != protocol.StateFailure || r.Results[1].TaskID != "t" {
		t.Fatalf("ChordPartReturn = %+v, %v; want Ready, a failed part for the bad member and the good part", r, err)
	}
}

func TestChordSizeNotNumber(t *testing.T) {
	b, raw := newTest(t, Config{})
	ctx := t.Context()
	gid := "g-" + rand.Text()
	if err := raw.Set(ctx, b.groupKey(gid, ".s"), "many", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ChordPartReturn(ctx, backend.ChordPart{GroupID: gid, TaskID: "t", State: protocol.StateSuccess}); err == nil {
		t.Fatal("ChordPartReturn accepted a non-numeric chord size")
	}
}

// TestWaitReplicas: with WaitReplicas the store waits for replicas with
// WAIT; the test server has none, so every store is written on the master
// but counted (and logged) as unreplicated. Without the option nothing is
// counted.
func TestWaitReplicas(t *testing.T) {
	ctx := context.Background()
	raw := rawClient(t)
	if info, err := raw.Info(ctx, "replication").Result(); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(info, "connected_slaves:0") {
		t.Fatalf("the test server has replicas; this test needs none:\n%s", info)
	}
	for _, tc := range []struct {
		name     string
		replicas int
		want     int64
	}{{"off", 0, 0}, {"one replica wanted", 1, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := newTest(t, Config{WaitReplicas: tc.replicas, WaitTimeout: 20 * time.Millisecond, MaxBatch: 1})
			for i := range 3 {
				id := fmt.Sprintf("wait-%d", i)
				if err := b.Store(ctx, backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess, Result: i}}); err != nil {
					t.Fatal(err)
				}
				if m, err := b.Get(ctx, id); err != nil || m.Status != protocol.StateSuccess {
					t.Fatalf("Get(%s) = %+v, %v", id, m, err)
				}
			}
			if got := b.Unreplicated(); got != tc.want {
				t.Errorf("Unreplicated() = %d, want %d", got, tc.want)
			}
		})
	}
	if _, err := New(Config{WaitReplicas: -1}); err == nil {
		t.Error("negative WaitReplicas accepted")
	}
}
