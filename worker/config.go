package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/transport"
)

// Config is a worker's configuration. Field names follow Celery's settings
// (worker_concurrency, worker_prefetch_multiplier, task_acks_late, ...). The
// zero value of each field means the default documented on it.
type Config struct {
	// The ten settings most workers set; the groups below are for tuning.

	// Queues to consume (Celery's -Q), in priority order when QueueOrder is
	// Strict or Weighted. Default: ["celery"].
	Queues []string
	// Concurrency is how many tasks run at once (worker_concurrency).
	// Default: the number of CPUs, as Celery.
	Concurrency int
	// Backend stores task states and results; nil stores nothing (as
	// ignore_result for every task).
	Backend backend.Backend
	// Hostname is the node name (Celery's -n), with %h (host), %n (host name
	// part) and %d (domain) expanded. Default "celery@%h".
	Hostname string
	// Logger receives the worker's logs; nil means no logging.
	Logger *zap.Logger
	// AcksLate acknowledges after the task ran instead of when it starts
	// (task_acks_late). With AcksLate a crash means redelivery.
	AcksLate bool
	// TimeLimit and SoftTimeLimit are the default per-task limits
	// (task_time_limit, task_soft_time_limit); zero means none. The message's
	// timelimit header and task options override them.
	TimeLimit     time.Duration
	SoftTimeLimit time.Duration
	// Retry is the default retry policy of tasks registered without one.
	// The zero Policy is Celery's default: explicit retries (retry.After,
	// ...) are honoured with max_retries 3; other errors fail at once.
	Retry retry.Policy
	// PrefetchMultiplier: the transport hands out at most
	// Concurrency*PrefetchMultiplier unsettled messages
	// (worker_prefetch_multiplier). Default 4; negative means unlimited.
	PrefetchMultiplier int
	// SendTaskEvents sends task events (task-received, -started,
	// -succeeded, -failed, -retried, -rejected, -revoked) for monitors such
	// as Flower: Celery's -E. The enable_events / disable_events control
	// commands switch them at run time.
	SendTaskEvents bool

	// Results.

	// ResultExtended writes name, args, kwargs, worker, retries and queue into
	// result documents (result_extended).
	ResultExtended bool
	// TrackStarted stores STARTED when a task starts (task_track_started).
	TrackStarted bool
	// IgnoreResult stores nothing on success (task_ignore_result); failures
	// are still stored when StoreErrorsEvenIfIgnored is set.
	IgnoreResult             bool
	StoreErrorsEvenIfIgnored bool

	// Failures and shutdown.

	// AcksOnFailure acknowledges the message of a task that failed for good
	// (retries exhausted, a permanent error, a hard time limit), as Celery
	// does by default (task_acks_on_failure_or_timeout=True). celeriac's
	// default, false, dead-letters it instead: basic.reject without requeue
	// on RabbitMQ, so the queue's dead-letter exchange catches it; the
	// dead-letter list on Redis. It applies to messages still held when the
	// task fails, that is acks_late tasks; an early-acked message is gone
	// once its task starts, as in Celery.
	AcksOnFailure bool
	// ShutdownTimeout bounds the wait for running tasks at a warm shutdown;
	// after it their contexts are cancelled and unsettled messages go back to
	// the broker. Default 30 s.
	ShutdownTimeout time.Duration
	// ResultTimeout bounds, from a result write's start, how long it is
	// tried again while the result backend does not answer. The task's
	// slot stays busy meanwhile, so a worker whose backend is away stops
	// taking tasks instead of finishing them into the void; past it the
	// result is given up, logged and counted (LossObserver), and an
	// acks_late message acknowledged, as the task ran. A shutdown that
	// gives up on running tasks ends it sooner, leaving the message
	// unacknowledged. Default 5 minutes: longer than the outages TCP rides
	// out unnoticed (Celery's redis_socket_timeout is 120 s); Celery itself
	// tries a failed write again only with result_backend_always_retry.
	ResultTimeout time.Duration

	// Queues and routing.

	// QueueOrder says which queue a free slot takes from: arrival order
	// across queues (default; what Celery does), QueueOrderStrict (the first
	// queue in Queues that has work, always) or QueueOrderWeighted (smooth
	// weighted round-robin by QueueWeights). Strict and weighted order ask
	// the transport for a prefetch window per queue
	// (transport.ConsumeOptions.PerQueuePrefetch): the worker then holds up
	// to the prefetch of each queue, and a task taken from a queue is
	// replaced from that queue, so the order holds under a backlog on every
	// queue and a newly arrived task of a preferred queue finds room at once.
	QueueOrder QueueOrder
	// QueueWeights are the weights of QueueOrderWeighted (default 1 each).
	QueueWeights map[string]int
	// QueueArguments are declaration arguments per queue name (x-max-priority,
	// x-dead-letter-exchange, x-queue-type), or for every queue under key "*".
	QueueArguments map[string]map[string]any
	// ExchangeType is the type of the exchange each consumed queue is bound
	// to (task_default_exchange_type): transport.Direct (the default, as
	// Celery) or transport.Topic, which Celery 5.5's native delayed delivery
	// on quorum queues needs (see transport/amqp.Config.DelayedDelivery).
	ExchangeType string
	// ExchangeTypes overrides ExchangeType per queue name. Celery gives
	// its default queue task_default_exchange_type but a queue it creates
	// because -Q names it a direct exchange (Celery 5.6:
	// task_create_missing_queue_exchange_type): a worker sharing such a
	// queue with Python workers must declare what they declare, or the
	// second declaration fails with PRECONDITION_FAILED.
	ExchangeTypes map[string]string
	// Routes maps task names to queues for tasks the worker publishes (chain
	// steps, callbacks, errbacks, chord bodies) without an explicit queue,
	// like Celery's task_routes. A Go worker cannot read the Python app's
	// routing, so without a route such a task goes to DefaultQueue when it
	// is set, and otherwise to the queue the task that sends it came from:
	// a workflow stays on the queue its first task was sent to.
	Routes map[string]string
	// DefaultQueue is task_default_queue: the queue consumed when Queues is
	// empty ("celery" when both are), and where tasks the worker publishes
	// go when no route names a queue (see Routes).
	DefaultQueue string

	// Limits.

	// ETATaskLimit bounds how many countdown/ETA tasks are held in memory
	// (Celery 5.6's worker_eta_task_limit). Each held task raises the prefetch
	// by one, up to this many; beyond it held tasks occupy prefetch slots, so a
	// flood of future tasks slows fetching instead of exhausting memory.
	// Default 10 000; negative means unlimited.
	ETATaskLimit int
	// GlobalRateLimiter enforces the global rate limits of tasks registered
	// with GlobalRateLimit, across every worker that shares it (a Redis
	// token bucket: backend/redis).
	GlobalRateLimiter backend.RateLimiter
	// Accept lists accepted content types (accept_content). Default JSON and
	// msgpack. Pickle is always refused.
	Accept []string
	// MaxMessageSize bounds a message body in bytes, after decompression
	// (default 64 MiB), and MaxNestingDepth the nesting of its arrays and
	// maps (default 256; at most protocol.MaxDepthLimit). Bigger or deeper
	// messages are refused before they are decoded further and
	// dead-lettered with reason "too-large" or "too-deep"; FAILURE is stored
	// for their task id. Negative values are configuration errors.
	MaxMessageSize  int
	MaxNestingDepth int
	// ConsumerWatchdog is how long the worker tolerates receiving nothing
	// while a queue it consumes has ready messages at the broker and the
	// worker has room for them (a free slot and a prefetch window not
	// full). Then the consumer is rebuilt: a new one is started, the stalled
	// one stopped (what it already handed out still runs and settles), the
	// restart logged and counted (ConsumerObserver) and reported by
	// ConsumerHealth meanwhile. A prefetch full of ETA tasks, rate-limited
	// tasks, busy slots, a queue cancelled with cancel_consumer and an empty
	// queue are not stalls. Each restart that brings nothing doubles the
	// wait before the next (up to 16 times), so a consumer the broker
	// legitimately starves (a single-active-consumer standby) costs rare
	// restarts only. Default 60 s; negative disables it. It needs a
	// transport that counts ready messages (transport.Admin: every adapter
	// of this module).
	ConsumerWatchdog time.Duration

	// Monitoring, remote control and tracing.

	// WithoutHeartbeat disables the worker events (worker-online,
	// worker-heartbeat every HeartbeatInterval, worker-offline) that Celery
	// sends by default.
	WithoutHeartbeat bool
	// AutoscaleMax, when positive, makes the pool autoscale as Celery's
	// --autoscale=MAX,MIN does: it starts at AutoscaleMin slots (at least
	// one), grows towards AutoscaleMax while tasks are waiting, and shrinks
	// back towards AutoscaleMin once AutoscaleKeepalive (default 30 s,
	// Celery's AUTOSCALE_KEEPALIVE) has passed since it last grew.
	// Concurrency is then ignored; the prefetch is AutoscaleMax ×
	// PrefetchMultiplier, as Celery's. Remote control autoscale changes
	// both bounds and inspect stats shows them.
	AutoscaleMax, AutoscaleMin int
	AutoscaleKeepalive         time.Duration

	// HeartbeatInterval is Celery's --heartbeat-interval. Default 2 s.
	HeartbeatInterval time.Duration
	// WithoutControl disables remote control (celery inspect / control).
	WithoutControl bool
	// Observer is told about received, waiting, started and finished tasks
	// (for metrics; see worker/prommetrics). Nil means none.
	Observer Observer
	// TracerProvider turns on OpenTelemetry tracing, as
	// opentelemetry-instrumentation-celery does it in Python: each run is a
	// CONSUMER span "run/<task name>", a child of the context its message
	// carries (traceparent, tracestate, baggage headers), and every message
	// the worker publishes (retries, chain steps, callbacks, errbacks, chord
	// bodies) carries the current context. Nil, the default, is off and
	// costs nothing.
	TracerProvider trace.TracerProvider
	// Propagator reads and writes the context in message headers. Default:
	// W3C trace context and baggage (OpenTelemetry's default propagators).
	Propagator propagation.TextMapPropagator
	// BaseContext returns the context handlers' contexts derive from. It is
	// never cancelled by shutdown (see ShutdownTimeout). Default:
	// context.Background.
	BaseContext func() context.Context
}

