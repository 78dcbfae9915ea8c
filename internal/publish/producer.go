package publish

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// DefaultQueue is Celery's task_default_queue.
const DefaultQueue = "celery"

// Config configures a Producer; see client.Config for the meaning of each
// field.
type Config struct {
	DefaultQueue   string
	Routes         map[string]string
	Serializer     string
	Compression    string
	Origin         string
	ReplyTo        string
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
}

// Producer builds and publishes task messages.
type Producer struct {
	pub transport.Publisher
	cfg Config
	// defaultSet is false when DefaultQueue was not configured, so that a
	// per-call fallback may win over "celery".
	defaultSet bool
	tracing    *Tracing
}

// New returns a Producer publishing through pub.
func New(pub transport.Publisher, cfg Config) *Producer {
	defaultSet := cfg.DefaultQueue != ""
	if !defaultSet {
		cfg.DefaultQueue = DefaultQueue
	}
	if cfg.Serializer == "" {
		cfg.Serializer = protocol.ContentTypeJSON
	}
	if cfg.Origin == "" {
		host, _ := os.Hostname()
		cfg.Origin = "gen" + strconv.Itoa(os.Getpid()) + "@" + host
	}
	return &Producer{pub: pub, cfg: cfg, defaultSet: defaultSet, tracing: NewTracing(cfg.TracerProvider, cfg.Propagator)}
}

// ReplyTo is the configured default reply_to.
func (p *Producer) ReplyTo() string { return p.cfg.ReplyTo }

// Send builds and publishes one task and returns its id, once the broker
// confirmed it.
func (p *Producer) Send(ctx context.Context, name string, args []any, kwargs map[string]any, o *Options) (string, error) {
	m, dest := p.Build(name, args, kwargs, o, time.Now())
	if err := p.Publish(ctx, m, dest, o.Serializer, o.Compression); err != nil {
		return "", err
	}
	return m.ID, nil
}

// Destination is where a message goes: a queue through the default
// exchange, or a named exchange with a routing key.
type Destination struct {
	Exchange     string
	ExchangeType string
	RoutingKey   string
}

func (p *Producer) route(name string, o *Options) Destination {
	switch {
	case o.Exchange != "":
		rk := o.RoutingKey
		if rk == "" {
			rk = o.Exchange
		}
		return Destination{Exchange: o.Exchange, ExchangeType: o.ExchangeType, RoutingKey: rk}
	case o.Queue != "":
		return Destination{RoutingKey: o.Queue}
	case p.cfg.Routes[name] != "":
		return Destination{RoutingKey: p.cfg.Routes[name]}
	case !p.defaultSet && o.FallbackQueue != "":
		return Destination{RoutingKey: o.FallbackQueue}
	}
	return Destination{RoutingKey: p.cfg.DefaultQueue}
}

// Build lays out the message of one task call, as Celery's as_task_v2
// does, and says where it goes.
func (p *Producer) Build(name string, args []any, kwargs map[string]any, o *Options, now time.Time) (*protocol.TaskMessage, Destination) {
	id := o.TaskID
	if id == "" {
		id = protocol.NewID()
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
		Shadow:        o.Shadow,
		Group:         o.GroupID,
		GroupIndex:    o.GroupIndex,
		Retries:       o.Retries,
		TimeLimit:     o.TimeLimit,
		SoftTimeLimit: o.SoftTimeLimit,
		RootID:        o.RootID,
		ParentID:      o.ParentID,
		Origin:        p.cfg.Origin,
		IgnoreResult:  o.IgnoreResult,
		Headers:       o.Headers,
		Args:          args,
		Kwargs:        kwargs,
		Embed: protocol.Embed{
			Callbacks: o.Link,
			Errbacks:  o.LinkError,
			Chain:     o.Chain,
			Chord:     o.Chord,
		},
		CorrelationID: id,
		ReplyTo:       o.ReplyTo,
		Priority:      o.Priority,
		DeliveryMode:  2,

		StampedHeaders: o.StampedHeaders,
		Stamps:         o.Stamps,
	}
	if m.RootID == "" {
		m.RootID = id
	}
	if m.ReplyTo == "" {
		m.ReplyTo = p.cfg.ReplyTo
	}
	// As Celery's as_task_v2: a countdown, when non-zero, replaces eta;
	// countdown=0 is no countdown at all.
	switch {
	case o.HasCountdown && o.Countdown > 0:
		m.ETA = now.Add(o.Countdown)
	case !o.ETA.IsZero():
		m.ETA = o.ETA
	}
	if !o.Expires.IsZero() {
		m.Expires = o.Expires
		m.Expiration = Expiration(o.Expires, now)
	}
	return m, p.route(name, o)
}

// Expiration is the RabbitMQ per-message TTL Celery sets for expires: the
// milliseconds left, never negative.
func Expiration(expires, now time.Time) string {
	ms := expires.Sub(now).Milliseconds()
	if ms < 0 {
		ms = 0
	}
	return strconv.FormatInt(ms, 10)
}

// Publish encodes m and publishes it to dest, in a PRODUCER span when
// tracing is on. Empty serializer and compression mean the configured ones.
func (p *Producer) Publish(ctx context.Context, m *protocol.TaskMessage, dest Destination, serializer, compression string) (err error) {
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
		return fmt.Errorf("celeriac: encode task %s[%s]: %w", m.Name, m.ID, err)
	}
	// Without an exchange type, a named exchange is used as it exists (the
	// AMQP transport declares a missing one direct, Celery's default), and
	// the transport knows the types of the exchanges it consumes through.
	pub := &transport.Publishing{Exchange: dest.Exchange, ExchangeType: dest.ExchangeType, RoutingKey: dest.RoutingKey, Message: *msg}
	if err := p.pub.Publish(ctx, pub); err != nil {
		return fmt.Errorf("celeriac: publish task %s[%s] to %q/%q: %w", m.Name, m.ID, dest.Exchange, dest.RoutingKey, err)
	}
	return nil
}
