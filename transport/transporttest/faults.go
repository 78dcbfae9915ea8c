package transporttest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/celeriac/celeriac/transport"
)

// ErrInjected is the error of an injected fault when no other error was
// given.
var ErrInjected = errors.New("transporttest: injected fault")

// Op names an operation Faulty can make fail.
type Op string

// Operations that can fail.
const (
	OpPublish    Op = "publish"
	OpAck        Op = "ack"
	OpReject     Op = "reject"
	OpDeadLetter Op = "dead-letter"
	OpConsume    Op = "consume"
	OpSubscribe  Op = "subscribe"
)

// Call describes one operation, for a fault function to decide on.
type Call struct {
	Op Op
	// Publishing is set for OpPublish.
	Publishing *transport.Publishing
	// Delivery is set for OpAck, OpReject and OpDeadLetter.
	Delivery *transport.Delivery
	// Requeue is the argument of Reject.
	Requeue bool
	// Reason is the argument of DeadLetter.
	Reason transport.DeadLetterReason
	// Queues are the queues of OpConsume.
	Queues []transport.Queue
}

// Faulty wraps a transport and injects the faults a real broker produces,
// for tests of code built on transports (the worker's retry, ack and
// shutdown paths): operations that fail a number of times or whenever a
// function says so, and an outage during which no delivery arrives and
// publishing waits.
//
// DropConnection takes back every delivery handed out and not settled, as a
// lost connection does.
//
// A failed Publish publishes nothing. A failed Ack, Reject or DeadLetter
// leaves the delivery unsettled at the broker, so it can be settled again
// and is redelivered if its transport closes first. Faults are checked
// before the operation reaches the wrapped transport, except those set with
// FailNextAfter, which fail after the broker carried the operation out (a
// lost confirm).
//
// Faulty implements transport.Transport, transport.Admin and
// transport.DeadLetterStore (the last two fail with errors.ErrUnsupported
// when the wrapped transport lacks them), and passes the conformance suite
// when no fault is set. Each consumer and subscription runs one goroutine
// that forwards deliveries; Stop, Close and Faulty.Close end it.
//
//	ft := transporttest.NewFaulty(memory.New(memory.Config{}))
//	ft.FailNext(transporttest.OpPublish, 2, nil) // two confirm failures
//	ft.Pause()                                   // broker outage
//	...
//	ft.Resume()
type Faulty struct {
	inner transport.Transport

	mu     sync.Mutex
	fail   map[Op]*failCount
	funcs  map[Op]func(Call) error
	calls  map[Op]int
	resume chan struct{} // nil when not paused; closed by Resume
	closed bool
	live   map[*forwarder]struct{} // consumers and subscriptions not yet ended
	out    map[*faultyAck]struct{} // deliveries handed out and not settled
	done   chan struct{}
	wg     sync.WaitGroup
}

type failCount struct {
	n     int
	err   error
	after bool // the operation is carried out before it fails
}

var (
	_ transport.Transport       = (*Faulty)(nil)
	_ transport.Admin           = (*Faulty)(nil)
	_ transport.DeadLetterStore = (*Faulty)(nil)
	_ QueueDeleter              = (*Faulty)(nil)
)

// NewFaulty wraps inner. Closing the Faulty closes inner.
func NewFaulty(inner transport.Transport) *Faulty {
	return &Faulty{
		inner: inner,
		fail:  map[Op]*failCount{},
		funcs: map[Op]func(Call) error{},
		calls: map[Op]int{},
		live:  map[*forwarder]struct{}{},
		out:   map[*faultyAck]struct{}{},
		done:  make(chan struct{}),
	}
}

// Unwrap returns the wrapped transport.
func (f *Faulty) Unwrap() transport.Transport { return f.inner }

