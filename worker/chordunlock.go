package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/retry"
)

// chordUnlockTask is Celery's built-in task that completes a chord on a
// result backend that does not count chord parts: the Python client sends
// it to the body's queue, and it polls the header until every result is
// ready, retrying itself every interval, then sends the body.
const chordUnlockTask = "celery.chord_unlock"

var errChordNotReady = errors.New("worker: chord header not ready yet")

// backendCleanupTask is Celery's built-in task that deletes expired
// results from backends that do not expire them (celery beat sends it
// daily when result_expires is set).
const backendCleanupTask = "celery.backend_cleanup"

// builtin returns the worker's own handler for a task the mux does not
// handle: celery.chord_unlock, when the result backend can unlock chords
// (backend.ChordUnlocker), and celery.backend_cleanup, when it can clean up
// (backend.Cleaner). Like Celery's chord_unlock, it stores no result and
// retries without limit unless the message says otherwise.
func (w *Worker) builtin(name string) (Handler, TaskOptions, bool) {
	if c, ok := w.cfg.Backend.(backend.Cleaner); ok && name == backendCleanupTask {
		return HandlerFunc(func(ctx context.Context, t *Task) (any, error) { return nil, c.Cleanup(ctx) }), TaskOptions{}, true
	}
	u, ok := w.cfg.Backend.(backend.ChordUnlocker)
	if name != chordUnlockTask || !ok {
		return nil, TaskOptions{}, false
	}
	ignore := true
	policy := retry.Policy{MaxRetries: retry.Unlimited(), DefaultRetryDelay: time.Second}
	h := HandlerFunc(func(ctx context.Context, t *Task) (any, error) { return w.chordUnlock(ctx, u, t) })
	return h, TaskOptions{IgnoreResult: &ignore, Retry: &policy}, true
}

// chordUnlock is celery.chord_unlock(group_id, callback, interval=None,
// max_retries=None, result=[header result tuples]).
func (w *Worker) chordUnlock(ctx context.Context, u backend.ChordUnlocker, t *Task) (any, error) {
	if len(t.Args) < 2 {
		return nil, retry.Skip(fmt.Errorf("worker: %s wants (group_id, callback), got %d arguments", chordUnlockTask, len(t.Args)))
	}
	gid, _ := t.Args[0].(string)
	body, err := protocol.DecodeSignature(t.Args[1])
	if gid == "" || err != nil {
		return nil, retry.Skip(fmt.Errorf("worker: %s: bad group id or callback: %v", chordUnlockTask, err))
	}
	tuples, _ := t.Kwargs["result"].([]any)
	ids := make([]string, 0, len(tuples))
	for _, tup := range tuples {
		id := tupleTaskID(tup)
		if id == "" {
			return nil, retry.Skip(fmt.Errorf("worker: %s: unreadable header result %v", chordUnlockTask, tup))
		}
		ids = append(ids, id)
	}
	interval := time.Second
	if f, ok := number(t.Kwargs["interval"]); ok && f >= 0 {
		interval = time.Duration(f * float64(time.Second))
	}
	if f, ok := number(t.Kwargs["max_retries"]); ok && float64(t.Retries) >= f {
		return nil, retry.Skip(fmt.Errorf("worker: %s: chord %s not ready after %d retries", chordUnlockTask, gid, t.Retries))
	}
	res, err := u.UnlockChord(ctx, gid, ids, t.ID)
	switch {
	case errors.Is(err, backend.ErrChordDone):
		w.log.Info("chord already unlocked", zap.String("group_id", gid), zap.String("task_id", t.ID))
		return nil, nil
	case err != nil:
		return nil, retry.After(interval, err)
	case !res.Ready:
		return nil, retry.After(interval, errChordNotReady)
	}
	bodyID, _ := body.Options["task_id"].(string)
	values := make([]any, 0, len(res.Results))
	for _, part := range res.Results {
		if part.State == protocol.StateFailure || part.State == protocol.StateRevoked {
			w.unlockFailed(t, body, bodyID, gid, part)
			return nil, nil
		}
		values = append(values, part.Result)
	}
	root := t.RootID
	if root == "" {
		root = t.ID
	}
	if _, err := w.applySignature(body, []any{values}, callOptions{parentID: t.ID, rootID: root, queue: t.DeliveryInfo.Queue}); err != nil {
		// The chord stays claimed by this task id: its retry sends the body.
		return nil, retry.After(interval, fmt.Errorf("worker: sending the chord body: %w", err))
	}
	return nil, nil
}

// unlockFailed fails the body as Celery's chord_unlock does:
// ChordError("Dependency <id> raised <repr>") stored for the body, then its
// errbacks.
func (w *Worker) unlockFailed(t *Task, body protocol.Signature, bodyID, gid string, culprit backend.ChordPart) {
	repr := fmt.Sprint(culprit.Result)
	if ex, ok := culprit.Result.(*protocol.ExceptionInfo); ok {
		repr = excRepr(ex)
	}
	ex := &protocol.ExceptionInfo{Type: "ChordError", Module: moduleCelery,
		Message: []any{fmt.Sprintf("Dependency %s raised %s", culprit.TaskID, repr)}}
	w.log.Error("chord failed", zap.String("group_id", gid), zap.String("body_id", bodyID), zap.String("culprit", culprit.TaskID))
	if bodyID != "" {
		w.storeMeta(nil, &protocol.ResultMeta{TaskID: bodyID, Status: protocol.StateFailure, Result: ex,
			Children: []any{}, DateDone: time.Now().UTC()}, "")
	}
	errbacks, err := publish.SignatureList(body.Options["link_error"])
	if err != nil {
		w.log.Error("chord body link_error unreadable", zap.Error(err))
		return
	}
	w.callErrbacks(&protocol.TaskMessage{ID: bodyID, RootID: t.RootID}, t.DeliveryInfo.Queue, errbacks, nil)
}

// tupleTaskID reads the id of a result tuple [[id, parent], children].
func tupleTaskID(v any) string {
	l, ok := v.([]any)
	if !ok || len(l) == 0 {
		return ""
	}
	if inner, ok := l[0].([]any); ok && len(inner) > 0 {
		id, _ := inner[0].(string)
		return id
	}
	id, _ := l[0].(string)
	return id
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}
