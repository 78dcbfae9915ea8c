package integration

import (
	"bufio"
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

// builds holds the binaries built from the root module, one per package
// path, so that each is built once per test binary.
var builds struct {
	mu   sync.Mutex
	bins map[string]*builtBin
}

type builtBin struct {
	once sync.Once
	path string
	err  error
}

// buildBin builds the main package pkg of the root module ("./cmd/celeriac",
// "./examples/sms", ...) once per test binary and returns its path.
func buildBin(t testing.TB, pkg string) string {
	t.Helper()
	builds.mu.Lock()
	if builds.bins == nil {
		builds.bins = map[string]*builtBin{}
	}
	b := builds.bins[pkg]
	if b == nil {
		b = &builtBin{}
		builds.bins[pkg] = b
	}
	builds.mu.Unlock()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "celeriac-it-bin")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, filepath.Base(pkg))
		if out, err := exec.Command("go", "build", "-C", "..", "-o", b.path, pkg).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// proc is a process a test started: a celeriac worker, an example.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	log  strings.Builder
	err  error // cmd.Wait's, once done is closed
}

// procOptions say how startProc runs a process.
type procOptions struct {
	// Exe runs this executable instead of building pkg (the test binary
	// itself, re-executed as a helper process).
	Exe string
	// Env is added to the environment, in which CELERY_BROKER_URL,
	// CELERY_RESULT_BACKEND and CELERIAC_RATE_LIMIT_URL are cleared so that
	// a developer's settings never leak into a test.
	Env map[string]string
	// Ready is a log line fragment that says the process is ready (default
	// "worker ready"); startProc waits for it up to ReadyTimeout (30 s).
	Ready        string
	ReadyTimeout time.Duration
	// Stop is how the test's cleanup ends the process: syscall.SIGKILL
	// (default) or syscall.SIGTERM, a warm shutdown given up to 40 s (with
	// SIGQUIT first when the test failed, to log the goroutines).
	Stop syscall.Signal
}

// startProc starts the main package pkg of the root module (built once)
// with args, waits until it logs o.Ready, and ends it when the test ends,
// logging its output if the test failed.
func startProc(t *testing.T, name, pkg string, o procOptions, args ...string) *proc {
	t.Helper()
	exe := o.Exe
	if exe == "" {
		exe = buildBin(t, pkg)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), "CELERY_BROKER_URL=", "CELERY_RESULT_BACKEND=", "CELERIAC_RATE_LIMIT_URL=", "GOTRACEBACK=all")
	for k, v := range o.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if o.Ready == "" {
		o.Ready = "worker ready"
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 30 * time.Second
	}
	if o.Stop == 0 {
		o.Stop = syscall.SIGKILL
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		var once sync.Once
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if strings.Contains(sc.Text(), o.Ready) {
				once.Do(func() { close(ready) })
			}
		}
		p.err = cmd.Wait()
		pr.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		if o.Stop == syscall.SIGTERM {
			if t.Failed() {
				_ = cmd.Process.Signal(syscall.SIGQUIT) // the stacks go to the log
			}
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(40 * time.Second):
			}
		}
		p.kill()
		if t.Failed() {
			t.Logf("%s log:\n%s", name, p.Log())
		}
	})
	select {
	case <-ready:
	case <-p.done:
		t.Fatalf("%s exited before it was ready:\n%s", name, p.Log())
	case <-time.After(o.ReadyTimeout):
		t.Fatalf("%s not ready after %v:\n%s", name, o.ReadyTimeout, p.Log())
	}
	return p
}

// Exited reports whether the process has ended.
func (p *proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL: no shutdown, no acks, no lease release.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// signalAndWait sends sig and waits up to timeout for a clean exit.
func (p *proc) signalAndWait(t *testing.T, sig os.Signal, timeout time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s did not exit after %v:\n%s", p.name, sig, p.Log())
	}
	if p.err != nil {
		t.Fatalf("%s exit after %v: %v\n%s", p.name, sig, p.err, p.Log())
	}
}

// Log returns what the process printed so far.
func (p *proc) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}
