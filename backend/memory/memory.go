package memory

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// Backend is an in-memory result backend. The zero value is not usable; call
// [New]. It is safe for concurrent use.
type Backend struct {
	mu      sync.Mutex
	closed  bool
	results map[string]*protocol.ResultMeta
	chords  map[string]*chordState
	// changed is closed and replaced on every stored state, so that Wait can
	// block without polling.
	changed chan struct{}
}

var (
	_ backend.Backend   = (*Backend)(nil)
	_ backend.Chords    = (*Backend)(nil)
	_ backend.Forgetter = (*Backend)(nil)
)

// chordState mirrors Celery's celery-taskset-meta-<gid>.j sorted set and
// .s key.
type chordState struct {
	size    int
	hasSize bool
	// parts is keyed by the part's canonical encoding: like a ZADD of an
	// identical member, storing the same outcome twice counts once.
	parts map[string]chordMember
}

type chordMember struct {
	score float64
	key   string
	part  backend.ChordPart
}

// New returns an empty backend.
func New() *Backend {
	return &Backend{
		results: map[string]*protocol.ResultMeta{},
		chords:  map[string]*chordState{},
		changed: make(chan struct{}),
	}
}

// Store writes a state. A stored SUCCESS is never overwritten: Store returns
// nil without writing. The meta is copied; the caller may reuse it.
// It returns ErrClosed after Close and ctx.Err() when ctx is already done.
func (b *Backend) Store(ctx context.Context, r backend.StoreRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validate(r.Meta); err != nil {
		return err
	}
	m := copyMeta(r.Meta)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return backend.ErrClosed
	}
	if cur, ok := b.results[m.TaskID]; ok && cur.Status == protocol.StateSuccess {
		return nil
	}
	b.results[m.TaskID] = m
	close(b.changed)
	b.changed = make(chan struct{})
	return nil
}

// Forget deletes the task's result, as AsyncResult.forget() does.
func (b *Backend) Forget(ctx context.Context, taskID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return backend.ErrClosed
	}
	delete(b.results, taskID)
	return nil
}

// Get returns a copy of the stored state, or ErrNotFound.
func (b *Backend) Get(ctx context.Context, taskID string) (*protocol.ResultMeta, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, backend.ErrClosed
	}
	m, ok := b.results[taskID]
	if !ok {
		return nil, backend.ErrNotFound
	}
	return copyMeta(m), nil
}

// Wait blocks until the task has a ready state (SUCCESS, FAILURE or REVOKED)
// and returns it, like Python's AsyncResult.get() without raising. It returns
// ctx.Err() when ctx is done first and ErrClosed when the backend is closed.
func (b *Backend) Wait(ctx context.Context, taskID string) (*protocol.ResultMeta, error) {
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return nil, backend.ErrClosed
		}
		if m, ok := b.results[taskID]; ok && m.Status.Ready() {
			c := copyMeta(m)
			b.mu.Unlock()
			return c, nil
		}
		changed := b.changed
		b.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Close drops everything stored and wakes up Wait calls. Later calls,
// including Close, return ErrClosed.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return backend.ErrClosed
	}
	b.closed = true
	b.results, b.chords = nil, nil
	close(b.changed)
	return nil
}

// SetChordSize records how many header tasks the chord of groupID has. A part
// returned after that and bringing the count to size completes the chord.
func (b *Backend) SetChordSize(ctx context.Context, groupID string, size int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if groupID == "" {
		return errors.New("memory: SetChordSize: empty group id")
	}
	if size <= 0 {
		return fmt.Errorf("memory: SetChordSize: chord size %d is not positive", size)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return backend.ErrClosed
	}
	c := b.chord(groupID)
	c.size, c.hasSize = size, true
	return nil
}

