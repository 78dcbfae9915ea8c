package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/celeriac/celeriac/worker/connect"
)

// settings is the JSON configuration file: Celery setting names.
type settings struct {
	BrokerURL              urlList       `json:"broker_url"`
	ResultBackend          string        `json:"result_backend"`
	BrokerTransportOptions transportOpts `json:"broker_transport_options"`
	BackendTransportOpts   transportOpts `json:"result_backend_transport_options"`
	BrokerFailoverStrategy string        `json:"broker_failover_strategy"`
	BrokerUseSSL           *sslSetting   `json:"broker_use_ssl"`
	RedisBackendUseSSL     *sslSetting   `json:"redis_backend_use_ssl"`
	ResultExpires          *float64      `json:"result_expires"`
	ResultSerializer       string        `json:"result_serializer"`
	ResultExtended         *bool         `json:"result_extended"`
	// Celery's database backend settings (db+postgresql://), and the
	// database URL of django-db (celeriac's: Django keeps it in DATABASES).
	DatabaseURL                string                    `json:"database_url"`
	DatabaseTableNames         map[string]string         `json:"database_table_names"`
	DatabaseTableSchemas       map[string]string         `json:"database_table_schemas"`
	DatabaseShortLivedSessions *bool                     `json:"database_short_lived_sessions"`
	TaskDefaultQueue           string                    `json:"task_default_queue"`
	TaskQueues                 []string                  `json:"task_queues"`
	TaskAcksLate               *bool                     `json:"task_acks_late"`
	TaskAcksOnFailure          *bool                     `json:"task_acks_on_failure_or_timeout"`
	TaskTrackStarted           *bool                     `json:"task_track_started"`
	TaskTimeLimit              *float64                  `json:"task_time_limit"`
	TaskSoftTimeLimit          *float64                  `json:"task_soft_time_limit"`
	WorkerConcurrency          *int                      `json:"worker_concurrency"`
	WorkerPrefetchMult         *int                      `json:"worker_prefetch_multiplier"`
	WorkerSendTaskEvents       *bool                     `json:"worker_send_task_events"`
	WorkerEtaTaskLimit         *int                      `json:"worker_eta_task_limit"`
	TaskRoutes                 map[string]any            `json:"task_routes"`
	QueueArguments             map[string]map[string]any `json:"celeriac_queue_arguments"`
	// Start-up retry (Celery's broker_connection_* settings).
	BrokerConnectionRetryOnStartup *bool `json:"broker_connection_retry_on_startup"`
	BrokerConnectionRetry          *bool `json:"broker_connection_retry"`
	BrokerConnectionMaxRetries     *int  `json:"broker_connection_max_retries"`
	// Celery 5.5's quorum-queue settings.
	TaskDefaultExchangeType string `json:"task_default_exchange_type"`
	TaskDefaultQueueType    string `json:"task_default_queue_type"`
	// Celery 5.6: how a queue that -Q names and task_queues does not
	// define is declared.
	TaskCreateMissingQueueType         string `json:"task_create_missing_queue_type"`
	TaskCreateMissingQueueExchangeType string `json:"task_create_missing_queue_exchange_type"`
	DetectQuorumQueues                 *bool  `json:"worker_detect_quorum_queues"`
	DelayedQueueType                   string `json:"broker_native_delayed_delivery_queue_type"`
	// celeriac beat: Celery's beat and time zone settings, RedBeat's
	// lease and key settings, and whose schedule arithmetic to follow.
	BeatSchedule             json.RawMessage `json:"beat_schedule"`
	BeatMaxLoopInterval      *float64        `json:"beat_max_loop_interval"`
	BeatCronStartingDeadline *float64        `json:"beat_cron_starting_deadline"`
	Timezone                 string          `json:"timezone"`
	EnableUTC                *bool           `json:"enable_utc"`
	RedbeatRedisURL          string          `json:"redbeat_redis_url"`
	RedbeatKeyPrefix         string          `json:"redbeat_key_prefix"`
	RedbeatLockTimeout       *float64        `json:"redbeat_lock_timeout"`
	BeatCelery               string          `json:"celeriac_beat_celery"`
}

