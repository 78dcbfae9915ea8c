// Package worker runs Go handlers for Celery tasks: it consumes the task
// messages Python Celery (or package client) sends, dispatches them by task
// name to handlers registered on a [Mux], and records and settles them as a
// Celery worker does, so Go and Python workers can share queues.
//
// # The life of a task
//
//   - Fetch: [Worker.Run] consumes Config.Queues with a prefetch of
//     Concurrency × PrefetchMultiplier unsettled messages.
//   - Decode and validate: protocol 1 or 2, an accepted content type (never
//     pickle), size and nesting limits. A message that fails, or names a task
//     no handler is registered for, is dead-lettered, with FAILURE stored
//     when it has a task id.
//   - Revoked or expired: not run; REVOKED is stored and the message
//     acknowledged. This is checked on arrival, when a held task comes due
//     and when it starts.
//   - Countdown/ETA: held in memory until due, without taking a slot; the
//     prefetch grows by one per held task, up to ETATaskLimit.
//   - Rate limits: the task's RateLimit, then its GlobalRateLimit, may hold
//     it longer, still without a slot.
//   - Run: the task takes one of Concurrency slots. Its message is
//     acknowledged now unless the task is acks_late. The handler's context
//     carries the [Task] and is cancelled at the soft time limit, on revoke
//     with terminate and at a cold shutdown. At the hard limit the task
//     ends with TimeLimitExceeded and its slot goes to the next task; a
//     panic is recovered as the task's error ([PanicError]).
//   - Outcome, from the handler's error ([Handler]): nil is SUCCESS;
//     [ErrIgnore] records nothing; [Reject] requeues or dead-letters; any
//     other error goes to the task's retry.Policy, which either publishes a
//     retry (retries+1, an ETA; RETRY stored) or fails the task (FAILURE
//     with the Python exception and traceback, see [Exception]).
//   - Store and canvas: the state goes to Config.Backend. On success link
//     callbacks and the next chain step are sent; on failure errbacks, and
//     the remaining chain steps fail. A chord's header task counts its part
//     in the backend, and the last part sends the body (or fails it); on
//     backends that cannot count (SQL), celery.chord_unlock does.
//   - Settle: a message still held (acks_late) is acknowledged, requeued
//     (a shutdown cut its task short, or Reject asked), or dead-lettered
//     when the task was rejected or failed for good, unless
//     [Config.AcksOnFailure] acknowledges failures, as Celery does by
//     default. Result writes, publishes and acks each get their own budget
//     and are tried again while the broker or backend is briefly down; a
//     retry or callback no transport can encode (protocol.ErrUnencodable)
//     fails the task instead.
//   - Events: with SendTaskEvents, task-received, -started, -succeeded,
//     -failed, -retried, -rejected and -revoked reach monitors such as
//     Flower; heartbeats and remote control (celery inspect, revoke) run
//     alongside.
//
// Cancelling Run's context starts a warm shutdown: fetching stops, held and
// unstarted messages go back to the broker, and running tasks get
// ShutdownTimeout to finish. [Worker.Close] is a cold shutdown.
//
// # Where to go next
//
// [Config] holds the worker's settings, named after Celery's; task options
// ([TaskOption]: [AcksLate], [TimeLimit], [RateLimit], [Retry], ...) set one
// task's at registration. [Mux.HandleFunc] registers a [HandlerFunc] and
// [Mux.Use] adds middleware; [Func] and [FuncKwargs] register ordinary Go
// functions whose parameters are the task's positional or keyword
// arguments. Package worker/connect opens the transport and result backend
// from Celery URLs. Package client is the callers' side: it sends tasks and
// canvases, waits for results and revokes tasks.
package worker
