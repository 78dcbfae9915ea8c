package retry

import (
	"math"
	"time"
)

// BackoffInterval is Celery's get_exponential_backoff_interval
// (celery/utils/time.py), in whole seconds:
//
//	countdown = min(maximum, factor * 2**retries)
//	if jitter: countdown = randrange(countdown + 1)
//	return max(0, countdown)
//
// retries is the current retry count (0 on the first failure), so with
// factor 1 the delays are 1, 2, 4, 8… seconds and, with jitter, a uniform
// whole number of seconds in [0, that] (the first retry may be immediate).
// maximum is truncated to whole seconds, as Celery's int() does.
//
// randn(n) must return a uniform integer in [0, n), like math/rand/v2's
// IntN; it is called once, only when jitter is true. A value outside
// [0, n) is clamped into it, and a nil randn yields the unjittered cap.
//
// Where Python's integers are unbounded and Go's are not, the result is
// still Celery's: factor * 2**retries never overflows (any value beyond
// maximum is maximum). Inputs Celery would reject or garble are made safe:
// a factor, maximum or retries below zero counts as zero.
func BackoffInterval(factor, retries int, maximum time.Duration, jitter bool, randn func(n int) int) time.Duration {
	maxSec := max(int64(maximum/time.Second), 0)
	retries = max(retries, 0)
	var sec int64
	switch {
	case factor <= 0:
		sec = 0
	// factor * 2**r > m exactly when factor > floor(m / 2**r), which
	// decides the min() without forming the product.
	case retries >= 63 || int64(factor) > maxSec>>uint(retries):
		sec = maxSec
	default:
		sec = int64(factor) << uint(retries)
	}
	if jitter && randn != nil {
		sec = draw(sec, randn)
	}
	return time.Duration(sec) * time.Second
}

// draw is Python's random.randrange(top + 1) over randn.
func draw(top int64, randn func(int) int) int64 {
	n := top + 1
	if n > math.MaxInt { // only on 32-bit platforms, for caps beyond 68 years
		n = math.MaxInt
	}
	v := int64(randn(int(n)))
	switch {
	case v < 0:
		return 0
	case v >= n:
		return n - 1
	default:
		return v
	}
}
