package cli

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

func writeConfig(t *testing.T, doc string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "celeryconfig.json")
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBrokerPrecedence: the broker comes from --broker, else
// CELERY_BROKER_URL, else the config file's broker_url. Three unreachable
// ports tell which one was used.
func TestBrokerPrecedence(t *testing.T) {
	const flag, env, file = "redis://127.0.0.1:1/1", "redis://127.0.0.1:2/1", "redis://127.0.0.1:3/1"
	cfg := writeConfig(t, `{"broker_url": "`+file+`", "result_backend": "redis://127.0.0.1:4/1"}`)
	for _, tc := range []struct {
		name    string
		env     string
		args    []string
		want    string
		wantErr string
	}{
		{"flag wins", env, []string{"--config", cfg, "-b", flag}, flag, ""},
		{"env over file", env, []string{"--config", cfg}, env, ""},
		{"file", "", []string{"--config", cfg}, file, ""},
		{"long flag", "", []string{"--broker=" + flag}, flag, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CELERY_BROKER_URL", tc.env)
			r := celeriac(t, append(tc.args, "send", "tasks.add", "1", "2")...)
			if r.code != exitError || !strings.Contains(r.stderr, "connect: broker "+tc.want+":") {
				t.Fatalf("want a failure naming %s:\n%s", tc.want, r)
			}
		})
	}
}

// TestResultBackendPrecedence: the same order for the result backend, seen
// through send --wait (which fails on the backend it got).
func TestResultBackendPrecedence(t *testing.T) {
	broker := brokers(t)[0].broker
	const flag, env, file = "redis://127.0.0.1:1/1", "redis://127.0.0.1:2/1", "redis://127.0.0.1:3/1"
	cfg := writeConfig(t, `{"result_backend": "`+file+`"}`)
	for _, tc := range []struct {
		env  string
		args []string
		want string
	}{
		{env, []string{"--config", cfg, "--result-backend", flag}, flag},
		{env, []string{"--config", cfg}, env},
		{"", []string{"--config", cfg}, file},
	} {
		t.Setenv("CELERY_RESULT_BACKEND", tc.env)
		r := celeriac(t, append(tc.args, "-b", broker, "send", "tasks.add", "1", "2", "--wait")...)
		if r.code != exitError || !strings.Contains(r.stderr, "connect: result backend "+tc.want+":") {
			t.Errorf("%v with env %q: want a failure naming %s:\n%s", tc.args, tc.env, tc.want, r)
		}
	}
}

// parseWorker parses a worker command line and resolves its configuration
// as runWorker does, without running it.
func parseWorker(t *testing.T, args ...string) (worker.Config, connect.Options, error) {
	t.Helper()
	g := &globalFlags{stderr: io.Discard}
	f := &workerFlags{}
	cmd := &cobra.Command{Use: "worker"}
	g.register(cmd)
	f.register(cmd)
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatalf("flags %v: %v", args, err)
	}
	if err := g.load(cmd); err != nil {
		return worker.Config{}, connect.Options{}, err
	}
	return workerSetup(cmd.Flags(), g, f)
}

