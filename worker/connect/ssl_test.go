package connect

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSSLOptionsTLSConfig(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		o        SSLOptions
		insecure bool
		wantErr  string
	}{
		{"defaults verify", SSLOptions{}, false, ""},
		{"CERT_REQUIRED", SSLOptions{CertReqs: "CERT_REQUIRED"}, false, ""},
		{"python constant 2", SSLOptions{CertReqs: "2"}, false, ""},
		{"CERT_OPTIONAL still verifies", SSLOptions{CertReqs: "cert_optional"}, false, ""},
		{"CERT_NONE", SSLOptions{CertReqs: "CERT_NONE"}, true, ""},
		{"python constant 0", SSLOptions{CertReqs: "0"}, true, ""},
		{"bad cert_reqs", SSLOptions{CertReqs: "maybe"}, false, "cert_reqs"},
		{"missing ca_certs", SSLOptions{CACerts: filepath.Join(dir, "nope.pem")}, false, "ca_certs"},
		{"ca_certs without PEM", SSLOptions{CACerts: notPEM}, false, "no PEM certificate"},
		{"missing certfile", SSLOptions{CertFile: filepath.Join(dir, "nope.pem"), KeyFile: notPEM}, false, "certfile/keyfile"},
		{"keyfile alone", SSLOptions{KeyFile: notPEM}, false, "without certfile"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.o.TLSConfig()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one about %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.InsecureSkipVerify != tt.insecure {
				t.Errorf("InsecureSkipVerify = %v, want %v", c.InsecureSkipVerify, tt.insecure)
			}
		})
	}
}

func TestForceScheme(t *testing.T) {
	tests := []struct{ raw, from, to, want string }{
		{"amqp://u:p@h//", "amqp", "amqps", "amqps://u:p@h//"},
		{"AMQP://h//", "amqp", "amqps", "amqps://h//"},
		{"amqps://h//", "amqp", "amqps", "amqps://h//"},
		{"redis://h:6379/1", "redis", "rediss", "rediss://h:6379/1"},
		{"rediss://h/1", "redis", "rediss", "rediss://h/1"},
		{"sentinel://h:26379", "redis", "rediss", "sentinel://h:26379"},
		{"redis+socket:///tmp/s", "redis", "rediss", "redis+socket:///tmp/s"},
		{"", "redis", "rediss", ""},
	}
	for _, tt := range tests {
		if got := forceScheme(tt.raw, tt.from, tt.to); got != tt.want {
			t.Errorf("forceScheme(%q) = %q, want %q", tt.raw, got, tt.want)
		}
	}
}
