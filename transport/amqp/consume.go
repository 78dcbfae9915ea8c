package amqp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/transport"
)

// maxPrefetch is the largest AMQP prefetch count; Celery turns larger values
// into 0 (unlimited), and so does SetPrefetch.
const maxPrefetch = 65535

// Consume declares the queues (see Config.Declare) and consumes them all on
// one channel with manual acknowledgements and basic.qos prefetch
// opts.Prefetch (0: unlimited; above 65535: unlimited, as Celery does). The
// consumer survives connection and channel losses: it reconnects,
// redeclares, and resumes with the current prefetch, while Deliveries stays
// open; deliveries handed out before the loss then fail their
// acknowledgement with transport.ErrStaleDelivery, and the broker delivers
// them again. Cancelling ctx aborts the setup only.
//
// Consume returns a *MismatchError under StrictTopology when a queue exists
// with other arguments. opts.PerQueuePrefetch gives each queue its own
// window (per-consumer QoS) on the one channel.
func (t *Transport) Consume(ctx context.Context, queues []transport.Queue, opts transport.ConsumeOptions) (transport.Consumer, error) {
	if opts.Prefetch < 0 {
		return nil, fmt.Errorf("amqp: negative prefetch %d", opts.Prefetch)
	}
	c := &consumer{
		t:        t,
		id:       t.seq.Add(1),
		out:      make(chan *transport.Delivery),
		prefetch: clampPrefetch(opts.Prefetch),
		window:   clampPrefetch(opts.Prefetch),
		perQueue: opts.PerQueuePrefetch,
		done:     make(chan struct{}),
	}
	c.log = t.s.log.With(zap.Uint64("consumer", c.id))
	for _, q := range queues {
		qs, err := newQueueState(t.s, q)
		if err != nil {
			return nil, err
		}
		if c.queueIndex(qs.q.Name) >= 0 {
			return nil, fmt.Errorf("amqp: queue %q listed twice", q.Name)
		}
		c.queues = append(c.queues, qs)
	}
	life, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.stopping = life.Done()

	var prev *session
	for {
		if t.isClosed() {
			cancel()
			return nil, transport.ErrClosed
		}
		sess, err := t.con.next(ctx, prev)
		if err != nil {
			cancel()
			return nil, err
		}
		c.opMu.Lock()
		cs, err := c.establish(sess)
		c.opMu.Unlock()
		if err == nil {
			if err := t.startConsumer(c, func() { c.run(life, cs) }); err != nil {
				cancel()
				cs.kill()
				cs.fw.Wait()
				return nil, err
			}
			return c, nil
		}
		switch {
		case globalQoSRefused(err) && !sess.isLost():
			prev = nil // retry at once, now with per-consumer QoS
		case isConnectionError(err, sess):
			prev = sess
		default:
			cancel()
			return nil, err
		}
	}
}

// startConsumer registers c and starts its loop, unless the transport is
// closed. Doing both under t.mu orders every wg.Add before Close's Wait.
func (t *Transport) startConsumer(c *consumer, run func()) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return transport.ErrClosed
	}
	t.consumers[c] = struct{}{}
	t.wg.Go(run)
	return nil
}

func clampPrefetch(n int) int {
	if n > maxPrefetch {
		return 0
	}
	return n
}

// consumer implements transport.Consumer: one channel, one basic.consume per
// queue, one forwarding goroutine per queue feeding out.
type consumer struct {
	t   *Transport
	id  uint64
	log *zap.Logger
	out chan *transport.Delivery

	// opMu serialises the operations that change the channel: establishing
	// it, SetPrefetch, AddQueue, CancelQueue and the teardown.
	opMu sync.Mutex

	mu       sync.Mutex
	queues   []*queueState
	prefetch int
	// window is the per-consumer basic.qos in force with per-consumer
	// QoS: the prefetch, grown and shrunk geometrically (see nextWindow).
	window int
	// perQueue is ConsumeOptions.PerQueuePrefetch: per-consumer QoS
	// whatever Config.QoS says.
	perQueue bool
	cs       *chanSession
	err      error
	stopped  bool

	cancel   context.CancelFunc // stops the loop
	stopping <-chan struct{}    // closed when the loop is told to stop
	done     chan struct{}      // closed when the loop has exited and out is closed
}

var _ transport.Consumer = (*consumer)(nil)

