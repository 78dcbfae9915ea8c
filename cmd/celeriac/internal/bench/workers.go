package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// proc is a worker process under measurement.
type proc struct {
	kind   Kind
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // from Wait, once exited is closed
	rss    *rssWatch
	out    *tailBuffer
}

// spec says which worker to start and how.
type spec struct {
	kind        Kind
	concurrency int // celeriac and Python threads; 0 means the kind's default
	broker      kit
	results     ResultStore
	profile     string // celeriac: CPU profile file
}

// start starts a worker process consuming the benchmark queue.
func (h *harness) start(s spec) (*proc, error) {
	var cmd *exec.Cmd
	q := h.o.Queue
	switch {
	case s.kind == Celeriac || s.kind == Traced || s.kind == Staged:
		c := s.concurrency
		if c == 0 {
			c = h.o.Concurrency
		}
		args := []string{"worker", "-b", s.broker.URL(), "-Q", q, "-c", strconv.Itoa(c),
			"-l", "warning", "--without-heartbeat", "-n", "bench-celeriac@%h"}
		if s.results.on() {
			args = append(args, "--result-backend", h.resultBackend(s.results))
		}
		if s.profile != "" {
			args = append(args, "--cpu-profile", s.profile)
		}
		cmd = exec.Command(h.o.Exe, args...)
		cmd.Env = childEnv()
		if s.kind == Staged {
			cmd.Env = childEnv("CELERIAC_REDIS_STAGED_POP=1")
		}
		if s.kind == Traced {
			url, err := h.otlpURL()
			if err != nil {
				return nil, err
			}
			cmd.Env = childEnv("OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
				"OTEL_EXPORTER_OTLP_ENDPOINT="+url, "OTEL_TRACES_SAMPLER=always_on", "OTEL_SERVICE_NAME=bench-celeriac")
		}
	case s.kind.ceiling():
		args := []string{"bench", "ceiling", "--broker-url", s.broker.URL(), "--queue", q}
		if s.kind == Batched {
			args = append(args, "--batched")
		}
		if s.results == RedisResults {
			args = append(args, "--result-url", h.resultURL())
		}
		cmd = exec.Command(h.o.Exe, args...)
		cmd.Env = childEnv()
	case s.kind.python():
		args := []string{"-m", "celery", "-A", "benchapp", "worker", "-P", string(s.kind), "-Q", q,
			"-l", "warning", "--without-gossip", "--without-mingle", "--without-heartbeat",
			"-n", "bench-" + string(s.kind) + "@%h"}
		switch s.kind {
		case Prefork:
			args = append(args, "-c", "2")
		case Threads:
			c := s.concurrency
			if c == 0 {
				c = 8
			}
			args = append(args, "-c", strconv.Itoa(c))
		}
		cmd = exec.Command(h.o.Python, args...)
		cmd.Dir = h.pyDir
		cmd.Env = h.pyEnv(s.broker.URL(), s.results)
	default:
		return nil, fmt.Errorf("unknown worker %q", s.kind)
	}
	p := &proc{kind: s.kind, cmd: cmd, exited: make(chan struct{}), out: &tailBuffer{max: 8 << 10}}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	// A group of its own, so that a prefork pool's children can be killed
	// with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p.rss = watchRSS(cmd.Process.Pid, 50*time.Millisecond)
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// failed reports an early exit as an error that shows the output's tail.
func (p *proc) failed() error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s worker exited: %v\n%s", p.kind, p.err, p.out.String())
	default:
		return nil
	}
}

// stop ends the worker with SIGTERM (a warm shutdown for every kind), then
// kills its process group if it has not exited within 15 s, and returns
// its peak RSS.
func (p *proc) stop() int64 {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.exited
	}
	// Pool children outliving their parent would skew the next run.
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	return p.rss.Stop()
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.b))
}

// python runs a Python command to completion and returns its stdout (and
// stderr on failure).
func (h *harness) python(ctx context.Context, broker string, results ResultStore, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, h.o.Python, args...)
	cmd.Dir = h.pyDir
	cmd.Env = h.pyEnv(broker, results)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) || stderr.Len() > 0 {
			return stdout.String() + stderr.String(), err
		}
	}
	return stdout.String(), err
}
