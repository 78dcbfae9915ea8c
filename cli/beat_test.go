package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// TestBeatRefusesBadSchedules: a config without beat_schedule, or with an
// entry Celery would refuse, is a usage error naming the entry.
func TestBeatRefusesBadSchedules(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"broker_url": "memory://"}`, "no beat_schedule"},
		{`{"broker_url": "memory://", "beat_schedule": {"e": {"task": "t", "schedule": {"crontab": {"minute": "61"}}}}}`, `beat_schedule["e"]`},
		{`{"broker_url": "memory://", "beat_schedule": {"e": {"task": "t", "schedule": 5, "optoins": {}}}}`, "optoins"},
		{`{"broker_url": "memory://", "beat_schedule": {"e": {"task": "t", "schedule": {"solar": {"event": "noon", "lat": 1, "lon": 2}}}}}`, "noon"},
		{`{"broker_url": "memory://", "timezone": "Mars/Olympus", "beat_schedule": {"e": {"task": "t", "schedule": 5}}}`, "Mars/Olympus"},
	} {
		r := celeriac(t, "--config", writeConfig(t, tc.doc), "beat")
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s:\n%s", tc.doc, r)
		}
	}
	// Celery's class name is taken for django-celery-beat's scheduler,
	// which needs the database.
	r := celeriac(t, "--config", writeConfig(t, `{"broker_url": "memory://"}`), "beat",
		"-S", "django_celery_beat.schedulers:DatabaseScheduler")
	if r.code != exitUsage || !strings.Contains(r.stderr, "database_url") {
		t.Errorf("django scheduler without database_url:\n%s", r)
	}
}

// TestBeatSendsThroughRedis runs the command against Redis until two runs
// of an every-second entry are in its queue, and checks the state it
// keeps in RedBeat's keys.
func TestBeatSendsThroughRedis(t *testing.T) {
	url := transporttest.RedisURL(t, testDB)
	opt, _ := goredis.ParseURL(url)
	rdb := goredis.NewClient(opt)
	defer rdb.Close()
	prefix := "beatcli-" + protocol.NewID() + ":"
	queue := prefix + "q"
	defer func() {
		keys, _ := rdb.Keys(context.Background(), prefix+"*").Result()
		rdb.Del(context.Background(), append(keys, queue)...)
	}()
	cfg := writeConfig(t, `{"broker_url": "`+url+`", "redbeat_key_prefix": "`+prefix+`",
		"beat_schedule": {"e": {"task": "tasks.add", "schedule": 1, "args": [1, 2], "options": {"queue": "`+queue+`"}}}}`)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	done := make(chan result, 1)
	go func() {
		var out, errb syncBuffer
		code := run(ctx, []string{"--config", cfg, "beat"}, &out, &errb)
		done <- result{code, out.String(), errb.String()}
	}()
	for {
		if n, _ := rdb.LLen(ctx, queue).Result(); n >= 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("no two runs in the queue")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if r := <-done; r.code != exitOK {
		t.Fatalf("beat: %s", r)
	}
	meta, err := rdb.HGet(context.Background(), prefix+"e", "meta").Result()
	if err != nil || !strings.Contains(meta, `"__type__":"datetime"`) || !strings.Contains(meta, `"total_run_count":`) {
		t.Errorf("meta %q, %v", meta, err)
	}
	if n, _ := rdb.Exists(context.Background(), prefix+":lock").Result(); n != 0 {
		t.Error("the lease outlived the beat's shutdown")
	}
}