const (
	defaultQueue           = "celery"
	defaultPrefetchMult    = 4
	defaultETATaskLimit    = 10000
	defaultShutdownTimeout = 30 * time.Second
	defaultResultTimeout   = 5 * time.Minute
	defaultWatchdog        = 60 * time.Second
)

// withDefaults returns a copy of c with defaults applied.
func (c Config) withDefaults() Config {
	if len(c.Queues) == 0 {
		q := c.DefaultQueue
		if q == "" {
			q = defaultQueue
		}
		c.Queues = []string{q}
	} else {
		c.Queues = append([]string(nil), c.Queues...)
	}
	if c.AutoscaleMax > 0 {
		c.Concurrency = max(c.AutoscaleMin, 1)
	}
	if c.Concurrency <= 0 {
		c.Concurrency = runtime.NumCPU()
	}
	if c.PrefetchMultiplier == 0 {
		c.PrefetchMultiplier = defaultPrefetchMult
	}
	if c.ETATaskLimit == 0 {
		c.ETATaskLimit = defaultETATaskLimit
	}
	if c.Hostname == "" {
		c.Hostname = "celery@%h"
	}
	c.Hostname = expandHostname(c.Hostname)
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = defaultShutdownTimeout
	}
	if c.ResultTimeout <= 0 {
		c.ResultTimeout = defaultResultTimeout
	}
	if c.ConsumerWatchdog == 0 {
		c.ConsumerWatchdog = defaultWatchdog
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.BaseContext == nil {
		c.BaseContext = context.Background
	}
	return c
}

