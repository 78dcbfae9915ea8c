package backendtest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// Factory returns a new backend for one test. Backends returned for
// different tests must not see each other's data (use a unique key prefix or
// database per call). The suite closes the backend; the factory may register
// further cleanup with t.Cleanup.
type Factory func(t *testing.T) backend.Backend

// Features declare what the backend under test supports. The zero value
// describes a backend with Get and without native chords.
type Features struct {
	// NoGet: the backend cannot read states back (the RPC backend, whose
	// results are messages consumed by the client). Get must return an error
	// matching errors.ErrUnsupported, and the store tests only check that
	// Store accepts what it should and refuses what it should.
	NoGet bool
	// Chords: the backend implements backend.Chords. The suite fails when
	// this disagrees with a type assertion, so that a backend cannot lose
	// chord support silently.
	Chords bool
	// UnorderedChords: chord results come in completion order and without
	// GroupIndex (Celery's result_chord_ordered = False, a list instead of a
	// sorted set). The chord tests then compare results as sets, and a part
	// stored twice counts twice.
	UnorderedChords bool
	// Unstored names the ResultMeta fields the backend's schema has no
	// place for, which Get therefore cannot return: "Result" (for a
	// backend that cannot read back every value it stores), "Children", "GroupID", "ParentID", "Args", "Kwargs", "Retries",
	// "Queue". The suite does not compare them; everything else must
	// read back as stored.
	Unstored []string
	// ChordSizeFirst: parts returned before SetChordSize are not counted,
	// because the counter is created with the size (django-celery-results'
	// ChordCounter). The worker always sets the size before it publishes
	// the header, so ChordSizeSetLate is skipped.
	ChordSizeFirst bool
	// IndexedChords: results carry their position in the header as
	// GroupIndex, also for parts returned without one (a ChordCounter
	// keeps the header's order, not the indexes).
	IndexedChords bool
}

func (f Features) unstored(field string) bool {
	for _, u := range f.Unstored {
		if u == field {
			return true
		}
	}
	return false
}

// Run runs the conformance suite as subtests of t.
func Run(t *testing.T, f Factory, feat Features) {
	t.Helper()
	s := &suite{factory: f, feat: feat}
	t.Run("StoreEachState", s.testStoreEachState)
	t.Run("NotFound", s.testNotFound)
	t.Run("SuccessNeverOverwritten", s.testSuccessNeverOverwritten)
	t.Run("OverwriteBeforeSuccess", s.testOverwriteBeforeSuccess)
	t.Run("ConcurrentStores", s.testConcurrentStores)
	t.Run("ConcurrentStoresSameTask", s.testConcurrentStoresSameTask)
	t.Run("InvalidStore", s.testInvalidStore)
	t.Run("CanceledContext", s.testCanceledContext)
	t.Run("Close", s.testClose)
	t.Run("Forget", s.testForget)
	t.Run("ChordSupport", s.testChordSupport)
	if feat.Chords {
		t.Run("ChordOrdered", s.testChordOrdered)
		t.Run("ChordUnordered", s.testChordUnordered)
		t.Run("ChordFailures", s.testChordFailures)
		t.Run("ChordSizeSetLate", s.testChordSizeSetLate)
		t.Run("ChordWithoutSize", s.testChordWithoutSize)
		t.Run("ChordDuplicatePart", s.testChordDuplicatePart)
		t.Run("ChordAfterComplete", s.testChordAfterComplete)
		t.Run("ChordManyConcurrent", s.testChordManyConcurrent)
		t.Run("ChordInvalid", s.testChordInvalid)
	}
}

type suite struct {
	factory Factory
	feat    Features
}

// diffChord compares chord results, as sets without group indexes when the
// backend does not keep the order.
func (s *suite) diffChord(want, got []backend.ChordPart) string {
	if !s.feat.UnorderedChords {
		return diffParts(want, got)
	}
	strip := func(ps []backend.ChordPart) []backend.ChordPart {
		out := make([]backend.ChordPart, len(ps))
		for i, p := range ps {
			p.GroupIndex = nil
			out[i] = p
		}
		sort.Slice(out, func(i, j int) bool { return out[i].TaskID < out[j].TaskID })
		return out
	}
	return diffParts(strip(want), strip(got))
}

