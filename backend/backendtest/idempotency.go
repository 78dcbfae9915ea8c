package backendtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/celeriac/celeriac/backend"
)

// IdempotencyFactory returns a new store for one test. Stores returned for
// different tests must not see each other's keys (use a unique key prefix
// per call); the factory registers its own cleanup with t.Cleanup.
type IdempotencyFactory func(t *testing.T) backend.IdempotencyStore

// RunIdempotency runs the conformance suite of [backend.IdempotencyStore]
// as subtests of t. It checks what worker.Idempotent relies on: exactly one
// of many concurrent claims wins, a recorded result is what every later
// claim gets (the first one recorded, never replaced), only the holder can
// renew or release its claim, a claim whose holder stops renewing it expires
// and the next claim gets the key, and a result is recorded even when the
// holder's lease lapsed, because the effect happened.
//
// The expiry tests use leases of a few tens of milliseconds and wait for
// them by polling the store, so a store must honour short leases (a
// millisecond resolution).
func RunIdempotency(t *testing.T, f IdempotencyFactory) {
	t.Helper()
	s := &idemSuite{factory: f}
	t.Run("Sequences", s.testSequences)
	t.Run("ResultBytes", s.testResultBytes)
	t.Run("ConcurrentClaims", s.testConcurrentClaims)
	t.Run("ConcurrentDuplicates", s.testConcurrentDuplicates)
	t.Run("LeaseExpires", s.testLeaseExpires)
	t.Run("CompleteAfterLapse", s.testCompleteAfterLapse)
	t.Run("ResultExpires", s.testResultExpires)
}

type idemSuite struct {
	factory IdempotencyFactory
}

// idemStep is one call in a sequence and what it must return.
type idemStep struct {
	op     string // claim, extend, complete, release
	owner  string
	result string // complete: the result; claim: the expected Done result
	want   backend.ClaimState
	// wantErr: extend/complete/release must fail.
	wantErr bool
}

const (
	longLease = time.Minute
	longKeep  = time.Hour
)

func (s *idemSuite) testSequences(t *testing.T) {
	claimed := func(owner string) idemStep { return idemStep{op: "claim", owner: owner, want: backend.Claimed} }
	busy := func(owner string) idemStep { return idemStep{op: "claim", owner: owner, want: backend.Busy} }
	done := func(owner, result string) idemStep {
		return idemStep{op: "claim", owner: owner, want: backend.Done, result: result}
	}
	complete := func(owner, result string) idemStep { return idemStep{op: "complete", owner: owner, result: result} }
	release := func(owner string) idemStep { return idemStep{op: "release", owner: owner} }
	extend := func(owner string) idemStep { return idemStep{op: "extend", owner: owner} }
	extendFails := func(owner string) idemStep { return idemStep{op: "extend", owner: owner, wantErr: true} }
	tests := []struct {
		name  string
		steps []idemStep
	}{
		{"first claim wins", []idemStep{claimed("a")}},
		{"held key is busy", []idemStep{claimed("a"), busy("b"), busy("c")}},
		{"holder claiming again keeps it", []idemStep{claimed("a"), claimed("a"), busy("b")}},
		{"completed key is done", []idemStep{claimed("a"), complete("a", `{"ok":1}`), done("b", `{"ok":1}`), done("a", `{"ok":1}`)}},
		{"released key can be claimed", []idemStep{claimed("a"), release("a"), claimed("b"), busy("a")}},
		{"release by another owner does nothing", []idemStep{claimed("a"), release("b"), busy("b")}},
		{"release of a free key does nothing", []idemStep{release("a"), claimed("b")}},
		{"holder extends", []idemStep{claimed("a"), extend("a"), extend("a"), busy("b")}},
		{"another owner cannot extend", []idemStep{claimed("a"), extendFails("b"), busy("b")}},
		{"no extend of a free key", []idemStep{extendFails("a"), claimed("a")}},
		{"no extend after release", []idemStep{claimed("a"), release("a"), extendFails("a")}},
		{"no extend after complete", []idemStep{claimed("a"), complete("a", "1"), extendFails("a"), done("b", "1")}},
		{"no release after complete", []idemStep{claimed("a"), complete("a", "1"), release("a"), done("b", "1")}},
		{"first result is kept", []idemStep{claimed("a"), complete("a", "1"), complete("a", "2"), done("b", "1")}},
		{"complete without a claim records", []idemStep{complete("a", "[1]"), done("b", "[1]")}},
		{"complete by another owner records", []idemStep{claimed("a"), complete("b", "2"), done("c", "2"), extendFails("a"), complete("a", "1"), done("c", "2")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := s.factory(t)
			ctx := t.Context()
			key := uniqueKey("seq")
			for i, step := range tt.steps {
				where := fmt.Sprintf("step %d (%s by %s)", i, step.op, step.owner)
				var err error
				switch step.op {
				case "claim":
					var c backend.Claim
					c, err = st.Claim(ctx, key, step.owner, longLease)
					if err != nil {
						t.Fatalf("%s: %v", where, err)
					}
					checkClaim(t, where, c, step.want, step.result, longLease)
					continue
				case "extend":
					err = st.Extend(ctx, key, step.owner, longLease)
				case "complete":
					err = st.Complete(ctx, key, step.owner, []byte(step.result), longKeep)
				case "release":
					err = st.Release(ctx, key, step.owner)
				default:
					t.Fatalf("bad step %q", step.op)
				}
				if (err != nil) != step.wantErr {
					t.Fatalf("%s: error %v, want error: %v", where, err, step.wantErr)
				}
			}
		})
	}
}

