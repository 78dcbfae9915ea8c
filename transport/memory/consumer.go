package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/celeriac/celeriac/transport"
)

// batchMax bounds how many messages a consumer takes from its queues under
// one lock. Larger batches amortise locking; smaller ones spread a queue's
// messages more evenly over competing consumers with a large prefetch.
const batchMax = 32

type deliveryState uint8

const (
	statePending deliveryState = iota // handed out (or about to be), not settled
	stateSettled                      // acked, rejected or dead-lettered
	stateLost                         // returned to its queue by Transport.Close
)

// delivery is the broker side of a transport.Delivery. It is its own
// Acknowledger, so one allocation serves both.
type delivery struct {
	d     transport.Delivery
	e     *entry
	c     *consumer
	q     *queue
	seq   uint64
	state deliveryState // guarded by b.mu
}

// consumer hands out messages from a set of queues through one goroutine,
// run, which is the only sender on out and closes it.
type consumer struct {
	t       *Transport
	autoAck bool // broadcast subscriptions: delivered means settled

	// Guarded by t.b.mu.
	queues   []*queue
	specs    []transport.Queue // parallel to queues
	next     int               // round-robin position in queues
	prefetch int
	inflight int // taken from queues and not settled
	stopping bool
	err      error

	wake     chan struct{} // capacity 1: "look at the queues again"
	stopCh   chan struct{}
	done     chan struct{} // closed when run has returned
	out      chan *transport.Delivery
	stopOnce sync.Once
}

var _ transport.Consumer = (*consumer)(nil)

// Consume declares each queue as Celery declares it (a direct exchange named
// like the queue, bound with the queue name, unless q says otherwise) and
// starts delivering. Declaring a queue that exists with other arguments, or
// an exchange that exists with another type, fails with
// transport.ErrTopologyMismatch. A queue created by publishing to it has no
// arguments yet and takes those of its first declaration.
//
// Several consumers of one queue share its messages. One consumer takes from
// its queues in turn (round robin), and from each queue the highest
// priority first.
func (t *Transport) Consume(ctx context.Context, queues []transport.Queue, opts transport.ConsumeOptions) (transport.Consumer, error) {
	if opts.Prefetch < 0 {
		return nil, fmt.Errorf("memory: negative prefetch %d", opts.Prefetch)
	}
	if err := t.lock(ctx); err != nil {
		return nil, err
	}
	defer t.b.mu.Unlock()
	c := t.newConsumer(false)
	c.prefetch = opts.Prefetch
	for _, spec := range queues {
		if err := c.add(spec); err != nil {
			c.detach()
			return nil, err
		}
	}
	t.start(c)
	return c, nil
}

func (t *Transport) newConsumer(autoAck bool) *consumer {
	// A buffer lets the goroutine hand over a batch without a goroutine
	// switch per message. Buffered deliveries count against the prefetch,
	// as messages in an AMQP client's buffer do, and Stop takes back the
	// ones nobody received, which needs their Acknowledger: broadcast
	// subscriptions have none, so they go unbuffered.
	buffer := batchMax
	if autoAck {
		buffer = 0
	}
	return &consumer{
		t:       t,
		autoAck: autoAck,
		wake:    make(chan struct{}, 1),
		stopCh:  make(chan struct{}),
		done:    make(chan struct{}),
		out:     make(chan *transport.Delivery, buffer),
	}
}

// start registers c and starts its goroutine. b.mu must be held.
func (t *Transport) start(c *consumer) {
	t.consumers[c] = struct{}{}
	t.wg.Add(1)
	go c.run()
	c.signal()
}

func withDefaults(q transport.Queue) transport.Queue {
	if q.Exchange == "" {
		q.Exchange = q.Name
	}
	if q.ExchangeType == "" {
		q.ExchangeType = transport.Direct
	}
	if q.RoutingKey == "" {
		q.RoutingKey = q.Name
	}
	return q
}

