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
// The worker side, [Backend], cannot read results back: Get returns an
// error matching errors.ErrUnsupported. Celery does not support chords on
// this backend, and neither does this package. Unlike the Redis backend, a
// state is sent even after a SUCCESS was sent for the same task (the
// backend keeps no state); Python's client stops listening for a task once
// it got its ready state.
//
// # The caller's side
//
// [Client] is the other end, Celery's rpc ResultConsumer: it declares a
// reply queue named by a random UUID (Celery's app.thread_oid) on the
// default exchange, non-durable, auto-delete, with x-expires =
// result_expires (86 400 000 ms), consumes it, and keeps the states that
// arrive by task id, so that Wait wakes as soon as a ready state is
// delivered, without polling, and a state that arrives before anyone waits
// for it is not lost (up to ClientConfig.MaxStates of them). Task messages
// carry [Client.ReplyTo] as their reply_to. It works over any
// transport.Transport: on RabbitMQ the queue is a broadcast subscription's
// transient queue, on Redis the list workers LPUSH replies to
// ([QueueKind]; the default finds out which with a probe). Client is a
// backend.Backend as well, the one package client reads results from.
//
//	c, err := rpc.NewClient(ctx, tr, rpc.ClientConfig{})
//	cl := client.New(tr, client.Config{Backend: c}) // reply_to = c.ReplyTo()
//	r, err := cl.Send(ctx, "tasks.add", []any{2, 3}, nil)
//	v, err := r.Get(ctx)
//
// # Why this package imports transport
//
// Replies travel over the broker, so the backend needs something that
// publishes. Rather than depend on an adapter, the package declares the one
// method it needs, [transport.Publisher], whose argument is a *transport.Publishing;
// any transport.Transport satisfies it. [Client] consumes as well, so it
// takes a transport.Transport. These are the only imports of transport
// from backend/*: the contracts otherwise stay independent.
//
//	be, err := rpc.New(amqpTransport, rpc.Config{})
//	err = be.Store(ctx, backend.StoreRequest{Meta: meta, ReplyTo: task.ReplyTo, CorrelationID: task.CorrelationID})
package rpc
