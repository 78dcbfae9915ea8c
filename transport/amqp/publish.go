package amqp

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/transport"
)

// maxRefusals bounds how often one Publish sends its message again after
// the broker closed the channel, or the connection with an error of its own
// (see closedOverInput), before confirming it, so that a message the broker
// keeps refusing (an exchange deleted under it, a permission, a frame the
// broker cannot parse) returns an error instead of looping. Each try can
// cost the whole publishing connection, so the bound is small.
const maxRefusals = 3

// Publish sends one message and, unless p.NoConfirm, returns once the broker
// has confirmed it (publisher confirms on a dedicated channel); a nack is an
// error. During a connection outage Publish waits for the reconnection,
// bounded by ctx, and publishes on the new connection. A message whose
// confirm was lost with the connection is published again, so the broker may
// hold it twice: delivery is at least once.
//
// Exchange "" is the default exchange: RoutingKey names the queue (Celery's
// anonymous-exchange convention). With DeclareAll, a missing named exchange
// is declared with kombu's flags (durable, except *.pidbox exchanges), and
// for a persistent message (DeliveryMode 2, a task) to the default exchange
// a missing target queue is declared as Celery declares task queues, as
// kombu's maybe_declare does; transient messages (results, replies, events)
// never create queues. Publish is safe for concurrent use.
//
// A message AMQP cannot carry (see the conversion rules in convert.go: a
// header of a type with no AMQP field, a NaN or an infinite float, a
// priority above 255) is refused before anything is sent, with an error
// wrapping protocol.ErrUnencodable. When the broker closes the channel or
// the connection over the message before confirming it, Publish tries
// again a few times (the close may have been another publisher's doing)
// and then returns an error wrapping the broker's *amqp091.Error. Config's
// ConfirmTimeout bounds the time spent waiting for confirms over all the
// tries of one Publish.
func (t *Transport) Publish(ctx context.Context, p *transport.Publishing) error {
	if p == nil {
		return errors.New("amqp: nil publishing")
	}
	if t.isClosed() {
		return transport.ErrClosed
	}
	msg, err := publishingFromMessage(&p.Message)
	if err != nil {
		return err
	}
	return t.publish(ctx, p, msg)
}

// publish sends msg, p's message in AMQP form, as Publish describes. Tests
// call it with messages the conversion would refuse, to see what the broker
// does with them.
func (t *Transport) publish(ctx context.Context, p *transport.Publishing, msg amqp091.Publishing) error {
	// plain is p without a delay (out of the delayed-delivery levels, see
	// plainRoute); p becomes the route into them when delayed. Copies are
	// made only when the route changes, which most publishes' does not.
	plain := p
	if ex, key := plainRoute(p); ex != p.Exchange || key != p.RoutingKey {
		c := *p
		c.Exchange, c.RoutingKey, c.ExchangeType = ex, key, transport.Topic
		plain = &c
	}
	ex, key, delayed := t.delayedRoute(p, time.Now)
	p = plain
	if delayed {
		c := *plain
		c.Exchange, c.RoutingKey, c.ExchangeType = ex, key, transport.Topic
		p = &c
	}
	refusals := 0
	budget := confirmBudget{limit: t.s.ConfirmTimeout}
	var prev *session
	for {
		if budget.spent() {
			return fmt.Errorf("amqp: no publisher confirm within ConfirmTimeout (%v) over the times the message was sent (it may or may not be at the broker): %w",
				t.s.ConfirmTimeout, context.DeadlineExceeded)
		}
		sess, pc, err := t.publishChannel(ctx, prev, !p.NoConfirm)
		if err != nil {
			return err
		}
		ch := pc.ch
		if delayed {
			if err := t.ensureDelayed(sess); err != nil {
				if isConnectionError(err, sess) {
					prev = sess
					continue
				}
				// Logged once by ensureDelayed: the worker holds it.
				delayed, p = false, plain
			}
		}
		err = t.ensurePublishTopology(sess, p)
		if err != nil {
			if isConnectionError(err, sess) {
				prev = sess
				continue
			}
			return err
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, p.Exchange, p.RoutingKey, false, false, msg)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if isConnectionError(err, sess) {
				prev = sess
				continue
			}
			if ch.IsClosed() {
				continue
			}
			return fmt.Errorf("amqp: publish: %w", err)
		}
		if p.NoConfirm || dc == nil {
			return nil
		}
		ack, err := budget.wait(ctx, dc)
		// amqp091 settles a pending confirm as a nack when its channel
		// closes, connection losses included: ch tells the cases apart.
		var reason error
		switch {
		case err != nil:
			return fmt.Errorf("amqp: waiting for the publisher confirm (the message may or may not be at the broker): %w", err)
		case ack:
			return nil
		case !ch.IsClosed():
			return errNack
		case sess.isLost():
			prev = sess
			select {
			case <-sess.lost: // sess.err is set
			case <-ctx.Done():
				return ctx.Err()
			}
			if !closedOverInput(sess.err) {
				// An outage: send the message again once reconnected.
				continue
			}
			reason = sess.err
		default:
			reason = pc.closeReason()
		}
		refusals++
		if refusals >= maxRefusals {
			return fmt.Errorf("amqp: publish to exchange %q key %q: the broker closed the channel or connection %d times before confirming the message: %w",
				p.Exchange, p.RoutingKey, refusals, reason)
		}
	}
}