func checkClaim(t *testing.T, where string, c backend.Claim, want backend.ClaimState, result string, lease time.Duration) {
	t.Helper()
	if c.State != want {
		t.Fatalf("%s: state %s, want %s (%+v)", where, stateName(c.State), stateName(want), c)
	}
	switch want {
	case backend.Done:
		if string(c.Result) != result {
			t.Fatalf("%s: result %q, want %q", where, c.Result, result)
		}
	case backend.Busy:
		if c.Retry <= 0 || c.Retry > lease {
			t.Fatalf("%s: Busy with Retry %v, want the holder's remaining lease in (0, %v]", where, c.Retry, lease)
		}
	}
}

func stateName(s backend.ClaimState) string {
	switch s {
	case backend.Claimed:
		return "Claimed"
	case backend.Done:
		return "Done"
	case backend.Busy:
		return "Busy"
	}
	return fmt.Sprintf("ClaimState(%d)", int(s))
}

// testResultBytes: results are opaque bytes, returned exactly.
func (s *idemSuite) testResultBytes(t *testing.T) {
	st := s.factory(t)
	ctx := t.Context()
	for _, r := range [][]byte{
		{},
		[]byte("null"),
		[]byte(`{"charge_id": "ch_1", "amount": 4200, "currency": "eur"}`),
		[]byte("b-not-a-claim"),
		[]byte("d"),
		{0, 0xff, '\n', 'd', 0x80, 0},
		[]byte(strings.Repeat("x", 1<<16)),
	} {
		key := uniqueKey("bytes")
		if c, err := st.Claim(ctx, key, "a", longLease); err != nil || c.State != backend.Claimed {
			t.Fatalf("claim: %+v %v", c, err)
		}
		if err := st.Complete(ctx, key, "a", r, longKeep); err != nil {
			t.Fatalf("complete: %v", err)
		}
		c, err := st.Claim(ctx, key, "b", longLease)
		if err != nil {
			t.Fatal(err)
		}
		if c.State != backend.Done || !bytes.Equal(c.Result, r) {
			t.Fatalf("result of %d bytes came back as %s with %d bytes", len(r), stateName(c.State), len(c.Result))
		}
	}
}

// testConcurrentClaims: of many owners claiming one key at once, exactly
// one gets it, on every round.
func (s *idemSuite) testConcurrentClaims(t *testing.T) {
	st := s.factory(t)
	ctx := t.Context()
	const rounds, owners = 20, 32
	for round := range rounds {
		key := uniqueKey("race")
		states := make([]backend.ClaimState, owners)
		errs := make([]error, owners)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range owners {
			wg.Go(func() {
				<-start
				c, err := st.Claim(ctx, key, fmt.Sprintf("owner-%d", i), longLease)
				states[i], errs[i] = c.State, err
			})
		}
		close(start)
		wg.Wait()
		counts := map[backend.ClaimState]int{}
		for i := range owners {
			if errs[i] != nil {
				t.Fatalf("round %d owner %d: %v", round, i, errs[i])
			}
			counts[states[i]]++
		}
		if counts[backend.Claimed] != 1 || counts[backend.Busy] != owners-1 {
			t.Fatalf("round %d: %d Claimed, %d Busy, %d Done; want exactly 1 Claimed and the rest Busy",
				round, counts[backend.Claimed], counts[backend.Busy], counts[backend.Done])
		}
	}
}

