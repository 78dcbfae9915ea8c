package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/beat"
	"github.com/celeriac/celeriac/protocol"
	redistransport "github.com/celeriac/celeriac/transport/redis"
)

// TestBeatDjango: django-celery-beat's tables (Debian's
// python3-django-celery-beat 2.4, migrated by Django) drive celeriac
// beat. A periodic task created through Django's ORM every hour sends
// nothing; edited through the ORM to every second with other args, it is
// sent on the new schedule with the new args within the scheduler's loop
// interval, and its row's total_run_count counts the runs the queue
// received, as DatabaseScheduler keeps it.
func TestBeatDjango(t *testing.T) {
	requireCelery(t, "5.2", "Debian 12's django-celery-beat 2.4 runs with its Celery 5.2")
	schema := pgSchema(t)
	queue := "it_beat_dj_" + protocol.NewID()[:8]
	env := djangoEnv(t, schema, queue)
	env["DJANGO_BEAT"] = "1"
	env["BROKER"] = redisDBURL(t, beatDB)
	if got := pyDjango(t, 2*time.Minute, env, "migrate"); len(got) != 1 || got[0]["migrated"] != true {
		t.Fatalf("migrate: %v", got)
	}
	pyDjango(t, time.Minute, env, "beat_put", "it-beat-dj", "it_dj.add", queue, "3600", "[1, 1]")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool, err := pgxpool.New(ctx, pgURL(t)+"?search_path="+schema)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	url := redisDBURL(t, beatDB)
	tr, err := redistransport.Dial(ctx, redistransport.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	opt, _ := goredis.ParseURL(url)
	rdb := goredis.NewClient(opt)
	defer rdb.Close()
	defer rdb.Del(context.Background(), queue)

	// One replica leads: the advisory lock is the schema's.
	other := beat.NewDjangoStore(pool, beat.DjangoStoreConfig{})
	if lead, err := other.Lead(ctx); !lead || err != nil {
		t.Fatalf("the first store does not take the free lock: %v, %v", lead, err)
	}
	store := beat.NewDjangoStore(pool, beat.DjangoStoreConfig{})
	if lead, err := store.Lead(ctx); lead || err != nil {
		t.Fatalf("a second store leads while the first holds the lock: %v, %v", lead, err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}

	const loop = 2 * time.Second // beat_max_loop_interval
	s := beat.New(beat.Config{Publisher: tr, Store: store, MaxLoopInterval: loop})
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	// The scheduler has read the hourly task once it wrote its last_run_at.
	waitFor(t, "the scheduler to read the task", time.Minute, func() bool {
		row := pyDjango(t, time.Minute, env, "beat_row", "it-beat-dj")
		return row[0]["last_run_at"] != nil
	})
	pyDjango(t, time.Minute, env, "beat_put", "it-beat-dj", "it_dj.add", queue, "1", "[2, 3]")
	var msgs []*protocol.TaskMessage
	var raws []string
	var firstAt time.Time
	deadline := time.Now().Add(time.Minute)
	for len(msgs) < 3 && time.Now().Before(deadline) {
		res, err := rdb.BRPop(ctx, time.Second, queue).Result()
		if err != nil {
			continue
		}
		if firstAt.IsZero() {
			firstAt = time.Now()
		}
		var env struct {
			Body    string         `json:"body"`
			Headers map[string]any `json:"headers"`
		}
		if err := json.Unmarshal([]byte(res[1]), &env); err != nil {
			t.Fatal(err)
		}
		body, _ := base64.StdEncoding.DecodeString(env.Body)
		var b []any
		if err := json.Unmarshal(body, &b); err != nil {
			t.Fatal(err)
		}
		raws = append(raws, res[1])
		msgs = append(msgs, &protocol.TaskMessage{Name: fmt.Sprint(env.Headers["task"]), Args: b[0].([]any)})
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(msgs) < 3 {
		t.Fatalf("%d runs within a minute of the edit to every second", len(msgs))
	}
	for _, m := range msgs {
		if m.Name != "it_dj.add" || fmt.Sprint(m.Args) != "[2 3]" {
			t.Errorf("sent %s%v, want it_dj.add[2 3] (the edited args)", m.Name, m.Args)
		}
	}
	// From the ORM's save (date_changed) to the first run received.
	var changed time.Time
	if err := pool.QueryRow(context.Background(), "SELECT date_changed FROM django_celery_beat_periodictask WHERE name = 'it-beat-dj'").Scan(&changed); err != nil {
		t.Fatal(err)
	}
	first := firstAt.Sub(changed)
	left, _ := rdb.LLen(context.Background(), queue).Result()
	row := pyDjango(t, time.Minute, env, "beat_row", "it-beat-dj")[0]
	if n, _ := row["total_run_count"].(float64); int(n) != len(msgs)+int(left) {
		t.Errorf("total_run_count %v, the queue received %d runs", row["total_run_count"], len(msgs)+int(left))
	}
	// DatabaseScheduler's message for the same row, against celeriac's.
	rdb.Del(context.Background(), queue)
	pyDjango(t, time.Minute, env, "beat_send", "it-beat-dj")
	pyRaw, err := rdb.RPop(context.Background(), queue).Result()
	if err != nil {
		t.Fatalf("DatabaseScheduler sent nothing: %v", err)
	}
	decode := func(raw string) map[string]any {
		var env map[string]any
		if err := json.Unmarshal([]byte(raw), &env); err != nil {
			t.Fatal(err)
		}
		body, _ := base64.StdEncoding.DecodeString(env["body"].(string))
		var b any
		_ = json.Unmarshal(body, &b)
		env["body"] = b
		return env
	}
	known := beatKnownDiffs("5.2")
	for _, d := range diffEnvelopes("", decode(pyRaw), decode(raws[0])) {
		if !known[d] {
			t.Errorf("DatabaseScheduler's message and celeriac's differ: %s", d)
		}
	}
	t.Logf("BEAT DJANGO: an ORM edit (hourly to every second, new args) sent on the new schedule %v after the save (loop interval %v); total_run_count %v = runs received; the message equals DatabaseScheduler's (periodic_task_name property included) but for lang",
		first.Round(time.Millisecond), loop, row["total_run_count"])
}
