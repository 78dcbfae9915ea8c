package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The restart and TLS tests run brokers of their own: the shared ones
// must never be restarted or reconfigured. Each server here lives in a
// temporary directory, on ports of its own, and is stopped when the test
// ends.

// testPKI is a test CA, a server certificate it signed for 127.0.0.1 and
// localhost, and a client certificate it signed, as PEM files. With
// clientAuth set, the servers started with it require a client
// certificate from that CA.
type testPKI struct {
	ca, cert, key         string
	clientCert, clientKey string
	clientAuth            bool
}

func newTestPKI(t *testing.T, dir string) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "celeriac flt test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	cliKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cliTmpl := &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "celeriac test client"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	cliDER, err := x509.CreateCertificate(rand.Reader, cliTmpl, caCert, &cliKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	cliKeyDER, err := x509.MarshalPKCS8PrivateKey(cliKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return testPKI{
		ca:         write("ca.pem", "CERTIFICATE", caDER),
		cert:       write("server.pem", "CERTIFICATE", srvDER),
		key:        write("server.key", "PRIVATE KEY", keyDER),
		clientCert: write("client.pem", "CERTIFICATE", cliDER),
		clientKey:  write("client.key", "PRIVATE KEY", cliKeyDER),
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitPort(port int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// ownRedis is a redis-server of the test's own, persisting every write to
// its append-only file so that a restart keeps the queues and unacked.
type ownRedis struct {
	t        *testing.T
	dir      string
	args     []string
	port     int // plain TCP; 0 when TLS only
	tlsPort  int
	password string
	mu       sync.Mutex
	cmd      *exec.Cmd
}

// startOwnRedis starts a redis-server; with pki, it listens for TLS only.
func startOwnRedis(t *testing.T, password string, pki *testPKI) *ownRedis {
	t.Helper()
	r := newOwnRedis(t, password, pki)
	r.start()
	return r
}

// newOwnRedis prepares a redis-server without starting it (start does).
func newOwnRedis(t *testing.T, password string, pki *testPKI) *ownRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "redis-server not installed (needed to run a Redis of the test's own)")
	}
	r := &ownRedis{t: t, dir: t.TempDir(), password: password}
	r.args = []string{"--bind", "127.0.0.1", "--dir", r.dir, "--save", "", "--appendonly", "yes", "--appendfsync", "always"}
	if pki != nil {
		r.tlsPort = freePort(t)
		r.args = append(r.args, "--port", "0", "--tls-port", fmt.Sprint(r.tlsPort),
			"--tls-cert-file", pki.cert, "--tls-key-file", pki.key, "--tls-ca-cert-file", pki.ca, "--tls-auth-clients", yesNo(pki.clientAuth))
	} else {
		r.port = freePort(t)
		r.args = append(r.args, "--port", fmt.Sprint(r.port))
	}
	if password != "" {
		r.args = append(r.args, "--requirepass", password)
	}
	r.args = append([]string{bin}, r.args...)
	t.Cleanup(r.stop)
	return r
}

func (r *ownRedis) listenPort() int {
	if r.tlsPort != 0 {
		return r.tlsPort
	}
	return r.port
}

func (r *ownRedis) start() {
	r.t.Helper()
	cmd := exec.Command(r.args[0], r.args[1:]...)
	cmd.Dir = r.dir
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	r.cmd = cmd
	r.mu.Unlock()
	if !waitPort(r.listenPort(), 30*time.Second) {
		r.t.Fatalf("own redis-server on %d did not start", r.listenPort())
	}
}

// stop shuts the server down (SIGTERM: it finishes its AOF writes).
func (r *ownRedis) stop() {
	r.mu.Lock()
	cmd := r.cmd
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// signal sends sig to the server (SIGSTOP freezes it, SIGCONT thaws it).
func (r *ownRedis) signal(sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		_ = r.cmd.Process.Signal(sig)
	}
}

// URL returns the server's redis:// or rediss:// URL for db.
func (r *ownRedis) URL(db int) string {
	auth := ""
	if r.password != "" {
		auth = ":" + r.password + "@"
	}
	if r.tlsPort != 0 {
		return fmt.Sprintf("rediss://%s127.0.0.1:%d/%d", auth, r.tlsPort, db)
	}
	return fmt.Sprintf("redis://%s127.0.0.1:%d/%d", auth, r.port, db)
}

