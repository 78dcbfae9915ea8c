package amqp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/transport"
)

// Topology is declared on throwaway channels: RabbitMQ answers a failed
// declaration by closing the channel, and the channels that consume or
// publish must not die of it.

// topo runs declarations on a channel of one connection, reopening the
// channel after the broker closed it.
type topo struct {
	sess *session
	ch   *amqp091.Channel
}

func (t *topo) do(fn func(ch *amqp091.Channel) error) error {
	if t.ch == nil || t.ch.IsClosed() {
		ch, err := t.sess.conn.Channel()
		if err != nil {
			return err
		}
		t.ch = ch
	}
	return fn(t.ch)
}

func (t *topo) close() {
	if t.ch != nil && !t.ch.IsClosed() {
		_ = t.ch.Close()
	}
}

// queueState is a consumed queue with its effective declaration.
type queueState struct {
	q    transport.Queue // Exchange, ExchangeType and RoutingKey filled in
	args amqp091.Table
	// quorum is learnt from the arguments, a mismatch or a refused global
	// QoS; it turns QoSAuto to per-consumer prefetch.
	quorum bool
	// exchangeMismatch: the exchange exists with another type than q says,
	// so its real type is unknown.
	exchangeMismatch bool
	// delayedWarned: the warning that delayed delivery cannot reach the
	// queue was logged.
	delayedWarned bool
}

// newQueueState applies Celery's defaults to q: exchange and routing key
// named after the queue, a direct exchange, and the configured arguments
// under q's own.
func newQueueState(s *settings, q transport.Queue) (*queueState, error) {
	if q.Name == "" {
		return nil, errors.New("amqp: queue without a name")
	}
	if q.Exchange == "" {
		q.Exchange = q.Name
	}
	if q.ExchangeType == "" {
		q.ExchangeType = transport.Direct
	}
	if q.RoutingKey == "" {
		q.RoutingKey = q.Name
	}
	merged := make(map[string]any, len(s.QueueArguments)+len(q.Arguments))
	for k, v := range s.QueueArguments {
		merged[k] = v
	}
	for k, v := range q.Arguments {
		merged[k] = v
	}
	args, err := toTable(merged)
	if err != nil {
		return nil, fmt.Errorf("amqp: queue %q arguments: %w", q.Name, err)
	}
	if len(args) == 0 {
		args = nil
	}
	qs := &queueState{q: q, args: args}
	if t, _ := args["x-queue-type"].(string); t == "quorum" {
		qs.quorum = true
	}
	return qs, nil
}

// declareQueue declares qs as the policy says, on the throwaway channels of
// t. A declaration the broker refuses as inequivalent is logged and the
// existing entity used, unless StrictTopology.
func declareQueue(s *settings, t *topo, qs *queueState) error {
	q := qs.q
	switch s.Declare {
	case DeclareNone:
		return nil
	case DeclarePassive:
		err := t.do(func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclarePassive(q.Name, true, false, false, false, nil)
			return err
		})
		if err != nil {
			return fmt.Errorf("amqp: queue %q: %w", q.Name, err)
		}
		return nil
	}

	err := t.do(func(ch *amqp091.Channel) error {
		return ch.ExchangeDeclare(q.Exchange, q.ExchangeType, exchangeDurable(q.Exchange), false, false, false, nil)
	})
	if err != nil {
		mm := asMismatch(err, "exchange", q.Exchange)
		if mm == nil {
			return fmt.Errorf("amqp: declare exchange %q: %w", q.Exchange, err)
		}
		if s.StrictTopology {
			return mm
		}
		qs.exchangeMismatch = true
		s.log.Warn("amqp exchange exists with other properties; using it as it is",
			zap.String("exchange", q.Exchange), zap.Error(mm))
	}

	err = t.do(func(ch *amqp091.Channel) error {
		_, err := ch.QueueDeclare(q.Name, true, false, false, false, qs.args)
		return err
	})
	if err != nil {
		mm := asMismatch(err, "queue", q.Name)
		if mm == nil {
			return fmt.Errorf("amqp: declare queue %q: %w", q.Name, err)
		}
		if s.StrictTopology {
			return mm
		}
		if mm.Quorum() {
			qs.quorum = true
		}
		s.log.Warn("amqp queue exists with other arguments; consuming it as it is (set the same arguments to silence this)",
			zap.String("queue", q.Name), zap.String("argument", mm.Argument),
			zap.String("current", mm.Current), zap.String("declared", mm.Declared), zap.Error(mm))
		err = t.do(func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclarePassive(q.Name, true, false, false, false, nil)
			return err
		})
		if err != nil {
			return fmt.Errorf("amqp: queue %q after mismatch: %w", q.Name, err)
		}
	}

	err = t.do(func(ch *amqp091.Channel) error {
		return ch.QueueBind(q.Name, q.RoutingKey, q.Exchange, false, nil)
	})
	if err != nil {
		return fmt.Errorf("amqp: bind queue %q to %q with key %q: %w", q.Name, q.Exchange, q.RoutingKey, err)
	}
	return nil
}

