package redis

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/internal/headers"
)

var (
	_ transport.Transport       = (*Transport)(nil)
	_ transport.Admin           = (*Transport)(nil)
	_ transport.DeadLetterStore = (*Transport)(nil)
)

var (
	//go:embed scripts/consume.lua
	luaConsume string
	//go:embed scripts/settle.lua
	luaSettle string
	//go:embed scripts/publish_direct.lua
	luaPublishDirect string
	//go:embed scripts/replay.lua
	luaReplay string
	//go:embed scripts/unlock.lua
	luaUnlock string
)

// Transport is a kombu-compatible Redis transport. It is safe for concurrent
// use. See the package documentation for the keys it uses.
type Transport struct {
	// unreplicated counts the writes WAIT did not see replicated.
	unreplicated        atomic.Int64
	lastUnreplicatedLog atomic.Int64 // unix ns
	watch               *connWatch

	cfg    Config
	log    *zap.Logger
	rdb    *goredis.Client
	ep     Endpoint
	keys   keys
	topics topicMatcher

	scrConsume, scrSettle, scrPublishDirect, scrReplay, scrUnlock *goredis.Script

	acker *acker

	mu          sync.Mutex
	closed      bool
	consumers   map[*consumer]struct{}
	subs        map[*subscription]struct{}
	held        map[*held]struct{}
	heldSeq     uint64
	bgStarted   bool
	topicExchs  map[string]bool
	stop        chan struct{}
	wg          sync.WaitGroup
	rpopCount   bool // the server's RPOP takes a count (Redis >= 6.2)
	errLimiter  logLimiter
	bgErrLimits logLimiter
	stray       strayTokens // restore.go
	// stagedHook, in tests, runs between a staged round's moves and its
	// records, with the consumer's id.
	stagedHook func(id string)
}

// Dial connects to the broker named by cfg.URL and returns a transport. It
// fails when the configuration is invalid or the broker does not answer a
// PING before ctx ends.
func Dial(ctx context.Context, cfg Config) (*Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	ep, err := ParseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := tlsConfig(cfg, ep)
	if err != nil {
		return nil, err
	}
	var rdb *goredis.Client
	if ep.Sentinel {
		rdb = goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName:       cfg.MasterName,
			SentinelAddrs:    ep.Addrs,
			SentinelUsername: cfg.SentinelUsername,
			SentinelPassword: cfg.SentinelPassword,
			Username:         ep.Username,
			Password:         ep.Password,
			DB:               ep.DB,
			TLSConfig:        tlsCfg,
			ClientName:       cfg.ClientName,
			PoolSize:         cfg.PoolSize,
			DialTimeout:      cfg.DialTimeout,
			ReadTimeout:      cfg.ReadTimeout,
			Protocol:         2,
			DisableIdentity:  true,
		})
	} else {
		rdb = goredis.NewClient(&goredis.Options{
			Network:         ep.Network,
			Addr:            ep.Addrs[0],
			Username:        ep.Username,
			Password:        ep.Password,
			DB:              ep.DB,
			TLSConfig:       tlsCfg,
			ClientName:      cfg.ClientName,
			PoolSize:        cfg.PoolSize,
			DialTimeout:     cfg.DialTimeout,
			ReadTimeout:     cfg.ReadTimeout,
			Protocol:        2,
			DisableIdentity: true,
		})
	}
	// Watched from the first connection on, so that Node is known at once.
	watch := &connWatch{log: cfg.Logger}
	rdb.AddHook(watch)
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("redis: connect %s: %w", strings.Join(ep.Addrs, ","), err)
	}
	t := &Transport{
		cfg:              cfg,
		watch:            watch,
		log:              cfg.Logger,
		rdb:              rdb,
		ep:               ep,
		keys:             newKeys(cfg, ep.DB),
		scrConsume:       goredis.NewScript(luaConsume),
		scrSettle:        goredis.NewScript(luaSettle),
		scrPublishDirect: goredis.NewScript(luaPublishDirect),
		scrReplay:        goredis.NewScript(luaReplay),
		scrUnlock:        goredis.NewScript(luaUnlock),
		consumers:        make(map[*consumer]struct{}),
		subs:             make(map[*subscription]struct{}),
		held:             make(map[*held]struct{}),
		topicExchs:       make(map[string]bool),
		stop:             make(chan struct{}),
		errLimiter:       logLimiter{every: 5 * time.Second},
		bgErrLimits:      logLimiter{every: 5 * time.Second},
	}
	t.rpopCount = serverAtLeast(ctx, rdb, 6, 2)
	t.acker = newAcker(t)
	t.wg.Go(func() {
		<-t.stop
		t.acker.close()
	})
	return t, nil
}