// add declares spec's topology and starts consuming it. b.mu must be held.
func (c *consumer) add(spec transport.Queue) error {
	b := c.t.b
	if spec.Name == "" {
		return errors.New("memory: queue name is empty")
	}
	spec = withDefaults(spec)
	if slices.ContainsFunc(c.specs, func(s transport.Queue) bool { return s.Name == spec.Name }) {
		return nil
	}
	x, err := b.declareExchange(spec.Exchange, spec.ExchangeType)
	if err != nil {
		return err
	}
	q, err := b.declareQueue(spec.Name, spec.Arguments, false)
	if err != nil {
		return err
	}
	x.bind(spec.RoutingKey, q.name)
	c.attach(q, spec)
	return nil
}

// attach starts consuming q. b.mu must be held.
func (c *consumer) attach(q *queue, spec transport.Queue) {
	c.queues = append(c.queues, q)
	c.specs = append(c.specs, spec)
	q.consumers = append(q.consumers, c)
	c.signal()
}

// forget stops consuming q. b.mu must be held.
func (c *consumer) forget(q *queue) {
	if i := slices.Index(c.queues, q); i >= 0 {
		c.queues = slices.Delete(c.queues, i, i+1)
		c.specs = slices.Delete(c.specs, i, i+1)
	}
	q.consumers = slices.DeleteFunc(q.consumers, func(o *consumer) bool { return o == c })
	if q.autoDelete && len(q.consumers) == 0 && c.t.b.queues[q.name] == q {
		c.t.b.deleteQueue(q)
	}
}

// detach stops consuming every queue. b.mu must be held.
func (c *consumer) detach() {
	for len(c.queues) > 0 {
		c.forget(c.queues[len(c.queues)-1])
	}
}

func (c *consumer) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *consumer) run() {
	defer c.t.wg.Done()
	defer close(c.done)
	var batch []*delivery
	for {
		batch = c.take(batch[:0])
		for i, d := range batch {
			select {
			case c.out <- &d.d:
			case <-c.stopCh:
				c.finish(batch[i:])
				return
			}
		}
		clear(batch) // let settled deliveries be collected
		if len(batch) == 0 {
			select {
			case <-c.wake:
			case <-c.stopCh:
				c.finish(nil)
				return
			}
		}
	}
}

// take removes up to the free prefetch (at most batchMax) messages from the
// consumer's queues and makes deliveries of them.
func (c *consumer) take(buf []*delivery) []*delivery {
	b := c.t.b
	b.mu.Lock()
	if c.stopping {
		b.mu.Unlock()
		return buf
	}
	limit := batchMax
	if c.prefetch > 0 && !c.autoAck {
		limit = min(limit, c.prefetch-c.inflight)
	}
	for len(buf) < limit && len(c.queues) > 0 {
		var e *entry
		var q *queue
		for i := range c.queues {
			j := (c.next + i) % len(c.queues)
			if e = c.queues[j].ready.pop(); e != nil {
				q = c.queues[j]
				c.next = j + 1
				break
			}
		}
		if e == nil {
			break
		}
		d := &delivery{e: e, c: c, q: q, seq: b.nextSeq()}
		if !c.autoAck {
			d.d.Acknowledger = d
			c.inflight++
			q.unacked++
			c.t.unacked[d] = struct{}{}
		}
		buf = append(buf, d)
	}
	b.mu.Unlock()

	// Entries are immutable, so the copies are made outside the lock.
	if len(buf) > 0 {
		now := c.t.now()
		for _, d := range buf {
			d.d.Message = exportMessage(d.e.s)
			d.d.Queue = d.q.name
			d.d.Exchange = d.e.exchange
			d.d.RoutingKey = d.e.routingKey
			d.d.Redelivered = d.e.redelivered
			d.d.Tag = strconv.FormatUint(d.seq, 10)
			d.d.ReceivedAt = now
		}
	}
	return buf
}

