package memory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/celeriac/celeriac/transport"
)

// Queue arguments the broker interprets. Others are stored and compared (for
// ErrTopologyMismatch) but have no effect.
const (
	// ArgMaxPriority caps message priorities in a queue, as RabbitMQ's
	// x-max-priority does: a higher priority counts as the cap.
	ArgMaxPriority = "x-max-priority"
	// ArgDeadLetterExchange makes Reject without requeue keep the message in
	// the dead-letter store (reason "rejected") instead of dropping it. The
	// value is not used for routing.
	ArgDeadLetterExchange = "x-dead-letter-exchange"
)

// maxPriority is the highest priority a message can have, as in AMQP where
// the priority property is one octet.
const maxPriority = 255

// Broker is the in-process broker: queues, exchanges with their bindings and
// the dead-letter store. It outlives the transports connected to it, as a
// real broker outlives its connections: messages a closed transport did not
// settle stay in the broker for the next one. A Broker needs no closing; it
// holds no goroutines and is collected once unreferenced.
type Broker struct {
	mu        sync.Mutex
	queues    map[string]*queue
	exchanges map[string]*exchange
	dead      map[string][]*deadEntry
	// seq numbers deliveries, dead messages and generated queue names.
	seq        uint64
	unroutable int64
}

// NewBroker returns an empty broker.
func NewBroker() *Broker {
	return &Broker{
		queues:    map[string]*queue{},
		exchanges: map[string]*exchange{},
		dead:      map[string][]*deadEntry{},
	}
}

// Stats is a snapshot of a broker's counters, for tests.
type Stats struct {
	// Queues is the number of queues.
	Queues int
	// Ready is the number of messages waiting in queues.
	Ready int
	// Unacked is the number of messages handed to consumers and not yet
	// settled.
	Unacked int
	// Dead is the number of messages in the dead-letter store.
	Dead int
	// Unroutable counts messages published to a named exchange that no
	// binding matched; they were dropped, as RabbitMQ drops them.
	Unroutable int64
}

// Stats returns a snapshot of the broker's counters.
func (b *Broker) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := Stats{Queues: len(b.queues), Unroutable: b.unroutable}
	for _, q := range b.queues {
		s.Ready += q.ready.len()
		s.Unacked += q.unacked
	}
	for _, d := range b.dead {
		s.Dead += len(d)
	}
	return s
}

type queue struct {
	name string
	args map[string]any
	// declared is false for a queue created by publishing to it; the first
	// declaration then sets its arguments.
	declared bool
	// capPriority is x-max-priority, or maxPriority.
	capPriority int
	// dlx: rejected messages go to the dead-letter store.
	dlx       bool
	ready     readyQueue
	consumers []*consumer
	// unacked counts deliveries of this queue handed out and not settled
	// (for Stats only).
	unacked int
	// autoDelete queues (broadcast subscriptions) are deleted when their last
	// consumer goes.
	autoDelete bool
}

type exchange struct {
	name     string
	kind     string
	bindings []binding
}

type binding struct {
	key   string
	queue string
}

type deadEntry struct {
	id     string
	queue  string
	e      *entry
	reason transport.DeadLetterReason
}

// nextSeq returns a fresh sequence number. b.mu must be held.
func (b *Broker) nextSeq() uint64 {
	b.seq++
	return b.seq
}

// declareQueue creates q or checks it against the existing queue. b.mu must
// be held.
func (b *Broker) declareQueue(name string, args map[string]any, autoDelete bool) (*queue, error) {
	if name == "" {
		return nil, errors.New("memory: queue name is empty")
	}
	capPriority := maxPriority
	if v, ok := args[ArgMaxPriority]; ok {
		n, ok := intArg(v)
		if !ok || n < 0 || n > maxPriority {
			return nil, fmt.Errorf("memory: queue %q: %s must be an integer from 0 to %d, got %v", name, ArgMaxPriority, maxPriority, v)
		}
		capPriority = int(n)
	}
	if q, ok := b.queues[name]; ok {
		if !q.declared {
			q.declared = true
			q.args = maps.Clone(args)
			q.capPriority = capPriority
			q.dlx = args[ArgDeadLetterExchange] != nil
			q.autoDelete = autoDelete
			return q, nil
		}
		if !argsEqual(q.args, args) {
			return nil, fmt.Errorf("%w: queue %q has arguments %v, declared with %v", transport.ErrTopologyMismatch, name, q.args, args)
		}
		return q, nil
	}
	q := &queue{
		name:        name,
		args:        maps.Clone(args),
		declared:    true,
		capPriority: capPriority,
		dlx:         args[ArgDeadLetterExchange] != nil,
		autoDelete:  autoDelete,
	}
	b.queues[name] = q
	return q, nil
}

