package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/celeriac/celeriac/worker/connect"
)

// settings is the JSON configuration file: Celery setting names.
type settings struct {
	BrokerURL              string                    `json:"broker_url"`
	ResultBackend          string                    `json:"result_backend"`
	BrokerTransportOptions transportOpts             `json:"broker_transport_options"`
	ResultExpires          *float64                  `json:"result_expires"`
	ResultSerializer       string                    `json:"result_serializer"`
	ResultExtended         *bool                     `json:"result_extended"`
	TaskDefaultQueue       string                    `json:"task_default_queue"`
	TaskQueues             []string                  `json:"task_queues"`
	TaskAcksLate           *bool                     `json:"task_acks_late"`
	TaskAcksOnFailure      *bool                     `json:"task_acks_on_failure_or_timeout"`
	TaskTrackStarted       *bool                     `json:"task_track_started"`
	TaskTimeLimit          *float64                  `json:"task_time_limit"`
	TaskSoftTimeLimit      *float64                  `json:"task_soft_time_limit"`
	WorkerConcurrency      *int                      `json:"worker_concurrency"`
	WorkerPrefetchMult     *int                      `json:"worker_prefetch_multiplier"`
	WorkerSendTaskEvents   *bool                     `json:"worker_send_task_events"`
	WorkerEtaTaskLimit     *int                      `json:"worker_eta_task_limit"`
	TaskRoutes             map[string]any            `json:"task_routes"`
	Extra                  map[string]any            `json:"-"`
	QueueArguments         map[string]map[string]any `json:"celeriac_queue_arguments"`
}

type transportOpts struct {
	VisibilityTimeout  *float64 `json:"visibility_timeout"`
	GlobalKeyPrefix    string   `json:"global_keyprefix"`
	QueueOrderStrategy string   `json:"queue_order_strategy"`
}

// globalFlags are the flags every command shares.
type globalFlags struct {
	configFile    string
	broker        string
	resultBackend string
	logLevel      string
	logFormat     string
	file          settings
	log           *zap.Logger
}

func (g *globalFlags) register(root *cobra.Command) {
	f := root.PersistentFlags()
	f.StringVarP(&g.broker, "broker", "b", "", "broker URL (default $CELERY_BROKER_URL, else memory://)")
	f.StringVar(&g.resultBackend, "result-backend", "", "result backend URL (default $CELERY_RESULT_BACKEND)")
	f.StringVar(&g.configFile, "config", "", "JSON file of Celery settings (broker_url, result_backend, worker_concurrency, ...)")
	f.StringVarP(&g.logLevel, "loglevel", "l", "info", "log level: debug, info, warning, error, critical")
	f.StringVar(&g.logFormat, "log-format", "console", "log format: console or json")
}

// load reads the config file and builds the logger.
func (g *globalFlags) load() error {
	if g.configFile != "" {
		b, err := os.ReadFile(g.configFile)
		if err != nil {
			return usagef("config: %v", err)
		}
		if err := json.Unmarshal(b, &g.file); err != nil {
			return usagef("config %s: %v", g.configFile, err)
		}
		integralArguments(g.file.QueueArguments)
	}
	log, err := newLogger(g.logLevel, g.logFormat)
	if err != nil {
		return err
	}
	g.log = log
	return nil
}

func newLogger(level, format string) (*zap.Logger, error) {
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
	var cfg zap.Config
	switch format {
	case "json":
		cfg = zap.NewProductionConfig()
	case "console", "":
		cfg = zap.NewDevelopmentConfig()
		cfg.EncoderConfig.EncodeLevel = zapcore.CapitalLevelEncoder
	default:
		return nil, usagef("unknown --log-format %q (console, json)", format)
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.DisableStacktrace = true
	cfg.Sampling = nil
	return cfg.Build()
}

// options resolves the connection settings: flags, then environment, then
// the config file.
func (g *globalFlags) options() connect.Options {
	o := connect.Options{BrokerURL: g.broker, ResultBackend: g.resultBackend, Logger: g.log}
	o = connect.FromEnv(o)
	if o.BrokerURL == "" {
		o.BrokerURL = g.file.BrokerURL
	}
	if o.ResultBackend == "" {
		o.ResultBackend = g.file.ResultBackend
	}
	t := g.file.BrokerTransportOptions
	if t.VisibilityTimeout != nil {
		o.VisibilityTimeout = seconds(*t.VisibilityTimeout)
	}
	o.GlobalKeyPrefix = t.GlobalKeyPrefix
	o.QueueOrderStrategy = t.QueueOrderStrategy
	if g.file.ResultExpires != nil {
		o.ResultExpires = seconds(*g.file.ResultExpires)
	}
	o.ResultSerializer = g.file.ResultSerializer
	host, _ := os.Hostname()
	o.ConnectionName = fmt.Sprintf("celeriac-%d@%s", os.Getpid(), host)
	return o
}

func (g *globalFlags) open(ctx context.Context) (*connect.Conn, error) {
	o := g.options()
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
