// Package amqp is celeriac's RabbitMQ transport, on amqp091-go, speaking the
// conventions of Celery and kombu so that Python and Go producers and
// workers share queues.
//
// # Topology
//
// Each consumed queue is declared as Celery declares it: a durable direct
// exchange and a durable queue of the same name, bound with the queue name as
// routing key, with Config.QueueArguments under the queue's own arguments.
// Python and Go can therefore start in either order. When the queue already
// exists with other arguments (x-max-priority, x-dead-letter-exchange,
// x-queue-type: quorum), RabbitMQ answers 406 PRECONDITION_FAILED and closes
// the channel; the transport parses the broker's message into a
// [MismatchError] (which wraps transport.ErrTopologyMismatch), logs it at warn
// level and consumes the existing queue as it is, or returns the error under
// Config.StrictTopology. Declarations run on throwaway channels, so such
// errors never kill a consuming or publishing channel.
//
// # Consuming and publishing
//
// All queues of a consumer are consumed on one channel, with manual
// acknowledgements and basic.qos: global (shared by the queues, Celery's
// choice on classic queues) unless a queue is a quorum queue. Publishing
// uses publisher confirms on a dedicated channel of a second connection:
// Publish returns after the broker's ack. Publishing to exchange "" with the
// queue as routing key is Celery's anonymous-exchange convention.
//
// # Failures
//
// A lost connection is replaced as Celery replaces it: every URL of the
// ";"-separated failover form once per round (in the order of
// Config.FailoverStrategy, round-robin or shuffle), with Celery's pause of
// 2 s, 4 s, ... 30 s between failed rounds; Transport.Node says which node
// is in use. A lost channel is reopened on the same schedule;
// consumers redeclare and resume with their current prefetch while their
// Deliveries channel stays open. Deliveries from the dead channel fail their
// acknowledgement with transport.ErrStaleDelivery (the broker redelivers
// them). Publish waits out an outage, bounded by its ctx. Heartbeats are on.
//
// # The py-amqp 'L' header tag
//
// py-amqp writes integers outside the int32 range into header tables with the
// tag 'L', which amqp091-go cannot parse: the connection would die on such a
// message and the broker would redeliver it forever. The transport rewrites
// those tags to 'l' (the same signed 64-bit value) in the frames it reads,
// through amqp091's Dial hook, leaving every other byte unchanged. py-amqp
// writes no other tag amqp091-go lacks ('S', 't', 'd', 'I', 'L', 'D', 'T',
// 'F', 'A', 'V' only); a header with a tag neither library knows would still
// fail the connection, as it would fail py-amqp.
//
// # Where it sits
//
// The package implements transport.Transport, transport.Admin and
// transport.DeadLetterStore; it imports transport and protocol. Only cmd,
// examples and integration wire it in:
//
//	tr, err := amqp.Dial(ctx, amqp.Config{URL: "amqp://guest:guest@localhost:5672//"})
//	c, err := tr.Consume(ctx, []transport.Queue{{Name: "celery"}}, transport.ConsumeOptions{Prefetch: 16})
//	for d := range c.Deliveries() { ...; d.Ack(ctx) }
package amqp
