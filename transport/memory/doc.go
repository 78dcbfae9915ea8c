// Package memory is an in-process message broker and a transport for it. It
// serves unit tests of code built on package transport and celeriac's
// embedded demo, so it behaves like a real broker rather than like a channel:
// it passes the same conformance suite (transport/transporttest.Run) as the
// RabbitMQ and Redis adapters.
//
// # Model
//
// A [Broker] holds queues, exchanges with their bindings and a dead-letter
// store. A [Transport] is one connection to a broker; several transports can
// share a broker (New(Config{Broker: b})), and the broker outlives them, so
// that messages a closed transport left unsettled are consumed by the next
// one, as with a real broker.
//
// Behaviour, and where it follows RabbitMQ or Redis:
//
//   - Queues are FIFO per priority, higher priority first, on every queue
//     (as if declared with RabbitMQ's x-max-priority 255; a queue's
//     x-max-priority argument lowers the cap, and priorities above it count
//     as the cap). Negative priorities count as 0. Note that kombu's Redis
//     transport orders the other way round (lower first).
//   - Publishing to exchange "" puts the message in the queue named by the
//     routing key, creating the queue when missing (like Redis; RabbitMQ would
//     drop it). Named exchanges route through bindings: Consume binds each
//     queue to its direct (or topic) exchange with Queue.RoutingKey,
//     Subscribe binds a broadcast queue to a fanout or topic exchange. Topic
//     patterns follow AMQP ("*" one word, "#" zero or more words). A message
//     that matches no binding is dropped and counted ([Broker.Stats]).
//   - Messages are deep-copied at publish and again at delivery: publisher
//     and consumers never share header maps, slices or body bytes. Header and
//     extra property values are converted to protocol's value types at
//     publish with protocol.ToValueStrict (int → int64, float32(0.1) → 0.1,
//     []string → []any, ...), as the Redis and AMQP adapters convert them.
//     Structs, maps without string keys, channels, funcs and cycles make
//     Publish fail, as on AMQP (the Redis adapter sends a struct as
//     encoding/json writes it). Typed slices and maps such as []int are
//     accepted, as on Redis; the AMQP adapter accepts only []string and
//     map[string]string. A header that is or holds a NaN or an infinite
//     float makes Publish fail with an error wrapping
//     protocol.ErrUnencodable, as on every adapter (RabbitMQ cannot carry
//     one).
//   - A consumer never has more than Prefetch deliveries handed out and not
//     settled; SetPrefetch applies at once in both directions. Consumers of
//     one queue share its messages; one consumer takes from its queues in
//     turn.
//   - Ack forgets the message; Reject with requeue puts it back at the head
//     of its queue marked Redelivered; Reject without requeue drops it, unless
//     the queue was declared with x-dead-letter-exchange, in which case it is
//     kept in the dead-letter store with reason "rejected" (RabbitMQ would
//     route it to the DLX). DeadLetter keeps it in the store with the given
//     reason. Settling twice returns transport.ErrAlreadyAcknowledged.
//   - Replay moves dead messages to the tail of their queue (ResetRetries
//     sets headers["retries"] to int64(0)).
//   - Consumer.Stop closes Deliveries; messages taken but not yet received
//     return to their queue unmarked, and deliveries already received stay
//     settleable. Transport.Close returns every unsettled delivery to the
//     head of its queue, marked Redelivered, and closes everything.
//   - Publish returns once the message is in its queues; there is no
//     persistence beyond the process.
//
// Each consumer and subscription runs one goroutine, owned by its transport
// and ended by Stop, Close or Transport.Close.
//
// A transport created inside a testing/synctest bubble works there: its
// goroutines block only on channels, and it reads the bubble's clock, so
// tests of ETA and backoff run in fake time, and synctest.Wait makes
// "nothing more is delivered" an exact check.
//
// # Sketch
//
//	t := memory.New(memory.Config{})
//	defer t.Close()
//	c, _ := t.Consume(ctx, []transport.Queue{{Name: "celery"}}, transport.ConsumeOptions{Prefetch: 8})
//	_ = t.Publish(ctx, &transport.Publishing{RoutingKey: "celery", Message: msg})
//	d := <-c.Deliveries()
//	_ = d.Ack(ctx)
//
// memory imports only transport and protocol.
package memory
