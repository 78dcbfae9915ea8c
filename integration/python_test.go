package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The interop tests run against one of three Python Celery versions, chosen
// with CELERIAC_CELERY:
//   - 5.2 (the default): Debian 12's python3-celery 5.2.6 / kombu 5.2.4,
//     installed in the system Python;
//   - 5.5: Debian 13's python3-celery 5.5.2 / kombu 5.5.3, which .ci/setup
//     unpacks into CELERIAC_CELERY55_DIR (default
//     $XDG_CACHE_HOME/celeriac/celery-5.5, as os.UserCacheDir says); its
//     dist-packages go first on PYTHONPATH, after the tests' helpers and
//     testdata/py55 (a sitecustomize working around a 5.5.2 client hang);
//   - 5.6: Debian sid's python3-celery 5.6.3 / kombu 5.6.2, unpacked the
//     same way into CELERIAC_CELERY56_DIR (default .../celeriac/celery-5.6).
//
// Tests that only make sense on one version call requireCelery; tests of
// what a version added (and later ones kept) call requireCeleryAtLeast.

// celeryVersion is the selected Python Celery, "5.2", "5.5" or "5.6".
func celeryVersion() string {
	if v := os.Getenv("CELERIAC_CELERY"); v != "" {
		return v
	}
	return "5.2"
}

// celery55Path is the dist-packages directory of the unpacked Celery 5.5.
func celery55Path() string { return unpackedCeleryPath("5.5") }

// unpackedCeleryPath is the dist-packages directory of the Celery version
// .ci/setup unpacks (5.5 or 5.6): CELERIAC_CELERY55_DIR or
// CELERIAC_CELERY56_DIR, else under the user cache directory.
func unpackedCeleryPath(version string) string {
	dir := os.Getenv("CELERIAC_CELERY" + strings.ReplaceAll(version, ".", "") + "_DIR")
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(cache, "celeriac", "celery-"+version)
	}
	return filepath.Join(dir, "root", "usr", "lib", "python3", "dist-packages")
}

// celeryPath is the dist-packages directory of the selected Celery, or ""
// for 5.2 (the system Python's own).
func celeryPath() string {
	if v := celeryVersion(); v != "5.2" {
		return unpackedCeleryPath(v)
	}
	return ""
}

// requireCelery skips t unless the selected Celery is version: the test
// exercises what only that version does (why). .ci/test runs the suite
// once per version, so the test runs in the other pass.
func requireCelery(t testing.TB, version, why string) {
	t.Helper()
	if v := celeryVersion(); v != version {
		t.Skipf("Celery %s only (%s); CELERIAC_CELERY=%s", version, why, v)
	}
}

// requireCeleryAtLeast skips t unless the selected Celery is version or
// newer: the test exercises what version added (why).
func requireCeleryAtLeast(t testing.TB, version, why string) {
	t.Helper()
	if v := celeryVersion(); v < version { // "5.2" < "5.5" < "5.6"
		t.Skipf("Celery %s only (%s); CELERIAC_CELERY=%s", version, why, v)
	}
}

// pythonBin returns the interpreter that has Celery installed. It is
// /usr/bin/python3 (Debian's python3-celery) unless CELERIAC_PYTHON says
// otherwise; the python3 first on PATH may be another interpreter. The
// selected Celery version must be the one it imports.
func pythonBin(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("CELERIAC_PYTHON")
	if bin == "" {
		bin = "/usr/bin/python3"
	}
	pythonCheck.Do(func() {
		v := celeryVersion()
		if v != "5.2" && v != "5.5" && v != "5.6" {
			pythonCheck.err = fmt.Sprintf("CELERIAC_CELERY=%q: want 5.2, 5.5 or 5.6", v)
			return
		}
		cmd := exec.Command(bin, "-c", "import celery, kombu, redis, amqp; print(celery.__version__)")
		cmd.Env = pyEnv(nil)
		out, err := cmd.CombinedOutput()
		if err != nil {
			pythonCheck.err = strings.TrimSpace(string(out))
			if pythonCheck.err == "" {
				pythonCheck.err = err.Error()
			}
			if v != "5.2" {
				pythonCheck.err += " (Celery " + v + " is looked for in " + celeryPath() + ": run .ci/setup)"
			}
			return
		}
		pythonCheck.version = strings.TrimSpace(string(out))
		if !strings.HasPrefix(pythonCheck.version, v+".") {
			pythonCheck.err = fmt.Sprintf("CELERIAC_CELERY=%s but Python imports celery %s (from %s)", v, pythonCheck.version, celeryPath())
		}
	})
	if pythonCheck.err != "" {
		unavailable(t, "python celery not usable via %s: %s (apt-get install python3-celery python3-redis)", bin, pythonCheck.err)
	}
	return bin
}

