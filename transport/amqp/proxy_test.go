package amqp

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// proxy is a TCP proxy to the test broker that a test can break: refuse new
// connections, drop the current ones, or freeze them (stop forwarding
// without closing, as a dead network does). With a TLS config it
// terminates TLS, so that amqps:// can be tested without touching the
// shared broker's configuration.
type proxy struct {
	t      testing.TB
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu      sync.Mutex
	conns   []net.Conn
	frozen  chan struct{} // closed when frozen
	closed  bool
	refused bool // new connections are closed at once
}

// newProxy starts a proxy to the broker of brokerURL; tlsCfg may be nil.
func newProxy(t testing.TB, brokerURL string, tlsCfg *tls.Config) *proxy {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	p := &proxy{t: t, ln: ln, target: u.Host, frozen: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// url returns brokerURL with the proxy's address (and scheme).
func (p *proxy) url(brokerURL, scheme string) string {
	u, err := url.Parse(brokerURL)
	if err != nil {
		p.t.Fatal(err)
	}
	u.Scheme = scheme
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			b.Close()
			return
		}
		if p.refused {
			p.mu.Unlock()
			c.Close()
			b.Close()
			continue
		}
		p.conns = append(p.conns, c, b)
		frozen := p.frozen
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			buf := make([]byte, 32*1024)
			for {
				n, err := src.Read(buf)
				select {
				case <-frozen:
					// Swallow everything: the peer sees silence.
					if err != nil {
						return
					}
					continue
				default:
				}
				if n > 0 {
					if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					if cw, ok := dst.(interface{ CloseWrite() error }); ok {
						_ = cw.CloseWrite()
					} else {
						_ = dst.Close()
					}
					return
				}
			}
		}
		p.wg.Go(func() { pipe(b, c) })
		p.wg.Go(func() { pipe(c, b) })
	}
}

// drop closes every proxied connection (new ones are still accepted).
func (p *proxy) drop() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// refuse makes the proxy close new connections at once (on) or forward
// them again (off), as a broker that is down and comes back.
func (p *proxy) refuse(on bool) {
	p.mu.Lock()
	p.refused = on
	p.mu.Unlock()
}

// freeze stops forwarding on the current connections without closing them;
// connections accepted later work normally.
func (p *proxy) freeze() {
	p.mu.Lock()
	close(p.frozen)
	p.frozen = make(chan struct{})
	p.mu.Unlock()
}

// close stops accepting and drops everything.
func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.drop()
	p.wg.Wait()
}

// selfSigned returns a server TLS config for 127.0.0.1 and a client config
// trusting it.
func selfSigned(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "celeriac test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	client = &tls.Config{RootCAs: pool}
	return server, client
}
