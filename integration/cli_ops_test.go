package integration

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// metricsAddr returns the address a worker started with --metrics-addr
// and --log-format json serves on, from its "serving metrics" log line.
func metricsAddr(t *testing.T, p *workerProc) string {
	t.Helper()
	for _, line := range strings.Split(p.Log(), "\n") {
		var e struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "serving metrics" {
			return "http://" + e.Addr
		}
	}
	t.Fatalf("no metrics address in the log:\n%s", p.Log())
	return ""
}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// scrape parses /metrics (text format, as client_golang writes it).
func scrape(t *testing.T, base string) []sample {
	t.Helper()
	code, body := httpGet(t, base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	var out []sample
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		s := sample{name: line[:i], labels: map[string]string{}, value: v}
		if j := strings.IndexByte(s.name, '{'); j >= 0 {
			for _, kv := range strings.Split(strings.TrimSuffix(s.name[j+1:], "}"), ",") {
				k, val, _ := strings.Cut(kv, "=")
				s.labels[k] = strings.Trim(val, `"`)
			}
			s.name = s.name[:j]
		}
		out = append(out, s)
	}
	return out
}

// metric sums the samples of name whose labels include the given pairs
// ("task", "tasks.add", ...).
func metric(ss []sample, name string, pairs ...string) float64 {
	total := 0.0
next:
	for _, s := range ss {
		if s.name != name {
			continue
		}
		for i := 0; i+1 < len(pairs); i += 2 {
			if s.labels[pairs[i]] != pairs[i+1] {
				continue next
			}
		}
		total += s.value
	}
	return total
}

// TestCLIMetrics: a `celeriac worker --metrics-addr` run on a real broker,
// a known mix of tasks from Python, and a scrape of /metrics that shows
// exactly the counts of that run.
func TestCLIMetrics(t *testing.T) {
	eachCLIBroker(t, func(t *testing.T, bc brokerCase) {
		q := cliQueue(t, bc)
		node := "it-cli-metrics-" + cliRand() + "@celeriac"
		p := startWorkerProc(t, bc, "-Q", q, "-n", node, "-c", "2", "--metrics-addr", "127.0.0.1:0", "--log-format", "json")
		base := metricsAddr(t, p)
		if code, body := httpGet(t, base+"/healthz"); code != 200 || body != "ok\n" {
			t.Fatalf("/healthz: %d %q", code, body)
		}
		if code, body := httpGet(t, base+"/readyz"); code != 200 || body != "ok\n" {
			t.Fatalf("/readyz: %d %q", code, body)
		}
		// One tasks.mul per hour: the first runs, the others wait for it.
		eventuallyCLI(t, "the worker answers", func() bool { return cli(t, bc, "inspect", "ping", "-d", node).code == 0 })
		mustCLI(t, bc, "control", "rate_limit", "tasks.mul", "1/h", "-d", node)

		env := map[string]string{"IT_BROKER": bc.broker, "IT_BACKEND": bc.backend, "IT_QUEUE": q}
		out := runPython(t, 2*cliWait, env, `
import time
from it_cli_app import app
S = app.send_task
adds = [S("tasks.add", (i, i)) for i in range(3)]
fails = [S("tasks.fail", ("boom",)) for _ in range(2)]
flaky = S("tasks.flaky", (1,))
nope = S("tasks.nope")
later = [S("tasks.add", (1, 1), countdown=2) for _ in range(2)]
muls = [S("tasks.mul", (2, 3)) for _ in range(3)]
assert [r.get(timeout=60) for r in adds + later] == [0, 2, 4, 2, 2]
for r in fails + [nope]:
    r.get(timeout=60, propagate=False)
    assert r.state == "FAILURE", r.state
assert flaky.get(timeout=60) == "succeeded after 1 retries", flaky.result
deadline = time.time() + 60
while time.time() < deadline and not any(r.state == "SUCCESS" for r in muls):
    time.sleep(0.1)
assert sorted(r.state for r in muls) == ["PENDING", "PENDING", "SUCCESS"], [r.state for r in muls]
print("OK")
`)
		if !strings.HasSuffix(strings.TrimSpace(out), "OK") {
			t.Fatalf("python: %s", out)
		}

		// Results are stored before the run is counted: wait for the last
		// count, then every count must be exactly that of the run.
		var ss []sample
		eventuallyCLI(t, "every finished run counted", func() bool {
			ss = scrape(t, base)
			return metric(ss, "celeriac_tasks_finished_total") >= 10 && metric(ss, "celeriac_tasks_held_rate_limit") == 2
		})
		for _, c := range []struct {
			name  string
			pairs []string
			want  float64
		}{
			{"celeriac_tasks_received_total", []string{"task", "tasks.add"}, 5},
			{"celeriac_tasks_received_total", []string{"task", "tasks.fail"}, 2},
			{"celeriac_tasks_received_total", []string{"task", "tasks.flaky"}, 2}, // the retry comes back
			{"celeriac_tasks_received_total", []string{"task", "tasks.mul"}, 3},
			{"celeriac_tasks_received_total", nil, 12},
			{"celeriac_tasks_started_total", []string{"task", "tasks.add"}, 5},
			{"celeriac_tasks_started_total", []string{"task", "tasks.flaky"}, 2},
			{"celeriac_tasks_started_total", []string{"task", "tasks.mul"}, 1},
			{"celeriac_tasks_started_total", nil, 10},
			{"celeriac_tasks_finished_total", []string{"task", "tasks.add", "outcome", "succeeded"}, 5},
			{"celeriac_tasks_finished_total", []string{"task", "tasks.fail", "outcome", "failed"}, 2},
			{"celeriac_tasks_finished_total", []string{"task", "tasks.flaky", "outcome", "retried"}, 1},
			{"celeriac_tasks_finished_total", []string{"task", "tasks.flaky", "outcome", "succeeded"}, 1},
			{"celeriac_tasks_finished_total", []string{"task", "tasks.mul", "outcome", "succeeded"}, 1},
			{"celeriac_tasks_finished_total", nil, 10},
			{"celeriac_messages_rejected_total", []string{"reason", "not-registered"}, 1},
			{"celeriac_messages_rejected_total", nil, 1},
			{"celeriac_task_waits_total", []string{"task", "tasks.add", "reason", "eta"}, 2},
			{"celeriac_task_waits_total", []string{"task", "tasks.flaky", "reason", "eta"}, 1},
			{"celeriac_task_waits_total", []string{"task", "tasks.mul", "reason", "rate-limit"}, 2},
			{"celeriac_task_waits_total", nil, 5},
			{"celeriac_task_wait_seconds_count", []string{"reason", "eta"}, 3},
			{"celeriac_task_wait_seconds_count", []string{"reason", "rate-limit"}, 2},
			{"celeriac_task_runtime_seconds_count", []string{"task", "tasks.add"}, 5},
			{"celeriac_task_runtime_seconds_count", []string{"task", "tasks.mul"}, 1},
			{"celeriac_tasks_running", nil, 0},
			{"celeriac_tasks_ready", nil, 0},
			{"celeriac_tasks_held_eta", nil, 0},
			{"celeriac_tasks_held_rate_limit", nil, 2},
			{"celeriac_concurrency", nil, 2},
		} {
			if got := metric(ss, c.name, c.pairs...); got != c.want {
				t.Errorf("%s%v = %v, want %v", c.name, c.pairs, got, c.want)
			}
		}
		if metric(ss, "process_resident_memory_bytes") == 0 || metric(ss, "go_goroutines") == 0 {
			t.Error("no process or Go runtime metrics")
		}
		if t.Failed() {
			var lines []string
			for _, s := range ss {
				if strings.HasPrefix(s.name, "celeriac_") && !strings.Contains(s.name, "_bucket") {
					lines = append(lines, fmt.Sprintf("%s%v %v", s.name, s.labels, s.value))
				}
			}
			sort.Strings(lines)
			t.Logf("scrape:\n%s", strings.Join(lines, "\n"))
		}
	})
}

