package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/transport/transporttest"
)

// TestStagedSweep: `celeriac staged sweep` puts back what a staged
// consumer whose heartbeat stopped left in its staging lists, and leaves
// a live consumer's alone. The staging state is written the way the
// transport writes it (its own tests cover the round that makes it).
func TestStagedSweep(t *testing.T) {
	ctx := context.Background()
	url := transporttest.RedisURL(t, redisDB)
	opt, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(opt)
	defer rdb.Close()

	// A key prefix of the test's own: a sweep reads every consumer the
	// registry names, and other packages' staged tests share this Redis.
	prefix := "staged-sweep-" + randHex(6) + ":"
	cfg := writeConfig(t, fmt.Sprintf(`{"broker_url": %q, "broker_transport_options": {"global_keyprefix": %q}}`, url, prefix))
	registry := prefix + "_celeriac.staging"
	q := prefix + "q"
	dead, live := "dead-"+randHex(6), "live-"+randHex(6)
	list := func(id string) string { return registry + "." + id + ".0" }
	t.Cleanup(func() {
		rdb.Del(ctx, q, list(dead), list(live), registry+"."+dead+".fence", registry+"."+live+".fence")
		rdb.HDel(ctx, registry, dead, live)
	})
	beat := func(at time.Time) string { return fmt.Sprintf(`{"at":%d,"lists":[%q]}`, at.UnixMilli(), q) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(rdb.RPush(ctx, q, "queued").Err())
	must(rdb.RPush(ctx, list(dead), "m1", "m2").Err())
	must(rdb.HSet(ctx, registry, dead, beat(time.Now().Add(-2*time.Minute))).Err())
	must(rdb.RPush(ctx, list(live), "m3").Err())
	must(rdb.HSet(ctx, registry, live, beat(time.Now())).Err())

	out := mustCLI(t, "--config", cfg, "staged", "sweep")
	for _, want := range []string{"put back 2 staged messages of stopped workers", "1 message still staged by workers that beat within the last 60 s"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	got, err := rdb.LRange(ctx, q, 0, -1).Result()
	must(err)
	slices.Sort(got)
	if want := []string{"m1", "m2", "queued"}; !slices.Equal(got, want) {
		t.Errorf("queue holds %q, want %q", got, want)
	}
	if n := rdb.Exists(ctx, list(dead)).Val(); n != 0 {
		t.Errorf("the dead consumer's staging list is still there")
	}
	if rdb.HExists(ctx, registry, dead).Val() {
		t.Errorf("the dead consumer is still registered")
	}
	if got := rdb.LRange(ctx, list(live), 0, -1).Val(); !slices.Equal(got, []string{"m3"}) {
		t.Errorf("the live consumer's staging list holds %q, want [m3]", got)
	}

	// Nothing left to put back: a second sweep moves nothing.
	if out := mustCLI(t, "--config", cfg, "staged", "sweep"); !strings.Contains(out, "put back 0 staged messages") {
		t.Errorf("second sweep:\n%s", out)
	}
}