// open returns a fresh backend that is closed when the test ends.
func (s *suite) open(t *testing.T) backend.Backend {
	t.Helper()
	b := s.factory(t)
	if b == nil {
		t.Fatal("backendtest: factory returned nil")
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func (s *suite) chords(t *testing.T, b backend.Backend) backend.Chords {
	t.Helper()
	c, ok := b.(backend.Chords)
	if !ok {
		t.Fatalf("%T does not implement backend.Chords", b)
	}
	return c
}

// newID returns a task or group id that no other test run uses.
func newID(t *testing.T, kind string) string {
	t.Helper()
	return fmt.Sprintf("bt-%s-%s", kind, rand.Text()[:16])
}

// doneAt is a date_done as Celery writes it: UTC with microseconds.
var doneAt = time.Date(2026, 11, 29, 13, 13, 55, 990025000, time.UTC)

// metas returns one document per state, with every field the encoders
// write, using the value types decoders produce.
func metas(id string) map[string]*protocol.ResultMeta {
	base := func(st protocol.State) *protocol.ResultMeta {
		m := &protocol.ResultMeta{
			TaskID: id, Status: st, Children: []any{},
			GroupID: "g-" + id, ParentID: "p-" + id,
			Extended: true, Name: "tasks.add", Args: []any{int64(2), "x"},
			Kwargs: map[string]any{"k": []any{true, nil}}, Worker: "w1@testhost",
			Retries: 1, Queue: "celery",
		}
		if st.Ready() {
			m.DateDone = doneAt
		}
		return m
	}
	success := base(protocol.StateSuccess)
	success.Result = map[string]any{
		"int": int64(-7), "float": 1.5, "str": "héllo ✓ 日本", "list": []any{int64(1), "two", nil},
		"bool": true, "none": nil, "nested": map[string]any{"a": []any{map[string]any{}}},
	}
	success.Children = []any{protocol.ChildTuple("c-" + id)}
	started := base(protocol.StateStarted)
	started.Result = map[string]any{"pid": int64(8789), "hostname": "w1@testhost"}
	failure := base(protocol.StateFailure)
	failure.Result = &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad thing", int64(42)}, Module: "builtins"}
	failure.Traceback = "Traceback (most recent call last):\n  File \"tasks.go\", line 1, in add\nValueError: bad thing\n"
	retry := base(protocol.StateRetry)
	retry.Result = &protocol.ExceptionInfo{Type: "Retry", Message: []any{"Retry in 5s"}, Module: "celery.exceptions"}
	retry.Traceback = "Traceback (most recent call last):\nRetry: Retry in 5s\n"
	revoked := base(protocol.StateRevoked)
	revoked.Result = &protocol.ExceptionInfo{Type: "TaskRevokedError", Message: []any{"expired"}, Module: "celery.exceptions"}
	plain := &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess, Result: int64(5), DateDone: doneAt}
	return map[string]*protocol.ResultMeta{
		"SUCCESS": success, "STARTED": started, "FAILURE": failure,
		"RETRY": retry, "REVOKED": revoked, "SUCCESS-not-extended": plain,
	}
}

func store(t *testing.T, b backend.Backend, m *protocol.ResultMeta) {
	t.Helper()
	err := b.Store(t.Context(), backend.StoreRequest{Meta: m, ReplyTo: "bt-reply", CorrelationID: m.TaskID})
	if err != nil {
		t.Fatalf("Store(%s %s): %v", m.TaskID, m.Status, err)
	}
}

// get reads a state back, or returns nil when the backend has no Get.
func (s *suite) get(t *testing.T, b backend.Backend, id string) *protocol.ResultMeta {
	t.Helper()
	m, err := b.Get(t.Context(), id)
	if s.feat.NoGet {
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("Get on a backend without Get: err = %v, want errors.ErrUnsupported", err)
		}
		return nil
	}
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	if m == nil {
		t.Fatalf("Get(%s) = nil, nil", id)
	}
	return m
}

