package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/celeriac/celeriac/transport"
)

// ownRedis is a redis-server of the test's own, which the test may stop and
// start again on the same port (the shared one must stay up).
type ownRedis struct {
	t    *testing.T
	bin  string
	dir  string
	port int
	cmd  *exec.Cmd
}

func newOwnRedis(t *testing.T) *ownRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed; this test needs a server of its own")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	r := &ownRedis{t: t, bin: bin, dir: t.TempDir(), port: port}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *ownRedis) url() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

func (r *ownRedis) start() {
	r.t.Helper()
	r.cmd = exec.Command(r.bin, "--port", fmt.Sprint(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir)
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", r.port))
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatal("redis-server did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *ownRedis) stop() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

// TestPing: Ping answers while the server is up, fails while it is down,
// answers again once it is back, and reports ErrClosed after Close.
func TestPing(t *testing.T) {
	srv := newOwnRedis(t)
	tr, err := Dial(context.Background(), Config{URL: srv.url(), Logger: zaptest.NewLogger(t),
		DisableRestore: true, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return tr.Ping(ctx)
	}
	if err := ping(); err != nil {
		t.Fatalf("Ping with the server up: %v", err)
	}

	srv.stop()
	err = ping()
	if err == nil {
		t.Fatal("Ping succeeded with the server stopped")
	}
	t.Logf("Ping while down: %v", err)

	srv.start()
	deadline := time.Now().Add(30 * time.Second)
	for err = ping(); err != nil; err = ping() {
		if time.Now().After(deadline) {
			t.Fatalf("Ping still failing after the server came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ping(); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Ping after Close = %v, want ErrClosed", err)
	}
}
