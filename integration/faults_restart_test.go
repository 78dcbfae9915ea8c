package integration

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// TestBrokerRestarts restarts a Redis and a RabbitMQ of the test's own
// while a celeriac worker process (acks_late) works through tasks published
// by Python: the worker reconnects by itself, what it held unacked comes
// back, and every effect happens exactly once. The effects are recorded in
// the shared Redis (db 2), which is not restarted.
func TestBrokerRestarts(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		own := startOwnRedis(t, "", nil)
		runRestart(t, "redis", own.URL(0), func() {
			own.stop()
			time.Sleep(time.Second)
			own.start()
		})
	})
	t.Run("rabbitmq", func(t *testing.T) {
		own := startOwnRabbit(t, "flt", "flt-restart-pw", nil)
		runRestart(t, "rabbitmq", own.URL(), func() {
			own.stop()
			time.Sleep(time.Second)
			own.start()
		})
	})
}

func runRestart(t *testing.T, kind, broker string, restart func()) {
	const n = 1500
	pythonBin(t)
	ctx := context.Background()
	stamp := time.Now().UnixNano() % 1e9
	queue := fmt.Sprintf("it_flt_restart_%s_%d", kind, stamp)
	prefix := fmt.Sprintf("it_flt:restart:%s:%d", kind, stamp)
	keys := fltKeysOf(prefix)
	effectsURL := redisDBURL(t, fltEffectDB)
	opt, err := goredis.ParseURL(effectsURL)
	if err != nil {
		t.Fatal(err)
	}
	effects := goredis.NewClient(opt)
	t.Cleanup(func() {
		effects.Del(context.Background(), keys.deliveries, keys.effects, keys.effectCount, keys.redelivered)
		effects.Close()
	})
	count := func() int { v, _ := effects.Get(ctx, keys.effectCount).Int(); return v }

	w := startFltWorker(t, fltWorkerConfig{
		Broker: broker, Effects: effectsURL, Prefix: prefix, Queue: queue,
		Name: queue + "-w", Hostname: "w@" + queue, Concurrency: 4,
		VisibilityTimeout: 6, RestoreInterval: 1,
	})
	// 30 ms a task at concurrency 4 is over 11 s of work: the restart must
	// come while tasks are left, also when a loaded machine publishes slowly.
	pub := startFltPublisher(t, n, map[string]string{"IT_BROKER": broker, "IT_QUEUE": queue, "IT_SLEEP_MS": "30"})
	if err := pub.wait(3 * time.Minute); err != nil {
		t.Fatalf("python publisher: %v", err)
	}
	before := count()
	if before >= n {
		t.Fatalf("all %d tasks ran before the restart; the test proves nothing", n)
	}
	start := time.Now()
	restart()
	t.Logf("%s restarted after %d of %d effects (down and up again in %s)", kind, before, n, time.Since(start).Round(time.Millisecond))

	last, lastChange := -1, time.Now()
	for count() < n {
		if c := count(); c != last {
			last, lastChange = c, time.Now()
		}
		if w.Exited() {
			t.Fatalf("the worker exited: %v\n%s", w.err, tail(w.Log(), 60))
		}
		if time.Since(lastChange) > 60*time.Second {
			t.Fatalf("only %d of %d effects, no progress for a minute after the restart\n%s", count(), n, tail(w.Log(), 60))
		}
		time.Sleep(100 * time.Millisecond)
	}
	deliveries, err := effects.HGetAll(ctx, keys.deliveries).Result()
	if err != nil {
		t.Fatal(err)
	}
	members := effects.SCard(ctx, keys.effects).Val()
	flagged, _ := effects.Get(ctx, keys.redelivered).Int()
	total, again := 0, 0
	for i := range n {
		d, _ := strconv.Atoi(deliveries[fmt.Sprintf("k%d", i)])
		if d < 1 {
			t.Errorf("task k%d never delivered", i)
		}
		total += d
		if d > 1 {
			again++
		}
	}
	if members != n || count() != n {
		t.Errorf("effects: %d in the set, counter %d; want %d each", members, count(), n)
	}
	if err := w.Term(60 * time.Second); err != nil {
		t.Errorf("worker after SIGTERM: %v\n%s", err, tail(w.Log(), 40))
	}
	t.Logf("COUNTS %s restart: %d tasks, %d effects (exactly once each), %d deliveries, %d tasks ran more than once, "+
		"%d deliveries flagged redelivered (unacked messages returned by the broker; on Redis the worker keeps what it holds and acks it after reconnecting); one worker process throughout",
		kind, n, count(), total, again, flagged)
}
