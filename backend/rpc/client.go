package rpc

import (
	"container/list"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// QueueKind says how a [Client] declares and reads its reply queue.
type QueueKind int

const (
	// AutoQueue (the default) tries TransientQueue and checks it with a
	// probe: a message sent to the queue the way workers send states
	// (exchange "", routing key = the queue). When the probe comes back
	// the broker routes replies to the subscription (RabbitMQ, the memory
	// transport); when it stays in the queue instead (transport.Admin's
	// Len counts it), the subscription was a pub/sub one (Redis), so the
	// client switches to ListQueue. On Redis this costs about 100 ms in
	// NewClient.
	AutoQueue QueueKind = iota
	// TransientQueue declares the queue with transport.Transport.Subscribe:
	// non-durable, auto-delete, x-expires, consumed without
	// acknowledgements, as Celery's client declares it on RabbitMQ. The
	// broadcast subscription also binds the queue to amq.direct with the
	// queue's name (Subscribe needs an exchange; amq.direct exists on
	// every RabbitMQ virtual host); replies arrive through the default
	// exchange as in Celery. The broker deletes the queue when the client
	// closes.
	TransientQueue
	// ListQueue consumes the queue with transport.Transport.Consume: on
	// Redis the list the workers LPUSH replies to, as kombu's Redis
	// transport reads it. Consume also binds the queue as kombu binds a
	// task queue (a _kombu.binding.<queue> set on Redis), and on RabbitMQ
	// it would declare a durable queue and exchange named after the queue,
	// so use it on Redis only.
	ListQueue
)

func (k QueueKind) String() string {
	switch k {
	case AutoQueue:
		return "auto"
	case TransientQueue:
		return "transient"
	case ListQueue:
		return "list"
	}
	return fmt.Sprintf("QueueKind(%d)", int(k))
}

// Defaults of ClientConfig.
const (
	// DefaultExpires is Celery's result_expires, the reply queue's
	// x-expires.
	DefaultExpires = 24 * time.Hour
	// DefaultMaxStates is Celery's MESSAGE_BUFFER_MAX
	// (celery/backends/base.py), the bound of its buffer of states that
	// arrived for tasks nobody waited for.
	DefaultMaxStates = 8192
)

// probeGrace is how long AutoQueue waits for its probe before it asks the
// transport whether the probe sits in the queue instead; probeTimeout is
// how long it waits in all before it gives up.
const (
	probeGrace   = 100 * time.Millisecond
	probeTimeout = 10 * time.Second
)

// replyExchange is the exchange TransientQueue's subscription binds to.
const replyExchange = "amq.direct"

// ClientConfig configures a Client. The zero value matches Celery's
// defaults.
type ClientConfig struct {
	// Config configures Store: the serializer and delivery mode of the
	// states the client sends.
	Config
	// Queue names the reply queue. Default: a random UUID, as Celery's
	// app.thread_oid.
	Queue string
	// Kind says how the queue is declared and read. Default AutoQueue.
	Kind QueueKind
	// Expires is the queue's x-expires (Celery's result_expires): RabbitMQ
	// deletes the queue once it has been unused that long. Default
	// DefaultExpires; negative for no x-expires.
	Expires time.Duration
	// MaxStates bounds the tasks whose state the client keeps for Get and
	// for a later Wait (a state can arrive before anyone waits for it).
	// When more arrive, the least recently used state nobody is waiting
	// for is forgotten. Default DefaultMaxStates.
	MaxStates int
	// Logger reports replies that cannot be read. Default: none.
	Logger *zap.Logger
}

// Client is the caller's side of the RPC backend, Celery's rpc
// ResultConsumer: it declares a reply queue of its own, consumes it, and
// keeps the states that arrive there by task id. The task messages carry
// [Client.ReplyTo] as their reply_to property; the workers (Python Celery
// with result_backend = "rpc://", or celeriac with backend/rpc) then send
// each state of those tasks to the queue.
//
// Client is a backend.Backend for package client: client.New(tr,
// client.Config{Backend: c}) sends its tasks with reply_to = ReplyTo(),
// and its AsyncResult's Get wakes on the reply. Get returns the latest
// state received (backend.ErrNotFound, which is PENDING, before the
// first), Wait blocks until a ready one arrives, and Store sends a state
// to a reply queue as the worker side ([Backend]) does. It is safe for
// concurrent use.
//
// States are routed by the task_id of the reply's body, which Celery's
// workers always set to the task's id (the correlation_id, which they
// copy from the task message, is used for a body without one). Once a
// task's state is ready (SUCCESS, FAILURE, REVOKED), later states that are
// not are ignored, and a SUCCESS is never replaced: Celery's client stops
// listening for a task once it is ready.
type Client struct {
	be        *Backend
	tr        transport.Transport
	queue     string
	kind      QueueKind
	args      map[string]any
	maxStates int
	log       *zap.Logger
	probeID   string

	// stop ends the subscription or consumer; loopDone is closed when
	// the goroutine routing its deliveries has returned.
	stop     func() error
	loopDone chan struct{}

	mu     sync.Mutex
	states map[string]*entry
	// idle holds the entries that have a state and no waiter, most
	// recently used first: the ones MaxStates may evict.
	idle   list.List
	closed bool
	// err is set, and done closed, when the client is closed
	// (backend.ErrClosed) or the reply queue stopped delivering.
	err  error
	done chan struct{}
}

// entry is one task's state as far as the client knows it.
type entry struct {
	id string
	// body and contentType are the latest reply: every reader decodes its
	// own copy, so that no two callers share maps or slices.
	body        []byte
	contentType string
	status      protocol.State
	has         bool
	ready       chan struct{} // closed once a ready state arrived
	waiters     int
	elem        *list.Element // in Client.idle
}

var _ backend.Backend = (*Client)(nil)

// NewClient declares the reply queue on tr as cfg.Kind says, starts
// consuming it and returns once replies can arrive: a task sent with
// reply_to = ReplyTo() after NewClient returned cannot be missed. ctx
// bounds the setup. The client does not own tr: Close does not close it.
func NewClient(ctx context.Context, tr transport.Transport, cfg ClientConfig) (*Client, error) {
	if tr == nil {
		return nil, errors.New("rpc client: nil transport")
	}
	be, err := New(tr, cfg.Config)
	if err != nil {
		return nil, err
	}
	c := &Client{
		be: be, tr: tr, queue: cfg.Queue, kind: cfg.Kind, maxStates: cfg.MaxStates, log: cfg.Logger,
		loopDone: make(chan struct{}), states: map[string]*entry{}, done: make(chan struct{}),
	}
	if c.queue == "" {
		if c.queue, err = newUUID(); err != nil {
			return nil, err
		}
	}
	if c.maxStates <= 0 {
		c.maxStates = DefaultMaxStates
	}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	c.log = c.log.With(zap.String("reply_queue", c.queue))
	expires := cfg.Expires
	if expires == 0 {
		expires = DefaultExpires
	}
	if expires > 0 {
		c.args = map[string]any{"x-expires": expires.Milliseconds()}
	}
	var deliveries <-chan *transport.Delivery
	switch cfg.Kind {
	case TransientQueue:
		deliveries, err = c.subscribe(ctx)
	case ListQueue:
		deliveries, err = c.consume(ctx)
	case AutoQueue:
		deliveries, err = c.probe(ctx)
	default:
		err = fmt.Errorf("rpc client: unknown queue kind %d", int(cfg.Kind))
	}
	if err != nil {
		return nil, err
	}
	go c.loop(deliveries)
	return c, nil
}

// subscribe declares the queue as a broadcast subscription.
func (c *Client) subscribe(ctx context.Context) (<-chan *transport.Delivery, error) {
	sub, err := c.tr.Subscribe(ctx, transport.Broadcast{
		Exchange: replyExchange, ExchangeType: transport.Direct, BindingKey: c.queue,
		Queue: c.queue, QueueArguments: c.args,
	})
	if err != nil {
		return nil, fmt.Errorf("rpc client: declare reply queue %s: %w", c.queue, err)
	}
	c.kind = TransientQueue
	c.stop = sub.Close
	return sub.Deliveries(), nil
}

// consume consumes the queue as a task queue.
func (c *Client) consume(ctx context.Context) (<-chan *transport.Delivery, error) {
	cons, err := c.tr.Consume(ctx, []transport.Queue{{Name: c.queue, Arguments: c.args}}, transport.ConsumeOptions{})
	if err != nil {
		return nil, fmt.Errorf("rpc client: consume reply queue %s: %w", c.queue, err)
	}
	c.kind = ListQueue
	c.stop = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := cons.Stop(ctx)
		if a, ok := c.tr.(transport.Admin); ok {
			// What is left would never be read: kombu deletes an
			// auto-delete queue when its consumer is cancelled.
			_, _ = a.Purge(ctx, c.queue)
		}
		return err
	}
	return cons.Deliveries(), nil
}

