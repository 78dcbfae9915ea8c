// Package connect opens a broker transport and a result backend from
// Celery-style URLs — broker_url and result_backend, or the
// CELERY_BROKER_URL and CELERY_RESULT_BACKEND environment variables — so
// that a Go main is configured the way a Python Celery app is.
//
//	c, err := connect.Open(ctx, connect.FromEnv(connect.Options{}))
//	if err != nil { ... }
//	defer c.Close()
//	w, err := worker.New(c.Transport, mux, worker.Config{Backend: c.Backend})
//
// Broker URLs: amqp://, amqps:// and pyamqp:// (RabbitMQ; several URLs
// separated by ';' fail over in order), redis://, rediss:// and
// sentinel:// (Redis, with kombu's conventions), memory:// (in-process).
// Result backends: redis://, rediss://, sentinel://, rpc:// and memory://,
// and PostgreSQL through Celery's database backends (backend/sql):
// db+postgresql:// (any +driver, such as db+postgresql+psycopg2://) for
// Celery's SQLAlchemy tables, and django-db for django-celery-results',
// whose database URL is Options.DatabaseURL (CELERIAC_DATABASE_URL), since a
// Go worker cannot read Django's settings.
// With a Redis result backend, Conn.Idempotency is the store that
// worker.Idempotent shares across the fleet:
//
//	mux.Handle("payments.charge", worker.Idempotent(worker.IdempotencyOptions{
//		Store: c.Idempotency, Key: orderID})(charge))
//
// Global rate limits (worker.GlobalRateLimit) need a limiter every worker
// shares: Conn.RateLimiter, for worker.Config.GlobalRateLimiter. It is the
// Redis result backend itself (its token buckets live next to the results),
// or the Redis server Options.RateLimitURL names
// (CELERIAC_RATE_LIMIT_URL), which any broker or backend can be combined
// with; memory:// there, or a memory:// result backend, limits one process
// only. Otherwise it is nil, and global limits are not enforced.
//
// connect is, with cmd, examples and integration, the only place that
// imports the adapters; the worker itself depends on the contracts only.
package connect

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	membackend "github.com/celeriac/celeriac/backend/memory"
	redisbackend "github.com/celeriac/celeriac/backend/redis"
	"github.com/celeriac/celeriac/backend/rpc"
	sqlbackend "github.com/celeriac/celeriac/backend/sql"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	"github.com/celeriac/celeriac/transport/memory"
	redistransport "github.com/celeriac/celeriac/transport/redis"
)