// FailNext makes the next n calls of op fail with err (ErrInjected when err
// is nil), replacing any count set before. n <= 0 cancels it. The errors
// returned wrap err, so errors.Is(got, err) holds.
func (f *Faulty) FailNext(op Op, n int, err error) {
	if err == nil {
		err = ErrInjected
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n <= 0 {
		delete(f.fail, op)
		return
	}
	f.fail[op] = &failCount{n: n, err: err}
}

// FailNextAfter makes the next n calls of op reach the wrapped transport and
// then fail with err (ErrInjected when nil) anyway: the broker applied the
// operation but its answer was lost, as when a publisher confirm times out
// after the broker stored the message, or a connection drops right after an
// ack was sent. A retry then publishes a duplicate, or settles a delivery
// already settled (ErrAlreadyAcknowledged). It replaces any FailNext count
// of op; n <= 0 cancels it.
func (f *Faulty) FailNextAfter(op Op, n int, err error) {
	f.FailNext(op, n, err)
	f.mu.Lock()
	defer f.mu.Unlock()
	if fc := f.fail[op]; fc != nil {
		fc.after = true
	}
}

// SetFault makes every call of op consult fn (after any FailNext count is
// used up): a non-nil error fails the call with it. A nil fn removes the
// function. fn runs without Faulty's lock held and may call Faulty's
// methods.
func (f *Faulty) SetFault(op Op, fn func(Call) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fn == nil {
		delete(f.funcs, op)
		return
	}
	f.funcs[op] = fn
}

// Calls returns how many times op was called, failed calls included.
func (f *Faulty) Calls(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// Pause starts an outage: deliveries stop reaching consumers and
// subscriptions (those the wrapped transport already handed out wait in the
// forwarding goroutine and still count against the prefetch), and Publish
// waits for Resume, its context or Close. Acknowledgements are not paused;
// use FailNext or SetFault for those. Pausing twice is the same as once.
func (f *Faulty) Pause() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.resume == nil {
		f.resume = make(chan struct{})
	}
}

// Resume ends an outage: held deliveries flow and waiting publishes proceed.
func (f *Faulty) Resume() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.resume != nil {
		close(f.resume)
		f.resume = nil
	}
}

// Paused reports whether an outage is in progress.
func (f *Faulty) Paused() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resume != nil
}

// inject counts a call and returns its injected error, if any, and whether
// the operation must be carried out before failing with it.
func (f *Faulty) inject(c Call) (after bool, err error) {
	f.mu.Lock()
	f.calls[c.Op]++
	if fc := f.fail[c.Op]; fc != nil {
		fc.n--
		if fc.n <= 0 {
			delete(f.fail, c.Op)
		}
		f.mu.Unlock()
		return fc.after, fmt.Errorf("transporttest: injected %s fault: %w", c.Op, fc.err)
	}
	fn := f.funcs[c.Op]
	f.mu.Unlock()
	if fn != nil {
		if err := fn(c); err != nil {
			return false, fmt.Errorf("transporttest: injected %s fault: %w", c.Op, err)
		}
	}
	return false, nil
}

// run carries out op unless the fault says otherwise, and returns the
// fault's error in its place.
func (f *Faulty) run(c Call, op func() error) error {
	after, err := f.inject(c)
	if err == nil {
		return op()
	}
	if after {
		if opErr := op(); opErr != nil {
			return opErr
		}
	}
	return err
}

// waitResume waits out an outage. It returns false if stop, ctx or Close
// ended the wait first.
func (f *Faulty) waitResume(ctx context.Context, stop <-chan struct{}) bool {
	ctxDone := ctx.Done()
	for {
		f.mu.Lock()
		resume := f.resume
		f.mu.Unlock()
		if resume == nil {
			return true
		}
		select {
		case <-resume:
		case <-stop:
			return false
		case <-f.done:
			return false
		case <-ctxDone:
			return false
		}
	}
}

// Publish implements transport.Transport.
func (f *Faulty) Publish(ctx context.Context, p *transport.Publishing) error {
	return f.run(Call{Op: OpPublish, Publishing: p}, func() error {
		if !f.waitResume(ctx, nil) {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("transporttest: publish during outage: %w", err)
			}
			return transport.ErrClosed
		}
		return f.inner.Publish(ctx, p)
	})
}