// knownSettings returns the JSON names of the settings celeriac reads.
func knownSettings() map[string]bool {
	known := map[string]bool{}
	t := reflect.TypeFor[settings]()
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			known[name] = true
		}
	}
	return known
}

type transportOpts struct {
	VisibilityTimeout  *float64 `json:"visibility_timeout"`
	GlobalKeyPrefix    string   `json:"global_keyprefix"`
	QueueOrderStrategy string   `json:"queue_order_strategy"`
	// celeriac's own: see connect.Options.RedisStagedPop.
	CeleriacStagedPop bool `json:"celeriac_staged_pop"`
	// Sentinel: the master group and the Sentinels' own credentials.
	MasterName     string `json:"master_name"`
	SentinelKwargs struct {
		Username string `json:"username"`
		Password string `json:"password"`
	} `json:"sentinel_kwargs"`
}

// urlList is broker_url: one URL, several separated by ';', or a list of
// them (Celery takes both for failover).
type urlList string

func (u *urlList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*u = urlList(one)
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("broker_url: want a URL or a list of URLs")
	}
	*u = urlList(strings.Join(many, ";"))
	return nil
}

// sslSetting is broker_use_ssl or redis_backend_use_ssl: true (TLS with
// the defaults) or a dictionary of ssl options, under their amqp names
// (keyfile, certfile, ca_certs, cert_reqs) or their redis names (ssl_
// prefixed). cert_reqs is a name (CERT_REQUIRED) or Python's ssl constant
// (2).
type sslSetting struct{ connect.SSLOptions }

func (s *sslSetting) UnmarshalJSON(b []byte) error {
	var on bool
	if err := json.Unmarshal(b, &on); err == nil {
		if !on {
			return errSSLOff
		}
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("want true or an object of ssl options")
	}
	for k, v := range m {
		var str string
		switch v := v.(type) {
		case string:
			str = v
		case float64:
			str = strconv.FormatFloat(v, 'f', -1, 64)
		default:
			return fmt.Errorf("%s: want a string", k)
		}
		switch strings.TrimPrefix(k, "ssl_") {
		case "keyfile":
			s.KeyFile = str
		case "certfile":
			s.CertFile = str
		case "ca_certs":
			s.CACerts = str
		case "cert_reqs":
			s.CertReqs = str
		default:
			return fmt.Errorf("unknown ssl option %q (keyfile, certfile, ca_certs, cert_reqs)", k)
		}
	}
	return nil
}

// errSSLOff marks "broker_use_ssl": false, which leaves the setting unset.
var errSSLOff = errors.New("ssl off")

// globalFlags are the flags every command shares, and what they lead to:
// the settings of the config file and the logger.
type globalFlags struct {
	configFile    string
	broker        string
	resultBackend string
	logLevel      string
	logFormat     string
	file          settings
	log           *zap.Logger

	stderr   io.Writer         // where logs go
	onLogger func(*zap.Logger) // nil, or told about the logger (main)

	celery  celeryGlobals
	logfile string // the worker's -f/--logfile
	node    string // the worker's -n, for %n in --logfile
	// defaultBroker and defaultBackend are cli.Defaults for broker and
	// result-backend: they come after the environment and the config file.
	defaultBroker, defaultBackend string
	hooks                         *options
	refuse                        func() error // the worker's refused options
	codeDefaults                  map[string]bool
	closers                       []func() // run when the command returns
}

func (g *globalFlags) register(root *cobra.Command) {
	f := root.PersistentFlags()
	f.StringVarP(&g.broker, "broker", "b", "", "broker URL (default $CELERY_BROKER_URL, then broker_url of --config)")
	f.StringVar(&g.resultBackend, "result-backend", "", "result backend URL (default $CELERY_RESULT_BACKEND)")
	f.StringVar(&g.configFile, "config", "", "JSON file of Celery settings (broker_url, result_backend, worker_concurrency, ...)")
	f.StringVarP(&g.logLevel, "loglevel", "l", "info", "log level: debug, info, warning, error, critical")
	f.StringVar(&g.logFormat, "log-format", "console", "log format: console or json")
	g.celery.register(f)
	_ = f.MarkHidden("loader")
}

