package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// AsyncResult is a task's result as Python's AsyncResult sees it.
type AsyncResult struct {
	// ID is the task id.
	ID string
	c  *Client
	// parents are the ancestors Apply linked, root first (Celery's
	// result.parent chain): each a result or a group's results.
	parents [][]string
}

// ParentPollInterval is how often Get looks at the parents of a canvas's
// result while it waits (Python's AsyncResult.get checks them on each
// interval of its wait, about once a second on Redis).
var ParentPollInterval = time.Second

// Get waits until the task is ready and returns its return value. A task
// that failed or was revoked returns a *TaskError carrying the Python
// exception type, message and traceback.
//
// For the result of a canvas sent with Apply, Get also follows its
// parents as Python's get(follow_parents=True) does: when an earlier
// chain step or a chord's header task has failed, Get returns that
// failure, the first in canvas order, even if the result itself never
// gets a state (a chord whose header holds a chord with a failed body,
// for one).
func (r *AsyncResult) Get(ctx context.Context) (any, error) {
	if len(r.parents) == 0 {
		m, err := Wait(ctx, r.c.be, r.ID)
		if err != nil {
			return nil, err
		}
		return outcome(m)
	}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(ParentPollInterval)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			if err := r.parentFailure(wctx); err != nil {
				cancel(err)
				return
			}
		}
	}()
	m, err := Wait(wctx, r.c.be, r.ID)
	cancel(nil)
	<-done
	if err != nil {
		var te *TaskError
		if cause := context.Cause(wctx); errors.As(cause, &te) && ctx.Err() == nil {
			return nil, te
		}
		return nil, err
	}
	return outcome(m)
}

// parentFailure is the first failed or revoked parent, root first, as
// Python's _maybe_reraise_parent_error raises it.
func (r *AsyncResult) parentFailure(ctx context.Context) error {
	for _, node := range r.parents {
		for _, id := range node {
			m, err := r.c.be.Get(ctx, id)
			if err != nil {
				continue // not stored yet (PENDING), or the backend is down: Wait reports that
			}
			if m.Status == protocol.StateFailure || m.Status == protocol.StateRevoked {
				_, err := outcome(m)
				return err
			}
		}
	}
	return nil
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
// as GroupResult.get() joins them. A failure is returned as an error
// wrapping the task's *TaskError: on the Redis and RPC backends the first
// to happen, whichever member it is (Celery's join_native returns as soon
// as one arrives, so a member that never finishes does not hide another's
// failure); on the database backends the first in the group's order, as
// Celery's join waits for each member in turn, following each member's
// parents as its get() does (for a group sent with ApplyGroup).
func (g *GroupResult) Get(ctx context.Context) ([]any, error) {
	out := make([]any, len(g.Results))
	if len(g.Results) == 0 {
		return out, nil
	}
	if _, ordered := g.Results[0].c.be.(backend.ChordUnlocker); ordered {
		// Celery's join: each member's get(), which follows the member's
		// parents (a failed earlier step of a member chain is raised
		// though the member's own result never gets a state).
		for i, r := range g.Results {
			v, err := r.Get(ctx)
			if err != nil {
				return nil, g.memberError(i, err)
			}
			out[i] = v
		}
		return out, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Cancel first, then wait: the members still waiting stop.
	defer wg.Wait()
	defer cancel()
	type got struct {
		i   int
		v   any
		err error
	}
	ch := make(chan got)
	sem := make(chan struct{}, groupWaiters)
	wg.Go(func() {
		for i, r := range g.Results {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Go(func() {
				defer func() { <-sem }()
				// join_native waits on the members alone, not their
				// parents.
				v, err := (&AsyncResult{ID: r.ID, c: r.c}).Get(ctx)
				select {
				case ch <- got{i, v, err}:
				case <-ctx.Done():
				}
			})
		}
	})
	for range g.Results {
		select {
		case r := <-ch:
			if r.err != nil {
				return nil, g.memberError(r.i, r.err)
			}
			out[r.i] = r.v
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return out, nil
}

// groupWaiters bounds the members a GroupResult waits on at once.
const groupWaiters = 64

func (g *GroupResult) memberError(i int, err error) error {
	return fmt.Errorf("client: group %s, task %d (%s): %w", g.ID, i, g.Results[i].ID, err)
}
