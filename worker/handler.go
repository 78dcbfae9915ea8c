package worker

import (
	"context"
	"fmt"
	"sort"
	"sync"
)

// Handler runs one task. The returned result is stored in the result backend
// (Celery's return value); the returned error decides the outcome:
//
//   - nil: SUCCESS.
//   - an error built by the retry package (retry.After, retry.At, ...), or an
//     error the task's retry policy auto-retries: the task is retried.
//   - [Reject]: the message is rejected (requeued or dead-lettered).
//   - [ErrIgnore]: the message is acknowledged and no state is stored.
//   - anything else: FAILURE (dead-lettered when terminal, see
//     [Config.AcksOnFailure]).
//
// Handlers must honour ctx: it is cancelled at the soft time limit (with
// cause [ErrSoftTimeLimitExceeded]), on revoke with terminate, and at the end
// of a cold shutdown.
type Handler interface {
	HandleTask(ctx context.Context, t *Task) (result any, err error)
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, t *Task) (any, error)

// HandleTask calls f(ctx, t).
func (f HandlerFunc) HandleTask(ctx context.Context, t *Task) (any, error) { return f(ctx, t) }

// Middleware wraps a Handler, as net/http middleware does.
type Middleware func(Handler) Handler

// Mux maps exact Celery task names to handlers. Register everything before
// the worker starts; a Mux is safe for concurrent reads after that.
type Mux struct {
	mu      sync.RWMutex
	entries map[string]*entry
	mw      []Middleware
}

type entry struct {
	name    string
	handler Handler // with middleware applied, built lazily
	raw     Handler
	opts    TaskOptions
}

// NewMux returns an empty Mux.
func NewMux() *Mux { return &Mux{entries: make(map[string]*entry)} }

// Handle registers h for the task name. It panics on an empty name, a nil
// handler or a name registered twice: those are programming errors.
func (m *Mux) Handle(name string, h Handler, opts ...TaskOption) {
	if name == "" {
		panic("worker: Handle with empty task name")
	}
	if h == nil {
		panic(fmt.Sprintf("worker: Handle %q with nil handler", name))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.entries[name]; dup {
		panic(fmt.Sprintf("worker: task %q registered twice", name))
	}
	var o TaskOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.parse(); err != nil {
		panic(fmt.Sprintf("worker: task %q: %v", name, err))
	}
	m.entries[name] = &entry{name: name, raw: h, opts: o}
}

// HandleFunc registers f for the task name; see [Mux.Handle].
func (m *Mux) HandleFunc(name string, f func(ctx context.Context, t *Task) (any, error), opts ...TaskOption) {
	if f == nil {
		panic(fmt.Sprintf("worker: HandleFunc %q with nil func", name))
	}
	m.Handle(name, HandlerFunc(f), opts...)
}

// Use appends middleware, applied to every handler in the order given (the
// first is outermost). Call it before the worker starts.
func (m *Mux) Use(mw ...Middleware) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mw = append(m.mw, mw...)
	for _, e := range m.entries {
		e.handler = nil
	}
}

// Names returns the registered task names, sorted.
func (m *Mux) Names() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	names := make([]string, 0, len(m.entries))
	for n := range m.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Options returns a copy of the options registered for the task name,
// and false when no task has that name.
func (m *Mux) Options(name string) (TaskOptions, bool) { return m.options(name) }

// Configure applies opts over the options registered for the task name,
// as if they had been passed to [Mux.Handle] last: a command line adds
// rate limits to tasks registered in code. It fails for an unknown task or
// options that do not parse. Call it before the worker starts.
func (m *Mux) Configure(name string, opts ...TaskOption) error {
	found, err := m.setOptions(name, func(o *TaskOptions) {
		for _, opt := range opts {
			opt(o)
		}
	})
	if !found {
		return fmt.Errorf("no task %q", name)
	}
	return err
}

// lookup returns the handler for name with middleware applied and a copy
// of its options.
func (m *Mux) lookup(name string) (Handler, TaskOptions, bool) {
	m.mu.RLock()
	e := m.entries[name]
	if e == nil {
		m.mu.RUnlock()
		return nil, TaskOptions{}, false
	}
	if h := e.handler; h != nil {
		o := e.opts
		m.mu.RUnlock()
		return h, o, true
	}
	m.mu.RUnlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.handler == nil {
		h := e.raw
		for i := len(m.mw) - 1; i >= 0; i-- {
			h = m.mw[i](h)
		}
		e.handler = h
	}
	return e.handler, e.opts, true
}

// options returns a copy of the task options registered for name.
func (m *Mux) options(name string) (TaskOptions, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e := m.entries[name]
	if e == nil {
		return TaskOptions{}, false
	}
	return e.opts, true
}

// setOptions changes options at run time (remote control rate_limit and
// time_limit). It reports false for an unknown task.
func (m *Mux) setOptions(name string, f func(*TaskOptions)) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[name]
	if e == nil {
		return false, nil
	}
	o := e.opts
	f(&o)
	if err := o.parse(); err != nil {
		return true, err
	}
	e.opts = o
	return true, nil
}