// chanSession is one channel of a consumer, from open to death.
type chanSession struct {
	c        *consumer
	sess     *session
	ch       *amqp091.Channel
	closed   chan *amqp091.Error // NotifyClose
	global   bool
	stopping <-chan struct{}

	dead    atomic.Bool
	died    chan struct{} // closed when dead is set
	stopped atomic.Bool   // consumer stopped; close the channel once idle
	idle    sync.Once     // closes the channel of a stopped consumer
	fw      sync.WaitGroup
	pending atomic.Int64 // deliveries handed out and not settled
	acks    *acker

	mu        sync.Mutex
	tags      map[string]string // queue → consumer tag, for consumers we did not cancel
	cancelled []string          // queues whose consumer the broker cancelled
	kick      chan struct{}     // signals cancelled
}

func (cs *chanSession) isDead() bool { return cs.dead.Load() || cs.ch.IsClosed() }

// kill marks the channel dead and closes it (the broker requeues its
// unacknowledged deliveries).
func (cs *chanSession) kill() {
	if !cs.dead.Swap(true) {
		close(cs.died)
	}
	if !cs.ch.IsClosed() {
		_ = cs.ch.Close()
	}
}

func (c *consumer) queueIndex(name string) int {
	return slices.IndexFunc(c.queues, func(q *queueState) bool { return q.q.Name == name })
}

// global decides the basic.qos global flag for the current queues.
func (c *consumer) global() bool {
	if c.perQueue {
		return false
	}
	switch c.t.s.QoS {
	case QoSGlobal:
		return true
	case QoSPerConsumer:
		return false
	}
	return !slices.ContainsFunc(c.queues, func(q *queueState) bool { return q.quorum })
}

// establish declares the queues, opens a channel, sets the prefetch and
// consumes every queue. The caller holds opMu.
func (c *consumer) establish(sess *session) (*chanSession, error) {
	c.mu.Lock()
	queues := slices.Clone(c.queues)
	prefetch := c.prefetch
	c.mu.Unlock()

	tp := &topo{sess: sess}
	defer tp.close()
	for _, qs := range queues {
		if err := declareQueue(c.t.s, tp, qs); err != nil {
			return nil, err
		}
	}
	if err := c.t.setupDelayed(tp, queues, c.log); err != nil {
		return nil, err
	}
	ch, err := sess.conn.Channel()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	global := c.global()
	if !global {
		prefetch = c.window
	}
	c.mu.Unlock()
	cs := &chanSession{
		c:        c,
		sess:     sess,
		ch:       ch,
		closed:   ch.NotifyClose(make(chan *amqp091.Error, 1)),
		global:   global,
		stopping: c.stopping,
		tags:     make(map[string]string),
		kick:     make(chan struct{}, 1),
		died:     make(chan struct{}),
	}
	cs.acks = newAcker(ch, cs.release)
	if err := ch.Qos(prefetch, 0, global); err != nil {
		cs.kill()
		return nil, fmt.Errorf("amqp: basic.qos: %w", err)
	}
	for _, qs := range queues {
		if err := cs.consume(qs.q.Name); err != nil {
			if globalQoSRefused(err) {
				// RabbitMQ refuses global QoS on quorum queues (and closes
				// the connection); consume this queue per consumer from
				// now on.
				qs.quorum = true
				c.log.Warn("amqp queue refuses global QoS (a quorum queue); using per-consumer prefetch",
					zap.String("queue", qs.q.Name))
			}
			cs.kill()
			cs.fw.Wait()
			return nil, err
		}
	}
	c.mu.Lock()
	c.cs = cs
	c.mu.Unlock()
	return cs, nil
}

func globalQoSRefused(err error) bool {
	var ae *amqp091.Error
	return errors.As(err, &ae) && ae.Code == amqp091.NotImplemented && strings.Contains(ae.Reason, "global qos")
}

// consume starts consuming queue on the channel and its forwarder.
func (cs *chanSession) consume(queue string) error {
	tag := "celeriac." + strconv.FormatUint(cs.c.id, 10) + "." + strconv.FormatUint(cs.c.t.seq.Add(1), 10)
	in, err := cs.ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("amqp: consume %q: %w", queue, err)
	}
	cs.mu.Lock()
	cs.tags[queue] = tag
	cs.mu.Unlock()
	cs.fw.Add(1)
	go cs.forward(queue, tag, in)
	return nil
}

