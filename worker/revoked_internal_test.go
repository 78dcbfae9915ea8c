package worker

import (
	"fmt"
	"testing"
	"time"
)

// TestRevokedSetBounds: Celery's LimitedSet semantics for revoked ids, at
// the worker's own bounds: at most defaultRevokesMax ids, oldest evicted
// first, each forgotten defaultRevokeExpires after it was revoked, and a
// repeated revoke refreshing an id's age.
func TestRevokedSetBounds(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	s := newRevokedSet(defaultRevokesMax, defaultRevokeExpires)
	for i := 0; i < defaultRevokesMax+10; i++ {
		s.add(t0.Add(time.Duration(i)*time.Millisecond), fmt.Sprint("id-", i))
	}
	now := t0.Add(time.Minute)
	if n := len(s.snapshot(now)); n != defaultRevokesMax {
		t.Fatalf("%d ids kept, want the bound %d", n, defaultRevokesMax)
	}
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"id-0", false}, {"id-9", false}, // the oldest went first
		{"id-10", true}, {fmt.Sprint("id-", defaultRevokesMax+9), true},
	} {
		if got := s.contains(now, tc.id); got != tc.want {
			t.Errorf("contains(%s) = %v, want %v", tc.id, got, tc.want)
		}
	}

	s = newRevokedSet(defaultRevokesMax, defaultRevokeExpires)
	s.add(t0, "old", "again")
	s.add(t0.Add(2*time.Hour), "again") // revoked again: its age restarts
	later := t0.Add(defaultRevokeExpires + time.Second)
	if s.contains(later, "old") {
		t.Error("an id revoked more than 3 h ago is still revoked")
	}
	if !s.contains(later, "again") {
		t.Error("an id revoked again 1 h ago was forgotten")
	}
	if got := s.snapshot(later); len(got) != 1 || !got["again"].Equal(t0.Add(2*time.Hour)) {
		t.Errorf("snapshot = %v", got)
	}
}
