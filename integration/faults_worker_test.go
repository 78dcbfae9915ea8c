package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	redisbackend "github.com/celeriac/celeriac/backend/redis"
	sqlbackend "github.com/celeriac/celeriac/backend/sql"
	"github.com/celeriac/celeriac/transport"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	redistransport "github.com/celeriac/celeriac/transport/redis"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
	"github.com/celeriac/celeriac/worker/prommetrics"
)

// The fault suite's worker runs in its own process, so that it can be
// killed with -9, sent SIGTERM and restarted: the test binary re-executes
// itself with -test.run=^TestFaultWorkerProcess$ and the worker's settings
// in fltWorkerEnv. It is wired as cmd/celeriac wires its worker (the first
// SIGTERM is a warm shutdown, the second a cold one) and registers the
// suite's task instead of the demo tasks.

const fltWorkerEnv = "CELERIAC_FLT_WORKER"

// fltWorkerConfig is the helper process's configuration, passed as JSON.
type fltWorkerConfig struct {
	Broker  string `json:"broker"`
	Backend string `json:"backend"`
	// Effects is the Redis URL where flt.record records its effects, under
	// Prefix.
	Effects string `json:"effects"`
	Prefix  string `json:"prefix"`
	Queue   string `json:"queue"`
	// Name is the connection name (AMQP connection_name, Redis CLIENT
	// SETNAME), so that the suite kills only this worker's connections.
	Name        string `json:"name"`
	Hostname    string `json:"hostname"`
	Concurrency int    `json:"concurrency"`
	// VisibilityTimeout and RestoreInterval (seconds) tune the Redis
	// transport so that a killed worker's messages come back within the
	// test's time; RestoreInterval 0 keeps the transport's sweep schedule.
	VisibilityTimeout float64                   `json:"visibility_timeout"`
	RestoreInterval   float64                   `json:"restore_interval"`
	MaxMessageSize    int                       `json:"max_message_size"`
	MaxNestingDepth   int                       `json:"max_nesting_depth"`
	QueueArguments    map[string]map[string]any `json:"queue_arguments"`
	// CAFile is a PEM CA bundle trusted for amqps:// and rediss://.
	CAFile string `json:"ca_file"`
	// MasterName is the Sentinel master group of sentinel:// broker and
	// backend URLs; WaitReplicas is transport/redis.Config.WaitReplicas
	// (and the backend's).
	MasterName       string `json:"master_name"`
	SentinelPassword string `json:"sentinel_password"`
	WaitReplicas     int    `json:"wait_replicas"`
	// Control turns remote control on (off by default in the suite);
	// ReadyAddr, when set, serves /readyz there as celeriac worker
	// --metrics-addr does (the consumer watchdog's health, then the broker's
	// PING).
	Control   bool   `json:"control"`
	ReadyAddr string `json:"ready_addr"`
}

// recordScript is flt.record's effect: the delivery is counted (and the
// deliveries the broker flagged as redelivered), and the
// effect (one member of the effects set, and one increment of the effect
// counter) happens only for the first delivery of a key. Doing the dedupe
// and the effect in one atomic step is what makes the effect exactly-once
// under at-least-once delivery even when the process dies at any point.
var recordScript = goredis.NewScript(`
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
if ARGV[2] == '1' then redis.call('INCR', KEYS[4]) end
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then
  redis.call('INCR', KEYS[3])
  return 1
end
return 0
`)

// fltKeys are the effect keys of a prefix.
type fltKeys struct{ deliveries, effects, effectCount, redelivered string }

func fltKeysOf(prefix string) fltKeys {
	return fltKeys{deliveries: prefix + ":deliveries", effects: prefix + ":effects",
		effectCount: prefix + ":effect_count", redelivered: prefix + ":redelivered"}
}

