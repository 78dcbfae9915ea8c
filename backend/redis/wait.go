package redis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

const (
	// defaultWaitPing is how often the shared pub/sub connection is
	// checked while Waits use it: a PING goes out when nothing arrived for
	// that long, and the connection is replaced when nothing (not even the
	// PONG) arrives in as long again. go-redis itself only notices a
	// connection that fails a read or a write; one whose peer vanished
	// (no RST) would otherwise keep its waiters asleep until TCP gives up.
	defaultWaitPing = 5 * time.Second
	// maxSubscribeBatch bounds the channels of one SUBSCRIBE or
	// UNSUBSCRIBE, maxReadBatch the keys of one MGET.
	maxSubscribeBatch = 1024
	maxReadBatch      = 1024
	// Delays between attempts after a failed SUBSCRIBE, MGET or pub/sub
	// read.
	waitRetryMin = 100 * time.Millisecond
	waitRetryMax = 2 * time.Second
)

// Wait blocks until the task reaches a ready state (SUCCESS, FAILURE,
// REVOKED) and returns it, as AsyncResult.get() does on Celery's Redis
// backend. It never polls: every Store PUBLISHes the document on the
// result's channel (the result key, celery-task-meta-<id>), and Wait wakes
// on it. States that are not ready (STARTED, RETRY, ...) are skipped.
//
// All the Waits of a Backend share one pub/sub connection, as the Waits of
// a Celery app share its ResultConsumer: the first Wait opens it, Close
// closes it. A channel is subscribed when its first Wait arrives and
// unsubscribed when its last one leaves; once the subscription is
// confirmed the key is read once, so that a result stored before it is
// not missed. When the connection drops, go-redis reconnects and
// subscribes again, and every Wait reads its key again, since a PUBLISH
// in between was lost.
//
// Wait returns ctx.Err() when ctx ends first, and ErrClosed when the
// backend is closed (Close ends every Wait). A result it cannot decode is
// an error. So is a failure to subscribe or to read the key before the
// Wait was first in place (Redis is down, say); after that, connection
// failures are retried and the Wait goes on.
func (b *Backend) Wait(ctx context.Context, taskID string) (*protocol.ResultMeta, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m, err := b.waitMux()
	if err != nil {
		return nil, err
	}
	w, err := m.join(b.TaskKey(taskID))
	if err != nil {
		return nil, err
	}
	defer m.leave(w)
	for {
		select {
		case <-w.wake:
		case <-b.closing:
			return nil, backend.ErrClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		for _, ev := range w.take() {
			if ev.err != nil {
				return nil, fmt.Errorf("redis backend: wait for %s: %w", taskID, ev.err)
			}
			meta, err := protocol.DecodeResult([]byte(ev.doc), b.s.contentType, protocol.DecodeOptions{MaxBodySize: maxValueSize})
			if err != nil {
				return nil, fmt.Errorf("redis backend: decode result of %s: %w", taskID, err)
			}
			if meta.Status.Ready() {
				return meta, nil
			}
		}
	}
}

// waitMux returns the shared subscription of Wait, starting it on first
// use.
func (b *Backend) waitMux() (*waitMux, error) {
	b.waitMu.Lock()
	defer b.waitMu.Unlock()
	if b.mux != nil {
		return b.mux, nil
	}
	// Close stops the mux it finds under waitMu after it set closed: a mux
	// started after that would outlive the backend.
	b.mu.RLock()
	closed := b.closed
	b.mu.RUnlock()
	if closed {
		return nil, backend.ErrClosed
	}
	b.mux = newWaitMux(b)
	return b.mux, nil
}

// waitMux multiplexes the Waits of a Backend over one go-redis PubSub.
//
// Three goroutines serve it. receive reads the connection: it hands each
// PUBLISHed document to the waiters of its channel, and on each SUBSCRIBE
// confirmation (go-redis's own after a reconnect included) queues a read
// of the channel's key. subscriber is the only one to send SUBSCRIBE and
// UNSUBSCRIBE: it brings the connection's channels in line with the
// channels that have waiters, in batches, and checks the connection's
// health. reader reads the queued keys, in batches (MGET), and hands what
// it finds to the waiters.
//
// A waiter is a struct in its topic's list and a queue of documents: no
// goroutine, no connection.
type waitMux struct {
	b *Backend
	// cancel ends the context of the goroutines, and with it their Redis
	// calls in progress.
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// received counts what receive has read, for the health check.
	received atomic.Uint64

	syncWake chan struct{} // capacity 1: syncQ has topics
	readWake chan struct{} // capacity 1: readQ has topics

	mu      sync.Mutex
	ps      *goredis.PubSub // replaced when the health check gives up on it
	stopped bool
	topics  map[string]*topic // by channel
	syncQ   []*topic          // topics whose subscription may have to change
	readQ   []*topic          // topics whose key must be read
}

// topic is one channel and its waiters. Guarded by waitMux.mu.
type topic struct {
	key     string
	waiters []*waiter
	// subscribed: SUBSCRIBE was sent, and no UNSUBSCRIBE since (the
	// channel is in the PubSub's set, which go-redis subscribes again
	// after a reconnect).
	subscribed bool
	// resend: SUBSCRIBE failed and must be sent again.
	resend                 bool
	syncQueued, readQueued bool
}

// waiter is one Wait.
type waiter struct {
	// Guarded by waitMux.mu.
	t   *topic
	idx int // in t.waiters
	// covered: a read of the key succeeded after the Wait joined; from then
	// on failures are retried instead of reported.
	covered bool

	wake   chan struct{} // capacity 1: events has something
	mu     sync.Mutex
	events []waitEvent
}

// waitEvent is a stored or published document, or an error ending the
// Wait.
type waitEvent struct {
	doc string
	err error
}

// push queues an event and wakes the Wait. It never blocks: receive and
// reader serve every waiter.
func (w *waiter) push(ev waitEvent) {
	w.mu.Lock()
	w.events = append(w.events, ev)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// take returns the queued events, oldest first.
func (w *waiter) take() []waitEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := w.events
	w.events = nil
	return evs
}

func newWaitMux(b *Backend) *waitMux {
	ctx, cancel := context.WithCancel(context.Background())
	m := &waitMux{
		b: b, cancel: cancel,
		syncWake: make(chan struct{}, 1), readWake: make(chan struct{}, 1),
		// Without channels, Subscribe connects on first use.
		ps:     b.client.Subscribe(ctx),
		topics: map[string]*topic{},
	}
	m.wg.Go(func() { m.receive(ctx) })
	m.wg.Go(func() { m.subscriber(ctx) })
	m.wg.Go(func() { m.reader(ctx) })
	return m
}

// shutdown stops the goroutines and closes the connection. The Waits end
// on the backend's closing channel.
func (m *waitMux) shutdown() {
	m.mu.Lock()
	m.stopped = true
	ps := m.ps
	m.mu.Unlock()
	// Cancel first: a dial in progress holds the PubSub's lock, which
	// Close needs.
	m.cancel()
	_ = ps.Close()
	m.wg.Wait()
}

// join registers a Wait on a channel.
func (m *waitMux) join(key string) (*waiter, error) {
	w := &waiter{wake: make(chan struct{}, 1)}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return nil, backend.ErrClosed
	}
	t := m.topics[key]
	if t == nil {
		t = &topic{key: key}
		m.topics[key] = t
	}
	w.t, w.idx = t, len(t.waiters)
	t.waiters = append(t.waiters, w)
	if t.subscribed {
		// The subscription may be confirmed already, and a document
		// published before this Wait joined did not reach it: read the key
		// (if a confirmation is still to come, it reads it again).
		m.queueReadLocked(t)
	} else {
		m.queueSyncLocked(t)
	}
	return w, nil
}