func (s *suite) testStoreEachState(t *testing.T) {
	b := s.open(t)
	for name, m := range metas(newID(t, "state")) {
		t.Run(name, func(t *testing.T) {
			m.TaskID = newID(t, "state")
			store(t, b, m)
			if got := s.get(t, b, m.TaskID); got != nil {
				if d := diffMeta(m, got, s.feat); d != "" {
					t.Errorf("Get after Store: %s", d)
				}
			}
		})
	}
}

// testForget: a backend that can forget (backend.Forgetter) deletes the
// result, so the task reads as PENDING again; forgetting an unknown id is
// not an error, as in Celery.
func (s *suite) testForget(t *testing.T) {
	b := s.open(t)
	f, ok := b.(backend.Forgetter)
	if !ok {
		t.Skip("the backend cannot forget results")
	}
	id := newID(t, "forget")
	store(t, b, metas(id)["SUCCESS-not-extended"])
	if err := f.Forget(t.Context(), id); err != nil {
		t.Fatalf("Forget: %v", err)
	}
	if _, err := b.Get(t.Context(), id); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("Get after Forget: %v, want ErrNotFound", err)
	}
	if err := f.Forget(t.Context(), newID(t, "forget-unknown")); err != nil {
		t.Fatalf("Forget of an unknown id: %v", err)
	}
}

func (s *suite) testNotFound(t *testing.T) {
	b := s.open(t)
	_, err := b.Get(t.Context(), newID(t, "missing"))
	want := backend.ErrNotFound
	if s.feat.NoGet {
		want = errors.ErrUnsupported
	}
	if !errors.Is(err, want) {
		t.Fatalf("Get(unknown id) err = %v, want %v", err, want)
	}
}

func (s *suite) testSuccessNeverOverwritten(t *testing.T) {
	b := s.open(t)
	for _, next := range []protocol.State{protocol.StateFailure, protocol.StateSuccess, protocol.StateStarted, protocol.StateRetry, protocol.StateRevoked} {
		t.Run(string(next), func(t *testing.T) {
			id := newID(t, "keep")
			first := &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess, Result: "first", DateDone: doneAt}
			store(t, b, first)
			later := &protocol.ResultMeta{TaskID: id, Status: next, Result: "second", DateDone: doneAt.Add(time.Second)}
			if next != protocol.StateSuccess {
				later.Result = &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"late"}, Module: "builtins"}
			}
			store(t, b, later)
			if got := s.get(t, b, id); got != nil {
				if d := diffMeta(first, got, s.feat); d != "" {
					t.Errorf("SUCCESS was overwritten by %s: %s", next, d)
				}
			}
		})
	}
}

func (s *suite) testOverwriteBeforeSuccess(t *testing.T) {
	b := s.open(t)
	seqs := [][]protocol.State{
		{protocol.StateStarted, protocol.StateSuccess},
		{protocol.StateRetry, protocol.StateSuccess},
		{protocol.StateStarted, protocol.StateFailure},
		{protocol.StateStarted, protocol.StateRetry, protocol.StateStarted, protocol.StateSuccess},
		{protocol.StateFailure, protocol.StateSuccess},
		{protocol.StateStarted, protocol.StateRevoked},
	}
	for _, seq := range seqs {
		t.Run(fmt.Sprint(seq), func(t *testing.T) {
			id := newID(t, "seq")
			var last *protocol.ResultMeta
			for i, st := range seq {
				last = &protocol.ResultMeta{TaskID: id, Status: st, Result: int64(i)}
				if st.Ready() {
					last.DateDone = doneAt
				}
				if st == protocol.StateFailure || st == protocol.StateRetry || st == protocol.StateRevoked {
					last.Result = &protocol.ExceptionInfo{Type: "KeyError", Message: []any{fmt.Sprint(i)}, Module: "builtins"}
				}
				store(t, b, last)
			}
			if got := s.get(t, b, id); got != nil {
				if d := diffMeta(last, got, s.feat); d != "" {
					t.Errorf("after %v: %s", seq, d)
				}
			}
		})
	}
}

