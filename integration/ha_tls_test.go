package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTLSClientCertificates: a RabbitMQ and a Redis of the test's own
// require a client certificate from the test CA. The celeriac command gets
// its certificates from a Celery config file (broker_use_ssl with the amqp
// key names, redis_backend_use_ssl with the redis ones), runs tasks Python
// Celery publishes over TLS with its own client certificate, and stores
// results Python reads over rediss://. The same file without the client
// certificate is refused by both servers. The Redis broker case starts from
// a redis:// URL: broker_use_ssl turns TLS on, as in Celery.
func TestTLSClientCertificates(t *testing.T) {
	pythonBin(t)
	pki := newTestPKI(t, t.TempDir())
	pki.clientAuth = true
	redis := startOwnRedis(t, "", &pki)
	rabbit := startOwnRabbit(t, "mtls", "mtls-pw", &pki)
	backend := redis.URL(1)
	amqpSSL := map[string]any{"keyfile": pki.clientKey, "certfile": pki.clientCert, "ca_certs": pki.ca, "cert_reqs": "CERT_REQUIRED"}
	redisSSL := map[string]any{"ssl_keyfile": pki.clientKey, "ssl_certfile": pki.clientCert, "ssl_ca_certs": pki.ca, "ssl_cert_reqs": 2}
	for _, tc := range []struct {
		name, broker string
		brokerSSL    map[string]any
	}{
		{"amqps", rabbit.URL(), amqpSSL},
		{"redis", strings.Replace(redis.URL(3), "rediss://", "redis://", 1), redisSSL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			queue := fmt.Sprintf("it_ha_mtls_%s_%d", tc.name, time.Now().UnixNano()%1e9)
			conf := map[string]any{"broker_url": tc.broker, "result_backend": backend,
				"broker_use_ssl": tc.brokerSSL, "redis_backend_use_ssl": redisSSL}
			file := writeJSON(t, conf)

			// Without a client certificate both servers refuse.
			noCert := map[string]any{"broker_url": tc.broker, "broker_use_ssl": map[string]any{"ca_certs": pki.ca}}
			if r := cliRaw(t, "--config", writeJSON(t, noCert), "send", "tasks.add", "1", "2", "-Q", queue); r.code == 0 || !refusedForCert(r.stderr) {
				t.Errorf("the broker accepted a client without a certificate, or refused it for another reason:\n%s", r)
			}
			noCert = map[string]any{"broker_url": "memory://", "result_backend": backend,
				"redis_backend_use_ssl": map[string]any{"ssl_ca_certs": pki.ca}}
			if r := cliRaw(t, "--config", writeJSON(t, noCert), "send", "tasks.add", "1", "2"); r.code == 0 || !refusedForCert(r.stderr) {
				t.Errorf("the result backend accepted a client without a certificate, or refused it for another reason:\n%s", r)
			}

			p := startWorkerProc(t, brokerCase{}, "--config", file, "-Q", queue, "-c", "2", "-n", "mtls@"+queue, "--without-heartbeat")
			env := map[string]string{"IT_BROKER": tc.broker, "IT_BACKEND": backend, "IT_QUEUE": queue,
				"IT_CA": pki.ca, "IT_CERT": pki.clientCert, "IT_KEY": pki.clientKey}
			out := runPython(t, 3*time.Minute, env, `
import os, ssl
from celery import Celery
from kombu import Exchange, Queue
q, ca, cert, key = (os.environ[k] for k in ("IT_QUEUE", "IT_CA", "IT_CERT", "IT_KEY"))
app = Celery("it_ha_mtls", broker=os.environ["IT_BROKER"], backend=os.environ["IT_BACKEND"])
if app.conf.broker_url.startswith("amqp"):
    broker_ssl = {"keyfile": key, "certfile": cert, "ca_certs": ca, "cert_reqs": ssl.CERT_REQUIRED}
else:
    broker_ssl = {"ssl_keyfile": key, "ssl_certfile": cert, "ssl_ca_certs": ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
app.conf.update(task_default_queue=q, task_queues=[Queue(q, Exchange(q), routing_key=q)],
    broker_use_ssl=broker_ssl,
    redis_backend_use_ssl={"ssl_keyfile": key, "ssl_certfile": cert, "ssl_ca_certs": ca, "ssl_cert_reqs": ssl.CERT_REQUIRED})
rs = [app.send_task("tasks.add", args=[i, 1]) for i in range(30)]
for i, r in enumerate(rs):
    got = r.get(timeout=60)
    assert got == i + 1, got
print("OK", len(rs))
`)
			if !strings.Contains(out, "OK 30") {
				t.Fatalf("python: %s", out)
			}
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(60 * time.Second):
				t.Fatalf("celeriac worker did not exit after SIGTERM")
			}
			t.Logf("COUNTS tls client certificates %s: 30 tasks published by Python with a client certificate, run by the celeriac command "+
				"with broker_use_ssl/redis_backend_use_ssl from its config file, 30 results read over rediss:// with a client certificate; "+
				"2 connections without a client certificate refused", tc.name)
		})
	}
}

// refusedForCert reports whether a command's error output says the TLS
// handshake failed for want of a certificate (Go's error for the server's
// alert, or the connection the server dropped right after the handshake).
func refusedForCert(stderr string) bool {
	s := strings.ToLower(stderr)
	return strings.Contains(s, "certificate") || strings.Contains(s, "handshake") || strings.Contains(s, "connection reset") || strings.Contains(s, "eof")
}

// writeJSON writes v to a JSON file in the test's temporary directory.
func writeJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(t.TempDir(), "celeryconfig-*.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	return filepath.Clean(f.Name())
}