func tlsConfig(cfg Config, ep Endpoint) (*tls.Config, error) {
	if cfg.TLSConfig != nil {
		return cfg.TLSConfig.Clone(), nil
	}
	if !ep.TLS {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if ep.Network == "tcp" && len(ep.Addrs) > 0 && !ep.Sentinel {
		if host, _, err := net.SplitHostPort(ep.Addrs[0]); err == nil {
			c.ServerName = host
		}
	}
	switch strings.ToUpper(ep.CertReqs) {
	case "CERT_NONE", "NONE":
		// kombu's ssl_cert_reqs=CERT_NONE: the operator chose not to verify.
		c.InsecureSkipVerify = true //nolint:gosec
	}
	if ep.CACerts != "" {
		pem, err := os.ReadFile(ep.CACerts)
		if err != nil {
			return nil, fmt.Errorf("redis: ssl_ca_certs: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis: ssl_ca_certs %s: no certificate found", ep.CACerts)
		}
		c.RootCAs = pool
	}
	if ep.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(ep.CertFile, orDefault(ep.KeyFile, ep.CertFile))
		if err != nil {
			return nil, fmt.Errorf("redis: ssl_certfile: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

func orDefault(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// serverAtLeast reports whether the server's version is at least
// major.minor (false when it cannot tell).
func serverAtLeast(ctx context.Context, rdb *goredis.Client, major, minor int) bool {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return false
	}
	for _, line := range strings.Split(info, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:")
		if !ok {
			continue
		}
		parts := strings.SplitN(v, ".", 3)
		if len(parts) < 2 {
			return false
		}
		ma, err1 := strconv.Atoi(parts[0])
		mi, err2 := strconv.Atoi(parts[1])
		return err1 == nil && err2 == nil && (ma > major || (ma == major && mi >= minor))
	}
	return false
}

// DB returns the database number the transport uses.
func (t *Transport) DB() int { return t.ep.DB }

func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// newTag returns a random UUID4 string, the form kombu uses for delivery
// tags.
func newTag() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return protocol.UUID4(b).String()
}

// isFanout reports whether a publish to exchange goes over pub/sub.
func (t *Transport) isFanout(exchange, typ string) bool {
	return typ == transport.Fanout || slices.Contains(t.cfg.FanoutExchanges, exchange)
}

// Publish sends one message as kombu does: the default exchange pushes to
// the routing key's queue, a direct exchange to every queue bound with the
// routing key, and a fanout exchange (or one of Config.FanoutExchanges) is
// a PUBLISH on its pub/sub channel. A topic exchange does both: an LPUSH to
// every task queue whose binding pattern matches, and a PUBLISH for the
// broadcast subscribers, which on Redis are pub/sub patterns (kombu turns
// Celery's topic event exchange into a fanout on Redis). Task queues get
// the list of the message's priority band. The envelope gets a fresh UUID4
// delivery tag. A message no binding matches goes nowhere, as in kombu and
// AMQP (it is logged at debug level). Publish returns transport.ErrClosed
// after Close.
//
// A header that is or holds a NaN or an infinite float is refused with an
// error wrapping protocol.ErrUnencodable, although the envelope's JSON could
// carry it (Python's json reads NaN): RabbitMQ cannot, and a message must
// not work on one broker and fail on another.
func (t *Transport) Publish(ctx context.Context, p *transport.Publishing) (err error) {
	if t.isClosed() {
		return transport.ErrClosed
	}
	if p.Exchange == "" && p.RoutingKey == "" {
		return errors.New("redis: publish needs an exchange or a routing key")
	}
	if err := headers.CheckFinite(p.Message.Headers); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	env := &protocol.Envelope{
		Message:      p.Message,
		BodyEncoding: "base64",
		DeliveryTag:  newTag(),
		DeliveryInfo: protocol.DeliveryInfo{Exchange: p.Exchange, RoutingKey: p.RoutingKey},
	}
	data, err := protocol.EncodeEnvelope(env)
	if err != nil {
		return fmt.Errorf("redis: encode envelope: %w", err)
	}
	prio := clampPriority(p.Message.Properties.Priority)
	routed := int64(1)
	// WAIT covers the writes of the connection it runs on.
	rdb := goredis.Cmdable(t.rdb)
	var sc goredis.Scripter = t.rdb
	if t.cfg.WaitReplicas > 0 {
		cn := t.rdb.Conn()
		defer cn.Close()
		rdb, sc = cn, cn
		defer func() {
			if err == nil {
				t.waitReplicated(ctx, cn, "publishes", 1)
			}
		}()
	}
	switch {
	case p.Exchange == "":
		err = rdb.LPush(ctx, t.keys.list(p.RoutingKey, prio), data).Err()
	case t.isFanout(p.Exchange, p.ExchangeType):
		err = rdb.Publish(ctx, t.keys.publishChannel(p.Exchange, p.RoutingKey), data).Err()
	case p.ExchangeType == transport.Topic:
		var queues []string
		queues, err = t.lookup(ctx, p.Exchange, p.RoutingKey, true)
		if err == nil {
			routed = int64(len(queues))
			_, err = rdb.Pipelined(ctx, func(pipe goredis.Pipeliner) error {
				for _, q := range queues {
					pipe.LPush(ctx, t.keys.list(q, prio), data)
				}
				pipe.Publish(ctx, t.keys.publishChannel(p.Exchange, p.RoutingKey), data)
				return nil
			})
		}
	default:
		suffix := ""
		if b := t.keys.band(prio); b != 0 {
			suffix = t.keys.sep + strconv.Itoa(b)
		}
		routed, err = t.scrPublishDirect.Run(ctx, sc, []string{t.keys.binding(p.Exchange)},
			p.RoutingKey, t.keys.sep, data, t.keys.prefix, suffix).Int64()
	}
	if err != nil {
		return fmt.Errorf("redis: publish: %w", err)
	}
	if routed == 0 {
		t.log.Debug("redis: no queue bound for the routing key; message dropped as kombu does",
			zap.String("exchange", p.Exchange), zap.String("routing_key", p.RoutingKey))
	}
	return nil
}

// lookup finds the queues bound to exchange for routingKey (kombu's
// Channel._lookup): the routing key itself for the default exchange,
// otherwise the binding set matched exactly (direct) or as a topic pattern.
func (t *Transport) lookup(ctx context.Context, exchange, routingKey string, topic bool) ([]string, error) {
	if exchange == "" {
		return []string{routingKey}, nil
	}
	members, err := t.rdb.SMembers(ctx, t.keys.binding(exchange)).Result()
	if err != nil {
		return nil, err
	}
	if !topic {
		t.mu.Lock()
		topic = t.topicExchs[exchange]
		t.mu.Unlock()
	}
	var out []string
	for _, m := range members {
		rk, pattern, q, ok := t.keys.splitBinding(m)
		if !ok || slices.Contains(out, q) {
			continue
		}
		if topic && pattern == "" {
			// A fanout binding (a Subscribe queue): served by pub/sub.
			continue
		}
		if (topic && t.topics.match(rk, routingKey)) || (!topic && rk == routingKey) {
			out = append(out, q)
		}
	}
	slices.Sort(out)
	return out, nil
}

// bind adds kombu's binding member for a consumed queue.
func (t *Transport) bind(ctx context.Context, q transport.Queue) error {
	ex, typ, rk := queueBinding(q)
	pattern := ""
	if typ == transport.Topic {
		pattern = topicPattern(rk)
		t.mu.Lock()
		t.topicExchs[ex] = true
		t.mu.Unlock()
	}
	return t.rdb.SAdd(ctx, t.keys.binding(ex), t.keys.bindingMember(rk, pattern, q.Name)).Err()
}

func queueBinding(q transport.Queue) (exchange, typ, routingKey string) {
	exchange, typ, routingKey = q.Exchange, q.ExchangeType, q.RoutingKey
	if exchange == "" {
		exchange = q.Name
	}
	if typ == "" {
		typ = transport.Direct
	}
	if routingKey == "" {
		routingKey = q.Name
	}
	return exchange, typ, routingKey
}

// Ping sends the broker a PING and reports whether it answered before ctx
// ended: the readiness check of a worker's /readyz. It fails with
// transport.ErrClosed after Close.
func (t *Transport) Ping(ctx context.Context) error {
	if t.isClosed() {
		return transport.ErrClosed
	}
	if err := t.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: ping %s: %w", strings.Join(t.ep.Addrs, ","), err)
	}
	return nil
}

// Len returns the number of ready messages of a queue over all its bands.
func (t *Transport) Len(ctx context.Context, queue string) (int, error) {
	if t.isClosed() {
		return 0, transport.ErrClosed
	}
	var cmds []*goredis.IntCmd
	_, err := t.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for _, k := range t.keys.bands(queue) {
			cmds = append(cmds, p.LLen(ctx, k))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("redis: len %q: %w", queue, err)
	}
	n := 0
	for _, c := range cmds {
		n += int(c.Val())
	}
	return n, nil
}

// Purge deletes the ready messages of a queue (every band) and returns how
// many there were, as kombu's queue_purge.
func (t *Transport) Purge(ctx context.Context, queue string) (int, error) {
	if t.isClosed() {
		return 0, transport.ErrClosed
	}
	var cmds []*goredis.IntCmd
	_, err := t.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		for _, k := range t.keys.bands(queue) {
			cmds = append(cmds, p.LLen(ctx, k))
			p.Del(ctx, k)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("redis: purge %q: %w", queue, err)
	}
	n := 0
	for _, c := range cmds {
		n += int(c.Val())
	}
	return n, nil
}

// Close stops every consumer and subscription, flushes pending acks,
// restores every delivery still held (RPUSH to the front of its queue with
// the redelivered flags, kombu's restore_at_shutdown) and closes the
// connections. It is safe to call more than once.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	consumers := make([]*consumer, 0, len(t.consumers))
	for c := range t.consumers {
		consumers = append(consumers, c)
	}
	subs := make([]*subscription, 0, len(t.subs))
	for s := range t.subs {
		subs = append(subs, s)
	}
	t.mu.Unlock()

	for _, c := range consumers {
		c.halt(transport.ErrClosed)
	}
	for _, s := range subs {
		_ = s.Close()
	}
	close(t.stop)
	t.wg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t.mu.Lock()
	hs := make([]*held, 0, len(t.held))
	for h := range t.held {
		hs = append(hs, h)
	}
	t.mu.Unlock()
	// Restore newest first: each RPUSH goes to the front of its list, so the
	// oldest delivery ends up consumed first again.
	slices.SortFunc(hs, func(a, b *held) int { return int(b.seq - a.seq) })
	var errs []error
	restored := 0
	for _, h := range hs {
		if !h.settle() {
			continue
		}
		if _, err := t.restore(ctx, h.tag, h.raw, h.exchange, h.routingKey, h.queue, false, ""); err != nil {
			errs = append(errs, fmt.Errorf("restore %s: %w", h.tag, err))
			continue
		}
		restored++
	}
	if restored > 0 {
		t.log.Info("restored unacknowledged deliveries at close", zap.Int("count", restored))
	}
	if err := t.rdb.Close(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("redis: close: %w", errors.Join(errs...))
	}
	return nil
}

// backoff returns the wait before retry attempt n (0-based): exponential
// from ReconnectMin, capped at ReconnectMax, with jitter in [d/2, d].
func (t *Transport) backoff(n int) time.Duration {
	d := t.cfg.ReconnectMin
	for i := 0; i < n && d < t.cfg.ReconnectMax; i++ {
		d *= 2
	}
	d = min(d, t.cfg.ReconnectMax)
	return d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
}

// logLimiter lets one log line through per interval, counting the
// suppressed ones, so that a broker outage does not flood the log.
type logLimiter struct {
	every time.Duration
	mu    sync.Mutex
	last  time.Time
	quiet int
}

func (l *logLimiter) allow() (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if now.Sub(l.last) < l.every {
		l.quiet++
		return false, 0
	}
	l.last = now
	n := l.quiet
	l.quiet = 0
	return true, n
}

func (t *Transport) logError(l *logLimiter, msg string, err error, fields ...zap.Field) {
	if ok, suppressed := l.allow(); ok {
		fields = append(fields, zap.Error(err))
		if suppressed > 0 {
			fields = append(fields, zap.Int("suppressed", suppressed))
		}
		t.log.Warn(msg, fields...)
	}
}

// sleep waits d or until stop is closed; it reports whether d passed.
func sleep(stop <-chan struct{}, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-stop:
		return false
	}
}

// isRetryable reports whether a Redis error is worth retrying (connection
// trouble) rather than a reply error that would repeat.
func isRetryable(err error) bool {
	if err == nil {
		return false
	}
	var re goredis.Error
	if errors.As(err, &re) && !goredis.IsLoadingError(err) && !goredis.IsReadOnlyError(err) {
		// A Redis reply error: the command reached the server and failed.
		return strings.HasPrefix(re.Error(), "CLUSTERDOWN") || strings.HasPrefix(re.Error(), "TRYAGAIN")
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// Reconnects reports how many times a connection to Redis was dialed again
// after one was lost (killed, Redis restarted, network dropped), for
// metrics.
func (t *Transport) Reconnects() int64 { return t.watch.reconnects.Load() }