// leave unregisters a Wait; the last one of a channel has it
// unsubscribed.
func (m *waitMux) leave(w *waiter) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := w.t
	last := len(t.waiters) - 1
	moved := t.waiters[last]
	t.waiters[w.idx], moved.idx = moved, w.idx
	t.waiters[last] = nil
	t.waiters = t.waiters[:last]
	if last > 0 || m.stopped {
		return
	}
	if t.subscribed {
		m.queueSyncLocked(t)
	} else if m.topics[t.key] == t {
		delete(m.topics, t.key)
	}
}

func (m *waitMux) queueSyncLocked(t *topic) {
	if t.syncQueued {
		return
	}
	t.syncQueued = true
	m.syncQ = append(m.syncQ, t)
	signal(m.syncWake)
}

func (m *waitMux) queueReadLocked(t *topic) {
	if t.readQueued {
		return
	}
	t.readQueued = true
	m.readQ = append(m.readQ, t)
	signal(m.readWake)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// sleep waits for d, or returns false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (m *waitMux) pubsub() *goredis.PubSub {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ps
}

// receive reads the pub/sub connection until the mux stops.
func (m *waitMux) receive(ctx context.Context) {
	log := m.b.s.log
	ps := m.pubsub()
	fails := 0
	for {
		msg, err := ps.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if cur := m.pubsub(); cur != ps {
				ps, fails = cur, 0 // the health check replaced it
				continue
			}
			// go-redis has reconnected already, or will on the next
			// Receive, and subscribes the channels again: their
			// confirmations have the keys read again.
			fails++
			if fails == 1 {
				log.Warn("redis backend: Wait's pub/sub connection failed; reconnecting", zap.Error(err))
				continue
			}
			if !sleep(ctx, min(waitRetryMin<<min(fails-2, 5), waitRetryMax)) {
				return
			}
			continue
		}
		if fails > 0 {
			log.Info("redis backend: Wait's pub/sub connection is back")
			fails = 0
		}
		m.received.Add(1)
		switch msg := msg.(type) {
		case *goredis.Message:
			m.deliver(msg.Channel, msg.Payload)
		case *goredis.Subscription:
			if msg.Kind == "subscribe" {
				m.confirmed(msg.Channel)
			}
		}
	}
}

