package cli

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/celeriac/celeriac/examples/demotasks"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// TestDefaults: defaults set in code apply when nothing else says, show in
// --help, and lose to the command line, the config file and (for the
// broker) the environment.
func TestDefaults(t *testing.T) {
	t.Setenv("CELERY_BROKER_URL", "")
	t.Setenv("CELERY_RESULT_BACKEND", "")
	defaults := Defaults(map[string]string{"queues": "a,b", "concurrency": "8", "broker": "redis://code:6379/0", "pool": "solo"})
	resolve := func(args ...string) (worker.Config, connect.Options, result) {
		t.Helper()
		mux := worker.NewMux()
		demotasks.Register(mux)
		var cfg worker.Config
		var o connect.Options
		var out, errb syncBuffer
		code := Run(t.Context(), mux, args, Output(&out, &errb), defaults, func(op *options) {
			op.dryRun = func(c worker.Config, co connect.Options) { cfg, o = c, co }
		})
		return cfg, o, result{code, out.String(), errb.String()}
	}
	cfg, o, r := resolve("worker")
	if r.code != exitOK || strings.Join(cfg.Queues, ",") != "a,b" || cfg.Concurrency != 1 || o.BrokerURL != "redis://code:6379/0" {
		t.Errorf("code defaults: queues %v concurrency %d broker %q (-P solo: 1)\n%s", cfg.Queues, cfg.Concurrency, o.BrokerURL, r)
	}
	cfg, _, r = resolve("worker", "-Q", "c", "-P", "threads", "-c", "3")
	if strings.Join(cfg.Queues, ",") != "c" || cfg.Concurrency != 3 {
		t.Errorf("command line: queues %v concurrency %d\n%s", cfg.Queues, cfg.Concurrency, r)
	}
	file := writeConfig(t, `{"task_queues": ["f"], "worker_concurrency": 5, "broker_url": "redis://file:6379/0"}`)
	cfg, o, r = resolve("--config", file, "worker", "-P", "threads")
	if strings.Join(cfg.Queues, ",") != "f" || cfg.Concurrency != 5 || o.BrokerURL != "redis://file:6379/0" {
		t.Errorf("config file: queues %v concurrency %d broker %q\n%s", cfg.Queues, cfg.Concurrency, o.BrokerURL, r)
	}
	t.Setenv("CELERY_BROKER_URL", "redis://env:6379/0")
	if _, o, _ = resolve("worker"); o.BrokerURL != "redis://env:6379/0" {
		t.Errorf("environment: broker %q", o.BrokerURL)
	}
	r = celeriacWith(t, []Option{defaults}, "worker", "--help")
	if !strings.Contains(r.stdout, `(default "a,b")`) || !strings.Contains(r.stdout, "(default 8)") {
		t.Errorf("--help does not show the code defaults:\n%s", r.stdout)
	}
	for _, bad := range []map[string]string{{"nope": "1"}, {"concurrency": "many"}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Defaults(%v) did not panic", bad)
				}
			}()
			New(worker.NewMux(), Defaults(bad))
		}()
	}
}

// TestHooks: a flag of the program's own reaches the start hook; the stop
// hook runs after the warm shutdown, once no task runs; a failing start
// hook stops the worker before it connects, and the stop hooks still run.
func TestHooks(t *testing.T) {
	var mu sync.Mutex
	var events []string
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, s)
	}
	var dsn string
	started := make(chan struct{})
	mux := worker.NewMux()
	opts := []Option{
		WorkerFlags(func(fs *pflag.FlagSet) {
			fs.StringVar(&dsn, "database-url", "postgres://default", "the program's database")
		}),
		OnStart(func(ctx context.Context) error { note("start " + dsn); close(started); return nil }),
		OnStop(func(ctx context.Context) error {
			if ctx.Err() != nil {
				t.Error("stop hook got a cancelled context")
			}
			note("stop")
			return nil
		}),
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	var errb syncBuffer
	go func() {
		done <- Run(ctx, mux, []string{"-b", "memory://", "worker", "--database-url", "postgres://db/proj", "-c", "1"}, append(opts, Output(&syncBuffer{}, &errb))...)
	}()
	select {
	case <-started:
	case <-time.After(waitBound):
		t.Fatal("start hook did not run")
	}
	waitFor(t, func() bool { return strings.Contains(errb.String(), "celeriac worker starting") })
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("exit %d\n%s", code, errb.String())
	}
	mu.Lock()
	got := strings.Join(events, ", ")
	mu.Unlock()
	if got != "start postgres://db/proj, stop" {
		t.Errorf("hooks ran as %q", got)
	}
	if i, j := strings.Index(errb.String(), "celeriac worker stopped"), len(errb.String()); i < 0 || i > j {
		t.Errorf("no clean stop:\n%s", errb.String())
	}

	stops := 0
	r := celeriacWith(t, []Option{
		OnStart(func(context.Context) error { return errors.New("database down") }),
		OnStop(func(context.Context) error { stops++; return nil }),
	}, "-b", "memory://", "worker")
	if r.code != exitError || !strings.Contains(r.stderr, "start hook: database down") || stops != 1 {
		t.Errorf("failing start hook: exit %d, stop hooks run %d times\n%s", r.code, stops, r)
	}
}

// celeriacWith runs the command line in-process with the demo tasks and
// extra options.
func celeriacWith(t *testing.T, opts []Option, args ...string) result {
	t.Helper()
	mux := worker.NewMux()
	demotasks.Register(mux)
	var out, errb syncBuffer
	code := Run(t.Context(), mux, args, append(opts, Output(&out, &errb))...)
	return result{code, out.String(), errb.String()}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
