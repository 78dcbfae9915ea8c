package client_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	mtransport "github.com/celeriac/celeriac/transport/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func store(t testing.TB, be backend.Backend, id string, st protocol.State, result any, tb string) {
	t.Helper()
	if err := be.Store(context.Background(), backend.StoreRequest{Meta: &protocol.ResultMeta{
		TaskID: id, Status: st, Result: result, Traceback: tb, Children: []any{}, DateDone: time.Now().UTC()}}); err != nil {
		t.Fatal(err)
	}
}

// polling hides a backend's Wait, so that client.Wait polls it.
type polling struct{ backend.Backend }

func TestGetAndState(t *testing.T) {
	for name, wrap := range map[string]func(*memory.Backend) backend.Backend{
		"waits": func(b *memory.Backend) backend.Backend { return b },
		"polls": func(b *memory.Backend) backend.Backend { return polling{b} },
	} {
		t.Run(name, func(t *testing.T) {
			mb := memory.New()
			defer mb.Close()
			be := wrap(mb)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := client.New(nil, client.Config{Backend: be})
			r := c.AsyncResult("t1")
			if st, err := r.State(ctx); err != nil || st != protocol.StatePending {
				t.Fatalf("State of an unknown task = %s, %v; want PENDING", st, err)
			}
			go func() {
				time.Sleep(20 * time.Millisecond)
				for _, st := range []protocol.State{protocol.StateStarted, protocol.StateSuccess} {
					_ = mb.Store(context.Background(), backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "t1", Status: st, Result: int64(5)}})
				}
			}()
			if v, err := r.Get(ctx); err != nil || v != int64(5) {
				t.Fatalf("Get = %v, %v; want 5", v, err)
			}
			if ok, err := r.Ready(ctx); !ok || err != nil {
				t.Fatalf("Ready = %v, %v", ok, err)
			}

			store(t, mb, "t2", protocol.StateFailure, &protocol.ExceptionInfo{Type: "ValueError", Module: "builtins", Message: []any{"bad thing"}},
				"Traceback (most recent call last):\nValueError: bad thing\n")
			_, err := c.AsyncResult("t2").Get(ctx)
			var te *client.TaskError
			if !errors.As(err, &te) || te.Type != "ValueError" || te.Message() != "bad thing" || te.State != protocol.StateFailure ||
				te.Traceback == "" || err.Error() != "ValueError: bad thing" {
				t.Fatalf("Get of a failure = %v (%#v)", err, te)
			}

			short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
			defer stop()
			if _, err := c.AsyncResult("never").Get(short); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Get of a task that never ends = %v", err)
			}
		})
	}
}

func TestGroupResultJoinsInOrder(t *testing.T) {
	mb := memory.New()
	defer mb.Close()
	ctx := context.Background()
	c := client.New(nil, client.Config{Backend: mb})
	ids := []string{"g0", "g1", "g2"}
	for i := len(ids) - 1; i >= 0; i-- { // finished in reverse order
		store(t, mb, ids[i], protocol.StateSuccess, int64(i*10), "")
	}
	got, err := c.GroupResult("g", ids...).Get(ctx)
	if err != nil || fmt.Sprint(got) != "[0 10 20]" {
		t.Fatalf("Get = %v, %v", got, err)
	}
	store(t, mb, "g3", protocol.StateRevoked, &protocol.ExceptionInfo{Type: "TaskRevokedError", Module: "celery.exceptions", Message: []any{"revoked"}}, "")
	_, err = c.GroupResult("g", "g0", "g3").Get(ctx)
	var te *client.TaskError
	if !errors.As(err, &te) || te.TaskID != "g3" || te.State != protocol.StateRevoked || te.Type != "TaskRevokedError" {
		t.Fatalf("Get of a group with a revoked task = %v", err)
	}
}

// unlocking is a backend that completes chords with chord_unlock (Celery's
// database backends), over memory: GroupResult joins it in order.
type unlocking struct{ *memory.Backend }

func (unlocking) UnlockChord(context.Context, string, []string, string) (backend.ChordResult, error) {
	return backend.ChordResult{}, nil
}

// TestGroupResultOrderedFollowsMemberParents: on the database backends a
// member chain whose first step failed (its last step never gets a state)
// fails the group, as Celery's join calls each member's get(), which
// follows the member's parents.
func TestGroupResultOrderedFollowsMemberParents(t *testing.T) {
	mb := memory.New()
	defer mb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := client.New(mtransport.New(mtransport.Config{}), client.Config{Backend: unlocking{mb}})
	step := func(id string) client.Signature {
		return client.NewSignature("tasks.add", []any{1}, nil, client.TaskID(id))
	}
	g, err := c.ApplyGroup(ctx, client.Group(step("m0"), client.Chain(step("first"), step("last"))))
	if err != nil {
		t.Fatal(err)
	}
	store(t, mb, "m0", protocol.StateSuccess, int64(1), "")
	store(t, mb, "first", protocol.StateFailure, &protocol.ExceptionInfo{Type: "ValueError", Module: "builtins", Message: []any{"x"}}, "")
	_, err = g.Get(ctx)
	var te *client.TaskError
	if !errors.As(err, &te) || te.TaskID != "first" || te.Type != "ValueError" {
		t.Fatalf("Get = %v; want the member chain's first step's ValueError", err)
	}
}

// TestGroupResultFirstFailureWins: on a backend that joins natively
// (Redis, RPC, memory) a member's failure is returned as soon as it is
// stored, though an earlier member never finishes, as Celery's
// join_native raises the first failure that arrives.
func TestGroupResultFirstFailureWins(t *testing.T) {
	mb := memory.New()
	defer mb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := client.New(nil, client.Config{Backend: mb})
	store(t, mb, "late-fail", protocol.StateFailure, &protocol.ExceptionInfo{Type: "ValueError", Module: "builtins", Message: []any{"x"}}, "")
	_, err := c.GroupResult("g", "never", "late-fail").Get(ctx)
	var te *client.TaskError
	if !errors.As(err, &te) || te.TaskID != "late-fail" {
		t.Fatalf("Get = %v; want late-fail's ValueError before the context ends", err)
	}
}
