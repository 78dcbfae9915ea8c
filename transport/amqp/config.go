package amqp

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// DeclarePolicy says what the transport declares on the broker.
type DeclarePolicy int

const (
	// DeclareAll declares what Celery declares: for each consumed queue a
	// durable direct exchange and a durable queue, named alike and bound
	// with the queue name as routing key; for publishes, a missing named
	// exchange, and a missing target queue of a persistent (task) message
	// to the default exchange. Python and Go workers can then start in
	// either order.
	DeclareAll DeclarePolicy = iota
	// DeclarePassive declares nothing; it only checks that the consumed
	// queues exist (a passive declare) and fails Consume when one is missing.
	DeclarePassive
	// DeclareNone declares and checks nothing: the topology is managed
	// elsewhere.
	DeclareNone
)

// QoSMode selects the basic.qos global flag.
type QoSMode int

const (
	// QoSAuto is Celery's rule: the prefetch is global to the channel (shared
	// by all consumed queues) unless a consumed queue is a quorum queue,
	// which RabbitMQ refuses to consume with global QoS; then it is per
	// consumer. A queue counts as quorum when its arguments say
	// x-queue-type=quorum, when the broker says so in a topology mismatch,
	// or when the broker refuses global QoS for it.
	QoSAuto QoSMode = iota
	// QoSGlobal always sets global=true.
	QoSGlobal
	// QoSPerConsumer always sets global=false: every queue gets its own
	// prefetch window. A message rejected with requeue is then always
	// delivered again before the messages behind it; with global QoS
	// RabbitMQ (3.10) sometimes frees the prefetch slot before the message
	// is back and delivers the next one first. SetPrefetch costs a
	// re-consume in this mode (see consumer SetPrefetch).
	QoSPerConsumer
)

