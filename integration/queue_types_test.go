package integration

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestQueueTypesMixedFleet: a celeriac worker and a Python worker, started
// with the same Celery settings and the same -Q, declare the same queues
// and exchanges, so that both start whichever comes first. celeriac starts
// first: a declaration of its that differs from Celery's (a quorum queue
// Celery creates classic, a topic exchange Celery creates direct) makes
// RabbitMQ refuse the Python worker's (PRECONDITION_FAILED), and it never
// gets ready. Celery gives task_default_queue_type and
// task_default_exchange_type to the default queue only; a queue that -Q
// adds is created "missing" (classic, direct), or in Celery 5.6 as
// task_create_missing_queue_type and task_create_missing_queue_exchange_type
// say (celery/celery#9815).
func TestQueueTypesMixedFleet(t *testing.T) {
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		unavailable(t, "rabbitmqctl not found: the test reads the declared queue types with it")
	}
	broker := amqpURL(t)
	cases := []struct {
		name, minCelery string
		conf            map[string]any
		// want: queue -> "type exchange-type"
		wantDefault, wantMissing string
	}{
		{name: "topic default exchange", minCelery: "5.2",
			conf:        map[string]any{"task_default_exchange_type": "topic"},
			wantDefault: "classic topic", wantMissing: "classic direct"},
		{name: "5.5 quorum default", minCelery: "5.5",
			conf:        map[string]any{"task_default_queue_type": "quorum", "task_default_exchange_type": "topic"},
			wantDefault: "quorum topic", wantMissing: "classic direct"},
		{name: "5.6 missing queue type", minCelery: "5.6",
			conf: map[string]any{"task_default_queue_type": "quorum", "task_default_exchange_type": "topic",
				"task_create_missing_queue_type": "quorum", "task_create_missing_queue_exchange_type": "topic"},
			wantDefault: "quorum topic", wantMissing: "quorum topic"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			requireCeleryAtLeast(t, tc.minCelery, "the settings of the case")
			stamp := fmt.Sprintf("%d-%d", time.Now().UnixNano(), i)
			def, missing := "it_qtypes_default_"+stamp, "it_qtypes_missing_"+stamp
			conf := map[string]any{"task_default_queue": def}
			for k, v := range tc.conf {
				conf[k] = v
			}
			deleteAMQP(t, def, missing) // queues and exchanges, at the end
			raw, _ := json.Marshal(conf)
			file := filepath.Join(t.TempDir(), "celeryconfig.json")
			if err := os.WriteFile(file, raw, 0o600); err != nil {
				t.Fatal(err)
			}
			queues := def + "," + missing
			startProc(t, "celeriac worker", "./cmd/celeriac", procOptions{},
				"worker", "--broker", broker, "--config", file, "-Q", queues,
				"-n", "qtypes-go-"+stamp+"@%h", "--without-heartbeat", "--without-mingle", "--without-gossip")
			startPythonWorker(t, map[string]string{"IT_BROKER": broker, "IT_CONF": string(raw)}, "it_qtypes_app",
				"-Q", queues, "-n", "qtypes-py-"+stamp+"@%h", "-c", "1", "-P", "solo",
				"--without-heartbeat", "--without-mingle", "--without-gossip")
			got := declaredTypes(t, broker)
			if g := got[def]; g != tc.wantDefault {
				t.Errorf("default queue %s declared %q, want %q", def, g, tc.wantDefault)
			}
			if g := got[missing]; g != tc.wantMissing {
				t.Errorf("missing queue %s declared %q, want %q", missing, g, tc.wantMissing)
			}
			// Both consume both queues.
			for _, q := range []string{def, missing} {
				if n := queueConsumers(t, broker, q); n != 2 {
					t.Errorf("queue %s has %d consumers, want 2 (celeriac and Python)", q, n)
				}
			}
		})
	}
}

// amqpVhost is the virtual host of an AMQP URL, as rabbitmqctl -p takes it.
func amqpVhost(t *testing.T, broker string) string {
	u, err := url.Parse(broker)
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimPrefix(u.Path, "/")
	if v == "" {
		return "/"
	}
	if uv, err := url.PathUnescape(v); err == nil {
		return uv
	}
	return v
}

// ownVhost creates the virtual host name on broker's RabbitMQ, lets
// broker's user use it, deletes it when the test ends, and returns broker's
// URL on it.
func ownVhost(t *testing.T, broker, name string) string {
	t.Helper()
	u, err := url.Parse(broker)
	if err != nil {
		t.Fatal(err)
	}
	rabbitmqctl(t, "add_vhost", name)
	t.Cleanup(func() {
		if out, err := exec.Command("rabbitmqctl", "delete_vhost", name).CombinedOutput(); err != nil {
			t.Logf("rabbitmqctl delete_vhost %s: %v\n%s", name, err, out)
		}
	})
	rabbitmqctl(t, "set_permissions", "-p", name, u.User.Username(), ".*", ".*", ".*")
	u.Path, u.RawPath = "/"+name, ""
	return u.String()
}

// declaredTypes reads every queue's type and the type of the exchange of
// the same name ("quorum topic"), as the broker holds them.
func declaredTypes(t *testing.T, broker string) map[string]string {
	t.Helper()
	vhost := amqpVhost(t, broker)
	var queues []struct{ Name, Type string }
	rabbitJSON(t, &queues, "list_queues", "-p", vhost, "name", "type")
	var exchanges []struct{ Name, Type string }
	rabbitJSON(t, &exchanges, "list_exchanges", "-p", vhost, "name", "type")
	ex := map[string]string{}
	for _, e := range exchanges {
		ex[e.Name] = e.Type
	}
	out := map[string]string{}
	for _, q := range queues {
		out[q.Name] = q.Type + " " + ex[q.Name]
	}
	return out
}

func queueConsumers(t *testing.T, broker, queue string) int {
	t.Helper()
	var queues []struct {
		Name      string
		Consumers int
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		rabbitJSON(t, &queues, "list_queues", "-p", amqpVhost(t, broker), "name", "consumers")
		for _, q := range queues {
			if q.Name == queue && (q.Consumers >= 2 || time.Now().After(deadline)) {
				return q.Consumers
			}
		}
		if time.Now().After(deadline) {
			return 0
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func rabbitJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", append([]string{"-q", "--formatter", "json"}, args...)...).Output()
	if err != nil {
		t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
	}
}
