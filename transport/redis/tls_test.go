package redis

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// writeTLSFiles writes a CA and a server certificate for 127.0.0.1 signed by
// it, as PEM files in dir.
func writeTLSFiles(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rt test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	caCert, _ := x509.ParseCertificate(caDER)
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER)
}

// TestTLSURL starts a TLS-only redis-server of its own and checks rediss://
// with kombu's ssl_ca_certs and ssl_cert_reqs query parameters.
func TestTLSURL(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed; the TLS test needs it")
	}
	dir := t.TempDir()
	ca, cert, key := writeTLSFiles(t, dir)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "--port", "0", "--bind", "127.0.0.1", "--tls-port", fmt.Sprint(port),
		"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "no",
		"--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("TLS redis-server did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx := context.Background()
	dial := func(url string) (*Transport, error) {
		return Dial(ctx, Config{URL: url, Logger: zaptest.NewLogger(t), DisableRestore: true, DialTimeout: 5 * time.Second})
	}
	base := fmt.Sprintf("rediss://127.0.0.1:%d/0", port)

	// Unknown CA: refused.
	if tr, err := dial(base); err == nil {
		tr.Close()
		t.Fatal("Dial accepted a certificate from an unknown CA")
	}
	// CERT_NONE: the operator chose not to verify.
	tr, err := dial(base + "?ssl_cert_reqs=CERT_NONE")
	if err != nil {
		t.Fatalf("Dial with CERT_NONE: %v", err)
	}
	tr.Close()
	// The CA given as kombu's ssl_ca_certs: verified, and it works.
	tr, err = dial(base + "?ssl_cert_reqs=CERT_REQUIRED&ssl_ca_certs=" + ca)
	if err != nil {
		t.Fatalf("Dial with ssl_ca_certs: %v", err)
	}
	defer tr.Close()
	msg := protocol.Message{ContentType: "application/json", Body: []byte(`[[1], {}, null]`), Headers: map[string]any{"task": "t"}}
	if err := tr.Publish(ctx, &transport.Publishing{RoutingKey: "rt_q", Message: msg}); err != nil {
		t.Fatal(err)
	}
	c := consume(t, tr, 1, "rt_q")
	d := receive(t, c.Deliveries())
	if string(d.Message.Body) != `[[1], {}, null]` {
		t.Fatalf("body %q", d.Message.Body)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