// cancel stops consuming queue; deliveries already on their way are still
// handed out by its forwarder.
func (cs *chanSession) cancel(queue string) error {
	cs.mu.Lock()
	tag, ok := cs.tags[queue]
	delete(cs.tags, queue)
	cs.mu.Unlock()
	if !ok || cs.isDead() {
		return nil
	}
	if err := cs.ch.Cancel(tag, false); err != nil && !cs.isDead() {
		return fmt.Errorf("amqp: cancel consumer of %q: %w", queue, err)
	}
	return nil
}

// forward converts the deliveries of one queue and hands them out. Once the
// consumer stops, deliveries not handed out are returned to the queue.
func (cs *chanSession) forward(queue, tag string, in <-chan amqp091.Delivery) {
	defer cs.fw.Done()
	c := cs.c
	for d := range in {
		del, err := newDelivery(cs, queue, &d)
		if err != nil {
			c.log.Error("amqp message with unreadable headers; rejecting it without requeue (a dead-letter exchange keeps it)",
				zap.String("queue", queue), zap.Uint64("delivery_tag", d.DeliveryTag), zap.Error(err))
			if cs.ch.Reject(d.DeliveryTag, false) == nil {
				cs.acks.settled(d.DeliveryTag)
			}
			continue
		}
		cs.pending.Add(1)
		select {
		case c.out <- &del.Delivery:
		case <-cs.stopping:
			del.settled.Store(true)
			cs.pending.Add(-1)
			if cs.ch.Reject(d.DeliveryTag, true) == nil {
				cs.acks.settled(d.DeliveryTag)
			}
		case <-cs.died:
			// Not handed out: the broker delivers it again on the next
			// channel, where its acknowledgement can succeed.
			del.settled.Store(true)
			cs.pending.Add(-1)
		case <-cs.sess.lost:
			del.settled.Store(true)
			cs.pending.Add(-1)
		}
	}
	// The delivery channel closes when the channel dies, when we cancel, or
	// when the broker cancels (the queue was deleted): only the last needs
	// the loop's attention.
	cs.mu.Lock()
	brokerCancel := cs.tags[queue] == tag && !cs.isDead()
	if brokerCancel {
		delete(cs.tags, queue)
		cs.cancelled = append(cs.cancelled, queue)
	}
	cs.mu.Unlock()
	if brokerCancel {
		select {
		case cs.kick <- struct{}{}:
		default:
		}
	}
}

// run is the consumer's loop: it watches the channel and replaces it after
// a loss until the consumer stops.
func (c *consumer) run(ctx context.Context, cs *chanSession) {
	defer close(c.done)
	defer close(c.out)
	for {
		c.serve(ctx, cs)
		if ctx.Err() != nil {
			c.teardown(cs)
			return
		}
		cs.kill()
		cs.fw.Wait()
		if cs = c.reestablish(ctx, cs.sess); cs == nil {
			c.mu.Lock()
			c.stopped = true
			c.mu.Unlock()
			c.t.unregister(c, nil)
			return
		}
	}
}

// serve returns when ctx ends or the channel is unusable.
func (c *consumer) serve(ctx context.Context, cs *chanSession) {
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-cs.closed:
			if ok && e != nil && !cs.sess.isLost() {
				c.log.Warn("amqp consumer channel closed by the broker; reopening", zap.Error(e))
			}
			return
		case <-cs.sess.lost:
			return
		case <-cs.kick:
			cs.mu.Lock()
			queues := cs.cancelled
			cs.cancelled = nil
			cs.mu.Unlock()
			for _, q := range queues {
				c.log.Warn("amqp broker cancelled the consumer (queue deleted?); redeclaring", zap.String("queue", q))
				if err := c.resume(cs, q); err != nil {
					c.log.Warn("amqp could not resume consuming; reopening the channel",
						zap.String("queue", q), zap.Error(err))
					return
				}
			}
		}
	}
}

// resume redeclares and consumes a queue whose consumer the broker
// cancelled, if it is still wanted.
func (c *consumer) resume(cs *chanSession, queue string) error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	i := c.queueIndex(queue)
	var qs *queueState
	if i >= 0 {
		qs = c.queues[i]
	}
	c.mu.Unlock()
	if qs == nil {
		return nil
	}
	tp := &topo{sess: cs.sess}
	defer tp.close()
	if err := declareQueue(c.t.s, tp, qs); err != nil {
		return err
	}
	if err := c.t.setupDelayed(tp, []*queueState{qs}, c.log); err != nil {
		return err
	}
	return cs.consume(queue)
}