// queueFor returns the queue to put a message into, creating an undeclared
// queue as the Redis transport does. b.mu must be held.
func (b *Broker) queueFor(name string) *queue {
	q, ok := b.queues[name]
	if !ok {
		q = &queue{name: name, capPriority: maxPriority}
		b.queues[name] = q
	}
	return q
}

func intArg(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	}
	return 0, false
}

// argsEqual compares declaration arguments as RabbitMQ does, ignoring the Go
// integer type (x-max-priority 10 as int or int64 is the same argument).
func argsEqual(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, va := range a {
		vb, ok := b[k]
		if !ok {
			return false
		}
		na, oka := intArg(va)
		nb, okb := intArg(vb)
		if oka && okb {
			if na != nb {
				return false
			}
			continue
		}
		if !reflect.DeepEqual(va, vb) {
			return false
		}
	}
	return true
}

// declareExchange creates the exchange or checks its type. b.mu must be held.
func (b *Broker) declareExchange(name, kind string) (*exchange, error) {
	if kind == "" {
		kind = transport.Direct
	}
	switch kind {
	case transport.Direct, transport.Fanout, transport.Topic:
	default:
		return nil, fmt.Errorf("memory: exchange %q: unsupported type %q", name, kind)
	}
	if x, ok := b.exchanges[name]; ok {
		if x.kind != kind {
			return nil, fmt.Errorf("%w: exchange %q is %s, declared as %s", transport.ErrTopologyMismatch, name, x.kind, kind)
		}
		return x, nil
	}
	x := &exchange{name: name, kind: kind}
	b.exchanges[name] = x
	return x, nil
}

func (x *exchange) bind(key, queue string) {
	if x.kind == transport.Fanout {
		key = ""
	}
	for _, bd := range x.bindings {
		if bd.key == key && bd.queue == queue {
			return
		}
	}
	x.bindings = append(x.bindings, binding{key: key, queue: queue})
}

// route returns the names of the queues a message goes to, each once, in
// binding order. b.mu must be held.
func (b *Broker) route(exchangeName, key string) []string {
	if exchangeName == "" {
		return []string{key}
	}
	x, ok := b.exchanges[exchangeName]
	if !ok {
		return nil
	}
	var out []string
	for _, bd := range x.bindings {
		var match bool
		switch x.kind {
		case transport.Fanout:
			match = true
		case transport.Direct:
			match = bd.key == key
		case transport.Topic:
			match = topicMatch(bd.key, key)
		}
		if match && !slices.Contains(out, bd.queue) {
			out = append(out, bd.queue)
		}
	}
	return out
}

// enqueue appends e to q and wakes its consumers. b.mu must be held.
func (b *Broker) enqueue(q *queue, e *entry, front bool) {
	e.priority = min(max(e.s.msg.Properties.Priority, 0), q.capPriority)
	if front {
		q.ready.pushFront(e)
	} else {
		q.ready.pushBack(e)
	}
	for _, c := range q.consumers {
		c.signal()
	}
}

// deleteQueue removes a queue, its bindings, and its consumers' interest in
// it. b.mu must be held.
func (b *Broker) deleteQueue(q *queue) int {
	n := q.ready.clear()
	delete(b.queues, q.name)
	for _, x := range b.exchanges {
		x.bindings = slices.DeleteFunc(x.bindings, func(bd binding) bool { return bd.queue == q.name })
	}
	for _, c := range q.consumers {
		c.forget(q)
	}
	q.consumers = nil
	return n
}

// Config configures a Transport. The zero value is ready to use.
type Config struct {
	// Broker is the broker to connect to. Nil creates a private broker,
	// reachable by other transports through [Transport.Broker].
	Broker *Broker
	// Now is the clock for Delivery.ReceivedAt and for dead-letter times
	// left zero by the caller. Nil means time.Now.
	Now func() time.Time
}

// Transport is one connection to a [Broker]. It implements
// transport.Transport, transport.Admin and transport.DeadLetterStore and is
// safe for concurrent use.
type Transport struct {
	b   *Broker
	now func() time.Time

	// Fields below are guarded by b.mu.
	closed    bool
	consumers map[*consumer]struct{}
	// unacked holds the deliveries handed out by this transport's consumers
	// and not settled; Close requeues them.
	unacked map[*delivery]struct{}

	wg sync.WaitGroup // consumer goroutines
}

