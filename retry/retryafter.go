package retry

import (
	"time"
)

// MaxRetryAfter bounds a server-dictated delay. RFC 9110 §10.2.3 allows any
// delay-seconds; §1.2.2 tells a recipient that cannot represent a value to
// use 2**31 seconds, which is also where this package stops, for dates too.
const MaxRetryAfter = (1 << 31) * time.Second

// The three HTTP-date forms RFC 9110 §5.6.7 requires a recipient to accept.
// The zone is the literal GMT the grammar prescribes: a zone abbreviation
// parsed by time.Parse would be resolved against time.Local, making the
// result depend on the machine.
const (
	imfFixdate = "Mon, 02 Jan 2006 15:04:05 GMT"
	rfc850Date = "Monday, 02-Jan-06 15:04:05 GMT"
	asctime    = "Mon Jan _2 15:04:05 2006" // always UTC
)

// maxHTTPDateLen is above the longest HTTP-date (a Wednesday in RFC 850
// form, 33 bytes); longer values are refused before any parsing.
const maxHTTPDateLen = 40

// ParseRetryAfter parses an HTTP Retry-After header value (RFC 9110
// §10.2.3): delay-seconds (a non-negative decimal integer) or an HTTP-date,
// which is resolved against now. It returns the delay to wait from now:
// zero for a date in the past, at most [MaxRetryAfter]. ok is false for an
// empty or malformed value; the caller then falls back to its own delay.
// Surrounding spaces and tabs are ignored.
func ParseRetryAfter(value string, now time.Time) (d time.Duration, ok bool) {
	value = trimOWS(value)
	if value == "" {
		return 0, false
	}
	if isDigits(value) {
		return delaySeconds(value), true
	}
	if len(value) > maxHTTPDateLen {
		return 0, false
	}
	for _, layout := range [...]string{imfFixdate, rfc850Date, asctime} {
		t, err := time.Parse(layout, value)
		if err != nil {
			continue
		}
		// Compare against MaxRetryAfter before subtracting: Sub saturates
		// at ±292 years, and year-9999 dates are valid input.
		if t.After(now.Add(MaxRetryAfter)) {
			return MaxRetryAfter, true
		}
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

func trimOWS(s string) string {
	i, j := 0, len(s)
	for i < j && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	for j > i && (s[j-1] == ' ' || s[j-1] == '\t') {
		j--
	}
	return s[i:j]
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// delaySeconds converts a string of digits, saturating at MaxRetryAfter.
func delaySeconds(s string) time.Duration {
	const limit = int64(MaxRetryAfter / time.Second)
	var n int64
	for i := 0; i < len(s); i++ {
		n = n*10 + int64(s[i]-'0')
		if n >= limit {
			return MaxRetryAfter
		}
	}
	return time.Duration(n) * time.Second
}
