package transporttest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// Factory returns a new connection to the broker under test. Every call in
// one Run must reach the same broker (the same URL, the same in-memory
// broker), because some tests check what one connection leaves behind for
// the next. The suite closes every transport it gets.
type Factory func(t testing.TB) transport.Transport

// PriorityOrder is the order in which a transport delivers the ready
// messages of one queue that carry different priorities.
type PriorityOrder int

const (
	// PriorityFIFO: priorities are ignored; publish order.
	PriorityFIFO PriorityOrder = iota
	// PriorityHigherFirst: higher priority first, FIFO within a priority
	// (RabbitMQ queues declared with x-max-priority; the memory transport).
	PriorityHigherFirst
	// PriorityLowerFirstBands: kombu's Redis bands. Priorities 0-2, 3-5, 6-8
	// and 9 form four bands, the lowest band first, FIFO within a band.
	PriorityLowerFirstBands
)

func (p PriorityOrder) String() string {
	switch p {
	case PriorityFIFO:
		return "fifo"
	case PriorityHigherFirst:
		return "higher-first"
	case PriorityLowerFirstBands:
		return "lower-first-bands"
	}
	return fmt.Sprintf("PriorityOrder(%d)", int(p))
}

// TopicSupport says how Subscribe honours topic binding keys.
type TopicSupport int

const (
	// TopicNone: topic broadcasts are not supported; those tests are skipped.
	TopicNone TopicSupport = iota
	// TopicPrefix: binding keys of the form "word.#" (Celery's "worker.#")
	// select the routing keys that start with "word." (kombu's Redis pub/sub
	// patterns).
	TopicPrefix
	// TopicAMQP: full AMQP semantics, "*" is exactly one word and "#" zero
	// or more words, anywhere in the key.
	TopicAMQP
)

// Features describe what differs between brokers, so that one suite checks
// each transport against what its broker promises. The zero value describes
// a transport with FIFO queues, Redelivered reported, prefix topics not
// supported and dead letters without reasons; set the fields that apply.
type Features struct {
	// QueuePrefix starts every queue and exchange name the suite declares.
	// Names are unique per test and per run (a random part), so runs on a
	// shared broker do not see each other. Default "tt_".
	QueuePrefix string

	// Priority is the delivery order of messages with different priorities
	// in one queue.
	Priority PriorityOrder
	// PriorityQueueArguments are the queue arguments the priority test
	// declares its queue with (RabbitMQ: {"x-max-priority": 10}).
	PriorityQueueArguments map[string]any

	// NoRedelivered: the transport does not set Delivery.Redelivered on a
	// message delivered before. When false the suite checks that it is set
	// after Reject with requeue and after Close, and unset on first delivery.
	NoRedelivered bool
	// RequeueAtHead: Reject with requeue puts the message back at the head of
	// its queue, so it is delivered before messages behind it (RabbitMQ, the
	// memory transport; kombu's Redis pushes it to the tail).
	RequeueAtHead bool
	// ExtraProperties: Properties.Extra survives the broker (the kombu Redis
	// envelope keeps any property; AMQP has a fixed property set).
	ExtraProperties bool
	// PerQueuePrefetch: every consumer of the run asks for
	// ConsumeOptions.PerQueuePrefetch, and the transport bounds each
	// consumed queue on its own.
	PerQueuePrefetch bool

	// DeadLetterQueueArguments returns the arguments of a queue whose
	// dead-lettered messages the transport keeps (RabbitMQ: a dead-letter
	// exchange routing to the queue the adapter lists). Nil means none are
	// needed. Used by the dead-letter tests only.
	DeadLetterQueueArguments func(queue string) map[string]any
	// RejectDeadLetters: Reject without requeue on a queue declared with
	// DeadLetterQueueArguments keeps the message in the DeadLetterStore, as a
	// RabbitMQ DLX does. When false the test of that case is skipped. On a
	// queue declared without those arguments a reject always drops.
	RejectDeadLetters bool
	// DeadLetterReason: DeadLetters returns the DeadLetterReason given to
	// Delivery.DeadLetter (Reason, Error, TaskID, TaskName, and Time to the
	// second).
	DeadLetterReason bool

	// Topics is the support for topic broadcasts.
	Topics TopicSupport

	// Messages is the message count of the concurrency test. Default 2000.
	Messages int
	// Timeout bounds each wait for something that must happen (a delivery,
	// a queue length). Default 10s.
	Timeout time.Duration
	// Quiet is how long the suite waits to conclude that nothing more is
	// delivered (prefetch bounds, cancelled queues). Longer is more
	// thorough on a laggy broker. Default 300ms.
	Quiet time.Duration

	// Skip names subtests (as "Group/Name", the part after Run's test name)
	// to skip, with the reason. For adapters that knowingly differ;
	// prefer a Features field when one fits.
	Skip map[string]string

	// Cleanup, when set, runs after each test with the queues and exchanges
	// the test declared, after every transport of the test was closed and
	// the queues were purged, to delete them on the broker. Transports that
	// have a DeleteQueue(ctx, name) error method have their queues deleted
	// through it anyway.
	Cleanup func(t testing.TB, queues, exchanges []string)
}

