package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMultiShowAsCelery: `celeriac multi show` builds, for each node, the
// worker command line `celery multi show` builds (the examples of Celery's
// documentation, per-node options, ranges, prefixes), compared option by
// option: Celery's interpreter, --detach and --executable aside, and the
// options Celery moves in front of `worker` (-b) taken where they are.
func TestMultiShowAsCelery(t *testing.T) {
	dir := t.TempDir()
	for _, args := range []string{
		"3 -c 3",
		"3 --range-prefix=worker -c 3",
		"image video data -c 3",
		"2 --hostname=worker.example.com -c 3",
		"foo@worker.example.com bar@worker.example.com -c 3",
		"foo@%h bar@%h",
		"3 -c 3 -c:1 10",
		"image video data -c 3 -c:image 10",
		"5 -c 3 -c:1-3 10",
		"foo bar baz xuzzy -c 3 -c:foo,bar,baz 10",
		"10 -l INFO -Q:1-3 images,video -Q:4,5 data -Q default",
		"w1 w2 -E -Q:w2 b --pidfile=" + dir + "/%n.pid --logfile=" + dir + "/%n%I.log --loglevel=INFO",
		"2 --prefix=x --suffix=y -l debug",
		"a b -c:1 4 -c:2 5 -b redis://127.0.0.1:6379/0",
		"w1 -E --autoscale=8,2 -O fair -P threads --time-limit=30",
	} {
		t.Run(args, func(t *testing.T) {
			py := runPython(t, 60*time.Second, nil, `
import sys
from celery.bin.celery import main
sys.argv = ["celery", "multi", "show"] + sys.argv[1:]
main()
`, strings.Fields(args)...)
			r := cliRaw(t, append([]string{"multi", "show"}, strings.Fields(args)...)...)
			if r.code != 0 {
				t.Fatalf("%s", r)
			}
			want, got := multiLines(py, true), multiLines(r.stdout, false)
			if len(want) == 0 || !slices.EqualFunc(want, got, slices.Equal[[]string]) {
				t.Errorf("celery multi show %s:\n%s\nceleriac multi show:\n%s", args, py, r.stdout)
			}
		})
	}
}

// multiLines turns each worker command line into its sorted options.
func multiLines(out string, celery bool) [][]string {
	var lines [][]string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		var opts []string
		skip := 1 // the executable
		if celery {
			skip = 3 // python -m celery
		}
		for i := skip; i < len(f); i++ {
			a := f[i]
			switch {
			case a == "worker" || a == "--detach" || strings.HasPrefix(a, "--executable="):
			case strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && i+1 < len(f) && !strings.HasPrefix(f[i+1], "-") && f[i+1] != "worker":
				opts = append(opts, a+" "+f[i+1])
				i++
			default:
				opts = append(opts, a)
			}
		}
		slices.Sort(opts)
		lines = append(lines, opts)
	}
	return lines
}

