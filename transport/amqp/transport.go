package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/transport"
)

// Transport is a RabbitMQ transport speaking Celery's AMQP conventions. It
// keeps two connections, one for consumers and subscriptions and one for
// publishing, so that broker flow control on publishers never stalls acks.
// It is safe for concurrent use.
type Transport struct {
	s   *settings
	con *link // consumers, subscriptions
	pub *link // publishing, admin, dead letters

	pubMu    sync.Mutex
	pubSess  *session
	confirmC *pubChannel
	plainC   *pubChannel

	mu        sync.Mutex
	closed    bool
	consumers map[*consumer]struct{}
	subs      map[*subscription]struct{}
	wg        sync.WaitGroup // consumer and subscription loops

	seq atomic.Uint64 // consumer ids and tags

	// quorumSeen: a consumed queue is a quorum queue, which turns
	// DelayedAuto on. exchangeKinds maps the exchanges of consumed queues
	// to their declared types, for delayedRoute.
	quorumSeen    atomic.Bool
	exchangeKinds sync.Map
}

var (
	_ transport.Transport = (*Transport)(nil)
	_ transport.Admin     = (*Transport)(nil)
)

// Dial connects to the broker: each configured URL is tried once, in order,
// and the first that answers is used. Later connection losses are repaired
// in the background (see Config). Cancelling ctx aborts the connection
// attempts.
func Dial(ctx context.Context, c Config) (*Transport, error) {
	return dial(ctx, c, nil)
}

// dial is Dial with a hook that sees each raw connection (tests inject
// faults through it).
func dial(ctx context.Context, c Config, hook func(role string, conn *tagFixConn)) (*Transport, error) {
	s, err := newSettings(c)
	if err != nil {
		return nil, err
	}
	roleHook := func(role string) func(*tagFixConn) {
		if hook == nil {
			return nil
		}
		return func(c *tagFixConn) { hook(role, c) }
	}
	con, err := dialLink(ctx, s, "consumer", roleHook("consumer"))
	if err != nil {
		return nil, err
	}
	pub, err := dialLink(ctx, s, "publisher", roleHook("publisher"))
	if err != nil {
		con.close()
		return nil, err
	}
	return &Transport{
		s:         s,
		con:       con,
		pub:       pub,
		consumers: make(map[*consumer]struct{}),
		subs:      make(map[*subscription]struct{}),
	}, nil
}

// Close stops all consumers and subscriptions and closes both connections.
// Deliveries not acknowledged yet go back to their queues (the broker
// requeues them when their channel closes); acknowledging them afterwards
// returns transport.ErrStaleDelivery. Close is idempotent.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	cons := make([]*consumer, 0, len(t.consumers))
	for c := range t.consumers {
		cons = append(cons, c)
	}
	subs := make([]*subscription, 0, len(t.subs))
	for s := range t.subs {
		subs = append(subs, s)
	}
	t.mu.Unlock()

	for _, c := range cons {
		c.shutdown()
	}
	for _, s := range subs {
		s.shutdown()
	}
	t.wg.Wait()
	for _, c := range cons {
		c.closeChannel()
	}
	t.pub.close()
	t.con.close()
	return nil
}

func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

func (t *Transport) unregister(c *consumer, s *subscription) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.consumers, c)
	delete(t.subs, s)
}

// Ping reports whether the broker is reachable, for a worker's /readyz: both
// connections (consumer and publisher) must be up. It does not wait for a
// reconnection, so it fails for as long as an outage lasts. A broker that
// closes the connection or goes away is noticed at once; a network that
// drops packets silently, after about three heartbeat intervals (see
// Config.Heartbeat). It fails with transport.ErrClosed after Close.
func (t *Transport) Ping(ctx context.Context) error {
	if t.isClosed() {
		return transport.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// One line, for logs and the probe's response body.
	cerr, perr := t.con.up(), t.pub.up()
	switch {
	case cerr != nil && perr != nil:
		return fmt.Errorf("%w; %w", cerr, perr)
	case cerr != nil:
		return cerr
	}
	return perr
}

// Len returns the number of ready messages in a queue (messages delivered
// and not yet acknowledged are not counted, as RabbitMQ counts). A queue
// that does not exist has length 0.
func (t *Transport) Len(ctx context.Context, queue string) (int, error) {
	n := 0
	err := t.withPubChannel(ctx, func(ch *amqp091.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	if isNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("amqp: length of %q: %w", queue, err)
	}
	return n, nil
}

// Purge deletes the ready messages of a queue and returns how many. A queue
// that does not exist has nothing to purge.
func (t *Transport) Purge(ctx context.Context, queue string) (int, error) {
	n := 0
	err := t.withPubChannel(ctx, func(ch *amqp091.Channel) error {
		var err error
		n, err = ch.QueuePurge(queue, false)
		return err
	})
	if isNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("amqp: purge %q: %w", queue, err)
	}
	return n, nil
}

// withPubChannel runs fn on a throwaway channel of the publishing
// connection, waiting out (and retrying after) connection losses.
func (t *Transport) withPubChannel(ctx context.Context, fn func(ch *amqp091.Channel) error) error {
	var prev *session
	for {
		if t.isClosed() {
			return transport.ErrClosed
		}
		sess, err := t.pub.next(ctx, prev)
		if err != nil {
			return err
		}
		tp := &topo{sess: sess}
		err = tp.do(fn)
		tp.close()
		if isConnectionError(err, sess) {
			prev = sess
			continue
		}
		return err
	}
}

// errNack is returned when the broker refuses a publish (basic.nack).
var errNack = errors.New("amqp: broker refused the message (basic.nack)")

// DeleteQueue deletes a queue and the messages in it (transporttest's
// QueueDeleter). A queue that does not exist is already deleted.
func (t *Transport) DeleteQueue(ctx context.Context, queue string) error {
	err := t.withPubChannel(ctx, func(ch *amqp091.Channel) error {
		_, err := ch.QueueDelete(queue, false, false, false)
		return err
	})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("amqp: delete queue %q: %w", queue, err)
	}
	return nil
}

// Reconnects reports how many times a connection to the broker was
// re-established after it was lost, for metrics.
func (t *Transport) Reconnects() int64 { return t.s.reconnects.Load() }

// Failovers reports how many of the reconnections (see Reconnects) landed
// on another broker URL than the one whose connection was lost.
func (t *Transport) Failovers() int64 { return t.s.failovers.Load() }

// Node returns the broker URL (password redacted) the consumer connection
// is using, or "" while it is down, for logs and metrics: with several
// failover URLs it says which node the worker is on.
func (t *Transport) Node() string { return t.con.node() }