// probe is AutoQueue: subscribe, send a probe the way workers send
// replies, and keep the subscription if the probe comes back through it.
func (c *Client) probe(ctx context.Context) (<-chan *transport.Delivery, error) {
	deliveries, err := c.subscribe(ctx)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (<-chan *transport.Delivery, error) {
		_ = c.stop()
		return nil, err
	}
	id, err := newUUID()
	if err != nil {
		return fail(err)
	}
	c.probeID = "celeriac-rpc-probe-" + id
	err = c.tr.Publish(ctx, &transport.Publishing{RoutingKey: c.queue, Message: protocol.Message{
		ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8", Headers: map[string]any{},
		Properties: protocol.Properties{CorrelationID: c.probeID, DeliveryMode: 1},
		Body:       []byte("{}"),
	}})
	if err != nil {
		return fail(fmt.Errorf("rpc client: probe reply queue %s: %w", c.queue, err))
	}
	admin, hasLen := c.tr.(transport.Admin)
	grace := time.NewTimer(probeGrace)
	defer grace.Stop()
	deadline := time.NewTimer(probeTimeout)
	defer deadline.Stop()
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return fail(fmt.Errorf("rpc client: reply queue %s: subscription ended during the probe", c.queue))
			}
			if d.Message.Properties.CorrelationID == c.probeID {
				return deliveries, nil
			}
			c.handle(d) // a reply to a queue name the caller chose and reused
		case <-grace.C:
			n := 1
			if hasLen {
				if n, err = admin.Len(ctx, c.queue); err != nil {
					return fail(fmt.Errorf("rpc client: probe reply queue %s: %w", c.queue, err))
				}
			}
			if n == 0 {
				// Routed to the subscription and not received yet.
				grace.Reset(probeGrace)
				continue
			}
			if err := c.stop(); err != nil {
				return nil, fmt.Errorf("rpc client: reply queue %s: %w", c.queue, err)
			}
			c.log.Debug("rpc client: replies stay in the queue; consuming it as a list")
			return c.consume(ctx)
		case <-deadline.C:
			return fail(fmt.Errorf("rpc client: the probe sent to reply queue %s came back neither through the subscription nor in the queue", c.queue))
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
}