// load builds the logger and reads the config file. Settings celeriac does
// not read are logged, not silently dropped: a misspelt name would
// otherwise look applied.
func (g *globalFlags) load(cmd *cobra.Command) error {
	level := g.logLevel
	if !cmd.Flags().Changed("loglevel") && !g.codeDefaults["loglevel"] && !isDaemon(cmd) {
		// Client commands are quiet, as Celery's: their output is the
		// answer, not how they connected.
		level = "warning"
	}
	if g.celery.quiet {
		if l := strings.ToLower(level); l == "info" || l == "debug" || l == "" {
			level = "warning"
		}
	}
	if g.refuse != nil && cmd.Annotations[daemonAnnotation] == "worker" {
		// Before --logfile is opened: --detach comes with one.
		if err := g.refuse(); err != nil {
			return err
		}
	}
	w := g.stderr
	if g.logfile != "" {
		path := nodeFormat(g.logfile, g.node)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return usagef("--logfile: %v", err)
		}
		g.closers = append(g.closers, func() { f.Close() })
		w = f
	}
	log, err := newLogger(level, g.logFormat, w)
	if err != nil {
		return err
	}
	if err := g.celery.apply(log); err != nil {
		return err
	}
	g.log = log
	if g.onLogger != nil {
		g.onLogger(log)
	}
	if g.configFile == "" {
		return nil
	}
	b, err := os.ReadFile(g.configFile)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && !strings.ContainsAny(g.configFile, "/\\") && !strings.HasSuffix(g.configFile, ".json") {
			return usagef("--config %s: no such file; celeriac reads a JSON file of Celery settings, not a Python module as Celery's --config does", g.configFile)
		}
		return usagef("--config: %v", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return usagef("--config %s: not a JSON object of Celery settings: %v", g.configFile, err)
	}
	// encoding/json matches names case-insensitively: BROKER_URL would
	// fill broker_url. Only the exact names are decoded.
	known := knownSettings()
	exact := map[string]json.RawMessage{}
	var unknown []string
	for k, v := range raw {
		if known[k] {
			exact[k] = v
		} else {
			unknown = append(unknown, k)
		}
	}
	for _, k := range []string{"broker_use_ssl", "redis_backend_use_ssl"} {
		if v, ok := exact[k]; ok && string(v) == "false" {
			delete(exact, k) // Celery's default: no TLS
		}
	}
	if b, err = json.Marshal(exact); err != nil {
		return usagef("--config %s: %v", g.configFile, err)
	}
	if err := json.Unmarshal(b, &g.file); err != nil {
		return usagef("--config %s: %v", g.configFile, err)
	}
	integralArguments(g.file.QueueArguments)
	if len(unknown) > 0 {
		sort.Strings(unknown)
		g.log.Warn("config file settings celeriac does not read (lower-case Celery names only)",
			zap.String("file", g.configFile), zap.Strings("settings", unknown))
	}
	return nil
}

// newLogger builds the zap logger of --loglevel and --log-format, writing
// to w.
func newLogger(level, format string, w io.Writer) (*zap.Logger, error) {
	var lvl zapcore.Level
	switch strings.ToLower(level) {
	case "debug":
		lvl = zap.DebugLevel
	case "info", "":
		lvl = zap.InfoLevel
	case "warning", "warn":
		lvl = zap.WarnLevel
	case "error":
		lvl = zap.ErrorLevel
	case "critical", "fatal":
		lvl = zap.DPanicLevel
	default:
		return nil, usagef("unknown --loglevel %q (debug, info, warning, error, critical)", level)
	}
	var enc zapcore.Encoder
	switch strings.ToLower(format) {
	case "json":
		enc = zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	case "console", "":
		cfg := zap.NewDevelopmentEncoderConfig()
		cfg.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(cfg)
	default:
		return nil, usagef("unknown --log-format %q (console, json)", format)
	}
	if w == nil {
		w = os.Stderr
	}
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core, zap.ErrorOutput(zapcore.Lock(zapcore.AddSync(w)))), nil
}

