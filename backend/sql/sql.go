package sql

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// Backend stores task states in PostgreSQL, in Celery's database backend
// tables or django-celery-results' (see the package doc). It is safe for
// concurrent use.
type Backend struct {
	pool   *pgxpool.Pool
	s      *settings
	schema Schema
	// columns of the task table, read at New (SQLAlchemy): extended
	// columns are written only when the table has them.
	hasExtended bool

	mu       sync.RWMutex
	closed   bool
	inflight sync.WaitGroup
	// closing is closed by Close: it ends every Wait.
	closing chan struct{}

	// lis is Wait's LISTEN connection, started by the first Wait.
	lisMu sync.Mutex
	lis   *listener
	// pollMin and pollMax are Wait's fallback poll delays (firstPoll and
	// maxPoll; tests change them).
	pollMin, pollMax time.Duration

	storeRetries  atomic.Int64
	storeFailures atomic.Int64

	// Group commit: stores waiting for a transaction, whether a leader is
	// committing them, and the goroutines started to lead.
	commitMu sync.Mutex
	pending  []*storeOp
	leading  bool
	leaders  sync.WaitGroup
}

// maxBatch bounds the stores written in one transaction.
const maxBatch = 64

// storeOp is one queued upsert.
type storeOp struct {
	q    string
	args []any
	done chan error // buffered: a leader never blocks on a caller that left
}

var (
	_ backend.Backend       = (*Backend)(nil)
	_ backend.Chords        = (*Backend)(nil)
	_ backend.ChordUnlocker = (*Backend)(nil)
	_ backend.Cleaner       = (*Backend)(nil)
)

// New connects to the database and, for SQLAlchemy, creates the tables and
// sequences that are missing, as Celery does on first use. For Django it
// checks that the migrated tables exist. ctx bounds the setup.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	s, err := cfg.settings()
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, s.pool)
	if err != nil {
		return nil, fmt.Errorf("sql backend: %w", err)
	}
	b := &Backend{pool: pool, s: s, schema: cfg.Schema, closing: make(chan struct{}), pollMin: firstPoll, pollMax: maxPoll}
	setup := b.prepareSQLAlchemy
	if cfg.Schema == Django {
		setup = b.checkDjango
	}
	if err := b.retry(ctx, "setup", setup); err != nil {
		pool.Close()
		return nil, err
	}
	return b, nil
}

// Ping checks that the database answers.
func (b *Backend) Ping(ctx context.Context) error {
	if err := b.enter(); err != nil {
		return err
	}
	defer b.inflight.Done()
	ctx, cancel := context.WithTimeout(ctx, b.s.stmtTimeout)
	defer cancel()
	if err := b.pool.Ping(ctx); err != nil {
		return fmt.Errorf("sql backend: ping: %w", err)
	}
	return nil
}

// Stats are counters of the backend's writes.
type Stats struct {
	// StoreRetries counts attempts repeated after a transient error (the
	// server restarting, a dropped connection).
	StoreRetries int64
	// StoreFailures counts Store and ChordPartReturn calls that failed
	// for another reason than the caller's context ending: the value was
	// refused (too long for its column, not encodable) or the database
	// answered with a lasting error. Each is also logged at error level.
	// A caller that runs out of time is told by the context's error; the
	// worker then logs and counts the lost result itself
	// (worker.LossObserver).
	StoreFailures int64
}

// Stats returns the counters.
func (b *Backend) Stats() Stats {
	return Stats{StoreRetries: b.storeRetries.Load(), StoreFailures: b.storeFailures.Load()}
}

func (b *Backend) enter() error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return backend.ErrClosed
	}
	b.inflight.Add(1)
	return nil
}

// Close ends every Wait with ErrClosed, waits for the other calls in
// progress, then closes Wait's LISTEN connection and the pool. Later
// calls, including Close, return ErrClosed.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return backend.ErrClosed
	}
	b.closed = true
	close(b.closing)
	b.mu.Unlock()
	b.inflight.Wait()
	b.leaders.Wait()
	b.lisMu.Lock()
	if b.lis != nil {
		b.lis.stop()
	}
	b.lisMu.Unlock()
	b.pool.Close()
	return nil
}