// deliver hands a published document to the waiters of its channel.
func (m *waitMux) deliver(channel, doc string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.topics[channel]; t != nil {
		for _, w := range t.waiters {
			w.push(waitEvent{doc: doc})
		}
	}
}

// confirmed queues a read of a channel's key once its subscription is in
// place: a document stored before was not published to the waiters.
func (m *waitMux) confirmed(channel string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t := m.topics[channel]; t != nil && len(t.waiters) > 0 {
		m.queueReadLocked(t)
	}
}

// subscriber sends the SUBSCRIBEs and UNSUBSCRIBEs, and checks the
// connection's health, until the mux stops. It alone changes the
// connection's channels, so they are changed in the order the topics
// changed: an UNSUBSCRIBE never overtakes the SUBSCRIBE of a later Wait.
func (m *waitMux) subscriber(ctx context.Context) {
	tick := time.NewTicker(m.b.waitPing)
	defer tick.Stop()
	var h health
	retry := waitRetryMin
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.syncWake:
		case <-tick.C:
			m.checkHealth(ctx, &h)
			m.rereadAll()
		}
		for {
			ps, subs, unsubs := m.takeSync()
			if len(subs) == 0 && len(unsubs) == 0 {
				break
			}
			if len(unsubs) > 0 {
				// A failure needs no retry: go-redis forgets the channels
				// anyway, and a connection that failed is replaced by one
				// without them.
				_ = ps.Unsubscribe(ctx, topicKeys(unsubs)...)
			}
			if len(subs) > 0 {
				if err := ps.Subscribe(ctx, topicKeys(subs)...); err != nil {
					m.subscribeFailed(subs, err)
					if !sleep(ctx, retry) {
						return
					}
					retry = min(retry*2, waitRetryMax)
					continue
				}
			}
			retry = waitRetryMin
		}
	}
}

// rereadAll queues a read of every key someone waits for. A writer that
// stores a result without PUBLISHing it (gocelery, celery-rs: a known cause
// of AsyncResult.get() hanging in Python) still wakes its waiters, within
// one health-check period; with many waiters it is one MGET per 1024 keys.
func (m *waitMux) rereadAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range m.topics {
		if len(t.waiters) > 0 && t.subscribed {
			m.queueReadLocked(t)
		}
	}
}

// takeSync takes a batch of topics whose subscription must change, and
// records the change as made.
func (m *waitMux) takeSync() (ps *goredis.PubSub, subs, unsubs []*topic) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for n < len(m.syncQ) && len(subs) < maxSubscribeBatch && len(unsubs) < maxSubscribeBatch {
		t := m.syncQ[n]
		n++
		t.syncQueued = false
		switch {
		case len(t.waiters) > 0 && (!t.subscribed || t.resend):
			t.subscribed, t.resend = true, false
			subs = append(subs, t)
		case len(t.waiters) == 0 && t.subscribed:
			t.subscribed, t.resend = false, false
			unsubs = append(unsubs, t)
			if m.topics[t.key] == t {
				delete(m.topics, t.key)
			}
		}
	}
	rest := copy(m.syncQ, m.syncQ[n:])
	clear(m.syncQ[rest:])
	m.syncQ = m.syncQ[:rest]
	return m.ps, subs, unsubs
}

