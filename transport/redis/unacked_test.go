package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// pagedHash answers HSCAN over kv in pages of size; with empty, it answers
// only empty pages and never ends, as a hostile or buggy server might.
type pagedHash struct {
	kv    []string
	size  int
	empty bool
	calls int
}

func (h *pagedHash) scan(_ context.Context, cursor uint64) ([]string, uint64, error) {
	h.calls++
	if h.empty {
		return nil, cursor + 1, nil
	}
	from := int(cursor) * 2 * h.size
	to := min(from+2*h.size, len(h.kv))
	next := cursor + 1
	if to == len(h.kv) {
		next = 0
	}
	return h.kv[from:to], next, nil
}

func unackedEntries(n int, value func(i int) string) []string {
	var kv []string
	for i := range n {
		kv = append(kv, fmt.Sprintf("tag-%d", i), value(i))
	}
	return kv
}

// TestCountUnacked: entries are counted by routing key; the count stops at
// its entry and byte bounds and after a bounded number of rounds, and says
// so; values that are not kombu's triple count under "".
func TestCountUnacked(t *testing.T) {
	ctx := context.Background()
	triple := func(rk string) string { return `[{"body": "W10="}, "", "` + rk + `"]` }
	h := &pagedHash{kv: unackedEntries(7, func(i int) string {
		switch i {
		case 5:
			return "not json"
		case 6:
			return `[{}, "", "` + strings.Repeat("k", unackedMaxKeyBytes+1) + `"]`
		}
		return triple([]string{"celery", "celery", "hipri", `q"x`, "celery"}[i])
	}), size: 2}
	h.kv[7] = `[{"body": "W10="}, "", "q\"x"]`
	got, err := countUnacked(ctx, h.scan, 100, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	want := UnackedCount{ByRoutingKey: map[string]int{"celery": 3, "hipri": 1, `q"x`: 1, "": 2}, Read: 7}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("count (-want +got):\n%s", d)
	}

	h = &pagedHash{kv: unackedEntries(50, func(int) string { return triple("celery") }), size: 10}
	if got, _ := countUnacked(ctx, h.scan, 25, 1<<20); got.Read != 25 || !got.Capped || got.ByRoutingKey["celery"] != 25 {
		t.Errorf("entry cap: %+v", got)
	}
	h = &pagedHash{kv: unackedEntries(50, func(int) string { return triple("celery") + strings.Repeat(" ", 1000) }), size: 10}
	if got, _ := countUnacked(ctx, h.scan, 1000, 10_000); got.Read > 11 || !got.Capped {
		t.Errorf("byte cap: %+v", got)
	}
	h = &pagedHash{kv: unackedEntries(50, func(int) string { return triple("celery") }), size: 10}
	if got, _ := countUnacked(ctx, h.scan, 50, 1<<20); got.Read != 50 || got.Capped {
		t.Errorf("exactly the limit is the whole hash: %+v", got)
	}
	h = &pagedHash{empty: true}
	if got, _ := countUnacked(ctx, h.scan, 1000, 1<<20); !got.Capped || h.calls > 1000/unackedScanCount*2+10 {
		t.Errorf("endless empty pages: %+v after %d calls", got, h.calls)
	}
	h = &pagedHash{kv: unackedEntries(3*unackedMaxKeys, func(i int) string { return triple(fmt.Sprint("q", i)) }), size: 500}
	got, _ = countUnacked(ctx, h.scan, 1<<20, 1<<30)
	if len(got.ByRoutingKey) > unackedMaxKeys+1 || got.ByRoutingKey[""] != 2*unackedMaxKeys {
		t.Errorf("distinct keys not bounded: %d keys, %d under \"\"", len(got.ByRoutingKey), got.ByRoutingKey[""])
	}
	boom := errors.New("boom")
	if _, err := countUnacked(ctx, func(context.Context, uint64) ([]string, uint64, error) { return nil, 0, boom }, 10, 10); !errors.Is(err, boom) {
		t.Errorf("err = %v", err)
	}
}

// TestUnackedByRoutingKey: messages a consumer holds are counted under
// their queue, up to the limit, and leave the count once acked.
func TestUnackedByRoutingKey(t *testing.T) {
	e := newEnv(t)
	tr := e.dial(e.config())
	ctx := context.Background()
	for i := range 3 {
		e.push("ua", 0, pyEnvelope(fmt.Sprint("ua-", i), "ua", 0, i))
	}
	e.push("ub", 0, pyEnvelope("ub-0", "ub", 0, 9))
	c := consume(t, tr, 10, "ua", "ub")
	for range 4 {
		if d := receive(t, c.Deliveries()); d.Queue == "ub" {
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := tr.UnackedByRoutingKey(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	if want := (UnackedCount{ByRoutingKey: map[string]int{"ua": 3}, Read: 3, Total: 3}); !cmp.Equal(want, got) {
		t.Errorf("UnackedByRoutingKey = %+v, want %+v", got, want)
	}
	if got, _ := tr.UnackedByRoutingKey(ctx, 2); got.Read != 2 || got.Total != 3 || !got.Capped {
		t.Errorf("limit 2: %+v", got)
	}
}
