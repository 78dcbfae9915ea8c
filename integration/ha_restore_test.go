package integration

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// TestRedisRestoreAfterKill9: a worker holding unacked messages is killed
// with -9, and its messages are back in the queue within the visibility
// timeout plus the sweep period, with the transport's default sweep
// schedule (kombu's would take 100 s): a second worker runs every task,
// each effect exactly once. It runs on a redis-server of its own, so that
// no other test's unacked bookkeeping is swept.
func TestRedisRestoreAfterKill9(t *testing.T) {
	pythonBin(t)
	const vt = 5 // visibility_timeout, seconds
	srv := startOwnRedis(t, "", nil)
	broker, effectsURL := srv.URL(0), srv.URL(2)
	ctx := context.Background()
	rdb := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", srv.port)})
	defer rdb.Close()
	queue := fmt.Sprintf("it_ha_restore_%d", time.Now().UnixNano()%1e9)
	prefix := "it_ha:restore:" + queue
	keys := fltKeysOf(prefix)
	effects := goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", srv.port), DB: 2})
	defer effects.Close()
	cfg := func(name string) fltWorkerConfig {
		return fltWorkerConfig{Broker: broker, Effects: effectsURL, Prefix: prefix, Queue: queue,
			Name: queue + "-" + name, Hostname: name + "@" + queue, Concurrency: 4, VisibilityTimeout: vt}
	}
	a := startFltWorker(t, cfg("a"))
	const n = 40
	pub := startFltPublisher(t, n, map[string]string{"IT_BROKER": broker, "IT_QUEUE": queue, "IT_SLEEP_MS": "1000"})
	if err := pub.wait(2 * time.Minute); err != nil {
		t.Fatalf("python publisher: %v", err)
	}
	// a takes its prefetch (concurrency 4 x 4) and starts 4 of them.
	deadline := time.Now().Add(time.Minute)
	for {
		held, err := rdb.HLen(ctx, "unacked").Result()
		if err != nil {
			t.Fatal(err)
		}
		if held >= 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker a holds %d messages after a minute\n%s", held, tail(a.Log(), 30))
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.Kill9()
	killed := time.Now()
	lost, err := rdb.HKeys(ctx, "unacked").Result()
	if err != nil {
		t.Fatal(err)
	}
	b := startFltWorker(t, cfg("b"))

	// A tag of a's is back when it left unacked (restored, not yet popped
	// again) or was recorded again after the kill (b popped it).
	var restoredIn time.Duration
	for {
		back := 0
		for _, tag := range lost {
			score, err := rdb.ZScore(ctx, "unacked_index", tag).Result()
			if err == goredis.Nil || err == nil && score > float64(killed.UnixNano())/1e9 {
				back++
			} else if err != nil {
				t.Fatal(err)
			}
		}
		if back == len(lost) {
			restoredIn = time.Since(killed)
			break
		}
		if time.Since(killed) > 90*time.Second {
			t.Fatalf("%d of worker a's %d unacked messages still not restored after %s", len(lost)-back, len(lost), time.Since(killed))
		}
		time.Sleep(50 * time.Millisecond)
	}
	r := &fltRun{t: t, effects: effects, keys: keys}
	r.waitEffects(n, 2*time.Minute, b)
	deliveries, err := effects.HGetAll(ctx, keys.deliveries).Result()
	if err != nil {
		t.Fatal(err)
	}
	effectCount := r.effectCount()
	total := 0
	for i := range n {
		d, _ := strconv.Atoi(deliveries["k"+strconv.Itoa(i)])
		if d < 1 {
			t.Errorf("task k%d never ran", i)
		}
		total += d
	}
	if effectCount != n {
		t.Errorf("%d effects, want %d (exactly once each)", effectCount, n)
	}
	// Kombu's schedule would restore them only after 100 s; the bound
	// leaves room for a loaded machine and still tells the two apart.
	if restoredIn > vt*time.Second+30*time.Second {
		t.Errorf("worker a's messages came back %s after kill -9, want within the visibility timeout (%ds) plus a few seconds", restoredIn, vt)
	}
	if err := b.Term(60 * time.Second); err != nil {
		t.Errorf("worker b after SIGTERM: %v\n%s", err, tail(b.Log(), 30))
	}
	t.Logf("COUNTS redis restore: visibility_timeout=%ds, %d unacked messages of a worker killed -9 restored %.1f s after the kill "+
		"(sweep every %s; kombu's schedule: 100 s); %d tasks, %d effects (exactly once), %d deliveries",
		vt, len(lost), restoredIn.Seconds(), time.Second, n, effectCount, total)
}