func (s *suite) testConcurrentStores(t *testing.T) {
	b := s.open(t)
	const writers, each = 64, 8
	prefix := newID(t, "conc")
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("%s-%d-%d", prefix, w, i)
				m := &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess, Result: []any{int64(w), int64(i)}, DateDone: doneAt}
				if err := b.Store(t.Context(), backend.StoreRequest{Meta: m, ReplyTo: "bt-reply"}); err != nil {
					errs <- fmt.Errorf("Store(%s): %w", id, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s.feat.NoGet {
		return
	}
	for w := range writers {
		if s.feat.unstored("Result") {
			break
		}
		for i := range each {
			id := fmt.Sprintf("%s-%d-%d", prefix, w, i)
			got := s.get(t, b, id)
			if want := []any{int64(w), int64(i)}; !reflect.DeepEqual(got.Result, want) {
				t.Errorf("Get(%s).Result = %#v, want %#v", id, got.Result, want)
			}
		}
	}
}

// testConcurrentStoresSameTask races SUCCESS against other states for the
// same ids: whatever the interleaving, the final state must be the SUCCESS,
// which only holds when the read-check-write of Store is atomic.
func (s *suite) testConcurrentStoresSameTask(t *testing.T) {
	b := s.open(t)
	const tasks, rounds = 16, 4
	prefix := newID(t, "race")
	states := []protocol.State{protocol.StateStarted, protocol.StateRetry, protocol.StateFailure, protocol.StateSuccess, protocol.StateRevoked}
	var wg sync.WaitGroup
	errs := make(chan error, tasks*rounds*len(states))
	for i := range tasks {
		id := fmt.Sprintf("%s-%d", prefix, i)
		for r := range rounds {
			for _, st := range states {
				wg.Go(func() {
					m := &protocol.ResultMeta{TaskID: id, Status: st, Result: fmt.Sprintf("%s-%d", st, r)}
					if st != protocol.StateSuccess && st != protocol.StateStarted {
						m.Result = &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"x"}, Module: "builtins"}
					}
					if err := b.Store(t.Context(), backend.StoreRequest{Meta: m}); err != nil {
						errs <- fmt.Errorf("Store(%s %s): %w", id, st, err)
					}
				})
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s.feat.NoGet {
		return
	}
	for i := range tasks {
		id := fmt.Sprintf("%s-%d", prefix, i)
		got := s.get(t, b, id)
		if got.Status != protocol.StateSuccess {
			t.Errorf("Get(%s).Status = %s, want SUCCESS (a later write overwrote it)", id, got.Status)
		}
	}
}

func (s *suite) testInvalidStore(t *testing.T) {
	b := s.open(t)
	for name, r := range map[string]backend.StoreRequest{
		"nil meta":     {},
		"empty id":     {Meta: &protocol.ResultMeta{Status: protocol.StateSuccess}},
		"empty status": {Meta: &protocol.ResultMeta{TaskID: newID(t, "bad")}},
	} {
		t.Run(name, func(t *testing.T) {
			if err := b.Store(t.Context(), r); err == nil {
				t.Fatal("Store accepted an invalid request")
			}
		})
	}
}

func (s *suite) testCanceledContext(t *testing.T) {
	b := s.open(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	id := newID(t, "cancel")
	err := b.Store(ctx, backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess}, ReplyTo: "bt-reply"})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Store with a canceled context: err = %v, want context.Canceled", err)
	}
	if !s.feat.NoGet {
		if _, err := b.Get(ctx, id); !errors.Is(err, context.Canceled) {
			t.Errorf("Get with a canceled context: err = %v, want context.Canceled", err)
		}
	}
}

