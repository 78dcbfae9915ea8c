package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/celeriac/celeriac/examples/demotasks"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// dryRun runs the command line (without the leading "celery") with the
// worker resolved but not started.
func dryRun(t *testing.T, line string) (cfg worker.Config, r result) {
	t.Helper()
	mux := worker.NewMux()
	demotasks.Register(mux)
	var out, errb syncBuffer
	var got bool
	opt := func(o *options) {
		o.dryRun = func(c worker.Config, _ connect.Options) { cfg, got = c, true }
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code := Run(ctx, mux, strings.Fields(line), Output(&out, &errb), opt)
	r = result{code, out.String(), errb.String()}
	if code == exitOK && strings.Contains(line, "worker") && !got {
		t.Fatalf("%s: the worker was not resolved\n%s", line, r)
	}
	return cfg, r
}

// TestCeleryCommandLines: command lines from Celery's documentation
// (first steps, workers guide, daemonizing, concurrency) and from common
// systemd units and Kubernetes manifests run unchanged: every option means
// what it means to Celery, or is accepted with exactly one warning that
// says what celeriac does instead, or (-B, --detach) is refused with what
// to do.
func TestCeleryCommandLines(t *testing.T) {
	t.Setenv("CELERY_BROKER_URL", "memory://")
	t.Setenv("CELERY_RESULT_BACKEND", "")
	type want struct {
		queues           []string
		concurrency      int
		autoMax, autoMin int
		hostname         string // "" leaves the default
		events           bool
		prefetch         int
		timeLimit, soft  time.Duration
		heartbeat        time.Duration
		withoutHeartbeat bool
		warnings         []string // each must appear exactly once
		refused          string   // exit 2 with this text
	}
	for _, tc := range []struct {
		line string
		want want
	}{
		// docs.celeryq.dev: getting started, workers guide.
		{"-A proj worker -l INFO", want{}},
		{"-A proj worker --loglevel=INFO", want{}},
		{"-A proj worker --loglevel=INFO --concurrency=10 -n worker1@%h", want{concurrency: 10, hostname: "worker1@%h"}},
		{"-A proj worker -l INFO -Q hipri,lopri", want{queues: []string{"hipri", "lopri"}}},
		{"-A proj worker -l INFO -Q celery -X lopri", want{queues: []string{"celery"}}},
		{"-A proj worker -X lopri", want{queues: []string{"celery"}}},
		{"-A proj worker --autoscale=10,3", want{autoMax: 10, autoMin: 3}},
		{"-A proj worker --autoscale=3,10", want{autoMax: 10, autoMin: 3}},
		{"-A proj worker --autoscale=8", want{autoMax: 8, autoMin: 0}},
		{"-A proj worker -n worker1", want{hostname: "celery@worker1"}},
		{"-A proj worker -n worker1@%h-%i%I", want{hostname: "worker1@%h-0"}},
		{"-A proj worker -E", want{events: true}},
		{"-A proj worker --events", want{events: true}},
		{"-A proj worker --task-events", want{events: true}},
		// Concurrency guide: every pool is goroutines; solo is one slot.
		{"-A proj worker -P gevent -c 1000", want{concurrency: 1000}},
		{"-A proj worker -P eventlet -c 500", want{concurrency: 500}},
		{"-A proj worker --pool=threads -c 8", want{concurrency: 8}},
		{"-A proj worker -P prefork -c 4", want{concurrency: 4}},
		{"-A proj worker -P solo", want{concurrency: 1}},
		{"-A proj worker -P solo -c 4", want{concurrency: 1, warnings: []string{"-P solo runs one task at a time: -c is ignored"}}},
		// Optimization and prefetch (the "prefetch limits" section).
		{"-A proj worker -O fair", want{}},
		{"-A proj worker -Ofair --prefetch-multiplier=1 -c 4", want{concurrency: 4, prefetch: 1}},
		{"-A proj worker --time-limit=300 --soft-time-limit=240", want{timeLimit: 300 * time.Second, soft: 240 * time.Second}},
		// A Kubernetes manifest of a typical deployment.
		{"-A proj worker --loglevel=INFO --concurrency=4 --max-tasks-per-child=100 --without-gossip --without-mingle --without-heartbeat -E",
			want{concurrency: 4, events: true, withoutHeartbeat: true, warnings: []string{"--max-tasks-per-child is ignored"}}},
		{"-A proj worker -l info --max-memory-per-child=120000", want{}},
		{"-A proj worker --heartbeat-interval=10 --without-mingle", want{heartbeat: 10 * time.Second}},
		{"-A proj worker -I proj.tasks,proj.more -S /var/run/celery/worker.state", want{warnings: []string{"-I/--include is ignored", "-S/--statedb is ignored"}}},
		{"--workdir=. -A proj worker -l info", want{}},
		{"-A proj -C -q worker", want{}},
		{"--app=proj worker --purge", want{}},
		// Refused, with what to do instead.
		{"-A proj worker -B -l INFO", want{refused: "run `beat` as its own process"}},
		{"-A proj worker --beat -s /var/run/celery/celerybeat-schedule", want{refused: "run `beat` as its own process"}},
		{"-A proj worker --detach --pidfile=/var/run/celery/%n.pid --logfile=/var/log/celery/%n%I.log", want{refused: "systemd"}},
		{"-A proj worker -D", want{refused: "systemd"}},
		{"-A proj worker -P fork", want{refused: `-P/--pool "fork": want one of prefork`}},
		{"-A proj worker -O quick", want{refused: "want default or fair"}},
		{"-A proj worker --autoscale=a,b", want{refused: "want MAX[,MIN]"}},
		{"-A proj worker --autoscale=0", want{refused: "MAX must be at least 1"}},
		{"-A proj worker -Q a -X a", want{refused: "leaves no queue"}},
		{"--config proj.celeryconfig worker", want{refused: "not a Python module"}},
	} {
		t.Run(tc.line, func(t *testing.T) {
			cfg, r := dryRun(t, tc.line)
			w := tc.want
			if w.refused != "" {
				if r.code != exitUsage || !strings.Contains(r.stderr, w.refused) {
					t.Fatalf("exit %d, want 2 with %q\n%s", r.code, w.refused, r)
				}
				return
			}
			if r.code != exitOK {
				t.Fatalf("exit %d\n%s", r.code, r)
			}
			if strings.Contains(r.stderr, "unknown") {
				t.Errorf("an option is unknown:\n%s", r.stderr)
			}
			for _, warn := range w.warnings {
				if n := strings.Count(r.stderr, warn); n != 1 {
					t.Errorf("warning %q logged %d times, want once:\n%s", warn, n, r.stderr)
				}
			}
			if n := strings.Count(r.stderr, "WARN"); n != len(w.warnings) {
				t.Errorf("%d warnings, want %d:\n%s", n, len(w.warnings), r.stderr)
			}
			if strings.Contains(tc.line, "-A proj") && !strings.Contains(r.stderr, "-A/--app is ignored") && !strings.Contains(tc.line, " -q ") {
				t.Errorf("no note that -A is ignored:\n%s", r.stderr)
			}
			if w.queues != nil && strings.Join(cfg.Queues, ",") != strings.Join(w.queues, ",") {
				t.Errorf("queues %v, want %v", cfg.Queues, w.queues)
			}
			if w.concurrency != 0 && cfg.Concurrency != w.concurrency {
				t.Errorf("concurrency %d, want %d", cfg.Concurrency, w.concurrency)
			}
			if cfg.AutoscaleMax != w.autoMax || cfg.AutoscaleMin != w.autoMin {
				t.Errorf("autoscale %d,%d, want %d,%d", cfg.AutoscaleMax, cfg.AutoscaleMin, w.autoMax, w.autoMin)
			}
			if w.hostname != "" && cfg.Hostname != w.hostname {
				t.Errorf("hostname %q, want %q", cfg.Hostname, w.hostname)
			}
			if cfg.SendTaskEvents != w.events {
				t.Errorf("task events %v, want %v", cfg.SendTaskEvents, w.events)
			}
			if w.prefetch != 0 && cfg.PrefetchMultiplier != w.prefetch {
				t.Errorf("prefetch multiplier %d, want %d", cfg.PrefetchMultiplier, w.prefetch)
			}
			if cfg.TimeLimit != w.timeLimit || cfg.SoftTimeLimit != w.soft {
				t.Errorf("time limits %v/%v, want %v/%v", cfg.TimeLimit, cfg.SoftTimeLimit, w.timeLimit, w.soft)
			}
			if cfg.HeartbeatInterval != w.heartbeat || cfg.WithoutHeartbeat != w.withoutHeartbeat {
				t.Errorf("heartbeat %v without %v, want %v %v", cfg.HeartbeatInterval, cfg.WithoutHeartbeat, w.heartbeat, w.withoutHeartbeat)
			}
		})
	}
}

// TestCeleryClientCommandLines: -A on every command, --version, and the
// client commands quiet (no INFO lines) as Celery's are.
func TestCeleryClientCommandLines(t *testing.T) {
	t.Setenv("CELERY_RESULT_BACKEND", "")
	for _, tc := range []struct {
		line   string
		code   int
		stdout string
	}{
		{"--version", exitOK, "celeriac " + worker.Version},
		{"version", exitOK, "celeriac " + worker.Version},
		{"-A proj report", exitOK, "tasks: tasks.add"},
		{"-A proj -b memory:// inspect ping -t 0.1", exitNoReply, ""},
		{"-A proj -b memory:// status -t 0.1", exitNoReply, ""},
		{"-A proj -b memory:// control shutdown -t 0.1", exitOK, "shutdown"},
		{"-A proj -b memory:// purge -f", exitOK, "celery"},
		{"-A proj -b memory:// result 1f4c2b0e --timeout 0.1", exitUsage, ""},
	} {
		_, r := dryRun(t, tc.line)
		if r.code != tc.code || !strings.Contains(r.stdout, tc.stdout) {
			t.Errorf("%s: exit %d, want %d with %q on stdout\n%s", tc.line, r.code, tc.code, tc.stdout, r)
		}
		if strings.Contains(r.stderr, "INFO") || strings.Contains(r.stderr, "unknown") {
			t.Errorf("%s: not quiet, or an option unknown:\n%s", tc.line, r.stderr)
		}
	}
}

func TestParseAutoscaleAndHostname(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"w1", "celery@w1"},
		{"w1@%h", "w1@%h"},
		{"w1@%%i", "w1@%%i"},
		{"%i@%I", "0@"},
		{"a@b%", "a@b%"},
	} {
		if got := celeryHostname(tc.in); got != tc.want {
			t.Errorf("celeryHostname(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	for _, tc := range []struct {
		in       string
		max, min int
		err      bool
	}{
		{"10,3", 10, 3, false}, {"3,10", 10, 3, false}, {"4", 4, 0, false}, {" 4 , 2 ", 4, 2, false},
		{"1,2,3", 0, 0, true}, {"x", 0, 0, true}, {"-1,2", 0, 0, true}, {"0,0", 0, 0, true},
	} {
		mx, mn, err := parseAutoscale(tc.in)
		if (err != nil) != tc.err || mx != tc.max || mn != tc.min {
			t.Errorf("parseAutoscale(%q) = %d, %d, %v", tc.in, mx, mn, err)
		}
	}
}

// TestPurgeAsksOnATerminal: without -f, purge asks as Celery's does and
// purges only on yes.
func TestPurgeAsksOnATerminal(t *testing.T) {
	defer func(f func() bool) { stdinIsTerminal = f }(stdinIsTerminal)
	stdinIsTerminal = func() bool { return true }
	for _, tc := range []struct {
		answer  string
		wantErr string
	}{
		{"\n", "aborted"},
		{"no\n", "aborted"},
		{"yes\n", ""},
		{"y\n", ""},
	} {
		var out, errb strings.Builder
		root := New(worker.NewMux(), Output(&out, &errb))
		root.SetIn(strings.NewReader(tc.answer))
		root.SetArgs([]string{"-b", "memory://", "purge", "-Q", "cli_a,cli_b"})
		err := root.Execute()
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr || strings.Contains(out.String(), "purged") {
				t.Errorf("answer %q: err %v, stdout %q; want %q and nothing purged", tc.answer, err, out.String(), tc.wantErr)
			}
		} else if err != nil || !strings.Contains(out.String(), "purged 0 message(s) from cli_b") {
			t.Errorf("answer %q: err %v, stdout %q", tc.answer, err, out.String())
		}
		if !strings.Contains(errb.String(), "This will remove all tasks from 2 queues: cli_a, cli_b.") {
			t.Errorf("answer %q: no question:\n%s", tc.answer, errb.String())
		}
	}
}