// exchangeDurable follows kombu's defaults: exchanges are durable, except
// the remote-control ones (celery.pidbox, reply.celery.pidbox), which kombu's
// Mailbox declares transient.
func exchangeDurable(name string) bool { return !strings.HasSuffix(name, ".pidbox") }

// ensureExchange makes sure a named exchange exists on sess, declaring it
// with kombu's flags when missing. Existing exchanges are used as they are.
func ensureExchange(s *settings, sess *session, name, kind string) error {
	key := "x:" + name
	if name == "" || s.Declare != DeclareAll || sess.wasDeclared(key) {
		return nil
	}
	if kind == "" {
		kind = transport.Direct
	}
	t := &topo{sess: sess}
	defer t.close()
	err := t.do(func(ch *amqp091.Channel) error {
		return ch.ExchangeDeclarePassive(name, kind, false, false, false, false, nil)
	})
	if isNotFound(err) {
		err = t.do(func(ch *amqp091.Channel) error {
			return ch.ExchangeDeclare(name, kind, exchangeDurable(name), false, false, false, nil)
		})
	}
	if err != nil {
		return fmt.Errorf("amqp: exchange %q: %w", name, err)
	}
	sess.setDeclared(key)
	return nil
}

// ensureQueue makes sure the queue a default-exchange publish is routed to
// exists, declaring it Celery-style (as kombu's maybe_declare does for task
// messages) when missing. Existing queues are used as they are.
func ensureQueue(s *settings, sess *session, name string) error {
	key := "q:" + name
	if name == "" || s.Declare != DeclareAll || sess.wasDeclared(key) {
		return nil
	}
	t := &topo{sess: sess}
	defer t.close()
	err := t.do(func(ch *amqp091.Channel) error {
		_, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		return err
	})
	if isNotFound(err) {
		var qs *queueState
		qs, err = newQueueState(s, transport.Queue{Name: name})
		if err == nil {
			err = declareQueue(s, t, qs)
		}
	}
	if err != nil {
		return err
	}
	sess.setDeclared(key)
	return nil
}

// isNotFound reports a 404 NOT_FOUND channel error.
func isNotFound(err error) bool {
	var ae *amqp091.Error
	return errors.As(err, &ae) && ae.Code == amqp091.NotFound
}

// isConnectionError reports whether err means the connection (not just a
// channel) is gone, so that the operation should wait for a reconnect.
func isConnectionError(err error, sess *session) bool {
	if err == nil {
		return false
	}
	if sess != nil && sess.isLost() {
		return true
	}
	// amqp091 returns the socket's error when a write fails and closes the
	// connection asynchronously.
	var opErr *net.OpError
	if errors.As(err, &opErr) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
		return true
	}
	if errors.Is(err, amqp091.ErrClosed) {
		return sess == nil || sess.isLost()
	}
	var ae *amqp091.Error
	if errors.As(err, &ae) {
		return !ae.Server || ae.Code == amqp091.ConnectionForced || isConnectionCode(ae.Code)
	}
	return false
}

// isConnectionCode reports AMQP reply codes that close the connection rather
// than the channel.
func isConnectionCode(code int) bool {
	switch code {
	case amqp091.ConnectionForced, amqp091.InvalidPath, amqp091.FrameError, amqp091.SyntaxError,
		amqp091.CommandInvalid, amqp091.ChannelError, amqp091.UnexpectedFrame, amqp091.ResourceError,
		amqp091.NotAllowed, amqp091.NotImplemented, amqp091.InternalError:
		return true
	}
	return false
}