// ChordPartReturn records one header task's outcome. Exactly one call per
// chord returns Ready: the one whose part brings the number of distinct parts
// to the chord size. Its Results are ordered by GroupIndex, parts without an
// index last. The chord is then forgotten, as Celery deletes its keys.
func (b *Backend) ChordPartReturn(ctx context.Context, p backend.ChordPart) (backend.ChordResult, error) {
	if err := ctx.Err(); err != nil {
		return backend.ChordResult{}, err
	}
	if p.GroupID == "" || p.TaskID == "" {
		return backend.ChordResult{}, errors.New("memory: ChordPartReturn: group id and task id are required")
	}
	key, err := memberKey(p)
	if err != nil {
		return backend.ChordResult{}, err
	}
	score := math.Inf(1)
	if p.GroupIndex != nil {
		score = float64(*p.GroupIndex)
	}
	p.Result = copyValue(p.Result)
	if p.GroupIndex != nil {
		i := *p.GroupIndex
		p.GroupIndex = &i
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return backend.ChordResult{}, backend.ErrClosed
	}
	c := b.chord(p.GroupID)
	c.parts[key] = chordMember{score: score, key: key, part: p}
	if !c.hasSize || len(c.parts) != c.size {
		return backend.ChordResult{}, nil
	}
	members := make([]chordMember, 0, len(c.parts))
	for _, m := range c.parts {
		members = append(members, m)
	}
	// Redis orders a sorted set by score, then by member bytes.
	slices.SortFunc(members, func(x, y chordMember) int {
		if c := cmp.Compare(x.score, y.score); c != 0 {
			return c
		}
		return cmp.Compare(x.key, y.key)
	})
	res := backend.ChordResult{Ready: true, Results: make([]backend.ChordPart, len(members))}
	for i, m := range members {
		res.Results[i] = m.part
	}
	delete(b.chords, p.GroupID)
	return res, nil
}

func (b *Backend) chord(groupID string) *chordState {
	c, ok := b.chords[groupID]
	if !ok {
		c = &chordState{parts: map[string]chordMember{}}
		b.chords[groupID] = c
	}
	return c
}

func validate(m *protocol.ResultMeta) error {
	switch {
	case m == nil:
		return errors.New("memory: Store: nil meta")
	case m.TaskID == "":
		return errors.New("memory: Store: empty task id")
	case m.Status == "":
		return errors.New("memory: Store: empty status")
	}
	return nil
}

// memberKey is the identity of a chord part, the counterpart of the JSON
// member [1, task_id, state, result] that Celery adds to the sorted set.
func memberKey(p backend.ChordPart) (string, error) {
	r := p.Result
	if e, ok := r.(*protocol.ExceptionInfo); ok && e != nil {
		r = map[string]any{"exc_type": e.Type, "exc_message": e.Message, "exc_module": e.Module}
	}
	b, err := json.Marshal([]any{1, p.TaskID, p.State, r})
	if err != nil {
		return "", fmt.Errorf("memory: ChordPartReturn: result of %s: %w", p.TaskID, err)
	}
	return string(b), nil
}

func copyMeta(m *protocol.ResultMeta) *protocol.ResultMeta {
	c := *m
	c.Result = copyValue(m.Result)
	c.Children = copySlice(m.Children)
	c.Args = copySlice(m.Args)
	c.Kwargs = copyMap(m.Kwargs)
	return &c
}

// copyValue deep-copies the containers of the protocol's value types, so
// that neither the caller nor a reader can change what is stored.
func copyValue(v any) any {
	switch v := v.(type) {
	case []any:
		return copySlice(v)
	case map[string]any:
		return copyMap(v)
	case []byte:
		if v == nil {
			return v
		}
		return slices.Clone(v)
	case *protocol.ExceptionInfo:
		if v == nil {
			return v
		}
		e := *v
		e.Message = copySlice(v.Message)
		return &e
	default:
		return v
	}
}

func copySlice(s []any) []any {
	if s == nil {
		return nil
	}
	c := make([]any, len(s))
	for i, v := range s {
		c[i] = copyValue(v)
	}
	return c
}

func copyMap(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	c := make(map[string]any, len(m))
	for k, v := range m {
		c[k] = copyValue(v)
	}
	return c
}
