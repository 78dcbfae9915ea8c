package redis

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/internal/redact"
	"github.com/celeriac/celeriac/protocol"
)

// Queue order strategies between queues of the same priority band, as kombu
// names them (transport option queue_order_strategy).
const (
	// RoundRobin moves the queue a message was taken from to the end of the
	// order, so a busy queue cannot starve the others (kombu's default).
	RoundRobin = "round_robin"
	// Priority keeps the queues in the order given: the first non-empty
	// queue always wins.
	Priority = "priority"
	// Sorted consumes queues in alphabetical order.
	Sorted = "sorted"
)

// Config configures a [Transport]. The zero value of every field means the
// documented default; field names follow kombu's transport options so that a
// Celery configuration translates one to one.
type Config struct {
	// URL is the broker URL: redis://[[user]:password@]host[:port][/db],
	// rediss:// for TLS (kombu's ssl_cert_reqs, ssl_ca_certs, ssl_certfile
	// and ssl_keyfile query parameters are honoured), or Sentinel as kombu
	// spells it: "sentinel://host:26379;sentinel://host2:26379" with
	// MasterName. Default redis://127.0.0.1:6379/0.
	URL string
	// MasterName is the Sentinel master group (kombu's master_name); required
	// for sentinel:// URLs.
	MasterName string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// themselves (kombu's sentinel_kwargs username and password: an ACL
	// user of the Sentinels); the URL's user and password are the master's.
	SentinelUsername string
	SentinelPassword string
	// TLSConfig, when set, is used for every connection (and implies TLS). It
	// overrides the TLS query parameters of a rediss:// URL.
	TLSConfig *tls.Config
	// ClientName is sent with CLIENT SETNAME on every connection, so that
	// operators (and tests) can tell this transport's connections apart.
	// Default "celeriac".
	ClientName string
	// PoolSize bounds the connection pool; default 10 (kombu's
	// max_connections). Each consumer holds one more connection while it
	// blocks waiting for messages.
	PoolSize int
	// DialTimeout bounds connecting; default 5 s.
	DialTimeout time.Duration
	// ReadTimeout bounds the wait for the reply to one command, on every
	// pooled connection; default 5 s (go-redis's). A blocking command
	// (BRPOP, BLMOVE) waits its own timeout plus 10 s instead, so a long
	// BRPOPTimeout never looks like a dead link; a connection blackholed
	// mid-command fails within this bound and is replaced. Negative means
	// no bound. The pooled connections also send TCP keepalives (30 s idle,
	// then 3 probes 5 s apart: go-redis's dialer).
	ReadTimeout time.Duration
	// HealthCheckInterval is how long a pub/sub connection (remote
	// control, events) may stay silent before it is sent a PING; a PING
	// unanswered for as long again has the connection replaced and
	// subscribed again. Default 10 s, so a blackholed subscription is
	// noticed within about 20 s (kombu's health_check_interval is 25 s);
	// negative disables it. A silent channel is no evidence of a dead link:
	// only the PING's answer is.
	HealthCheckInterval time.Duration

	// GlobalKeyPrefix is prepended to every key and pub/sub channel the
	// transport touches, the unacked bookkeeping included, exactly as kombu's
	// global_keyprefix. Default "" (none).
	GlobalKeyPrefix string
	// Sep separates a queue name from its priority band and the fields of a
	// binding; default "\x06\x16" (kombu's sep).
	Sep string
	// PrioritySteps are the priority bands; default [0, 3, 6, 9]. Messages
	// go to the largest step not above their priority (0..9), and lower
	// steps are consumed first.
	PrioritySteps []int
	// QueueOrderStrategy orders queues inside a band: RoundRobin (default),
	// Priority (the order given) or Sorted.
	QueueOrderStrategy string

	// UnackedKey, UnackedIndexKey and UnackedMutexKey name kombu's unacked
	// hash, its index zset and the restore mutex; defaults "unacked",
	// "unacked_index", "unacked_mutex".
	UnackedKey      string
	UnackedIndexKey string
	UnackedMutexKey string
	// UnackedMutexExpire is how long the restore mutex may be held; default
	// 300 s.
	UnackedMutexExpire time.Duration
	// UnackedRestoreLimit bounds how many messages one sweep restores; 0
	// means no limit (kombu's default).
	UnackedRestoreLimit int
	// VisibilityTimeout is how long a delivered message may stay unacked
	// before any worker's sweep restores it; default 1 h. It must match the
	// Python workers' visibility_timeout on the same broker.
	VisibilityTimeout time.Duration
	// RestoreInterval and RestoreThrottle bound the period of the restore
	// sweep as kombu's unacked_restore_interval and unacked_restore_throttle
	// do (defaults 10 s and 10, so at most 100 s between sweeps): a sweep
	// runs when consuming starts and then every SweepPeriod(), which is
	// RestoreInterval*RestoreThrottle or, for a short visibility timeout,
	// VisibilityTimeout/10 but not below a second. A message a killed
	// worker held is then back in its queue within the visibility timeout
	// plus that period (plus the sweep's own run): 6 s for
	// visibility_timeout=5 instead of kombu's 100 s. The sweep takes
	// kombu's unacked_mutex, so Python and Go workers never sweep at once.
	RestoreInterval time.Duration
	RestoreThrottle int
	// DisableRestore turns the sweep off in this process (other workers
	// still sweep). Messages this process holds are restored at Close either
	// way.
	DisableRestore bool
	// RenewInterval is how often the visibility of held deliveries is
	// renewed (their unacked_index score refreshed), so that no worker's
	// sweep restores a message this live process still holds. Default
	// VisibilityTimeout/4; negative disables renewal (kombu's behaviour).
	RenewInterval time.Duration

	// BRPOPTimeout is how long one blocking wait lasts when every queue is
	// empty; default 1 s (kombu's brpop_timeout). A consumer of several
	// lists (queues or priority bands) waits at most 100 ms on Redis >= 6.2
	// (see the package documentation).
	BRPOPTimeout time.Duration
	// StagedPop pops without the consume script, on Redis >= 6.2 (older
	// servers keep the script): each message moves (LMOVE) into a staging
	// list of the consumer's own, and kombu's unacked records are written
	// from the client in a second round trip, which costs Redis about a
	// third of the script's CPU a message (docs/performance.md). A message
	// is never outside Redis either way. The price: what a consumer that
	// dies between the two steps leaves in its staging lists comes back
	// through a celeriac sweeper only (any celeriac transport with
	// StagedPop, after StagedLease), since Python workers know kombu's
	// unacked hash alone. celeriac's own setting (broker_transport_options
	// celeriac_staged_pop); off by default.
	StagedPop bool
	// StagedLease is how long a staged consumer's heartbeat may be silent
	// before a sweeper puts back its staging lists; default 60 s. It beats
	// every sixth of it.
	StagedLease time.Duration

	// BatchSize caps how many messages one atomic pop takes (never more than
	// the free prefetch); default 256, at most 4096.
	BatchSize int

	// FanoutPrefix is the pub/sub channel prefix of fanout exchanges, with
	// "{db}" replaced by the database number; default "/{db}.". Set
	// NoFanoutPrefix for kombu's fanout_prefix=False.
	FanoutPrefix   string
	NoFanoutPrefix bool
	// NoFanoutPatterns turns off kombu's fanout_patterns (publishing on
	// "<prefix><exchange>/<routing_key>").
	NoFanoutPatterns bool
	// FanoutExchanges are always routed as fanout (pub/sub), whatever the
	// exchange type of a publish says: Celery declares its event and control
	// exchanges as fanout on Redis. Default ["celeryev", "celery.pidbox"].
	FanoutExchanges []string

	// DeadLetterPrefix starts the name of each queue's dead-letter list
	// ("<GlobalKeyPrefix><DeadLetterPrefix><queue>"); default
	// "celeriac.dead.". Python never reads these lists.
	DeadLetterPrefix string

	// ReconnectMin and ReconnectMax bound the exponential backoff (with
	// jitter) between attempts after a connection error; defaults 50 ms and
	// 5 s.
	ReconnectMin time.Duration
	ReconnectMax time.Duration

	// WaitReplicas, when positive, makes every ack batch and every publish
	// wait (Redis WAIT) until that many replicas have its writes, for up to
	// WaitTimeout (default 1 s). Redis replicates asynchronously, so a
	// Sentinel failover can lose what the old master acknowledged: an ack
	// (the message then runs again) or a message this transport published
	// (a retry, a chained task: lost). A write not replicated in time is
	// still on the master; it is logged at warn level and counted
	// (Unreplicated). Python producers have no such option: what they
	// published just before a failover can be lost, and no worker sees it.
	WaitReplicas int
	WaitTimeout  time.Duration

	// Decode bounds what envelopes are accepted (protocol.DecodeOptions).
	Decode protocol.DecodeOptions

	// Logger receives the transport's logs; nil means zap.NewNop().
	Logger *zap.Logger
}

