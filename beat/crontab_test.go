package beat

import (
	"slices"
	"testing"
	"time"
)

func TestParseCronField(t *testing.T) {
	for _, tc := range []struct {
		spec     string
		max, min int
		d        Dialect
		want     []int // nil: refused
	}{
		{"*/15", 60, 0, Celery55, []int{0, 15, 30, 45}},
		{"*", 7, 0, Celery55, []int{0, 1, 2, 3, 4, 5, 6}},
		{"mon-fri", 7, 0, Celery55, []int{1, 2, 3, 4, 5}},
		{"Saturday,sun", 7, 0, Celery55, []int{0, 6}},
		{"*/3", 31, 1, Celery55, []int{1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31}},
		{"2-12/2", 12, 1, Celery55, []int{2, 4, 6, 8, 10, 12}},
		{"22-2", 24, 0, Celery55, []int{0, 1, 2, 22, 23}}, // wraps past the maximum
		{"22-2/2", 24, 0, Celery55, []int{0, 2, 22}},      // steps over the wrapped list
		{"1-5)", 60, 0, Celery55, []int{1, 2, 3, 4, 5}},   // re.match ignores the rest
		{" 5", 60, 0, Celery55, []int{5}},                 // int() strips spaces
		{"1_0", 60, 0, Celery55, []int{10}},               // and reads underscores
		{"jan-mar", 12, 1, Celery55, []int{1, 2, 3}},      // month names since 5.3
		{"jan-mar", 12, 1, Celery52, nil},                 // not in 5.2
		{"60", 60, 0, Celery55, nil},                      // out of range
		{"0", 31, 1, Celery55, nil},                       // below a 1-based minimum
		{"1,,2", 60, 0, Celery55, nil},                    // empty part
		{"*/", 60, 0, Celery55, nil},                      // empty filter
		{"*/0", 60, 0, Celery55, nil},                     // zero step
		{"-1", 60, 0, Celery55, nil},                      // negative
		{"x", 60, 0, Celery55, nil},                       // not a number or a name
	} {
		got, err := parseCronField(tc.spec, tc.max, tc.min, tc.d)
		if tc.want == nil {
			if err == nil {
				t.Errorf("%q: got %v, want an error", tc.spec, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%q: got %v, %v; want %v", tc.spec, got, err, tc.want)
		}
	}
}

func TestCrontabRolloverRefused(t *testing.T) {
	// February never has a 31st: Celery gives up after 2000 months.
	c := MustCrontab(CronSpec{DayOfMonth: "31", MonthOfYear: "2"}, Zone{})
	if _, err := c.Remaining(mustTime("2026-01-01T00:00:00Z"), mustTime("2026-01-01T00:00:00Z")); err != ErrRollover {
		t.Fatalf("got %v, want ErrRollover", err)
	}
}

func mustTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}