// TestWorkerSettings: the config file's Celery setting names reach the
// worker, flags given on the command line win over them (false and 0
// included), and flags not given keep the file's values.
func TestWorkerSettings(t *testing.T) {
	t.Setenv("CELERY_BROKER_URL", "")
	t.Setenv("CELERY_RESULT_BACKEND", "")
	file := writeConfig(t, `{
		"broker_url": "redis://127.0.0.1:6379/1",
		"result_backend": "redis://127.0.0.1:6379/1",
		"broker_transport_options": {"visibility_timeout": 120, "global_keyprefix": "pfx:", "queue_order_strategy": "priority", "celeriac_staged_pop": true},
		"result_expires": 600,
		"result_serializer": "msgpack",
		"result_extended": true,
		"task_default_queue": "cli_default",
		"task_queues": ["cli_a", "cli_b"],
		"task_acks_late": true,
		"task_track_started": true,
		"task_time_limit": 30,
		"task_soft_time_limit": 20.5,
		"worker_concurrency": 5,
		"worker_prefetch_multiplier": 2,
		"worker_send_task_events": true,
		"worker_eta_task_limit": 99,
		"task_routes": {"tasks.add": "cli_fast", "tasks.mul": {"queue": "cli_slow"}},
		"celeriac_queue_arguments": {"*": {"x-max-priority": 10}}
	}`)
	fromFile := worker.Config{
		Queues: []string{"cli_a", "cli_b"}, Concurrency: 5, PrefetchMultiplier: 2, ETATaskLimit: 99,
		SendTaskEvents: true, AcksLate: true, ResultExtended: true, TrackStarted: true,
		TimeLimit: 30 * time.Second, SoftTimeLimit: 20500 * time.Millisecond,
		ShutdownTimeout: 30 * time.Second, ResultTimeout: 5 * time.Minute, DefaultQueue: "cli_default",
		Routes:         map[string]string{"tasks.add": "cli_fast", "tasks.mul": "cli_slow"},
		QueueArguments: map[string]map[string]any{"*": {"x-max-priority": int64(10)}},
	}
	defaults := worker.Config{PrefetchMultiplier: 4, ShutdownTimeout: 30 * time.Second, ResultTimeout: 5 * time.Minute}
	for _, tc := range []struct {
		name string
		args []string
		want func(c *worker.Config)
		base worker.Config
	}{
		{"defaults", nil, func(c *worker.Config) {}, defaults},
		{"file", []string{"--config", file}, func(c *worker.Config) {}, fromFile},
		{"flags win", []string{"--config", file, "-Q", "cli_x, cli_y", "-c", "3", "--prefetch-multiplier", "1",
			"-E=false", "--acks-late=false", "--result-extended=false", "--track-started=false",
			"--time-limit", "0", "--soft-time-limit", "1.5", "--eta-task-limit", "7", "-n", "cli@host"},
			func(c *worker.Config) {
				c.Queues = []string{"cli_x", "cli_y"}
				c.Concurrency, c.PrefetchMultiplier, c.ETATaskLimit = 3, 1, 7
				c.SendTaskEvents, c.AcksLate, c.ResultExtended, c.TrackStarted = false, false, false, false
				c.TimeLimit, c.SoftTimeLimit = 0, 1500*time.Millisecond
				c.Hostname = "cli@host"
			}, fromFile},
		{"prefetch 0 is unlimited", []string{"--prefetch-multiplier", "0"}, func(c *worker.Config) {
			c.PrefetchMultiplier = -1
		}, defaults},
		{"worker flags without a file", []string{"-E", "--acks-late", "--shutdown-timeout", "5s", "--result-timeout", "90s", "--without-heartbeat", "--queue-order", "strict"},
			func(c *worker.Config) {
				c.SendTaskEvents, c.AcksLate, c.WithoutHeartbeat = true, true, true
				c.ShutdownTimeout, c.ResultTimeout = 5*time.Second, 90*time.Second
				c.QueueOrder = worker.QueueOrderStrict
			}, defaults},
		{"queue weights", []string{"-Q", "high,low", "--queue-order", "weighted", "--queue-weights", "high=3, low=1"},
			func(c *worker.Config) {
				c.Queues = []string{"high", "low"}
				c.QueueOrder = worker.QueueOrderWeighted
				c.QueueWeights = map[string]int{"high": 3, "low": 1}
			}, defaults},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := parseWorker(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.base
			tc.want(&want)
			if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(worker.Config{}, "Logger", "Retry", "BaseContext")); diff != "" {
				t.Errorf("worker config (-want +got):\n%s", diff)
			}
		})
	}

	// Connection settings from the file, and flags over them.
	_, o, err := parseWorker(t, "--config", file)
	if err != nil {
		t.Fatal(err)
	}
	if o.BrokerURL != "redis://127.0.0.1:6379/1" || o.ResultBackend != "redis://127.0.0.1:6379/1" ||
		o.VisibilityTimeout != 120*time.Second || o.GlobalKeyPrefix != "pfx:" || o.QueueOrderStrategy != "priority" || !o.RedisStagedPop ||
		o.ResultExpires != 600*time.Second || o.ResultSerializer != "msgpack" {
		t.Errorf("connection options from the file: %+v", o)
	}
	_, o, err = parseWorker(t, "--config", file, "--visibility-timeout", "60", "--global-keyprefix", "other:")
	if err != nil {
		t.Fatal(err)
	}
	if o.VisibilityTimeout != time.Minute || o.GlobalKeyPrefix != "other:" {
		t.Errorf("flags did not win over broker_transport_options: %+v", o)
	}
}

