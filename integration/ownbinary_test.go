package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These tests run examples/ownbinary: a program of its own built on
// package cli, outside the module's commands, with two tasks
// (proj.tasks.add, proj.tasks.render) and a store opened by an OnStart
// hook and closed by an OnStop hook. Redis db 9 is theirs.
const ownDB = 9

func projBin(t testing.TB) string { return buildBin(t, "./examples/ownbinary") }

// projRun runs the program to completion with env (the Celery variables
// cleared first) and returns its result.
func projRun(t *testing.T, env map[string]string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, projBin(t), args...)
	cmd.Env = append(os.Environ(), "CELERY_BROKER_URL=", "CELERY_RESULT_BACKEND=")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := cliResult{args: args, stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("proj %v: %v", args, err)
	}
	return r
}

func mustProj(t *testing.T, env map[string]string, args ...string) cliResult {
	t.Helper()
	r := projRun(t, env, args...)
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	return r
}

// projPublish is Python Celery 5.2 publishing n proj.tasks.render(kib, ms)
// (alternately to queues qa and qb) and n proj.tasks.add(i, i), then
// waiting for every result. It prints the sum of the adds, the number of
// renders that returned kib KiB, and the id of the first add.
const projPublish = `
import sys, celery
broker, backend, qa, qb, n, kib, ms = sys.argv[1:8]
n, kib, ms = int(n), int(kib), int(ms)
app = celery.Celery(broker=broker, backend=backend)
renders = [app.send_task('proj.tasks.render', args=[kib, ms], queue=(qa if i % 2 == 0 else qb)) for i in range(n)]
adds = [app.send_task('proj.tasks.add', args=[i, i], queue=qb) for i in range(n)]
total = sum(r.get(timeout=180) for r in adds)
ok = sum(1 for r in renders if r.get(timeout=180)['bytes'] == kib * 1024)
print(total, ok, adds[0].id)
`

func checkPublish(t *testing.T, out string, n int) (id string) {
	t.Helper()
	var total, ok int
	if _, err := fmt.Sscan(out, &total, &ok, &id); err != nil {
		t.Fatalf("python output %q: %v", out, err)
	}
	if want := n * (n - 1); total != want || ok != n {
		t.Fatalf("sum of adds %d (want %d), renders done %d (want %d): tasks lost or wrong", total, want, ok, n)
	}
	return id
}

