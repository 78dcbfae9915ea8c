package amqp

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// Native delayed delivery is Celery 5.5's answer to quorum queues, which
// refuse global QoS: with a static prefetch a worker cannot take in one more
// message per held ETA task, so countdown tasks are parked in the broker
// instead. 28 levels of topic exchange and TTL queue, celery_delayed_27 down
// to celery_delayed_0, each holding a message 2^level seconds when its bit of
// the countdown is 1 and passing it on at once when it is 0; the routing key
// is the countdown's 28 binary digits, dot-separated, then the real key. The
// last level dead-letters into celery_delayed_delivery, to which the task
// exchanges are bound with "#.<routing key>". Python's workers declare this
// topology and Python's producers publish into it; a Go fleet replacing them
// must do both, or a Python countdown task is routed into the levels and
// nobody binds the way back out.

// DelayedDeliveryMode selects native delayed delivery.
type DelayedDeliveryMode int

const (
	// DelayedAuto is Celery's rule (worker_detect_quorum_queues): on when a
	// consumed queue is a quorum queue, off otherwise.
	DelayedAuto DelayedDeliveryMode = iota
	// DelayedOn declares the topology for every consumed queue and routes
	// countdown publishes through it, quorum or not; a producer that
	// consumes nothing needs it to publish into the levels.
	DelayedOn
	// DelayedOff neither declares nor uses it: the worker holds countdown
	// tasks itself, raising the prefetch where the queue allows.
	DelayedOff
)

const (
	delayedBits     = 28
	delayedMaxLevel = delayedBits - 1
	// delayedDelivery is the exchange the last level dead-letters into.
	delayedDelivery = "celery_delayed_delivery"
	delayedPrefix   = "celery_delayed_"
	// delayedKeyPrefixLen is the length of the 28 digits and their dots.
	delayedKeyPrefixLen = 2 * delayedBits
	// delayedMaxCountdown is the longest delay the 28 bits can carry
	// (about 8.5 years); a longer one is held by the worker.
	delayedMaxCountdown = 1<<delayedBits - 1
	declaredDelayed     = "delayed-delivery"
	delayedUnavailable  = "delayed-delivery-unavailable"
	// delayedMaxKey is AMQP's limit on a routing key (a short string).
	delayedMaxKey = 255
)

var errDelayedUnavailable = errors.New("amqp: native delayed delivery is not available on this connection")

// delayedLevel names level n's exchange and queue.
func delayedLevel(n int) string { return delayedPrefix + strconv.Itoa(n) }

// isDelayedExchange reports the exchanges of the topology, all topic ones.
func isDelayedExchange(name string) bool {
	if name == delayedDelivery {
		return true
	}
	n, ok := strings.CutPrefix(name, delayedPrefix)
	if !ok || n == "" || len(n) > 2 {
		return false
	}
	level, err := strconv.Atoi(n)
	return err == nil && level >= 0 && level <= delayedMaxLevel && strconv.Itoa(level) == n
}

// delayedRoutingKey is kombu's calculate_routing_key: the countdown in whole
// seconds as 28 binary digits joined by dots, then the routing key with any
// earlier prefix removed (a retried message carries the prefix it arrived
// with, and prefixes must not pile up past AMQP's 255-byte key limit).
func delayedRoutingKey(countdown int64, routingKey string) string {
	routingKey = stripDelayedPrefix(routingKey)
	var b strings.Builder
	b.Grow(delayedKeyPrefixLen + len(routingKey))
	for bit := delayedMaxLevel; bit >= 0; bit-- {
		if countdown>>bit&1 == 1 {
			b.WriteByte('1')
		} else {
			b.WriteByte('0')
		}
		b.WriteByte('.')
	}
	b.WriteString(routingKey)
	return b.String()
}

// stripDelayedPrefix removes the 28 "d." groups delayedRoutingKey puts in
// front of a routing key, when they are there.
func stripDelayedPrefix(key string) string {
	if len(key) < delayedKeyPrefixLen {
		return key
	}
	for i := 0; i < delayedKeyPrefixLen; i += 2 {
		if key[i] != '0' && key[i] != '1' || key[i+1] != '.' {
			return key
		}
	}
	return key[delayedKeyPrefixLen:]
}

// delayedBindingKey is the key a task exchange and its queue are bound with
// to celery_delayed_delivery, as kombu binds them.
func delayedBindingKey(routingKey string) string {
	if strings.HasPrefix(routingKey, "#") {
		return routingKey
	}
	return "#." + routingKey
}

// delayedQueueArgs are the arguments of level n's queue, as kombu declares
// them.
func delayedQueueArgs(level int, queueType string) amqp091.Table {
	next := delayedDelivery
	if level > 0 {
		next = delayedLevel(level - 1)
	}
	args := amqp091.Table{
		"x-queue-type":           queueType,
		"x-overflow":             "reject-publish",
		"x-message-ttl":          int64(1) << level * 1000,
		"x-dead-letter-exchange": next,
	}
	if queueType == "quorum" {
		args["x-dead-letter-strategy"] = "at-least-once"
	}
	return args
}

