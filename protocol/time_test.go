package protocol

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

func TestFormatTimePython(t *testing.T) {
	f := loadPyFixture(t)
	for _, c := range f.TimeFormat {
		t.Run(c.ISO, func(t *testing.T) {
			v := untag(t, c.Value).(time.Time)
			if got := FormatTime(v); got != c.ISO {
				t.Errorf("FormatTime(%v) = %q, Python's isoformat() = %q", v, got, c.ISO)
			}
		})
	}
}

func TestParseTimePython(t *testing.T) {
	// Where celeriac deliberately differs from Python 3.11's
	// datetime.fromisoformat.
	lenient := map[string]bool{
		"2024-01-02T03:04:05z": true, // a lower-case Z, accepted like 't'
	}
	strict := map[string]bool{
		"2024-01-02T03:04:05+05:60":  true, // Python reads minute 60 as an hour
		"2024-01-02T03:04:05 +05:00": true, // Python skips a space before the offset
	}
	f := loadPyFixture(t)
	for _, c := range f.TimeParse {
		t.Run(c.Input, func(t *testing.T) {
			got, err := ParseTime(c.Input)
			switch {
			case c.Error && !lenient[c.Input]:
				if err == nil {
					t.Fatalf("ParseTime(%q) = %v; Python refuses it", c.Input, got)
				}
			case strict[c.Input]:
				if err == nil {
					t.Fatalf("ParseTime(%q) = %v; celeriac refuses it on purpose", c.Input, got)
				}
			case c.Error:
				if err != nil {
					t.Fatalf("ParseTime(%q): %v; accepted on purpose", c.Input, err)
				}
			default:
				if err != nil {
					t.Fatalf("ParseTime(%q): %v; Python accepts it", c.Input, err)
				}
				want := untag(t, c.Value)
				if diff := cmp.Diff(want, truncMicro(got), valueOpts); diff != "" {
					t.Errorf("ParseTime(%q) mismatch (-python +got):\n%s", c.Input, diff)
				}
			}
		})
	}
}

func TestParseTime(t *testing.T) {
	ist := time.FixedZone("", 5*3600+1800)
	tests := []struct {
		give string
		want time.Time
	}{
		{"2026-11-29T18:49:39.713054+05:30", time.Date(2026, 11, 29, 18, 49, 39, 713054000, ist)},
		{"2030-01-01T12:00:00", time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)},
		{"2024-01-02T03:04:05.123456789Z", time.Date(2024, 1, 2, 3, 4, 5, 123456789, time.UTC)},
		{"2024-01-02T03:04:05.1234567891234", time.Date(2024, 1, 2, 3, 4, 5, 123456789, time.UTC)},
		{"2024-01-02 03:04:05+0530", time.Date(2024, 1, 2, 3, 4, 5, 0, ist)},
		{"2024-01-02T03:04:05-00:00", time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)},
		{"2024-01-02T03:04-08", time.Date(2024, 1, 2, 3, 4, 0, 0, time.FixedZone("", -8*3600))},
		{"2024-02-29", time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC)},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			got, err := ParseTime(tt.give)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, valueOpts); diff != "" {
				t.Errorf("ParseTime(%q) mismatch (-want +got):\n%s", tt.give, diff)
			}
		})
	}
	for _, bad := range []string{"", "2024", "2024-01-02X03:04:05", "2024-01-02T03:04:05+", "2024-01-02T03:04:05+1", "2024-01-02T03:04:05Zjunk",
		"2024-01-02T03:04:05.x", "2100-02-29", "2024-00-10", "-024-01-02", "2024-01-02T03", "2024-01-02T03:04:5"} {
		if got, err := ParseTime(bad); err == nil {
			t.Errorf("ParseTime(%q) = %v, want an error", bad, got)
		}
	}
}

func TestFormatTime(t *testing.T) {
	tests := []struct {
		give time.Time
		want string
	}{
		{time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC), "2024-01-02T03:04:05+00:00"},
		{time.Date(2024, 1, 2, 3, 4, 5, 999, time.UTC), "2024-01-02T03:04:05+00:00"}, // below a microsecond
		{time.Date(2024, 1, 2, 3, 4, 5, 1000, time.FixedZone("X", -(3*3600+1800))), "2024-01-02T03:04:05.000001-03:30"},
		{time.Date(2024, 1, 2, 3, 4, 5, 0, time.FixedZone("", 3600+15)), "2024-01-02T03:04:05+01:00:15"},
		{time.Date(12, 1, 2, 3, 4, 5, 0, time.UTC), "0012-01-02T03:04:05+00:00"},
		{time.Time{}, "0001-01-01T00:00:00+00:00"},
	}
	for _, tt := range tests {
		if got := FormatTime(tt.give); got != tt.want {
			t.Errorf("FormatTime(%v) = %q, want %q", tt.give, got, tt.want)
		}
	}
}

func FuzzParseTime(f *testing.F) {
	fx := loadPyFixture(f)
	for _, c := range fx.TimeParse {
		f.Add(c.Input)
	}
	for _, c := range fx.TimeFormat {
		f.Add(c.ISO)
	}
	f.Fuzz(func(t *testing.T, s string) {
		defer fuzzwatch.Watch(t, s)()
		got, err := ParseTime(s)
		if err != nil {
			return
		}
		// Whatever is accepted formats as Python would and parses back to
		// the same instant and offset (to the microsecond).
		text := FormatTime(got)
		again, err := ParseTime(text)
		if err != nil {
			t.Fatalf("ParseTime(FormatTime(ParseTime(%q)) = %q): %v", s, text, err)
		}
		if diff := cmp.Diff(got.Truncate(time.Microsecond), again, valueOpts); diff != "" {
			t.Fatalf("%q -> %q round trip mismatch (-want +got):\n%s", s, text, diff)
		}
	})
}