// TestOwnBinaryCeleryCommandLine is the evidence of issue 24: the
// program, started with a Celery command line (-A proj worker -Q a,b -c 8
// -l INFO -P threads --autoscale=8,2 -O fair), runs what Python Celery
// 5.2 sends, autoscales with Celery's semantics under load and back when
// idle, and the same binary inspects, controls and lists it.
func TestOwnBinaryCeleryCommandLine(t *testing.T) {
	pythonBin(t)
	r := redisDBURL(t, ownDB)
	for _, bc := range []brokerCase{{"redis", r, r}, {"rabbitmq", amqpURL(t), r}} {
		t.Run(bc.name, func(t *testing.T) {
			env := map[string]string{"CELERY_BROKER_URL": bc.broker, "CELERY_RESULT_BACKEND": bc.backend, "AUTOSCALE_KEEPALIVE": "2"}
			// The queues of the command line are a and b: the test starts
			// them empty, through the binary's purge.
			p := mustProj(t, env, "-A", "proj", "purge", "-f", "-Q", "a,b")
			if strings.Contains(p.stderr, "INFO") {
				t.Errorf("purge is not quiet:\n%s", p.stderr)
			}
			node := "proj-" + cliRand() + "@%h"
			w := startProc(t, "proj worker", "./examples/ownbinary", procOptions{Env: env, Stop: syscall.SIGTERM},
				"-A", "proj", "worker", "-Q", "a,b", "-c", "8", "-l", "INFO", "-P", "threads", "--autoscale=8,2", "-O", "fair", "-n", node)
			host, _ := os.Hostname()
			node = strings.ReplaceAll(node, "%h", host)
			if !strings.Contains(w.Log(), "store opened: mem://proj") {
				t.Fatalf("the start hook did not run:\n%s", w.Log())
			}
			stats := func() map[string]any {
				t.Helper()
				out := mustProj(t, env, "-A", "proj", "inspect", "stats", "-d", node, "--json").stdout
				var v map[string]map[string]any
				if err := json.Unmarshal([]byte(out), &v); err != nil {
					t.Fatalf("inspect stats --json: %v\n%s", err, out)
				}
				as, _ := v[node]["autoscaler"].(map[string]any)
				return as
			}
			if as := stats(); fmt.Sprint(as["max"], as["min"], as["current"]) != "8 2 2" {
				t.Fatalf("at start: autoscaler %v, want max 8 min 2 current 2", as)
			}

			const n = 40
			id := checkPublish(t, runPython(t, 3*time.Minute, nil, projPublish, bc.broker, bc.backend, "a", "b", fmt.Sprint(n), "64", "300"), n)
			if !strings.Contains(w.Log(), `"to": 8}`) {
				t.Errorf("under load the pool did not grow to --autoscale's max 8:\n%s", w.Log())
			}
			// Idle: Celery's keepalive (AUTOSCALE_KEEPALIVE=2 s here) after the
			// last growth, the pool shrinks back to min.
			deadline := time.Now().Add(30 * time.Second)
			for as := stats(); fmt.Sprint(as["current"]) != "2"; as = stats() {
				if time.Now().After(deadline) {
					t.Fatalf("idle: autoscaler %v, want current back at min 2\n%s", as, w.Log())
				}
				time.Sleep(500 * time.Millisecond)
			}

			reply := mustProj(t, env, "-A", "proj", "control", "autoscale", "6", "3", "-d", node).stdout
			if !strings.Contains(reply, "autoscale now max=6 min=3") {
				t.Errorf("control autoscale: %s", reply)
			}
			if as := stats(); fmt.Sprint(as["max"], as["min"], as["current"]) != "6 3 3" {
				t.Errorf("after control autoscale 6 3: autoscaler %v", as)
			}
			reg := mustProj(t, env, "-A", "proj", "inspect", "registered", "-d", node).stdout
			if !strings.Contains(reg, "proj.tasks.add") || !strings.Contains(reg, "proj.tasks.render") {
				t.Errorf("inspect registered:\n%s", reg)
			}
			if st := mustProj(t, env, "-A", "proj", "status").stdout; !strings.Contains(st, node+": OK") {
				t.Errorf("status does not list %s:\n%s", node, st)
			}
			if res := mustProj(t, env, "-A", "proj", "result", id).stdout; strings.TrimSpace(res) != "0" {
				t.Errorf("result %s = %q, want 0 (add(0, 0))", id, res)
			}
			w.signalAndWait(t, syscall.SIGTERM, 60*time.Second)
			log := w.Log()
			if i, j := strings.Index(log, "celeriac worker stopped"), strings.Index(log, "store closed"); i < 0 || j < i {
				t.Errorf("the stop hook did not run after the warm shutdown:\n%s", log)
			}
		})
	}
}

// TestOwnBinaryMaxMemoryPerChild: under a load whose buffers pass
// --max-memory-per-child, the worker stops taking tasks, lets the running
// ones finish, frees memory and consumes again; every task Python sent
// ran, none twice.
func TestOwnBinaryMaxMemoryPerChild(t *testing.T) {
	pythonBin(t)
	r := redisDBURL(t, ownDB)
	env := map[string]string{"CELERY_BROKER_URL": r, "CELERY_RESULT_BACKEND": r}
	q := "mem_" + cliRand()
	w := startProc(t, "proj worker", "./examples/ownbinary", procOptions{Env: env, Stop: syscall.SIGTERM},
		"worker", "-Q", q, "-c", "8", "--max-memory-per-child=24000", "-n", "projmem-"+cliRand()+"@%h")
	// 8 at once of 4 MiB each, held 500 ms: 32 MiB, over the 24 000 KiB.
	const n = 24
	checkPublish(t, runPython(t, 3*time.Minute, nil, projPublish, r, r, q, q, fmt.Sprint(n), "4096", "500"), n)
	log := w.Log()
	t.Logf("MAXMEM %d tasks, %d consumer restarts on --max-memory-per-child=24000", 2*n, strings.Count(log, "memory freed, consuming again"))
	if !strings.Contains(log, "--max-memory-per-child: the Go heap is above the limit") ||
		!strings.Contains(log, "--max-memory-per-child: memory freed, consuming again") {
		t.Fatalf("no restart on --max-memory-per-child:\n%s", log)
	}
	if w.Exited() {
		t.Fatalf("the worker exited:\n%s", log)
	}
	// A heap that stays above the ceiling after the warm restart (a leak
	// that no restart of the consumer frees) ends the process for the
	// service manager, after the stop hook, as Celery replaces a child.
	r2 := projRun(t, nil, "-b", "memory://", "worker", "--max-memory-per-child=1")
	if r2.code != 1 || !strings.Contains(r2.stderr, "still above 1 KiB: exiting so that the service manager starts a fresh process") ||
		!strings.Contains(r2.stdout, "store closed") {
		t.Errorf("a heap above the ceiling after the restart: %s", r2)
	}
}