func (f *Features) defaults() {
	if f.QueuePrefix == "" {
		f.QueuePrefix = "tt_"
	}
	if f.Messages <= 0 {
		f.Messages = 2000
	}
	if f.Timeout <= 0 {
		f.Timeout = 10 * time.Second
	}
	if f.Quiet <= 0 {
		f.Quiet = 300 * time.Millisecond
	}
}

// QueueDeleter is implemented by transports that can delete a queue. The
// suite uses it, when present, to remove what each test declared.
type QueueDeleter interface {
	DeleteQueue(ctx context.Context, name string) error
}

// Run runs the conformance suite against the transport newTransport
// connects to. Each behaviour is a subtest named "Group/Name" (for example
// "Prefetch/RaiseAndLower") so that adapter authors see exactly what fails;
// run one with go test -run 'TestX/Prefetch/RaiseAndLower'.
//
// The suite is written for real, shared and slightly laggy brokers: every
// test uses fresh queue names, waits by polling with generous timeouts
// rather than sleeping, and purges (and deletes, where it can) what it
// declared. It needs only the contract of package transport; Admin and
// DeadLetterStore are used when the transport implements them.
func Run(t *testing.T, newTransport Factory, f Features) {
	f.defaults()
	s := &suite{newT: newTransport, f: f, run: fmt.Sprintf("%06x", rand.Uint32()&0xffffff)}
	for _, g := range allGroups() {
		t.Run(g.name, func(t *testing.T) {
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					if why, ok := f.Skip[g.name+"/"+tc.name]; ok {
						t.Skip(why)
					}
					tc.fn(t, s.env(t))
				})
			}
		})
	}
}

type testCase struct {
	name string
	fn   func(t *testing.T, e *env)
}

type group struct {
	name  string
	tests []testCase
}

// allGroups lists every test of the suite, in the order they run.
func allGroups() []group {
	return []group{
		{"Publish", publishTests()},
		{"Prefetch", prefetchTests()},
		{"Settle", settleTests()},
		{"DeadLetter", deadLetterTests()},
		{"Lifecycle", lifecycleTests()},
		{"Admin", adminTests()},
		{"Priority", priorityTests()},
		{"Queues", queueTests()},
		{"Broadcast", broadcastTests()},
		{"Concurrency", concurrencyTests()},
	}
}

type suite struct {
	newT Factory
	f    Features
	run  string // random per Run, part of every name
}

// env is one test's view of the suite: it hands out transports and names
// and cleans up after the test.
type env struct {
	s   *suite
	f   *Features
	t   *testing.T
	ctx context.Context

	mu         sync.Mutex
	transports []transport.Transport
	admin      transport.Transport // for cleanup; made while the test runs
	queues     []string
	exchanges  []string
	n          int
}

func (s *suite) env(t *testing.T) *env {
	e := &env{s: s, f: &s.f, t: t, ctx: t.Context()}
	// Registered first, so it runs last: after every consumer was stopped.
	t.Cleanup(e.cleanup)
	return e
}

func (e *env) cleanup() {
	e.mu.Lock()
	ts, admin, queues, exchanges := e.transports, e.admin, e.queues, e.exchanges
	e.mu.Unlock()
	for _, tr := range ts {
		_ = tr.Close() // unsettled deliveries go back to their queues first
	}
	if admin == nil {
		return
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), e.f.Timeout)
	defer cancel()
	for _, q := range queues {
		if a, ok := admin.(transport.Admin); ok {
			if _, err := a.Purge(ctx, q); err != nil {
				e.t.Logf("cleanup: purge %s: %v", q, err)
			}
		}
		if d, ok := admin.(transport.DeadLetterStore); ok {
			if _, err := d.PurgeDead(ctx, q, nil); err != nil {
				e.t.Logf("cleanup: purge dead letters of %s: %v", q, err)
			}
		}
		if d, ok := admin.(QueueDeleter); ok {
			if err := d.DeleteQueue(ctx, q); err != nil {
				e.t.Logf("cleanup: delete %s: %v", q, err)
			}
		}
	}
	if e.f.Cleanup != nil {
		e.f.Cleanup(e.t, queues, exchanges)
	}
}

