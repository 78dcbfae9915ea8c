package protocol

import (
	"fmt"
	"time"
)

// ParseTime parses an ISO 8601 time as Celery writes it (Python's
// datetime.isoformat()) and as Celery's workers accept it:
//
//	YYYY-MM-DD[(T|t| )HH:MM[:SS[(.|,)f+]][Z|z|±HH:MM|±HHMM|±HH|±HH:MM:SS]]
//
// Fraction digits past nanoseconds are dropped. A value without an offset
// (naive) is read as UTC, as Celery's worker does for eta and expires. A
// zero offset yields a time in [time.UTC]; any other offset is kept as a
// fixed zone, so [FormatTime] writes it back unchanged. A date alone means
// midnight UTC. Offsets must be less than 24 hours, as in Python.
func ParseTime(s string) (time.Time, error) {
	t, ok := parseTime(s)
	if !ok {
		return time.Time{}, fmt.Errorf("protocol: invalid ISO 8601 time %q", s)
	}
	return t, nil
}

func parseTime(s string) (time.Time, bool) {
	if len(s) < 10 {
		return time.Time{}, false
	}
	d, ok := parseDatePart(s[:10])
	if !ok {
		return time.Time{}, false
	}
	rest := s[10:]
	if rest == "" {
		return time.Date(d.Year, d.Month, d.Day, 0, 0, 0, 0, time.UTC), true
	}
	if c := rest[0]; c != 'T' && c != 't' && c != ' ' {
		return time.Time{}, false
	}
	clock, rest, ok := parseClock(rest[1:])
	if !ok {
		return time.Time{}, false
	}
	loc, ok := parseOffset(rest)
	if !ok {
		return time.Time{}, false
	}
	return time.Date(d.Year, d.Month, d.Day, clock.Hour, clock.Minute, clock.Second, clock.Nanosecond, loc), true
}

// parseOffset parses the zone suffix of an ISO time; "" is naive (UTC).
func parseOffset(s string) (*time.Location, bool) {
	switch s {
	case "", "Z", "z":
		return time.UTC, true
	}
	sign := 1
	switch s[0] {
	case '+':
	case '-':
		sign = -1
	default:
		return nil, false
	}
	s = s[1:]
	var h, m, sec int
	var ok bool
	switch {
	case len(s) == 2:
		h, ok = atoiFixed(s)
	case len(s) == 4:
		h, ok = atoiFixed(s[:2])
		if ok {
			m, ok = atoiFixed(s[2:])
		}
	case len(s) == 5 && s[2] == ':':
		h, ok = atoiFixed(s[:2])
		if ok {
			m, ok = atoiFixed(s[3:])
		}
	case len(s) == 8 && s[2] == ':' && s[5] == ':':
		h, ok = atoiFixed(s[:2])
		if ok {
			m, ok = atoiFixed(s[3:5])
		}
		if ok {
			sec, ok = atoiFixed(s[6:])
		}
	}
	if !ok || h > 23 || m > 59 || sec > 59 {
		return nil, false
	}
	off := sign * (h*3600 + m*60 + sec)
	if off == 0 {
		return time.UTC, true
	}
	return time.FixedZone("", off), true
}

// FormatTime formats t exactly as Python's datetime.isoformat() formats an
// aware datetime with t's UTC offset:
//
//	2024-01-02T03:04:05+00:00
//	2024-01-02T03:04:05.123456+05:30
//
// The fraction is written only when the microseconds are not zero, and the
// offset is always ±HH:MM (±HH:MM:SS if it has seconds), never "Z". Python
// keeps microseconds, so finer digits are truncated. Naive output is not
// offered: Celery reads naive times as UTC, so writing the offset loses
// nothing. Years outside 1..9999, which Python cannot represent, are
// written with at least four digits and a sign when negative.
func FormatTime(t time.Time) string {
	return string(appendTime(make([]byte, 0, 32), t))
}

func appendTime(b []byte, t time.Time) []byte {
	y, mo, d := t.Date()
	h, mi, s := t.Clock()
	b = Date{Year: y, Month: mo, Day: d}.appendISO(b)
	b = append(b, 'T')
	b = TimeOfDay{Hour: h, Minute: mi, Second: s, Nanosecond: t.Nanosecond()}.appendISO(b)
	_, off := t.Zone()
	if off < 0 {
		b = append(b, '-')
		off = -off
	} else {
		b = append(b, '+')
	}
	b = appendInt(b, off/3600, 2)
	b = append(b, ':')
	b = appendInt(b, off/60%60, 2)
	if off%60 != 0 {
		b = append(b, ':')
		b = appendInt(b, off%60, 2)
	}
	return b
}
