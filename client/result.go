// Package client is the Go caller's side of Celery tasks: waiting for and
// reading their results as Python's AsyncResult and GroupResult do, from
// the result backend Python Celery and celeriac workers write to. It needs
// no worker: a Go service imports client, backend and protocol only.
//
//	r := client.NewAsyncResult(be, id)
//	v, err := r.Get(ctx) // waits; a failed task is a *client.TaskError
//
// Get waits without polling on backends that can wait (backend/redis wakes
// on the result's PUBLISH, as Celery's client does; backend/memory), and
// polls with a growing delay (2 ms up to 200 ms) on the others.
package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// Waiter is implemented by backends that can wait for a task to be ready
// without polling (backend/redis, backend/memory).
type Waiter interface {
	Wait(ctx context.Context, taskID string) (*protocol.ResultMeta, error)
}

// Wait blocks until the task is ready (SUCCESS, FAILURE or REVOKED) and
// returns its result document, like AsyncResult.get(propagate=False). It
// uses the backend's own Wait when it has one, and polls otherwise.
func Wait(ctx context.Context, be backend.Backend, taskID string) (*protocol.ResultMeta, error) {
	if w, ok := be.(Waiter); ok {
		return w.Wait(ctx, taskID)
	}
	delay := 2 * time.Millisecond
	for {
		m, err := be.Get(ctx, taskID)
		switch {
		case err == nil && m.Status.Ready():
			return m, nil
		case err != nil && !errors.Is(err, backend.ErrNotFound):
			return nil, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		delay = min(delay*2, 200*time.Millisecond)
	}
}

// AsyncResult is a task's result as Python's AsyncResult sees it.
type AsyncResult struct {
	// ID is the task id.
	ID string
	be backend.Backend
}

// NewAsyncResult returns the result of task id in be.
func NewAsyncResult(be backend.Backend, id string) *AsyncResult {
	return &AsyncResult{ID: id, be: be}
}

// Get waits until the task is ready and returns its return value. A task
// that failed or was revoked returns a *TaskError carrying the Python
// exception type, message and traceback.
func (r *AsyncResult) Get(ctx context.Context) (any, error) {
	m, err := Wait(ctx, r.be, r.ID)
	if err != nil {
		return nil, err
	}
	return outcome(m)
}

// Meta waits until the task is ready and returns its whole result
// document (state, result, traceback, children, date_done, ...).
func (r *AsyncResult) Meta(ctx context.Context) (*protocol.ResultMeta, error) {
	return Wait(ctx, r.be, r.ID)
}

// State returns the task's state now, without waiting: PENDING when the
// backend knows nothing of it, as in Celery.
func (r *AsyncResult) State(ctx context.Context) (protocol.State, error) {
	m, err := r.be.Get(ctx, r.ID)
	if errors.Is(err, backend.ErrNotFound) {
		return protocol.StatePending, nil
	}
	if err != nil {
		return "", err
	}
	return m.Status, nil
}

// Ready reports whether the task has finished (SUCCESS, FAILURE or
// REVOKED).
func (r *AsyncResult) Ready(ctx context.Context) (bool, error) {
	st, err := r.State(ctx)
	return err == nil && st.Ready(), err
}

func outcome(m *protocol.ResultMeta) (any, error) {
	if m.Status == protocol.StateSuccess {
		return m.Result, nil
	}
	te := &TaskError{TaskID: m.TaskID, State: m.Status, Traceback: m.Traceback}
	if ex, ok := m.Result.(*protocol.ExceptionInfo); ok {
		te.Type, te.Module, te.Args = ex.Type, ex.Module, ex.Message
	} else {
		te.Type, te.Args = "Exception", []any{m.Result}
	}
	return nil, te
}

// TaskError is a task's failure as Python raises it from .get(): the
// exception's type (ValueError, TaskRevokedError, ...), module, arguments and
// the remote traceback.
type TaskError struct {
	TaskID    string
	State     protocol.State // FAILURE or REVOKED
	Type      string
	Module    string
	Args      []any
	Traceback string
}

// Error is "Type: message", as Python prints an exception.
func (e *TaskError) Error() string {
	return e.Type + ": " + e.Message()
}

// Message is str(exception): its only argument, or the repr of them.
func (e *TaskError) Message() string {
	if len(e.Args) == 1 {
		if s, ok := e.Args[0].(string); ok {
			return s
		}
	}
	parts := make([]string, len(e.Args))
	for i, a := range e.Args {
		parts[i] = protocol.Repr(a)
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// GroupResult is the results of a group's tasks, in the group's order.
type GroupResult struct {
	ID      string
	Results []*AsyncResult
}

// NewGroupResult returns the result of a group whose tasks have ids.
func NewGroupResult(be backend.Backend, groupID string, ids ...string) *GroupResult {
	g := &GroupResult{ID: groupID}
	for _, id := range ids {
		g.Results = append(g.Results, NewAsyncResult(be, id))
	}
	return g
}

// Get waits for every task and returns their values in the group's order,
// as GroupResult.get() joins them; the first failure (in order) is
// returned as an error wrapping the task's *TaskError.
func (g *GroupResult) Get(ctx context.Context) ([]any, error) {
	out := make([]any, len(g.Results))
	for i, r := range g.Results {
		v, err := r.Get(ctx)
		if err != nil {
			return nil, fmt.Errorf("client: group %s, task %d (%s): %w", g.ID, i, r.ID, err)
		}
		out[i] = v
	}
	return out, nil
}