// Store writes a state with one upsert that leaves a stored SUCCESS alone.
// A transient failure (the server restarting, a dropped connection) is
// retried with backoff until ctx ends: the caller's budget bounds the
// retries. A write that fails for good is logged and counted (Stats).
func (b *Backend) Store(ctx context.Context, r backend.StoreRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m := r.Meta
	switch {
	case m == nil:
		return errors.New("sql backend: Store: nil meta")
	case m.TaskID == "":
		return errors.New("sql backend: Store: empty task id")
	case m.Status == "":
		return fmt.Errorf("sql backend: Store %s: empty status", m.TaskID)
	}
	if err := b.enter(); err != nil {
		return err
	}
	defer b.inflight.Done()
	var (
		q    string
		args []any
		err  error
	)
	if b.schema == Django {
		q, args, err = b.djangoStore(m)
	} else {
		q, args, err = b.sqlaStore(m)
	}
	if err != nil {
		b.fail("store", m.TaskID, err)
		return fmt.Errorf("sql backend: store %s: %w", m.TaskID, err)
	}
	if b.s.notify {
		q, args = notifying(q, args, b.s.channel)
	}
	// A queued store waits for its transaction as long as the caller
	// lets it: the statement timeout bounds each transaction (in commit),
	// not the time in the queue, so a slow database is not flooded with
	// copies of stores that are still waiting their turn.
	err = b.retryWith(ctx, "store", context.WithCancel, func(ctx context.Context) error {
		op := &storeOp{q: q, args: args, done: make(chan error, 1)}
		b.submit(ctx, op)
		select {
		case err := <-op.done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err != nil {
		if ctx.Err() == nil || !errors.Is(err, ctx.Err()) {
			b.fail("store", m.TaskID, err)
		}
		return fmt.Errorf("sql backend: store %s: %w", m.TaskID, refused(err))
	}
	return nil
}

// refused marks errors about the value itself (a data exception such as a
// task id longer than its column, an integrity violation) with
// protocol.ErrUnencodable: writing the same value again cannot succeed, and
// the worker does not retry it.
func refused(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && len(pe.Code) >= 2 && (pe.Code[:2] == "22" || pe.Code[:2] == "23") {
		return fmt.Errorf("%w: %w", protocol.ErrUnencodable, err)
	}
	return err
}

// fail logs and counts a write that will not happen.
func (b *Backend) fail(op, id string, err error) {
	b.storeFailures.Add(1)
	b.s.log.Error("sql backend: result not written", zap.String("op", op), zap.String("task_id", id), zap.Error(err))
}

// Get reads a task's state, or returns ErrNotFound. With the SQLAlchemy
// schema the result is a pickle, read with [DecodePickle]: Result is the
// value (an *protocol.ExceptionInfo for FAILURE, RETRY and REVOKED), nil
// for None, or a [PickledResult] when the restricted decoder refuses the
// pickle (see the package doc).
func (b *Backend) Get(ctx context.Context, taskID string) (*protocol.ResultMeta, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := b.enter(); err != nil {
		return nil, err
	}
	defer b.inflight.Done()
	var m *protocol.ResultMeta
	err := b.retry(ctx, "get", func(ctx context.Context) error {
		var err error
		if b.schema == Django {
			m, err = b.djangoGet(ctx, taskID)
		} else {
			m, err = b.sqlaGet(ctx, taskID)
		}
		return err
	})
	if errors.Is(err, backend.ErrNotFound) {
		return nil, backend.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("sql backend: get %s: %w", taskID, err)
	}
	return m, nil
}

// Forget deletes the task's row, as AsyncResult.forget() does on Celery's
// database backends.
func (b *Backend) Forget(ctx context.Context, taskID string) error {
	if err := b.enter(); err != nil {
		return err
	}
	defer b.inflight.Done()
	err := b.retry(ctx, "forget", func(ctx context.Context) error {
		_, err := b.pool.Exec(ctx, "DELETE FROM "+b.s.taskTable+" WHERE task_id = $1", taskID)
		return err
	})
	if err != nil {
		return fmt.Errorf("sql backend: forget %s: %w", taskID, err)
	}
	return nil
}

// retry runs f, each attempt under the statement timeout, until it
// succeeds, fails for good, or ctx ends.
func (b *Backend) retry(ctx context.Context, op string, f func(context.Context) error) error {
	return b.retryWith(ctx, op, func(ctx context.Context) (context.Context, context.CancelFunc) {
		return context.WithTimeout(ctx, b.s.stmtTimeout)
	}, f)
}

// retryWith is retry with each attempt's context made by attemptCtx.
func (b *Backend) retryWith(ctx context.Context, op string, attemptCtx func(context.Context) (context.Context, context.CancelFunc), f func(context.Context) error) error {
	delay := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		actx, cancel := attemptCtx(ctx)
		err := f(actx)
		cancel()
		if err == nil || !transient(err) {
			return err
		}
		if ctx.Err() != nil {
			return errors.Join(ctx.Err(), err)
		}
		b.storeRetries.Add(1)
		b.s.log.Warn("sql backend: retrying after a transient error", zap.String("op", op), zap.Int("attempt", attempt+1), zap.Error(err))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(ctx.Err(), err)
		case <-t.C:
		}
		delay = min(delay*2, time.Second)
	}
}

// transient reports whether err may go away by itself: the connection
// broke or the server is restarting or shutting down, a statement ran
// into its timeout, or a transaction lost a serialization race.
func transient(err error) bool {
	if errors.Is(err, backend.ErrNotFound) || errors.Is(err, context.Canceled) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case len(pe.Code) >= 2 && pe.Code[:2] == "08": // connection exception
			return true
		case pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03": // shutdown, crash, starting up
			return true
		case pe.Code == "40001", pe.Code == "40P01": // serialization failure, deadlock
			return true
		case pe.Code == "57014": // statement_timeout
			return true
		}
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	// pgx reports a connection closed under a query this way.
	return errors.Is(err, net.ErrClosed) || isConnClosed(err)
}