// TestDatabaseBackendSettings: Celery's database backend settings and
// django-db's database URL reach the connection options; the environment's
// CELERIAC_DATABASE_URL wins over the file's database_url.
func TestDatabaseBackendSettings(t *testing.T) {
	t.Setenv("CELERY_BROKER_URL", "")
	t.Setenv("CELERY_RESULT_BACKEND", "")
	t.Setenv("CELERIAC_DATABASE_URL", "")
	file := writeConfig(t, `{
		"broker_url": "memory://",
		"result_backend": "django-db",
		"result_extended": true,
		"database_url": "postgres://app:pw@db/app",
		"database_table_names": {"task": "t", "group": "g"},
		"database_table_schemas": {"task": "s1", "group": "s2"},
		"database_short_lived_sessions": true
	}`)
	_, o, err := parseWorker(t, "--config", file)
	if err != nil {
		t.Fatal(err)
	}
	if o.ResultBackend != "django-db" || o.DatabaseURL != "postgres://app:pw@db/app" || !o.ResultExtended || !o.DatabaseShortLivedSessions ||
		o.DatabaseTableNames["task"] != "t" || o.DatabaseTableNames["group"] != "g" || o.DatabaseTableSchemas["task"] != "s1" || o.DatabaseTableSchemas["group"] != "s2" {
		t.Errorf("options from the file: %+v", o)
	}
	t.Setenv("CELERIAC_DATABASE_URL", "postgres://env/app")
	if _, o, _ = parseWorker(t, "--config", file, "--result-extended=false"); o.DatabaseURL != "postgres://env/app" || o.ResultExtended {
		t.Errorf("environment and flag: DatabaseURL %q, ResultExtended %v", o.DatabaseURL, o.ResultExtended)
	}
}

// TestQuorumQueueSettings: Celery 5.5's quorum-queue settings reach the
// queue declarations and the AMQP transport's delayed delivery.
func TestQuorumQueueSettings(t *testing.T) {
	t.Setenv("CELERY_BROKER_URL", "")
	t.Setenv("CELERY_RESULT_BACKEND", "")
	file := writeConfig(t, `{
		"task_default_exchange_type": "topic",
		"task_default_queue_type": "quorum",
		"broker_native_delayed_delivery_queue_type": "classic",
		"celeriac_queue_arguments": {"*": {"x-max-priority": 5}, "old": {"x-queue-type": "classic"}}
	}`)
	cfg, o, err := parseWorker(t, "--config", file)
	if err != nil {
		t.Fatal(err)
	}
	// The default queue takes the default types; "*" sets no x-queue-type,
	// so the quorum type is added to the default queue's own arguments.
	if cfg.ExchangeType != "" || cfg.ExchangeTypes["celery"] != "topic" {
		t.Errorf("ExchangeType %q, ExchangeTypes %v, want the celery queue's topic", cfg.ExchangeType, cfg.ExchangeTypes)
	}
	wantArgs := map[string]map[string]any{
		"*":      {"x-max-priority": int64(5)},
		"old":    {"x-queue-type": "classic"},
		"celery": {"x-queue-type": "quorum"},
	}
	if d := cmp.Diff(wantArgs, cfg.QueueArguments); d != "" {
		t.Errorf("queue arguments (-want +got):\n%s", d)
	}
	if o.DelayedQueueType != "classic" || o.DelayedDelivery != "" {
		t.Errorf("delayed delivery options %q %q, want classic and auto", o.DelayedQueueType, o.DelayedDelivery)
	}
	_, o, err = parseWorker(t, "--config", writeConfig(t, `{"worker_detect_quorum_queues": false}`))
	if err != nil {
		t.Fatal(err)
	}
	if o.DelayedDelivery != "off" {
		t.Errorf("worker_detect_quorum_queues false: DelayedDelivery %q, want off", o.DelayedDelivery)
	}
	for _, doc := range []string{`{"task_default_queue_type": "stream"}`, `{"task_default_exchange_type": "headers"}`,
		`{"task_create_missing_queue_type": "stream"}`, `{"task_create_missing_queue_exchange_type": "fanout"}`} {
		_, _, err := parseWorker(t, "--config", writeConfig(t, doc))
		var ue UsageError
		if err == nil || !asUsage(err, &ue) {
			t.Errorf("%s: err = %v, want a usage error", doc, err)
		}
	}
}

