package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/backend"
)

// IdempotencyNamespace follows the global key prefix in the key of every
// idempotency claim: <GlobalKeyPrefix>celeriac.idem.<key>.
const IdempotencyNamespace = "celeriac.idem."

var (
	//go:embed scripts/idem_claim.lua
	idemClaimLua string
	//go:embed scripts/idem_extend.lua
	idemExtendLua string
	//go:embed scripts/idem_complete.lua
	idemCompleteLua string
	//go:embed scripts/idem_release.lua
	idemReleaseLua string
)

// idemScripts are the IdempotencyStore scripts; goredis.Script runs EVALSHA
// and falls back to EVAL when the server lost its script cache.
type idemScripts struct {
	claim, extend, complete, release *goredis.Script
}

func newIdemScripts() idemScripts {
	return idemScripts{
		claim:    goredis.NewScript(idemClaimLua),
		extend:   goredis.NewScript(idemExtendLua),
		complete: goredis.NewScript(idemCompleteLua),
		release:  goredis.NewScript(idemReleaseLua),
	}
}

var _ backend.IdempotencyStore = (*Backend)(nil)

// IdempotencyKey returns the Redis key of an idempotency claim.
func (b *Backend) IdempotencyKey(key string) string {
	return b.s.globalPrefix + IdempotencyNamespace + key
}

// Claim implements backend.IdempotencyStore in one script: it takes key for
// owner with a lease of lease (the key's PX expiry), unless a result is
// recorded (Done, with it) or another owner's lease is still running (Busy,
// with the time it has left). A lease whose holder died simply expires, and
// the next Claim gets the key. Claiming again with the owner that holds the
// key renews the lease and reports Claimed, so a Claim retried after a lost
// reply is harmless.
func (b *Backend) Claim(ctx context.Context, key, owner string, lease time.Duration) (backend.Claim, error) {
	if err := checkIdem("Claim", key, owner, lease); err != nil {
		return backend.Claim{}, err
	}
	if err := b.enter(); err != nil {
		return backend.Claim{}, err
	}
	defer b.inflight.Done()
	reply, err := b.idem.claim.Run(ctx, b.client, []string{b.IdempotencyKey(key)}, owner, millis(lease)).Slice()
	if err != nil {
		return backend.Claim{}, fmt.Errorf("redis backend: idempotency claim %q: %w", key, err)
	}
	c, err := parseClaim(reply)
	if err != nil {
		return backend.Claim{}, fmt.Errorf("redis backend: idempotency claim %q: %w", key, err)
	}
	return c, nil
}

// parseClaim decodes the claim script's reply.
func parseClaim(reply []any) (backend.Claim, error) {
	if len(reply) == 0 {
		return backend.Claim{}, errors.New("empty reply")
	}
	state, ok := reply[0].(int64)
	if !ok {
		return backend.Claim{}, fmt.Errorf("reply state %T, want an integer", reply[0])
	}
	switch {
	case state == 0 && len(reply) == 1:
		return backend.Claim{State: backend.Claimed}, nil
	case state == 1 && len(reply) == 2:
		r, ok := reply[1].(string)
		if !ok {
			return backend.Claim{}, fmt.Errorf("stored result is %T, want a string", reply[1])
		}
		return backend.Claim{State: backend.Done, Result: []byte(r)}, nil
	case state == 2 && len(reply) == 2:
		ms, ok := reply[1].(int64)
		if !ok {
			return backend.Claim{}, fmt.Errorf("lease left is %T, want an integer", reply[1])
		}
		// PTTL is -1 for a key without expiry, which this store never
		// writes; -2 (gone) cannot happen inside the script. Either way the
		// caller should come back soon rather than wait.
		return backend.Claim{State: backend.Busy, Retry: time.Duration(max(ms, 0)) * time.Millisecond}, nil
	}
	return backend.Claim{}, fmt.Errorf("unexpected reply %v", reply)
}

// Extend implements backend.IdempotencyStore: it renews owner's lease to
// lease from now, or fails when owner no longer holds key (the lease
// expired, or the key was released or completed).
func (b *Backend) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	if err := checkIdem("Extend", key, owner, lease); err != nil {
		return err
	}
	n, err := b.idemRun(ctx, b.idem.extend, key, owner, millis(lease))
	if err != nil {
		return fmt.Errorf("redis backend: idempotency extend %q: %w", key, err)
	}
	if n == 0 {
		return fmt.Errorf("redis backend: idempotency key %q is not held by %s (its lease expired, or it was released or completed)", key, owner)
	}
	return nil
}

// Complete implements backend.IdempotencyStore: it records result, kept for
// keep. The effect happened, so the result is recorded even when owner's
// lease lapsed meanwhile; if a result is already recorded (a second holder
// after a lapse finished first), that one is kept, so every duplicate gets
// the same result.
func (b *Backend) Complete(ctx context.Context, key, owner string, result []byte, keep time.Duration) error {
	if err := checkIdem("Complete", key, owner, keep); err != nil {
		return err
	}
	if len(result) >= maxValueSize {
		return fmt.Errorf("redis backend: idempotency complete %q: result of %d bytes is over Redis's 512 MB limit", key, len(result))
	}
	if _, err := b.idemRun(ctx, b.idem.complete, key, owner, result, millis(keep)); err != nil {
		return fmt.Errorf("redis backend: idempotency complete %q: %w", key, err)
	}
	return nil
}

// Release implements backend.IdempotencyStore: it deletes key if owner still
// holds it, so that a retry can claim it at once. A key owner no longer
// holds is left alone; that is not an error.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	if err := checkIdem("Release", key, owner, time.Millisecond); err != nil {
		return err
	}
	if _, err := b.idemRun(ctx, b.idem.release, key, owner); err != nil {
		return fmt.Errorf("redis backend: idempotency release %q: %w", key, err)
	}
	return nil
}

// idemRun runs a script that returns an integer on the key's Redis key.
func (b *Backend) idemRun(ctx context.Context, s *goredis.Script, key string, args ...any) (int64, error) {
	if err := b.enter(); err != nil {
		return 0, err
	}
	defer b.inflight.Done()
	return s.Run(ctx, b.client, []string{b.IdempotencyKey(key)}, args...).Int64()
}

// checkIdem rejects arguments that would make a claim meaningless: without
// an owner nobody could tell holders apart, and a lease or keep below a
// millisecond is no time at all (PX takes whole milliseconds).
func checkIdem(op, key, owner string, d time.Duration) error {
	switch {
	case key == "":
		return fmt.Errorf("redis backend: idempotency %s: empty key", op)
	case owner == "":
		return fmt.Errorf("redis backend: idempotency %s %q: empty owner", op, key)
	case d < time.Millisecond:
		return fmt.Errorf("redis backend: idempotency %s %q: duration %v is under a millisecond", op, key, d)
	}
	return nil
}

// millis rounds d up to whole milliseconds, so a lease never ends early.
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