// Validate reports configuration errors.
func (c Config) Validate() error {
	var errs []error
	for _, q := range c.Queues {
		if q == "" {
			errs = append(errs, errors.New("worker: empty queue name"))
		}
	}
	switch c.ExchangeType {
	case "", transport.Direct, transport.Topic:
	default:
		errs = append(errs, fmt.Errorf("worker: exchange type %q: want direct or topic", c.ExchangeType))
	}
	for q, typ := range c.ExchangeTypes {
		switch typ {
		case "", transport.Direct, transport.Topic:
		default:
			errs = append(errs, fmt.Errorf("worker: exchange type %q of queue %q: want direct or topic", typ, q))
		}
	}
	switch c.QueueOrder {
	case QueueOrderArrival, QueueOrderStrict, QueueOrderWeighted:
	default:
		errs = append(errs, fmt.Errorf("worker: unknown queue order %q", c.QueueOrder))
	}
	if c.TimeLimit < 0 || c.SoftTimeLimit < 0 {
		errs = append(errs, errors.New("worker: negative time limit"))
	}
	if c.AutoscaleMax < 0 || c.AutoscaleMin < 0 || (c.AutoscaleMax > 0 && c.AutoscaleMin > c.AutoscaleMax) {
		errs = append(errs, fmt.Errorf("worker: autoscale max %d, min %d: want 0 <= min <= max", c.AutoscaleMax, c.AutoscaleMin))
	}
	if c.MaxMessageSize < 0 {
		errs = append(errs, fmt.Errorf("worker: negative MaxMessageSize %d", c.MaxMessageSize))
	}
	if c.MaxNestingDepth < 0 || c.MaxNestingDepth > protocol.MaxDepthLimit {
		errs = append(errs, fmt.Errorf("worker: MaxNestingDepth %d outside [0, %d]", c.MaxNestingDepth, protocol.MaxDepthLimit))
	}
	return errors.Join(errs...)
}