// transport returns a new connection, closed at the end of the test.
func (e *env) transport() transport.Transport {
	e.t.Helper()
	tr := e.s.newT(e.t)
	if tr == nil {
		e.t.Fatal("transporttest: Factory returned nil")
	}
	e.mu.Lock()
	e.transports = append(e.transports, tr)
	e.mu.Unlock()
	return tr
}

// name returns a fresh queue or exchange name for this test. The first call
// also connects the transport that cleans up after the test: the factory
// may need the test's context, which is gone by the time cleanups run.
func (e *env) name(kind string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.admin == nil {
		e.admin = e.s.newT(e.t)
		if e.admin == nil {
			e.t.Fatal("transporttest: Factory returned nil")
		}
	}
	e.n++
	base := e.t.Name()
	if i := strings.LastIndexByte(base, '/'); i >= 0 {
		base = base[i+1:]
	}
	base = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, base)
	if len(base) > 24 {
		base = base[:24]
	}
	return fmt.Sprintf("%s%s_%s_%s%d", e.f.QueuePrefix, base, e.s.run, kind, e.n)
}

// queue returns a fresh queue name, cleaned up after the test.
func (e *env) queue() string {
	q := e.name("q")
	e.mu.Lock()
	e.queues = append(e.queues, q)
	e.mu.Unlock()
	return q
}

// exchange returns a fresh exchange name, cleaned up after the test.
func (e *env) exchange() string {
	x := e.name("x")
	e.mu.Lock()
	e.exchanges = append(e.exchanges, x)
	e.mu.Unlock()
	return x
}

// consume starts a consumer that is stopped at the end of the test.
func (e *env) consume(tr transport.Transport, prefetch int, queues ...transport.Queue) transport.Consumer {
	e.t.Helper()
	c, err := tr.Consume(e.ctx, queues, transport.ConsumeOptions{Prefetch: prefetch, PerQueuePrefetch: e.f.PerQueuePrefetch})
	if err != nil {
		e.t.Fatalf("Consume(%v, prefetch %d): %v", queueNames(queues), prefetch, err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), e.f.Timeout)
		defer cancel()
		_ = c.Stop(ctx)
		if _, closed := drainFor(c.Deliveries(), e.f.Timeout); !closed {
			e.t.Errorf("Deliveries not closed within %v after Stop", e.f.Timeout)
		}
	})
	return c
}

// declare makes sure the queues exist (on AMQP a message published to a
// missing queue is dropped) without leaving a consumer behind: it starts a
// consumer and stops it before anything is published.
func (e *env) declare(tr transport.Transport, queues ...transport.Queue) {
	e.t.Helper()
	c, err := tr.Consume(e.ctx, queues, transport.ConsumeOptions{Prefetch: 1})
	if err != nil {
		e.t.Fatalf("Consume(%v) to declare: %v", queueNames(queues), err)
	}
	if err := c.Stop(e.ctx); err != nil {
		e.t.Fatalf("Stop after declaring %v: %v", queueNames(queues), err)
	}
	ds, closed := drainFor(c.Deliveries(), e.f.Timeout)
	if !closed {
		e.t.Fatalf("declaring %v: Deliveries not closed within %v after Stop", queueNames(queues), e.f.Timeout)
	}
	if len(ds) > 0 {
		e.t.Fatalf("declaring %v: got %d deliveries from queues that should be empty", queueNames(queues), len(ds))
	}
}

// drainFor reads ch until it is closed or timeout passes, and returns what
// it read and whether ch was closed.
func drainFor(ch <-chan *transport.Delivery, timeout time.Duration) ([]*transport.Delivery, bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var out []*transport.Delivery
	for {
		select {
		case d, ok := <-ch:
			if !ok {
				return out, true
			}
			out = append(out, d)
		case <-timer.C:
			return out, false
		}
	}
}

func queueNames(qs []transport.Queue) []string {
	out := make([]string, len(qs))
	for i, q := range qs {
		out[i] = q.Name
	}
	return out
}

// publish publishes m to the default exchange with routing key queue.
func (e *env) publish(tr transport.Transport, queue string, m protocol.Message) {
	e.t.Helper()
	e.publishTo(tr, &transport.Publishing{RoutingKey: queue, Message: m})
}

