package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHelp: every command has help that names what a user needs, and
// asking for it succeeds.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"worker", "send", "inspect", "control", "status", "dlq", "purge", "--broker", "--config", "--loglevel", "--log-format", "CELERY_BROKER_URL"}},
		{[]string{"--help"}, []string{"Available Commands", "--result-backend"}},
		{[]string{"worker", "--help"}, []string{"-Q, --queues", "-c, --concurrency", "-n, --hostname", "-E, --task-events", "--prefetch-multiplier", "--metrics-addr", "/readyz", "warm shutdown", "worker_concurrency"}},
		{[]string{"send", "--help"}, []string{"--wait", "--kwargs", "--args", "--countdown", "--eta", "--expires", "-Q, --queue", "celery call", "exit status is 1"}},
		{[]string{"inspect", "--help"}, []string{"ping", "registered", "active_queues", "query_task <ids>...", "stats", "-d, --destination", "--pattern", "-j, --json", "-t, --timeout", "exit status is 3"}},
		{[]string{"control", "--help"}, []string{"revoke <task_id>...", "rate_limit <task_name> <rate_limit>", "time_limit <task_name> <soft> [hard]", "add_consumer <queue>", "cancel_consumer <queue>", "enable_events", "shutdown", "--terminate"}},
		{[]string{"status", "--help"}, []string{"online", "--json"}},
		{[]string{"dlq", "--help"}, []string{"list", "show", "replay", "purge"}},
		{[]string{"dlq", "replay", "--help"}, []string{"--reset-retries"}},
		{[]string{"purge", "--help"}, []string{"-Q, --queues", "-f, --force"}},
		{[]string{"help", "inspect"}, []string{"Broadcast an inspect command"}},
	} {
		r := celeriac(t, tc.args...)
		if r.code != exitOK {
			t.Errorf("celeriac %v: %s", tc.args, r)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("celeriac %v: help lacks %q:\n%s", tc.args, w, r.stdout)
			}
		}
	}
}