// Config configures a Transport. The zero value of each field selects the
// default documented on it.
type Config struct {
	// URL is the broker URL: amqp://user:pass@host:port/vhost (Celery's
	// "//" path means vhost "/"), amqps:// for TLS, or kombu's pyamqp://
	// alias. Several URLs separated by ";" (Celery's failover form) are tried
	// in order when connecting and when reconnecting. Required unless URLs
	// is set.
	URL string
	// URLs are more failover URLs, tried after those in URL.
	URLs []string

	// TLS configures amqps:// connections. nil means a default configuration
	// verifying the server against the system roots with the URL's host as
	// server name. A ServerName left empty is set to the URL's host. The
	// TLS options of amqp091's URL query (certfile, keyfile, cacertfile) are
	// not read: build the tls.Config instead.
	TLS *tls.Config

	// Heartbeat is the heartbeat interval proposed to the broker. Zero means
	// 10 s, amqp091's default, rather than Celery's 120 s: a dead peer is
	// noticed after about three intervals, and failover should not wait
	// minutes. A heartbeat query parameter in the URL wins. Negative means
	// the broker's value.
	Heartbeat time.Duration

	// DialTimeout bounds one connection attempt (TCP, TLS and the AMQP
	// handshake). Zero means 10 s.
	DialTimeout time.Duration

	// ConnectionName is sent as the connection_name client property, shown
	// by rabbitmqctl list_connections and the management UI. The transport
	// opens two connections, named ConnectionName+" consumer" and
	// ConnectionName+" publisher". Zero means "celeriac".
	ConnectionName string

	// Logger receives connection events, topology warnings and errors. nil
	// means no logging.
	Logger *zap.Logger

	// FailoverStrategy is Celery's broker_failover_strategy: the order in
	// which the broker URLs are tried. FailoverRoundRobin ("round-robin",
	// the default) goes through them in the order given, and after a loss
	// starts with the URL after the one that was in use, so that a dead node
	// is tried last. FailoverShuffle ("shuffle") tries them in a new random
	// order every round, the first connection included, which spreads a
	// fleet over the nodes.
	FailoverStrategy string

	// ReconnectInitial, ReconnectStep and ReconnectMax are the pause
	// between reconnection rounds (one round tries every URL once, with no
	// pause between URLs), as Celery's kombu schedules it: ReconnectInitial
	// after the first failed round, growing by ReconnectStep each round up
	// to ReconnectMax. Zero means Celery's 2 s, 2 s and 30 s. A negative
	// ReconnectStep doubles the pause each round instead.
	ReconnectInitial time.Duration
	ReconnectStep    time.Duration
	ReconnectMax     time.Duration
	// ReconnectJitter is the fraction of each pause that is randomised: a
	// pause d becomes a value in [d×(1−j), d]. Zero (or negative) means
	// none, as in Celery.
	ReconnectJitter float64

	// QueueArguments are declaration arguments for every task queue the
	// transport declares (x-max-priority, x-queue-type, ...), under
	// transport.Queue.Arguments, which win per key. They must equal those of
	// existing queues; see StrictTopology.
	QueueArguments map[string]any

	// Declare says what is declared. Zero means DeclareAll.
	Declare DeclarePolicy

	// StrictTopology makes an existing queue or exchange that differs from
	// the declaration (RabbitMQ's 406 PRECONDITION_FAILED) an error
	// (*MismatchError, wrapping transport.ErrTopologyMismatch). By default
	// the difference is logged at warn level and the existing entity is used
	// as it is, after a passive declare.
	StrictTopology bool

	// QoS selects the basic.qos global flag. Zero means QoSAuto.
	QoS QoSMode

	// ConfirmTimeout bounds the wait for the broker's publisher confirm of
	// one Publish, on top of the caller's ctx: the waits of every time the
	// message is sent (again after a connection loss) count together.
	// Waiting for a reconnection is bounded by the ctx only. Zero means
	// 30 s; negative means only the ctx bounds it.
	ConfirmTimeout time.Duration

	// DelayedDelivery selects Celery 5.5's native delayed delivery (see
	// DelayedDeliveryMode): the celery_delayed_* topology is declared and
	// every consumed queue whose exchange is a topic or fanout exchange is
	// bound to it, so countdown tasks published into it by Python
	// producers come back out; and a countdown task this transport
	// publishes to such an exchange (a retry, a Go producer's task) is
	// parked in the broker instead of held by a worker. Zero means
	// DelayedAuto: on once a consumed queue is a quorum queue.
	DelayedDelivery DelayedDeliveryMode
	// DelayedQueueType is the x-queue-type of the delayed-delivery queues,
	// Celery's broker_native_delayed_delivery_queue_type: "quorum" (the
	// default) or "classic". It must match what other workers declared.
	DelayedQueueType string

	// DeadLetterQueue names the queue that holds the dead letters of a task
	// queue, for the transport.DeadLetterStore methods (the queue the
	// task queue's dead-letter exchange routes to). nil means queue+".dlq".
	DeadLetterQueue func(queue string) string
}

// Defaults for Config fields.
const (
	defaultHeartbeat        = 10 * time.Second
	defaultDialTimeout      = 10 * time.Second
	defaultConnectionName   = "celeriac"
	defaultReconnectInitial = 2 * time.Second
	defaultReconnectStep    = 2 * time.Second
	defaultReconnectMax     = 30 * time.Second
	defaultConfirmTimeout   = 30 * time.Second
)

// brokerURL is one parsed broker URL.
type brokerURL struct {
	// dial is the URL handed to amqp091: for amqps the scheme is rewritten
	// to amqp with an explicit port, because the transport performs the TLS
	// handshake itself (its Dial hook must wrap the decrypted stream).
	dial string
	// redacted is the URL for logs, password hidden.
	redacted string
	tls      bool
	host     string
}