// Options are the connection settings, named after Celery's.
type Options struct {
	// BrokerURL is broker_url. It is required: Open refuses an empty one
	// (ErrNoBroker) rather than start on a broker nothing else can reach;
	// memory:// asks for the in-process broker explicitly.
	BrokerURL string
	// ResultBackend is result_backend. Empty means no result backend.
	ResultBackend string

	// Redis broker transport options (broker_transport_options).
	VisibilityTimeout  time.Duration
	GlobalKeyPrefix    string
	QueueOrderStrategy string
	// RedisStagedPop is transport/redis.Config.StagedPop: pop without the
	// consume script, for about a third of its Redis CPU a message.
	// celeriac's own (broker_transport_options celeriac_staged_pop, or
	// CELERIAC_REDIS_STAGED_POP=1).
	RedisStagedPop bool

	// RateLimitURL is the Redis server of the global rate limits
	// (redis://, rediss://, sentinel://), or memory:// for limits within
	// this process. Empty means the result backend when it is Redis or
	// memory://, else none. It is celeriac's own setting; Celery has no
	// global rate limit.
	RateLimitURL string

	// ResultExpires is result_expires (default 1 day); ResultSerializer is
	// result_serializer (default json).
	ResultExpires    time.Duration
	ResultSerializer string
	// ResultExtended is result_extended. The database backends need it
	// to know which columns to create and fill.
	ResultExtended bool

	// DatabaseURL is the PostgreSQL URL of a django-db result backend
	// (celeriac's setting: Django keeps it in DATABASES), or Celery's
	// database_url for result_backend = "database".
	DatabaseURL string
	// DatabaseTableNames, DatabaseTableSchemas and
	// DatabaseShortLivedSessions are Celery's database_table_names,
	// database_table_schemas ({"task": ..., "group": ...}) and
	// database_short_lived_sessions, for db+ backends.
	DatabaseTableNames         map[string]string
	DatabaseTableSchemas       map[string]string
	DatabaseShortLivedSessions bool

	// DelayedDelivery is RabbitMQ's native delayed delivery (Celery 5.5,
	// for quorum queues; see transport/amqp.Config.DelayedDelivery):
	// "auto" or "" (on when a consumed queue is a quorum queue, Celery's
	// worker_detect_quorum_queues), "on" or "off". DelayedQueueType is
	// broker_native_delayed_delivery_queue_type: "quorum" (default) or
	// "classic". Other brokers ignore both.
	DelayedDelivery  string
	DelayedQueueType string

	// TLS configures amqps:// and rediss:// connections, of the broker and
	// the result backend alike; BrokerSSL and BackendSSL win over it.
	TLS *tls.Config
	// BrokerSSL is Celery's broker_use_ssl: certificates from files,
	// client certificates included. Set, it turns TLS on for amqp:// and
	// redis:// broker URLs too (amqp:// then defaults to port 5671), as
	// Celery does.
	BrokerSSL *SSLOptions
	// BackendSSL is Celery's redis_backend_use_ssl, for a Redis result
	// backend (redis:// turns into rediss://) and for the rate limiter of
	// RateLimitURL.
	BackendSSL *SSLOptions

	// FailoverStrategy is broker_failover_strategy for several
	// ';'-separated AMQP URLs: "round-robin" (the default) or "shuffle"
	// (see transport/amqp.Config.FailoverStrategy).
	FailoverStrategy string
	// MasterName, SentinelUsername and SentinelPassword are the Sentinel
	// settings of a sentinel:// broker (broker_transport_options
	// master_name, and the username and password of sentinel_kwargs, for
	// Sentinels with ACL users); the Backend ones those of a sentinel://
	// result backend (result_backend_transport_options). The rate limiter
	// of a sentinel:// RateLimitURL uses the backend's, else the broker's.
	MasterName              string
	SentinelUsername        string
	SentinelPassword        string
	BackendMasterName       string
	BackendSentinelUsername string
	BackendSentinelPassword string
	// WaitReplicas, when positive, makes Redis acks, publishes and result
	// writes wait (WAIT) until that many replicas have them, for up to
	// WaitTimeout (default 1 s); what is not replicated in time is logged
	// and counted (see transport/redis.Config.WaitReplicas). celeriac's own
	// setting; Celery has none.
	WaitReplicas int
	WaitTimeout  time.Duration
	// ConnectionName names the AMQP connection and Redis clients, for
	// rabbitmqctl and CLIENT LIST.
	ConnectionName string
	Logger         *zap.Logger

	// Broker is the in-process broker memory:// connects to (nil: a new
	// one), so that several transports can share it.
	Broker *memory.Broker
}

// ErrNoBroker: Options.BrokerURL is empty. A worker started with a typo in
// its environment must not come up on an in-process broker, consume
// nothing and look healthy.
var ErrNoBroker = errors.New("connect: no broker URL: set broker_url (CELERY_BROKER_URL), or memory:// for an in-process broker")

// FromEnv fills BrokerURL, ResultBackend, RateLimitURL and DatabaseURL
// from CELERY_BROKER_URL, CELERY_RESULT_BACKEND, CELERIAC_RATE_LIMIT_URL and
// CELERIAC_DATABASE_URL when they are empty, and turns RedisStagedPop on
// when CELERIAC_REDIS_STAGED_POP is true.
func FromEnv(o Options) Options {
	if o.DatabaseURL == "" {
		o.DatabaseURL = os.Getenv("CELERIAC_DATABASE_URL")
	}
	if o.BrokerURL == "" {
		o.BrokerURL = os.Getenv("CELERY_BROKER_URL")
	}
	if o.ResultBackend == "" {
		o.ResultBackend = os.Getenv("CELERY_RESULT_BACKEND")
	}
	if o.RateLimitURL == "" {
		o.RateLimitURL = os.Getenv("CELERIAC_RATE_LIMIT_URL")
	}
	if v, err := strconv.ParseBool(os.Getenv("CELERIAC_REDIS_STAGED_POP")); err == nil && v {
		o.RedisStagedPop = true
	}
	return o
}

