package beat

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Zone is what a schedule computes in: the app's time zone (Celery's
// timezone setting; UTC by default) and whose arithmetic it follows.
type Zone struct {
	Location *time.Location // nil: UTC
	Dialect  Dialect
}

func (z Zone) loc() *time.Location {
	if z.Location == nil {
		return time.UTC
	}
	return z.Location
}

func (z Zone) local(t time.Time) pyTime { return localize(t, z.loc(), z.Dialect) }

// CronSpec is the five fields of Celery's crontab(), in Celery's string
// syntax: "*", numbers, ranges "a-b" (wrapping past the maximum when b <
// a), steps "*/n" and "a-b/n", comma-separated lists, and day names
// ("mon", "monday"; Celery 5.3+ also month names "jan") for numbers. An
// empty field is "*".
type CronSpec struct {
	Minute      string `json:"minute"`
	Hour        string `json:"hour"`
	DayOfWeek   string `json:"day_of_week"`
	DayOfMonth  string `json:"day_of_month"`
	MonthOfYear string `json:"month_of_year"`
}

// Crontab is Celery's crontab schedule.
type Crontab struct {
	Spec CronSpec
	Zone Zone
	// StartingDeadline is beat_cron_starting_deadline (Celery 5.3+): a run
	// missed by more than this is not sent late. Zero: no deadline.
	StartingDeadline time.Duration

	minute, hour, dow, dom, moy []int // sorted
}

// ParseError is a crontab field Celery would refuse.
type ParseError struct {
	Field, Value string
	Err          error
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("crontab %s %q: %v", e.Field, e.Value, e.Err)
}

func (e *ParseError) Unwrap() error { return e.Err }

// NewCrontab parses spec as Celery's crontab() does; a spec Celery
// refuses is a *ParseError.
func NewCrontab(spec CronSpec, z Zone) (*Crontab, error) {
	c := &Crontab{Zone: z}
	fields := []struct {
		name     string
		v        *string
		out      *[]int
		max, min int
	}{
		{"hour", &spec.Hour, &c.hour, 24, 0},
		{"minute", &spec.Minute, &c.minute, 60, 0},
		{"day_of_week", &spec.DayOfWeek, &c.dow, 7, 0},
		{"day_of_month", &spec.DayOfMonth, &c.dom, 31, 1},
		{"month_of_year", &spec.MonthOfYear, &c.moy, 12, 1},
	}
	for _, f := range fields {
		if *f.v == "" {
			*f.v = "*"
		}
		set, err := parseCronField(*f.v, f.max, f.min, z.Dialect)
		if err != nil {
			return nil, &ParseError{Field: f.name, Value: *f.v, Err: err}
		}
		*f.out = set
	}
	c.Spec = spec
	return c, nil
}

// MustCrontab is NewCrontab for specs known to be valid; it panics on a
// *ParseError.
func MustCrontab(spec CronSpec, z Zone) *Crontab {
	c, err := NewCrontab(spec, z)
	if err != nil {
		panic(err)
	}
	return c
}

func (c *Crontab) String() string {
	s := c.Spec
	return fmt.Sprintf("<crontab: %s %s %s %s %s (m/h/d/dM/MY)>", s.Minute, s.Hour, s.DayOfWeek, s.DayOfMonth, s.MonthOfYear)
}

var (
	cronRangeSteps = regexp.MustCompile(`^(\w+?)-(\w+)/(\w+)?`)
	cronRange      = regexp.MustCompile(`^(\w+?)-(\w+)`)
	cronStarSteps  = regexp.MustCompile(`^\*/(\w+)?`)
	cronStar       = regexp.MustCompile(`^\*$`)
)

// parseCronField is celery.schedules.crontab_parser(max, min).parse. Its
// patterns match a prefix of each part, as Python's re.match does, so
// trailing text after a range or step is ignored there too.
func parseCronField(spec string, max, min int, d Dialect) ([]int, error) {
	if len(spec) > 4096 {
		return nil, errors.New("too long")
	}
	acc := map[int]bool{}
	for part := range strings.SplitSeq(spec, ",") {
		if part == "" {
			return nil, errors.New("empty part")
		}
		vals, err := parseCronPart(part, max, min, d)
		if err != nil {
			return nil, err
		}
		for _, v := range vals {
			acc[v] = true
		}
	}
	out := make([]int, 0, len(acc))
	for v := range acc {
		if v >= max+min || v < min {
			return nil, fmt.Errorf("invalid crontab pattern: valid range is %d-%d, '%d' was found", min, max-1+min, v)
		}
		out = append(out, v)
	}
	slices.Sort(out)
	return out, nil
}