// confirmBudget is ConfirmTimeout spread over the times one Publish sends
// its message: a message sent again after a connection loss waits only for
// what is left, so that no series of losses stretches the wait.
type confirmBudget struct {
	limit time.Duration // ConfirmTimeout; not positive: only ctx bounds the waits
	used  time.Duration
}

// spent reports whether nothing is left to wait.
func (b *confirmBudget) spent() bool { return b.limit > 0 && b.used >= b.limit }

// wait waits for dc's confirm within what is left and ctx.
func (b *confirmBudget) wait(ctx context.Context, dc interface {
	WaitContext(context.Context) (bool, error)
}) (bool, error) {
	if b.limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.limit-b.used)
		defer cancel()
	}
	start := time.Now()
	ack, err := dc.WaitContext(ctx)
	b.used += time.Since(start)
	return ack, err
}

// closedOverInput reports whether the broker closed the connection over
// something a client sent on it (a frame it could not parse, a crash of
// the channel process: RabbitMQ's 5xx codes), as opposed to an outage: a
// network failure, or CONNECTION_FORCED from an operator or a stopping
// node, after which the message is simply sent again.
func closedOverInput(err error) bool {
	var ae *amqp091.Error
	return errors.As(err, &ae) && ae.Server && ae.Code != amqp091.ConnectionForced
}

// ensurePublishTopology declares what a publish needs (see Publish).
func (t *Transport) ensurePublishTopology(sess *session, p *transport.Publishing) error {
	if p.Exchange != "" {
		return ensureExchange(t.s, sess, p.Exchange, p.ExchangeType)
	}
	if p.Message.Properties.DeliveryMode == 2 {
		return ensureQueue(t.s, sess, p.RoutingKey)
	}
	return nil
}

// publishChannel returns the confirm (or plain) publishing channel of the
// live publishing connection, opening it when needed. prev is a connection
// the caller found lost.
func (t *Transport) publishChannel(ctx context.Context, prev *session, confirm bool) (*session, *pubChannel, error) {
	for {
		if t.isClosed() {
			return nil, nil, transport.ErrClosed
		}
		sess, err := t.pub.next(ctx, prev)
		if err != nil {
			return nil, nil, err
		}
		t.pubMu.Lock()
		if t.pubSess != sess {
			t.pubSess, t.confirmC, t.plainC = sess, nil, nil
		}
		slot := &t.plainC
		if confirm {
			slot = &t.confirmC
		}
		pc := *slot
		if pc == nil || pc.ch.IsClosed() {
			pc, err = openPubChannel(sess, confirm)
			if err == nil {
				*slot = pc
			}
		}
		t.pubMu.Unlock()
		if err == nil {
			return sess, pc, nil
		}
		if isConnectionError(err, sess) {
			prev = sess
			continue
		}
		return nil, nil, fmt.Errorf("amqp: open publishing channel: %w", err)
	}
}

// pubChannel is a publishing channel and the notification of its closing.
type pubChannel struct {
	ch     *amqp091.Channel
	closed chan *amqp091.Error
}

func openPubChannel(sess *session, confirm bool) (*pubChannel, error) {
	ch, err := sess.conn.Channel()
	if err != nil {
		return nil, err
	}
	if confirm {
		if err := ch.Confirm(false); err != nil {
			_ = ch.Close()
			return nil, err
		}
	}
	return &pubChannel{ch: ch, closed: ch.NotifyClose(make(chan *amqp091.Error, 1))}, nil
}

// closeReason returns why the broker closed the channel, when known (only
// the first caller learns it).
func (pc *pubChannel) closeReason() error {
	select {
	case e, ok := <-pc.closed:
		if ok && e != nil {
			return e
		}
	default:
	}
	return amqp091.ErrClosed
}