// TestQueueTypesAsCelery: which queue gets which queue and exchange type,
// as Celery's Queues declares them (celery/app/amqp.py: the default queue
// takes task_default_queue_type and task_default_exchange_type, a queue
// that -Q names and task_queues does not define is new_missing's, which
// Celery 5.6 sets with task_create_missing_queue_type and
// task_create_missing_queue_exchange_type).
func TestQueueTypesAsCelery(t *testing.T) {
	t.Setenv("CELERY_BROKER_URL", "")
	t.Setenv("CELERY_RESULT_BACKEND", "")
	quorum := map[string]any{"x-queue-type": "quorum"}
	for _, tc := range []struct {
		name     string
		config   string
		args     []string
		wantEx   map[string]string
		wantArgs map[string]map[string]any
	}{
		{name: "nothing set", config: `{}`, args: []string{"-Q", "celery,extra"}},
		{name: "5.5 quorum default, -Q default and missing",
			config:   `{"task_default_queue_type": "quorum", "task_default_exchange_type": "topic"}`,
			args:     []string{"-Q", "celery,extra"},
			wantEx:   map[string]string{"celery": "topic"},
			wantArgs: map[string]map[string]any{"celery": quorum}},
		{name: "no -Q: the default queue",
			config:   `{"task_default_queue": "jobs", "task_default_queue_type": "quorum"}`,
			wantArgs: map[string]map[string]any{"jobs": quorum}},
		{name: "task_queues are defined queues",
			config:   `{"task_queues": ["a", "b"], "task_default_queue_type": "quorum", "task_default_exchange_type": "topic"}`,
			wantEx:   map[string]string{"a": "topic", "b": "topic"},
			wantArgs: map[string]map[string]any{"a": quorum, "b": quorum}},
		{name: "5.6 missing queues quorum on topic",
			config:   `{"task_create_missing_queue_type": "quorum", "task_create_missing_queue_exchange_type": "topic"}`,
			args:     []string{"-Q", "celery,extra"},
			wantEx:   map[string]string{"extra": "topic"},
			wantArgs: map[string]map[string]any{"extra": quorum}},
		{name: "the queue's own x-queue-type wins",
			config:   `{"task_default_queue_type": "quorum", "celeriac_queue_arguments": {"celery": {"x-queue-type": "classic", "x-max-priority": 3}}}`,
			wantArgs: map[string]map[string]any{"celery": {"x-queue-type": "classic", "x-max-priority": int64(3)}}},
		{name: "own arguments kept beside quorum",
			config:   `{"task_default_queue_type": "quorum", "celeriac_queue_arguments": {"celery": {"x-delivery-limit": 5}}}`,
			wantArgs: map[string]map[string]any{"celery": {"x-queue-type": "quorum", "x-delivery-limit": int64(5)}}},
		{name: "x-queue-type under * wins",
			config:   `{"task_create_missing_queue_type": "quorum", "celeriac_queue_arguments": {"*": {"x-queue-type": "classic"}}}`,
			args:     []string{"-Q", "extra"},
			wantArgs: map[string]map[string]any{"*": {"x-queue-type": "classic"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := parseWorker(t, append([]string{"--config", writeConfig(t, tc.config)}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.ExchangeType != "" {
				t.Errorf("ExchangeType %q, want direct for queues added later (Celery's add_task_queue)", cfg.ExchangeType)
			}
			if d := cmp.Diff(tc.wantEx, cfg.ExchangeTypes, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("exchange types (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantArgs, cfg.QueueArguments, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("queue arguments (-want +got):\n%s", d)
			}
		})
	}
}

// TestQueueWeightsErrors: bad --queue-weights are usage errors that say
// what is wrong.
func TestQueueWeightsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--queue-weights", "high=3"}, "--queue-weights needs --queue-order weighted"},
		{[]string{"--queue-order", "weighted", "--queue-weights", "high"}, `"high": want NAME=N`},
		{[]string{"--queue-order", "weighted", "--queue-weights", "high=0"}, `"high=0": want NAME=N`},
		{[]string{"--queue-order", "weighted", "--queue-weights", "=2"}, `"=2": want NAME=N`},
		{[]string{"--queue-order", "weighted", "--queue-weights", "high=x"}, `"high=x": want NAME=N`},
		{[]string{"--queue-order", "weighted", "--queue-weights", ","}, "names no queue"},
	} {
		_, _, err := parseWorker(t, tc.args...)
		var ue UsageError
		if err == nil || !strings.Contains(err.Error(), tc.want) || !asUsage(err, &ue) {
			t.Errorf("%v: err = %v, want a usage error with %q", tc.args, err, tc.want)
		}
	}
}

// TestWorkerSettingsErrors: settings a worker cannot use are usage errors.
func TestWorkerSettingsErrors(t *testing.T) {
	for _, tc := range []struct {
		doc, want string
	}{
		{`{"task_routes": {"tasks.add": 5}}`, `task_routes["tasks.add"] must be a queue name`},
		{`{"task_routes": {"tasks.add": {"exchange": "x"}}}`, `task_routes["tasks.add"] has no "queue"`},
		{`{"worker_concurrency": -2}`, "--concurrency must not be negative"},
		{`{"worker_concurrency": "many"}`, "worker_concurrency"},
	} {
		_, _, err := parseWorker(t, "--config", writeConfig(t, tc.doc))
		var ue UsageError
		if err == nil || !strings.Contains(err.Error(), tc.want) || !asUsage(err, &ue) {
			t.Errorf("%s: err = %v, want a usage error with %q", tc.doc, err, tc.want)
		}
	}
}

func asUsage(err error, ue *UsageError) bool {
	u, ok := err.(UsageError)
	if ok {
		*ue = u
	}
	return ok
}

// TestUnknownSettingsLogged: settings the file has and celeriac does not
// read are named in a warning, not silently dropped.
func TestUnknownSettingsLogged(t *testing.T) {
	t.Setenv("CELERY_BROKER_URL", "")
	cfg := writeConfig(t, `{"broker_url": "redis://127.0.0.1:1/1", "BROKER_URL": "x", "worker_hijack_root_logger": false, "worker_concurency": 3}`)
	r := celeriac(t, "--config", cfg, "--log-format", "json", "send", "tasks.add")
	// The upper-case name is not read as broker_url.
	if r.code != exitError || !strings.Contains(r.stderr, "connect: broker redis://127.0.0.1:1/1:") {
		t.Errorf("the broker is not broker_url's:\n%s", r)
	}
	var warned bool
	for _, line := range strings.Split(r.stderr, "\n") {
		var entry struct {
			Level    string   `json:"level"`
			Msg      string   `json:"msg"`
			Settings []string `json:"settings"`
		}
		if json.Unmarshal([]byte(line), &entry) != nil || !strings.Contains(entry.Msg, "does not read") {
			continue
		}
		warned = true
		if entry.Level != "warn" || !cmp.Equal(entry.Settings, []string{"BROKER_URL", "worker_concurency", "worker_hijack_root_logger"}) {
			t.Errorf("warning: %+v", entry)
		}
	}
	if !warned {
		t.Fatalf("no warning about unknown settings:\n%s", r)
	}
}

// TestLogLevels: --loglevel takes Celery's level names in any case.
func TestLogLevels(t *testing.T) {
	for _, tc := range []struct {
		level          string
		debug, info    bool
		warn, errorLvl bool
	}{
		{"DEBUG", true, true, true, true},
		{"info", false, true, true, true},
		{"WARNING", false, false, true, true},
		{"warn", false, false, true, true},
		{"error", false, false, false, true},
		{"CRITICAL", false, false, false, false},
		{"fatal", false, false, false, false},
	} {
		var b syncBuffer
		log, err := newLogger(tc.level, "json", &b)
		if err != nil {
			t.Fatalf("%s: %v", tc.level, err)
		}
		log.Debug("d")
		log.Info("i")
		log.Warn("w")
		log.Error("e")
		got := b.String()
		for _, c := range []struct {
			msg  string
			want bool
		}{{`"msg":"d"`, tc.debug}, {`"msg":"i"`, tc.info}, {`"msg":"w"`, tc.warn}, {`"msg":"e"`, tc.errorLvl}} {
			if strings.Contains(got, c.msg) != c.want {
				t.Errorf("--loglevel %s: %s logged = %v, want %v", tc.level, c.msg, !c.want, c.want)
			}
		}
	}
	var b syncBuffer
	log, err := newLogger("info", "console", &b)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hello", zap.String("task_id", "abc"))
	if got := b.String(); !strings.Contains(got, "INFO\thello\t{\"task_id\": \"abc\"}") {
		t.Errorf("console line = %q", got)
	}
}

// TestHASettings: Celery's settings for replicated brokers reach
// connect.Options: broker_url as a list, broker_failover_strategy,
// broker_use_ssl and redis_backend_use_ssl (amqp and redis key spellings,
// cert_reqs as a name or as Python's ssl constant), and the Sentinel
// transport options of the broker and the result backend.
func TestHASettings(t *testing.T) {
	t.Setenv("CELERY_BROKER_URL", "")
	t.Setenv("CELERY_RESULT_BACKEND", "")
	file := writeConfig(t, `{
		"broker_url": ["amqp://u:p@a:5672//", "amqp://u:p@b:5673//"],
		"broker_failover_strategy": "shuffle",
		"broker_use_ssl": {"keyfile": "/k.pem", "certfile": "/c.pem", "ca_certs": "/ca.pem", "cert_reqs": 2},
		"redis_backend_use_ssl": {"ssl_keyfile": "/rk.pem", "ssl_certfile": "/rc.pem", "ssl_ca_certs": "/rca.pem", "ssl_cert_reqs": "CERT_NONE"},
		"result_backend": "sentinel://:pw@h1:26379/1;sentinel://h2:26380/1",
		"broker_transport_options": {"master_name": "bm", "sentinel_kwargs": {"username": "bsu", "password": "bsp"}},
		"result_backend_transport_options": {"master_name": "rm", "sentinel_kwargs": {"username": "rsu", "password": "rsp"}}
	}`)
	_, o, err := parseWorker(t, "--config", file)
	if err != nil {
		t.Fatal(err)
	}
	want := connect.Options{
		BrokerURL:        "amqp://u:p@a:5672//;amqp://u:p@b:5673//",
		ResultBackend:    "sentinel://:pw@h1:26379/1;sentinel://h2:26380/1",
		FailoverStrategy: "shuffle",
		BrokerSSL:        &connect.SSLOptions{KeyFile: "/k.pem", CertFile: "/c.pem", CACerts: "/ca.pem", CertReqs: "2"},
		BackendSSL:       &connect.SSLOptions{KeyFile: "/rk.pem", CertFile: "/rc.pem", CACerts: "/rca.pem", CertReqs: "CERT_NONE"},
		MasterName:       "bm", SentinelUsername: "bsu", SentinelPassword: "bsp",
		BackendMasterName: "rm", BackendSentinelUsername: "rsu", BackendSentinelPassword: "rsp",
		WaitTimeout: time.Second,
	}
	if diff := cmp.Diff(want, o, cmpopts.IgnoreFields(connect.Options{}, "Logger", "ConnectionName")); diff != "" {
		t.Errorf("options (-want +got):\n%s", diff)
	}

	// false is Celery's default (no TLS); true is TLS with the defaults.
	file = writeConfig(t, `{"broker_url": "amqp://a//;amqp://b//", "broker_use_ssl": false, "redis_backend_use_ssl": true}`)
	if _, o, err = parseWorker(t, "--config", file); err != nil {
		t.Fatal(err)
	}
	if o.BrokerSSL != nil || o.BackendSSL == nil || *o.BackendSSL != (connect.SSLOptions{}) || o.BrokerURL != "amqp://a//;amqp://b//" {
		t.Errorf("broker_use_ssl false / redis_backend_use_ssl true: %+v", o)
	}

	for _, bad := range []string{
		`{"broker_use_ssl": {"keyfile": "/k", "verify": "yes"}}`,
		`{"broker_use_ssl": "yes"}`,
		`{"broker_url": 5}`,
	} {
		if _, _, err := parseWorker(t, "--config", writeConfig(t, bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
