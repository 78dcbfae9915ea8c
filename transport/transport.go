package transport

import (
	"context"
	"errors"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

// Errors returned by transports. Adapters wrap broker errors with %w so that
// callers can still reach the client library's error values.
var (
	// ErrClosed: the transport, consumer or subscription was closed.
	ErrClosed = errors.New("transport: closed")
	// ErrStaleDelivery: the delivery belongs to a channel or connection that
	// is gone. The broker redelivers the message; the caller should log and
	// move on, not retry the acknowledgement.
	ErrStaleDelivery = errors.New("transport: stale delivery")
	// ErrAlreadyAcknowledged: Ack, Reject or DeadLetter was already called.
	ErrAlreadyAcknowledged = errors.New("transport: delivery already acknowledged")
	// ErrTopologyMismatch: a queue or exchange exists with other arguments
	// than those configured. The error text says what differs.
	ErrTopologyMismatch = errors.New("transport: existing queue or exchange differs")
)

// Exchange types.
const (
	Direct = "direct"
	Fanout = "fanout"
	Topic  = "topic"
)

// Queue describes a task queue to consume, declared as Celery declares it: a
// durable queue bound to a direct exchange of the same name with a routing
// key equal to the queue name, unless fields say otherwise.
type Queue struct {
	Name string
	// Exchange defaults to Name; ExchangeType defaults to Direct.
	Exchange     string
	ExchangeType string
	// RoutingKey defaults to Name.
	RoutingKey string
	// Arguments are the queue declaration arguments (x-max-priority,
	// x-dead-letter-exchange, x-queue-type, ...). They must equal those of an
	// existing queue on RabbitMQ; see ErrTopologyMismatch.
	Arguments map[string]any
}

// ConsumeOptions tune a consumer.
type ConsumeOptions struct {
	// Prefetch bounds the deliveries handed out and not yet acknowledged,
	// rejected or dead-lettered. Zero means unlimited.
	Prefetch int
	// PerQueuePrefetch applies Prefetch to each queue on its own instead of
	// to all of them together (Celery's), so that a message taken from a
	// queue is replaced from that queue: a consumer that prefers one queue
	// (strict or weighted queue order) then holds what it prefers, where a
	// shared window is refilled in the broker's order. RabbitMQ uses
	// per-consumer basic.qos, Redis one pop per queue with room; the memory
	// transport ignores it.
	PerQueuePrefetch bool
}

// Publisher is the part of a Transport that sends: what a task producer
// (client.Client) or the RPC result backend needs.
type Publisher interface {
	Publish(ctx context.Context, p *Publishing) error
}

// Transport is a connection to one broker. Implementations are safe for
// concurrent use. Close releases everything; after Close every method returns
// ErrClosed.
type Transport interface {
	// Consume declares the queues (when the adapter declares topology) and
	// starts delivering their messages. Cancelling ctx only aborts the setup;
	// stop the consumer with Consumer.Stop.
	Consume(ctx context.Context, queues []Queue, opts ConsumeOptions) (Consumer, error)

	// Publish sends one message and returns once the broker has confirmed it
	// (publisher confirm on AMQP, the command's reply on Redis), unless
	// p.NoConfirm is set. A nil error means the message is durable at the
	// broker as far as the broker can promise. A message with a header
	// value no broker can carry (a channel, a func, a NaN or an infinite
	// float, which RabbitMQ cannot parse) is refused before anything is
	// sent, on every adapter, with an error wrapping
	// protocol.ErrUnencodable: sending it again cannot help.
	Publish(ctx context.Context, p *Publishing) error

	// Subscribe receives the messages published to a broadcast exchange
	// (celery.pidbox, celeryev). Broadcast deliveries need no acknowledgement.
	Subscribe(ctx context.Context, b Broadcast) (Subscription, error)

	// Close stops all consumers and subscriptions and closes connections.
	// Unacknowledged deliveries are returned to the broker as the broker does
	// it: AMQP requeues them, the Redis adapter restores them.
	Close() error
}

// Consumer hands out deliveries from a set of queues.
type Consumer interface {
	// Deliveries is closed after Stop, or after Close of the transport. It
	// is also closed if the consumer fails for good; Err then says why.
	Deliveries() <-chan *Delivery

	// SetPrefetch changes the prefetch bound (Celery raises it by one per
	// held ETA task). Zero means unlimited.
	SetPrefetch(n int) error

	// AddQueue starts consuming one more queue (remote control add_consumer).
	AddQueue(ctx context.Context, q Queue) error
	// CancelQueue stops consuming a queue (remote control cancel_consumer).
	CancelQueue(ctx context.Context, name string) error
	// Queues lists the queues being consumed.
	Queues() []Queue

	// Stop stops fetching and closes Deliveries. Deliveries already handed
	// out stay valid: they can still be acknowledged, rejected or
	// dead-lettered until the transport is closed.
	Stop(ctx context.Context) error

	// Err reports why Deliveries was closed, or nil after Stop.
	Err() error
}

// Delivery is one message handed out by a consumer. Exactly one of Ack,
// Reject or DeadLetter may be called; later calls return
// ErrAlreadyAcknowledged.
type Delivery struct {
	Message protocol.Message
	// Queue is the queue the message was consumed from.
	Queue string
	// Exchange and RoutingKey are those the message was published with
	// (exchange "" is the default exchange, routing key = queue).
	Exchange   string
	RoutingKey string
	// Redelivered is true when the broker (or kombu's restore) delivered the
	// message before.
	Redelivered bool
	// Tag identifies the delivery to its transport (the AMQP delivery tag as a
	// decimal string, the kombu delivery_tag UUID on Redis).
	Tag string
	// ReceivedAt is when the transport received the message.
	ReceivedAt time.Time

	Acknowledger Acknowledger
}

// Ack acknowledges the delivery: the broker forgets the message.
func (d *Delivery) Ack(ctx context.Context) error {
	if d.Acknowledger == nil {
		return nil
	}
	return d.Acknowledger.Ack(ctx, d)
}

// AckAsync starts acknowledging the delivery and returns a function that
// waits for the broker's answer; the delivery counts as settled at once. An
// error from AckAsync itself (ErrClosed, ErrAlreadyAcknowledged) means the
// ack was not sent. An Acknowledger that is not an AsyncAcknowledger
// acknowledges here, as Ack does, and wait has nothing left to wait for.
func (d *Delivery) AckAsync(ctx context.Context) (wait func(context.Context) error, err error) {
	if a, ok := d.Acknowledger.(AsyncAcknowledger); ok {
		return a.AckAsync(ctx, d)
	}
	if err := d.Ack(ctx); err != nil {
		return nil, err
	}
	return func(context.Context) error { return nil }, nil
}

// Reject returns the message to the broker (requeue) or drops it. On AMQP a
// reject without requeue is dead-lettered when the queue has a DLX.
func (d *Delivery) Reject(ctx context.Context, requeue bool) error {
	if d.Acknowledger == nil {
		return nil
	}
	return d.Acknowledger.Reject(ctx, d, requeue)
}

// DeadLetter removes the message from its queue and keeps it where a person
// can list and replay it: on AMQP a basic.reject without requeue (the queue's
// dead-letter exchange catches it), on Redis a dead-letter list per queue
// holding the original envelope with the reason.
func (d *Delivery) DeadLetter(ctx context.Context, r DeadLetterReason) error {
	if d.Acknowledger == nil {
		return nil
	}
	return d.Acknowledger.DeadLetter(ctx, d, r)
}

// Acknowledger settles deliveries. Transports implement it; tests may supply
// fakes.
type Acknowledger interface {
	Ack(ctx context.Context, d *Delivery) error
	Reject(ctx context.Context, d *Delivery, requeue bool) error
	DeadLetter(ctx context.Context, d *Delivery, r DeadLetterReason) error
}

// AsyncAcknowledger is an Acknowledger whose acks can be started without
// waiting for the broker, where waiting costs a round trip (Redis). See
// Delivery.AckAsync.
type AsyncAcknowledger interface {
	Acknowledger
	AckAsync(ctx context.Context, d *Delivery) (wait func(context.Context) error, err error)
}

// DeadLetterReason says why a message was dead-lettered.
type DeadLetterReason struct {
	// Reason is a short machine-readable cause: "max-retries", "permanent",
	// "not-registered", "undecodable", "rejected", ...
	Reason string
	// Error is the error text (for a task failure, the exception).
	Error string
	// TaskID and TaskName when known.
	TaskID   string
	TaskName string
	// Time is when the message was dead-lettered.
	Time time.Time
}

// Publishing is a message to publish.
type Publishing struct {
	// Exchange "" is the default exchange: RoutingKey names the queue.
	Exchange string
	// ExchangeType of a named exchange (Direct, Fanout or Topic). The Redis
	// adapter needs it to route; empty means Direct.
	ExchangeType string
	RoutingKey   string
	Message      protocol.Message
	// NoConfirm skips waiting for the broker's confirmation (events, remote
	// control replies).
	NoConfirm bool
}

// Broadcast describes a broadcast subscription: a fanout or topic exchange and
// the queue that receives its messages on AMQP.
type Broadcast struct {
	Exchange     string
	ExchangeType string // Fanout (default) or Topic
	// BindingKey is the topic pattern ("worker.#"); empty for fanout.
	BindingKey string
	// Queue is the AMQP queue to declare and bind (e.g. "w1@host.celery.pidbox");
	// empty means a generated name. Ignored on Redis, which uses pub/sub.
	Queue string
	// QueueArguments for the AMQP queue (x-message-ttl, x-expires).
	QueueArguments map[string]any
}

// Subscription receives broadcast messages.
type Subscription interface {
	// Deliveries is closed after Close. Broadcast deliveries need no
	// acknowledgement.
	Deliveries() <-chan *Delivery
	Close() error
}

// Admin is implemented by transports that can inspect and purge queues (all
// adapters in this module do).
type Admin interface {
	// Len returns the number of ready messages in a queue (all priority bands
	// on Redis).
	Len(ctx context.Context, queue string) (int, error)
	// Purge deletes the ready messages of a queue and returns how many.
	Purge(ctx context.Context, queue string) (int, error)
}

// DeadLetterStore is implemented by transports that keep dead-lettered
// messages themselves (Redis, where kombu has no dead-lettering, and the
// in-memory transport). On RabbitMQ the queue's dead-letter exchange keeps
// them; the amqp adapter implements this interface over the dead-letter queue.
type DeadLetterStore interface {
	// DeadLetters lists up to limit dead messages of a queue, oldest first,
	// without removing them. limit <= 0 means all.
	DeadLetters(ctx context.Context, queue string, limit int) ([]DeadMessage, error)
	// Replay moves dead messages back to the queue they came from (all of the
	// queue's when ids is empty) and returns how many moved. A message is
	// removed from the dead letters only after it is safely back in its
	// queue, so a replay that fails halfway loses nothing.
	Replay(ctx context.Context, queue string, ids []string, opts ReplayOptions) (int, error)
	// PurgeDead deletes dead messages (all of the queue's when ids is empty)
	// and returns how many.
	PurgeDead(ctx context.Context, queue string, ids []string) (int, error)
}

// DeadMessage is one dead-lettered message.
type DeadMessage struct {
	// ID identifies the dead message within its store (the delivery tag on
	// Redis).
	ID         string
	Queue      string
	Exchange   string
	RoutingKey string
	Message    protocol.Message
	Reason     DeadLetterReason
}

// ReplayOptions tune Replay.
type ReplayOptions struct {
	// ResetRetries sets the task's retries header back to 0, so the task gets
	// its full retry budget again. Otherwise the count is kept.
	ResetRetries bool
}
