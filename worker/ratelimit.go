package worker

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Rate is a rate limit: N tasks per interval. The zero Rate means no limit.
type Rate struct {
	N   float64
	Per time.Duration
}

// ParseRate parses Celery's rate_limit syntax: "10/s", "100/m", "1000/h",
// "2.5/s", or a bare number meaning per second. "" and "0" mean no limit.
func ParseRate(s string) (Rate, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Rate{}, nil
	}
	num, unit, hasUnit := strings.Cut(s, "/")
	n, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if err != nil || n < 0 {
		return Rate{}, fmt.Errorf("worker: invalid rate limit %q", s)
	}
	per := time.Second
	if hasUnit {
		switch strings.TrimSpace(unit) {
		case "s":
			per = time.Second
		case "m":
			per = time.Minute
		case "h":
			per = time.Hour
		default:
			return Rate{}, fmt.Errorf("worker: invalid rate limit unit in %q (want s, m or h)", s)
		}
	}
	if n == 0 {
		return Rate{}, nil
	}
	return Rate{N: n, Per: per}, nil
}

// IsZero reports whether r is no limit.
func (r Rate) IsZero() bool { return r.N <= 0 || r.Per <= 0 }

// Interval is the time between two tasks at this rate.
func (r Rate) Interval() time.Duration {
	if r.IsZero() {
		return 0
	}
	return time.Duration(float64(r.Per) / r.N)
}

func (r Rate) String() string {
	if r.IsZero() {
		return ""
	}
	unit := "s"
	switch r.Per {
	case time.Minute:
		unit = "m"
	case time.Hour:
		unit = "h"
	}
	return strconv.FormatFloat(r.N, 'f', -1, 64) + "/" + unit
}

// localBucket is Celery's per-worker rate limit: a token bucket of capacity
// one per task name. reserve hands out start times spaced by the interval,
// so a rate-limited task is scheduled once, waits without a concurrency slot
// and without busy waiting, and is never dropped.
type localBucket struct {
	rate Rate
	next time.Time // when the next token is available
}

func (b *localBucket) reserve(now time.Time) time.Time {
	at := b.next
	if at.Before(now) {
		at = now
	}
	b.next = at.Add(b.rate.Interval())
	return at
}

// rateLimits holds the per-worker buckets, keyed by task name. Remote
// control (rate_limit) may change them while the worker runs.
type rateLimits struct {
	mu      sync.Mutex
	buckets map[string]*localBucket
}

// reserve returns when a task of this name may start, given its rate.
func (r *rateLimits) reserve(name string, rate Rate, now time.Time) time.Time {
	if rate.IsZero() {
		return now
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.buckets == nil {
		r.buckets = make(map[string]*localBucket)
	}
	b := r.buckets[name]
	if b == nil || b.rate != rate {
		b = &localBucket{rate: rate}
		r.buckets[name] = b
	}
	return b.reserve(now)
}