// Defaults.
const (
	DefaultURL               = "redis://127.0.0.1:6379/0"
	DefaultClientName        = "celeriac"
	DefaultSep               = "\x06\x16"
	DefaultVisibilityTimeout = time.Hour
	DefaultBatchSize         = 256
	maxBatchSize             = 4096
	DefaultDeadLetterPrefix  = "celeriac.dead."
	// DefaultHealthCheckInterval is Config.HealthCheckInterval's default.
	DefaultHealthCheckInterval = 10 * time.Second
)

// withDefaults returns a copy of c with defaults applied.
func (c Config) withDefaults() Config {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	defDur := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.URL, DefaultURL)
	def(&c.ClientName, DefaultClientName)
	def(&c.Sep, DefaultSep)
	def(&c.QueueOrderStrategy, RoundRobin)
	def(&c.UnackedKey, "unacked")
	def(&c.UnackedIndexKey, "unacked_index")
	def(&c.UnackedMutexKey, "unacked_mutex")
	def(&c.FanoutPrefix, "/{db}.")
	def(&c.DeadLetterPrefix, DefaultDeadLetterPrefix)
	if c.PoolSize == 0 {
		c.PoolSize = 10
	}
	defDur(&c.DialTimeout, 5*time.Second)
	defDur(&c.ReadTimeout, 5*time.Second)
	if c.ReadTimeout < 0 {
		c.ReadTimeout = -1 // go-redis's "no deadline"
	}
	defDur(&c.HealthCheckInterval, DefaultHealthCheckInterval)
	defDur(&c.UnackedMutexExpire, 300*time.Second)
	defDur(&c.VisibilityTimeout, DefaultVisibilityTimeout)
	defDur(&c.RestoreInterval, 10*time.Second)
	if c.RestoreThrottle == 0 {
		c.RestoreThrottle = 10
	}
	defDur(&c.RenewInterval, c.VisibilityTimeout/4)
	defDur(&c.BRPOPTimeout, time.Second)
	defDur(&c.StagedLease, time.Minute)
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	defDur(&c.WaitTimeout, time.Second)
	defDur(&c.ReconnectMin, 50*time.Millisecond)
	defDur(&c.ReconnectMax, 5*time.Second)
	if c.PrioritySteps == nil {
		c.PrioritySteps = []int{0, 3, 6, 9}
	} else {
		c.PrioritySteps = slices.Clone(c.PrioritySteps)
	}
	if c.FanoutExchanges == nil {
		c.FanoutExchanges = []string{"celeryev", "celery.pidbox"}
	} else {
		c.FanoutExchanges = slices.Clone(c.FanoutExchanges)
	}
	if c.NoFanoutPrefix {
		c.FanoutPrefix = ""
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

// SweepPeriod is the time between two restore sweeps of a configuration
// (see RestoreInterval).
func (c Config) SweepPeriod() time.Duration {
	c = c.withDefaults()
	kombu := c.RestoreInterval * time.Duration(c.RestoreThrottle)
	return min(kombu, max(c.VisibilityTimeout/10, time.Second))
}

// Validate reports the first invalid field of a configuration with defaults
// applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch c.QueueOrderStrategy {
	case RoundRobin, Priority, Sorted:
	default:
		return fmt.Errorf("redis: unknown QueueOrderStrategy %q", c.QueueOrderStrategy)
	}
	if len(c.PrioritySteps) == 0 {
		return errors.New("redis: PrioritySteps is empty")
	}
	for _, s := range c.PrioritySteps {
		if s < 0 || s > 9 {
			return fmt.Errorf("redis: priority step %d outside 0..9", s)
		}
	}
	if c.StagedLease < 100*time.Millisecond {
		return fmt.Errorf("redis: StagedLease %v too small", c.StagedLease)
	}
	if c.BatchSize < 1 || c.BatchSize > maxBatchSize {
		return fmt.Errorf("redis: BatchSize %d outside 1..%d", c.BatchSize, maxBatchSize)
	}
	if c.VisibilityTimeout < time.Millisecond {
		return fmt.Errorf("redis: VisibilityTimeout %v too small", c.VisibilityTimeout)
	}
	if c.RestoreInterval < 0 || c.RestoreThrottle < 1 {
		return errors.New("redis: RestoreInterval must be positive and RestoreThrottle at least 1")
	}
	if c.WaitReplicas < 0 || c.WaitTimeout < 0 {
		return errors.New("redis: negative WaitReplicas or WaitTimeout")
	}
	if c.ReconnectMin <= 0 || c.ReconnectMax < c.ReconnectMin {
		return errors.New("redis: ReconnectMin must be positive and not above ReconnectMax")
	}
	ep, err := ParseURL(c.URL)
	if err != nil {
		return err
	}
	if ep.Sentinel && c.MasterName == "" {
		return errors.New("redis: sentinel URL needs MasterName")
	}
	return nil
}