// TestMultiStartsWorkers runs the command lines of Celery's systemd unit
// (docs/userguide/daemonizing: ExecStart `celery -A proj multi start
// $CELERYD_NODES --pidfile=... --logfile=... --loglevel=... $CELERYD_OPTS`,
// ExecStop `multi stopwait`, ExecReload `multi restart`) with celeriac in
// place of celery: two workers start in the background, run what Python
// Celery sends, answer remote control under their node names, restart with
// new pids, and stop, leaving no process and no pid file.
func TestMultiStartsWorkers(t *testing.T) {
	bc := cliBrokers(t)[0]
	q := cliQueue(t, bc)
	dir := t.TempDir()
	nodes := "mw1-" + cliRand() + " mw2-" + cliRand()
	common := append(strings.Fields(nodes), "--pidfile="+filepath.Join(dir, "run", "%n.pid"),
		"--logfile="+filepath.Join(dir, "log", "%n%I.log"), "--loglevel=INFO")
	// Long options take their value after "=", as celery multi parses
	// them ("--result-backend URL" makes URL a node name, in Celery too).
	opts := []string{"-b", bc.broker, "--result-backend=" + bc.backend, "-Q", q, "-c", "2", "--without-mingle", "--without-gossip"}
	multi := func(cmd string, extra ...string) cliResult {
		args := append(append([]string{"-A", "proj", "multi", cmd}, common...), extra...)
		r := cliRaw(t, args...)
		if r.code != 0 {
			t.Fatalf("%s", r)
		}
		return r
	}
	host, _ := os.Hostname()
	pidOf := func(node string) int {
		b, err := os.ReadFile(filepath.Join(dir, "run", node+".pid"))
		if err != nil {
			return 0
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return pid
	}
	t.Cleanup(func() {
		for _, n := range strings.Fields(nodes) {
			if pid := pidOf(n); pid != 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			for _, n := range strings.Fields(nodes) {
				b, _ := os.ReadFile(filepath.Join(dir, "log", n+".log"))
				t.Logf("log of %s:\n%s", n, tail(string(b), 30))
			}
		}
	})

	r := multi("start", opts...)
	for _, n := range strings.Fields(nodes) {
		if !strings.Contains(r.stdout, "\t> "+n+"@"+host+": OK") {
			t.Errorf("start did not report %s OK:\n%s", n, r)
		}
		if pidOf(n) == 0 {
			t.Fatalf("no pid file for %s after start:\n%s", n, r)
		}
	}
	sendAndCheck := func() {
		t.Helper()
		out := runPython(t, 90*time.Second, map[string]string{"IT_BROKER": bc.broker, "IT_BACKEND": bc.backend, "IT_QUEUE": q}, `
import os, celery
app = celery.Celery(broker=os.environ["IT_BROKER"], backend=os.environ["IT_BACKEND"])
rs = [app.send_task("tasks.add", args=[i, i], queue=os.environ["IT_QUEUE"]) for i in range(40)]
print("SUM", sum(r.get(timeout=60) for r in rs))
names = sorted(n for reply in app.control.ping(timeout=3) for n in reply)
print("PING", " ".join(names))
`)
		if !strings.Contains(out, "SUM 1560") {
			t.Errorf("python sum: %s", out)
		}
		for _, n := range strings.Fields(nodes) {
			if !strings.Contains(out, n+"@"+host) {
				t.Errorf("%s@%s did not answer ping: %s", n, host, out)
			}
		}
	}
	sendAndCheck()

	before := map[string]int{}
	for _, n := range strings.Fields(nodes) {
		before[n] = pidOf(n)
	}
	r = multi("restart", opts...)
	for _, n := range strings.Fields(nodes) {
		if procRunning(before[n]) {
			t.Errorf("%s: the process before the restart (%d) still runs:\n%s", n, before[n], r)
		}
		if p := pidOf(n); p == 0 || p == before[n] {
			t.Errorf("%s: pid %d after restart (was %d):\n%s", n, p, before[n], r)
		}
	}
	sendAndCheck()

	running := map[string]int{}
	for _, n := range strings.Fields(nodes) {
		running[n] = pidOf(n)
	}
	r = multi("stopwait")
	for _, n := range strings.Fields(nodes) {
		if procRunning(running[n]) {
			t.Errorf("%s (%d) still runs after stopwait:\n%s", n, running[n], r)
		}
		if pidOf(n) != 0 {
			t.Errorf("%s: pid file left after a warm shutdown", n)
		}
		if !strings.Contains(r.stdout, "\t> "+n+"@"+host+": OK") {
			t.Errorf("stopwait did not report %s OK:\n%s", n, r)
		}
	}
}

// procRunning reports whether pid runs: a zombie has exited. The workers
// multi starts outlive it and are reparented to the machine's init, which
// here (a container's) may leave them unreaped.
func procRunning(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}