// loop routes the deliveries until the subscription or consumer ends.
func (c *Client) loop(deliveries <-chan *transport.Delivery) {
	defer close(c.loopDone)
	for d := range deliveries {
		c.handle(d)
		if c.kind == ListQueue {
			if err := d.Ack(context.Background()); err != nil {
				c.log.Debug("rpc client: ack of a reply failed", zap.Error(err))
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = fmt.Errorf("rpc client: reply queue %s stopped delivering: %w", c.queue, transport.ErrClosed)
		close(c.done)
	}
}

// handle decodes one reply and records it.
func (c *Client) handle(d *transport.Delivery) {
	m := &d.Message
	if c.probeID != "" && m.Properties.CorrelationID == c.probeID {
		return
	}
	body := m.Body
	if comp, _ := m.Headers["compression"].(string); comp != "" {
		var err error
		if body, err = protocol.Decompress(comp, body, 0); err != nil {
			c.log.Warn("rpc client: reply dropped: cannot decompress it", zap.String("correlation_id", m.Properties.CorrelationID), zap.Error(err))
			return
		}
	}
	meta, err := protocol.DecodeResult(body, m.ContentType, protocol.DecodeOptions{})
	if err != nil {
		c.log.Warn("rpc client: reply dropped: not a result", zap.String("correlation_id", m.Properties.CorrelationID), zap.Error(err))
		return
	}
	id := meta.TaskID
	if id == "" {
		id = m.Properties.CorrelationID
	}
	if id == "" {
		c.log.Warn("rpc client: reply dropped: no task id and no correlation id")
		return
	}
	c.record(id, meta.Status, body, m.ContentType)
}

// record keeps a task's new state and wakes its waiters when it is ready.
func (c *Client) record(id string, st protocol.State, body []byte, contentType string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	e := c.states[id]
	if e == nil {
		e = &entry{id: id, ready: make(chan struct{})}
		c.states[id] = e
	}
	if e.has && e.status.Ready() && (!st.Ready() || e.status == protocol.StateSuccess) {
		return
	}
	e.body, e.contentType, e.status, e.has = body, contentType, st, true
	if st.Ready() {
		select {
		case <-e.ready:
		default:
			close(e.ready)
		}
	}
	if e.waiters == 0 {
		c.touch(e)
	}
}

// touch makes e the most recently used idle entry and evicts beyond
// MaxStates. c.mu must be held.
func (c *Client) touch(e *entry) {
	if e.elem != nil {
		c.idle.MoveToFront(e.elem)
		return
	}
	e.elem = c.idle.PushFront(e)
	for c.idle.Len() > c.maxStates {
		old := c.idle.Remove(c.idle.Back()).(*entry)
		old.elem = nil
		delete(c.states, old.id)
		// Nobody waited for it; a later Get of this id sees PENDING, so say
		// which one went.
		c.log.Warn("rpc client: state dropped: more than MaxStates results arrived that nobody waited for",
			zap.String("task_id", old.id), zap.Int("max_states", c.maxStates))
	}
}

// meta decodes e's state. c.mu must be held.
func (e *entry) meta() (*protocol.ResultMeta, error) {
	m, err := protocol.DecodeResult(e.body, e.contentType, protocol.DecodeOptions{})
	if err != nil {
		return nil, fmt.Errorf("rpc client: state of %s: %w", e.id, err)
	}
	if m.TaskID == "" {
		m.TaskID = e.id
	}
	return m, nil
}

// ReplyTo returns the reply queue's name: the reply_to property of the task
// messages whose states the client receives.
func (c *Client) ReplyTo() string { return c.queue }

// Kind returns how the reply queue was declared: TransientQueue or
// ListQueue (what AutoQueue found).
func (c *Client) Kind() QueueKind { return c.kind }

// Wait blocks until a ready state (SUCCESS, FAILURE or REVOKED) of the task
// has arrived and returns it, like AsyncResult.get(propagate=False) on
// Celery's RPC backend. It returns at once when the state arrived before
// (unless MaxStates newer states pushed it out). It returns ctx's error
// when ctx ends first, backend.ErrClosed when the client is closed, and an
// error wrapping transport.ErrClosed when the reply queue stopped
// delivering (the transport was closed).
func (c *Client) Wait(ctx context.Context, taskID string) (*protocol.ResultMeta, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, backend.ErrClosed
	}
	e := c.states[taskID]
	if e == nil {
		e = &entry{id: taskID, ready: make(chan struct{})}
		c.states[taskID] = e
	}
	if e.elem != nil {
		c.idle.Remove(e.elem)
		e.elem = nil
	}
	e.waiters++
	c.mu.Unlock()
	defer c.leave(e)

	select {
	case <-e.ready:
	default:
		select {
		case <-e.ready:
		case <-c.done:
			select {
			case <-e.ready:
			default:
				return nil, c.doneErr()
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return e.meta()
}

// leave ends a Wait on e.
func (c *Client) leave(e *entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.waiters--
	if e.waiters > 0 || c.closed || c.states[e.id] != e {
		return
	}
	if !e.has {
		delete(c.states, e.id)
		return
	}
	c.touch(e)
}

func (c *Client) doneErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Get returns the latest state received for the task, or
// backend.ErrNotFound (Celery's PENDING) when none has arrived (or it was
// evicted, see MaxStates). After the reply queue stopped delivering, a task
// without a state gets that error instead.
func (c *Client) Get(ctx context.Context, taskID string) (*protocol.ResultMeta, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, backend.ErrClosed
	}
	e := c.states[taskID]
	if e == nil || !e.has {
		if c.err != nil {
			return nil, c.err
		}
		return nil, backend.ErrNotFound
	}
	if e.waiters == 0 {
		c.touch(e)
	}
	return e.meta()
}

// Store sends a state to r.ReplyTo, as [Backend.Store] does (the client's
// own queue when r.ReplyTo is ReplyTo()).
func (c *Client) Store(ctx context.Context, r backend.StoreRequest) error {
	return c.be.Store(ctx, r)
}

// Close stops consuming the reply queue (on RabbitMQ the broker then
// deletes it; a ListQueue is purged), wakes every Wait with
// backend.ErrClosed and waits for Store calls in progress. Later calls,
// including Close, return backend.ErrClosed. The transport stays open.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return backend.ErrClosed
	}
	c.closed = true
	if c.err == nil {
		c.err = backend.ErrClosed
		close(c.done)
	}
	c.mu.Unlock()
	err := c.stop()
	<-c.loopDone
	c.mu.Lock()
	c.states = map[string]*entry{}
	c.idle.Init()
	c.mu.Unlock()
	if berr := c.be.Close(); err == nil && !errors.Is(berr, backend.ErrClosed) {
		err = berr
	}
	if err != nil && !errors.Is(err, transport.ErrClosed) {
		return fmt.Errorf("rpc client: close reply queue %s: %w", c.queue, err)
	}
	return nil
}

// newUUID returns a random (version 4) UUID in its canonical text form.
func newUUID() (string, error) {
	var b [16]byte
	if _, err := crand.Read(b[:]); err != nil {
		return "", fmt.Errorf("rpc client: uuid: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], nil
}