func parseCronPart(part string, max, min int, d Dialect) ([]int, error) {
	if m := cronRangeSteps.FindStringSubmatch(part); m != nil {
		if m[3] == "" {
			return nil, errors.New("empty filter")
		}
		r, err := expandRange(m[1], m[2], max, min, d)
		if err != nil {
			return nil, err
		}
		return everyNth(r, m[3])
	}
	if m := cronRange.FindStringSubmatch(part); m != nil {
		return expandRange(m[1], m[2], max, min, d)
	}
	if m := cronStarSteps.FindStringSubmatch(part); m != nil {
		if m[1] == "" {
			return nil, errors.New("empty filter")
		}
		star := make([]int, 0, max)
		for i := min; i < max+min; i++ {
			star = append(star, i)
		}
		return everyNth(star, m[1])
	}
	if cronStar.MatchString(part) {
		star := make([]int, 0, max)
		for i := min; i < max+min; i++ {
			star = append(star, i)
		}
		return star, nil
	}
	if part[0] == '-' {
		return nil, errors.New("negative numbers not supported")
	}
	n, err := expandNumber(part, max, min, d)
	if err != nil {
		return nil, err
	}
	return []int{n}, nil
}

// everyNth is Python's list[::step].
func everyNth(r []int, step string) ([]int, error) {
	n, ok := pyInt(step)
	if !ok {
		return nil, fmt.Errorf("invalid literal for int(): %q", step)
	}
	if n == 0 {
		return nil, errors.New("slice step cannot be zero")
	}
	var out []int
	for i := 0; i < len(r); i += n {
		out = append(out, r[i])
	}
	return out, nil
}

func expandRange(from, to string, max, min int, d Dialect) ([]int, error) {
	fr, err := expandNumber(from, max, min, d)
	if err != nil {
		return nil, err
	}
	t, err := expandNumber(to, max, min, d)
	if err != nil {
		return nil, err
	}
	var out []int
	if t < fr { // wraps around max
		for i := fr; i < min+max; i++ {
			out = append(out, i)
		}
		for i := min; i <= t; i++ {
			out = append(out, i)
		}
		return out, nil
	}
	for i := fr; i <= t; i++ {
		out = append(out, i)
	}
	return out, nil
}

var (
	dayNames   = []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}
	monthNames = []string{"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}
)

func expandNumber(s string, max, min int, d Dialect) (int, error) {
	i, ok := pyInt(s)
	if !ok {
		abbr := strings.ToLower(s[:min3(len(s))])
		found := false
		if d != Celery52 { // yearmonth() is tried first since 5.3
			if k := slices.Index(monthNames, abbr); k >= 0 {
				i, found = k+1, true
			}
		}
		if !found {
			k := slices.Index(dayNames, abbr)
			if k < 0 {
				return 0, fmt.Errorf("invalid weekday literal %q", s)
			}
			i = k
		}
	}
	if maxVal := min + max - 1; i > maxVal {
		return 0, fmt.Errorf("invalid end range: %d > %d", i, maxVal)
	}
	if i < min {
		return 0, fmt.Errorf("invalid beginning range: %d < %d", i, min)
	}
	return i, nil
}

func min3(n int) int { return min(n, 3) }

// pyInt is Python's int(str): surrounding white space, a sign, and
// underscores between digits are allowed.
func pyInt(s string) (int, bool) {
	s = strings.TrimFunc(s, unicode.IsSpace)
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg = s[0] == '-'
		s = s[1:]
	}
	if s == "" || s[0] == '_' || s[len(s)-1] == '_' || strings.Contains(s, "__") {
		return 0, false
	}
	s = strings.ReplaceAll(s, "_", "")
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		if len(s) > 0 { // too large for int: out of every cron range
			return 1 << 40, true
		}
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

// ErrRollover is Celery's "unable to rollover, time specification is
// probably invalid": no day of the crontab's months ever matches.
var ErrRollover = errors.New("unable to rollover, time specification is probably invalid")

func contains(set []int, v int) bool {
	_, ok := slices.BinarySearch(set, v)
	return ok
}

// remainingDelta is crontab.remaining_delta: the last run and now as
// local datetimes, and the fields to add to the last run.
func (c *Crontab) remainingDelta(last, now pyTime) (ffwd, error) {
	lw, nw := last.wall, now.wall
	dowNum := cronWeekday(lw)
	thisDate := contains(c.moy, int(lw.Month())) && contains(c.dom, lw.Day()) && contains(c.dow, dowNum)
	thisHour := thisDate && lw.Day() == nw.Day() && lw.Month() == nw.Month() && lw.Year() == nw.Year() &&
		contains(c.hour, lw.Hour()) && lw.Minute() < c.minute[len(c.minute)-1]
	zero := iptr(0)
	if thisHour {
		i, _ := slices.BinarySearch(c.minute, lw.Minute()+1)
		return ffwd{minute: iptr(c.minute[i]), second: zero, microsecond: zero}, nil
	}
	nextMinute := c.minute[0]
	if thisDate && lw.Hour() < c.hour[len(c.hour)-1] {
		i, _ := slices.BinarySearch(c.hour, lw.Hour()+1)
		return ffwd{hour: iptr(c.hour[i]), minute: iptr(nextMinute), second: zero, microsecond: zero}, nil
	}
	nextHour := c.hour[0]
	if c.Spec.DayOfMonth == "*" && c.Spec.MonthOfYear == "*" {
		nextDay := c.dow[0]
		if i, _ := slices.BinarySearch(c.dow, dowNum+1); i < len(c.dow) {
			nextDay = c.dow[i]
		}
		weeks := 0
		if nextDay == dowNum {
			weeks = 1
		}
		return ffwd{weeks: weeks, weekday: iptr(mod(nextDay-1, 7)), hour: iptr(nextHour), minute: iptr(nextMinute),
			second: zero, microsecond: zero}, nil
	}
	return c.deltaToNext(last, nextHour, nextMinute)
}

