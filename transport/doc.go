// Package transport is the contract between the worker and a message broker:
// consume task messages with a prefetch bound, acknowledge, reject or
// dead-letter them, publish with confirmation, and subscribe to broadcasts
// (remote control and events).
//
// Adapters live in sub-packages: transport/amqp (RabbitMQ, kombu's AMQP
// conventions), transport/redis (kombu's Redis conventions) and
// transport/memory (in-process, for tests and the demo). All of them pass the
// conformance suite in transport/transporttest.
//
// transport imports only protocol. The worker depends on this package, never
// on an adapter; only cmd, examples and integration wire adapters in.
package transport
