package redis

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// pops runs a test with the consume script and with the staged pop.
func pops(t *testing.T, f func(t *testing.T, staged bool)) {
	t.Run("script", func(t *testing.T) { f(t, false) })
	t.Run("staged", func(t *testing.T) { f(t, true) })
}

func TestQuickMetaAgreesWithParseMeta(t *testing.T) {
	tag := "7f1c0d2e-0000-4000-8000-000000000001"
	for _, tc := range []struct {
		name, raw   string
		tag, ex, rk string
		wantErr     bool
	}{
		{name: "kombu", raw: pyEnvelope(tag, "q1", 0, 1), tag: tag, ex: "", rk: "q1"},
		{name: "compact", raw: `{"body":"","properties":{"delivery_info":{"exchange":"ex","routing_key":"rk"},"delivery_tag":"t1"}}`,
			tag: "t1", ex: "ex", rk: "rk"},
		{name: "escaped routing key", raw: `{"properties": {"delivery_info": {"exchange": "", "routing_key": "a\"b"}, "delivery_tag": "t2"}}`,
			tag: "t2", ex: "", rk: `a"b`},
		{name: "key twice (a header that looks like one)", raw: `{"headers": {"x": {"delivery_tag": "fake"}}, "properties": {"delivery_info": {"exchange": "", "routing_key": "q"}, "delivery_tag": "t3"}, "properties2": 1}`,
			tag: "t3", ex: "", rk: "q"},
		{name: "properties twice", raw: `{"properties": {"delivery_tag": "x"}, "properties": {"delivery_info": {"exchange": "", "routing_key": "q"}, "delivery_tag": "t4"}}`,
			tag: "t4", ex: "", rk: "q"},
		{name: "no routing key", raw: `{"properties": {"delivery_tag": "t5"}}`, tag: "t5"},
		{name: "no tag", raw: `{"properties": {"priority": 0}}`, wantErr: true},
		{name: "not JSON", raw: "not json \xff", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tag, ex, rk, err := quickMeta([]byte(tc.raw))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			got := [3]string{tag, ex, rk}
			if want := [3]string{tc.tag, tc.ex, tc.rk}; got != want {
				t.Fatalf("quickMeta = %q, want %q", got, want)
			}
			m, err := parseMeta([]byte(tc.raw))
			if err != nil {
				t.Fatal(err)
			}
			if full := [3]string{m.Tag, m.Exchange, m.RoutingKey}; full != got {
				t.Fatalf("parseMeta = %q, quickMeta %q", full, got)
			}
		})
	}
}