// release forgets that d is in flight. b.mu must be held.
func (c *consumer) release(d *delivery) {
	if c.autoAck {
		return
	}
	delete(c.t.unacked, d)
	if c.prefetch > 0 && c.inflight >= c.prefetch {
		c.signal()
	}
	c.inflight--
	d.q.unacked--
}

// finish runs on run's way out: it returns the deliveries that were taken but
// never received, from the batch and from out's buffer, to the head of their
// queues, unmarked and in order, and closes out.
func (c *consumer) finish(batch []*delivery) {
	var unsent []*delivery
	for len(c.out) > 0 {
		select {
		case td := <-c.out:
			// Buffered deliveries are task deliveries: their Acknowledger
			// is the broker side.
			unsent = append(unsent, td.Acknowledger.(*delivery))
		default: // the reader took it first
		}
	}
	unsent = append(unsent, batch...) // the batch comes after the buffer
	b := c.t.b
	b.mu.Lock()
	for i := len(unsent) - 1; i >= 0; i-- {
		d := unsent[i]
		d.state = stateSettled
		c.release(d)
		b.enqueue(b.queueFor(d.q.name), d.e, true)
	}
	c.detach()
	delete(c.t.consumers, c)
	b.mu.Unlock()
	close(c.out)
}

func (c *consumer) stop(err error) {
	c.stopOnce.Do(func() {
		c.t.b.mu.Lock()
		c.stopping = true
		c.err = err
		c.t.b.mu.Unlock()
		close(c.stopCh)
	})
}

// Deliveries implements transport.Consumer.
func (c *consumer) Deliveries() <-chan *transport.Delivery { return c.out }

// SetPrefetch implements transport.Consumer. It takes effect at once: raising
// it hands out more messages immediately; lowering it holds further
// deliveries back until enough of those handed out are settled.
func (c *consumer) SetPrefetch(n int) error {
	if n < 0 {
		return fmt.Errorf("memory: negative prefetch %d", n)
	}
	b := c.t.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.stopping {
		return transport.ErrClosed
	}
	c.prefetch = n
	c.signal()
	return nil
}

// AddQueue implements transport.Consumer. Adding a queue already consumed
// does nothing.
func (c *consumer) AddQueue(ctx context.Context, q transport.Queue) error {
	if err := c.t.lock(ctx); err != nil {
		return err
	}
	defer c.t.b.mu.Unlock()
	if c.stopping {
		return transport.ErrClosed
	}
	return c.add(q)
}

// CancelQueue implements transport.Consumer. Deliveries of the queue already
// handed out stay valid. Cancelling a queue not consumed does nothing.
func (c *consumer) CancelQueue(ctx context.Context, name string) error {
	if err := c.t.lock(ctx); err != nil {
		return err
	}
	defer c.t.b.mu.Unlock()
	if c.stopping {
		return transport.ErrClosed
	}
	if i := slices.IndexFunc(c.specs, func(s transport.Queue) bool { return s.Name == name }); i >= 0 {
		c.forget(c.queues[i])
	}
	return nil
}

// Queues implements transport.Consumer; defaults are filled in.
func (c *consumer) Queues() []transport.Queue {
	c.t.b.mu.Lock()
	defer c.t.b.mu.Unlock()
	return slices.Clone(c.specs)
}

