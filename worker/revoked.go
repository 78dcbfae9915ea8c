package worker

import (
	"container/list"
	"sync"
	"time"
)

// Celery's bounds for the revoked set (CELERY_WORKER_REVOKES_MAX and
// CELERY_WORKER_REVOKE_EXPIRES).
const (
	defaultRevokesMax    = 50000
	defaultRevokeExpires = 3 * time.Hour
)

// revokedSet is Celery's LimitedSet of revoked task ids: bounded in size,
// each entry expiring after a while, oldest evicted first.
type revokedSet struct {
	mu      sync.Mutex
	max     int
	expires time.Duration
	order   *list.List // of revokedEntry, oldest first
	index   map[string]*list.Element
}

type revokedEntry struct {
	id string
	at time.Time
}

func newRevokedSet(max int, expires time.Duration) *revokedSet {
	return &revokedSet{max: max, expires: expires, order: list.New(), index: map[string]*list.Element{}}
}

// add records ids as revoked at now.
func (s *revokedSet) add(now time.Time, ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if e, ok := s.index[id]; ok {
			s.order.Remove(e)
		}
		s.index[id] = s.order.PushBack(revokedEntry{id: id, at: now})
	}
	s.purge(now)
}

// contains reports whether id is revoked (and not expired) at now.
func (s *revokedSet) contains(now time.Time, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.index) == 0 {
		return false
	}
	e, ok := s.index[id]
	if !ok {
		return false
	}
	if now.Sub(e.Value.(revokedEntry).at) > s.expires {
		s.order.Remove(e)
		delete(s.index, id)
		return false
	}
	return true
}

// snapshot returns the live ids with the times they were revoked.
func (s *revokedSet) snapshot(now time.Time) map[string]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.purge(now)
	out := make(map[string]time.Time, len(s.index))
	for e := s.order.Front(); e != nil; e = e.Next() {
		r := e.Value.(revokedEntry)
		out[r.id] = r.at
	}
	return out
}

func (s *revokedSet) purge(now time.Time) {
	for e := s.order.Front(); e != nil; e = s.order.Front() {
		r := e.Value.(revokedEntry)
		if len(s.index) <= s.max && now.Sub(r.at) <= s.expires {
			return
		}
		s.order.Remove(e)
		delete(s.index, r.id)
	}
}
