// Package rpc is Celery's RPC result backend (result_backend = "rpc://"):
// each state is sent as a message to the client's reply queue instead of
// being stored, so that a Python client waiting in AsyncResult.get() on its
// reply_to queue receives it.
//
// A state goes to the default exchange "" with routing key = the task
// message's reply_to and correlation_id = its correlation id (the task id
// when absent), delivery mode 1 (2 with Config.Persistent), empty headers,
// and Celery 5.2's body {"task_id", "status", "result", "traceback",
// "children"}. Nothing is declared. A task message without reply_to gets no
// reply, as in Celery.
//
// Results cannot be read back: Get returns an error matching
// errors.ErrUnsupported. Celery does not support chords on this backend, and
// neither does this package. Unlike the Redis backend, a state is sent even
// after a SUCCESS was sent for the same task (the backend keeps no state);
// Python's client stops listening for a task once it got its ready state.
//
// # Why this package imports transport
//
// Replies travel over the broker, so the backend needs something that
// publishes. Rather than depend on an adapter, the package declares the one
// method it needs, [Publisher], whose argument is a *transport.Publishing;
// any transport.Transport satisfies it. This is the only import of transport
// from backend/*: the contracts otherwise stay independent.
//
//	be, err := rpc.New(amqpTransport, rpc.Config{})
//	err = be.Store(ctx, backend.StoreRequest{Meta: meta, ReplyTo: task.ReplyTo, CorrelationID: task.CorrelationID})
package rpc