// TestStartupRetryBrokersDown: the worker starts while its RabbitMQ and
// its Redis (result backend) are down; it retries as Celery does
// (broker_connection_retry_on_startup), logging every attempt, /readyz
// says 503 meanwhile; the servers start 20 s later; then every task
// Python Celery publishes runs.
func TestStartupRetryBrokersDown(t *testing.T) {
	pythonBin(t)
	rabbit := newOwnRabbit(t, "proj", "proj-pw", nil)
	redis := newOwnRedis(t, "", nil)
	metrics := freePort(t)
	env := map[string]string{"CELERY_BROKER_URL": rabbit.URL(), "CELERY_RESULT_BACKEND": redis.URL(0)}
	began := time.Now()
	w := startProc(t, "proj worker", "./examples/ownbinary", procOptions{Env: env, Stop: syscall.SIGTERM, Ready: "trying again in 2s (1/100)"},
		"-A", "proj", "worker", "-Q", "a", "-c", "4", "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", metrics), "-n", "projretry-"+cliRand()+"@%h")
	readyz := func() (int, string) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", metrics))
		if err != nil {
			t.Fatalf("/readyz: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "connecting to the broker") {
		t.Errorf("/readyz while the broker is down: %d %q", code, body)
	}
	time.Sleep(time.Until(began.Add(20 * time.Second)))
	if w.Exited() {
		t.Fatalf("the worker gave up:\n%s", w.Log())
	}
	redis.start()
	rabbit.start()
	const n = 30
	checkPublish(t, runPython(t, 3*time.Minute, nil, projPublish, rabbit.URL(), redis.URL(0), "a", "a", fmt.Sprint(n), "1", "1"), n)
	log := w.Log()
	t.Logf("STARTUP %d connection attempts logged while the servers were down; %d tasks from Python ran", strings.Count(log, "cannot connect"), 2*n)
	if c := strings.Count(log, "cannot connect"); c < 3 {
		t.Errorf("%d attempts logged in 20 s, want one per retry (2, 4, 6 ... s):\n%s", c, log)
	}
	if strings.Contains(log, "proj-pw") {
		t.Errorf("the password was logged:\n%s", log)
	}
	if code, body := readyz(); code != http.StatusOK {
		t.Errorf("/readyz once connected: %d %q", code, body)
	}
}

// TestOwnBinaryDaemonOptions: Celery's daemon options of a systemd unit
// (--pidfile, --logfile with %n and %I, and as root --uid/--gid) work: the
// pid file names the process and goes at exit, the log goes to the file,
// the process runs as the user; a second worker on the same pid file is
// refused while the first runs.
func TestOwnBinaryDaemonOptions(t *testing.T) {
	// Not t.TempDir: its parent is 0700, closed to nobody.
	dir, err := os.MkdirTemp("", "celeriac-projd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil { // writable once the worker is nobody
		t.Fatal(err)
	}
	logfile := dir + "/%n%I.log"
	args := []string{"-A", "proj", "-b", "memory://", "worker", "-n", "projd@%h", "--pidfile", dir + "/projd.pid", "--logfile", logfile}
	root := os.Geteuid() == 0
	if root {
		args = append(args, "--uid", "nobody", "--gid", "nogroup")
	}
	w := startProc(t, "proj worker", "./examples/ownbinary", procOptions{Stop: syscall.SIGTERM, Ready: "store opened"}, args...)
	var b []byte
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ = os.ReadFile(dir + "/projd.log")
		if strings.Contains(string(b), "worker ready") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 'worker ready' in the --logfile %s/projd.log (%%n%%I):\n%s\nstdout/stderr:\n%s", dir, b, w.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	pid, _ := os.ReadFile(dir + "/projd.pid")
	if strings.TrimSpace(string(pid)) != fmt.Sprint(w.cmd.Process.Pid) {
		t.Errorf("--pidfile holds %q, want %d", pid, w.cmd.Process.Pid)
	}
	if root {
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", w.cmd.Process.Pid))
		if !strings.Contains(string(status), "Uid:\t65534\t65534") {
			t.Errorf("--uid nobody: the process runs as\n%s", status)
		}
	}
	second := projRun(t, nil, "-b", "memory://", "worker", "--pidfile", dir+"/projd.pid")
	if second.code != 1 || !strings.Contains(second.stderr, "is running") {
		t.Errorf("a second worker on the pid file: %s", second)
	}
	w.signalAndWait(t, syscall.SIGTERM, 30*time.Second)
	if _, err := os.Stat(dir + "/projd.pid"); !os.IsNotExist(err) {
		t.Errorf("the pid file is still there after the warm shutdown: %v", err)
	}
}