// register records a forwarder so that Close can end it. It reports false
// when f is closed.
func (f *Faulty) register(fw *forwarder) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.live[fw] = struct{}{}
	f.wg.Add(1)
	return true
}

func (f *Faulty) unregister(fw *forwarder) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.live, fw)
}

// Consume implements transport.Transport. Deliveries are forwarded through
// a goroutine that holds them during an outage; their acknowledgements go
// through the fault checks.
func (f *Faulty) Consume(ctx context.Context, queues []transport.Queue, opts transport.ConsumeOptions) (transport.Consumer, error) {
	if _, err := f.inject(Call{Op: OpConsume, Queues: queues}); err != nil {
		return nil, err
	}
	inner, err := f.inner.Consume(ctx, queues, opts)
	if err != nil {
		return nil, err
	}
	c := &faultyConsumer{inner: inner}
	c.fw = f.newForwarder(inner.Deliveries(), func(ctx context.Context) error { return inner.Stop(ctx) }, true)
	if c.fw == nil {
		_ = inner.Stop(ctx)
		return nil, transport.ErrClosed
	}
	return c, nil
}

// Subscribe implements transport.Transport. Broadcasts are held during an
// outage like deliveries.
func (f *Faulty) Subscribe(ctx context.Context, b transport.Broadcast) (transport.Subscription, error) {
	if _, err := f.inject(Call{Op: OpSubscribe}); err != nil {
		return nil, err
	}
	inner, err := f.inner.Subscribe(ctx, b)
	if err != nil {
		return nil, err
	}
	fw := f.newForwarder(inner.Deliveries(), func(context.Context) error { return inner.Close() }, false)
	if fw == nil {
		_ = inner.Close()
		return nil, transport.ErrClosed
	}
	return &faultySubscription{fw: fw}, nil
}

// Close stops every forwarder, then closes the wrapped transport.
func (f *Faulty) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	close(f.done)
	live := slices.Collect(maps.Keys(f.live))
	f.mu.Unlock()
	for _, fw := range live {
		fw.signalStop()
	}
	err := f.inner.Close()
	f.wg.Wait()
	f.mu.Lock()
	clear(f.out) // the wrapped transport returned them to the broker
	f.mu.Unlock()
	return err
}

// Len implements transport.Admin.
func (f *Faulty) Len(ctx context.Context, queue string) (int, error) {
	a, ok := f.inner.(transport.Admin)
	if !ok {
		return 0, fmt.Errorf("transporttest: %T has no Len: %w", f.inner, errors.ErrUnsupported)
	}
	return a.Len(ctx, queue)
}

// Purge implements transport.Admin.
func (f *Faulty) Purge(ctx context.Context, queue string) (int, error) {
	a, ok := f.inner.(transport.Admin)
	if !ok {
		return 0, fmt.Errorf("transporttest: %T has no Purge: %w", f.inner, errors.ErrUnsupported)
	}
	return a.Purge(ctx, queue)
}

// DeleteQueue implements QueueDeleter.
func (f *Faulty) DeleteQueue(ctx context.Context, queue string) error {
	d, ok := f.inner.(QueueDeleter)
	if !ok {
		return fmt.Errorf("transporttest: %T has no DeleteQueue: %w", f.inner, errors.ErrUnsupported)
	}
	return d.DeleteQueue(ctx, queue)
}

// DeadLetters implements transport.DeadLetterStore.
func (f *Faulty) DeadLetters(ctx context.Context, queue string, limit int) ([]transport.DeadMessage, error) {
	d, ok := f.inner.(transport.DeadLetterStore)
	if !ok {
		return nil, fmt.Errorf("transporttest: %T has no dead-letter store: %w", f.inner, errors.ErrUnsupported)
	}
	return d.DeadLetters(ctx, queue, limit)
}