// TestUsageErrors: mistakes on the command line exit 2 with a message that
// says what is wrong and how to get help, before anything is sent.
func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"broker_url": 5}`), 0o600); err != nil {
		t.Fatal(err)
	}
	notObject := filepath.Join(dir, "list.json")
	if err := os.WriteFile(notObject, []byte(`[1]`), 0o600); err != nil {
		t.Fatal(err)
	}
	// A broker nobody listens on: any attempt to connect would exit 1, so
	// exit 2 shows the mistake was caught first.
	const nowhere = "redis://127.0.0.1:1/1"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"nope"}, `unknown command "nope"`},
		{[]string{"inspec"}, "Did you mean this?"},
		{[]string{"--bogus"}, "unknown flag: --bogus"},
		{[]string{"send", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"send"}, "requires at least 1 arg"},
		{[]string{"-b", nowhere, "send", "tasks.add", "--kwargs", "{bad"}, `--kwargs must be a JSON object, got "{bad"`},
		{[]string{"-b", nowhere, "send", "tasks.add", "--kwargs", "[1]"}, "--kwargs must be a JSON object"},
		{[]string{"-b", nowhere, "send", "tasks.add", "--args", `{"a": 1}`}, "--args must be a JSON list"},
		{[]string{"-b", nowhere, "send", "tasks.add", "1", "--args", "[2]"}, "either as ARGs or with --args"},
		{[]string{"-b", nowhere, "send", "tasks.add", "--eta", "tomorrow"}, "--eta"},
		{[]string{"-b", nowhere, "send", "tasks.add", "--serializer", "pickle"}, "--serializer must be json or msgpack"},
		{[]string{"-b", nowhere, "send", "tasks.add", "--timeout", "soon"}, `"soon": want seconds`},
		{[]string{"-b", nowhere, "--loglevel", "loud", "send", "tasks.add"}, `unknown --loglevel "loud"`},
		{[]string{"-b", nowhere, "--log-format", "xml", "send", "tasks.add"}, `unknown --log-format "xml"`},
		{[]string{"-b", nowhere, "--config", filepath.Join(dir, "missing.json"), "send", "tasks.add"}, "missing.json"},
		{[]string{"-b", nowhere, "--config", bad, "send", "tasks.add"}, "bad.json"},
		{[]string{"-b", nowhere, "--config", notObject, "send", "tasks.add"}, "not a JSON object of Celery settings"},
		{[]string{"-b", nowhere, "inspect"}, "requires at least 1 arg"},
		{[]string{"-b", nowhere, "inspect", "pong"}, `unknown command "pong" (one of active, active_queues`},
		{[]string{"-b", nowhere, "inspect", "ping", "extra"}, `unexpected argument "extra"`},
		{[]string{"-b", nowhere, "inspect", "query_task"}, "missing ids"},
		{[]string{"-b", nowhere, "inspect", "ping", "-t", "-1"}, "want a positive number of seconds"},
		{[]string{"-b", nowhere, "inspect", "ping", "--pattern", "x", "--matcher", "regex"}, "--matcher must be glob or pcre"},
		{[]string{"-b", nowhere, "control", "rate_limit", "tasks.add"}, "rate_limit <task_name> <rate_limit>: missing rate_limit"},
		{[]string{"-b", nowhere, "control", "time_limit", "tasks.add", "x"}, `argument soft: "x" is not a number`},
		{[]string{"-b", nowhere, "control", "pool_grow", "many"}, `"many" is not an integer`},
		{[]string{"-b", nowhere, "control", "revoke"}, "missing task_id"},
		{[]string{"-b", nowhere, "control", "enable_events", "--terminate"}, "--terminate and --signal go with revoke"},
		{[]string{"-b", nowhere, "control", "explode"}, `unknown command "explode"`},
		{[]string{"-b", nowhere, "inspect", "conf", "maybe"}, "not a truth value"},
		{[]string{"-b", nowhere, "status", "extra"}, "unknown command"},
		{[]string{"-b", nowhere, "purge"}, "add -f/--force to confirm (queues: celery)"},
		{[]string{"-b", nowhere, "purge", "-Q", "cli_x,cli_y", "-X", "cli_y"}, "add -f/--force to confirm (queues: cli_x)"},
		{[]string{"-b", nowhere, "purge", "-Q", "cli_x", "-X", "cli_x", "-f"}, "leaves no queue to purge"},
		{[]string{"-b", nowhere, "dlq", "list"}, "accepts 1 arg(s), received 0"},
		{[]string{"-b", nowhere, "worker", "extra"}, "unknown command"},
		{[]string{"-b", nowhere, "worker", "-c", "-1"}, "--concurrency must not be negative"},
		{[]string{"-b", nowhere, "worker", "-Q", ","}, "-Q/--queues names no queue"},
		{[]string{"-b", nowhere, "worker", "--queue-order", "random"}, "unknown queue order"},
		{[]string{"-b", nowhere, "worker", "--metrics-addr", "not-an-address"}, "--metrics-addr"},
	} {
		r := celeriac(t, tc.args...)
		if r.code != exitUsage {
			t.Errorf("celeriac %v: exit %d, want %d\n%s", tc.args, r.code, exitUsage, r)
			continue
		}
		if !strings.Contains(r.stderr, tc.want) {
			t.Errorf("celeriac %v: stderr lacks %q:\n%s", tc.args, tc.want, r.stderr)
		}
		if !strings.Contains(r.stderr, "--help") {
			t.Errorf("celeriac %v: stderr does not point at --help:\n%s", tc.args, r.stderr)
		}
		if r.stdout != "" {
			t.Errorf("celeriac %v: printed on stdout: %q", tc.args, r.stdout)
		}
	}
}

// TestUnreachableBroker: a broker that does not answer is a failure (exit
// 1) that names the broker without its password.
func TestUnreachableBroker(t *testing.T) {
	// The worker retries at start-up unless told not to (TestStartupRetry).
	noRetry := writeConfig(t, `{"broker_connection_retry_on_startup": false}`)
	every := [][]string{
		{"inspect", "ping"},
		{"control", "shutdown", "-d", "cli-nobody@x"},
		{"status"},
		{"purge", "-Q", "cli_x", "--force"},
		{"dlq", "list", "cli_x"},
		{"worker", "-l", "debug", "--config", noRetry},
	}
	for _, tc := range []struct {
		url, shown string
		all        bool // every command, not just send
	}{
		{"redis://:s3cret-pw@127.0.0.1:1/1", "redis://:xxx@127.0.0.1:1/1", true},
		{"redis://user:s3cret-pw@127.0.0.1:1/1", "redis://user:xxx@127.0.0.1:1/1", false},
		{"amqp://guest:s3cret-pw@127.0.0.1:1//", "amqp://guest:xxx@127.0.0.1:1//", false},
		{"amqp://guest:s3cret-pw@127.0.0.1:1//;amqp://other:s3cret-pw@127.0.0.1:2//", "amqp://other:xxx@127.0.0.1:2//", true},
	} {
		cmds := [][]string{{"send", "tasks.add", "1", "2"}}
		if tc.all {
			cmds = append(cmds, every...)
		}
		for _, c := range cmds {
			args := append([]string{"-b", tc.url}, c...)
			r := celeriac(t, args...)
			if r.code != exitError {
				t.Errorf("celeriac %v: exit %d, want %d\n%s", args, r.code, exitError, r)
				continue
			}
			if strings.Contains(r.stderr+r.stdout, "s3cret-pw") {
				t.Errorf("celeriac %v: the password was printed:\n%s", args, r)
			}
			if !strings.Contains(r.stderr, tc.shown) {
				t.Errorf("celeriac %v: stderr does not name %s:\n%s", args, tc.shown, r.stderr)
			}
			if !strings.Contains(r.stderr, "connection refused") {
				t.Errorf("celeriac %v: stderr does not say why:\n%s", args, r.stderr)
			}
		}
	}
}

// TestStartupRetry: a worker whose broker is down at start retries, as
// Celery's broker_connection_retry_on_startup, logging every attempt
// (password hidden), and gives up after broker_connection_max_retries.
func TestStartupRetry(t *testing.T) {
	defer func(f func(time.Duration) time.Duration) { connectWait = f }(connectWait)
	connectWait = func(time.Duration) time.Duration { return time.Millisecond }
	cfg := writeConfig(t, `{"broker_connection_max_retries": 3}`)
	r := celeriac(t, "-b", "redis://:s3cret-pw@127.0.0.1:1/1", "--config", cfg, "worker")
	if r.code != exitError || !strings.Contains(r.stderr, "giving up after 3 retries (broker_connection_max_retries)") {
		t.Fatalf("exit %d, want 1 after 3 retries\n%s", r.code, r)
	}
	for _, want := range []string{"trying again in 2s (1/3)", "trying again in 4s (2/3)", "trying again in 6s (3/3)", "redis://:xxx@127.0.0.1:1/1"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "s3cret-pw") || strings.Contains(r.stderr, "(4/3)") {
		t.Errorf("a password or a fourth retry in the log:\n%s", r.stderr)
	}
	// A mistake that no retry fixes is not retried.
	r = celeriac(t, "-b", "amqp://guest:guest@127.0.0.1:1/%zz", "worker")
	if r.code == exitOK || strings.Contains(r.stderr, "trying again") {
		t.Errorf("a bad URL was retried:\n%s", r)
	}
}

// TestNoReply: nobody answering is exit 3 with Celery's message.
func TestNoReply(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		for _, args := range [][]string{
			{"inspect", "ping", "-t", "0.3", "-d", "cli-nobody@nowhere"},
			{"inspect", "stats", "-t", "300ms", "--pattern", "cli-nobody-*"},
			{"control", "rate_limit", "tasks.add", "1/s", "-t", "0.3", "-d", "cli-nobody@nowhere"},
			{"status", "-t", "0.3", "--pattern", "cli-nobody-*", "--json"},
		} {
			r := celeriac(t, append([]string{"-b", bc.broker}, args...)...)
			if r.code != exitNoReply {
				t.Errorf("celeriac %v: exit %d, want %d\n%s", args, r.code, exitNoReply, r)
			}
			if !strings.Contains(r.stderr, "No nodes replied within time constraint") {
				t.Errorf("celeriac %v: stderr %q", args, r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("celeriac %v: stdout %q", args, r.stdout)
			}
		}
	})
}

// TestNoBroker: client commands and the worker refuse to run without a broker rather than
// talk to an in-process one that no worker can reach.
func TestNoBroker(t *testing.T) {
	t.Setenv("CELERY_BROKER_URL", "")
	for _, args := range [][]string{
		{"send", "tasks.add", "1", "2"},
		{"inspect", "ping"},
		{"status"},
		{"control", "heartbeat"},
		{"purge", "-Q", "cli_x", "-f"},
		{"dlq", "list", "cli_x"},
		{"worker"},
	} {
		r := celeriac(t, args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "no broker: give --broker, set CELERY_BROKER_URL or broker_url in --config") {
			t.Errorf("celeriac %v without a broker:\n%s", args, r)
		}
	}
}
