package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/worker/connect"
)

// The CLI tests (cli_*_test.go) use Redis db 1 and queues and node names
// starting with it_cli_ / it-cli-.
const cliRedisDB = 1

// cliWait bounds every wait of the CLI tests: a deadline against hangs,
// never an assertion about speed.
const cliWait = 60 * time.Second

func cliBrokers(t *testing.T) []brokerCase {
	r := redisDBURL(t, cliRedisDB)
	return []brokerCase{
		{"redis", r, r},
		{"rabbitmq", amqpURL(t), r},
	}
}

func eachCLIBroker(t *testing.T, f func(t *testing.T, bc brokerCase)) {
	for _, bc := range cliBrokers(t) {
		t.Run(bc.name, func(t *testing.T) { f(t, bc) })
	}
}

func cliRand() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// cliQueue returns a queue name of the CLI tests' own and removes the queue
// when the test ends.
func cliQueue(t *testing.T, bc brokerCase) string {
	q := "it_cli_" + cliRand()
	t.Cleanup(func() { deleteQueue(t, bc, q) })
	return q
}

// cliResult is one run of the celeriac binary.
type cliResult struct {
	args           []string
	code           int
	stdout, stderr string
}

func (r cliResult) String() string {
	return fmt.Sprintf("celeriac %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// cli runs the celeriac binary with the broker and backend of bc.
func cli(t *testing.T, bc brokerCase, args ...string) cliResult {
	t.Helper()
	return cliRaw(t, append([]string{"-b", bc.broker, "--result-backend", bc.backend}, args...)...)
}

// cliRaw runs the celeriac binary with exactly args, outside the
// environment's Celery settings.
func cliRaw(t *testing.T, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, celeriacBin(t), args...)
	cmd.Env = append(os.Environ(), "CELERY_BROKER_URL=", "CELERY_RESULT_BACKEND=")
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
		t.Fatalf("celeriac %v: %v", args, err)
	}
	return r
}

// mustCLI runs cli and fails the test unless it exits 0.
func mustCLI(t *testing.T, bc brokerCase, args ...string) cliResult {
	t.Helper()
	r := cli(t, bc, args...)
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	return r
}

// cliJSON runs an inspect or control command with --json and decodes its
// output.
func cliJSON(t *testing.T, bc brokerCase, args ...string) any {
	t.Helper()
	r := mustCLI(t, bc, append(args, "--json")...)
	var v any
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("%s\nnot JSON: %v", r, err)
	}
	return v
}

// eventuallyCLI polls until cond holds.
func eventuallyCLI(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(cliWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cliResultOf waits for the ready state of a task in bc's result backend.
func cliResultOf(t *testing.T, bc brokerCase, id string) *protocol.ResultMeta {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliWait)
	defer cancel()
	conn, err := connect.Open(ctx, connect.Options{BrokerURL: "memory://", ResultBackend: bc.backend})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	m, err := client.Wait(ctx, conn.Backend, id)
	if err != nil {
		t.Fatalf("result of %s: %v", id, err)
	}
	return m
}

// sendID sends a task with the celeriac binary and returns its id.
func sendID(t *testing.T, bc brokerCase, args ...string) string {
	t.Helper()
	r := mustCLI(t, bc, append([]string{"send"}, args...)...)
	return strings.TrimSpace(strings.SplitN(r.stdout, "\n", 2)[0])
}

// The outage and password tests use startOwnRedis (faults_servers_test.go):
// a password-protected redis-server of the test's own that may be stopped
// and started again on the same port while the shared one stays up.

// tcpProxy forwards to a broker until the test breaks it: refuse new
// connections and drop the current ones, as a broker that goes away does.
type tcpProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu      sync.Mutex
	conns   []net.Conn
	refused bool
	closed  bool
}

func startProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.refused || p.closed {
			p.mu.Unlock()
			c.Close()
			continue
		}
		b, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns = append(p.conns, c, b)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(b, c); b.Close() })
		p.wg.Go(func() { _, _ = io.Copy(c, b); c.Close() })
	}
}

// outage refuses new connections and drops the current ones (on), or lets
// connections through again (off).
func (p *tcpProxy) outage(on bool) {
	p.mu.Lock()
	p.refused = on
	var conns []net.Conn
	if on {
		conns, p.conns = p.conns, nil
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

func (p *tcpProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.outage(true)
	p.wg.Wait()
}

// httpGet returns the status and body of a GET.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}
