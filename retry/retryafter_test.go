package retry_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/celeriac/celeriac/retry"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// now is the fixed "current time" of the tests, with a fraction of a second
// so that HTTP dates (whole seconds) do not line up with it.
var testNow = time.Date(2026, 11, 29, 12, 0, 0, 250_000_000, time.UTC)

func TestParseRetryAfter(t *testing.T) {
	tests := []struct {
		name   string
		give   string
		want   time.Duration
		wantOK bool
	}{
		{"seconds", "120", 120 * time.Second, true},
		{"zero seconds", "0", 0, true},
		{"leading zeros", "0007", 7 * time.Second, true},
		{"surrounding spaces and tabs", " \t30\t ", 30 * time.Second, true},
		{"2**31 - 1 seconds", "2147483647", 2147483647 * time.Second, true},
		{"2**31 seconds is the cap", "2147483648", retry.MaxRetryAfter, true},
		{"beyond int64 saturates", "99999999999999999999999999999", retry.MaxRetryAfter, true},
		{"IMF-fixdate in the future", "Sun, 29 Nov 2026 12:02:00 GMT", 2*time.Minute - 250*time.Millisecond, true},
		{"IMF-fixdate in the past", "Sun, 29 Nov 2026 11:00:00 GMT", 0, true},
		{"IMF-fixdate equal to now's second", "Sun, 29 Nov 2026 12:00:00 GMT", 0, true},
		{"IMF-fixdate long ago", "Sun, 06 Nov 1994 08:49:37 GMT", 0, true},
		{"IMF-fixdate far future is capped", "Fri, 31 Dec 9999 23:59:59 GMT", retry.MaxRetryAfter, true},
		{"RFC 850 date", "Sunday, 29-Nov-26 12:00:10 GMT", 9*time.Second + 750*time.Millisecond, true},
		{"asctime date", "Sun Nov 29 12:00:10 2026", 9*time.Second + 750*time.Millisecond, true},
		{"asctime date, one-digit day", "Wed Dec  2 12:00:00 2026", 3*24*time.Hour - 250*time.Millisecond, true},
		{"empty", "", 0, false},
		{"blank", "  \t ", 0, false},
		{"negative", "-5", 0, false},
		{"plus sign", "+5", 0, false},
		{"fraction", "1.5", 0, false},
		{"unit", "30s", 0, false},
		{"hex", "0x10", 0, false},
		{"inner space", "1 2", 0, false},
		{"garbage", "soon", 0, false},
		{"non-GMT zone", "Sun, 29 Nov 2026 12:02:00 PST", 0, false},
		{"numeric zone", "Sun, 29 Nov 2026 12:02:00 +0000", 0, false},
		{"ISO 8601 is not an HTTP-date", "2026-11-29T12:02:00Z", 0, false},
		{"date without zone", "Sun, 29 Nov 2026 12:02:00", 0, false},
		{"impossible date", "Sun, 31 Feb 2026 12:02:00 GMT", 0, false},
		{"too long", "Sun, 29 Nov 2026 12:02:00 GMT" + strings.Repeat(" x", 40), 0, false},
		{"unicode digits", "١٢٠", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := retry.ParseRetryAfter(tt.give, testNow)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.give, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// FuzzParseRetryAfter checks that no input panics, that every accepted
// value is a delay in [0, MaxRetryAfter], and that the result agrees with
// independent oracles: strconv for delay-seconds and net/http's
// ParseTime for dates.
func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{
		"120", "0", "", " 5 ", "-1", "1.5", "99999999999999999999",
		"Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
		"Sun, 29 Nov 2026 12:02:00 GMT", "Fri, 31 Dec 9999 23:59:59 GMT", "Sun, 29 Nov 2026 12:02:00 PST",
		"soon", "\t", "2026-11-29T12:02:00Z",
	} {
		f.Add(s, testNow.Unix())
	}
	f.Fuzz(func(t *testing.T, value string, nowUnix int64) {
		defer fuzzwatch.Watch(t, value, nowUnix)()
		now := time.Unix(nowUnix%(1<<40), 0).UTC() // keep now within time's comfortable range
		d, ok := retry.ParseRetryAfter(value, now)
		if !ok {
			if d != 0 {
				t.Fatalf("ParseRetryAfter(%q) = %v, false; a refusal must return 0", value, d)
			}
			return
		}
		if d < 0 || d > retry.MaxRetryAfter {
			t.Fatalf("ParseRetryAfter(%q) = %v, outside [0, %v]", value, d, retry.MaxRetryAfter)
		}
		trimmed := strings.Trim(value, " \t")
		if n, err := strconv.ParseUint(trimmed, 10, 64); err == nil && trimmed[0] != '+' {
			want := retry.MaxRetryAfter
			if n < uint64(retry.MaxRetryAfter/time.Second) {
				want = time.Duration(n) * time.Second
			}
			if d != want {
				t.Fatalf("ParseRetryAfter(%q) = %v, strconv says %v", value, d, want)
			}
			return
		}
		date, err := http.ParseTime(trimmed)
		if err != nil {
			if !isASCIIDigits(trimmed) {
				t.Fatalf("ParseRetryAfter(%q) accepted a value net/http does not parse as a date: %v", value, err)
			}
			return // a digit string too long for strconv
		}
		want := min(max(date.Sub(now), 0), retry.MaxRetryAfter)
		if date.After(now.Add(retry.MaxRetryAfter)) {
			want = retry.MaxRetryAfter
		}
		if d != want {
			t.Fatalf("ParseRetryAfter(%q) = %v, net/http date %v gives %v", value, d, date, want)
		}
	})
}

func isASCIIDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
