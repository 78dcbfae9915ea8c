package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

var (
	//go:embed scripts/store.lua
	storeLua string
	//go:embed scripts/chord.lua
	chordLua string
)

// Backend is Celery's Redis result backend. It is safe for concurrent use.
type Backend struct {
	client *goredis.Client
	s      settings
	// unreplicated counts result writes WAIT did not see replicated.
	unreplicated        atomic.Int64
	lastUnreplicatedLog atomic.Int64 // unix ns

	storeScript *goredis.Script
	chordScript *goredis.Script
	idem        idemScripts
	rateScript  *goredis.Script

	// mu guards closed; inflight counts calls that passed the closed check,
	// so that Close can wait for them before closing the client. Waits are
	// not among them: closing, closed by Close, ends them.
	mu       sync.RWMutex
	closed   bool
	inflight sync.WaitGroup
	closing  chan struct{}

	// The shared subscription of Wait, started by the first one (see
	// wait.go); waitPing is its health-check period.
	waitMu   sync.Mutex
	mux      *waitMux
	waitPing time.Duration

	// Group commit state: stores waiting for a round trip, and whether a
	// leader is committing them. leaders tracks the goroutines started to
	// take over leadership under load.
	commitMu sync.Mutex
	pending  []*storeOp
	leading  bool
	leaders  sync.WaitGroup
}

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Chords  = (*Backend)(nil)
)

// New connects to Redis as cfg says. It does not contact the server:
// connection errors show up on the first call (use Ping to check early).
// Close releases it.
func New(cfg Config) (*Backend, error) {
	s, err := cfg.settings()
	if err != nil {
		return nil, err
	}
	client, err := cfg.newClient()
	if err != nil {
		return nil, err
	}
	return &Backend{
		client:      client,
		s:           s,
		storeScript: goredis.NewScript(storeLua),
		chordScript: goredis.NewScript(chordLua),
		idem:        newIdemScripts(),
		rateScript:  goredis.NewScript(rateLimitLua),
		closing:     make(chan struct{}),
		waitPing:    defaultWaitPing,
	}, nil
}

// Ping checks that the server answers.
func (b *Backend) Ping(ctx context.Context) error {
	if err := b.enter(); err != nil {
		return err
	}
	defer b.inflight.Done()
	if err := b.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis backend: ping: %w", err)
	}
	return nil
}

// TaskKey returns the key (and pub/sub channel) of a task's result, for
// example celery-task-meta-<id>.
func (b *Backend) TaskKey(taskID string) string { return b.s.taskPrefix + taskID }

// groupKey returns the key of a group, plus suffix (".j", ".t", ".s").
func (b *Backend) groupKey(groupID, suffix string) string {
	return b.s.groupPrefix + groupID + suffix
}

// enter registers a call, or returns ErrClosed. The caller must call
// b.inflight.Done when it returns.
func (b *Backend) enter() error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return backend.ErrClosed
	}
	b.inflight.Add(1)
	return nil
}