func (s *suite) testClose(t *testing.T) {
	b := s.factory(t)
	if b == nil {
		t.Fatal("backendtest: factory returned nil")
	}
	id := newID(t, "closed")
	store(t, b, &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess, Result: int64(1)})
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := b.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess}, ReplyTo: "bt-reply"}); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Store after Close: err = %v, want ErrClosed", err)
	}
	if !s.feat.NoGet {
		if _, err := b.Get(t.Context(), id); !errors.Is(err, backend.ErrClosed) {
			t.Errorf("Get after Close: err = %v, want ErrClosed", err)
		}
	}
	if c, ok := b.(backend.Chords); ok {
		if _, err := c.ChordPartReturn(t.Context(), backend.ChordPart{GroupID: id, TaskID: id, State: protocol.StateSuccess}); !errors.Is(err, backend.ErrClosed) {
			t.Errorf("ChordPartReturn after Close: err = %v, want ErrClosed", err)
		}
		if err := c.SetChordSize(t.Context(), id, 1); !errors.Is(err, backend.ErrClosed) {
			t.Errorf("SetChordSize after Close: err = %v, want ErrClosed", err)
		}
	}
	if err := b.Close(); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("second Close: err = %v, want ErrClosed", err)
	}
}

func (s *suite) testChordSupport(t *testing.T) {
	b := s.open(t)
	if _, ok := b.(backend.Chords); ok != s.feat.Chords {
		t.Fatalf("%T implements backend.Chords = %v, but Features.Chords = %v", b, ok, s.feat.Chords)
	}
}

func intp(i int) *int { return &i }

// chordParts returns n successful parts of group gid with distinct results.
func chordParts(gid string, n int, ordered bool) []backend.ChordPart {
	parts := make([]backend.ChordPart, n)
	for i := range parts {
		parts[i] = backend.ChordPart{
			GroupID: gid, TaskID: fmt.Sprintf("%s-part-%02d", gid, i),
			State: protocol.StateSuccess, Result: []any{int64(i), fmt.Sprintf("r%d", i)},
		}
		if ordered {
			parts[i].GroupIndex = intp(i)
		}
	}
	return parts
}

