package redis

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/protocol"
)

// Defaults of Celery's Redis result backend.
const (
	// DefaultURL is used when Config.URL is empty.
	DefaultURL = "redis://127.0.0.1:6379/0"
	// DefaultResultExpires is Celery's result_expires default.
	DefaultResultExpires = 24 * time.Hour
	// DefaultKeyPrefix is Celery's task_keyprefix.
	DefaultKeyPrefix = "celery-task-meta-"
	// DefaultGroupKeyPrefix is Celery's group_keyprefix; chord counters
	// live under it (<prefix><group id>.j, .t, .s).
	DefaultGroupKeyPrefix = "celery-taskset-meta-"
	// DefaultMaxBatch bounds how many stores share one round trip.
	DefaultMaxBatch = 256
)

// NoExpiry as Config.ResultExpires stores results without a TTL (SET instead
// of SETEX), like Celery's result_expires = None.
const NoExpiry time.Duration = -1

// maxValueSize is Redis's limit for a string value (Celery refuses larger
// results with BackendStoreError).
const maxValueSize = 512 << 20

// Config configures a Backend. The zero value is usable: it connects to
// DefaultURL and behaves like Celery's defaults.
type Config struct {
	// URL of the Redis server, as Celery's result_backend:
	//   redis://[[user]:password@]host[:port][/db][?options]
	//   rediss://...?ssl_cert_reqs=required&ssl_ca_certs=/path  (TLS)
	//   unix:///path/to/socket?db=N  or  socket:///path/to/socket?virtual_host=N
	//   sentinel://[:password@]host:port[/db];sentinel://host2:port...  (with MasterName)
	// Query options other than Celery's ssl_* ones are go-redis options
	// (pool_size, dial_timeout, ...). Empty means DefaultURL.
	URL string
	// MasterName is the Sentinel service name (Celery's
	// result_backend_transport_options["master_name"]). Required with
	// sentinel:// URLs unless the URL carries ?master_name=.
	MasterName string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// (Celery's sentinel_kwargs username and password: an ACL user of the
	// Sentinels). The URL's user and password are the master's.
	SentinelUsername string
	SentinelPassword string
	// TLSConfig overrides the TLS settings derived from a rediss:// URL.
	TLSConfig *tls.Config

	// ResultExpires is the TTL of stored results and chord counters
	// (Celery's result_expires). Zero means DefaultResultExpires (one day);
	// NoExpiry (or any negative value) stores them without TTL. Values are
	// rounded down to whole seconds, at least one.
	ResultExpires time.Duration
	// KeyPrefix precedes the task id in result keys. Empty means
	// DefaultKeyPrefix.
	KeyPrefix string
	// GroupKeyPrefix precedes the group id in chord keys. Empty means
	// DefaultGroupKeyPrefix.
	GroupKeyPrefix string
	// GlobalKeyPrefix is prepended to both prefixes (Celery ≥5.3's
	// result_backend_transport_options["global_keyprefix"]), and to the keys
	// of celeriac's own shared state (idempotency claims); like Celery,
	// "_" is appended unless it already ends with one of ":_-.".
	GlobalKeyPrefix string
	// Serializer encodes results: protocol.ContentTypeJSON (the default when
	// empty) or protocol.ContentTypeMsgpack; "json" and "msgpack" are
	// accepted too. It must equal the result_serializer of the Python
	// clients: the Redis backend stores no content type, so a client decodes
	// with its own setting, whatever serializer the task message used.
	Serializer string
	// UnorderedChords keeps chord parts in a list instead of a sorted set
	// (Celery's result_chord_ordered = False transport option). Python
	// workers sharing the chords must use the same setting.
	UnorderedChords bool
	// MaxBatch bounds the number of concurrent Store calls written in one
	// pipeline round trip. Zero means DefaultMaxBatch. 1 disables batching:
	// each Store then does its own round trip from the caller's goroutine,
	// under the caller's context.
	MaxBatch int
	// WaitReplicas, when positive, makes every result write wait (Redis
	// WAIT) until that many replicas have it, for up to WaitTimeout
	// (default 1 s). Redis replicates asynchronously: a result the master
	// acknowledged can be lost when a Sentinel failover promotes a replica
	// that had not received it. A write not replicated in time is still
	// stored on the master; it is logged at warn level and counted
	// (Unreplicated), so that no loss goes unseen. Each write batch costs
	// one more round trip, and one replica's acknowledgement.
	WaitReplicas int
	WaitTimeout  time.Duration
	// Logger receives debug and warning logs. Nil means no logging.
	Logger *zap.Logger
}

