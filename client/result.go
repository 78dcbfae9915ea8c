package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// AsyncResult is a task's result as Python's AsyncResult sees it.
type AsyncResult struct {
	// ID is the task id.
	ID string
	c  *Client
}

// Get waits until the task is ready and returns its return value. A task
// that failed or was revoked returns a *TaskError carrying the Python
// exception type, message and traceback.
func (r *AsyncResult) Get(ctx context.Context) (any, error) {
	m, err := Wait(ctx, r.c.be, r.ID)
	if err != nil {
		return nil, err
	}
	return outcome(m)
}

// Meta waits until the task is ready and returns its whole result
// document (state, result, traceback, children, date_done, ...).
func (r *AsyncResult) Meta(ctx context.Context) (*protocol.ResultMeta, error) {
	return Wait(ctx, r.c.be, r.ID)
}

// State returns the task's state now, without waiting: PENDING when the
// backend knows nothing of it, as in Celery.
func (r *AsyncResult) State(ctx context.Context) (protocol.State, error) {
	if r.c.be == nil {
		return "", ErrNoBackend
	}
	m, err := r.c.be.Get(ctx, r.ID)
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

// Forget removes the task's result from the backend, as
// AsyncResult.forget() does. It returns ErrNoForget when the backend cannot
// delete results (the RPC backend keeps none to delete).
func (r *AsyncResult) Forget(ctx context.Context) error {
	f, ok := r.c.be.(backend.Forgetter)
	if !ok {
		return ErrNoForget
	}
	return f.Forget(ctx, r.ID)
}

// ErrNoForget: the result backend cannot delete results.
var ErrNoForget = errors.New("client: the result backend cannot forget results")

// Revoke revokes the task on every worker (see Client.Revoke); with
// terminate, a running task is stopped.
func (r *AsyncResult) Revoke(ctx context.Context, terminate bool) error {
	return r.c.Revoke(ctx, terminate, r.ID)
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
func (e *TaskError) Message() string { return protocol.ExceptionMessage(e.Args) }

// GroupResult is the results of a group's tasks, in the group's order.
type GroupResult struct {
	ID      string
	Results []*AsyncResult
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
