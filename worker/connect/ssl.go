package connect

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
)

// SSLOptions are the keys of Celery's broker_use_ssl and
// redis_backend_use_ssl dictionaries. The Redis spellings (ssl_keyfile,
// ssl_certfile, ssl_ca_certs, ssl_cert_reqs) name the same settings.
type SSLOptions struct {
	// KeyFile and CertFile are the client certificate (PEM) presented to a
	// server that asks for one: keyfile and certfile. KeyFile may be empty
	// when CertFile holds the key too.
	KeyFile  string
	CertFile string
	// CACerts is the PEM bundle the server's certificate is verified
	// against (ca_certs); empty means the system roots.
	CACerts string
	// CertReqs is cert_reqs: "CERT_REQUIRED" (or "" or "2", the default),
	// "CERT_OPTIONAL" ("1"; Go's client always sees a server certificate, so
	// it is verified as with CERT_REQUIRED), or "CERT_NONE" ("0": not
	// verified).
	CertReqs string
}

// TLSConfig builds the client TLS configuration, reading the files now so
// that a missing or bad file is reported at start.
func (o *SSLOptions) TLSConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	switch strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(o.CertReqs)), "CERT_") {
	case "", "REQUIRED", "2", "OPTIONAL", "1":
	case "NONE", "0":
		// The operator chose not to verify the server (Celery's CERT_NONE).
		c.InsecureSkipVerify = true //nolint:gosec
	default:
		return nil, fmt.Errorf("cert_reqs %q: want CERT_REQUIRED, CERT_OPTIONAL or CERT_NONE", o.CertReqs)
	}
	if o.CACerts != "" {
		pem, err := os.ReadFile(o.CACerts)
		if err != nil {
			return nil, fmt.Errorf("ca_certs: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_certs %s: no PEM certificate in it", o.CACerts)
		}
		c.RootCAs = pool
	}
	switch {
	case o.CertFile != "":
		key := o.KeyFile
		if key == "" {
			key = o.CertFile
		}
		cert, err := tls.LoadX509KeyPair(o.CertFile, key)
		if err != nil {
			return nil, fmt.Errorf("certfile/keyfile: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	case o.KeyFile != "":
		return nil, fmt.Errorf("keyfile %s without certfile", o.KeyFile)
	}
	return c, nil
}

// backendTLS returns the TLS configuration of a Redis result backend or
// rate limiter URL, and the URL, turned into rediss:// when BackendSSL asks
// for TLS.
func backendTLS(o Options, raw string) (*tls.Config, string, error) {
	if o.BackendSSL == nil {
		return o.TLS, raw, nil
	}
	c, err := o.BackendSSL.TLSConfig()
	if err != nil {
		return nil, raw, fmt.Errorf("redis_backend_use_ssl: %w", err)
	}
	return c, forceScheme(raw, "redis", "rediss"), nil
}

// forceScheme rewrites a URL of scheme from into scheme to (amqp:// into
// amqps://), leaving other URLs alone.
func forceScheme(raw, from, to string) string {
	s := strings.TrimSpace(raw)
	if len(s) > len(from)+3 && strings.EqualFold(s[:len(from)+3], from+"://") {
		return to + s[len(from):]
	}
	return raw
}