var (
	_ transport.Transport       = (*Transport)(nil)
	_ transport.Admin           = (*Transport)(nil)
	_ transport.DeadLetterStore = (*Transport)(nil)
)

// New connects a transport to cfg.Broker (a new private broker when nil).
func New(cfg Config) *Transport {
	b := cfg.Broker
	if b == nil {
		b = NewBroker()
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &Transport{
		b:         b,
		now:       now,
		consumers: map[*consumer]struct{}{},
		unacked:   map[*delivery]struct{}{},
	}
}

// Broker returns the broker t is connected to, so that more transports can
// connect to it (New(Config{Broker: t.Broker()})).
func (t *Transport) Broker() *Broker { return t.b }

// lock takes the broker lock and reports ErrClosed when t is closed; on error
// the lock is not held.
func (t *Transport) lock(ctx context.Context) error {
	if ctx != nil {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	t.b.mu.Lock()
	if t.closed {
		t.b.mu.Unlock()
		return transport.ErrClosed
	}
	return nil
}

// Publish routes a deep copy of p.Message: exchange "" puts it in the queue
// named by the routing key (created when missing, as Redis does); a named
// exchange routes it through the bindings Consume and Subscribe created, and
// a message no binding matches is dropped and counted in [Stats.Unroutable],
// as RabbitMQ drops it. Header and property values are converted to the
// protocol value types; a value of another type is an error. The message is
// in its queues when Publish returns, so NoConfirm changes nothing.
func (t *Transport) Publish(ctx context.Context, p *transport.Publishing) error {
	if p == nil {
		return errors.New("memory: nil publishing")
	}
	if p.Exchange == "" && p.RoutingKey == "" {
		return errors.New("memory: publishing to the default exchange needs a routing key (the queue name)")
	}
	s, err := importMessage(&p.Message)
	if err != nil {
		return err
	}
	if err := t.lock(ctx); err != nil {
		return err
	}
	defer t.b.mu.Unlock()
	names := t.b.route(p.Exchange, p.RoutingKey)
	if len(names) == 0 {
		t.b.unroutable++
		return nil
	}
	// One allocation holds the stored message and the first queue's entry:
	// most publications go to one queue.
	first := &struct {
		e entry
		s stored
	}{s: s}
	for i, name := range names {
		e := &first.e
		if i > 0 {
			e = &entry{}
		}
		*e = entry{s: &first.s, exchange: p.Exchange, routingKey: p.RoutingKey}
		t.b.enqueue(t.b.queueFor(name), e, false)
	}
	return nil
}

// Len returns the number of ready messages in a queue; 0 for a queue that
// does not exist.
func (t *Transport) Len(ctx context.Context, queue string) (int, error) {
	if err := t.lock(ctx); err != nil {
		return 0, err
	}
	defer t.b.mu.Unlock()
	if q, ok := t.b.queues[queue]; ok {
		return q.ready.len(), nil
	}
	return 0, nil
}

// Purge deletes the ready messages of a queue and returns how many. Messages
// handed out and not settled are not ready and survive, as on RabbitMQ.
func (t *Transport) Purge(ctx context.Context, queue string) (int, error) {
	if err := t.lock(ctx); err != nil {
		return 0, err
	}
	defer t.b.mu.Unlock()
	if q, ok := t.b.queues[queue]; ok {
		return q.ready.clear(), nil
	}
	return 0, nil
}

// DeleteQueue deletes a queue with its ready messages and bindings; its
// consumers stop consuming it. Deleting a missing queue is not an error.
// Unsettled deliveries of the queue stay valid; requeueing one recreates the
// queue.
func (t *Transport) DeleteQueue(ctx context.Context, queue string) error {
	if err := t.lock(ctx); err != nil {
		return err
	}
	defer t.b.mu.Unlock()
	if q, ok := t.b.queues[queue]; ok {
		t.b.deleteQueue(q)
	}
	return nil
}

// DeadLetters lists up to limit dead messages of a queue, oldest first.
func (t *Transport) DeadLetters(ctx context.Context, queue string, limit int) ([]transport.DeadMessage, error) {
	if err := t.lock(ctx); err != nil {
		return nil, err
	}
	defer t.b.mu.Unlock()
	dead := t.b.dead[queue]
	if limit > 0 && limit < len(dead) {
		dead = dead[:limit]
	}
	out := make([]transport.DeadMessage, len(dead))
	for i, d := range dead {
		out[i] = transport.DeadMessage{
			ID:         d.id,
			Queue:      d.queue,
			Exchange:   d.e.exchange,
			RoutingKey: d.e.routingKey,
			Message:    exportMessage(d.e.s),
			Reason:     d.reason,
		}
	}
	return out, nil
}

// Replay moves dead messages back to the tail of the queue they were
// consumed from, as new messages (not marked redelivered). Ids that are not
// in the store are skipped. The move is atomic.
func (t *Transport) Replay(ctx context.Context, queue string, ids []string, opts transport.ReplayOptions) (int, error) {
	if err := t.lock(ctx); err != nil {
		return 0, err
	}
	defer t.b.mu.Unlock()
	moved := t.b.takeDead(queue, ids)
	for _, d := range moved {
		e := &entry{s: d.e.s, exchange: d.e.exchange, routingKey: d.e.routingKey}
		if opts.ResetRetries {
			// Stored messages may be shared (fanout) and are immutable:
			// change a copy.
			s := *e.s
			s.msg.Headers = maps.Clone(s.msg.Headers)
			if s.msg.Headers == nil {
				s.msg.Headers = map[string]any{}
			}
			s.msg.Headers["retries"] = int64(0)
			e.s = &s
		}
		t.b.enqueue(t.b.queueFor(d.queue), e, false)
	}
	return len(moved), nil
}

// PurgeDead deletes dead messages (all of the queue's when ids is empty) and
// returns how many.
func (t *Transport) PurgeDead(ctx context.Context, queue string, ids []string) (int, error) {
	if err := t.lock(ctx); err != nil {
		return 0, err
	}
	defer t.b.mu.Unlock()
	return len(t.b.takeDead(queue, ids)), nil
}

// takeDead removes and returns the dead messages of queue with the given ids
// (all when ids is empty), oldest first. b.mu must be held.
func (b *Broker) takeDead(queue string, ids []string) []*deadEntry {
	dead := b.dead[queue]
	var taken, kept []*deadEntry
	if len(ids) == 0 {
		taken = dead
	} else {
		for _, d := range dead {
			if slices.Contains(ids, d.id) {
				taken = append(taken, d)
			} else {
				kept = append(kept, d)
			}
		}
	}
	if len(kept) == 0 {
		delete(b.dead, queue)
	} else {
		b.dead[queue] = kept
	}
	return taken
}

// addDead stores e as a dead message of queue. b.mu must be held.
func (b *Broker) addDead(queue string, e *entry, r transport.DeadLetterReason) {
	e.redelivered = false
	b.dead[queue] = append(b.dead[queue], &deadEntry{
		id:     "dead-" + strconv.FormatUint(b.nextSeq(), 10),
		queue:  queue,
		e:      e,
		reason: r,
	})
}

// Close stops every consumer and subscription of t and returns each
// delivery it handed out and did not settle to the head of its queue,
// marked redelivered, in the order they were delivered. Settling such a
// delivery afterwards fails with an error matching both transport.ErrClosed
// and transport.ErrStaleDelivery. Close is idempotent.
func (t *Transport) Close() error {
	t.b.mu.Lock()
	if t.closed {
		t.b.mu.Unlock()
		return nil
	}
	t.closed = true
	cs := slices.Collect(maps.Keys(t.consumers))
	t.b.mu.Unlock()

	for _, c := range cs {
		c.stop(transport.ErrClosed)
	}
	t.wg.Wait()

	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	ds := slices.Collect(maps.Keys(t.unacked))
	// Requeue newest first at the head, so the oldest ends up first.
	slices.SortFunc(ds, func(a, b *delivery) int { return cmp.Compare(b.seq, a.seq) })
	for _, d := range ds {
		d.state = stateLost
		d.c.release(d)
		d.e.redelivered = true
		t.b.enqueue(t.b.queueFor(d.d.Queue), d.e, true)
	}
	clear(t.unacked)
	clear(t.consumers)
	return nil
}

// errLost is returned when settling a delivery that Close returned to its
// queue: the transport is closed and the message will be redelivered.
var errLost = fmt.Errorf("memory: delivery returned to its queue by Close: %w (%w)", transport.ErrClosed, transport.ErrStaleDelivery)