// Store encodes the state with the configured serializer and writes it with
// a script that skips the write when the stored state is SUCCESS, else
// does SETEX (SET without expiry) and PUBLISH on the key's channel, which is
// what wakes Python clients waiting in AsyncResult.get(). Stores from
// concurrent callers share one script call (one round trip); each gets its
// own error.
//
// Store returns ErrClosed after Close. When ctx ends first it returns
// ctx.Err(), and the write may still happen.
func (b *Backend) Store(ctx context.Context, r backend.StoreRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m := r.Meta
	switch {
	case m == nil:
		return errors.New("redis backend: Store: nil meta")
	case m.TaskID == "":
		return errors.New("redis backend: Store: empty task id")
	case m.Status == "":
		return fmt.Errorf("redis backend: Store %s: empty status", m.TaskID)
	}
	if err := b.enter(); err != nil {
		return err
	}
	defer b.inflight.Done()
	value, err := protocol.EncodeResult(m, b.s.contentType)
	if err != nil {
		return fmt.Errorf("redis backend: encode result of %s: %w", m.TaskID, err)
	}
	if len(value) > maxValueSize {
		return fmt.Errorf("redis backend: result of %s is %d bytes, over Redis's 512 MB limit", m.TaskID, len(value))
	}
	op := &storeOp{key: b.TaskKey(m.TaskID), value: value, done: make(chan error, 1)}
	if b.s.maxBatch == 1 {
		// No batching: the caller's goroutine does the round trip, under
		// the caller's context.
		b.commit(ctx, []*storeOp{op})
	} else {
		b.submit(ctx, op)
	}
	select {
	case err := <-op.done:
		if err != nil {
			return fmt.Errorf("redis backend: store %s: %w", m.TaskID, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Get reads and decodes a task's stored state, or returns ErrNotFound (the
// state Celery reports as PENDING).
func (b *Backend) Get(ctx context.Context, taskID string) (*protocol.ResultMeta, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := b.enter(); err != nil {
		return nil, err
	}
	defer b.inflight.Done()
	data, err := b.client.Get(ctx, b.TaskKey(taskID)).Bytes()
	if errors.Is(err, goredis.Nil) {
		return nil, backend.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("redis backend: get %s: %w", taskID, err)
	}
	m, err := protocol.DecodeResult(data, b.s.contentType, protocol.DecodeOptions{MaxBodySize: maxValueSize})
	if err != nil {
		return nil, fmt.Errorf("redis backend: decode result of %s: %w", taskID, err)
	}
	return m, nil
}

// Forget deletes the task's result, as AsyncResult.forget() does.
func (b *Backend) Forget(ctx context.Context, taskID string) error {
	if err := b.enter(); err != nil {
		return err
	}
	defer b.inflight.Done()
	if err := b.client.Del(ctx, b.TaskKey(taskID)).Err(); err != nil {
		return fmt.Errorf("redis backend: forget %s: %w", taskID, err)
	}
	return nil
}

// Close ends every Wait with ErrClosed, waits for the other calls in
// progress and for stores still queued, then closes the connections.
// Later calls, including Close, return ErrClosed.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return backend.ErrClosed
	}
	b.closed = true
	close(b.closing)
	b.mu.Unlock()
	b.waitMu.Lock()
	mux := b.mux
	b.waitMu.Unlock()
	if mux != nil {
		mux.shutdown()
	}
	b.inflight.Wait()
	b.leaders.Wait()
	if err := b.client.Close(); err != nil {
		return fmt.Errorf("redis backend: close: %w", err)
	}
	return nil
}

// storeOp is one queued Store.
type storeOp struct {
	key   string
	value []byte
	done  chan error // buffered: a leader never blocks on a caller that left
}

// submit is the group commit. A store that finds no round trip in progress
// is written at once by its own goroutine, which thereby becomes the
// leader: an idle backend adds no hand-off and no latency. Stores that
// arrive while a leader's round trip is in flight queue up; when it
// returns, the leader hands the queue to a new goroutine, which writes all
// of it (up to MaxBatch per pipeline) and keeps doing so until the queue is
// empty. The caller that led returns as soon as its own batch is written.
func (b *Backend) submit(ctx context.Context, op *storeOp) {
	b.commitMu.Lock()
	b.pending = append(b.pending, op)
	if b.leading {
		b.commitMu.Unlock()
		return
	}
	b.leading = true
	// The queue was empty (no leader, nothing pending), so the batch is
	// this caller's store alone and may run under its context.
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

// lead writes queued stores until there are none left.
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

// takeLocked removes up to MaxBatch stores from the queue.
func (b *Backend) takeLocked() []*storeOp {
	n := min(len(b.pending), b.s.maxBatch)
	batch := slices.Clone(b.pending[:n])
	rest := copy(b.pending, b.pending[n:])
	clear(b.pending[rest:])
	b.pending = b.pending[:rest]
	return batch
}

// commit writes a batch and reports each store's outcome to its caller.
// Batches of queued stores run under a background context: a result that
// reached the queue is written even if its caller gave up (go-redis's
// timeouts bound the round trip).
func (b *Backend) commit(ctx context.Context, batch []*storeOp) {
	outcomes, err := b.runStores(ctx, batch, false)
	if isNoScript(err) {
		// The script cache was flushed (SCRIPT FLUSH, restart, failover):
		// EVAL sends the source and loads it again.
		b.s.log.Debug("redis backend: reloading the store script", zap.Int("stores", len(batch)))
		outcomes, err = b.runStores(ctx, batch, true)
	}
	for i, op := range batch {
		switch {
		case err != nil:
			op.done <- err
		case outcomes[i] == storeKept:
			b.s.log.Debug("redis backend: result kept, the task already succeeded", zap.String("key", op.key))
			op.done <- nil
		case outcomes[i] == storeWritten:
			op.done <- nil
		default:
			op.done <- outcomes[i].(error)
		}
	}
}

// The store script's answers for one store (else a redis error).
const (
	storeKept    = int64(0)
	storeWritten = int64(1)
)

// runStores writes the batch with one call of the store script and
// returns, per store, storeWritten, storeKept (a SUCCESS was there) or
// that store's error. The keys of one call may lie in different cluster
// slots: this backend talks to a single server (or a Sentinel-managed
// primary), never to a Cluster.
func (b *Backend) runStores(ctx context.Context, batch []*storeOp, eval bool) ([]any, error) {
	keys := make([]string, len(batch))
	args := make([]any, 2, 2+len(batch))
	args[0], args[1] = b.s.expires, b.s.luaFormat
	for i, op := range batch {
		keys[i] = op.key
		args = append(args, op.value)
	}
	// WAIT covers the writes of the connection it runs on: with
	// WaitReplicas the batch takes one connection for both.
	var sc goredis.Scripter = b.client
	var cn *goredis.Conn
	if b.s.waitReplicas > 0 {
		cn = b.client.Conn()
		defer cn.Close()
		sc = cn
	}
	var cmd *goredis.Cmd
	if eval {
		cmd = b.storeScript.Eval(ctx, sc, keys, args...)
	} else {
		cmd = b.storeScript.EvalSha(ctx, sc, keys, args...)
	}
	res, err := cmd.Slice()
	if err != nil {
		return nil, err
	}
	if cn != nil {
		b.waitReplicated(ctx, cn, len(batch))
	}
	if len(res) != len(batch) {
		return nil, fmt.Errorf("store script answered %d results for %d stores", len(res), len(batch))
	}
	for i, r := range res {
		switch r.(type) {
		case int64, error:
		default:
			res[i] = fmt.Errorf("store script answered %T", r)
		}
	}
	return res, nil
}

// waitReplicated runs WAIT on cn after n result writes, and logs and
// counts them when fewer replicas than WaitReplicas acknowledged them in
// time: a failover now would lose them.
func (b *Backend) waitReplicated(ctx context.Context, cn *goredis.Conn, n int) {
	got, err := cn.Wait(ctx, b.s.waitReplicas, b.s.waitTimeout).Result()
	if err == nil && got >= int64(b.s.waitReplicas) {
		return
	}
	total := b.unreplicated.Add(int64(n))
	// One line per 5 s at most: a replica that is down would otherwise log
	// every batch; the count says how many went unreplicated.
	now := time.Now().UnixNano()
	last := b.lastUnreplicatedLog.Load()
	if now-last < int64(5*time.Second) || !b.lastUnreplicatedLog.CompareAndSwap(last, now) {
		return
	}
	b.s.log.Warn("redis backend: results not replicated in time; a failover now would lose them",
		zap.Int("results", n), zap.Int64("replicas", got), zap.Int("want_replicas", b.s.waitReplicas),
		zap.Duration("wait_timeout", b.s.waitTimeout), zap.Int64("unreplicated_total", total), zap.Error(err))
}

// Unreplicated reports how many result writes were not acknowledged by
// WaitReplicas replicas within WaitTimeout (always 0 without WaitReplicas),
// for metrics.
func (b *Backend) Unreplicated() int64 { return b.unreplicated.Load() }

func isNoScript(err error) bool {
	return err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT")
}
