package amqp

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/transport"
)

// maxChannelFailures bounds how often one Publish retries after its channel
// (not the connection) was closed by the broker, so that a publish the broker
// keeps refusing (an exchange deleted under it, a permission) returns an
// error instead of looping.
const maxChannelFailures = 3

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
	failures := 0
	var prev *session
	for {
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
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if t.s.ConfirmTimeout > 0 {
			cctx, cancel = context.WithTimeout(ctx, t.s.ConfirmTimeout)
		}
		ack, err := dc.WaitContext(cctx)
		cancel()
		switch {
		case err != nil:
			return fmt.Errorf("amqp: waiting for the publisher confirm (the message may or may not be at the broker): %w", err)
		case ack:
			return nil
		case !ch.IsClosed():
			return errNack
		case sess.isLost():
			prev = sess
		default:
			failures++
			if failures >= maxChannelFailures {
				return fmt.Errorf("amqp: publish to exchange %q key %q: the broker closed the channel %d times: %w",
					p.Exchange, p.RoutingKey, failures, pc.closeReason())
			}
		}
	}
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