// Stop implements transport.Consumer. Messages taken from the queues but not
// yet received from Deliveries go back to the head of their queues, not
// marked redelivered. Stop waits for the consumer's goroutine, bounded by
// ctx.
func (c *consumer) Stop(ctx context.Context) error {
	c.stop(nil)
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Err implements transport.Consumer: nil after Stop, transport.ErrClosed
// after the transport was closed.
func (c *consumer) Err() error {
	c.t.b.mu.Lock()
	defer c.t.b.mu.Unlock()
	return c.err
}

type settleOp uint8

const (
	opAck settleOp = iota
	opReject
	opDeadLetter
)

// Ack implements transport.Acknowledger.
func (d *delivery) Ack(ctx context.Context, _ *transport.Delivery) error {
	return d.settle(ctx, opAck, false, transport.DeadLetterReason{})
}

// Reject implements transport.Acknowledger. With requeue the message goes
// back to the head of its queue marked redelivered; without, it is dropped,
// or kept in the dead-letter store with reason "rejected" when its queue was
// declared with x-dead-letter-exchange.
func (d *delivery) Reject(ctx context.Context, _ *transport.Delivery, requeue bool) error {
	return d.settle(ctx, opReject, requeue, transport.DeadLetterReason{})
}

// DeadLetter implements transport.Acknowledger: the message moves to the
// dead-letter store of its queue with r (r.Time defaults to now).
func (d *delivery) DeadLetter(ctx context.Context, _ *transport.Delivery, r transport.DeadLetterReason) error {
	return d.settle(ctx, opDeadLetter, false, r)
}

func (d *delivery) settle(ctx context.Context, op settleOp, requeue bool, r transport.DeadLetterReason) error {
	if ctx != nil {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	t := d.c.t
	b := t.b
	if (op == opDeadLetter || op == opReject && !requeue) && r.Time.IsZero() {
		r.Time = t.now()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch d.state {
	case stateSettled:
		return transport.ErrAlreadyAcknowledged
	case stateLost:
		return errLost
	}
	d.state = stateSettled
	d.c.release(d)
	switch op {
	case opReject:
		if requeue {
			d.e.redelivered = true
			b.enqueue(b.queueFor(d.q.name), d.e, true)
		} else if q := b.queues[d.q.name]; q != nil && q.dlx {
			r.Reason = "rejected"
			b.addDead(d.q.name, d.e, r)
		}
	case opDeadLetter:
		b.addDead(d.q.name, d.e, r)
	}
	return nil
}

// subscription is a broadcast subscription: an auto-delete queue bound to
// the exchange, consumed without acknowledgements.
type subscription struct {
	c *consumer
}

// Subscribe binds a queue to the broadcast exchange b.Exchange (declared
// with b.ExchangeType, Fanout by default) with b.BindingKey, and delivers its
// messages without acknowledgement. The queue is b.Queue, or a generated
// "amq.gen-N" name; it is deleted when its last subscription closes, and
// subscriptions naming the same queue share its messages, as on RabbitMQ.
// Topic binding keys use AMQP semantics: "*" is one word, "#" zero or more.
// Messages published while no queue is bound are lost, as on every broker.
func (t *Transport) Subscribe(ctx context.Context, bc transport.Broadcast) (transport.Subscription, error) {
	if bc.Exchange == "" {
		return nil, errors.New("memory: broadcast exchange name is empty")
	}
	kind := bc.ExchangeType
	if kind == "" {
		kind = transport.Fanout
	}
	if err := t.lock(ctx); err != nil {
		return nil, err
	}
	defer t.b.mu.Unlock()
	x, err := t.b.declareExchange(bc.Exchange, kind)
	if err != nil {
		return nil, err
	}
	name := bc.Queue
	if name == "" {
		name = "amq.gen-" + strconv.FormatUint(t.b.nextSeq(), 10)
	}
	q, err := t.b.declareQueue(name, bc.QueueArguments, true)
	if err != nil {
		return nil, err
	}
	x.bind(bc.BindingKey, q.name)
	c := t.newConsumer(true)
	c.attach(q, transport.Queue{Name: q.name, Exchange: x.name, ExchangeType: x.kind, RoutingKey: bc.BindingKey, Arguments: bc.QueueArguments})
	t.start(c)
	return &subscription{c: c}, nil
}

// Deliveries implements transport.Subscription.
func (s *subscription) Deliveries() <-chan *transport.Delivery { return s.c.out }

// Close implements transport.Subscription. It is idempotent.
func (s *subscription) Close() error {
	s.c.stop(nil)
	<-s.c.done
	return nil
}
