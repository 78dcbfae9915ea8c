package backend

import (
	"context"
	"time"
)

// Shared worker state beyond results: a fleet of workers (Go and Python)
// that share a Redis server share these too. backend/redis implements them
// with one atomic script per operation; backend/memory for a single process.

// RateLimiter is a rate limit shared by every worker that uses it: a token
// bucket refilled at n per period, holding at most burst tokens.
type RateLimiter interface {
	// Reserve takes one token from the bucket named key and returns how long
	// the caller must wait before using it (zero: now). A token reserved
	// ahead makes later callers wait longer, so the rate holds across all
	// callers without anyone polling.
	Reserve(ctx context.Context, key string, n float64, period time.Duration, burst int) (time.Duration, error)
}

// ClaimState is the outcome of IdempotencyStore.Claim.
type ClaimState int

// Claim states.
const (
	// Claimed: the caller holds the key and must run the effect, then
	// Complete or Release.
	Claimed ClaimState = iota
	// Done: the effect already happened; Claim.Result is its stored result.
	Done
	// Busy: another live holder is running the effect now.
	Busy
)

// Claim is what IdempotencyStore.Claim found.
type Claim struct {
	State ClaimState
	// Result is the stored result (JSON) when State is Done.
	Result []byte
	// Retry is how long the current holder's lease still runs, when Busy.
	Retry time.Duration
}

// IdempotencyStore keeps idempotency claims and results. Claim must be
// atomic across every worker sharing the store.
type IdempotencyStore interface {
	// Claim takes key for owner with a lease, unless it is done or held by a
	// live owner.
	Claim(ctx context.Context, key, owner string, lease time.Duration) (Claim, error)
	// Extend renews owner's lease; it fails when owner no longer holds key.
	Extend(ctx context.Context, key, owner string, lease time.Duration) error
	// Complete records the result and keeps key done for keep.
	Complete(ctx context.Context, key, owner string, result []byte, keep time.Duration) error
	// Release gives key up without a result: the effect did not happen, and
	// a later delivery (a retry) may claim it.
	Release(ctx context.Context, key, owner string) error
}
