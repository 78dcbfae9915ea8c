package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
)

//go:embed scripts/ratelimit.lua
var rateLimitLua string

// RateLimitNamespace precedes the bucket name in rate-limit keys, after the
// global key prefix: <GlobalKeyPrefix>celeriac.ratelimit.<name>.
const RateLimitNamespace = "celeriac.ratelimit."

var _ backend.RateLimiter = (*Backend)(nil)

// ErrInvalidRate is returned by Reserve for a rate that is not a positive,
// finite number of tokens per positive period, or an empty bucket name.
var ErrInvalidRate = errors.New("redis backend: invalid rate limit")

// RateLimitKey returns the Redis key of the rate-limit bucket name.
func (b *Backend) RateLimitKey(name string) string {
	return b.s.globalPrefix + RateLimitNamespace + name
}

// Reserve implements backend.RateLimiter with a token bucket in Redis,
// shared by every worker (Go or not) that uses the same server, database
// and global key prefix. The bucket holds at most burst tokens (at least 1)
// and refills at n per period; it starts full.
//
// Each call is one script run: it reads the stored token count and the time
// it was stored, adds the refill since then measured by Redis's clock (so
// the workers' clocks do not matter), takes one token and stores the new
// state with a TTL that lets an idle bucket vanish once it would be full
// again. When the bucket was empty the count goes below zero and Reserve
// returns the debt divided by the rate: how long the caller must wait. The
// wait is counted from the moment the script ran; the caller's own start
// time adds the round trip to it. Nothing polls, and a thousand callers
// arriving at once get a thousand start times spaced 1/rate apart.
//
// All callers of one bucket should pass the same rate and burst: the refill
// since the last reservation is computed with the caller's rate and capped
// at the caller's burst.
//
// A bucket whose stored state cannot be read (written by something else) is
// started again, full, with a warning in the log. Reserve returns
// ErrInvalidRate for bad arguments and ErrClosed after Close.
func (b *Backend) Reserve(ctx context.Context, key string, n float64, period time.Duration, burst int) (time.Duration, error) {
	rate := n / period.Seconds()
	if key == "" || !(n > 0) || period <= 0 || math.IsInf(rate, 0) || math.IsNaN(rate) || !(rate > 0) {
		return 0, fmt.Errorf("%w: %v per %v on bucket %q", ErrInvalidRate, n, period, key)
	}
	res, err := b.reserve(ctx, key, rate, max(burst, 1), 0)
	if err != nil {
		return 0, err
	}
	return res.wait, nil
}

// reservation is what the script answered.
type reservation struct {
	wait   time.Duration
	now    time.Time // Redis's clock when the script ran
	tokens float64   // left after this reservation; negative is debt
}

// reserve runs the script. nowMicros overrides Redis's clock when nonzero,
// so that tests can replay a timeline.
func (b *Backend) reserve(ctx context.Context, name string, rate float64, burst int, nowMicros int64) (reservation, error) {
	if err := ctx.Err(); err != nil {
		return reservation{}, err
	}
	if err := b.enter(); err != nil {
		return reservation{}, err
	}
	defer b.inflight.Done()
	key := b.RateLimitKey(name)
	clock := ""
	if nowMicros != 0 {
		clock = strconv.FormatInt(nowMicros, 10)
	}
	// Run tries EVALSHA and falls back to EVAL when the server lost its
	// script cache.
	vals, err := b.rateScript.Run(ctx, b.client, []string{key},
		strconv.FormatFloat(rate, 'g', -1, 64), burst, clock).Slice()
	if err != nil {
		return reservation{}, fmt.Errorf("redis backend: rate limit %q: %w", name, err)
	}
	res, reset, err := parseReservation(vals)
	if err != nil {
		return reservation{}, fmt.Errorf("redis backend: rate limit %q: %w", name, err)
	}
	if reset {
		b.s.log.Warn("redis backend: rate-limit bucket held unreadable state; it started again full",
			zap.String("key", key))
	}
	return res, nil
}

// parseReservation decodes the script's reply {wait µs, now µs, tokens, reset}.
func parseReservation(vals []any) (reservation, bool, error) {
	if len(vals) != 4 {
		return reservation{}, false, fmt.Errorf("unexpected script reply %v", vals)
	}
	wait, ok1 := vals[0].(int64)
	now, ok2 := vals[1].(int64)
	left, ok3 := vals[2].(string)
	reset, ok4 := vals[3].(int64)
	tokens, err := strconv.ParseFloat(left, 64)
	if !ok1 || !ok2 || !ok3 || !ok4 || err != nil || wait < 0 {
		return reservation{}, false, fmt.Errorf("unexpected script reply %v", vals)
	}
	const maxMicros = int64(math.MaxInt64 / time.Microsecond)
	return reservation{
		wait:   time.Duration(min(wait, maxMicros)) * time.Microsecond,
		now:    time.UnixMicro(now),
		tokens: tokens,
	}, reset == 1, nil
}