// reestablish replaces a dead channel, reconnecting as needed, with backoff
// between failed attempts. It returns nil when the consumer stops or fails
// for good (c.err says why).
func (c *consumer) reestablish(ctx context.Context, sess *session) *chanSession {
	for attempt := 0; ; attempt++ {
		if sess.isLost() {
			next, err := c.t.con.next(ctx, sess)
			if err != nil {
				return nil
			}
			sess = next
		}
		c.opMu.Lock()
		cs, err := c.establish(sess)
		c.opMu.Unlock()
		switch {
		case err == nil:
			c.log.Info("amqp consumer resumed", zap.Uint64("session", sess.id))
			return cs
		case ctx.Err() != nil:
			return nil
		case permanent(err):
			c.log.Error("amqp consumer failed for good", zap.Error(err))
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			return nil
		case globalQoSRefused(err) && !sess.isLost():
			continue // now with per-consumer QoS
		case isConnectionError(err, sess):
			next, err := c.t.con.next(ctx, sess)
			if err != nil {
				return nil
			}
			sess = next
			continue
		}
		d := c.t.s.pause(attempt)
		c.log.Warn("amqp consumer could not resume; retrying", zap.Duration("retry_in", d), zap.Error(err))
		tm := time.NewTimer(d)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return nil
		}
	}
}

// permanent reports errors that retrying will not fix.
func permanent(err error) bool {
	var mm *MismatchError
	if errors.As(err, &mm) {
		return true
	}
	var ae *amqp091.Error
	return errors.As(err, &ae) && ae.Code == amqp091.AccessRefused
}

// teardown stops consuming after Stop or Close: it cancels the broker-side
// consumers, returns undelivered messages to their queues, and leaves the
// channel open for the deliveries still held until they are settled.
func (c *consumer) teardown(cs *chanSession) {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	cs.mu.Lock()
	queues := make([]string, 0, len(cs.tags))
	for q := range cs.tags {
		queues = append(queues, q)
	}
	cs.mu.Unlock()
	for _, q := range queues {
		_ = cs.cancel(q)
	}
	cs.fw.Wait()
	cs.stopped.Store(true)
	if cs.pending.Load() == 0 {
		cs.closeIdle()
	}
}

// closeIdle closes the channel of a stopped consumer once nothing it handed
// out is pending, and forgets the consumer.
func (cs *chanSession) closeIdle() {
	cs.idle.Do(func() {
		cs.kill()
		cs.c.t.unregister(cs.c, nil)
	})
}

// shutdown tells the loop to stop; it does not wait.
func (c *consumer) shutdown() { c.cancel() }

// closeChannel closes the current channel (transport Close).
func (c *consumer) closeChannel() {
	c.mu.Lock()
	cs := c.cs
	c.mu.Unlock()
	if cs != nil {
		cs.kill()
	}
}

// Deliveries implements transport.Consumer.
func (c *consumer) Deliveries() <-chan *transport.Delivery { return c.out }

// Err implements transport.Consumer.
func (c *consumer) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Queues implements transport.Consumer.
func (c *consumer) Queues() []transport.Queue {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]transport.Queue, len(c.queues))
	for i, q := range c.queues {
		out[i] = q.q
	}
	return out
}

