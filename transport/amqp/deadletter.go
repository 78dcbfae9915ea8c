package amqp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// The dead-letter store reads the queue that the task queue's dead-letter
// exchange routes to, Config.DeadLetterQueue(queue) (queue+".dlq" by
// default). The transport creates that topology only when asked
// (Transport.DeclareDeadLetter); attaching the exchange to the task queue is
// the user's choice: x-dead-letter-exchange in the queue's declaration
// arguments (Config.QueueArguments or the queue's Arguments, equal to what
// Python declares), or a RabbitMQ policy. A dead-letter queue may collect
// several task queues' dead letters: messages are attributed to a task queue
// by RabbitMQ's x-death header (a message without one is attributed to the
// queue asked for).
//
// Dead messages are read with basic.get without acknowledgement and
// returned to the dead-letter queue by closing the channel, so listing
// removes nothing (RabbitMQ keeps their order where it can and marks them
// redelivered), with the per-message TTL (expiration) RabbitMQ moved into
// x-death restored. A message's ID is its task id (the "id" header), else its
// correlation id, else a digest of its body: replaying or purging an ID acts
// on every dead message that has it. The reason given to DeadLetter is not
// stored (it is logged): Reason here is RabbitMQ's ("rejected", "expired",
// "maxlen") with the time of death from x-death.

var _ transport.DeadLetterStore = (*Transport)(nil)

// ArgDeadLetterExchange is the queue argument that names a queue's
// dead-letter exchange; "dead-letter-exchange" is its name in a RabbitMQ
// policy definition.
const ArgDeadLetterExchange = "x-dead-letter-exchange"

// DeadLetterExchange is the name of the exchange [Transport.DeclareDeadLetter]
// declares for a task queue: queue+".dlx".
func DeadLetterExchange(queue string) string { return queue + ".dlx" }

// DeadLetterQueue returns the name of the queue that holds the dead letters
// of a task queue: Config.DeadLetterQueue(queue), queue+".dlq" by default.
func (t *Transport) DeadLetterQueue(queue string) string { return t.s.DeadLetterQueue(queue) }