// Replay implements transport.DeadLetterStore.
func (f *Faulty) Replay(ctx context.Context, queue string, ids []string, opts transport.ReplayOptions) (int, error) {
	d, ok := f.inner.(transport.DeadLetterStore)
	if !ok {
		return 0, fmt.Errorf("transporttest: %T has no dead-letter store: %w", f.inner, errors.ErrUnsupported)
	}
	return d.Replay(ctx, queue, ids, opts)
}

// PurgeDead implements transport.DeadLetterStore.
func (f *Faulty) PurgeDead(ctx context.Context, queue string, ids []string) (int, error) {
	d, ok := f.inner.(transport.DeadLetterStore)
	if !ok {
		return 0, fmt.Errorf("transporttest: %T has no dead-letter store: %w", f.inner, errors.ErrUnsupported)
	}
	return d.PurgeDead(ctx, queue, ids)
}

// forwarder moves deliveries from the wrapped consumer or subscription to
// its own channel, of which it is the only sender.
type forwarder struct {
	f         *Faulty
	in        <-chan *transport.Delivery
	out       chan *transport.Delivery
	stopInner func(context.Context) error
	ack       bool // wrap acknowledgers (task deliveries) or not (broadcasts)
	stopCh    chan struct{}
	stopOnce  sync.Once
	done      chan struct{}
}

// newForwarder starts a forwarder, or returns nil when f is closed.
func (f *Faulty) newForwarder(in <-chan *transport.Delivery, stopInner func(context.Context) error, ack bool) *forwarder {
	fw := &forwarder{
		f:         f,
		in:        in,
		out:       make(chan *transport.Delivery),
		stopInner: stopInner,
		ack:       ack,
		stopCh:    make(chan struct{}),
		done:      make(chan struct{}),
	}
	if !f.register(fw) {
		return nil
	}
	go fw.run()
	return fw
}

func (fw *forwarder) signalStop() {
	fw.stopOnce.Do(func() { close(fw.stopCh) })
}

// stop ends forwarding: the wrapped consumer is stopped, and what it still
// delivers is returned to the broker rather than handed out.
func (fw *forwarder) stop(ctx context.Context) error {
	fw.signalStop()
	err := fw.stopInner(ctx)
	select {
	case <-fw.done:
	case <-ctx.Done():
		if err == nil {
			err = ctx.Err()
		}
	}
	return err
}

func (fw *forwarder) run() {
	defer fw.f.wg.Done()
	defer fw.f.unregister(fw)
	defer close(fw.done)
	defer close(fw.out)
	for {
		var d *transport.Delivery
		select {
		case x, ok := <-fw.in:
			if !ok {
				return
			}
			d = x
		case <-fw.stopCh:
			fw.returnRest(nil)
			return
		}
		if fw.ack && d.Acknowledger != nil {
			a := &faultyAck{f: fw.f, inner: d.Acknowledger, d: d}
			d.Acknowledger = a
			fw.f.mu.Lock()
			fw.f.out[a] = struct{}{}
			fw.f.mu.Unlock()
		}
		if !fw.f.waitResume(context.Background(), fw.stopCh) {
			fw.returnRest(d)
			return
		}
		select {
		case fw.out <- d:
		case <-fw.stopCh:
			fw.returnRest(d)
			return
		}
	}
}

// returnRest gives back held, a delivery taken from the wrapped consumer but
// never handed out, and everything the wrapped consumer still delivers
// until it closes its channel (Stop or Close of the wrapped transport are
// under way when this runs). Task deliveries are rejected with requeue, so
// the broker redelivers them (marked redelivered); broadcasts are dropped.
func (fw *forwarder) returnRest(held *transport.Delivery) {
	give := func(d *transport.Delivery) {
		if !fw.ack || d.Acknowledger == nil {
			return
		}
		// Straight to the wrapped transport: this is no caller's settlement,
		// so no fault applies. A closed transport requeues it itself.
		if a, ok := d.Acknowledger.(*faultyAck); ok {
			fw.f.mu.Lock()
			delete(fw.f.out, a)
			fw.f.mu.Unlock()
			_ = a.inner.Reject(context.Background(), d, true)
			return
		}
		_ = d.Reject(context.Background(), true)
	}
	if held != nil {
		give(held)
	}
	for d := range fw.in {
		give(d)
	}
}