// deltaToNext is crontab._delta_to_next, with its quirks: the search
// starts in the last run's year even when it wraps to the first month, and
// a day counts as past when (5.2) its midnight UTC is before the last
// run, or (5.3+) its run time on the wall clock is.
func (c *Crontab) deltaToNext(last pyTime, nextHour, nextMinute int) (ffwd, error) {
	lw := last.wall
	year := lw.Year()
	var dom, moy int
	if contains(c.moy, int(lw.Month())) {
		dom, _ = slices.BinarySearch(c.dom, lw.Day()+1) // bisect_right
		moy, _ = slices.BinarySearch(c.moy, int(lw.Month()))
	} else {
		dom = 0
		moy, _ = slices.BinarySearch(c.moy, int(lw.Month())+1)
		if moy == len(c.moy) {
			moy = 0
		}
	}
	beforeLast := func(y, m, d int) bool {
		if c.Zone.Dialect == Celery52 {
			return wallDate(y, time.Month(m), d, 0, 0, 0, 0).Before(last.instant())
		}
		w := wallDate(y, time.Month(m), d, nextHour, nextMinute, 0, 0)
		if c.Zone.Dialect == Celery56 {
			w = resolveImaginary(w, c.Zone.loc())
		}
		return w.Before(lw)
	}
	rollOver := func() error {
		for range 2000 {
			if dom == len(c.dom) || c.dom[dom] > daysIn(year, time.Month(c.moy[moy])) ||
				beforeLast(year, c.moy[moy], c.dom[dom]) {
				dom = 0
				moy++
				if moy == len(c.moy) {
					moy = 0
					year++
				}
				continue
			}
			return nil
		}
		return ErrRollover
	}
	if err := rollOver(); err != nil {
		return ffwd{}, err
	}
	for range 100000 {
		th := wallDate(year, time.Month(c.moy[moy]), c.dom[dom], 0, 0, 0, 0)
		if contains(c.dow, cronWeekday(th)) {
			zero := iptr(0)
			return ffwd{year: iptr(year), month: iptr(c.moy[moy]), day: iptr(c.dom[dom]), hour: iptr(nextHour),
				minute: iptr(nextMinute), second: zero, microsecond: zero}, nil
		}
		dom++
		if err := rollOver(); err != nil {
			return ffwd{}, err
		}
	}
	return ffwd{}, ErrRollover
}

// Remaining is crontab.remaining_estimate: how long after now the next
// run after lastRun is (negative when it is overdue).
func (c *Crontab) Remaining(lastRun, now time.Time) (time.Duration, error) {
	last, n := c.Zone.local(lastRun), c.Zone.local(now)
	f, err := c.remainingDelta(last, n)
	if err != nil {
		return 0, err
	}
	return remaining(last, f.add, n), nil
}

// IsDue is crontab.is_due: whether a run is due at now, and the time until
// the run after (when due) or until this one.
func (c *Crontab) IsDue(lastRun, now time.Time) (bool, time.Duration, error) {
	rem, err := c.Remaining(lastRun, now)
	if err != nil {
		return false, 0, err
	}
	due := rem <= 0
	passed := false
	if c.StartingDeadline > 0 {
		// The latest run time that has passed must be within the
		// deadline, or none is sent late (Celery 5.3+).
		checked := c.Zone.local(lastRun)
		lastFeasible := rem
		for i := 0; rem < 0; i++ {
			if i > 1_000_000 {
				return false, 0, ErrRollover
			}
			checked = checked.plus(checked.wall.Add(-rem))
			r, err := c.remainingFrom(checked, now)
			if err != nil {
				return false, 0, err
			}
			rem = r
			if rem < 0 {
				lastFeasible = rem
			}
		}
		passed = -lastFeasible > c.StartingDeadline
		if passed {
			due = false
		}
	}
	if due || passed {
		r, err := c.Remaining(now, now)
		if err != nil {
			return false, 0, err
		}
		rem = r
	}
	return due, max(rem, 0), nil
}

func (c *Crontab) remainingFrom(last pyTime, now time.Time) (time.Duration, error) {
	n := c.Zone.local(now)
	f, err := c.remainingDelta(last, n)
	if err != nil {
		return 0, err
	}
	return remaining(last, f.add, n), nil
}