// returnAll calls ChordPartReturn for every part from its own goroutine and
// returns the results of the calls that reported Ready.
func returnAll(t *testing.T, c backend.Chords, parts []backend.ChordPart) []backend.ChordResult {
	t.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		ready []backend.ChordResult
	)
	errs := make(chan error, len(parts))
	for _, p := range parts {
		wg.Go(func() {
			r, err := c.ChordPartReturn(t.Context(), p)
			if err != nil {
				errs <- fmt.Errorf("ChordPartReturn(%s): %w", p.TaskID, err)
				return
			}
			if r.Ready {
				mu.Lock()
				ready = append(ready, r)
				mu.Unlock()
			} else if len(r.Results) != 0 {
				errs <- fmt.Errorf("ChordPartReturn(%s) not ready but returned %d results", p.TaskID, len(r.Results))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return ready
}

func (s *suite) testChordOrdered(t *testing.T) {
	c := s.chords(t, s.open(t))
	gid := newID(t, "chord")
	parts := chordParts(gid, 12, true)
	if err := c.SetChordSize(t.Context(), gid, len(parts)); err != nil {
		t.Fatalf("SetChordSize: %v", err)
	}
	ready := returnAll(t, c, shuffled(parts))
	if len(ready) != 1 {
		t.Fatalf("%d calls reported Ready, want exactly 1", len(ready))
	}
	if d := s.diffChord(parts, ready[0].Results); d != "" {
		t.Errorf("chord results (in group_index order): %s", d)
	}
}

func (s *suite) testChordUnordered(t *testing.T) {
	c := s.chords(t, s.open(t))
	gid := newID(t, "chord")
	parts := chordParts(gid, 9, false)
	// Two ordered parts: unordered ones (Celery's +inf score) come after them.
	parts[3].GroupIndex, parts[7].GroupIndex = intp(1), intp(0)
	if err := c.SetChordSize(t.Context(), gid, len(parts)); err != nil {
		t.Fatalf("SetChordSize: %v", err)
	}
	ready := returnAll(t, c, shuffled(parts))
	if len(ready) != 1 {
		t.Fatalf("%d calls reported Ready, want exactly 1", len(ready))
	}
	got := ready[0].Results
	if s.feat.UnorderedChords {
		if d := s.diffChord(parts, got); d != "" {
			t.Errorf("results: %s", d)
		}
		return
	}
	if len(got) != len(parts) {
		t.Fatalf("got %d results, want %d", len(got), len(parts))
	}
	if d := diffParts([]backend.ChordPart{parts[7], parts[3]}, got[:2]); d != "" {
		t.Errorf("indexed parts must come first, in order: %s", d)
	}
	rest := []backend.ChordPart{parts[0], parts[1], parts[2], parts[4], parts[5], parts[6], parts[8]}
	gotRest := append([]backend.ChordPart(nil), got[2:]...)
	if s.feat.IndexedChords {
		for i := range gotRest {
			if gotRest[i].GroupIndex == nil || *gotRest[i].GroupIndex != i+2 {
				t.Errorf("part %s: GroupIndex %v, want its position %d", gotRest[i].TaskID, gotRest[i].GroupIndex, i+2)
			}
			gotRest[i].GroupIndex = nil
		}
	}
	sort.Slice(gotRest, func(i, j int) bool { return gotRest[i].TaskID < gotRest[j].TaskID })
	if d := diffParts(rest, gotRest); d != "" {
		t.Errorf("unordered parts (compared as a set): %s", d)
	}
}

func (s *suite) testChordFailures(t *testing.T) {
	c := s.chords(t, s.open(t))
	gid := newID(t, "chord")
	parts := chordParts(gid, 6, true)
	parts[1].State = protocol.StateFailure
	parts[1].Result = &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"part 1 failed"}, Module: "builtins"}
	parts[4].State = protocol.StateRevoked
	parts[4].Result = &protocol.ExceptionInfo{Type: "TaskRevokedError", Message: []any{"revoked"}, Module: "celery.exceptions"}
	parts[5].Result = nil
	if err := c.SetChordSize(t.Context(), gid, len(parts)); err != nil {
		t.Fatalf("SetChordSize: %v", err)
	}
	ready := returnAll(t, c, shuffled(parts))
	if len(ready) != 1 {
		t.Fatalf("%d calls reported Ready, want exactly 1", len(ready))
	}
	if d := s.diffChord(parts, ready[0].Results); d != "" {
		t.Errorf("failed parts must be reported with their exception: %s", d)
	}
}

func (s *suite) testChordSizeSetLate(t *testing.T) {
	if s.feat.ChordSizeFirst {
		t.Skip("the backend counts parts from SetChordSize on (Features.ChordSizeFirst)")
	}
	c := s.chords(t, s.open(t))
	gid := newID(t, "chord")
	parts := chordParts(gid, 4, true)
	if ready := returnAll(t, c, parts[:3]); len(ready) != 0 {
		t.Fatalf("chord completed before its size was set")
	}
	if err := c.SetChordSize(t.Context(), gid, len(parts)); err != nil {
		t.Fatalf("SetChordSize: %v", err)
	}
	ready := returnAll(t, c, parts[3:])
	if len(ready) != 1 {
		t.Fatalf("last part: %d Ready, want 1", len(ready))
	}
	if d := s.diffChord(parts, ready[0].Results); d != "" {
		t.Errorf("results: %s", d)
	}
}

func (s *suite) testChordWithoutSize(t *testing.T) {
	c := s.chords(t, s.open(t))
	gid := newID(t, "chord")
	if ready := returnAll(t, c, chordParts(gid, 5, true)); len(ready) != 0 {
		t.Fatalf("a chord without a size completed (%d Ready)", len(ready))
	}
}

func (s *suite) testChordDuplicatePart(t *testing.T) {
	if s.feat.UnorderedChords {
		t.Skip("a list counts duplicate parts, as Celery's list mode does")
	}
	c := s.chords(t, s.open(t))
	gid := newID(t, "chord")
	parts := chordParts(gid, 3, true)
	if err := c.SetChordSize(t.Context(), gid, len(parts)); err != nil {
		t.Fatalf("SetChordSize: %v", err)
	}
	// A redelivered header task stores the same outcome again: like a ZADD
	// of an identical member, it must not count twice.
	for _, p := range []backend.ChordPart{parts[0], parts[1], parts[0], parts[1]} {
		r, err := c.ChordPartReturn(t.Context(), p)
		if err != nil {
			t.Fatalf("ChordPartReturn: %v", err)
		}
		if r.Ready {
			t.Fatalf("chord completed after a duplicate part (%s)", p.TaskID)
		}
	}
	r, err := c.ChordPartReturn(t.Context(), parts[2])
	if err != nil {
		t.Fatalf("ChordPartReturn: %v", err)
	}
	if !r.Ready {
		t.Fatal("last distinct part did not complete the chord")
	}
	if d := s.diffChord(parts, r.Results); d != "" {
		t.Errorf("results: %s", d)
	}
}

func (s *suite) testChordAfterComplete(t *testing.T) {
	c := s.chords(t, s.open(t))
	gid := newID(t, "chord")
	parts := chordParts(gid, 2, true)
	if err := c.SetChordSize(t.Context(), gid, len(parts)); err != nil {
		t.Fatalf("SetChordSize: %v", err)
	}
	if ready := returnAll(t, c, parts); len(ready) != 1 {
		t.Fatalf("%d Ready, want 1", len(ready))
	}
	// A late duplicate (for example a redelivery after the chord fired) must
	// not fire the body again.
	for _, p := range parts {
		r, err := c.ChordPartReturn(t.Context(), p)
		if err != nil {
			t.Fatalf("ChordPartReturn: %v", err)
		}
		if r.Ready {
			t.Fatalf("chord fired again after completing (%s)", p.TaskID)
		}
	}
}

func (s *suite) testChordManyConcurrent(t *testing.T) {
	c := s.chords(t, s.open(t))
	const chords, size = 16, 8
	var all []backend.ChordPart
	groups := make([][]backend.ChordPart, chords)
	for i := range groups {
		gid := newID(t, "chord")
		groups[i] = chordParts(gid, size, true)
		if err := c.SetChordSize(t.Context(), gid, size); err != nil {
			t.Fatalf("SetChordSize: %v", err)
		}
		all = append(all, groups[i]...)
	}
	ready := returnAll(t, c, shuffled(all))
	if len(ready) != chords {
		t.Fatalf("%d Ready, want one per chord (%d)", len(ready), chords)
	}
	seen := map[string]bool{}
	for _, r := range ready {
		if len(r.Results) == 0 {
			t.Fatal("Ready without results")
		}
		gid := r.Results[0].GroupID
		if seen[gid] {
			t.Fatalf("chord %s fired twice", gid)
		}
		seen[gid] = true
		for _, g := range groups {
			if g[0].GroupID == gid {
				if d := s.diffChord(g, r.Results); d != "" {
					t.Errorf("chord %s: %s", gid, d)
				}
			}
		}
	}
}

func (s *suite) testChordInvalid(t *testing.T) {
	c := s.chords(t, s.open(t))
	gid := newID(t, "chord")
	if _, err := c.ChordPartReturn(t.Context(), backend.ChordPart{TaskID: "x", State: protocol.StateSuccess}); err == nil {
		t.Error("ChordPartReturn accepted a part without group id")
	}
	if _, err := c.ChordPartReturn(t.Context(), backend.ChordPart{GroupID: gid, State: protocol.StateSuccess}); err == nil {
		t.Error("ChordPartReturn accepted a part without task id")
	}
	if err := c.SetChordSize(t.Context(), "", 3); err == nil {
		t.Error("SetChordSize accepted an empty group id")
	}
	for _, n := range []int{0, -1} {
		if err := c.SetChordSize(t.Context(), gid, n); err == nil {
			t.Errorf("SetChordSize accepted size %d", n)
		}
	}
}

// shuffled returns a copy of parts in a random order, so that completion
// order differs from group_index order.
func shuffled(parts []backend.ChordPart) []backend.ChordPart {
	out := append([]backend.ChordPart(nil), parts...)
	for i := len(out) - 1; i > 0; i-- {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(i+1)))
		if err != nil {
			return out
		}
		j := int(n.Int64())
		out[i], out[j] = out[j], out[i]
	}
	return out
}
