package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// goWorker starts `celeriac worker` in-process on a queue of its own, with
// JSON logs at debug level, and waits until it is ready.
func goWorker(t *testing.T, bc brokerCase, q, node string, extra ...string) *bgWorker {
	t.Helper()
	args := append([]string{"-b", bc.broker, "--result-backend", bc.backend, "-Q", q, "-n", node, "-c", "2",
		"--log-format", "json", "-l", "debug"}, extra...)
	w := startWorker(t, args...)
	w.waitLog(t, `"msg":"worker ready"`)
	return w
}

// sendLines splits send's output: the task id, then (with --wait) the
// result document.
func sendLines(t *testing.T, r result) (id string, doc map[string]any) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	id = lines[0]
	if len(lines) > 1 {
		if err := json.Unmarshal([]byte(lines[1]), &doc); err != nil {
			t.Fatalf("result line %q: %v", lines[1], err)
		}
	}
	return id, doc
}

// TestSendWait: send --wait prints the id and the result and exits 0 on
// success; a failure prints the exception and exits 1, and so does a
// result that does not come.
func TestSendWait(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		goWorker(t, bc, q, "cli-send-"+q+"@test")
		base := []string{"-b", bc.broker, "--result-backend", bc.backend, "send", "-Q", q, "--wait"}
		send := func(args ...string) result { return celeriac(t, append(base, args...)...) }

		r := send("tasks.add", "2", "3")
		id, doc := sendLines(t, r)
		if r.code != exitOK || !cmp.Equal(doc, map[string]any{"task_id": id, "status": "SUCCESS", "result": 5.0}) {
			t.Errorf("send tasks.add 2 3 --wait:\n%s", r)
		}

		r = send("tasks.echo", "--args", `["x", [1, 2], {"k": null}]`, "--kwargs", `{"n": 1.5}`, "--serializer", "msgpack", "--countdown", "0.2")
		_, doc = sendLines(t, r)
		want := map[string]any{"args": []any{"x", []any{1.0, 2.0}, map[string]any{"k": nil}}, "kwargs": map[string]any{"n": 1.5}}
		if r.code != exitOK || !cmp.Equal(doc["result"], any(want)) {
			t.Errorf("send tasks.echo --args --kwargs:\n%s", r)
		}

		r = send("tasks.fail", "boom")
		id, doc = sendLines(t, r)
		wantDoc := map[string]any{"task_id": id, "status": "FAILURE",
			"exception": map[string]any{"exc_type": "ValueError", "exc_module": "builtins", "exc_message": []any{"boom"}}}
		if r.code != exitError || !cmp.Equal(doc, wantDoc) || !strings.Contains(r.stderr, "task FAILURE: ValueError('boom')") {
			t.Errorf("send tasks.fail boom --wait:\n%s", r)
		}

		r = send("tasks.nope")
		_, doc = sendLines(t, r)
		if r.code != exitError || doc["status"] != "FAILURE" || !strings.Contains(r.stderr, "NotRegistered('tasks.nope')") {
			t.Errorf("send tasks.nope --wait:\n%s", r)
		}

		nobody := uniqueQueue(t, bc)
		r = celeriac(t, "-b", bc.broker, "--result-backend", bc.backend, "send", "-Q", nobody, "tasks.add", "1", "1", "--wait", "--timeout", "0.3")
		if r.code != exitError || !strings.Contains(r.stderr, "no result for task") || !strings.Contains(r.stderr, "within 300ms") {
			t.Errorf("send --wait to a queue nobody consumes:\n%s", r)
		}

		r = celeriac(t, "-b", bc.broker, "send", "-Q", q, "tasks.add", "1", "1", "--wait")
		if r.code != exitUsage || !strings.Contains(r.stderr, "--wait needs a result backend") || r.stdout != "" {
			t.Errorf("send --wait without a backend:\n%s", r)
		}
	})
}

// TestPurge: purge -Q --force deletes the ready messages of each queue and
// says how many.
func TestPurge(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q1, q2 := uniqueQueue(t, bc), uniqueQueue(t, bc)
		for i, q := range []string{q1, q1, q1, q2} {
			if r := celeriac(t, "-b", bc.broker, "send", "-Q", q, "tasks.add", "1", "2"); r.code != exitOK {
				t.Fatalf("send %d:\n%s", i, r)
			}
		}
		r := celeriac(t, "-b", bc.broker, "purge", "-Q", q1+", "+q2, "--force")
		want := "purged 3 message(s) from " + q1 + "\npurged 1 message(s) from " + q2 + "\n"
		if r.code != exitOK || r.stdout != want {
			t.Fatalf("purge:\n%s\nwant stdout %q", r, want)
		}
		r = celeriac(t, "-b", bc.broker, "purge", "-Q", q1, "-f")
		if r.code != exitOK || r.stdout != "purged 0 message(s) from "+q1+"\n" {
			t.Fatalf("second purge:\n%s", r)
		}
	})
}

