package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/celeriac/celeriac/backend"
	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/worker"
)

// unlockBackend is the in-memory backend plus a ChordUnlocker whose chord
// becomes ready on the readyAt-th call, claimed by the first caller then.
type unlockBackend struct {
	*membackend.Backend
	readyAt int

	mu       sync.Mutex
	calls    int
	claimant string
}

func (b *unlockBackend) UnlockChord(_ context.Context, gid string, ids []string, claimant string) (backend.ChordResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	if b.calls < b.readyAt {
		return backend.ChordResult{}, nil
	}
	if b.claimant != "" && b.claimant != claimant {
		return backend.ChordResult{}, backend.ErrChordDone
	}
	b.claimant = claimant
	res := backend.ChordResult{Ready: true}
	for i, id := range ids {
		res.Results = append(res.Results, backend.ChordPart{GroupID: gid, TaskID: id, State: protocol.StateSuccess, Result: int64(i + 1)})
	}
	return res, nil
}

// TestChordUnlockBuiltin: celery.chord_unlock, as a Python client sends
// it, is retried every interval until the backend says the header is
// ready, then sends the body once with the header's results; another
// chord_unlock for the same chord sends nothing.
func TestChordUnlockBuiltin(t *testing.T) {
	be := &unlockBackend{Backend: membackend.New(), readyAt: 3}
	h := newHarness(t, worker.Config{Backend: be})
	var (
		mu   sync.Mutex
		runs [][]int64
	)
	h.mux.HandleFunc("t.sum", func(ctx context.Context, task *worker.Task) (any, error) {
		var xs []int64
		if err := task.Bind(&xs); err != nil {
			return nil, err
		}
		mu.Lock()
		runs = append(runs, xs)
		mu.Unlock()
		return xs[0] + xs[1] + xs[2], nil
	})
	h.start()
	body := protocol.Signature{Task: "t.sum", Args: []any{}, Kwargs: map[string]any{}, Options: map[string]any{"task_id": "body-1"}}
	kwargs := map[string]any{"interval": 0.01, "max_retries": nil, "result": []any{
		protocol.ChildTuple("p0"), protocol.ChildTuple("p1"), protocol.ChildTuple("p2")}}
	h.send("celery.chord_unlock", []any{"g1", body.Value()}, kwargs)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	m, err := be.Wait(ctx, "body-1")
	if err != nil {
		t.Fatal(err)
	}
	if m.Status != protocol.StateSuccess || m.Result != int64(6) {
		t.Fatalf("chord body: %s %v, want SUCCESS 6", m.Status, m.Result)
	}
	be.mu.Lock()
	calls := be.calls
	be.mu.Unlock()
	if calls != 3 {
		t.Errorf("UnlockChord called %d times, want 3 (two retries)", calls)
	}
	// A second chord_unlock for the chord (another id): already claimed.
	id := h.send("celery.chord_unlock", []any{"g1", body.Value()}, kwargs)
	eventually(t, "the second chord_unlock to run", func() bool {
		be.mu.Lock()
		defer be.mu.Unlock()
		return be.calls == 4
	})
	h.stop()
	mu.Lock()
	defer mu.Unlock()
	if len(runs) != 1 || len(runs[0]) != 3 || runs[0][2] != 3 {
		t.Errorf("body runs %v, want one with [1 2 3] (second unlock %s)", runs, id)
	}
}