// settings is a Config with defaults applied.
type settings struct {
	expires     int64 // seconds; 0 = no TTL
	taskPrefix  string
	groupPrefix string
	contentType string
	luaFormat   string // "json" or "msgpack": how the store script reads a stored status
	unordered   bool
	maxBatch    int
	log         *zap.Logger
	// globalPrefix is GlobalKeyPrefix as Celery normalises it ("" or ending
	// in one of ":_-."), for celeriac's own keys.
	globalPrefix string
	waitReplicas int
	waitTimeout  time.Duration
}

func (c *Config) settings() (settings, error) {
	s := settings{
		taskPrefix:  cmpOr(c.KeyPrefix, DefaultKeyPrefix),
		groupPrefix: cmpOr(c.GroupKeyPrefix, DefaultGroupKeyPrefix),
		unordered:   c.UnorderedChords,
		maxBatch:    c.MaxBatch,
		log:         c.Logger,
	}
	switch {
	case c.ResultExpires == 0:
		s.expires = int64(DefaultResultExpires / time.Second)
	case c.ResultExpires > 0:
		s.expires = max(int64(c.ResultExpires/time.Second), 1)
	}
	if g := c.GlobalKeyPrefix; g != "" {
		if !strings.ContainsAny(g[len(g)-1:], ":_-.") {
			g += "_"
		}
		s.taskPrefix, s.groupPrefix = g+s.taskPrefix, g+s.groupPrefix
		s.globalPrefix = g
	}
	switch strings.ToLower(c.Serializer) {
	case "", "json", protocol.ContentTypeJSON:
		s.contentType, s.luaFormat = protocol.ContentTypeJSON, "json"
	case "msgpack", protocol.ContentTypeMsgpack:
		s.contentType, s.luaFormat = protocol.ContentTypeMsgpack, "msgpack"
	default:
		return s, fmt.Errorf("redis backend: unsupported result serializer %q (json or msgpack)", c.Serializer)
	}
	if s.maxBatch < 0 {
		return s, fmt.Errorf("redis backend: negative MaxBatch %d", s.maxBatch)
	}
	if s.maxBatch == 0 {
		s.maxBatch = DefaultMaxBatch
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if c.WaitReplicas < 0 || c.WaitTimeout < 0 {
		return s, errors.New("redis backend: negative WaitReplicas or WaitTimeout")
	}
	s.waitReplicas, s.waitTimeout = c.WaitReplicas, c.WaitTimeout
	if s.waitReplicas > 0 && s.waitTimeout == 0 {
		s.waitTimeout = time.Second
	}
	return s, nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// newClient builds the go-redis client for c.URL.
func (c *Config) newClient() (*goredis.Client, error) {
	raw := cmpOr(c.URL, DefaultURL)
	if strings.HasPrefix(raw, "sentinel://") {
		opt, err := c.failoverOptions(raw)
		if err != nil {
			return nil, err
		}
		return goredis.NewFailoverClient(opt), nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("redis backend: bad URL: %w", redactURLError(err))
	}
	q := u.Query()
	tlsConf, err := celeryTLS(u.Scheme, u.Hostname(), q)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "socket" {
		// Celery's socket:// names a unix socket; the db is ?virtual_host=.
		u.Scheme = "unix"
		if vh := q.Get("virtual_host"); vh != "" {
			q.Del("virtual_host")
			q.Set("db", vh)
		}
	}
	u.RawQuery = q.Encode()
	opt, err := goredis.ParseURL(u.String())
	if err != nil {
		return nil, fmt.Errorf("redis backend: bad URL: %w", redactURLError(err))
	}
	if tlsConf != nil {
		opt.TLSConfig = tlsConf
	}
	if c.TLSConfig != nil {
		opt.TLSConfig = c.TLSConfig.Clone()
	}
	return goredis.NewClient(opt), nil
}

// failoverOptions parses Celery's sentinel URL list:
// sentinel://:pw@h1:26379/0;sentinel://h2:26379/0. The password and db of
// the first URL are the master's, as in Celery's SentinelBackend.
func (c *Config) failoverOptions(raw string) (*goredis.FailoverOptions, error) {
	opt := &goredis.FailoverOptions{MasterName: c.MasterName, SentinelUsername: c.SentinelUsername, SentinelPassword: c.SentinelPassword}
	for i, chunk := range strings.Split(raw, ";") {
		chunk = strings.TrimSpace(chunk)
		if chunk == "" {
			continue
		}
		u, err := url.Parse(chunk)
		if err != nil {
			return nil, fmt.Errorf("redis backend: bad sentinel URL: %w", redactURLError(err))
		}
		if u.Scheme != "sentinel" {
			return nil, fmt.Errorf("redis backend: sentinel URL list mixes in scheme %q", u.Scheme)
		}
		host, port := u.Hostname(), u.Port()
		if host == "" {
			host = "localhost"
		}
		if port == "" {
			port = "26379"
		}
		opt.SentinelAddrs = append(opt.SentinelAddrs, net.JoinHostPort(host, port))
		if i == 0 {
			if u.User != nil {
				opt.Username = u.User.Username()
				opt.Password, _ = u.User.Password()
			}
			if db := strings.Trim(u.Path, "/"); db != "" {
				n, err := strconv.Atoi(db)
				if err != nil || n < 0 {
					return nil, fmt.Errorf("redis backend: bad database number %q in sentinel URL", db)
				}
				opt.DB = n
			}
			if m := u.Query().Get("master_name"); m != "" && opt.MasterName == "" {
				opt.MasterName = m
			}
		}
	}
	if len(opt.SentinelAddrs) == 0 {
		return nil, errors.New("redis backend: sentinel URL names no sentinel")
	}
	if opt.MasterName == "" {
		return nil, errors.New("redis backend: sentinel URL needs Config.MasterName (Celery's master_name transport option)")
	}
	if c.TLSConfig != nil {
		opt.TLSConfig = c.TLSConfig.Clone()
	}
	return opt, nil
}

// celeryTLS turns Celery's ssl_* URL options into a tls.Config and removes
// them from q (go-redis refuses unknown options).
func celeryTLS(scheme, host string, q url.Values) (*tls.Config, error) {
	keys := []string{"ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile"}
	if scheme != "rediss" {
		for _, k := range keys {
			if q.Has(k) {
				return nil, fmt.Errorf("redis backend: %s needs a rediss:// URL", k)
			}
		}
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
	switch strings.TrimPrefix(strings.ToUpper(q.Get("ssl_cert_reqs")), "CERT_") {
	case "", "REQUIRED":
	case "NONE":
		conf.InsecureSkipVerify = true
	case "OPTIONAL":
		// Python verifies a certificate when one is presented; Go's client
		// always gets one from a TLS server, so this is "required".
	default:
		return nil, fmt.Errorf("redis backend: bad ssl_cert_reqs %q", q.Get("ssl_cert_reqs"))
	}
	if ca := q.Get("ssl_ca_certs"); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("redis backend: ssl_ca_certs: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis backend: ssl_ca_certs %s holds no PEM certificate", ca)
		}
		conf.RootCAs = pool
	}
	cert, key := q.Get("ssl_certfile"), q.Get("ssl_keyfile")
	if cert != "" || key != "" {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("redis backend: ssl_certfile/ssl_keyfile: %w", err)
		}
		conf.Certificates = []tls.Certificate{kp}
	}
	for _, k := range keys {
		q.Del(k)
	}
	return conf, nil
}

// redactURLError drops the URL (which may hold a password) from url.Error.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