// TestFaultWorkerProcess is the fault suite's worker when run as a helper
// process; run directly it does nothing.
func TestFaultWorkerProcess(t *testing.T) {
	raw := os.Getenv(fltWorkerEnv)
	if raw == "" {
		t.Skip("helper process of the fault suite (started by TestFaults*)")
	}
	var c fltWorkerConfig
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		fmt.Fprintf(os.Stderr, "flt worker: bad config: %v\n", err)
		os.Exit(2)
	}
	if err := runFltWorker(c); err != nil {
		fmt.Fprintf(os.Stderr, "flt worker: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runFltWorker(c fltWorkerConfig) error {
	zc := zap.NewProductionConfig()
	zc.Sampling = nil
	zc.DisableStacktrace = true
	log, err := zc.Build()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	var tlsConf *tls.Config
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("no certificate in %s", c.CAFile)
		}
		tlsConf = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(sigs)

	var tr transport.Transport
	switch connect.Scheme(c.Broker) {
	case "redis", "rediss", "sentinel":
		rc := redistransport.Config{
			URL: c.Broker, ClientName: c.Name, TLSConfig: tlsConf, Logger: log,
			VisibilityTimeout: seconds(c.VisibilityTimeout),
			MasterName:        c.MasterName, SentinelPassword: c.SentinelPassword, WaitReplicas: c.WaitReplicas,
			StagedPop: itStagedPop(),
		}
		if c.RestoreInterval > 0 {
			rc.RestoreInterval, rc.RestoreThrottle = seconds(c.RestoreInterval), 1
			// A worker the test kills with -9 in the middle of a sweep
			// leaves kombu's unacked_mutex held for its expiry (300 s by
			// default), and nobody restores anything meanwhile: longer
			// than the tests wait for progress. The sweeps take
			// milliseconds, so a short expiry is safe here.
			rc.UnackedMutexExpire = 15 * time.Second
		}
		tr, err = redistransport.Dial(ctx, rc)
	default:
		tr, err = amqptransport.Dial(ctx, amqptransport.Config{
			URLs: []string{c.Broker}, ConnectionName: c.Name, TLS: tlsConf, Logger: log,
		})
	}
	if err != nil {
		return fmt.Errorf("broker %s: %w", connect.Redact(c.Broker), err)
	}
	defer tr.Close()
	var be backend.Backend
	if strings.HasPrefix(c.Backend, "db+") {
		sb, err := sqlbackend.New(context.Background(), sqlbackend.Config{URL: c.Backend, Logger: log})
		if err != nil {
			return fmt.Errorf("backend %s: %w", connect.Redact(c.Backend), err)
		}
		defer sb.Close()
		be = sb
	} else if c.Backend != "" {
		rb, err := redisbackend.New(redisbackend.Config{URL: c.Backend, TLSConfig: tlsConf, Logger: log,
			MasterName: c.MasterName, SentinelPassword: c.SentinelPassword, WaitReplicas: c.WaitReplicas})
		if err != nil {
			return fmt.Errorf("backend %s: %w", connect.Redact(c.Backend), err)
		}
		defer rb.Close()
		be = rb
	}
	opt, err := goredis.ParseURL(c.Effects)
	if err != nil {
		return err
	}
	if tlsConf != nil && opt.TLSConfig != nil {
		opt.TLSConfig.RootCAs = tlsConf.RootCAs
	}
	opt.ClientName = c.Name + "-effects"
	effects := goredis.NewClient(opt)
	defer effects.Close()
	keys := fltKeysOf(c.Prefix)

	mux := worker.NewMux()
	mux.HandleFunc("flt.record", func(ctx context.Context, t *worker.Task) (any, error) {
		var key string
		var sleepMS int
		if err := t.Bind(&key, &sleepMS); err != nil {
			return nil, err
		}
		if sleepMS > 0 {
			time.Sleep(time.Duration(sleepMS) * time.Millisecond)
		}
		redelivered := "0"
		if t.DeliveryInfo.Redelivered {
			redelivered = "1"
		}
		// The effect store is another server than the broker: keep trying
		// while it is briefly unreachable rather than fail the task.
		var first int64
		var err error // not runFltWorker's: handlers run concurrently
		for attempt := 0; ; attempt++ {
			first, err = recordScript.Run(context.WithoutCancel(ctx), effects,
				[]string{keys.deliveries, keys.effects, keys.effectCount, keys.redelivered}, key, redelivered).Int64()
			if err == nil || attempt == 50 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			return nil, fmt.Errorf("record effect: %w", err)
		}
		return map[string]any{"key": key, "first": first == 1}, nil
	}, worker.AcksLate(true))

	w, err := worker.New(tr, mux, worker.Config{
		Queues:          []string{c.Queue},
		Concurrency:     c.Concurrency,
		Hostname:        c.Hostname,
		Backend:         be,
		MaxMessageSize:  c.MaxMessageSize,
		MaxNestingDepth: c.MaxNestingDepth,
		QueueArguments:  c.QueueArguments,
		ShutdownTimeout: 20 * time.Second,
		WithoutControl:  !c.Control,
		Logger:          log,
	})
	if err != nil {
		return err
	}
	if c.ReadyAddr != "" {
		// What celeriac worker --metrics-addr serves (prommetrics.Handler,
		// with cli's readiness check).
		m := prommetrics.New(nil)
		srv := &http.Server{Addr: c.ReadyAddr, ReadHeaderTimeout: 5 * time.Second,
			Handler: m.Handler(func(ctx context.Context) error {
				if err := w.ConsumerHealth(); err != nil {
					return err
				}
				if p, ok := tr.(interface{ Ping(context.Context) error }); ok {
					return p.Ping(ctx)
				}
				return nil
			})}
		go func() { _ = srv.ListenAndServe() }()
		defer srv.Close()
	}
	go func() {
		select {
		case <-sigs:
			log.Info("warm shutdown requested")
			cancel()
		case <-ctx.Done():
			return
		}
		<-sigs
		log.Warn("cold shutdown requested")
		w.Close()
	}()
	err = w.Run(ctx)
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	// What WAIT did not see replicated, for the fault runs' counts.
	fields := []zap.Field{zap.Error(err)}
	if u, ok := tr.(interface{ Unreplicated() int64 }); ok {
		fields = append(fields, zap.Int64("broker_unreplicated", u.Unreplicated()))
	}
	if u, ok := be.(interface{ Unreplicated() int64 }); ok {
		fields = append(fields, zap.Int64("backend_unreplicated", u.Unreplicated()))
	}
	if f, ok := tr.(interface{ Failovers() int64 }); ok {
		fields = append(fields, zap.Int64("failovers", f.Failovers()))
	}
	log.Info("flt worker exiting", fields...)
	return err
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// fltProc is a running fault-suite worker process.
type fltProc = proc

// startFltWorker starts a helper worker process (this test binary, running
// TestFaultWorkerProcess) and waits until it consumes. It is killed at the
// end of the test if still running.
func startFltWorker(t *testing.T, c fltWorkerConfig) *fltProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return startProc(t, "flt worker "+c.Name, "", procOptions{
		Exe: exe, Env: map[string]string{fltWorkerEnv: string(raw)},
		Ready: `"worker ready"`, ReadyTimeout: 3 * time.Minute,
	}, "-test.run=^TestFaultWorkerProcess$", "-test.timeout=0", "-test.count=1")
}

// Kill9 kills the process with SIGKILL and waits for it.
func (p *fltProc) Kill9() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Term sends SIGTERM and waits up to timeout for the process to exit,
// returning its exit error (nil for status 0).
func (p *fltProc) Term(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		return fmt.Errorf("still running %s after SIGTERM", timeout)
	}
}
