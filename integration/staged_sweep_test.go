package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRedisStagedSweepPythonRuns: messages Python Celery published, left in
// the staging list of a staged-pop celeriac worker that died between its two
// round trips, are put back by `celeriac staged sweep`, and a Python worker
// (the fleet gone back to Python alone) then runs every one of them.
//
// The dead worker's state is written as the transport leaves it (registry
// entry and staging list under _celeriac.staging, LMOVE RIGHT LEFT): a real
// kill between the two round trips cannot be timed from here. The transport's
// own tests cover the round that makes that state.
func TestRedisStagedSweepPythonRuns(t *testing.T) {
	r := newRedisIT(t, 30*time.Second)
	const n = 5
	r.publish("it.record", make([]int, n))
	ctx := context.Background()
	src := r.key(r.queue)
	registry := r.key("_celeriac.staging")
	staging := registry + ".dead.0"
	for range n {
		if err := r.raw.LMove(ctx, src, staging, "RIGHT", "LEFT").Err(); err != nil {
			t.Fatalf("staging a message: %v", err)
		}
	}
	beat, _ := json.Marshal(map[string]any{"at": time.Now().Add(-2 * time.Minute).UnixMilli(), "lists": []string{src}})
	if err := r.raw.HSet(ctx, registry, "dead", beat).Err(); err != nil {
		t.Fatal(err)
	}
	if l := r.raw.LLen(ctx, src).Val(); l != 0 {
		t.Fatalf("queue holds %d messages after staging them all", l)
	}

	cfg := filepath.Join(t.TempDir(), "celeryconfig.json")
	doc := fmt.Sprintf(`{"broker_url": %q, "broker_transport_options": {"global_keyprefix": %q}}`, r.url, r.prefix)
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	res := cliRaw(t, "--config", cfg, "staged", "sweep")
	if res.code != 0 || !strings.Contains(res.stdout, fmt.Sprintf("put back %d staged messages", n)) {
		t.Fatalf("staged sweep: %s", res)
	}
	if l := r.raw.LLen(ctx, src).Val(); l != n {
		t.Fatalf("queue holds %d messages after the sweep, want %d", l, n)
	}

	startPythonWorker(t, r.env(), "it_redis_app", "-Q", r.queue, "-P", "solo", "-c", "1",
		"--without-gossip", "--without-mingle", "--without-heartbeat")
	waitFor(t, "the Python worker to run every swept message", 90*time.Second, func() bool { return len(r.done()) == n })
	for i, c := range r.done() {
		if c != 1 {
			t.Errorf("message %d ran %d times", i, c)
		}
	}
}