// declareDelayedTopology declares the 28 levels and the delivery exchange
// on t's connection, once per connection. A level queue that exists with
// other arguments (declared classic by another fleet, say) is used as it
// is, with a warning, unless StrictTopology.
func declareDelayedTopology(s *settings, t *topo) error {
	if t.sess.wasDeclared(declaredDelayed) {
		return nil
	}
	key := "1.#"
	for level := delayedMaxLevel; level >= 0; level-- {
		name := delayedLevel(level)
		if err := t.do(func(ch *amqp091.Channel) error {
			return ch.ExchangeDeclare(name, transport.Topic, true, false, false, false, nil)
		}); err != nil {
			return fmt.Errorf("amqp: delayed delivery: declare exchange %q: %w", name, err)
		}
		args := delayedQueueArgs(level, s.DelayedQueueType)
		err := t.do(func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(name, true, false, false, false, args)
			return err
		})
		if err != nil {
			mm := asMismatch(err, "queue", name)
			if mm == nil || s.StrictTopology {
				if mm != nil {
					return mm
				}
				return fmt.Errorf("amqp: delayed delivery: declare queue %q: %w", name, err)
			}
			s.log.Warn("amqp delayed-delivery queue differs from Celery's declaration; using it as it is",
				zap.String("queue", name), zap.String("argument", mm.Argument),
				zap.String("current", mm.Current), zap.String("declared", mm.Declared))
		}
		if err := t.do(func(ch *amqp091.Channel) error { return ch.QueueBind(name, key, name, false, nil) }); err != nil {
			return fmt.Errorf("amqp: delayed delivery: bind queue %q: %w", name, err)
		}
		key = "*." + key
	}
	// A 0 bit skips the level: its exchange passes the message straight to
	// the next level's (or, at level 0, to the delivery exchange).
	if err := t.do(func(ch *amqp091.Channel) error {
		return ch.ExchangeDeclare(delayedDelivery, transport.Topic, true, false, false, false, nil)
	}); err != nil {
		return fmt.Errorf("amqp: delayed delivery: declare exchange %q: %w", delayedDelivery, err)
	}
	key = "0.#"
	for level := delayedMaxLevel; level >= 0; level-- {
		next := delayedDelivery
		if level > 0 {
			next = delayedLevel(level - 1)
		}
		src := delayedLevel(level)
		if err := t.do(func(ch *amqp091.Channel) error { return ch.ExchangeBind(next, key, src, false, nil) }); err != nil {
			return fmt.Errorf("amqp: delayed delivery: bind exchange %q to %q: %w", next, src, err)
		}
		key = "*." + key
	}
	t.sess.setDeclared(declaredDelayed)
	return nil
}

// bindDelayed binds a consumed queue's exchange to the delivery exchange and
// the queue to its exchange with the "#.<key>" pattern, so that a message
// leaving the levels reaches it. Direct exchanges match keys exactly and
// cannot take part: Celery warns and holds such tasks in the worker, and so
// does celeriac.
func bindDelayed(s *settings, t *topo, qs *queueState) error {
	q := qs.q
	if q.ExchangeType == transport.Direct || qs.exchangeMismatch {
		if !qs.delayedWarned {
			qs.delayedWarned = true
			s.log.Warn("amqp queue's exchange is not a known topic or fanout exchange; native delayed delivery cannot route to it, so its countdown tasks are held by the worker (set the exchange type to topic)",
				zap.String("queue", q.Name), zap.String("exchange", q.Exchange), zap.String("type", q.ExchangeType))
		}
		return nil
	}
	key := delayedBindingKey(q.RoutingKey)
	if err := t.do(func(ch *amqp091.Channel) error { return ch.ExchangeBind(q.Exchange, key, delayedDelivery, false, nil) }); err != nil {
		return fmt.Errorf("amqp: delayed delivery: bind exchange %q: %w", q.Exchange, err)
	}
	if err := t.do(func(ch *amqp091.Channel) error { return ch.QueueBind(q.Name, key, q.Exchange, false, nil) }); err != nil {
		return fmt.Errorf("amqp: delayed delivery: bind queue %q: %w", q.Name, err)
	}
	return nil
}

// plainRoute is where p goes without a delay. A message addressed to the
// topology (a retry of a task that came out of it, retried at once or
// with delayed delivery off) goes to the delivery exchange with its key
// unprefixed, so that the bits it arrived with do not delay it again.
func plainRoute(p *transport.Publishing) (exchange, key string) {
	if isDelayedExchange(p.Exchange) {
		return delayedDelivery, stripDelayedPrefix(p.RoutingKey)
	}
	return p.Exchange, p.RoutingKey
}