func TestStagedPlanFollowsKombuOrder(t *testing.T) {
	k := keys{prefix: "p:", sep: DefaultSep, steps: []int{0, 3, 6, 9}}
	band := func(q string, b int) string { return k.prefix + k.queueBand(q, b) }
	for _, tc := range []struct {
		name     string
		strategy string
		order    []string
		lens     map[string]int64
		n        int
		want     []step
	}{
		{name: "one queue, bands in order", strategy: RoundRobin, order: []string{"a"},
			lens: map[string]int64{band("a", 0): 2, band("a", 6): 5}, n: 4,
			want: []step{{"a", band("a", 0), 2}, {"a", band("a", 6), 2}}},
		{name: "round robin inside a band", strategy: RoundRobin, order: []string{"a", "b"},
			lens: map[string]int64{band("a", 0): 3, band("b", 0): 1, band("b", 3): 1}, n: 10,
			want: []step{{"a", band("a", 0), 1}, {"b", band("b", 0), 1}, {"a", band("a", 0), 2}, {"b", band("b", 3), 1}}},
		{name: "priority strategy drains the first queue first", strategy: Priority, order: []string{"a", "b"},
			lens: map[string]int64{band("a", 0): 2, band("b", 0): 2}, n: 3,
			want: []step{{"a", band("a", 0), 2}, {"b", band("b", 0), 1}}},
		{name: "nothing known", strategy: RoundRobin, order: []string{"a"}, lens: map[string]int64{}, n: 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &stager{t: &Transport{cfg: Config{QueueOrderStrategy: tc.strategy}, keys: k}, lens: tc.lens}
			got := s.plan(tc.order, tc.n)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(step{})); diff != "" {
				t.Fatalf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// A consumer that died between its moves and its records left messages in
// its staging list: a sweeper puts them back at the front of their list,
// in their order, once the consumer's heartbeat is older than the lease,
// and leaves a live consumer's alone.
func TestStagedSweepPutsBackADeadConsumersMessages(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cfg.StagedPop = true
	tr := e.dial(cfg)
	ctx := context.Background()
	src := e.key("rt_q")
	e.push("rt_q", 0, pyEnvelope(newTag(), "rt_q", 0, 9)) // behind the staged ones
	e.stage("dead", time.Now().Add(-2*time.Minute), 1, 2, 3)
	e.stage("alive", time.Now(), 7)
	n, err := tr.SweepStaged(ctx)
	if err != nil || n != 3 {
		t.Fatalf("SweepStaged = %d, %v; want 3", n, err)
	}
	var got []int
	for {
		v, err := e.raw.RPop(ctx, src).Result()
		if err != nil {
			break
		}
		var env struct {
			Headers struct{ ID string } `json:"headers"`
		}
		json.Unmarshal([]byte(v), &env)
		var i int
		fmt.Sscanf(env.Headers.ID, "00000000-0000-4000-8000-%d", &i)
		got = append(got, i)
	}
	if diff := cmp.Diff([]int{1, 2, 3, 9}, got); diff != "" {
		t.Fatalf("queue order after the sweep (-want +got):\n%s", diff)
	}
	if e.raw.Exists(ctx, stagedList(e.prefix, "dead", 0)).Val() != 0 || e.raw.HExists(ctx, e.key(stagedRegistry), "dead").Val() {
		t.Fatal("the dead consumer's staging list or registry entry is left")
	}
	if e.raw.LLen(ctx, stagedList(e.prefix, "alive", 0)).Val() != 1 || !e.raw.HExists(ctx, e.key(stagedRegistry), "alive").Val() {
		t.Fatal("the live consumer's staging was touched")
	}
}

// A sweeper that puts a slow consumer's staged messages back between its
// moves and its records wins: the consumer's records are not written (its
// EXEC fails on the fence), and every message is delivered once, from the
// queue again.
func TestStagedRoundLosesToASweep(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cfg.StagedPop = true
	tr := e.dial(cfg)
	ctx := context.Background()
	var swept atomic.Int32
	tr.stagedHook = func(id string) {
		if swept.Add(1) != 1 {
			return
		}
		n, err := tr.putBack(ctx, id, []string{e.key("rt_q")}, 0)
		if err != nil || n == 0 {
			t.Errorf("putBack = %d, %v", n, err)
		}
	}
	const total = 20
	for i := range total {
		e.push("rt_q", 0, pyEnvelope(newTag(), "rt_q", 0, i))
	}
	c := consume(t, tr, 100, "rt_q")
	seen := map[int]int{}
	for range total {
		d := receive(t, c.Deliveries())
		seen[idx(d)]++
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	noDelivery(t, c.Deliveries(), 300*time.Millisecond)
	for i := range total {
		if seen[i] != 1 {
			t.Fatalf("message %d delivered %d times", i, seen[i])
		}
	}
	if swept.Load() < 2 {
		t.Fatalf("the hook ran %d times: the sweep did not happen mid-round", swept.Load())
	}
	if n := e.raw.HLen(ctx, e.key("unacked")).Val(); n != 0 {
		t.Fatalf("unacked holds %d records after every ack", n)
	}
}

// A transport whose consumer died leaves its staging list; another
// celeriac transport's background sweep puts it back after the lease and
// its consumer delivers the messages.
func TestStagedDeadConsumerIsSweptByAnother(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.stage("crashed", time.Now(), 0, 1, 2)
	cfg := e.config()
	cfg.StagedPop = true
	cfg.StagedLease = 600 * time.Millisecond
	tr := e.dial(cfg)
	c := consume(t, tr, 10, "rt_q")
	var got []int
	for range 3 {
		d := receive(t, c.Deliveries())
		got = append(got, idx(d))
		d.Ack(ctx)
	}
	if diff := cmp.Diff([]int{0, 1, 2}, got); diff != "" {
		t.Fatalf("order (-want +got):\n%s", diff)
	}
}

// Stopping a consumer leaves no staging state behind.
func TestStagedStopLeavesNothing(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cfg.StagedPop = true
	tr := e.dial(cfg)
	ctx := context.Background()
	e.push("rt_q", 0, pyEnvelope(newTag(), "rt_q", 0, 1))
	c := consume(t, tr, 10, "rt_q")
	d := receive(t, c.Deliveries())
	d.Ack(ctx)
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	ks, _ := e.raw.Keys(ctx, e.key(stagedRegistry)+"*").Result()
	if len(ks) != 0 {
		t.Fatalf("keys left after Stop: %q", ks)
	}
}

// stage leaves what a staged consumer id that beat at at and then died
// would: its registry entry (one source list, rt_q) and messages is in its
// staging list, as LMOVE RIGHT LEFT leaves them (the newest on the left).
func (e *env) stage(id string, at time.Time, is ...int) {
	e.t.Helper()
	ctx := context.Background()
	b, _ := json.Marshal(stagedBeat{At: at.UnixMilli(), Lists: []string{e.key("rt_q")}})
	if err := e.raw.HSet(ctx, e.key(stagedRegistry), id, b).Err(); err != nil {
		e.t.Fatal(err)
	}
	for _, i := range is {
		if err := e.raw.LPush(ctx, stagedList(e.prefix, id, 0), pyEnvelope(newTag(), "rt_q", 0, i)).Err(); err != nil {
			e.t.Fatal(err)
		}
	}
}
