package amqp

import "testing"

func TestNextWindow(t *testing.T) {
	for _, tc := range []struct {
		w, n, want int
	}{
		{8, 8, 8},
		{8, 9, 16},   // grow: double
		{8, 40, 40},  // grow past double: what was asked
		{16, 12, 16}, // within the window: keep it
		{16, 5, 16},  // above a quarter: keep it
		{16, 4, 4},   // a quarter: shrink to what was asked
		{8, 0, 0},    // unlimited
		{0, 8, 8},    // limited again
		{0, 0, 0},    //
		{40000, 40001, maxPrefetch},
		{maxPrefetch, maxPrefetch + 1, 0}, // over AMQP's maximum: unlimited, as Celery
	} {
		if got := nextWindow(tc.w, tc.n); got != tc.want {
			t.Errorf("nextWindow(%d, %d) = %d, want %d", tc.w, tc.n, got, tc.want)
		}
	}
	// Celery's prefetch rises by one per held ETA task: from 8 to 10 008,
	// the window changes (and the queues are consumed again) 11 times, not
	// 10 000, and never falls below what was asked or exceeds twice it.
	w, changes := 8, 0
	for n := 9; n <= 10008; n++ {
		next := nextWindow(w, n)
		if next != w {
			changes++
		}
		w = next
		if w < n || w > 2*n {
			t.Fatalf("window %d for prefetch %d", w, n)
		}
	}
	if changes != 11 {
		t.Errorf("%d window changes from 8 to 10 008, want 11", changes)
	}
}