// parseURLs splits Celery's ";"-separated failover form and parses each URL.
func parseURLs(primary string, more []string) ([]brokerURL, error) {
	var raw []string
	for _, s := range append([]string{primary}, more...) {
		for _, part := range strings.Split(s, ";") {
			if part = strings.TrimSpace(part); part != "" {
				raw = append(raw, part)
			}
		}
	}
	if len(raw) == 0 {
		return nil, errors.New("amqp: no broker URL configured")
	}
	out := make([]brokerURL, 0, len(raw))
	for _, r := range raw {
		b, err := parseURL(r)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func parseURL(raw string) (brokerURL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url's error repeats the URL, password included.
		return brokerURL{}, errors.New("amqp: malformed broker URL")
	}
	if u.Opaque != "" || u.Fragment != "" || strings.Contains(raw, "#") ||
		u.Host == "" && u.Scheme != "" && !strings.HasPrefix(raw[len(u.Scheme):], "://") {
		// "amqp:user:pass@host" and the like: nothing to redact safely.
		return brokerURL{}, errors.New("amqp: malformed broker URL (want amqp://user:password@host:port/vhost)")
	}
	redacted := u.Redacted()
	var b brokerURL
	switch u.Scheme {
	case "amqp", "pyamqp", "librabbitmq":
		u.Scheme = "amqp"
	case "amqps":
		u.Scheme = "amqp"
		b.tls = true
		if u.Port() == "" {
			u.Host = net.JoinHostPort(u.Hostname(), "5671")
		}
	default:
		return brokerURL{}, fmt.Errorf("amqp: broker URL scheme %q: must be amqp, amqps or pyamqp", u.Scheme)
	}
	if u.Host == "" {
		u.Host = "localhost" // amqp091's default; keeps "//" in the string form
	}
	b.dial = u.String()
	b.redacted = redacted
	b.host = u.Hostname()
	if _, err := amqp091.ParseURI(b.dial); err != nil {
		// Neither the URL nor amqp091's error may be shown: a password with an
		// unescaped "/" or "@" lands in the host, port or vhost, which
		// Redacted does not hide and amqp091's error quotes.
		return brokerURL{}, fmt.Errorf("amqp: malformed %s broker URL: %s", u.Scheme, hostProblem(u))
	}
	return b, nil
}

// ParseURI reads one broker URL as the transport does (amqp, amqps, pyamqp
// and librabbitmq schemes, Celery's defaults): its host, vhost and
// credentials, for tools that reach the same broker another way (the
// management API). An error never quotes the URL, which may carry the
// password.
func ParseURI(raw string) (amqp091.URI, error) {
	b, err := parseURL(strings.TrimSpace(raw))
	if err != nil {
		return amqp091.URI{}, err
	}
	return amqp091.ParseURI(b.dial)
}

// hostProblem names what is wrong with a URL amqp091 refuses, without quoting
// any of it.
func hostProblem(u *url.URL) string {
	const hint = " (want amqp://user:password@host:port/vhost, with / and @ in the password escaped as %2F and %40)"
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "the port is not a number from 1 to 65535" + hint
		}
	}
	return "the host, port or vhost does not parse" + hint
}

// settings is a Config with defaults applied and URLs parsed.
type settings struct {
	// reconnects counts reconnections of either connection, and failovers
	// those that landed on another URL than the one lost, for metrics.
	reconnects atomic.Int64
	failovers  atomic.Int64

	Config
	urls []brokerURL
	log  *zap.Logger
}

