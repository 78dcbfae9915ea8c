package memory

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/celeriac/celeriac/backend"
)

var _ backend.IdempotencyStore = (*Idempotency)(nil)

// Idempotency is an in-process backend.IdempotencyStore, for tests and
// single-process deployments.
type Idempotency struct {
	mu      sync.Mutex
	entries map[string]*idemEntry
	now     func() time.Time
}

type idemEntry struct {
	owner  string
	done   bool
	result []byte
	until  time.Time
}

// NewIdempotency returns an empty store.
func NewIdempotency() *Idempotency {
	return &Idempotency{entries: map[string]*idemEntry{}, now: time.Now}
}

// Claim implements backend.IdempotencyStore.
func (s *Idempotency) Claim(ctx context.Context, key, owner string, lease time.Duration) (backend.Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e := s.entries[key]
	if e != nil && now.Before(e.until) {
		if e.done {
			return backend.Claim{State: backend.Done, Result: append([]byte{}, e.result...)}, nil
		}
		if e.owner != owner {
			return backend.Claim{State: backend.Busy, Retry: e.until.Sub(now)}, nil
		}
		// The holder claiming again (a retried call) keeps its claim.
	}
	s.entries[key] = &idemEntry{owner: owner, until: now.Add(lease)}
	return backend.Claim{State: backend.Claimed}, nil
}

// Extend implements backend.IdempotencyStore.
func (s *Idempotency) Extend(ctx context.Context, key, owner string, lease time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[key]
	if e == nil || e.done || e.owner != owner || !s.now().Before(e.until) {
		return fmt.Errorf("memory: idempotency key %q is not held by %s", key, owner)
	}
	e.until = s.now().Add(lease)
	return nil
}

// Complete implements backend.IdempotencyStore.
func (s *Idempotency) Complete(ctx context.Context, key, owner string, result []byte, keep time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[key]
	if e != nil && e.done && s.now().Before(e.until) {
		// The first result recorded stays: duplicates must all see it.
		return nil
	}
	if e == nil || e.owner != owner {
		// The lease ran out and someone else may hold it: still record the
		// result, the effect happened.
		e = &idemEntry{owner: owner}
		s.entries[key] = e
	}
	e.done, e.result, e.until = true, append([]byte(nil), result...), s.now().Add(keep)
	return nil
}

// Release implements backend.IdempotencyStore.
func (s *Idempotency) Release(ctx context.Context, key, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entries[key]; e != nil && !e.done && e.owner == owner {
		delete(s.entries, key)
	}
	return nil
}