// subscribeFailed ends, with err, the Waits of subs that were not in place
// yet, and has the others' SUBSCRIBE sent again: go-redis keeps the
// channels in its set, but may have reconnected without them.
func (m *waitMux) subscribeFailed(subs []*topic, err error) {
	err = fmt.Errorf("subscribe: %w", err)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return // the Waits end with ErrClosed
	}
	for _, t := range subs {
		for _, w := range t.waiters {
			if !w.covered {
				w.push(waitEvent{err: err})
			}
		}
		t.resend = true
		m.queueSyncLocked(t)
	}
}

func topicKeys(ts []*topic) []string {
	keys := make([]string, len(ts))
	for i, t := range ts {
		keys[i] = t.key
	}
	return keys
}

// health is the subscriber's view of the connection between two ticks.
type health struct {
	received uint64 // waitMux.received at the last tick
	pinged   bool   // a PING went out at the last tick
}

// checkHealth runs on every tick: when nothing was received since the
// last tick, it sends a PING, or, when it sent one then, replaces the
// connection. Idle connections (no channel) are left alone.
func (m *waitMux) checkHealth(ctx context.Context, h *health) {
	n := m.received.Load()
	m.mu.Lock()
	ps, busy := m.ps, len(m.topics) > 0
	m.mu.Unlock()
	switch {
	case !busy || n != h.received:
		h.received, h.pinged = n, false
	case h.pinged:
		m.replace()
		h.pinged = false
	default:
		// A PING that fails has go-redis reconnect; one that is written
		// gets an answer within a tick, or the connection is dead.
		h.pinged = ps.Ping(ctx) == nil
	}
}

// replace swaps the PubSub for a new one and has every channel with
// waiters subscribed on it; the confirmations have the keys read again.
// receive notices the swap when the old one, closed, fails its read.
func (m *waitMux) replace() {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return
	}
	old := m.ps
	m.ps = m.b.client.Subscribe(context.Background()) // without channels it only allocates
	for key, t := range m.topics {
		t.subscribed, t.resend = false, false
		if len(t.waiters) == 0 {
			delete(m.topics, key)
			continue
		}
		m.queueSyncLocked(t)
	}
	m.mu.Unlock()
	m.b.s.log.Warn("redis backend: Wait's pub/sub connection does not answer PING; replacing it")
	_ = old.Close()
}

// reader reads the queued keys until the mux stops.
func (m *waitMux) reader(ctx context.Context) {
	retry := waitRetryMin
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.readWake:
		}
		for {
			batch := m.takeReads()
			if len(batch) == 0 {
				break
			}
			vals, err := m.b.client.MGet(ctx, topicKeys(batch)...).Result()
			if err == nil && len(vals) != len(batch) {
				err = fmt.Errorf("MGET answered %d values for %d keys", len(vals), len(batch))
			}
			if err != nil {
				m.readFailed(batch, err)
				if !sleep(ctx, retry) {
					return
				}
				retry = min(retry*2, waitRetryMax)
				continue
			}
			retry = waitRetryMin
			m.readDone(batch, vals)
		}
	}
}

// takeReads takes a batch of topics to read.
func (m *waitMux) takeReads() []*topic {
	m.mu.Lock()
	defer m.mu.Unlock()
	var batch []*topic
	n := 0
	for n < len(m.readQ) && len(batch) < maxReadBatch {
		t := m.readQ[n]
		n++
		t.readQueued = false
		if len(t.waiters) > 0 {
			batch = append(batch, t)
		}
	}
	rest := copy(m.readQ, m.readQ[n:])
	clear(m.readQ[rest:])
	m.readQ = m.readQ[:rest]
	return batch
}

// readDone hands the documents read to the waiters. A waiter that joined
// after the read was sent gets it too; its own read is queued.
func (m *waitMux) readDone(batch []*topic, vals []any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, t := range batch {
		doc, found := vals[i].(string)
		for _, w := range t.waiters {
			w.covered = true
			if found {
				w.push(waitEvent{doc: doc})
			}
		}
	}
}

// readFailed ends, with err, the Waits whose key was never read, and
// queues the others' reads again.
func (m *waitMux) readFailed(batch []*topic, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return // the Waits end with ErrClosed
	}
	m.b.s.log.Warn("redis backend: Wait cannot read results; retrying", zap.Int("keys", len(batch)), zap.Error(err))
	err = fmt.Errorf("read result: %w", err)
	for _, t := range batch {
		again := false
		for _, w := range t.waiters {
			if w.covered {
				again = true
			} else {
				w.push(waitEvent{err: err})
			}
		}
		if again {
			m.queueReadLocked(t)
		}
	}
}
