package cli

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMultiShow: the worker command lines celery multi builds, taken from
// `celery multi show` of Celery 5.2.6 (the examples of its documentation
// and more; integration's TestMultiShowAsCelery runs Celery itself).
func TestMultiShow(t *testing.T) {
	host, _ := os.Hostname()
	for _, tc := range []struct {
		args string
		want []string
	}{
		{`3 -c 3`, []string{
			"worker -c 3 -n celery1@" + host + " --pidfile=/var/run/celery/celery1.pid --logfile=/var/log/celery/celery1%I.log",
			"worker -c 3 -n celery2@" + host + " --pidfile=/var/run/celery/celery2.pid --logfile=/var/log/celery/celery2%I.log",
			"worker -c 3 -n celery3@" + host + " --pidfile=/var/run/celery/celery3.pid --logfile=/var/log/celery/celery3%I.log",
		}},
		{`3 --range-prefix=worker -c 3`, []string{
			"worker -c 3 -n worker1@" + host + " --pidfile=/var/run/celery/worker1.pid --logfile=/var/log/celery/worker1%I.log",
			"worker -c 3 -n worker2@" + host + " --pidfile=/var/run/celery/worker2.pid --logfile=/var/log/celery/worker2%I.log",
			"worker -c 3 -n worker3@" + host + " --pidfile=/var/run/celery/worker3.pid --logfile=/var/log/celery/worker3%I.log",
		}},
		{`image video data -c 3`, []string{
			"worker -c 3 -n image@" + host + " --pidfile=/var/run/celery/image.pid --logfile=/var/log/celery/image%I.log",
			"worker -c 3 -n video@" + host + " --pidfile=/var/run/celery/video.pid --logfile=/var/log/celery/video%I.log",
			"worker -c 3 -n data@" + host + " --pidfile=/var/run/celery/data.pid --logfile=/var/log/celery/data%I.log",
		}},
		{`2 --hostname=worker.example.com -c 3`, []string{
			"worker -c 3 -n celery1@worker.example.com --pidfile=/var/run/celery/celery1.pid --logfile=/var/log/celery/celery1%I.log",
			"worker -c 3 -n celery2@worker.example.com --pidfile=/var/run/celery/celery2.pid --logfile=/var/log/celery/celery2%I.log",
		}},
		{`foo@worker.example.com bar@worker.example.com -c 3`, []string{
			"worker -c 3 -n foo@worker.example.com --pidfile=/var/run/celery/foo.pid --logfile=/var/log/celery/foo%I.log",
			"worker -c 3 -n bar@worker.example.com --pidfile=/var/run/celery/bar.pid --logfile=/var/log/celery/bar%I.log",
		}},
		{`foo@%h bar@%h`, []string{
			"worker -n foo@" + host + " --pidfile=/var/run/celery/foo.pid --logfile=/var/log/celery/foo%I.log",
			"worker -n bar@" + host + " --pidfile=/var/run/celery/bar.pid --logfile=/var/log/celery/bar%I.log",
		}},
		{`3 -c 3 -c:1 10`, []string{
			"worker -c 10 -n celery1@" + host + " --pidfile=/var/run/celery/celery1.pid --logfile=/var/log/celery/celery1%I.log",
			"worker -c 3 -n celery2@" + host + " --pidfile=/var/run/celery/celery2.pid --logfile=/var/log/celery/celery2%I.log",
			"worker -c 3 -n celery3@" + host + " --pidfile=/var/run/celery/celery3.pid --logfile=/var/log/celery/celery3%I.log",
		}},
		{`image video data -c 3 -c:image 10`, []string{
			"worker -c 10 -n image@" + host + " --pidfile=/var/run/celery/image.pid --logfile=/var/log/celery/image%I.log",
			"worker -c 3 -n video@" + host + " --pidfile=/var/run/celery/video.pid --logfile=/var/log/celery/video%I.log",
			"worker -c 3 -n data@" + host + " --pidfile=/var/run/celery/data.pid --logfile=/var/log/celery/data%I.log",
		}},
		{`5 -c 3 -c:1-3 10`, []string{
			"worker -c 10 -n celery1@" + host + " --pidfile=/var/run/celery/celery1.pid --logfile=/var/log/celery/celery1%I.log",
			"worker -c 10 -n celery2@" + host + " --pidfile=/var/run/celery/celery2.pid --logfile=/var/log/celery/celery2%I.log",
			"worker -c 10 -n celery3@" + host + " --pidfile=/var/run/celery/celery3.pid --logfile=/var/log/celery/celery3%I.log",
			"worker -c 3 -n celery4@" + host + " --pidfile=/var/run/celery/celery4.pid --logfile=/var/log/celery/celery4%I.log",
			"worker -c 3 -n celery5@" + host + " --pidfile=/var/run/celery/celery5.pid --logfile=/var/log/celery/celery5%I.log",
		}},
		{`foo bar baz xuzzy -c 3 -c:foo,bar,baz 10`, []string{
			"worker -c 10 -n foo@" + host + " --pidfile=/var/run/celery/foo.pid --logfile=/var/log/celery/foo%I.log",
			"worker -c 10 -n bar@" + host + " --pidfile=/var/run/celery/bar.pid --logfile=/var/log/celery/bar%I.log",
			"worker -c 10 -n baz@" + host + " --pidfile=/var/run/celery/baz.pid --logfile=/var/log/celery/baz%I.log",
			"worker -c 3 -n xuzzy@" + host + " --pidfile=/var/run/celery/xuzzy.pid --logfile=/var/log/celery/xuzzy%I.log",
		}},
		{`w1 w2 -E -Q:w2 b --pidfile=/tmp/mp/%n.pid --logfile=/tmp/mp/%n%I.log --loglevel=INFO`, []string{
			"worker -E --pidfile=/tmp/mp/w1.pid --logfile=/tmp/mp/w1%I.log --loglevel=INFO -n w1@" + host,
			"worker -E --pidfile=/tmp/mp/w2.pid --logfile=/tmp/mp/w2%I.log --loglevel=INFO -Q b -n w2@" + host,
		}},
		{`2 --prefix=x --suffix=y -l debug`, []string{
			"worker -l debug -n celery1@y --pidfile=/var/run/celery/celery1.pid --logfile=/var/log/celery/celery1%I.log",
			"worker -l debug -n celery2@y --pidfile=/var/run/celery/celery2.pid --logfile=/var/log/celery/celery2%I.log",
		}},
		{`a b -c:1 4 -c:2 5`, []string{
			"worker -c 4 -n a@" + host + " --pidfile=/var/run/celery/a.pid --logfile=/var/log/celery/a%I.log",
			"worker -c 5 -n b@" + host + " --pidfile=/var/run/celery/b.pid --logfile=/var/log/celery/b%I.log",
		}},
		{`w1 -E --autoscale=8,2 -O fair -P threads`, []string{
			"worker -E --autoscale=8,2 -O fair -P threads -n w1@" + host + " --pidfile=/var/run/celery/w1.pid --logfile=/var/log/celery/w1%I.log",
		}},
	} {
		t.Run(tc.args, func(t *testing.T) {
			var got []string
			for _, n := range parseMulti(strings.Fields(tc.args)).nodes {
				got = append(got, strings.Join(n.argv, " "))
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("multi show %s:\ngot\n  %s\nwant\n  %s", tc.args, strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

// fakeWorker is the test binary started by multi in place of a worker:
// with CELERIAC_FAKE_WORKER=ok it writes its pid file (expanded as the
// worker does), runs until SIGTERM and removes the file; with "fail" it
// exits 2 at once, as a worker with a bad flag does.
func fakeWorker() {
	var pidfile, node string
	args := os.Args[1:]
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--pidfile="); ok {
			pidfile = v
		}
		if a == "-n" && i+1 < len(args) {
			node = args[i+1]
		}
	}
	if os.Getenv("CELERIAC_FAKE_WORKER") == "fail" {
		fmt.Fprintln(os.Stderr, "fake worker: refusing to start")
		os.Exit(2)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	pidfile = nodeFormat(pidfile, node)
	if err := os.WriteFile(pidfile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("fake worker", node, "running")
	<-sig
	os.Remove(pidfile)
	fmt.Println("fake worker", node, "stopped")
	os.Exit(0)
}

// testMulti is multi with the test binary as its worker.
func testMulti(t *testing.T, mode string) (*multiTool, *bytes.Buffer) {
	t.Helper()
	t.Setenv("CELERIAC_FAKE_WORKER", mode)
	// A -race binary sleeps 1 s at exit unless told not to; the stops
	// below would wait for it (they wait for the process, not its file).
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	var out bytes.Buffer
	return &multiTool{exe: os.Args[0], prog: "celeriac", stdout: &out, stderr: &out,
		startWait: 20 * time.Second, stopPoll: 20 * time.Millisecond}, &out
}

// TestMultiStartStop: start writes OK per node once its worker has written
// its pid file; stop and stopwait signal through the pid files; restart
// starts a down node at once and a running one after it has stopped; kill
// sends SIGKILL; a node without a pid file is DOWN.
func TestMultiStartStop(t *testing.T) {
	dir := t.TempDir()
	files := []string{"--pidfile=" + filepath.Join(dir, "run", "%n.pid"), "--logfile=" + filepath.Join(dir, "log", "%n%I.log")}
	m, out := testMulti(t, "ok")
	args := func(cmd string, extra ...string) []string {
		return append(append([]string{cmd, "w1", "w2", "--nosplash"}, files...), extra...)
	}
	if code := m.run(args("start", "-c", "2")); code != 0 {
		t.Fatalf("start: exit %d\n%s", code, out)
	}
	host, _ := os.Hostname()
	for _, n := range []string{"w1", "w2"} {
		if !strings.Contains(out.String(), "\t> "+n+"@"+host+": OK") {
			t.Errorf("start did not report %s OK:\n%s", n, out)
		}
	}
	c := parseMulti(args("start")[1:])
	pids := map[string]int{}
	for _, n := range c.nodes {
		if !n.alive() {
			t.Fatalf("%s not running after start (pid file %s)", n.name, n.pidfile())
		}
		pids[n.name] = n.pid()
		// The worker's output goes to its log file.
		b, _ := os.ReadFile(n.logfile())
		if !strings.Contains(string(b), "fake worker "+n.name+" running") {
			t.Errorf("log file %s: %q", n.logfile(), b)
		}
	}

	out.Reset()
	if code := m.run(args("stopwait")); code != 0 {
		t.Fatalf("stopwait: exit %d\n%s", code, out)
	}
	for _, n := range c.nodes {
		if n.alive() || n.pid() != 0 {
			t.Errorf("%s still running (or its pid file left) after stopwait", n.name)
		}
		if !strings.Contains(out.String(), fmt.Sprintf("\t> %s: TERM -> %d", n.name, pids[n.name])) ||
			!strings.Contains(out.String(), "\t> "+n.name+": OK") {
			t.Errorf("stopwait output for %s:\n%s", n.name, out)
		}
	}

	// Both down: stop says so; restart starts them.
	out.Reset()
	m.run(args("stop"))
	if !strings.Contains(out.String(), "> w1@"+host+": DOWN") {
		t.Errorf("stop of stopped nodes:\n%s", out)
	}
	out.Reset()
	if code := m.run(args("restart")); code != 0 {
		t.Fatalf("restart: exit %d\n%s", code, out)
	}
	for _, n := range c.nodes {
		if !n.alive() {
			t.Errorf("%s not running after restart:\n%s", n.name, out)
		}
		pids[n.name] = n.pid()
	}
	// Running: restart stops each and starts it again, with a new pid.
	out.Reset()
	if code := m.run(args("restart")); code != 0 {
		t.Fatalf("restart: exit %d\n%s", code, out)
	}
	for _, n := range c.nodes {
		if !n.alive() || n.pid() == pids[n.name] {
			t.Errorf("%s after the second restart: alive %t, pid %d (was %d)\n%s", n.name, n.alive(), n.pid(), pids[n.name], out)
		}
		pids[n.name] = n.pid()
	}

	out.Reset()
	m.run(args("kill"))
	for _, n := range c.nodes {
		if !strings.Contains(out.String(), fmt.Sprintf("Sending SIGKILL to node %s (%d)", n.name, pids[n.name])) {
			t.Errorf("kill output:\n%s", out)
		}
		deadline := time.Now().Add(10 * time.Second)
		for n.alive() && time.Now().Before(deadline) {
			// Killed, the process is reaped by init: it was started in a
			// session of its own.
			time.Sleep(10 * time.Millisecond)
		}
		if n.alive() {
			t.Errorf("%s alive after kill", n.name)
		}
		// A killed worker leaves its pid file, naming a process that is gone.
		if n.pid() == 0 {
			t.Errorf("%s: the pid file of a killed worker is gone: the test proves nothing about stale files", n.name)
		}
	}
	// A stale pid file: stop reports that the process is gone.
	out.Reset()
	m.run(args("stop"))
	if !strings.Contains(out.String(), "No such process") {
		t.Errorf("stop with stale pid files:\n%s", out)
	}
}

// TestMultiStartFailed: a worker that exits before it has written its pid
// file is FAILED, with its exit code, and multi exits 1.
func TestMultiStartFailed(t *testing.T) {
	dir := t.TempDir()
	m, out := testMulti(t, "fail")
	code := m.run([]string{"start", "w1", "--pidfile=" + filepath.Join(dir, "%n.pid"), "--logfile=" + filepath.Join(dir, "%n.log")})
	if code != 1 || !strings.Contains(out.String(), "FAILED") || !strings.Contains(out.String(), "exit code 2") {
		t.Errorf("exit %d\n%s", code, out)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "w1.log")); !strings.Contains(string(b), "refusing to start") {
		t.Errorf("the worker's output is not in its log file: %q", b)
	}
}

// TestMultiArgs: the signal of stop, options before the subcommand, the
// reserved options, and errors.
func TestMultiArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want syscall.Signal
	}{
		{[]string{"w1", "w2"}, syscall.SIGTERM},
		{[]string{"w1", "-KILL"}, syscall.SIGKILL},
		{[]string{"w1", "-9"}, syscall.SIGKILL},
		{[]string{"w1", "-SIGQUIT"}, syscall.SIGQUIT},
		{[]string{"w1", "--pidfile=/x/%n.pid", "-INT"}, syscall.SIGINT},
	} {
		if got := parseMulti(tc.args).sig(); got != tc.want {
			t.Errorf("%v: signal %v, want %v", tc.args, got, tc.want)
		}
	}
	var out bytes.Buffer
	m := &multiTool{exe: "/bin/celeriac", prog: "celeriac", stdout: &out, stderr: &out}
	if code := m.run([]string{"-A", "proj", "--nosplash", "show", "w1", "-c", "3"}); code != 0 ||
		!strings.Contains(out.String(), "/bin/celeriac worker -c 3 -A proj -n w1@") {
		t.Errorf("options before the subcommand: exit %d\n%s", code, out.String())
	}
	out.Reset()
	if code := m.run([]string{"frobnicate", "w1"}); code != 1 || !strings.Contains(out.String(), "Invalid command: frobnicate") {
		t.Errorf("unknown subcommand: exit %d\n%s", code, out.String())
	}
	out.Reset()
	if code := m.run([]string{"expand", "%h-%n-%d.pid", "w1@example.org"}); code != 0 ||
		out.String() != "w1@example.org-w1-example.org.pid\n" {
		t.Errorf("expand: exit %d %q", code, out.String())
	}
	out.Reset()
	if code := m.run([]string{"get", "b@h", "a@h", "b@h", "-c:2", "5"}); code != 0 || out.String() != "worker -c 5 -n b@h --pidfile=/var/run/celery/b.pid --logfile=/var/log/celery/b%I.log\n" {
		t.Errorf("get: exit %d %q", code, out.String())
	}
}

// TestProcessAliveGone: a pid with no process is not alive, whether kill
// or /proc says so first.
func TestProcessAliveGone(t *testing.T) {
	if !processAlive(os.Getpid()) {
		t.Error("this process is not alive")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if processAlive(cmd.Process.Pid) {
		t.Errorf("an exited and reaped process (%d) is alive", cmd.Process.Pid)
	}
}