// options resolves the connection settings: flags, then environment, then
// the config file.
func (g *globalFlags) options() connect.Options {
	o := connect.Options{BrokerURL: g.broker, ResultBackend: g.resultBackend, Logger: g.log}
	o = connect.FromEnv(o)
	if o.BrokerURL == "" {
		o.BrokerURL = string(g.file.BrokerURL)
	}
	if o.ResultBackend == "" {
		o.ResultBackend = g.file.ResultBackend
	}
	if o.BrokerURL == "" {
		o.BrokerURL = g.defaultBroker
	}
	if o.ResultBackend == "" {
		o.ResultBackend = g.defaultBackend
	}
	t := g.file.BrokerTransportOptions
	if t.VisibilityTimeout != nil {
		o.VisibilityTimeout = seconds(*t.VisibilityTimeout)
	}
	o.GlobalKeyPrefix = t.GlobalKeyPrefix
	o.QueueOrderStrategy = t.QueueOrderStrategy
	o.RedisStagedPop = o.RedisStagedPop || t.CeleriacStagedPop
	o.MasterName, o.SentinelUsername, o.SentinelPassword = t.MasterName, t.SentinelKwargs.Username, t.SentinelKwargs.Password
	bt := g.file.BackendTransportOpts
	o.BackendMasterName, o.BackendSentinelUsername, o.BackendSentinelPassword = bt.MasterName, bt.SentinelKwargs.Username, bt.SentinelKwargs.Password
	o.FailoverStrategy = g.file.BrokerFailoverStrategy
	if s := g.file.BrokerUseSSL; s != nil {
		o.BrokerSSL = &s.SSLOptions
	}
	if s := g.file.RedisBackendUseSSL; s != nil {
		o.BackendSSL = &s.SSLOptions
	}
	if g.file.ResultExpires != nil {
		o.ResultExpires = seconds(*g.file.ResultExpires)
	}
	o.ResultSerializer = g.file.ResultSerializer
	if g.file.ResultExtended != nil {
		o.ResultExtended = *g.file.ResultExtended
	}
	if o.DatabaseURL == "" {
		o.DatabaseURL = g.file.DatabaseURL
	}
	o.DatabaseTableNames = g.file.DatabaseTableNames
	o.DatabaseTableSchemas = g.file.DatabaseTableSchemas
	if v := g.file.DatabaseShortLivedSessions; v != nil {
		o.DatabaseShortLivedSessions = *v
	}
	o.DelayedQueueType = g.file.DelayedQueueType
	if d := g.file.DetectQuorumQueues; d != nil && !*d {
		// Celery: no quorum detection, no DelayedDelivery bootstep.
		o.DelayedDelivery = "off"
	}
	host, _ := os.Hostname()
	o.ConnectionName = fmt.Sprintf("celeriac-%d@%s", os.Getpid(), host)
	return o
}

// open connects for the client commands (send, inspect, control, purge,
// dlq). Unlike the worker they refuse to run without a broker: an
// in-process broker would reach no worker and make every command a no-op.
func (g *globalFlags) open(ctx context.Context) (*connect.Conn, error) {
	o := g.options()
	if strings.TrimSpace(o.BrokerURL) == "" {
		return nil, usagef("no broker: give --broker, set CELERY_BROKER_URL or broker_url in --config")
	}
	g.log.Debug("connecting", zap.String("broker", connect.Redact(o.BrokerURL)), zap.String("result_backend", connect.Redact(o.ResultBackend)))
	return connect.Open(ctx, o)
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// integralArguments turns the whole numbers JSON decoded as float64 in
// queue arguments into int64. RabbitMQ wants integers for x-max-priority,
// x-message-ttl and the like, and compares them with what Python declared
// (an integer): a double 10.0 is "inequivalent" to 10.
func integralArguments(args map[string]map[string]any) {
	for _, a := range args {
		for k, v := range a {
			if f, ok := v.(float64); ok && f == math.Trunc(f) && math.Abs(f) < 1<<53 {
				a[k] = int64(f)
			}
		}
	}
}
