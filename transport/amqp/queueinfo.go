package amqp

import (
	"context"
	"fmt"
	"strconv"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// QueueInfo is what RabbitMQ tells about a queue over AMQP, for monitors
// such as celeriac dashboard.
type QueueInfo struct {
	// Exists is false for a queue the broker does not have (the counts
	// are then zero).
	Exists bool
	// Messages ready (delivered, unacknowledged ones are not counted) and
	// consumers attached.
	Messages, Consumers int
	// MaxPriority is the queue's x-max-priority: 0 for a queue without
	// priorities, -1 when the broker would not say.
	MaxPriority int
}

// probePriority is the x-max-priority QueueInfo declares to learn the real
// one: the highest RabbitMQ allows, so that a real queue rarely has it.
const probePriority = 255

// QueueInfo reports a queue's counts and its maximum priority. AMQP has no
// call that returns a queue's arguments (only the management plugin's HTTP
// API does, and it is often not enabled), but RabbitMQ refuses a declaration
// with another x-max-priority than the queue's and names the current value
// in the refusal: QueueInfo declares the queue with x-max-priority 255 on a
// throwaway channel and reads the answer. The probe never changes an
// existing queue; it runs only after a passive declaration found the queue.
func (t *Transport) QueueInfo(ctx context.Context, queue string) (QueueInfo, error) {
	info := QueueInfo{MaxPriority: -1}
	err := t.withPubChannel(ctx, func(ch *amqp091.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return err
		}
		info.Exists, info.Messages, info.Consumers = true, q.Messages, q.Consumers
		return nil
	})
	if isNotFound(err) {
		info.MaxPriority = 0
		return info, nil
	}
	if err != nil {
		return info, fmt.Errorf("amqp: queue %q: %w", queue, err)
	}
	// RabbitMQ names the first argument that differs, which may be another
	// one (x-dead-letter-exchange, x-queue-type): the probe then adopts the
	// queue's value for it and asks again, a few times at most.
	probe := amqp091.Table{"x-max-priority": int32(probePriority)}
	for range 6 {
		perr := t.withPubChannel(ctx, func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(queue, true, false, false, false, probe)
			return err
		})
		if perr == nil {
			info.MaxPriority = probePriority
			return info, nil
		}
		m := asMismatch(perr, "queue", queue)
		switch {
		case m == nil:
			return info, nil
		case m.Argument == "x-max-priority":
			if !m.CurrentSet {
				info.MaxPriority = 0
			} else if n, err := strconv.Atoi(m.Current); err == nil {
				info.MaxPriority = n
			}
			return info, nil
		}
		v, ok := tableValue(m)
		if !ok {
			return info, nil
		}
		if v == nil {
			delete(probe, m.Argument)
		} else {
			probe[m.Argument] = v
		}
	}
	return info, nil
}

// tableValue converts the current value a mismatch names back into the
// AMQP table value that declares it; nil when the queue has none.
func tableValue(m *MismatchError) (any, bool) {
	if !m.CurrentSet {
		return nil, m.DeclaredSet
	}
	switch m.CurrentType {
	case "longstr", "":
		return m.Current, true
	case "signedint", "long", "short", "byte":
		n, err := strconv.ParseInt(m.Current, 10, 64)
		if err != nil {
			return nil, false
		}
		switch m.CurrentType {
		case "long":
			return n, true
		case "short":
			return int16(n), true
		case "byte":
			return int8(n), true
		}
		return int32(n), true
	case "bool":
		return m.Current == "true", true
	}
	return nil, false
}