func (e *env) publishTo(tr transport.Transport, p *transport.Publishing) {
	e.t.Helper()
	if err := tr.Publish(e.ctx, p); err != nil {
		e.t.Fatalf("Publish(exchange %q, routing key %q): %v", p.Exchange, p.RoutingKey, err)
	}
}

// recv waits for the next delivery.
func (e *env) recv(c transport.Consumer) *transport.Delivery {
	e.t.Helper()
	return e.recvFrom(c.Deliveries(), c.Err)
}

func (e *env) recvFrom(ch <-chan *transport.Delivery, errf func() error) *transport.Delivery {
	e.t.Helper()
	timer := time.NewTimer(e.f.Timeout)
	defer timer.Stop()
	select {
	case d, ok := <-ch:
		if !ok {
			var err error
			if errf != nil {
				err = errf()
			}
			e.t.Fatalf("Deliveries closed while waiting for a delivery (Err: %v)", err)
		}
		if d == nil {
			e.t.Fatal("received a nil *Delivery")
		}
		return d
	case <-timer.C:
		e.t.Fatalf("no delivery within %v", e.f.Timeout)
	case <-e.ctx.Done():
		e.t.Fatal("test context done while waiting for a delivery")
	}
	return nil
}

// recvN waits for n deliveries.
func (e *env) recvN(c transport.Consumer, n int) []*transport.Delivery {
	e.t.Helper()
	out := make([]*transport.Delivery, 0, n)
	for range n {
		out = append(out, e.recv(c))
	}
	return out
}

// none checks that nothing is delivered for Features.Quiet.
func (e *env) none(c transport.Consumer, why string) {
	e.t.Helper()
	e.noneFrom(c.Deliveries(), why)
}

func (e *env) noneFrom(ch <-chan *transport.Delivery, why string) {
	e.t.Helper()
	timer := time.NewTimer(e.f.Quiet)
	defer timer.Stop()
	select {
	case d, ok := <-ch:
		if !ok {
			e.t.Fatalf("Deliveries closed; expected it open and silent (%s)", why)
		}
		e.t.Fatalf("unexpected delivery %s from %q (%s)", msgID(d.Message), d.Queue, why)
	case <-timer.C:
	}
}

// eventually polls cond until it reports true or Features.Timeout passes.
func (e *env) eventually(what string, cond func() (bool, string)) {
	e.t.Helper()
	deadline := time.Now().Add(e.f.Timeout)
	wait := 5 * time.Millisecond
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not reached within %v; last state: %s", what, e.f.Timeout, state)
		}
		time.Sleep(wait)
		wait = min(wait*2, 200*time.Millisecond)
	}
}

// waitLen waits until Len(queue) == n, when the transport implements Admin.
func (e *env) waitLen(tr transport.Transport, queue string, n int) {
	e.t.Helper()
	a, ok := tr.(transport.Admin)
	if !ok {
		return
	}
	e.eventually(fmt.Sprintf("Len(%s) == %d", queue, n), func() (bool, string) {
		got, err := a.Len(e.ctx, queue)
		if err != nil {
			return false, err.Error()
		}
		return got == n, fmt.Sprintf("Len = %d", got)
	})
}

// ack acknowledges d and fails the test on error.
func (e *env) ack(d *transport.Delivery) {
	e.t.Helper()
	if err := d.Ack(e.ctx); err != nil {
		e.t.Fatalf("Ack(%s): %v", msgID(d.Message), err)
	}
}

// msg returns a small task-like message whose id header is id.
func msg(id string) protocol.Message {
	return protocol.Message{
		ContentType:     protocol.ContentTypeJSON,
		ContentEncoding: "utf-8",
		Headers:         map[string]any{"lang": "go", "task": "transporttest.noop", "id": id},
		Properties:      protocol.Properties{CorrelationID: id, DeliveryMode: 2},
		Body:            []byte(`[[], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]`),
	}
}

// msgID is the id header of m, for messages made by msg.
func msgID(m protocol.Message) string {
	if s, ok := m.Headers["id"].(string); ok {
		return s
	}
	return fmt.Sprintf("<no id: headers %v>", m.Headers)
}

func ids(ds []*transport.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = msgID(d.Message)
	}
	return out
}

// isClosedErr reports whether err says that the transport is closed or the
// delivery's connection is gone, the two acceptable answers to settling a
// delivery after Close.
func isClosedErr(err error) bool {
	return errors.Is(err, transport.ErrClosed) || errors.Is(err, transport.ErrStaleDelivery)
}
