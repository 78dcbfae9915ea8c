package beat

import (
	"fmt"
	"time"
)

// Schedule says when a periodic task runs, as Celery's schedule classes do.
type Schedule interface {
	// IsDue reports whether an entry that last ran at lastRun is due at
	// now, and how long until the scheduler should look again: after a
	// due run, until the next one; else until this one.
	IsDue(lastRun, now time.Time) (due bool, next time.Duration, err error)
	// Remaining is how long after now the first run after lastRun is;
	// negative when it is overdue.
	Remaining(lastRun, now time.Time) (time.Duration, error)
}

// Interval is Celery's schedule(run_every, relative): every Every after
// the last run. Relative rounds the next run time down to the
// resolution of Every (whole days, hours or minutes) on the wall clock,
// as Celery's delta_resolution does.
type Interval struct {
	Every    time.Duration
	Relative bool
	Zone     Zone
}

func (s *Interval) String() string { return fmt.Sprintf("<freq: %s>", s.Every) }

// Remaining is schedule.remaining_estimate.
func (s *Interval) Remaining(lastRun, now time.Time) (time.Duration, error) {
	last, n := s.Zone.local(lastRun), s.Zone.local(now)
	return remaining(last, s.end, n), nil
}

// end is start + run_every, rounded when relative.
func (s *Interval) end(start pyTime) pyTime {
	e := start.plus(start.wall.Add(s.Every))
	if !s.Relative {
		return e
	}
	w := e.wall
	var r time.Time
	switch d := max(s.Every, 0); {
	case d >= 24*time.Hour:
		r = wallDate(w.Year(), w.Month(), w.Day(), 0, 0, 0, 0)
	case d >= time.Hour:
		r = wallDate(w.Year(), w.Month(), w.Day(), w.Hour(), 0, 0, 0)
	case d >= time.Minute:
		r = wallDate(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), 0, 0)
	default:
		r = w.Truncate(time.Second)
	}
	// datetime(..., tzinfo=dt.tzinfo) starts a new datetime: fold 0.
	return e.plus(r)
}

// IsDue is schedule.is_due.
func (s *Interval) IsDue(lastRun, now time.Time) (bool, time.Duration, error) {
	rem, _ := s.Remaining(lastRun, now)
	if rem <= 0 {
		return true, max(s.Every, 0), nil
	}
	return false, rem, nil
}