// Conn is an open broker transport and result backend.
type Conn struct {
	Transport transport.Transport
	// Backend is nil when no result backend is configured.
	Backend backend.Backend
	// Idempotency is the store for worker.Idempotent that every worker
	// sharing the result backend shares: the Redis result backend itself
	// (keys <global_keyprefix>celeriac.idem.<key>), or an in-process store
	// with memory://. It is nil for other backends (rpc://, none), which
	// cannot keep claims.
	Idempotency backend.IdempotencyStore
	// BrokerScheme is the broker kind: "amqp", "redis" or "memory".
	BrokerScheme string
	// RateLimiter enforces global rate limits (see the package doc); nil
	// when none is configured.
	RateLimiter backend.RateLimiter

	// limiterConn is the connection opened for RateLimitURL alone.
	limiterConn backend.Backend
}

// Close closes the rate limiter's own connection, the backend, then the
// transport.
func (c *Conn) Close() error {
	var errs []error
	if c.limiterConn != nil {
		errs = append(errs, c.limiterConn.Close())
	}
	if c.Backend != nil {
		errs = append(errs, c.Backend.Close())
	}
	if c.Transport != nil {
		errs = append(errs, c.Transport.Close())
	}
	return errors.Join(errs...)
}

// Open connects to the broker and opens the result backend.
func Open(ctx context.Context, o Options) (*Conn, error) {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	tr, scheme, err := openBroker(ctx, o)
	if err != nil {
		return nil, err
	}
	c := &Conn{Transport: tr, BrokerScheme: scheme}
	be, err := openBackend(ctx, o, tr)
	if err != nil {
		tr.Close()
		return nil, err
	}
	c.Backend = be
	switch be := be.(type) {
	case backend.IdempotencyStore:
		c.Idempotency = be
	case *membackend.Backend:
		// Only this process sees the in-memory backend, so an in-process
		// store is shared by everything that can share its results.
		c.Idempotency = membackend.NewIdempotency()
	}
	if err := openRateLimiter(ctx, o, c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// openRateLimiter sets c.RateLimiter from o.RateLimitURL, else from the
// result backend.
func openRateLimiter(ctx context.Context, o Options, c *Conn) error {
	raw := strings.TrimSpace(o.RateLimitURL)
	switch s := Scheme(raw); s {
	case "":
		if raw != "" {
			return fmt.Errorf("connect: rate limit URL %q is not a URL", Redact(raw))
		}
		switch be := c.Backend.(type) {
		case backend.RateLimiter:
			c.RateLimiter = be
		case *membackend.Backend:
			c.RateLimiter = membackend.NewRateLimiter()
		}
		return nil
	case "memory":
		c.RateLimiter = membackend.NewRateLimiter()
		return nil
	case "redis", "rediss", "sentinel":
		tlsConf, raw, err := backendTLS(o, raw)
		if err != nil {
			return fmt.Errorf("connect: rate limit URL %s: %w", Redact(raw), err)
		}
		master, sentinelUser, sentinelPw := o.BackendMasterName, o.BackendSentinelUsername, o.BackendSentinelPassword
		if master == "" {
			master, sentinelUser, sentinelPw = o.MasterName, o.SentinelUsername, o.SentinelPassword
		}
		be, err := redisbackend.New(redisbackend.Config{URL: raw, TLSConfig: tlsConf, Logger: o.Logger,
			MasterName: master, SentinelUsername: sentinelUser, SentinelPassword: sentinelPw})
		if err != nil {
			return fmt.Errorf("connect: rate limit URL %s: %w", Redact(raw), err)
		}
		if err := be.Ping(ctx); err != nil {
			be.Close()
			return fmt.Errorf("connect: rate limit URL %s: %w", Redact(raw), err)
		}
		c.limiterConn, c.RateLimiter = be, be
		return nil
	default:
		return fmt.Errorf("connect: unsupported rate limit URL scheme %q in %s (want redis://, rediss://, sentinel:// or memory://)", s, Redact(raw))
	}
}

// Scheme returns a URL's scheme, lower-cased, for the first of several
// ';'-separated URLs.
func Scheme(raw string) string {
	first, _, _ := strings.Cut(strings.TrimSpace(raw), ";")
	s, _, ok := strings.Cut(first, "://")
	if !ok {
		return ""
	}
	return strings.ToLower(s)
}

func openBroker(ctx context.Context, o Options) (transport.Transport, string, error) {
	raw := strings.TrimSpace(o.BrokerURL)
	if raw == "" {
		return nil, "", ErrNoBroker
	}
	switch s := Scheme(raw); s {
	case "", "memory":
		if s == "" {
			// Not silently memory://: a task sent there reaches nobody.
			return nil, "", fmt.Errorf("connect: broker %q is not a URL (want amqp://, redis://, sentinel:// or memory://)", Redact(raw))
		}
		return memory.New(memory.Config{Broker: o.Broker}), "memory", nil
	case "amqp", "amqps", "pyamqp", "librabbitmq":
		var urls []string
		for _, u := range strings.Split(raw, ";") {
			if u = strings.TrimSpace(u); u != "" {
				// kombu's aliases name the client library, not the protocol.
				u = strings.Replace(u, "pyamqp://", "amqp://", 1)
				u = strings.Replace(u, "librabbitmq://", "amqp://", 1)
				urls = append(urls, u)
			}
		}
		mode, err := delayedMode(o.DelayedDelivery)
		if err != nil {
			return nil, "", err
		}
		tlsConf := o.TLS
		if o.BrokerSSL != nil {
			if tlsConf, err = o.BrokerSSL.TLSConfig(); err != nil {
				return nil, "", fmt.Errorf("connect: broker_use_ssl: %w", err)
			}
			for i, u := range urls {
				urls[i] = forceScheme(u, "amqp", "amqps")
			}
		}
		tr, err := amqptransport.Dial(ctx, amqptransport.Config{
			URLs: urls, TLS: tlsConf, ConnectionName: o.ConnectionName, Logger: o.Logger,
			DelayedDelivery: mode, DelayedQueueType: o.DelayedQueueType,
			FailoverStrategy: o.FailoverStrategy,
		})
		if err != nil {
			return nil, "", fmt.Errorf("connect: broker %s: %w", Redact(raw), err)
		}
		return tr, "amqp", nil
	case "redis", "rediss", "sentinel", "redis+socket":
		tlsConf := o.TLS
		if o.BrokerSSL != nil {
			var err error
			if tlsConf, err = o.BrokerSSL.TLSConfig(); err != nil {
				return nil, "", fmt.Errorf("connect: broker_use_ssl: %w", err)
			}
			raw = forceScheme(raw, "redis", "rediss")
		}
		tr, err := redistransport.Dial(ctx, redistransport.Config{
			URL: raw, TLSConfig: tlsConf, ClientName: o.ConnectionName, Logger: o.Logger,
			VisibilityTimeout: o.VisibilityTimeout, GlobalKeyPrefix: o.GlobalKeyPrefix,
			QueueOrderStrategy: o.QueueOrderStrategy, StagedPop: o.RedisStagedPop,
			MasterName: o.MasterName, SentinelUsername: o.SentinelUsername, SentinelPassword: o.SentinelPassword,
			WaitReplicas: o.WaitReplicas, WaitTimeout: o.WaitTimeout,
		})
		if err != nil {
			return nil, "", fmt.Errorf("connect: broker %s: %w", Redact(raw), err)
		}
		return tr, "redis", nil
	default:
		return nil, "", fmt.Errorf("connect: unsupported broker scheme %q in %s (want amqp://, redis://, sentinel:// or memory://)", s, Redact(raw))
	}
}

func openBackend(ctx context.Context, o Options, tr transport.Transport) (backend.Backend, error) {
	raw := strings.TrimSpace(o.ResultBackend)
	serializer := o.ResultSerializer
	switch serializer {
	case "", "json":
		serializer = protocol.ContentTypeJSON
	case "msgpack":
		serializer = protocol.ContentTypeMsgpack
	}
	if strings.HasPrefix(strings.ToLower(raw), "db+") || raw == "django-db" || raw == "database" {
		return openSQLBackend(ctx, o, raw, serializer)
	}
	switch s := Scheme(raw); s {
	case "":
		if raw == "" || raw == "disabled" {
			return nil, nil
		}
		return nil, fmt.Errorf("connect: result backend %q is not a URL", Redact(raw))
	case "memory", "cache+memory":
		return membackend.New(), nil
	case "rpc":
		return rpc.New(tr, rpc.Config{Serializer: serializer})
	case "redis", "rediss", "sentinel":
		tlsConf, raw, err := backendTLS(o, raw)
		if err != nil {
			return nil, fmt.Errorf("connect: result backend %s: %w", Redact(raw), err)
		}
		be, err := redisbackend.New(redisbackend.Config{
			URL: raw, TLSConfig: tlsConf, ResultExpires: o.ResultExpires,
			Serializer: serializer, Logger: o.Logger,
			MasterName: o.BackendMasterName, SentinelUsername: o.BackendSentinelUsername, SentinelPassword: o.BackendSentinelPassword,
			WaitReplicas: o.WaitReplicas, WaitTimeout: o.WaitTimeout,
		})
		if err != nil {
			return nil, fmt.Errorf("connect: result backend %s: %w", Redact(raw), err)
		}
		if p, ok := any(be).(interface{ Ping(context.Context) error }); ok {
			if err := p.Ping(ctx); err != nil {
				be.Close()
				return nil, fmt.Errorf("connect: result backend %s: %w", Redact(raw), err)
			}
		}
		return be, nil
	default:
		return nil, fmt.Errorf("connect: unsupported result backend %q in %s (want redis://, rpc://, db+postgresql://, django-db or memory://)", s, Redact(raw))
	}
}

// openSQLBackend opens Celery's SQLAlchemy backend (db+postgresql://...,
// or "database" with DatabaseURL) or django-celery-results' (django-db
// with DatabaseURL).
func openSQLBackend(ctx context.Context, o Options, raw, serializer string) (backend.Backend, error) {
	cfg := sqlbackend.Config{
		URL: raw, Extended: o.ResultExtended, Serializer: serializer, ResultExpires: o.ResultExpires,
		TableNames: o.DatabaseTableNames, TableSchemas: o.DatabaseTableSchemas,
		ShortLivedSessions: o.DatabaseShortLivedSessions, Logger: o.Logger,
	}
	if raw == "django-db" || raw == "database" {
		if strings.TrimSpace(o.DatabaseURL) == "" {
			return nil, fmt.Errorf("connect: result backend %s needs the database URL (CELERIAC_DATABASE_URL, or database_url in the config file)", raw)
		}
		cfg.URL = o.DatabaseURL
		if raw == "django-db" {
			cfg.Schema = sqlbackend.Django
		}
	}
	be, err := sqlbackend.New(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: result backend %s: %w", Redact(cfg.URL), err)
	}
	return be, nil
}

// delayedMode reads Options.DelayedDelivery.
func delayedMode(s string) (amqptransport.DelayedDeliveryMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return amqptransport.DelayedAuto, nil
	case "on":
		return amqptransport.DelayedOn, nil
	case "off":
		return amqptransport.DelayedOff, nil
	}
	return 0, fmt.Errorf("connect: DelayedDelivery %q: want auto, on or off", s)
}
