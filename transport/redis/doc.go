// Package redis is celeriac's kombu-compatible Redis transport: Go workers
// consume and publish on the same Redis database as Python Celery workers
// and clients, with kombu's keys, envelopes and acknowledgement emulation,
// so that either side restores the messages the other lost.
//
// # Keys
//
// Every name below is prefixed with Config.GlobalKeyPrefix (kombu's
// global_keyprefix), the unacked bookkeeping included:
//
//	<queue>, <queue>\x06\x16<band>   lists of priority bands 0, 3, 6, 9 (LPUSH in, pop from the right)
//	_kombu.binding.<exchange>        set of "<routing key>\x06\x16<pattern>\x06\x16<queue>"
//	unacked                          hash: delivery tag -> JSON [envelope, exchange, routing key]
//	unacked_index                    zset: delivery tag -> delivery time (Unix seconds)
//	unacked_mutex                    the restore sweep's lock
//	/{db}.<exchange>[/<routing key>] pub/sub channels of fanout exchanges
//	celeriac.dead.<queue>            dead-letter list (celeriac only; Python never reads it)
//
// Each dead-letter item is a JSON object {"id", "envelope", "queue",
// "exchange", "routing_key", "reason", "error", "task_id", "task_name",
// "time"} where envelope is the kombu envelope as it was popped (or, for an
// item that was not valid JSON, a string holding its bytes) and id its
// delivery tag. See [Transport.DeadLetters] and [Transport.Replay].
//
// # Consuming
//
// One Lua script pops up to the free prefetch (at most Config.BatchSize)
// over all queues and bands in kombu's order (band-major, queues rotated
// round-robin) and records each message in unacked and unacked_index in the
// same atomic step, so nothing popped is ever unrecorded. When every list
// is empty the consumer blocks without popping: BLMOVE of the first list
// onto itself (right to right, which leaves the list unchanged) returns
// when a message arrives, and the script, pipelined behind it on the same
// connection, takes it in the same round trip. Unlike kombu's
// BRPOP, no message is ever out of its list and not yet in unacked, so a
// worker killed with -9 or a connection cut at any moment loses nothing.
// BLMOVE watches one list (the first queue's default band, where Celery's
// unprioritised tasks go); the other lists are polled every 100 ms while
// idle. Redis before 6.2 has no BLMOVE: there the consumer blocks in BRPOP
// (Config.BRPOPTimeout) and records the message as kombu does, with
// kombu's loss window between the two. Acks from all deliveries are
// group-committed: whatever acks arrive while one MULTI/EXEC is in flight
// go out together in the next one; an ack that finds none in flight is
// written at once by its caller, and Delivery.AckAsync lets the worker
// start a task without waiting for its early ack's round trip.
//
// Config.StagedPop replaces the script with plain commands, for about two
// thirds of its Redis CPU a task: LMOVE into staging lists of the
// consumer's own, then kombu's records written from the client in a
// MULTI that also empties them. A celeriac sweeper puts back the staging
// lists of a consumer whose heartbeat (in the hash _celeriac.staging)
// stopped; see Config.StagedPop for the price.
//
// Messages that cannot be decoded never stop the consumer: they move to
// their queue's dead-letter list with reason "undecodable" and are logged.
//
// # Visibility
//
// Like kombu, every transport runs the restore sweep (every
// Config.SweepPeriod: kombu's 100 s, or more often for a visibility timeout
// under 1000 s): under unacked_mutex, messages delivered more
// than Config.VisibilityTimeout ago go back to the front of their queue
// with headers.redelivered and properties.delivery_info.redelivered set, to
// the list of their priority band (kombu >= 5.4 behaviour). Beyond kombu,
// while this process holds a delivery it refreshes its unacked_index score
// every Config.RenewInterval, so no worker (Python or Go) restores a
// message whose holder is alive; a crashed holder stops refreshing and its
// messages come back. Close restores every delivery still held.
//
// # Where it sits
//
// The package implements transport.Transport, transport.Admin and
// transport.DeadLetterStore. It imports transport and protocol, go-redis
// (as goredis) and zap; the worker never imports it directly.
package redis