// TestControlShutdownInProcess: status and inspect see the worker, and the
// shutdown command stops it cleanly (exit 0).
func TestControlShutdownInProcess(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		node := "cli-stop-" + q + "@test"
		w := goWorker(t, bc, q, node)
		r := celeriac(t, "-b", bc.broker, "status", "-d", node)
		if r.code != exitOK || r.stdout != "->  "+node+": OK\n\n1 node online.\n" {
			t.Fatalf("status:\n%s", r)
		}
		r = celeriac(t, "-b", bc.broker, "inspect", "ping", "-d", node, "--json")
		if r.code != exitOK || strings.TrimSpace(r.stdout) != `{"`+node+`":{"ok":"pong"}}` {
			t.Fatalf("inspect ping --json:\n%s", r)
		}
		r = celeriac(t, "-b", bc.broker, "control", "shutdown", "-d", node)
		if r.code != exitOK || r.stdout != "-> shutdown sent\n" {
			t.Fatalf("control shutdown:\n%s", r)
		}
		select {
		case code := <-w.done:
			w.cancel()
			w.cancel = nil
			w.code = code
			if code != exitOK {
				t.Fatalf("worker exit %d after shutdown:\n%s", code, w.logs.String())
			}
		case <-timeAfter(waitBound):
			t.Fatalf("worker still running after shutdown:\n%s", w.logs.String())
		}
		for _, want := range []string{`"msg":"remote shutdown requested"`, `"msg":"celeriac worker stopped"`} {
			if !strings.Contains(w.logs.String(), want) {
				t.Errorf("worker log lacks %s", want)
			}
		}
	})
}

// logEntry is one line of the worker's JSON log.
type logEntry map[string]any

func parseLog(t *testing.T, log string) []logEntry {
	t.Helper()
	var out []logEntry
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		var e logEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		out = append(out, e)
	}
	return out
}

// TestWorkerLogs: with --log-format json every line is a JSON object, each
// task line carries the task's id, name and retries, and the broker's
// password appears nowhere.
func TestWorkerLogs(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		q := uniqueQueue(t, bc)
		w := goWorker(t, bc, q, "cli-logs-"+q+"@test")
		base := []string{"-b", bc.broker, "--result-backend", bc.backend, "send", "-Q", q, "--wait"}
		ids := map[string]string{}
		for _, c := range [][]string{{"tasks.add", "1", "2"}, {"tasks.fail", "x"}, {"tasks.flaky", "1"}, {"tasks.nope"}} {
			r := celeriac(t, append(base, c...)...)
			id, _ := sendLines(t, r)
			ids[c[0]] = id
		}
		if code := w.Stop(t); code != exitOK {
			t.Fatalf("worker exit %d", code)
		}
		log := w.logs.String()
		if strings.Contains(log, "guest:guest") {
			t.Error("the AMQP password is in the log")
		}
		want := map[string]struct {
			task    string
			retries float64
		}{}
		for _, e := range parseLog(t, log) {
			msg, _ := e["msg"].(string)
			switch msg {
			case "task succeeded", "task failed", "task retry scheduled", "received unregistered task, dead-lettering it", "task started":
			default:
				continue
			}
			id, _ := e["task_id"].(string)
			name, _ := e["task_name"].(string)
			retries, hasRetries := e["retries"].(float64)
			if id == "" || name == "" || !hasRetries || e["level"] == nil || e["ts"] == nil {
				t.Errorf("task line without task_id/task_name/retries: %v", e)
				continue
			}
			if ids[name] != id {
				t.Errorf("task line %q: task_id %s, sent %s as %s", msg, id, ids[name], name)
			}
			want[msg+" "+name] = struct {
				task    string
				retries float64
			}{id, retries}
		}
		for _, k := range []struct {
			key     string
			retries float64
		}{
			{"task succeeded tasks.add", 0},
			{"task failed tasks.fail", 0},
			{"task retry scheduled tasks.flaky", 0},
			{"task succeeded tasks.flaky", 1},
			{"received unregistered task, dead-lettering it tasks.nope", 0},
		} {
			got, ok := want[k.key]
			if !ok || got.retries != k.retries {
				t.Errorf("no %q line with retries=%v (got %+v, ok=%v)", k.key, k.retries, got, ok)
			}
		}
		if t.Failed() {
			t.Logf("log:\n%s", log)
		}
	})
}

// TestWorkerLogLevel: --loglevel warning keeps info and debug lines out of
// a worker's log.
func TestWorkerLogLevel(t *testing.T) {
	bc := brokers(t)[0]
	q := uniqueQueue(t, bc)
	node := "cli-level-" + q + "@test"
	w := startWorker(t, "-b", bc.broker, "--result-backend", bc.backend, "-Q", q, "-n", node,
		"--log-format", "json", "--loglevel", "WARNING")
	// Readiness is not logged at this level: wait for the worker to answer.
	waitPong(t, bc, node)
	celeriac(t, "-b", bc.broker, "--result-backend", bc.backend, "send", "-Q", q, "--wait", "tasks.add", "1", "2")
	celeriac(t, "-b", bc.broker, "--result-backend", bc.backend, "send", "-Q", q, "--wait", "tasks.fail", "x")
	w.Stop(t)
	levels := map[string]int{}
	for _, e := range parseLog(t, w.logs.String()) {
		levels[e["level"].(string)]++
	}
	if levels["info"] != 0 || levels["debug"] != 0 || levels["error"] == 0 {
		t.Fatalf("levels logged at --loglevel WARNING: %v\n%s", levels, w.logs.String())
	}
}