// DeclareDeadLetter declares the dead-letter topology of a task queue: a
// durable fanout exchange [DeadLetterExchange](queue) and the durable queue
// Config.DeadLetterQueue(queue) (queue+".dlq") bound to it. It is idempotent,
// and the queue's dead letters keep every header, so [Transport.DeadLetters]
// attributes them by x-death.
//
// It does not change the task queue, whose arguments RabbitMQ never lets a
// redeclaration change. It returns the arguments that attach the exchange,
// {"x-dead-letter-exchange": DeadLetterExchange(queue)}, for one of the two
// ways to do it:
//
//   - at declaration, in Config.QueueArguments (worker.Config.QueueArguments
//     for one queue) and in every Python app that declares the queue
//     (Queue(..., queue_arguments=...)), since RabbitMQ refuses a declaration
//     whose arguments differ (406 PRECONDITION_FAILED);
//   - with a policy on the existing queue, which needs no redeclaration and
//     no change to Python:
//     rabbitmqctl set_policy NAME '^queue$' '{"dead-letter-exchange":"queue.dlx"}' --apply-to queues
//
// A fanout exchange routes whatever routing key the message died with (the
// queue name, or the key a Python producer used on another exchange).
func (t *Transport) DeclareDeadLetter(ctx context.Context, queue string) (map[string]any, error) {
	if queue == "" {
		return nil, errors.New("amqp: DeclareDeadLetter: empty queue name")
	}
	x, dlq := DeadLetterExchange(queue), t.s.DeadLetterQueue(queue)
	err := t.withPubChannel(ctx, func(ch *amqp091.Channel) error {
		if err := ch.ExchangeDeclare(x, amqp091.ExchangeFanout, true, false, false, false, nil); err != nil {
			return fmt.Errorf("exchange %q: %w", x, err)
		}
		if _, err := ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
			return fmt.Errorf("queue %q: %w", dlq, err)
		}
		if err := ch.QueueBind(dlq, "", x, false, nil); err != nil {
			return fmt.Errorf("bind %q to %q: %w", dlq, x, err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("amqp: dead-letter topology of %q: %w", queue, err)
	}
	return map[string]any{ArgDeadLetterExchange: x}, nil
}

// DeadLetters implements transport.DeadLetterStore.
func (t *Transport) DeadLetters(ctx context.Context, queue string, limit int) ([]transport.DeadMessage, error) {
	var out []transport.DeadMessage
	err := t.scanDead(ctx, queue, func(_ *amqp091.Channel, _ amqp091.Delivery, dm transport.DeadMessage) (bool, error) {
		out = append(out, dm)
		return limit <= 0 || len(out) < limit, nil
	})
	return out, err
}

// Replay implements transport.DeadLetterStore: each selected dead message
// is published back to the queue it died in (default exchange, the queue as
// routing key) with a publisher confirm, and only then acknowledged in the
// dead-letter queue; a replay that fails halfway leaves the rest dead and
// may leave one message both replayed and dead, never lost. RabbitMQ's
// death annotations (x-death, x-first-death-*, x-last-death-*) are removed.
func (t *Transport) Replay(ctx context.Context, queue string, ids []string, opts transport.ReplayOptions) (int, error) {
	n := 0
	err := t.scanDead(ctx, queue, func(ch *amqp091.Channel, d amqp091.Delivery, dm transport.DeadMessage) (bool, error) {
		if len(ids) > 0 && !slices.Contains(ids, dm.ID) {
			return true, nil
		}
		m := dm.Message
		m.Headers = maps.Clone(m.Headers)
		for k := range m.Headers {
			if k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-") {
				delete(m.Headers, k)
			}
		}
		if opts.ResetRetries {
			if _, ok := m.Headers["retries"]; ok {
				m.Headers["retries"] = int64(0)
			}
		}
		if err := t.Publish(ctx, &transport.Publishing{RoutingKey: dm.Queue, Message: m}); err != nil {
			return false, fmt.Errorf("amqp: replay %s to %q: %w", dm.ID, dm.Queue, err)
		}
		if err := ch.Ack(d.DeliveryTag, false); err != nil {
			return false, fmt.Errorf("amqp: replayed %s to %q but could not remove it from the dead letters: %w", dm.ID, dm.Queue, err)
		}
		n++
		return true, nil
	})
	return n, err
}

// PurgeDead implements transport.DeadLetterStore.
func (t *Transport) PurgeDead(ctx context.Context, queue string, ids []string) (int, error) {
	n := 0
	err := t.scanDead(ctx, queue, func(ch *amqp091.Channel, d amqp091.Delivery, dm transport.DeadMessage) (bool, error) {
		if len(ids) > 0 && !slices.Contains(ids, dm.ID) {
			return true, nil
		}
		if err := ch.Ack(d.DeliveryTag, false); err != nil {
			return false, fmt.Errorf("amqp: purge dead %s: %w", dm.ID, err)
		}
		n++
		return true, nil
	})
	return n, err
}

// scanDead reads the dead-letter queue of queue once, oldest first, calling
// fn for each message that died in queue, until fn returns false. Messages
// fn does not acknowledge go back to the dead-letter queue. A missing
// dead-letter queue holds nothing.
func (t *Transport) scanDead(ctx context.Context, queue string, fn func(*amqp091.Channel, amqp091.Delivery, transport.DeadMessage) (bool, error)) error {
	dlq := t.s.DeadLetterQueue(queue)
	sess, err := t.pub.current(ctx)
	if err != nil {
		return err
	}
	ch, err := sess.conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp: dead letters of %q: %w", queue, err)
	}
	// Closing the channel returns every message got and not acknowledged.
	defer func() {
		if !ch.IsClosed() {
			_ = ch.Close()
		}
	}()
	q, err := ch.QueueDeclarePassive(dlq, true, false, false, false, nil)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("amqp: dead-letter queue %q: %w", dlq, err)
	}
	// Reading at most the messages present at the start makes the scan end
	// even while new dead letters arrive.
	for range q.Messages {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, ok, err := ch.Get(dlq, false)
		if err != nil {
			return fmt.Errorf("amqp: read dead-letter queue %q: %w", dlq, err)
		}
		if !ok {
			return nil
		}
		dm, err := deadMessage(&d, queue)
		if err != nil {
			return fmt.Errorf("amqp: dead letter %d of %q: %w", d.DeliveryTag, dlq, err)
		}
		if dm.Queue != queue {
			continue
		}
		more, err := fn(ch, d, dm)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// deadMessage describes a message read from a dead-letter queue; fallback
// is the task queue assumed when the message has no x-death header.
func deadMessage(d *amqp091.Delivery, fallback string) (transport.DeadMessage, error) {
	m, err := messageFromDelivery(d)
	if err != nil {
		return transport.DeadMessage{}, err
	}
	dm := transport.DeadMessage{
		ID:         deadID(&m),
		Queue:      fallback,
		Exchange:   d.Exchange,
		RoutingKey: d.RoutingKey,
		Message:    m,
	}
	dm.Reason.TaskID, _ = m.Headers["id"].(string)
	dm.Reason.TaskName, _ = m.Headers["task"].(string)
	// x-death lists deaths, most recent first; the first entry says where
	// the message was when it last died.
	if deaths, ok := m.Headers["x-death"].([]any); ok && len(deaths) > 0 {
		if last, ok := deaths[0].(map[string]any); ok {
			if q, ok := last["queue"].(string); ok && q != "" {
				dm.Queue = q
			}
			if x, ok := last["exchange"].(string); ok {
				dm.Exchange = x
			}
			if keys, ok := last["routing-keys"].([]any); ok && len(keys) > 0 {
				if k, ok := keys[0].(string); ok {
					dm.RoutingKey = k
				}
			}
			dm.Reason.Reason, _ = last["reason"].(string)
			dm.Reason.Time, _ = last["time"].(time.Time)
			// RabbitMQ moves the per-message TTL out of the properties
			// when it dead-letters, so that the dead copy does not expire.
			if exp, ok := last["original-expiration"].(string); ok && dm.Message.Properties.Expiration == "" {
				dm.Message.Properties.Expiration = exp
			}
		}
	}
	return dm, nil
}

// deadID identifies a dead message: its task id, else its correlation id,
// else a digest of its body.
func deadID(m *protocol.Message) string {
	if id, ok := m.Headers["id"].(string); ok && id != "" {
		return id
	}
	if m.Properties.CorrelationID != "" {
		return m.Properties.CorrelationID
	}
	sum := sha256.Sum256(m.Body)
	return "sha256:" + hex.EncodeToString(sum[:8])
}
