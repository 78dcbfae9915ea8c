package sql

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// Wait's fallback poll: the first read again after firstPoll, each next one
// after twice as long, up to maxPoll (the interval of Celery's own
// AsyncResult.get on this backend).
const (
	firstPoll = 5 * time.Millisecond
	maxPoll   = 500 * time.Millisecond
)

// Reconnection delays of the LISTEN connection.
const (
	listenRetryMin = 100 * time.Millisecond
	listenRetryMax = 10 * time.Second
)

// notifying turns a store's upsert into one statement that also notifies
// channel with the task id, when the upsert wrote a row: the notification
// is sent at commit, with the row, and not at all when the upsert left a
// stored SUCCESS alone. The channel is a bind parameter, never quoted
// into the text (quoting by hand depends on standard_conforming_strings).
func notifying(upsert string, args []any, channel string) (string, []any) {
	args = append(args, channel)
	return fmt.Sprintf("WITH w AS (%s RETURNING t.task_id) SELECT pg_notify($%d, task_id) FROM w", upsert, len(args)), args
}

// Wait blocks until the task reaches a ready state (SUCCESS, FAILURE or
// REVOKED) and returns it, like AsyncResult.get() without raising.
//
// Celery's database backend has nothing to wait on, so its client polls
// (every 500 ms). celeriac's Store notifies instead: in the transaction
// that writes a state, pg_notify(Config.NotifyChannel, task id). Wait
// listens on that channel on a connection of its own (one per Backend,
// opened by the first Wait and shared by all) and reads the row again as
// soon as its task is notified, so a result a celeriac worker stores
// wakes it at once. Rows written by Python Celery workers are not
// notified: for them Wait also polls, 5 ms after it started, then after
// twice as long each time up to every 500 ms. While the LISTEN
// connection is down (it is reopened with backoff) Wait only polls; after
// it is back, every Wait reads its row once more, in case a notification
// was missed meanwhile.
//
// Wait returns ctx's error when ctx ends first, and ErrClosed when the
// backend is closed (Close ends every Wait).
func (b *Backend) Wait(ctx context.Context, taskID string) (*protocol.ResultMeta, error) {
	if err := b.enter(); err != nil {
		return nil, err
	}
	// Wait is not a call in progress for Close: Close ends it.
	b.inflight.Done()
	l, err := b.listener()
	if err != nil {
		return nil, err
	}
	wake, unregister := l.register(taskID)
	defer unregister()
	// The first Wait reads only once LISTEN is in place (or failed), so
	// that no notification of a store after the read can be missed.
	select {
	case <-l.tried:
	case <-b.closing:
		return nil, backend.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	delay := b.pollMin
	for {
		m, err := b.Get(ctx, taskID)
		switch {
		case err == nil && m.Status.Ready():
			return m, nil
		case err != nil && !errors.Is(err, backend.ErrNotFound):
			return nil, err
		}
		t := time.NewTimer(delay)
		select {
		case <-wake:
			t.Stop()
		case <-t.C:
			delay = min(delay*2, b.pollMax)
		case <-b.closing:
			t.Stop()
			return nil, backend.ErrClosed
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// listener returns the LISTEN side of Wait, starting it on first use.
func (b *Backend) listener() (*listener, error) {
	b.lisMu.Lock()
	defer b.lisMu.Unlock()
	if b.lis != nil {
		return b.lis, nil
	}
	// Close stops a listener under lisMu after it set closed: a listener
	// started after that would outlive the backend.
	b.mu.RLock()
	closed := b.closed
	b.mu.RUnlock()
	if closed {
		return nil, backend.ErrClosed
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.lis = &listener{
		b: b, cancel: cancel, waiters: map[string]map[chan struct{}]struct{}{},
		tried: make(chan struct{}), done: make(chan struct{}),
	}
	go b.lis.run(ctx)
	return b.lis, nil
}

// listener is one connection that LISTENs on the notify channel and wakes
// the Waits of the tasks it is told about.
type listener struct {
	b      *Backend
	cancel context.CancelFunc
	// tried is closed after the first attempt to LISTEN, done when run
	// has returned.
	tried chan struct{}
	done  chan struct{}

	// pid is the server process of the current LISTEN connection (0 when
	// there is none), for tests.
	pid atomic.Uint32

	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
}

// register returns a channel that receives a value when the task is
// notified (or might have been), and the function that ends the
// registration.
func (l *listener) register(taskID string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	set := l.waiters[taskID]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		l.waiters[taskID] = set
	}
	set[ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(set, ch)
		if len(set) == 0 {
			delete(l.waiters, taskID)
		}
	}
}

// wake signals the waiters of one task, or of every task when all is set.
func (l *listener) wake(taskID string, all bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	signal := func(set map[chan struct{}]struct{}) {
		for ch := range set {
			select {
			case ch <- struct{}{}:
			default: // a wake-up is already pending
			}
		}
	}
	if all {
		for _, set := range l.waiters {
			signal(set)
		}
		return
	}
	signal(l.waiters[taskID])
}

// run keeps a connection LISTENing and dispatches its notifications until
// ctx ends.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	log := l.b.s.log
	retry := listenRetryMin
	first := true
	for {
		conn, err := l.connect(ctx)
		if first {
			close(l.tried)
			first = false
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("sql backend: cannot LISTEN for results; Wait polls meanwhile",
				zap.String("channel", l.b.s.channel), zap.Duration("retry_in", retry), zap.Error(err))
			t := time.NewTimer(retry)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			retry = min(retry*2, listenRetryMax)
			continue
		}
		retry = listenRetryMin
		l.pid.Store(conn.PgConn().PID())
		// Notifications sent while no connection listened are lost.
		l.wake("", true)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				break
			}
			l.wake(n.Payload, false)
		}
		l.pid.Store(0)
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		log.Warn("sql backend: LISTEN connection lost; reconnecting", zap.String("channel", l.b.s.channel))
	}
}

// connect opens the LISTEN connection.
func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg := l.b.s.pool.ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] += " listen"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(l.b.s.channel)); err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
		return nil, err
	}
	return conn, nil
}

// stop ends run and waits for it.
func (l *listener) stop() {
	l.cancel()
	<-l.done
}
