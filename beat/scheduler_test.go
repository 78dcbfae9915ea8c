package beat

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

type recorder struct {
	mu   sync.Mutex
	msgs []*transport.Publishing
	at   []time.Time
}

func (r *recorder) Publish(_ context.Context, p *transport.Publishing) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, p)
	r.at = append(r.at, time.Now())
	return nil
}

func (r *recorder) sent() ([]*transport.Publishing, []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*transport.Publishing(nil), r.msgs...), append([]time.Time(nil), r.at...)
}

// TestSchedulerSendsOnSchedule runs a scheduler in a synctest bubble for
// ten minutes: an interval entry runs every 30 s after the start, a
// crontab entry on every 2nd minute, each message as send_task lays it out.
func TestSchedulerSendsOnSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entries, err := ParseSchedule([]byte(`{
			"every-30": {"task": "tasks.add", "schedule": 30, "args": [2, 3]},
			"cron": {"task": "tasks.cron", "schedule": {"crontab": {"minute": "*/2"}},
				"kwargs": {"x": 1}, "options": {"queue": "q1", "priority": 7, "expires": 60, "headers": {"h": "v"}}}
		}`), Settings{})
		if err != nil {
			t.Fatal(err)
		}
		rec := &recorder{}
		start := time.Now() // synctest's clock: 2000-01-01 00:00 UTC
		s := New(Config{Entries: entries, Publisher: rec})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = s.Run(ctx) }()
		time.Sleep(10*time.Minute + time.Second)
		cancel()
		<-done
		msgs, at := rec.sent()
		var every, cron []time.Duration
		for i, p := range msgs {
			m, err := protocol.DecodeTask(&p.Message, protocol.DecodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			switch m.Name {
			case "tasks.add":
				every = append(every, at[i].Sub(start))
				if p.RoutingKey != "celery" || len(m.Args) != 2 || m.ReplyTo == "" {
					t.Errorf("every-30: %+v to %q", m, p.RoutingKey)
				}
			case "tasks.cron":
				cron = append(cron, at[i].Sub(start))
				if p.RoutingKey != "q1" || m.Priority != 7 || m.Headers["h"] != "v" || m.Kwargs["x"] != int64(1) {
					t.Errorf("cron: %+v to %q", m, p.RoutingKey)
				}
				if got := m.Expires.Sub(at[i]); got != time.Minute {
					t.Errorf("cron expires %v after the send, want 1m", got)
				}
			}
		}
		if len(every) != 20 || every[0] != 30*time.Second || every[19] != 10*time.Minute {
			t.Errorf("every-30 sent at %v, want every 30 s from 30 s", every)
		}
		if len(cron) != 5 || cron[0] != 2*time.Minute || cron[4] != 10*time.Minute {
			t.Errorf("cron sent at %v, want every 2nd minute", cron)
		}
	})
}

// TestSchedulerMaxLoopInterval: an edit of an entry's state by another
// process is seen within beat_max_loop_interval even when the next run is
// far off (the scheduler wakes at least that often).
func TestSchedulerMaxLoopInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entries, _ := ParseSchedule([]byte(`{"hourly": {"task": "t", "schedule": 3600}}`), Settings{})
		var wakes int
		var mu sync.Mutex
		clock := func() time.Time { mu.Lock(); wakes++; mu.Unlock(); return time.Now() }
		s := New(Config{Entries: entries, Publisher: &recorder{}, MaxLoopInterval: 5 * time.Second, Now: clock})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = s.Run(ctx) }()
		time.Sleep(time.Minute)
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		// One Now for Load, then one a tick: every 5 s for 60 s.
		if wakes < 12 || wakes > 14 {
			t.Errorf("%d looks at the schedule in a minute, want 13 (every 5 s)", wakes)
		}
	})
}
