package integration

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// TestTLSBrokersAndBackend runs a celeriac worker process against a
// RabbitMQ (amqps://) and a Redis (rediss://) of the test's own that only
// speak TLS with a certificate from a CA made by the test: Python Celery
// publishes over TLS, the worker runs the tasks, and Python reads the
// results over rediss://. The broker connections are cut once in the
// middle, so that reconnection is logged too, and the passwords of both
// URLs must appear nowhere in the worker's logs.
func TestTLSBrokersAndBackend(t *testing.T) {
	pki := newTestPKI(t, t.TempDir())
	const redisPass = "flt-redis-S3cret-pw"
	redis := startOwnRedis(t, redisPass, &pki)
	t.Run("amqps", func(t *testing.T) {
		const amqpPass = "flt-amqp-S3cret-pw"
		rabbit := startOwnRabbit(t, "flt", amqpPass, &pki)
		runTLS(t, pki, rabbit.URL(), redis, []string{amqpPass, redisPass}, func(prefix string) int {
			return killAMQPConnections(context.Background(), rabbit.ctlCommand(), prefix)
		})
	})
	t.Run("rediss", func(t *testing.T) {
		runTLS(t, pki, redis.URL(3), redis, []string{redisPass}, func(prefix string) int {
			opt, err := goredis.ParseURL(redis.URL(3))
			if err != nil {
				t.Fatal(err)
			}
			opt.TLSConfig.InsecureSkipVerify = true // the killer's own connection only
			rdb := goredis.NewClient(opt)
			defer rdb.Close()
			return killRedisClients(context.Background(), rdb, func(name string) bool {
				return strings.HasPrefix(name, prefix) && !strings.HasSuffix(name, "-effects")
			})
		})
	})
}

func runTLS(t *testing.T, pki testPKI, broker string, redis *ownRedis, secrets []string, kill func(prefix string) int) {
	pythonBin(t)
	queue := fmt.Sprintf("it_flt_tls_%d", time.Now().UnixNano()%1e9)
	backend := redis.URL(1)
	w := startFltWorker(t, fltWorkerConfig{
		Broker: broker, Backend: backend, Effects: redis.URL(2), Prefix: "it_flt:tls:" + queue, Queue: queue,
		Name: queue + "-w", Hostname: "w@" + queue, Concurrency: 4, CAFile: pki.ca,
		VisibilityTimeout: 30, RestoreInterval: 1,
	})
	env := map[string]string{"IT_BROKER": broker, "IT_QUEUE": queue, "IT_CA": pki.ca,
		"IT_BACKEND": backend + "?ssl_cert_reqs=required&ssl_ca_certs=" + pki.ca}
	script := `
import os, ssl, sys
from celery import Celery
from kombu import Exchange, Queue
q, ca = os.environ["IT_QUEUE"], os.environ["IT_CA"]
app = Celery("it_flt_tls", broker=os.environ["IT_BROKER"], backend=os.environ["IT_BACKEND"])
app.conf.update(task_default_queue=q, task_queues=[Queue(q, Exchange(q), routing_key=q)],
    broker_connection_retry_on_startup=True)
if app.conf.broker_url.startswith("amqps"):
    app.conf.broker_use_ssl = {"ca_certs": ca, "cert_reqs": ssl.CERT_REQUIRED}
    app.conf.broker_transport_options = {"confirm_publish": True}
else:
    app.conf.broker_use_ssl = {"ssl_ca_certs": ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
batch = sys.argv[1]
rs = [app.send_task("flt.record", args=[f"{batch}-{i}", 0]) for i in range(50)]
for i, r in enumerate(rs):
    got = r.get(timeout=60)
    assert got == {"key": f"{batch}-{i}", "first": True}, got
print("OK", len(rs))
`
	out := runPython(t, 3*time.Minute, env, script, "before")
	if !strings.Contains(out, "OK 50") {
		t.Fatalf("python: %s", out)
	}
	killed := kill(queue + "-")
	if killed == 0 {
		t.Fatalf("no worker connection found to cut\n%s", tail(w.Log(), 30))
	}
	out = runPython(t, 3*time.Minute, env, script, "after")
	if !strings.Contains(out, "OK 50") {
		t.Fatalf("python: %s", out)
	}
	if err := w.Term(60 * time.Second); err != nil {
		t.Errorf("worker after SIGTERM: %v\n%s", err, w.Log())
	}
	log := w.Log()
	if strings.HasPrefix(broker, "amqps") && !strings.Contains(log, "reconnecting") {
		t.Errorf("the worker logged no reconnection after %d connections were cut; the log check below proves less:\n%s", killed, tail(log, 30))
	}

	// The celeriac command itself, trusting the test CA through
	// SSL_CERT_FILE (Go's system roots): it logs its broker and backend
	// URLs at start, redacted.
	t.Setenv("SSL_CERT_FILE", pki.ca)
	p := startWorkerProc(t, brokerCase{broker: broker, backend: backend}, "-Q", queue, "-c", "2", "-n", "cli@"+queue, "--without-heartbeat")
	cliScript := strings.Replace(script, `app.send_task("flt.record", args=[f"{batch}-{i}", 0])`, `app.send_task("tasks.add", args=[i, 1])`, 1)
	cliScript = strings.Replace(cliScript, `assert got == {"key": f"{batch}-{i}", "first": True}, got`, `assert got == i + 1, got`, 1)
	if out := runPython(t, 3*time.Minute, env, cliScript, "cli"); !strings.Contains(out, "OK 50") {
		t.Fatalf("python against celeriac worker: %s", out)
	}
	killed += kill(queue)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("celeriac worker did not exit after SIGTERM")
	}
	cliLog := p.Log()
	if !strings.Contains(cliLog, "celeriac worker starting") || !strings.Contains(cliLog, "@127.0.0.1:") {
		t.Errorf("the celeriac command did not log its redacted URLs:\n%s", tail(cliLog, 20))
	}
	log += cliLog
	for _, s := range secrets {
		if strings.Contains(log, s) {
			for _, line := range strings.Split(log, "\n") {
				if strings.Contains(line, s) {
					t.Errorf("a password appears in the worker's log: %s", line)
				}
			}
		}
	}
	t.Logf("COUNTS tls %s: 150 tasks published over TLS by Python (100 to the fault worker, 50 to the celeriac command), 150 results read over rediss://, "+
		"%d worker connections cut and re-established; %d log lines, none with a password",
		broker[:strings.Index(broker, ":")], killed, strings.Count(log, "\n"))
}