func (c Config) prefetch() int {
	if c.PrefetchMultiplier < 0 {
		return 0
	}
	n := c.Concurrency * c.PrefetchMultiplier
	if c.AutoscaleMax > 0 {
		n = c.AutoscaleMax * c.PrefetchMultiplier
	}
	if n > 65535 {
		return 0 // as Celery: above the AMQP field's range means unlimited
	}
	return n
}

func (c Config) queues() []transport.Queue {
	qs := make([]transport.Queue, 0, len(c.Queues))
	for _, name := range c.Queues {
		qs = append(qs, c.queue(name))
	}
	return qs
}

func (c Config) queue(name string) transport.Queue {
	q := transport.Queue{Name: name, ExchangeType: cmp.Or(c.ExchangeTypes[name], c.ExchangeType)}
	args := map[string]any{}
	for k, v := range c.QueueArguments["*"] {
		args[k] = v
	}
	for k, v := range c.QueueArguments[name] {
		args[k] = v
	}
	if len(args) > 0 {
		q.Arguments = args
	}
	return q
}

// expandHostname expands Celery's node-name keys: %h (full host name), %n
// (the part before the first dot) and %d (the domain, after it). %% is a
// percent sign.
func expandHostname(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	name, domain, _ := strings.Cut(host, ".")
	r := strings.NewReplacer("%%", "%", "%h", host, "%n", name, "%d", domain)
	return r.Replace(s)
}

func (c Config) heartbeat() time.Duration {
	if c.HeartbeatInterval <= 0 {
		return defaultHeartbeat
	}
	return c.HeartbeatInterval
}

// QueueOrder is how a worker chooses between the queues it consumes.
type QueueOrder string

// Queue orders.
const (
	QueueOrderArrival  QueueOrder = ""
	QueueOrderStrict   QueueOrder = "strict"
	QueueOrderWeighted QueueOrder = "weighted"
)

func (c Config) weights() []int {
	w := make([]int, len(c.Queues))
	for i, q := range c.Queues {
		w[i] = c.QueueWeights[q]
	}
	return w
}

func (c Config) String() string {
	return fmt.Sprintf("worker{queues=%v concurrency=%d prefetch=%d hostname=%s}", c.Queues, c.Concurrency, c.prefetch(), c.Hostname)
}