// testConcurrentDuplicates: while a holder completes, concurrent claims see
// Busy until the result is recorded and Done (with it) afterwards, never a
// second Claimed.
func (s *idemSuite) testConcurrentDuplicates(t *testing.T) {
	st := s.factory(t)
	ctx := t.Context()
	key := uniqueKey("dup")
	if c, err := st.Claim(ctx, key, "holder", longLease); err != nil || c.State != backend.Claimed {
		t.Fatalf("claim: %+v %v", c, err)
	}
	const dups = 16
	var wg sync.WaitGroup
	errs := make(chan error, dups)
	for i := range dups {
		wg.Go(func() {
			owner := fmt.Sprintf("dup-%d", i)
			for {
				c, err := st.Claim(ctx, key, owner, longLease)
				if err != nil {
					errs <- err
					return
				}
				switch c.State {
				case backend.Claimed:
					errs <- fmt.Errorf("%s claimed a key another owner holds", owner)
					return
				case backend.Done:
					if string(c.Result) != `"ch_1"` {
						errs <- fmt.Errorf("%s got result %q", owner, c.Result)
					}
					return
				}
			}
		})
	}
	if err := st.Complete(ctx, key, "holder", []byte(`"ch_1"`), longKeep); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// testLeaseExpires: a holder that dies stops renewing; once its lease is
// over the next claim gets the key, and the dead holder can neither renew
// nor release the new holder's claim.
func (s *idemSuite) testLeaseExpires(t *testing.T) {
	st := s.factory(t)
	ctx := t.Context()
	key := uniqueKey("lease")
	const lease = 30 * time.Millisecond
	if c, err := st.Claim(ctx, key, "dead", lease); err != nil || c.State != backend.Claimed {
		t.Fatalf("claim: %+v %v", c, err)
	}
	claimUntil(t, st, key, "next", backend.Claimed)
	if err := st.Extend(ctx, key, "dead", longLease); err == nil {
		t.Fatal("the dead holder renewed a lease it lost")
	}
	if err := st.Release(ctx, key, "dead"); err != nil {
		t.Fatalf("release by a former holder: %v", err)
	}
	if c, err := st.Claim(ctx, key, "third", longLease); err != nil || c.State != backend.Busy {
		t.Fatalf("the former holder's release freed the new holder's claim: %+v %v", c, err)
	}
	if err := st.Extend(ctx, key, "next", longLease); err != nil {
		t.Fatalf("the new holder cannot renew: %v", err)
	}
}

// testCompleteAfterLapse: a slow holder whose lease lapsed still records
// its result (its effect happened), and the second holder that claimed
// meanwhile then finds its lease gone and keeps the first result.
func (s *idemSuite) testCompleteAfterLapse(t *testing.T) {
	st := s.factory(t)
	ctx := t.Context()
	key := uniqueKey("lapse")
	if c, err := st.Claim(ctx, key, "slow", 30*time.Millisecond); err != nil || c.State != backend.Claimed {
		t.Fatalf("claim: %+v %v", c, err)
	}
	claimUntil(t, st, key, "second", backend.Claimed)
	if err := st.Complete(ctx, key, "slow", []byte("first"), longKeep); err != nil {
		t.Fatalf("complete after the lease lapsed: %v", err)
	}
	c, err := st.Claim(ctx, key, "third", longLease)
	if err != nil || c.State != backend.Done || string(c.Result) != "first" {
		t.Fatalf("after the slow holder completed: %+v %v", c, err)
	}
	if err := st.Extend(ctx, key, "second", longLease); err == nil {
		t.Fatal("the second holder renewed a key that is done")
	}
	if err := st.Complete(ctx, key, "second", []byte("second"), longKeep); err != nil {
		t.Fatal(err)
	}
	if c, _ := st.Claim(ctx, key, "third", longLease); c.State != backend.Done || string(c.Result) != "first" {
		t.Fatalf("the first result was replaced: %+v", c)
	}
}

// testResultExpires: a result is kept for keep, then the key is free.
func (s *idemSuite) testResultExpires(t *testing.T) {
	st := s.factory(t)
	ctx := t.Context()
	key := uniqueKey("keep")
	if c, err := st.Claim(ctx, key, "a", longLease); err != nil || c.State != backend.Claimed {
		t.Fatalf("claim: %+v %v", c, err)
	}
	if err := st.Complete(ctx, key, "a", []byte("r"), 30*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	claimUntil(t, st, key, "b", backend.Claimed)
}

// claimUntil claims key for owner until the claim returns want, failing
// after a generous deadline (the store's clock decides; nothing here
// asserts how long it took).
func claimUntil(t *testing.T, st backend.IdempotencyStore, key, owner string, want backend.ClaimState) backend.Claim {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		c, err := st.Claim(ctx, key, owner, longLease)
		if err != nil {
			t.Fatalf("claim by %s: %v", owner, err)
		}
		if c.State == want {
			return c
		}
		select {
		case <-ctx.Done():
			t.Fatalf("claim by %s: still %s, want %s", owner, stateName(c.State), stateName(want))
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func uniqueKey(kind string) string {
	return "backendtest:" + kind + ":" + rand.Text()[:16]
}
