package beat

import (
	"fmt"
	"time"
)

// Dialect selects whose date arithmetic the schedules reproduce. Celery's
// schedules compute the next run by adding calendar fields to an aware
// Python datetime; what that means across a DST change depends on the time
// zone library Celery uses, which changed in Celery 5.3.
type Dialect int

const (
	// Celery55 is Celery 5.3 and later (zoneinfo): a datetime keeps its
	// zone, and its UTC offset follows its wall clock (and fold) after
	// every addition. The default.
	Celery55 Dialect = iota
	// Celery52 is Celery 5.2 and earlier (pytz): a datetime keeps the
	// fixed UTC offset it was localized with, whatever its wall clock
	// becomes after an addition, except that remaining() swaps in now's
	// offset when the two differ.
	Celery52
	// Celery56 is Celery 5.6: Celery55, but a wall clock in a DST gap is
	// moved forward by the gap when crontab compares days with the last
	// run, and dusk_astronomical's horizon is -18° (celery/celery#10121).
	Celery56
)

// ParseDialect reads a Celery version ("5.2", "5.5", "5.6"; "" is 5.5).
func ParseDialect(v string) (Dialect, error) {
	switch v {
	case "", "5.3", "5.4", "5.5":
		return Celery55, nil
	case "5.2", "5.1", "5.0":
		return Celery52, nil
	case "5.6":
		return Celery56, nil
	}
	return 0, fmt.Errorf("unknown Celery version %q (5.2, 5.5 or 5.6)", v)
}

// pyTime is an aware Python datetime as Celery's schedules handle it: a
// wall clock (a time.Time in UTC used as a naive datetime), the fixed
// offset pytz attached to it (Celery52), or the fold that picks between two
// occurrences of an ambiguous wall clock (Celery55, whose offset is
// computed from wall and fold).
type pyTime struct {
	wall time.Time
	off  int // seconds east of UTC (Celery52)
	fold int // Celery55
	loc  *time.Location
	d    Dialect
}

// localize is instant.astimezone(tz): exact in both dialects.
func localize(instant time.Time, loc *time.Location, d Dialect) pyTime {
	t := instant.In(loc)
	_, off := t.Zone()
	w := time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
	p := pyTime{wall: w, off: off, loc: loc, d: d}
	if d != Celery52 && zoneOffset(w, 0, loc) != off {
		p.fold = 1
	}
	return p
}

// offset is utcoffset().
func (p pyTime) offset() int {
	if p.d == Celery52 {
		return p.off
	}
	return zoneOffset(p.wall, p.fold, p.loc)
}

// instant is the UTC instant of p.
func (p pyTime) instant() time.Time {
	return p.wall.Add(-time.Duration(p.offset()) * time.Second)
}

// plus is datetime + timedelta, with the wall clock the sum gives: pytz
// keeps the fixed offset; Python resets fold to 0 (so zoneinfo reads an
// ambiguous result as its first occurrence).
func (p pyTime) plus(w time.Time) pyTime {
	p.wall = w
	p.fold = 0
	return p
}

// sub is p - q for aware datetimes: the difference of their instants.
func (p pyTime) sub(q pyTime) time.Duration { return p.instant().Sub(q.instant()) }

// offsetAt is the zone's offset at a UTC instant.
func offsetAt(loc *time.Location, instant time.Time) int {
	_, off := instant.In(loc).Zone()
	return off
}

// zoneOffset is zoneinfo's utcoffset() of a wall clock with fold (PEP 495):
// an ambiguous wall clock takes the offset before the transition with
// fold=0 and the one after with fold=1; a wall clock in a gap likewise.
func zoneOffset(wall time.Time, fold int, loc *time.Location) int {
	// Zones change offset rarely, so the offsets a day and a half either
	// side are the only candidates (a zone with two transitions within
	// 36 hours would be misread; tzdata has none in the years tested).
	before := offsetAt(loc, wall.Add(-36*time.Hour))
	after := offsetAt(loc, wall.Add(36*time.Hour))
	okBefore := offsetAt(loc, wall.Add(-time.Duration(before)*time.Second)) == before
	okAfter := offsetAt(loc, wall.Add(-time.Duration(after)*time.Second)) == after
	switch {
	case okBefore && okAfter && before != after: // ambiguous
		if fold == 0 {
			return before
		}
		return after
	case okBefore:
		return before
	case okAfter:
		return after
	}
	// In a gap: the offset before the transition with fold=0.
	if fold == 0 {
		return before
	}
	return after
}

// resolveImaginary is dateutil's resolve_imaginary: a wall clock in a gap
// moves forward by the gap's length.
func resolveImaginary(wall time.Time, loc *time.Location) time.Time {
	before := offsetAt(loc, wall.Add(-24*time.Hour))
	after := offsetAt(loc, wall.Add(24*time.Hour))
	exists := offsetAt(loc, wall.Add(-time.Duration(before)*time.Second)) == before ||
		offsetAt(loc, wall.Add(-time.Duration(after)*time.Second)) == after
	if exists {
		return wall
	}
	return wall.Add(time.Duration(after-before) * time.Second)
}

// wallDate is a naive datetime.
func wallDate(y int, m time.Month, d, h, mi, s, us int) time.Time {
	return time.Date(y, m, d, h, mi, s, us*1000, time.UTC)
}

// daysIn is calendar.monthrange(y, m)[1].
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// pyWeekday is datetime.weekday(): Monday 0 .. Sunday 6.
func pyWeekday(t time.Time) int { return (int(t.Weekday()) + 6) % 7 }

// cronWeekday is isoweekday() % 7: Sunday 0 .. Saturday 6, crontab's.
func cronWeekday(t time.Time) int { return int(t.Weekday()) }

// ffwd is celery.utils.time.ffwd: fields that replace those of a datetime
// (nil: keep), then a weekday to move forward to and whole weeks to add.
type ffwd struct {
	year, month, day, hour, minute, second, microsecond *int
	weeks                                               int
	weekday                                             *int // Python's, Monday 0
}

func iptr(i int) *int { return &i }

// add is datetime + ffwd.
func (f ffwd) add(p pyTime) pyTime {
	w := p.wall
	year, month := w.Year(), int(w.Month())
	if f.year != nil && *f.year != 0 {
		year = *f.year
	}
	if f.month != nil && *f.month != 0 {
		month = *f.month
	}
	day := w.Day()
	if f.day != nil && *f.day != 0 {
		day = *f.day
	}
	day = min(daysIn(year, time.Month(month)), day)
	pick := func(f *int, v int) int {
		if f != nil {
			return *f
		}
		return v
	}
	nw := wallDate(year, time.Month(month), day, pick(f.hour, w.Hour()), pick(f.minute, w.Minute()),
		pick(f.second, w.Second()), pick(f.microsecond, w.Nanosecond()/1000))
	if f.weekday != nil {
		nw = nw.AddDate(0, 0, mod(7-pyWeekday(nw)+*f.weekday, 7))
	}
	// ffwd always ends with "+ timedelta(days=...)", even of zero days.
	return p.plus(nw.AddDate(0, 0, 7*f.weeks))
}

func mod(a, b int) int { return ((a % b) + b) % b }

// remaining is celery.utils.time.remaining: how long from now until start
// plus a delta (ends is start+delta on the wall clock).
func remaining(start pyTime, ends func(pyTime) pyTime, now pyTime) time.Duration {
	if start.d == Celery52 && now.offset() != start.offset() {
		// pytz's "DST started/ended" fix-up: both are in the app's zone,
		// so their zone names match and start takes now's offset.
		start.off = now.off
	}
	return ends(start).sub(now)
}
