package integration

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pythonBin returns the interpreter that has Celery installed. It is
// /usr/bin/python3 (Debian's python3-celery) unless CELERIAC_PYTHON says
// otherwise; the python3 first on PATH may be another interpreter.
func pythonBin(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("CELERIAC_PYTHON")
	if bin == "" {
		bin = "/usr/bin/python3"
	}
	pythonCheck.Do(func() {
		out, err := exec.Command(bin, "-c", "import celery, kombu, redis, amqp; print(celery.__version__)").CombinedOutput()
		if err != nil {
			pythonCheck.err = strings.TrimSpace(string(out))
			if pythonCheck.err == "" {
				pythonCheck.err = err.Error()
			}
			return
		}
		pythonCheck.version = strings.TrimSpace(string(out))
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
// PYTHONPATH plus the given variables.
func pyEnv(extra map[string]string) []string {
	dir, _ := filepath.Abs("testdata/py")
	env := append(os.Environ(), "PYTHONPATH="+dir, "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1")
	for k, v := range extra {
		env = append(env, k+"="+v)
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
	out := runPython(t, 30*time.Second, nil, "import celery; print(celery.__version__)")
	if got := strings.TrimSpace(out); !strings.HasPrefix(got, "5.") {
		t.Fatalf("celery version = %q, want 5.x", got)
	}
}