func newSettings(c Config) (*settings, error) {
	urls, err := parseURLs(c.URL, c.URLs)
	if err != nil {
		return nil, err
	}
	s := &settings{Config: c, urls: urls, log: c.Logger}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if s.Heartbeat == 0 {
		s.Heartbeat = defaultHeartbeat
	}
	if s.DialTimeout <= 0 {
		s.DialTimeout = defaultDialTimeout
	}
	switch s.DelayedQueueType {
	case "":
		s.DelayedQueueType = "quorum"
	case "quorum", "classic":
	default:
		return nil, fmt.Errorf("amqp: DelayedQueueType %q: want quorum or classic", s.DelayedQueueType)
	}
	switch s.DelayedDelivery {
	case DelayedAuto, DelayedOn, DelayedOff:
	default:
		return nil, fmt.Errorf("amqp: unknown DelayedDelivery mode %d", s.DelayedDelivery)
	}
	if s.ConnectionName == "" {
		s.ConnectionName = defaultConnectionName
	}
	if s.ReconnectInitial <= 0 {
		s.ReconnectInitial = defaultReconnectInitial
	}
	if s.ReconnectMax <= 0 {
		s.ReconnectMax = defaultReconnectMax
	}
	if s.ReconnectMax < s.ReconnectInitial {
		s.ReconnectMax = s.ReconnectInitial
	}
	if s.ReconnectStep == 0 {
		s.ReconnectStep = defaultReconnectStep
	}
	switch {
	case s.ReconnectJitter < 0:
		s.ReconnectJitter = 0
	case s.ReconnectJitter > 1:
		return nil, fmt.Errorf("amqp: ReconnectJitter %v outside [0, 1]", s.ReconnectJitter)
	}
	switch s.FailoverStrategy {
	case "":
		s.FailoverStrategy = FailoverRoundRobin
	case FailoverRoundRobin, FailoverShuffle:
	default:
		return nil, fmt.Errorf("amqp: FailoverStrategy %q: want %q or %q", s.FailoverStrategy, FailoverRoundRobin, FailoverShuffle)
	}
	if s.ConfirmTimeout == 0 {
		s.ConfirmTimeout = defaultConfirmTimeout
	}
	switch s.Declare {
	case DeclareAll, DeclarePassive, DeclareNone:
	default:
		return nil, fmt.Errorf("amqp: unknown DeclarePolicy %d", s.Declare)
	}
	switch s.QoS {
	case QoSAuto, QoSGlobal, QoSPerConsumer:
	default:
		return nil, fmt.Errorf("amqp: unknown QoSMode %d", s.QoS)
	}
	if s.DeadLetterQueue == nil {
		s.DeadLetterQueue = func(q string) string { return q + ".dlq" }
	}
	if _, err := toTable(s.QueueArguments); err != nil {
		return nil, fmt.Errorf("amqp: QueueArguments: %w", err)
	}
	return s, nil
}

// Failover strategies, Celery's broker_failover_strategy values.
const (
	FailoverRoundRobin = "round-robin"
	FailoverShuffle    = "shuffle"
)

// backoff returns the pause after failed reconnection round n (0-based):
// initial + n × step (kombu's interval_start and interval_step) or, with a
// negative step, initial × 2^n; capped at max, of which the fraction
// jitter is randomised by r in [0, 1).
func backoff(n int, initial, step, max time.Duration, jitter, r float64) time.Duration {
	var d float64
	if step > 0 {
		d = float64(initial) + float64(min(n, 1<<30))*float64(step)
	} else {
		d = float64(initial) * math.Pow(2, float64(min(n, 62)))
	}
	if d > float64(max) {
		d = float64(max)
	}
	return time.Duration(d * (1 - jitter*r))
}

// pause is the pause after failed round n, with this transport's schedule.
func (s *settings) pause(n int) time.Duration {
	return backoff(n, s.ReconnectInitial, s.ReconnectStep, s.ReconnectMax, s.ReconnectJitter, rand.Float64())
}

// order returns the indexes of the URLs in the order one round tries them.
// lost is the URL whose connection was lost (-1 at the first dial): under
// round-robin the round starts with the URL after it and ends with it.
func (s *settings) order(lost int) []int {
	n := len(s.urls)
	if s.FailoverStrategy == FailoverShuffle {
		return rand.Perm(n)
	}
	out := make([]int, n)
	for k := range n {
		out[k] = (lost + 1 + k) % n
	}
	return out
}