// Stop implements transport.Consumer: it cancels the broker-side consumers,
// returns the messages received but not handed out, and closes Deliveries.
// The channel stays open until the deliveries handed out are settled (or the
// transport closes).
func (c *consumer) Stop(ctx context.Context) error {
	c.shutdown()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SetPrefetch implements transport.Consumer with a new basic.qos. With
// per-consumer QoS (quorum queues, per-queue prefetch) RabbitMQ applies a
// new prefetch only to consumers started after it, so every queue is
// consumed again (basic.cancel then basic.consume; deliveries already
// received stay valid). The new window then counts only deliveries made
// after the call: those held from before are outside it until settled, so
// the number unacknowledged can exceed n by the number held at the call.
// To keep that rare, the per-consumer window moves in geometric steps
// (nextWindow): at least n, up to twice what was asked. During an outage
// the value is applied on reconnection.
func (c *consumer) SetPrefetch(n int) error {
	if n < 0 {
		return fmt.Errorf("amqp: negative prefetch %d", n)
	}
	n = clampPrefetch(n)
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return transport.ErrClosed
	}
	c.prefetch = n
	cs := c.cs
	if cs != nil && !cs.global {
		// Each change costs a re-consume, and each re-consume opens a new
		// window beside the deliveries still held: changing it for every
		// held ETA task would let the unacknowledged count grow by about
		// a window per change. Geometric steps bound it to a few windows.
		w := nextWindow(c.window, n)
		if w == c.window {
			c.mu.Unlock()
			return nil
		}
		c.window, n = w, w
	} else {
		c.window = n
	}
	c.mu.Unlock()
	if cs == nil || cs.isDead() {
		return nil
	}
	if err := cs.ch.Qos(n, 0, cs.global); err != nil {
		if cs.isDead() {
			return nil // applied when the channel is replaced
		}
		return fmt.Errorf("amqp: basic.qos: %w", err)
	}
	if cs.global {
		return nil
	}
	cs.mu.Lock()
	queues := make([]string, 0, len(cs.tags))
	for q := range cs.tags {
		queues = append(queues, q)
	}
	cs.mu.Unlock()
	for _, q := range queues {
		if err := cs.cancel(q); err != nil {
			return err
		}
		if err := cs.consume(q); err != nil {
			if cs.isDead() {
				return nil
			}
			return err
		}
	}
	return nil
}

// nextWindow is the per-consumer window to apply for prefetch n when w is
// in force: at least n, doubling when it must grow, and back to n only when
// n has fallen to a quarter of w, so that a prefetch moving one by one
// (Celery's one more per held ETA task) changes the window, and costs a
// re-consume, a logarithmic number of times. Zero is unlimited.
func nextWindow(w, n int) int {
	switch {
	case n == 0 || w == 0:
		return n
	case n > w:
		return clampPrefetch(max(n, min(2*w, maxPrefetch)))
	case n*4 <= w:
		return n
	}
	return w
}

// AddQueue implements transport.Consumer. Adding a queue already consumed
// does nothing.
func (c *consumer) AddQueue(ctx context.Context, q transport.Queue) error {
	qs, err := newQueueState(c.t.s, q)
	if err != nil {
		return err
	}
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return transport.ErrClosed
	}
	if c.queueIndex(qs.q.Name) >= 0 {
		c.mu.Unlock()
		return nil
	}
	c.queues = append(c.queues, qs)
	cs := c.cs
	c.mu.Unlock()
	if cs == nil || cs.isDead() {
		return nil // consumed when the channel is replaced
	}
	remove := func() {
		c.mu.Lock()
		if i := c.queueIndex(qs.q.Name); i >= 0 {
			c.queues = slices.Delete(c.queues, i, i+1)
		}
		c.mu.Unlock()
	}
	tp := &topo{sess: cs.sess}
	defer tp.close()
	if err := declareQueue(c.t.s, tp, qs); err != nil {
		if isConnectionError(err, cs.sess) {
			return nil
		}
		remove()
		return err
	}
	if err := c.t.setupDelayed(tp, []*queueState{qs}, c.log); err != nil {
		return nil // the connection is gone: set up again when the channel is replaced
	}
	if qs.quorum && cs.global && c.t.s.QoS == QoSAuto {
		// The channel's QoS must become per consumer: replace the channel.
		c.log.Info("amqp quorum queue added; reopening the channel with per-consumer prefetch",
			zap.String("queue", qs.q.Name))
		cs.kill()
		return nil
	}
	if err := cs.consume(qs.q.Name); err != nil {
		if cs.isDead() {
			return nil
		}
		remove()
		return err
	}
	return nil
}

// CancelQueue implements transport.Consumer. Messages of that queue already
// received are still handed out. Cancelling a queue not consumed does
// nothing.
func (c *consumer) CancelQueue(ctx context.Context, name string) error {
	c.opMu.Lock()
	defer c.opMu.Unlock()
	c.mu.Lock()
	if i := c.queueIndex(name); i >= 0 {
		c.queues = slices.Delete(c.queues, i, i+1)
	}
	cs := c.cs
	c.mu.Unlock()
	if cs == nil {
		return nil
	}
	return cs.cancel(name)
}