func isConnClosed(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == "conn closed" || e.Error() == "unexpected EOF" {
			return true
		}
	}
	return false
}

// submit is the group commit. A store that finds no transaction in
// progress is written at once by its own goroutine, under its caller's
// context; stores that arrive meanwhile queue up, and when it returns a
// goroutine writes all of them (up to maxBatch per transaction: one round
// trip and one commit, so one WAL flush), then the next queue, until none
// is left.
func (b *Backend) submit(ctx context.Context, op *storeOp) {
	b.commitMu.Lock()
	b.pending = append(b.pending, op)
	if b.leading {
		b.commitMu.Unlock()
		return
	}
	b.leading = true
	batch := b.takeLocked()
	b.commitMu.Unlock()

	b.commit(ctx, batch)

	b.commitMu.Lock()
	defer b.commitMu.Unlock()
	if len(b.pending) == 0 {
		b.leading = false
		return
	}
	b.leaders.Go(b.lead)
}

// lead writes queued stores until there are none left. A queued store is
// written even if its caller gave up; each transaction has the statement
// timeout.
func (b *Backend) lead() {
	for {
		b.commitMu.Lock()
		if len(b.pending) == 0 {
			b.leading = false
			b.commitMu.Unlock()
			return
		}
		batch := b.takeLocked()
		b.commitMu.Unlock()
		b.commit(context.Background(), batch)
	}
}

func (b *Backend) takeLocked() []*storeOp {
	n := min(len(b.pending), maxBatch)
	batch := make([]*storeOp, n)
	copy(batch, b.pending)
	rest := copy(b.pending, b.pending[n:])
	clear(b.pending[rest:])
	b.pending = b.pending[:rest]
	return batch
}

// commit writes a batch in one transaction. When the transaction fails
// for another reason than the connection (one store's value refused, which
// aborts the others), each store is written on its own, so that one bad
// value costs no other result.
func (b *Backend) commit(parent context.Context, batch []*storeOp) {
	exec := func(op *storeOp) {
		ctx, cancel := context.WithTimeout(parent, b.s.stmtTimeout)
		defer cancel()
		_, err := b.pool.Exec(ctx, op.q, op.args...)
		op.done <- err
	}
	if len(batch) == 1 {
		exec(batch[0])
		return
	}
	ctx, cancel := context.WithTimeout(parent, b.s.stmtTimeout)
	defer cancel()
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var pb pgx.Batch
		for _, op := range batch {
			pb.Queue(op.q, op.args...)
		}
		return tx.SendBatch(ctx, &pb).Close()
	})
	if err == nil || transient(err) {
		for _, op := range batch {
			op.done <- err
		}
		return
	}
	for _, op := range batch {
		exec(op)
	}
}