// delayedRoute is where p goes into the levels: when delayed delivery is
// on, p is a task with a countdown of at least a second, and its exchange
// is known to route "#.<key>" bindings.
// now is called only then, so that other publishes do not pay for it. A
// key the prefix would take past AMQP's 255 bytes is not delayed.
func (t *Transport) delayedRoute(p *transport.Publishing, now func() time.Time) (exchange, key string, ok bool) {
	if p.Exchange == "" || !t.delayedActive() || !t.routableKind(p) {
		return "", "", false
	}
	countdown, ok := countdownOf(&p.Message, now)
	if !ok {
		return "", "", false
	}
	key = delayedRoutingKey(countdown, p.RoutingKey)
	if len(key) > delayedMaxKey {
		return "", "", false
	}
	return delayedLevel(delayedMaxLevel), key, true
}

// delayedActive reports whether publishes use the topology.
func (t *Transport) delayedActive() bool {
	switch t.s.DelayedDelivery {
	case DelayedOn:
		return true
	case DelayedOff:
		return false
	}
	return t.quorumSeen.Load()
}

// routableKind reports whether p's exchange is known to route "#.<key>"
// bindings: a topic or fanout exchange, named in p or learnt from a
// consumed queue's declaration. Unknown exchanges are left alone.
func (t *Transport) routableKind(p *transport.Publishing) bool {
	kind := p.ExchangeType
	if kind == "" {
		if isDelayedExchange(p.Exchange) {
			return true
		}
		if v, ok := t.exchangeKinds.Load(p.Exchange); ok {
			kind = v.(string)
		}
	}
	return kind == transport.Topic || kind == transport.Fanout
}

// countdownOf is the whole seconds from now to the message's eta header, as
// Celery truncates them; ok is false without an eta, under a second, or
// beyond what 28 bits hold.
func countdownOf(m *protocol.Message, now func() time.Time) (int64, bool) {
	s, _ := m.Headers["eta"].(string)
	if s == "" {
		return 0, false
	}
	eta, err := protocol.ParseTime(s)
	if err != nil {
		return 0, false
	}
	secs := int64(eta.Sub(now()) / time.Second)
	return secs, secs >= 1 && secs <= delayedMaxCountdown
}

// setupDelayed learns the exchange types and quorum-ness of queues and,
// when delayed delivery is on, declares the topology and binds them to it.
// It runs after the queues were declared (a mismatch teaches their type).
// Only a lost connection is returned; any other failure is logged and the
// worker holds those countdown tasks itself, as Celery's bootstep only
// warns.
func (t *Transport) setupDelayed(tp *topo, queues []*queueState, log *zap.Logger) error {
	for _, qs := range queues {
		if qs.quorum {
			t.quorumSeen.Store(true)
		}
		if qs.exchangeMismatch {
			t.exchangeKinds.Delete(qs.q.Exchange)
		} else {
			t.exchangeKinds.Store(qs.q.Exchange, qs.q.ExchangeType)
		}
	}
	if !t.delayedActive() || t.s.Declare != DeclareAll {
		return nil
	}
	err := declareDelayedTopology(t.s, tp)
	for _, qs := range queues {
		if err != nil {
			break
		}
		err = bindDelayed(t.s, tp, qs)
	}
	if err != nil && !isConnectionError(err, tp.sess) {
		log.Warn("amqp native delayed delivery could not be set up; countdown tasks are held by the worker", zap.Error(err))
		return nil
	}
	return err
}

// ensureDelayed makes sure the topology exists on the publishing
// connection before a message is routed into it (a message published into
// missing levels would be dropped unroutable). A passive check of the
// entry and exit exchanges suffices when a worker declared the levels
// (consuming declares them whole); with DeclareAll a missing topology is
// declared. The answer is kept for the connection: a failure is logged once
// and later countdown tasks on it go directly, without asking again.
func (t *Transport) ensureDelayed(sess *session) error {
	if sess.wasDeclared(declaredDelayed) {
		return nil
	}
	if sess.wasDeclared(delayedUnavailable) {
		return errDelayedUnavailable
	}
	tp := &topo{sess: sess}
	defer tp.close()
	var err error
	for _, name := range []string{delayedLevel(delayedMaxLevel), delayedDelivery} {
		err = tp.do(func(ch *amqp091.Channel) error {
			return ch.ExchangeDeclarePassive(name, transport.Topic, true, false, false, false, nil)
		})
		if err != nil {
			err = fmt.Errorf("amqp: delayed delivery: exchange %q: %w", name, err)
			break
		}
	}
	if err == nil {
		sess.setDeclared(declaredDelayed)
		return nil
	}
	if isNotFound(err) && t.s.Declare == DeclareAll {
		err = declareDelayedTopology(t.s, tp)
	}
	if err != nil && !isConnectionError(err, sess) {
		t.s.log.Warn("amqp native delayed delivery is not available on this connection; countdown tasks are published directly and held by the worker", zap.Error(err))
		sess.setDeclared(delayedUnavailable)
	}
	return err
}