var _ transport.AsyncAcknowledger = (*delivery)(nil)

// delivery is a transport.Delivery with its acknowledger in one allocation.
type delivery struct {
	transport.Delivery
	cs      *chanSession
	tag     uint64
	settled atomic.Bool
}

func newDelivery(cs *chanSession, queue string, d *amqp091.Delivery) (*delivery, error) {
	m, err := messageFromDelivery(d)
	if err != nil {
		return nil, err
	}
	del := &delivery{cs: cs, tag: d.DeliveryTag}
	del.Delivery = transport.Delivery{
		Message:     m,
		Queue:       queue,
		Exchange:    d.Exchange,
		RoutingKey:  d.RoutingKey,
		Redelivered: d.Redelivered,
		Tag:         strconv.FormatUint(d.DeliveryTag, 10),
		ReceivedAt:  time.Now(),
	}
	del.Acknowledger = del
	return del, nil
}

// release counts n deliveries handed out as settled, and closes the
// channel of a stopped consumer once none is left.
func (cs *chanSession) release(n int) {
	if cs.pending.Add(-int64(n)) == 0 && cs.stopped.Load() {
		cs.closeIdle()
	}
}

// staleError maps the error of writing basic.ack or basic.reject to
// transport.ErrStaleDelivery. Neither has a reply: an error means the
// frame could not be written, so the connection is failing and the broker
// will deliver the message again.
func staleError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, amqp091.ErrClosed) {
		return transport.ErrStaleDelivery
	}
	return fmt.Errorf("%w: %v", transport.ErrStaleDelivery, err)
}

// settle runs op once for the delivery and maps a dead channel to
// transport.ErrStaleDelivery. op writes a basic.reject: once it is
// written, the acker may ack past the delivery's tag with multiple.
func (d *delivery) settle(op func(ch *amqp091.Channel) error) error {
	if !d.settled.CompareAndSwap(false, true) {
		return transport.ErrAlreadyAcknowledged
	}
	cs := d.cs
	defer cs.release(1)
	if cs.isDead() {
		return transport.ErrStaleDelivery
	}
	if err := op(cs.ch); err != nil {
		return staleError(err)
	}
	cs.acks.settled(d.tag)
	return nil
}

// AckAsync implements transport.AsyncAcknowledger: the ack is written at
// once, or, when another goroutine is writing acks of the channel, by that
// goroutine with them (see acker); wait returns once it is written.
func (d *delivery) AckAsync(ctx context.Context, _ *transport.Delivery) (wait func(context.Context) error, err error) {
	if !d.settled.CompareAndSwap(false, true) {
		return nil, transport.ErrAlreadyAcknowledged
	}
	cs := d.cs
	if cs.isDead() {
		cs.release(1)
		return nil, transport.ErrStaleDelivery
	}
	w := cs.acks.ack(d.tag)
	return func(ctx context.Context) error {
		err := w(ctx)
		if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return err // not known to be written yet
		}
		return staleError(err)
	}, nil
}

// Ack implements transport.Acknowledger with basic.ack, coalesced with
// the channel's other acks (see acker).
func (d *delivery) Ack(ctx context.Context, td *transport.Delivery) error {
	wait, err := d.AckAsync(ctx, td)
	if err != nil {
		return err
	}
	return wait(ctx)
}

// Reject implements transport.Acknowledger with basic.reject.
func (d *delivery) Reject(ctx context.Context, _ *transport.Delivery, requeue bool) error {
	return d.settle(func(ch *amqp091.Channel) error { return ch.Reject(d.tag, requeue) })
}

// DeadLetter implements transport.Acknowledger with basic.reject without
// requeue: the queue's dead-letter exchange, if it has one, keeps the
// message. The reason cannot travel with it (RabbitMQ adds only its own
// x-death header), so it is logged here.
func (d *delivery) DeadLetter(ctx context.Context, _ *transport.Delivery, r transport.DeadLetterReason) error {
	err := d.settle(func(ch *amqp091.Channel) error { return ch.Reject(d.tag, false) })
	if err == nil {
		d.cs.c.log.Warn("amqp message dead-lettered",
			zap.String("queue", d.Queue), zap.String("delivery_tag", d.Tag),
			zap.String("task_id", r.TaskID), zap.String("task_name", r.TaskName),
			zap.String("reason", r.Reason), zap.String("error", r.Error))
	}
	return err
}