// Endpoint is a parsed broker URL.
type Endpoint struct {
	// Network is "tcp" or "unix".
	Network string
	// Addrs holds one address for redis:// and rediss://, the Sentinels'
	// addresses for sentinel://, and a socket path for unix sockets.
	Addrs []string
	// Sentinel is true for sentinel:// URLs.
	Sentinel bool
	// TLS is true for rediss:// (and sentinel URLs with ssl query options).
	TLS                bool
	Username, Password string
	// DB is the database number (kombu's virtual host); it also names the
	// fanout channels ("/{db}.").
	DB int
	// TLS options from kombu's query parameters: ssl_cert_reqs
	// (CERT_REQUIRED, CERT_OPTIONAL, CERT_NONE), ssl_ca_certs, ssl_certfile,
	// ssl_keyfile.
	CertReqs, CACerts, CertFile, KeyFile string
}

// ParseURL parses a kombu Redis broker URL: redis://, rediss://, a
// ";"-separated list of sentinel:// URLs, or redis+socket:// / socket://
// with a socket path. The database comes from the path ("/3") or a "db" or
// "virtual_host" query parameter; default 0.
func ParseURL(raw string) (Endpoint, error) {
	var ep Endpoint
	parts := strings.Split(raw, ";")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		u, err := url.Parse(p)
		if err != nil {
			return Endpoint{}, fmt.Errorf("redis: bad URL: %w", redact.Error(err))
		}
		scheme := strings.ToLower(u.Scheme)
		if i > 0 && scheme != "sentinel" && scheme != "sentinels" {
			return Endpoint{}, fmt.Errorf("redis: only sentinel URLs may be combined with ';', got %q", u.Scheme)
		}
		switch scheme {
		case "redis", "rediss", "sentinel", "sentinels":
			ep.Network = "tcp"
			host := u.Hostname()
			if host == "" {
				host = "127.0.0.1"
			}
			port := u.Port()
			if port == "" {
				port = "6379"
				if strings.HasPrefix(scheme, "sentinel") {
					port = "26379"
				}
			}
			if _, err := strconv.Atoi(port); err != nil {
				return Endpoint{}, fmt.Errorf("redis: bad port %q", port)
			}
			ep.Addrs = append(ep.Addrs, net.JoinHostPort(host, port))
			ep.Sentinel = strings.HasPrefix(scheme, "sentinel")
			if scheme == "rediss" || scheme == "sentinels" {
				ep.TLS = true
			}
		case "redis+socket", "socket", "unix":
			ep.Network = "unix"
			if u.Path == "" {
				return Endpoint{}, errors.New("redis: socket URL without a path")
			}
			ep.Addrs = []string{u.Path}
		default:
			return Endpoint{}, fmt.Errorf("redis: unsupported URL scheme %q", u.Scheme)
		}
		if i > 0 && !ep.Sentinel {
			return Endpoint{}, errors.New("redis: only sentinel URLs may be combined with ';'")
		}
		// The first URL carries the credentials and the database, as in
		// kombu (the others only add Sentinel addresses).
		if len(ep.Addrs) > 1 {
			continue
		}
		if u.User != nil {
			ep.Username = u.User.Username()
			ep.Password, _ = u.User.Password()
		}
		q := u.Query()
		if ep.Network == "tcp" {
			if db := strings.Trim(u.Path, "/"); db != "" {
				n, err := strconv.Atoi(db)
				if err != nil || n < 0 {
					return Endpoint{}, fmt.Errorf("redis: database is an integer, not %q", db)
				}
				ep.DB = n
			}
		}
		for _, k := range []string{"db", "virtual_host"} {
			if v := q.Get(k); v != "" {
				n, err := strconv.Atoi(strings.Trim(v, "/"))
				if err != nil || n < 0 {
					return Endpoint{}, fmt.Errorf("redis: database is an integer, not %q", v)
				}
				ep.DB = n
			}
		}
		if v := q.Get("password"); v != "" && ep.Password == "" {
			ep.Password = v
		}
		ep.CertReqs = q.Get("ssl_cert_reqs")
		ep.CACerts = q.Get("ssl_ca_certs")
		ep.CertFile = q.Get("ssl_certfile")
		ep.KeyFile = q.Get("ssl_keyfile")
		if ep.CertReqs != "" || ep.CACerts != "" || ep.CertFile != "" {
			if ep.Sentinel {
				ep.TLS = true
			}
		}
		switch strings.ToUpper(ep.CertReqs) {
		case "", "CERT_REQUIRED", "REQUIRED", "CERT_OPTIONAL", "OPTIONAL", "CERT_NONE", "NONE":
		default:
			return Endpoint{}, fmt.Errorf("redis: bad ssl_cert_reqs %q", ep.CertReqs)
		}
	}
	if len(ep.Addrs) == 0 {
		return Endpoint{}, fmt.Errorf("redis: no address in URL %s", redact.URL(raw))
	}
	return ep, nil
}
