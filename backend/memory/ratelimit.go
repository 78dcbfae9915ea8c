package memory

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/celeriac/celeriac/backend"
)

var _ backend.RateLimiter = (*RateLimiter)(nil)

// RateLimiter is an in-process backend.RateLimiter: the same token bucket
// as the Redis one, for tests and single-process deployments.
type RateLimiter struct {
	mu      sync.Mutex
	buckets map[string]*bucket
	now     func() time.Time
}

type bucket struct {
	tokens float64
	at     time.Time
}

// NewRateLimiter returns a RateLimiter.
func NewRateLimiter() *RateLimiter {
	return &RateLimiter{buckets: map[string]*bucket{}, now: time.Now}
}

// Reserve implements backend.RateLimiter: the bucket refills at n per
// period up to burst tokens; a reservation may take it below zero, and the
// caller waits until the refill has paid the debt back.
func (l *RateLimiter) Reserve(ctx context.Context, key string, n float64, period time.Duration, burst int) (time.Duration, error) {
	if n <= 0 || period <= 0 {
		return 0, errors.New("memory: rate limit must be positive")
	}
	if burst < 1 {
		burst = 1
	}
	rate := n / period.Seconds() // tokens per second
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b := l.buckets[key]
	if b == nil {
		b = &bucket{tokens: float64(burst), at: now}
		l.buckets[key] = b
	}
	b.tokens = min(float64(burst), b.tokens+now.Sub(b.at).Seconds()*rate)
	b.at = now
	b.tokens--
	if b.tokens >= 0 {
		return 0, nil
	}
	return time.Duration(-b.tokens / rate * float64(time.Second)), nil
}