// stopWorkerProc sends SIGTERM and waits for a clean exit.
func stopWorkerProc(t *testing.T, p *workerProc) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
		if p.err != nil {
			t.Errorf("worker exit: %v", p.err)
		}
	case <-time.After(cliWait):
		t.Fatalf("worker did not stop after SIGTERM:\n%s", p.Log())
	}
}

// checkReadyz follows /readyz through a broker outage: ok, then 503 with
// the reason while the broker is away, /healthz ok throughout, then ok
// again, and the worker runs tasks again.
func checkReadyz(t *testing.T, bc brokerCase, p *workerProc, q, password string, down, up func(), wantReason string) {
	t.Helper()
	base := metricsAddr(t, p)
	if code, body := httpGet(t, base+"/readyz"); code != 200 || body != "ok\n" {
		t.Fatalf("/readyz with the broker up: %d %q", code, body)
	}
	down()
	var body string
	eventuallyCLI(t, "/readyz reports the outage", func() bool {
		var code int
		code, body = httpGet(t, base+"/readyz")
		return code == 503
	})
	t.Logf("/readyz during the outage: 503 %q", body)
	if !strings.HasPrefix(body, "not ready: broker: ") || !strings.Contains(body, wantReason) {
		t.Errorf("/readyz during the outage: %q, want the broker's reason (%s)", body, wantReason)
	}
	if strings.Contains(body, password) {
		t.Errorf("/readyz shows the password: %q", body)
	}
	if code, _ := httpGet(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz during the outage: %d, want 200 (the process is alive)", code)
	}
	up()
	eventuallyCLI(t, "/readyz recovers", func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == 200
	})
	r := cli(t, bc, "send", "-Q", q, "--wait", "tasks.add", "20", "22")
	if r.code != 0 || !strings.Contains(r.stdout, `"result":42`) {
		t.Errorf("a task after the outage:\n%s", r)
	}
	stopWorkerProc(t, p)
	if strings.Contains(p.Log(), password) {
		t.Errorf("the broker password is in the worker's log:\n%s", p.Log())
	}
	if !strings.Contains(p.Log(), ":xxx@") {
		t.Errorf("the worker's log never shows the redacted broker URL:\n%s", p.Log())
	}
}