var pythonCheck struct {
	sync.Once
	version string
	err     string
}

// pyEnv is the environment for Python processes: the test's helpers on
// PYTHONPATH (then, for CELERIAC_CELERY=5.5, Celery 5.5's packages) plus
// the given variables.
func pyEnv(extra map[string]string) []string {
	dir, _ := filepath.Abs("testdata/py")
	path := dir
	switch celeryVersion() {
	case "5.5":
		py55, _ := filepath.Abs("testdata/py55")
		path += string(os.PathListSeparator) + py55 + string(os.PathListSeparator) + celery55Path()
	case "5.6":
		path += string(os.PathListSeparator) + celeryPath()
	}
	// An extra PYTHONPATH goes in front, so that Celery 5.5 stays on it.
	if p := extra["PYTHONPATH"]; p != "" {
		path = p + string(os.PathListSeparator) + path
	}
	env := append(os.Environ(), "PYTHONPATH="+path, "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1")
	for k, v := range extra {
		if k != "PYTHONPATH" {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// runPython runs a Python script (source text) to completion and returns its
// stdout. The test fails with the script's stderr when it exits non-zero or
// outlives timeout.
func runPython(t testing.TB, timeout time.Duration, env map[string]string, script string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, pythonBin(t), append([]string{"-c", script}, args...)...)
	cmd.Env = pyEnv(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("python failed: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// pyWorker is a Python Celery worker process started by startPythonWorker.
type pyWorker struct {
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	log  bytes.Buffer
}

// Log returns what the worker wrote so far.
func (w *pyWorker) Log() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.log.String()
}

// Kill sends SIGKILL and waits for the process to exit.
func (w *pyWorker) Kill() {
	_ = syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
	<-w.done
}

// Stop sends SIGTERM (warm shutdown) and waits up to timeout, then kills.
func (w *pyWorker) Stop(timeout time.Duration) {
	_ = syscall.Kill(-w.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(timeout):
		w.Kill()
	}
}

// startPythonWorker starts `celery -A app worker args...` and waits until its
// log says it is ready. It is stopped when the test ends.
func startPythonWorker(t testing.TB, env map[string]string, app string, args ...string) *pyWorker {
	t.Helper()
	argv := append([]string{"-m", "celery", "-A", app, "worker", "--loglevel=INFO"}, args...)
	cmd := exec.Command(pythonBin(t), argv...)
	cmd.Env = pyEnv(env)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	w := &pyWorker{cmd: cmd, done: make(chan struct{})}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("start python worker: %v", err)
	}
	pw.Close()
	ready := make(chan struct{})
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			w.mu.Lock()
			w.log.WriteString(line + "\n")
			w.mu.Unlock()
			if strings.Contains(line, " ready.") {
				once.Do(func() { close(ready) })
			}
		}
		_ = cmd.Wait()
		pr.Close()
	}()
	t.Cleanup(func() {
		w.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("python worker log:\n%s", w.Log())
		}
	})
	select {
	case <-ready:
	case <-w.done:
		t.Fatalf("python worker exited before ready:\n%s", w.Log())
	case <-time.After(60 * time.Second):
		t.Fatalf("python worker not ready after 60s:\n%s", w.Log())
	}
	return w
}

func TestPythonCeleryAvailable(t *testing.T) {
	out := runPython(t, 30*time.Second, nil, "import celery, kombu; print(celery.__version__, kombu.__version__)")
	got := strings.TrimSpace(out)
	if !strings.HasPrefix(got, celeryVersion()+".") {
		t.Fatalf("celery, kombu versions = %q, want celery %s.x (CELERIAC_CELERY)", got, celeryVersion())
	}
	t.Logf("CELERY_VERSION %s: celery, kombu %s", celeryVersion(), got)
}
