package beat_test

import (
	"context"
	"fmt"
	"time"

	"github.com/celeriac/celeriac/beat"
	"github.com/celeriac/celeriac/transport/memory"
)

// A crontab in Celery's syntax: every 15 minutes from 9 to 17 on weekdays,
// in Berlin.
func ExampleCrontab() {
	berlin, _ := time.LoadLocation("Europe/Berlin")
	c, err := beat.NewCrontab(beat.CronSpec{Minute: "*/15", Hour: "9-17", DayOfWeek: "mon-fri"},
		beat.Zone{Location: berlin})
	if err != nil {
		panic(err)
	}
	last := time.Date(2026, 12, 4, 17, 45, 0, 0, berlin) // a Friday
	rem, _ := c.Remaining(last, last)
	fmt.Println(last.Add(rem).Format("Mon 2006-01-02 15:04 MST"))
	// Output: Mon 2026-12-07 09:00 CET
}

// An interval: due once Every has passed since the last run.
func ExampleInterval() {
	s := &beat.Interval{Every: 30 * time.Second}
	last := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	due, next, _ := s.IsDue(last, last.Add(10*time.Second))
	fmt.Println(due, next)
	due, next, _ = s.IsDue(last, last.Add(31*time.Second))
	fmt.Println(due, next)
	// Output:
	// false 20s
	// true 30s
}

// A beat_schedule as the config file has it, read into entries.
func ExampleParseSchedule() {
	entries, err := beat.ParseSchedule([]byte(`{
		"add-every-30-seconds": {"task": "tasks.add", "schedule": 30, "args": [16, 16]},
		"digest": {"task": "tasks.digest", "schedule": {"crontab": {"minute": 0, "hour": "7-9", "day_of_week": "mon-fri"}},
			"options": {"queue": "reports", "expires": 600}}
	}`), beat.Settings{})
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		fmt.Println(e.Name, e.Task, e.Schedule, e.Args, e.Options["queue"])
	}
	// Output:
	// add-every-30-seconds tasks.add <freq: 30s> [16 16] <nil>
	// digest tasks.digest <crontab: 0 7-9 mon-fri * * (m/h/d/dM/MY)> [] reports
}

// A scheduler on an in-process broker: SendNow sends one run at once, as
// Python beat's apply_entry does for a due entry; Run sends them on
// schedule until its context ends.
func ExampleScheduler_SendNow() {
	entries, _ := beat.ParseSchedule([]byte(`{"tick": {"task": "tasks.tick", "schedule": 1}}`), beat.Settings{})
	tr := memory.New(memory.Config{})
	defer tr.Close()
	s := beat.New(beat.Config{Entries: entries, Publisher: tr})
	if _, err := s.SendNow(context.Background(), entries[0], beat.State{}); err != nil {
		panic(err)
	}
	n, _ := tr.Len(context.Background(), "celery")
	fmt.Println(n, "message in the celery queue")
	// Output: 1 message in the celery queue
}
