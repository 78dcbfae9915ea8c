package backend

import (
	"context"
	"errors"

	"github.com/celeriac/celeriac/protocol"
)

// ErrNotFound: no state is stored for the task id (Celery's PENDING).
var ErrNotFound = errors.New("backend: result not found")

// ErrClosed: the backend was closed.
var ErrClosed = errors.New("backend: closed")

// StoreRequest is one state update.
type StoreRequest struct {
	Meta *protocol.ResultMeta
	// ReplyTo and CorrelationID come from the task message; the RPC backend
	// replies to that queue with that correlation id.
	ReplyTo       string
	CorrelationID string
}

// Backend stores task states. Implementations are safe for concurrent use.
type Backend interface {
	// Store writes a state. A stored SUCCESS is never overwritten: Store
	// returns nil without writing when the task already succeeded.
	Store(ctx context.Context, r StoreRequest) error
	// Get reads the stored state, or returns ErrNotFound.
	Get(ctx context.Context, taskID string) (*protocol.ResultMeta, error)
	// Close releases connections; later calls return ErrClosed.
	Close() error
}

// ChordPart is the outcome of one header task of a chord.
type ChordPart struct {
	GroupID string
	// GroupIndex orders the results; nil for unordered (appended) parts.
	GroupIndex *int
	TaskID     string
	State      protocol.State
	// Result is the return value, or the exception for FAILURE/REVOKED.
	Result any
}

// ChordResult is what the call that completes a chord receives.
type ChordResult struct {
	// Ready is true for exactly one header task: the one that completed the
	// chord. The others get Ready false.
	Ready bool
	// Results are the header results in group_index order (when Ready).
	Results []ChordPart
}

// Chords is implemented by backends that count chord parts natively, as
// Celery's Redis backend does (celery-taskset-meta-<gid>.j/.t/.s).
type Chords interface {
	// ChordPartReturn records one header task's outcome and reports whether
	// that completed the chord.
	ChordPartReturn(ctx context.Context, p ChordPart) (ChordResult, error)
	// SetChordSize records how many header tasks a chord has (the client
	// does this before publishing the last header task).
	SetChordSize(ctx context.Context, groupID string, size int) error
}

// ChordsOf returns be's chord counter when chords on be are completed by
// counting their parts, as its Python clients and workers count them
// (Redis; django-celery-results' ChordCounter), and false when they are
// completed by celery.chord_unlock (Celery's SQLAlchemy database backend) or
// not at all. A backend that implements Chords for some configurations only
// says which with a CountsChords() bool method.
func ChordsOf(be Backend) (Chords, bool) {
	c, ok := be.(Chords)
	if !ok {
		return nil, false
	}
	if cc, ok := be.(interface{ CountsChords() bool }); ok && !cc.CountsChords() {
		return nil, false
	}
	return c, true
}

// ErrChordDone: the chord was completed before, by another call.
var ErrChordDone = errors.New("backend: chord already completed")

// ChordUnlocker is implemented by backends whose Python clients do not count
// chord parts but send the celery.chord_unlock task, which polls the
// header's results until all are ready and then fires the body (Celery's
// database backend). The worker runs celery.chord_unlock with it.
type ChordUnlocker interface {
	// UnlockChord returns the header's results in taskIDs' order, with
	// Ready true, once every one of them is ready and readable; Ready false
	// while some are not. The first call that finds the chord complete
	// claims it for claimant (the chord_unlock task's id): later calls
	// return ErrChordDone, except for the same claimant, which gets the
	// results again (a retry after the body could not be sent).
	UnlockChord(ctx context.Context, groupID string, taskIDs []string, claimant string) (ChordResult, error)
}

// Cleaner is implemented by backends whose results do not expire by
// themselves (Celery's database backends): Cleanup deletes those older than
// the result expiry. The worker runs Celery's celery.backend_cleanup task
// (which celery beat sends daily) with it.
type Cleaner interface {
	Cleanup(ctx context.Context) error
}

// Forgetter is implemented by backends that can delete a task's result, as
// AsyncResult.forget() does.
type Forgetter interface {
	Forget(ctx context.Context, taskID string) error
}
