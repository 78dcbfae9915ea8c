// Package transporttest is test support for transports and for code built
// on them: the conformance suite every transport adapter must pass ([Run]),
// a fault-injecting wrapper for any transport ([Faulty]), and the discovery
// of real brokers for tests ([AMQPURL], [RedisURL]).
//
// # Running the suite against an adapter
//
// The factory returns a new connection to the same broker on every call;
// Features say what the broker does differently:
//
//	func TestConformance(t *testing.T) {
//		url := transporttest.RedisURL(t, 10)
//		transporttest.Run(t, func(t testing.TB) transport.Transport {
//			tr, err := redis.Dial(t.Context(), redis.Config{URL: url, GlobalKeyPrefix: prefix})
//			if err != nil {
//				t.Fatal(err)
//			}
//			return tr
//		}, transporttest.Features{
//			QueuePrefix:     "rt_",
//			Priority:        transporttest.PriorityLowerFirstBands,
//			ExtraProperties: true,
//			DeadLetterReason: true,
//			Topics:          transporttest.TopicPrefix,
//		})
//	}
//
// Each behaviour is a subtest named Group/Name, for example
// TestConformance/Prefetch/RaiseAndLower; run one with -run. The groups are
// Publish (round trip of every value type, no aliasing, FIFO, several queues,
// direct and topic exchanges, a 1 MiB body, NoConfirm), Prefetch, Settle (ack, reject with and without
// requeue, settling twice, consumers sharing a queue), DeadLetter (list,
// replay with and without ResetRetries, purge), Lifecycle (Stop, Close,
// use after Close), Admin, Priority, Queues (AddQueue, CancelQueue),
// Broadcast (fanout and topic subscriptions) and Concurrency (publishers and
// consumers under -race, every message exactly once).
//
// What the suite assumes of a transport, beyond the doc comments of package
// transport:
//
//   - Consume declares the queues it consumes (and, with defaults, a direct
//     exchange named like each queue); the suite publishes to the default
//     exchange only after declaring, so brokers that drop messages for
//     missing queues work.
//   - Subscribe returns only once messages published afterwards reach the
//     subscription.
//   - Publish returns once the broker has the message (the suite does not
//     set NoConfirm on task messages).
//
// On a shared broker every name starts with Features.QueuePrefix and
// contains a random part, so concurrent runs never meet. After each test the
// suite closes its transports, purges its queues and dead letters, deletes
// the queues when the transport has a DeleteQueue method ([QueueDeleter]),
// and calls Features.Cleanup with the queue and exchange names, where an
// adapter can delete what else it declared (on RabbitMQ, the direct
// exchanges named like the queues).
//
// Features by broker, as far as known (the RabbitMQ line was checked
// against the amqp adapter on a local RabbitMQ):
//
//	memory:   Priority: PriorityHigherFirst, RequeueAtHead, ExtraProperties,
//	          RejectDeadLetters, DeadLetterReason, Topics: TopicAMQP,
//	          DeadLetterQueueArguments → {"x-dead-letter-exchange": ""}
//	RabbitMQ: Priority: PriorityHigherFirst with PriorityQueueArguments
//	          {"x-max-priority": 10}, RequeueAtHead, RejectDeadLetters,
//	          Topics: TopicAMQP, DeadLetterQueueArguments → declare q+".dlq"
//	          and return {"x-dead-letter-exchange": "",
//	          "x-dead-letter-routing-key": q+".dlq"}; Cleanup deletes the
//	          queues, the ".dlq" queues and the exchanges named like queues
//	kombu Redis: Priority: PriorityLowerFirstBands, ExtraProperties,
//	          DeadLetterReason, Topics: TopicPrefix (requeue goes to the tail)
//
// Waits poll with Features.Timeout as the bound; only the checks that
// nothing more arrives wait a fixed Features.Quiet, so a laggy broker makes
// the suite slower, not flaky. Raise Quiet if a broker is slow to deliver.
//
// # Faults
//
// [Faulty] wraps a transport (usually the in-memory one) and fails Publish,
// Ack, Reject, DeadLetter, Consume or Subscribe on demand (before the broker
// acts, or after it, as a lost confirm does: FailNextAfter), simulates an
// outage with Pause and Resume, and a lost connection with DropConnection
// (unsettled deliveries come back redelivered, their acknowledgements fail
// with ErrStaleDelivery). The worker's tests use it to drive retry,
// acknowledgement and shutdown paths without a broker.
//
// transporttest imports transport and protocol, and the standard library
// only.
package transporttest
