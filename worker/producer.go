package worker

import (
	"context"
	"fmt"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"os"
	"strconv"
	"time"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// Publisher is what a Producer needs from a transport.
type Publisher interface {
	Publish(ctx context.Context, p *transport.Publishing) error
}

// ProducerConfig configures a Producer. Zero values mean the documented
// defaults.
type ProducerConfig struct {
	// DefaultQueue receives tasks without a queue or route
	// (task_default_queue). Default "celery".
	DefaultQueue string
	// Routes maps task names to queues (a static task_routes).
	Routes map[string]string
	// Serializer is the content type of task bodies (task_serializer).
	// Default application/json.
	Serializer string
	// Compression is a compression MIME type (task_compression), or empty.
	Compression string
	// Origin is the origin header. Default "gen<pid>@<hostname>", as Python.
	Origin string
	// ReplyTo is the default reply_to property (the RPC backend's reply
	// queue).
	ReplyTo string
	// TracerProvider turns on tracing: each message is published in a
	// PRODUCER span "apply_async/<task name>", a child of the context given
	// to SendTask, and carries that span's context in its headers, where a
	// Python worker with opentelemetry-instrumentation-celery (or celeriac)
	// continues the trace. Nil, the default, is off.
	TracerProvider trace.TracerProvider
	// Propagator writes the context into headers. Default: W3C trace
	// context and baggage.
	Propagator propagation.TextMapPropagator
}

// Producer publishes task messages that Python Celery workers and celeriac
// accept: the Go equivalent of send_task / apply_async. The worker uses the
// same code for retries, callbacks, chain steps and chord bodies.
type Producer struct {
	pub Publisher
	cfg ProducerConfig
	// defaultSet is false when DefaultQueue was not configured, so that a
	// per-call fallback may win over "celery".
	defaultSet bool
	tracing    *tracing
}

// NewProducer returns a Producer publishing through pub (any
// transport.Transport).
func NewProducer(pub Publisher, cfg ProducerConfig) *Producer {
	defaultSet := cfg.DefaultQueue != ""
	if !defaultSet {
		cfg.DefaultQueue = defaultQueue
	}
	if cfg.Serializer == "" {
		cfg.Serializer = protocol.ContentTypeJSON
	}
	if cfg.Origin == "" {
		host, _ := os.Hostname()
		cfg.Origin = "gen" + strconv.Itoa(os.Getpid()) + "@" + host
	}
	return &Producer{pub: pub, cfg: cfg, defaultSet: defaultSet, tracing: newTracing(cfg.TracerProvider, cfg.Propagator)}
}

// SendOption modifies one SendTask call, like apply_async's keyword
// arguments.
type SendOption func(*sendOptions)

type sendOptions struct {
	taskID        string
	countdown     time.Duration
	hasCountdown  bool
	eta           time.Time
	expires       time.Time
	queue         string
	exchange      string
	exchangeType  string
	routingKey    string
	priority      int
	link          []protocol.Signature
	linkError     []protocol.Signature
	chain         []protocol.Signature
	chord         *protocol.Signature
	headers       map[string]any
	timeLimit     time.Duration
	softTimeLimit time.Duration
	replyTo       string
	serializer    string
	compression   string
	ignoreResult  *bool
	shadow        string
	groupID       string
	groupIndex    *int
	parentID      string
	rootID        string
	retries       int
	// stampedHeaders and stamps come from a stamped signature's options
	// (Celery 5.5's stamping: stamped_headers, then each stamp as an
	// option of its own).
	stampedHeaders []string
	stamps         map[string]any
	// fallbackQueue is used when neither an option nor a route names a
	// queue and the producer has no configured default (canvas messages
	// sent by the worker: the parent's queue).
	fallbackQueue string
}

// TaskID sets the task id (default: a new UUID).
func TaskID(id string) SendOption { return func(o *sendOptions) { o.taskID = id } }

// Countdown delays the task by d from now.
func Countdown(d time.Duration) SendOption {
	return func(o *sendOptions) { o.countdown, o.hasCountdown = d, true }
}

// ETA schedules the task at t.
func ETA(t time.Time) SendOption { return func(o *sendOptions) { o.eta = t } }

// Expires sets the time after which the task is not run.
func Expires(t time.Time) SendOption { return func(o *sendOptions) { o.expires = t } }

// ExpiresIn sets the expiry d from now.
func ExpiresIn(d time.Duration) SendOption {
	return func(o *sendOptions) { o.expires = time.Now().Add(d) }
}

// ToQueue routes the task to a queue (through the default exchange, as
// Celery does).
func ToQueue(name string) SendOption { return func(o *sendOptions) { o.queue = name } }

// ToExchange routes the task through a named exchange with a routing key
// (default: the exchange's name). A missing exchange is declared direct,
// Celery's default; an existing one is used as it is.
func ToExchange(exchange, routingKey string) SendOption {
	return func(o *sendOptions) { o.exchange, o.routingKey = exchange, routingKey }
}

// ExchangeKind states the type of the ToExchange exchange (transport.Topic,
// Fanout or Direct), as a Celery producer knows it from task_queues. The
// transport learns the types of the exchanges it consumes through; a
// producer publishing to others says so, because with native delayed
// delivery on (Celery 5.5, quorum queues) a countdown task goes through the
// delay levels only to a topic or fanout exchange.
func ExchangeKind(kind string) SendOption { return func(o *sendOptions) { o.exchangeType = kind } }

// Priority sets the message priority.
func Priority(p int) SendOption { return func(o *sendOptions) { o.priority = p } }

// Link adds success callbacks (link).
func Link(s ...protocol.Signature) SendOption {
	return func(o *sendOptions) { o.link = append(o.link, s...) }
}

// LinkError adds error callbacks (link_error).
func LinkError(s ...protocol.Signature) SendOption {
	return func(o *sendOptions) { o.linkError = append(o.linkError, s...) }
}

// Headers adds custom headers.
func Headers(h map[string]any) SendOption {
	return func(o *sendOptions) {
		if o.headers == nil {
			o.headers = map[string]any{}
		}
		for k, v := range h {
			o.headers[k] = v
		}
	}
}

// TimeLimits sets the hard and soft time limits carried by the message.
func TimeLimits(hard, soft time.Duration) SendOption {
	return func(o *sendOptions) { o.timeLimit, o.softTimeLimit = hard, soft }
}

// ReplyTo sets the reply_to property (the RPC backend's reply queue).
func ReplyTo(q string) SendOption { return func(o *sendOptions) { o.replyTo = q } }

// Serializer overrides the body content type for this task.
func Serializer(contentType string) SendOption {
	return func(o *sendOptions) { o.serializer = contentType }
}

// Compression compresses the body ([protocol.CompressionZlib]).
func Compression(mime string) SendOption { return func(o *sendOptions) { o.compression = mime } }

// IgnoreResultHeader sets the message's ignore_result header.
func IgnoreResultHeader(v bool) SendOption { return func(o *sendOptions) { o.ignoreResult = &v } }

// Shadow sets the display name used in logs and events.
func Shadow(name string) SendOption { return func(o *sendOptions) { o.shadow = name } }

// Group makes the task a member of a group.
func Group(id string, index *int) SendOption {
	return func(o *sendOptions) { o.groupID, o.groupIndex = id, index }
}

// Parent sets parent_id and root_id, as when a task sends another task.
func Parent(parentID, rootID string) SendOption {
	return func(o *sendOptions) { o.parentID, o.rootID = parentID, rootID }
}

// SendTask publishes a task by name and returns its id. It returns once the
// broker confirmed the message.
func (p *Producer) SendTask(ctx context.Context, name string, args []any, kwargs map[string]any, opts ...SendOption) (string, error) {
	var o sendOptions
	for _, opt := range opts {
		opt(&o)
	}
	m, dest := p.build(name, args, kwargs, &o, time.Now())
	if err := p.publish(ctx, m, dest, o.serializer, o.compression); err != nil {
		return "", err
	}
	return m.ID, nil
}

// destination is where a message goes: a queue through the default
// exchange, or a named exchange with a routing key.
type destination struct {
	exchange     string
	exchangeType string
	routingKey   string
}

func (p *Producer) route(name string, o *sendOptions) destination {
	switch {
	case o.exchange != "":
		rk := o.routingKey
		if rk == "" {
			rk = o.exchange
		}
		return destination{exchange: o.exchange, exchangeType: o.exchangeType, routingKey: rk}
	case o.queue != "":
		return destination{routingKey: o.queue}
	case p.cfg.Routes[name] != "":
		return destination{routingKey: p.cfg.Routes[name]}
	case !p.defaultSet && o.fallbackQueue != "":
		return destination{routingKey: o.fallbackQueue}
	}
	return destination{routingKey: p.cfg.DefaultQueue}
}

func (p *Producer) build(name string, args []any, kwargs map[string]any, o *sendOptions, now time.Time) (*protocol.TaskMessage, destination) {
	id := o.taskID
	if id == "" {
		id = NewID()
	}
	if args == nil {
		args = []any{}
	}
	if kwargs == nil {
		kwargs = map[string]any{}
	}
	m := &protocol.TaskMessage{
		Protocol:      2,
		ID:            id,
		Name:          name,
		Lang:          "go",
		Shadow:        o.shadow,
		Group:         o.groupID,
		GroupIndex:    o.groupIndex,
		Retries:       o.retries,
		TimeLimit:     o.timeLimit,
		SoftTimeLimit: o.softTimeLimit,
		RootID:        o.rootID,
		ParentID:      o.parentID,
		Origin:        p.cfg.Origin,
		IgnoreResult:  o.ignoreResult,
		Headers:       o.headers,
		Args:          args,
		Kwargs:        kwargs,
		Embed: protocol.Embed{
			Callbacks: o.link,
			Errbacks:  o.linkError,
			Chain:     o.chain,
			Chord:     o.chord,
		},
		CorrelationID: id,
		ReplyTo:       o.replyTo,
		Priority:      o.priority,
		DeliveryMode:  2,

		StampedHeaders: o.stampedHeaders,
		Stamps:         o.stamps,
	}
	if m.RootID == "" {
		m.RootID = id
	}
	if m.ReplyTo == "" {
		m.ReplyTo = p.cfg.ReplyTo
	}
	switch {
	case !o.eta.IsZero():
		m.ETA = o.eta
	case o.hasCountdown:
		m.ETA = now.Add(o.countdown)
	}
	if !o.expires.IsZero() {
		m.Expires = o.expires
		m.Expiration = expiration(o.expires, now)
	}
	return m, p.route(name, o)
}

// expiration is the RabbitMQ per-message TTL Celery sets for expires: the
// milliseconds left, never negative.
func expiration(expires, now time.Time) string {
	ms := expires.Sub(now).Milliseconds()
	if ms < 0 {
		ms = 0
	}
	return strconv.FormatInt(ms, 10)
}

func (p *Producer) publish(ctx context.Context, m *protocol.TaskMessage, dest destination, serializer, compression string) (err error) {
	if serializer == "" {
		serializer = p.cfg.Serializer
	}
	if compression == "" {
		compression = p.cfg.Compression
	}
	if p.tracing != nil {
		span := p.tracing.startPublish(ctx, m, dest)
		defer span.End()
		defer func() {
			if err != nil {
				span.SetStatus(codes.Error, err.Error())
			}
		}()
	}
	msg, err := protocol.EncodeTask(m, protocol.EncodeOptions{ContentType: serializer, Compression: compression})
	if err != nil {
		return fmt.Errorf("worker: encode task %s[%s]: %w", m.Name, m.ID, err)
	}
	// Without ExchangeKind, a named exchange is used as it exists (the AMQP
	// transport declares a missing one direct, Celery's default), and the
	// transport knows the types of the exchanges it consumes through.
	pub := &transport.Publishing{Exchange: dest.exchange, ExchangeType: dest.exchangeType, RoutingKey: dest.routingKey, Message: *msg}
	if err := p.pub.Publish(ctx, pub); err != nil {
		return fmt.Errorf("worker: publish task %s[%s] to %q/%q: %w", m.Name, m.ID, dest.exchange, dest.routingKey, err)
	}
	return nil
}
