// Package backendtest is the conformance suite for result backends: every
// implementation of [backend.Backend] (and of [backend.Chords], when it
// counts chord parts natively) runs [Run] in its tests, so that the worker
// can rely on the same behaviour from all of them.
//
//	func TestConformance(t *testing.T) {
//		backendtest.Run(t, func(t *testing.T) backend.Backend {
//			return memory.New()
//		}, backendtest.Features{Chords: true})
//	}
//
// The suite checks what Celery's Python client depends on: each state reads
// back as stored, a SUCCESS is never overwritten, concurrent writers keep
// that promise, chord parts written from many goroutines complete the chord
// exactly once with the results in group_index order, and a closed backend
// answers ErrClosed.
//
// [RunIdempotency] is the suite of [backend.IdempotencyStore]: one winner
// among concurrent claims, the first recorded result returned to every
// later claim, leases that only their holder renews or releases, and
// claims whose holder died expiring so that the next delivery runs.
//
// backendtest imports backend, protocol and the standard library only.
package backendtest