// TestCLIReadyzRedis: /readyz follows a Redis broker (a redis-server of the
// test's own, with a password) going away and coming back, and the
// password appears neither in the log nor in the probe.
func TestCLIReadyzRedis(t *testing.T) {
	srv := startOwnRedis(t, "it-cli-pw-"+cliRand(), nil)
	bc := brokerCase{"own-redis", srv.URL(0), srv.URL(1)}
	q := cliQueue(t, bc)
	p := startWorkerProc(t, bc, "-Q", q, "-n", "it-cli-ready-"+cliRand()+"@celeriac",
		"--metrics-addr", "127.0.0.1:0", "--log-format", "json", "-l", "debug")
	checkReadyz(t, bc, p, q, srv.password, srv.stop, srv.start, "connection refused")
}

// TestCLIReadyzRabbitMQ: the same through a proxy to RabbitMQ that the
// test breaks, with a user of the test's own whose password must not
// appear.
func TestCLIReadyzRabbitMQ(t *testing.T) {
	broker := amqpURL(t)
	user, password := "it_cli_"+cliRand(), "it-cli-pw-"+cliRand()
	rabbitmqctl(t, "add_user", user, password)
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "delete_user", user).Run() })
	rabbitmqctl(t, "set_permissions", "-p", "/", user, ".*", ".*", ".*")
	host := strings.TrimSuffix(strings.SplitN(strings.SplitN(broker, "@", 2)[1], "/", 2)[0], "/")
	proxy := startProxy(t, host)
	bc := brokerCase{"rabbitmq-proxy", fmt.Sprintf("amqp://%s:%s@%s//", user, password, proxy.addr()), redisDBURL(t, cliRedisDB)}
	q := cliQueue(t, bc)
	p := startWorkerProc(t, bc, "-Q", q, "-n", "it-cli-ready-"+cliRand()+"@celeriac",
		"--metrics-addr", "127.0.0.1:0", "--log-format", "json", "-l", "debug")
	checkReadyz(t, bc, p, q, password, func() { proxy.outage(true) }, func() { proxy.outage(false) }, "connection down, reconnecting")
}

func rabbitmqctl(t *testing.T, args ...string) {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		unavailable(t, "rabbitmqctl not installed")
	}
	if out, err := exec.Command("rabbitmqctl", args...).CombinedOutput(); err != nil {
		t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
	}
}

// TestCLILogsRedacted: on both brokers, with a password of the test's own,
// the password appears nowhere in a debug-level worker log nor in the
// output of the client commands, whatever they log.
func TestCLILogsRedacted(t *testing.T) {
	srv := startOwnRedis(t, "it-cli-pw-"+cliRand(), nil)
	user, password := "it_cli_"+cliRand(), "it-cli-pw-"+cliRand()
	rabbitmqctl(t, "add_user", user, password)
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "delete_user", user).Run() })
	rabbitmqctl(t, "set_permissions", "-p", "/", user, ".*", ".*", ".*")
	broker := amqpURL(t)
	host := strings.SplitN(strings.SplitN(broker, "@", 2)[1], "/", 2)[0]
	for _, c := range []struct {
		bc       brokerCase
		password string
	}{
		{brokerCase{"redis", srv.URL(0), srv.URL(1)}, srv.password},
		{brokerCase{"rabbitmq", fmt.Sprintf("amqp://%s:%s@%s//", user, password, host), srv.URL(1)}, password},
	} {
		t.Run(c.bc.name, func(t *testing.T) {
			bc := c.bc
			q := cliQueue(t, bc)
			node := "it-cli-logs-" + cliRand() + "@celeriac"
			p := startWorkerProc(t, bc, "-Q", q, "-n", node, "-l", "debug", "-E")
			var outputs []cliResult
			for _, args := range [][]string{
				{"-l", "debug", "send", "-Q", q, "--wait", "tasks.add", "1", "2"},
				{"-l", "debug", "send", "-Q", q, "--wait", "tasks.fail", "x"},
				{"-l", "debug", "send", "-Q", q, "--wait", "tasks.nope"},
				{"-l", "debug", "inspect", "stats", "-d", node},
				{"-l", "debug", "--log-format", "json", "inspect", "active_queues", "-d", node, "--json"},
				{"-l", "debug", "purge", "-Q", q, "-f"},
				{"-l", "debug", "dlq", "list", q},
				{"-l", "debug", "control", "shutdown", "-d", node},
			} {
				outputs = append(outputs, cli(t, bc, args...))
			}
			select {
			case <-p.done:
			case <-time.After(cliWait):
				t.Fatalf("worker still running after shutdown:\n%s", p.Log())
			}
			if strings.Contains(p.Log(), c.password) {
				t.Errorf("the password is in the worker's log:\n%s", p.Log())
			}
			if !strings.Contains(p.Log(), ":xxx@") {
				t.Errorf("the worker's log never names the broker:\n%s", p.Log())
			}
			for _, r := range outputs {
				if strings.Contains(r.stdout+r.stderr, c.password) {
					t.Errorf("the password is in the output of %s", r)
				}
			}
		})
	}
}