type faultyConsumer struct {
	inner transport.Consumer
	fw    *forwarder
}

func (c *faultyConsumer) Deliveries() <-chan *transport.Delivery { return c.fw.out }
func (c *faultyConsumer) SetPrefetch(n int) error                { return c.inner.SetPrefetch(n) }
func (c *faultyConsumer) AddQueue(ctx context.Context, q transport.Queue) error {
	return c.inner.AddQueue(ctx, q)
}
func (c *faultyConsumer) CancelQueue(ctx context.Context, name string) error {
	return c.inner.CancelQueue(ctx, name)
}
func (c *faultyConsumer) Queues() []transport.Queue { return c.inner.Queues() }

// Stop stops the wrapped consumer. Deliveries it had handed to the
// forwarder but the forwarder had not handed out are rejected with requeue.
func (c *faultyConsumer) Stop(ctx context.Context) error { return c.fw.stop(ctx) }
func (c *faultyConsumer) Err() error                     { return c.inner.Err() }

type faultySubscription struct {
	fw *forwarder
}

func (s *faultySubscription) Deliveries() <-chan *transport.Delivery { return s.fw.out }
func (s *faultySubscription) Close() error {
	return s.fw.stop(context.Background())
}

// faultyAck puts acknowledgements through the fault checks.
type faultyAck struct {
	f     *Faulty
	inner transport.Acknowledger
	d     *transport.Delivery
	stale bool // guarded by f.mu: DropConnection took the delivery back
}

// settle runs one settlement through staleness and the fault checks, and
// forgets the delivery once the wrapped transport has settled it.
func (a *faultyAck) settle(c Call, op func() error) error {
	a.f.mu.Lock()
	stale := a.stale
	a.f.mu.Unlock()
	if stale {
		a.f.inject(c) // counted like any call
		return fmt.Errorf("transporttest: %s after DropConnection: %w", c.Op, transport.ErrStaleDelivery)
	}
	ran := false
	err := a.f.run(c, func() error {
		ran = true
		return op()
	})
	if ran {
		a.f.mu.Lock()
		delete(a.f.out, a)
		a.f.mu.Unlock()
	}
	return err
}

func (a *faultyAck) Ack(ctx context.Context, d *transport.Delivery) error {
	return a.settle(Call{Op: OpAck, Delivery: d}, func() error { return a.inner.Ack(ctx, d) })
}

func (a *faultyAck) Reject(ctx context.Context, d *transport.Delivery, requeue bool) error {
	return a.settle(Call{Op: OpReject, Delivery: d, Requeue: requeue}, func() error { return a.inner.Reject(ctx, d, requeue) })
}

func (a *faultyAck) DeadLetter(ctx context.Context, d *transport.Delivery, r transport.DeadLetterReason) error {
	return a.settle(Call{Op: OpDeadLetter, Delivery: d, Reason: r}, func() error { return a.inner.DeadLetter(ctx, d, r) })
}

// DropConnection simulates the loss of the connection that carried the
// deliveries handed out so far, as RabbitMQ sees it: every one not yet
// settled goes back to its queue (rejected with requeue on the wrapped
// transport, so it is redelivered marked Redelivered), and settling it
// afterwards fails with an error matching transport.ErrStaleDelivery, which
// the caller should log and move on from. Consumers keep consuming, as after
// a reconnect. It returns how many deliveries were taken back.
func (f *Faulty) DropConnection(ctx context.Context) int {
	f.mu.Lock()
	acks := slices.Collect(maps.Keys(f.out))
	for _, a := range acks {
		a.stale = true
	}
	clear(f.out)
	f.mu.Unlock()
	for _, a := range acks {
		// A settlement racing with the drop may have won; the broker then
		// answers ErrAlreadyAcknowledged, which is fine.
		_ = a.inner.Reject(ctx, a.d, true)
	}
	return len(acks)
}