// ownRabbit is a RabbitMQ node of the test's own (its own node name,
// ports, data directory and Erlang cookie), so that it can be restarted
// and configured for TLS without touching the shared broker.
type ownRabbit struct {
	t        *testing.T
	dir      string
	node     string
	port     int
	tls      bool
	user     string
	password string
	env      []string
	server   string
	ctl      string
	mu       sync.Mutex
	cmd      *exec.Cmd
}

func startOwnRabbit(t *testing.T, user, password string, pki *testPKI) *ownRabbit {
	t.Helper()
	r := newOwnRabbit(t, user, password, pki)
	r.start()
	return r
}

// newOwnRabbit prepares a RabbitMQ node without starting it (start does).
func newOwnRabbit(t *testing.T, user, password string, pki *testPKI) *ownRabbit {
	t.Helper()
	const bin = "/usr/lib/rabbitmq/bin/"
	if _, err := os.Stat(bin + "rabbitmq-server"); err != nil {
		unavailable(t, "RabbitMQ not installed at %s (needed to run a node of the test's own)", bin)
	}
	dir, err := os.MkdirTemp("", "celeriac-flt-rmq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	r := &ownRabbit{t: t, dir: dir, node: "flt" + hex.EncodeToString(id) + "@localhost", port: freePort(t),
		tls: pki != nil, user: user, password: password, server: bin + "rabbitmq-server", ctl: bin + "rabbitmqctl"}
	for _, d := range []string{"home", "mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A cookie of its own: rabbitmqctl with the same HOME can talk to the
	// node, and nothing can talk to the shared node with it.
	cookie := make([]byte, 16)
	_, _ = rand.Read(cookie)
	if err := os.WriteFile(filepath.Join(dir, "home", ".erlang.cookie"), []byte(strings.ToUpper(hex.EncodeToString(cookie))), 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("default_user = %s\ndefault_pass = %s\nloopback_users = none\n", user, password)
	if pki != nil {
		conf += fmt.Sprintf("listeners.tcp = none\nlisteners.ssl.default = 127.0.0.1:%d\n"+
			"ssl_options.cacertfile = %s\nssl_options.certfile = %s\nssl_options.keyfile = %s\n"+
			"ssl_options.verify = %s\nssl_options.fail_if_no_peer_cert = %v\n", r.port, pki.ca, pki.cert, pki.key,
			map[bool]string{false: "verify_none", true: "verify_peer"}[pki.clientAuth], pki.clientAuth)
	} else {
		conf += fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\n", r.port)
	}
	if err := os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	r.env = append(os.Environ(),
		"HOME="+filepath.Join(dir, "home"),
		"RABBITMQ_NODENAME="+r.node,
		fmt.Sprintf("RABBITMQ_NODE_PORT=%d", r.port),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", freePort(t)),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
	)
	t.Cleanup(r.stop)
	return r
}

func (r *ownRabbit) start() {
	r.t.Helper()
	cmd := exec.Command(r.server)
	cmd.Env = r.env
	cmd.Dir = r.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := os.Create(filepath.Join(r.dir, "server.out"))
	if err != nil {
		r.t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	r.cmd = cmd
	r.mu.Unlock()
	if !waitPort(r.port, 3*time.Minute) {
		log, _ := os.ReadFile(filepath.Join(r.dir, "server.out"))
		r.stop()
		r.t.Fatalf("own RabbitMQ node %s did not start:\n%s", r.node, log)
	}
}

// Ctl runs rabbitmqctl against this node.
func (r *ownRabbit) Ctl(args ...string) (string, error) {
	cmd := exec.Command(r.ctl, append([]string{"-n", r.node}, args...)...)
	cmd.Env = r.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// ctlCommand is the rabbitmqctl command line for this node, for
// killAMQPConnections.
func (r *ownRabbit) ctlCommand() []string {
	return []string{"env", "HOME=" + filepath.Join(r.dir, "home"), r.ctl, "-n", r.node}
}

// stop stops the node gracefully (durable queues and persistent messages
// survive), killing it if it does not stop.
func (r *ownRabbit) stop() {
	r.mu.Lock()
	cmd := r.cmd
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_, _ = r.Ctl("stop")
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// signal sends sig to the node's process group (SIGSTOP freezes the
// node, SIGCONT thaws it).
func (r *ownRabbit) signal(sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		_ = syscall.Kill(-r.cmd.Process.Pid, sig)
	}
}

// URL returns the node's amqp:// or amqps:// URL.
func (r *ownRabbit) URL() string {
	scheme := "amqp"
	if r.tls {
		scheme = "amqps"
	}
	return fmt.Sprintf("%s://%s:%s@127.0.0.1:%d//", scheme, r.user, r.password, r.port)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
