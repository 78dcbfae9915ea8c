package backendtest

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// ErrInjected is the error of an injected fault when no other error was
// given.
var ErrInjected = errors.New("backendtest: injected fault")

// Op names a backend operation Faulty can make fail.
type Op string

// Operations that can fail.
const (
	OpStore     Op = "store"
	OpGet       Op = "get"
	OpChordPart Op = "chord-part"
	OpChordSize Op = "chord-size"
)

// Call describes one operation, for a fault function to decide on.
type Call struct {
	Op Op
	// TaskID is the task the call is about (the group id for OpChordSize).
	TaskID string
	// Store is set for OpStore.
	Store *backend.StoreRequest
}

// Faulty wraps a backend and injects the faults a real one produces (a
// result store that is down, or answers too late), for tests of code that
// writes results: the worker's settle path. A failed call changes nothing
// in the wrapped backend. With no fault set it behaves as the wrapped
// backend and passes the conformance suite.
//
// Faulty implements backend.Chords when the wrapped backend does; Chords
// returns nil otherwise.
type Faulty struct {
	inner backend.Backend

	mu    sync.Mutex
	fail  map[Op]int
	err   map[Op]error
	fn    func(Call) error
	calls map[Op]int
}

// NewFaulty wraps inner. Closing the Faulty closes inner.
func NewFaulty(inner backend.Backend) *Faulty {
	return &Faulty{inner: inner, fail: map[Op]int{}, err: map[Op]error{}, calls: map[Op]int{}}
}

// FailNext makes the next n calls of op fail with err (ErrInjected when nil).
func (f *Faulty) FailNext(op Op, n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		err = ErrInjected
	}
	f.fail[op], f.err[op] = n, err
}

// SetFault makes every call ask fn first; a non-nil error fails the call.
// nil removes it.
func (f *Faulty) SetFault(fn func(Call) error) {
	f.mu.Lock()
	f.fn = fn
	f.mu.Unlock()
}

// Calls returns how many calls of op were made, failed ones included.
func (f *Faulty) Calls(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *Faulty) inject(ctx context.Context, c Call) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	f.calls[c.Op]++
	fn := f.fn
	if f.fail[c.Op] > 0 {
		f.fail[c.Op]--
		err := f.err[c.Op]
		f.mu.Unlock()
		return fmt.Errorf("backendtest: %s %s: %w", c.Op, c.TaskID, err)
	}
	f.mu.Unlock()
	if fn != nil {
		if err := fn(c); err != nil {
			return fmt.Errorf("backendtest: %s %s: %w", c.Op, c.TaskID, err)
		}
	}
	return nil
}

// Store implements backend.Backend.
func (f *Faulty) Store(ctx context.Context, r backend.StoreRequest) error {
	id := ""
	if r.Meta != nil {
		id = r.Meta.TaskID
	}
	if err := f.inject(ctx, Call{Op: OpStore, TaskID: id, Store: &r}); err != nil {
		return err
	}
	return f.inner.Store(ctx, r)
}

// Get implements backend.Backend.
func (f *Faulty) Get(ctx context.Context, taskID string) (*protocol.ResultMeta, error) {
	if err := f.inject(ctx, Call{Op: OpGet, TaskID: taskID}); err != nil {
		return nil, err
	}
	return f.inner.Get(ctx, taskID)
}

// Close implements backend.Backend.
func (f *Faulty) Close() error { return f.inner.Close() }

// Chords returns the Faulty as backend.Chords, or nil when the wrapped
// backend does not count chord parts.
func (f *Faulty) Chords() backend.Chords {
	if _, ok := f.inner.(backend.Chords); !ok {
		return nil
	}
	return faultyChords{f}
}

// faultyChords adds backend.Chords; a separate type, so that a Faulty over
// a backend without chords does not claim them.
type faultyChords struct{ *Faulty }

func (c faultyChords) ChordPartReturn(ctx context.Context, p backend.ChordPart) (backend.ChordResult, error) {
	if err := c.inject(ctx, Call{Op: OpChordPart, TaskID: p.TaskID}); err != nil {
		return backend.ChordResult{}, err
	}
	return c.inner.(backend.Chords).ChordPartReturn(ctx, p)
}

func (c faultyChords) SetChordSize(ctx context.Context, groupID string, size int) error {
	if err := c.inject(ctx, Call{Op: OpChordSize, TaskID: groupID}); err != nil {
		return err
	}
	return c.inner.(backend.Chords).SetChordSize(ctx, groupID, size)
}
