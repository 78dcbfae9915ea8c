package integration

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/protocol"
)

// cliFleet is a celeriac worker and a Python Celery worker sharing a queue,
// each also consuming a queue of its own that the test adds at run time.
type cliFleet struct {
	bc             brokerCase
	q              string // shared queue
	goQ, pyQ       string // each worker's own queue (add_consumer)
	goNode, pyNode string
	pattern        string // selects both nodes and no other
	goProc         *workerProc
	py             *pyWorker
}

func startFleet(t *testing.T, bc brokerCase) *cliFleet {
	t.Helper()
	r := cliRand()
	f := &cliFleet{bc: bc, q: cliQueue(t, bc), goQ: cliQueue(t, bc), pyQ: cliQueue(t, bc),
		goNode: "it-cli-go-" + r + "@celeriac", pyNode: "it-cli-py-" + r + "@celeriac",
		pattern: "it-cli-*-" + r + "@celeriac"}
	f.goProc = startWorkerProc(t, bc, "-Q", f.q, "-n", f.goNode, "-c", "2", "--log-format", "json", "-l", "debug")
	env := map[string]string{"IT_BROKER": bc.broker, "IT_BACKEND": bc.backend, "IT_QUEUE": f.q}
	f.py = startPythonWorker(t, env, "it_cli_app", "-Q", f.q, "-n", f.pyNode, "-c", "2",
		"--without-mingle")
	// Both answer before the test starts (the Go worker's pidbox is
	// subscribed asynchronously).
	eventuallyCLI(t, "both workers answer a ping", func() bool {
		r := cli(t, bc, "inspect", "ping", "--pattern", f.pattern, "--json")
		return r.code == 0 && strings.Contains(r.stdout, f.goNode) && strings.Contains(r.stdout, f.pyNode)
	})
	return f
}

// both runs an inspect/control command against both workers with --json
// and returns the replies by node.
func (f *cliFleet) both(t *testing.T, args ...string) map[string]any {
	t.Helper()
	v := cliJSON(t, f.bc, append(args, "--pattern", f.pattern)...)
	out := map[string]any{}
	switch v := v.(type) {
	case map[string]any: // inspect
		out = v
	case []any: // control
		for _, e := range v {
			for k, r := range e.(map[string]any) {
				out[k] = r
			}
		}
	}
	_, hasGo := out[f.goNode]
	_, hasPy := out[f.pyNode]
	if len(out) != 2 || !hasGo || !hasPy {
		t.Fatalf("celeriac %v: replies from %v, want %s and %s", args, keysOf(out), f.goNode, f.pyNode)
	}
	return out
}

// wantBoth checks that both workers replied want.
func (f *cliFleet) wantBoth(t *testing.T, want any, args ...string) {
	t.Helper()
	got := f.both(t, args...)
	for _, n := range []string{f.goNode, f.pyNode} {
		if !cmp.Equal(got[n], want) {
			t.Errorf("celeriac %v: %s replied %#v, want %#v", args, n, got[n], want)
		}
	}
}

func keysOf(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func queueNames(t *testing.T, v any) []string {
	t.Helper()
	var names []string
	for _, q := range v.([]any) {
		names = append(names, q.(map[string]any)["name"].(string))
	}
	sort.Strings(names)
	return names
}

func okReply(s string) map[string]any { return map[string]any{"ok": s} }

// TestCLIInspectControl: `celeriac inspect` and `celeriac control` against
// a Python Celery worker and a celeriac worker at once, on Redis and
// RabbitMQ: the same commands get the answers Celery's tools get, and
// the control commands take effect on both kinds of worker.
func TestCLIInspectControl(t *testing.T) {
	eachCLIBroker(t, func(t *testing.T, bc brokerCase) {
		f := startFleet(t, bc)

		// ping, status, destination and pattern selection.
		r := mustCLI(t, bc, "inspect", "ping", "--pattern", f.pattern)
		for _, n := range []string{f.goNode, f.pyNode} {
			if !strings.Contains(r.stdout, "->  "+n+": OK\n        pong\n") {
				t.Errorf("inspect ping lacks %s's pong:\n%s", n, r.stdout)
			}
		}
		if !strings.HasSuffix(r.stdout, "\n2 nodes online.\n") {
			t.Errorf("inspect ping:\n%s", r.stdout)
		}
		r = mustCLI(t, bc, "inspect", "ping", "-d", f.pyNode)
		if r.stdout != "->  "+f.pyNode+": OK\n        pong\n\n1 node online.\n" {
			t.Errorf("inspect ping -d %s:\n%s", f.pyNode, r.stdout)
		}
		r = mustCLI(t, bc, "status", "-d", f.goNode+","+f.pyNode)
		if want := "->  " + f.goNode + ": OK\n->  " + f.pyNode + ": OK\n\n2 nodes online.\n"; r.stdout != want {
			t.Errorf("status:\n%s\nwant:\n%s", r.stdout, want)
		}
		if v := cliJSON(t, bc, "inspect", "ping", "--pattern", "it-cli-go-.*", "--matcher", "pcre"); !hasNode(v, f.goNode) || hasNode(v, f.pyNode) {
			t.Errorf("pcre pattern selected %v", v)
		}
		f.wantBoth(t, okReply("pong"), "inspect", "ping")

		// registered: Celery's "name [rate_limit=...]" form on both.
		reg := f.both(t, "inspect", "registered")
		for n, want := range map[string]string{f.goNode: "tasks.wordcount", f.pyNode: "tasks.mul [rate_limit=600/m]"} {
			if !slices.Contains(reg[n].([]any), any(want)) || !slices.Contains(reg[n].([]any), any("tasks.add")) {
				t.Errorf("registered of %s = %v, want tasks.add and %q", n, reg[n], want)
			}
		}

		// add_consumer / active_queues / cancel_consumer.
		if got := cliJSON(t, bc, "control", "add_consumer", f.goQ, "-d", f.goNode); !cmp.Equal(got, []any{map[string]any{f.goNode: okReply("add consumer " + f.goQ)}}) {
			t.Errorf("add_consumer on the Go worker: %v", got)
		}
		if got := cliJSON(t, bc, "control", "add_consumer", f.pyQ, "-d", f.pyNode); !cmp.Equal(got, []any{map[string]any{f.pyNode: okReply("add consumer " + f.pyQ)}}) {
			t.Errorf("add_consumer on the Python worker: %v", got)
		}
		var aq map[string]any
		eventuallyCLI(t, "both consume their own queue", func() bool {
			aq = f.both(t, "inspect", "active_queues")
			return slices.Contains(queueNames(t, aq[f.pyNode]), f.pyQ)
		})
		for n, want := range map[string][]string{f.goNode: sorted(f.q, f.goQ), f.pyNode: sorted(f.q, f.pyQ)} {
			if got := queueNames(t, aq[n]); !cmp.Equal(got, want) {
				t.Errorf("active_queues of %s = %v, want %v", n, got, want)
			}
		}
		goQueue := firstQueue(aq[f.goNode], f.goQ)
		pyQueue := firstQueue(aq[f.pyNode], f.pyQ)
		for _, k := range []string{"name", "routing_key", "durable", "exclusive", "auto_delete", "no_ack", "exchange"} {
			if k != "name" && k != "routing_key" && k != "exchange" && !cmp.Equal(goQueue[k], pyQueue[k]) {
				t.Errorf("active_queues %s: Go %v, Python %v", k, goQueue[k], pyQueue[k])
			}
		}

		// active and query_task: a sleeping task on each worker's own queue.
		goSleep := sendID(t, bc, "-Q", f.goQ, "tasks.sleep", "30")
		pySleep := sendID(t, bc, "-Q", f.pyQ, "tasks.sleep", "30")
		eventuallyCLI(t, "both sleeping tasks active", func() bool {
			act := f.both(t, "inspect", "active")
			return activeID(act[f.goNode]) == goSleep && activeID(act[f.pyNode]) == pySleep
		})
		act := f.both(t, "inspect", "active")
		for n, id := range map[string]string{f.goNode: goSleep, f.pyNode: pySleep} {
			info := act[n].([]any)[0].(map[string]any)
			if info["name"] != "tasks.sleep" || info["hostname"] != n || !cmp.Equal(info["args"], []any{30.0}) {
				t.Errorf("active of %s: %v", n, info)
			}
			di, _ := info["delivery_info"].(map[string]any)
			if di == nil || di["routing_key"] != map[string]string{f.goNode: f.goQ, f.pyNode: f.pyQ}[n] {
				t.Errorf("active delivery_info of %s: %v", n, info["delivery_info"])
			}
			qt := cliJSON(t, bc, "inspect", "query_task", id, "-d", n).(map[string]any)[n].(map[string]any)
			if st, _ := qt[id].([]any); len(st) != 2 || st[0] != "active" {
				t.Errorf("query_task %s on %s: %v", id, n, qt)
			}
		}
		stats := f.both(t, "inspect", "stats")
		for _, n := range []string{f.goNode, f.pyNode} {
			s := stats[n].(map[string]any)
			pool, _ := s["pool"].(map[string]any)
			if pool["max-concurrency"] != 2.0 || s["pid"] == nil || s["prefetch_count"] == nil {
				t.Errorf("stats of %s: pool %v, pid %v, prefetch_count %v", n, pool, s["pid"], s["prefetch_count"])
			}
			if tr := s["broker"].(map[string]any)["transport"]; tr != map[string]string{"redis": "redis", "rabbitmq": "amqp"}[bc.name] {
				t.Errorf("stats broker.transport of %s = %v", n, tr)
			}
		}

		// revoke --terminate stops the running tasks on both.
		got := f.both(t, "control", "revoke", goSleep, pySleep, "--terminate", "--signal", "SIGKILL")
		if !cmp.Equal(got[f.goNode], okReply("terminate: "+goSleep)) || !cmp.Equal(got[f.pyNode], okReply("terminate: "+pySleep)) {
			t.Errorf("revoke --terminate: %v", got)
		}
		for _, id := range []string{goSleep, pySleep} {
			if m := cliResultOf(t, bc, id); m.Status != protocol.StateRevoked {
				t.Errorf("terminated task %s: %s %v", id, m.Status, m.Result)
			}
		}

		// revoke before a countdown expires: never run, REVOKED (Python
		// records it when the countdown is due, celeriac at once). The
		// countdown leaves room for slow CLI round trips before the revoke.
		goLater := sendID(t, bc, "-Q", f.goQ, "--countdown", "8", "tasks.add", "1", "2")
		pyLater := sendID(t, bc, "-Q", f.pyQ, "--countdown", "8", "tasks.add", "1", "2")
		eventuallyCLI(t, "both countdown tasks scheduled", func() bool {
			s := f.both(t, "inspect", "scheduled")
			return scheduledID(s[f.goNode]) == goLater && scheduledID(s[f.pyNode]) == pyLater
		})
		got = f.both(t, "control", "revoke", goLater, pyLater)
		for _, n := range []string{f.goNode, f.pyNode} {
			msg, _ := got[n].(map[string]any)["ok"].(string)
			if !strings.HasPrefix(msg, "tasks ") || !strings.Contains(msg, goLater) || !strings.Contains(msg, pyLater) || !strings.HasSuffix(msg, " flagged as revoked") {
				t.Errorf("revoke reply of %s: %v", n, got[n])
			}
		}
		for _, id := range []string{goLater, pyLater} {
			if m := cliResultOf(t, bc, id); m.Status != protocol.StateRevoked {
				t.Errorf("revoked countdown task %s: %s %v", id, m.Status, m.Result)
			}
		}
		rv := f.both(t, "inspect", "revoked")
		for _, n := range []string{f.goNode, f.pyNode} {
			for _, id := range []string{goSleep, pySleep, goLater, pyLater} {
				if !slices.Contains(rv[n].([]any), any(id)) {
					t.Errorf("inspect revoked of %s lacks %s: %v", n, id, rv[n])
				}
			}
		}

		// rate_limit and time_limit, seen in registered and replies.
		f.wantBoth(t, okReply("new rate limit set successfully"), "control", "rate_limit", "tasks.add", "7/m")
		reg = f.both(t, "inspect", "registered")
		for _, n := range []string{f.goNode, f.pyNode} {
			if !slices.Contains(reg[n].([]any), any("tasks.add [rate_limit=7/m]")) {
				t.Errorf("registered of %s after rate_limit: %v", n, reg[n])
			}
		}
		// "0" disables; Celery's reply to the string "0" still says "set".
		f.wantBoth(t, okReply("new rate limit set successfully"), "control", "rate_limit", "tasks.add", "0")
		reg = f.both(t, "inspect", "registered")
		for _, n := range []string{f.goNode, f.pyNode} {
			if !slices.Contains(reg[n].([]any), any("tasks.add [rate_limit=0]")) {
				t.Errorf("registered of %s after rate_limit 0: %v", n, reg[n])
			}
		}
		f.wantBoth(t, map[string]any{"error": "unknown task"}, "control", "rate_limit", "tasks.nope", "1/s")
		f.wantBoth(t, okReply("time limits set successfully"), "control", "time_limit", "tasks.sleep", "10", "20")

		// events switched at run time; heartbeat answered with null.
		f.wantBoth(t, okReply("task events enabled"), "control", "enable_events")
		f.wantBoth(t, okReply("task events disabled"), "control", "disable_events")
		f.wantBoth(t, nil, "control", "heartbeat")

		// cancel_consumer: the queue is no longer consumed; tasks sent to it
		// stay there.
		f.wantBoth(t, okReply("no longer consuming from "+f.goQ), "control", "cancel_consumer", f.goQ)
		aq = f.both(t, "inspect", "active_queues")
		if got := queueNames(t, aq[f.goNode]); !cmp.Equal(got, []string{f.q}) {
			t.Errorf("active_queues of the Go worker after cancel_consumer: %v", got)
		}
		sendID(t, bc, "-Q", f.goQ, "tasks.add", "1", "1")
		if n := readyMessages(t, bc, f.goQ); n != 1 {
			t.Errorf("%d messages in the cancelled queue, want 1 (left alone)", n)
		}

		// Unknown commands on the worker side: Celery's KeyError reply,
		// shown as ERROR.
		r = mustCLI(t, bc, "inspect", "memsample", "-d", f.goNode)
		if !strings.Contains(r.stdout, "->  "+f.goNode+": ERROR\n") {
			t.Errorf("memsample on the Go worker:\n%s", r.stdout)
		}

		// shutdown: both stop; the Go worker exits 0 after a warm shutdown.
		r = mustCLI(t, bc, "control", "shutdown", "-d", f.goNode+","+f.pyNode)
		if r.stdout != "-> shutdown sent\n" {
			t.Errorf("control shutdown:\n%s", r.stdout)
		}
		select {
		case <-f.goProc.done:
			if f.goProc.err != nil {
				t.Errorf("celeriac worker exit after shutdown: %v", f.goProc.err)
			}
		case <-time.After(cliWait):
			t.Fatalf("celeriac worker still running after shutdown:\n%s", f.goProc.Log())
		}
		if !strings.Contains(f.goProc.Log(), `"msg":"celeriac worker stopped"`) {
			t.Errorf("no clean stop in the worker log:\n%s", f.goProc.Log())
		}
		select {
		case <-f.py.done:
		case <-time.After(cliWait):
			t.Fatalf("python worker still running after shutdown:\n%s", f.py.Log())
		}
		r = cli(t, bc, "inspect", "ping", "--pattern", f.pattern, "-t", "0.5")
		if r.code != 3 || !strings.Contains(r.stderr, "No nodes replied within time constraint") {
			t.Errorf("ping after shutdown:\n%s", r)
		}
	})
}

// TestCLIMatchesCeleryOutput: for the same worker, `celeriac inspect` and
// `celery inspect` print the same text, and agree on exit status when
// nobody answers.
func TestCLIMatchesCeleryOutput(t *testing.T) {
	eachCLIBroker(t, func(t *testing.T, bc brokerCase) {
		f := startFleet(t, bc)
		env := map[string]string{"IT_BROKER": bc.broker, "IT_BACKEND": bc.backend, "IT_QUEUE": f.q}
		celery := func(args ...string) (string, int) {
			out := runPython(t, cliWait, env, `
import subprocess, sys
r = subprocess.run([sys.executable, "-m", "celery", "-A", "it_cli_app"] + sys.argv[1:], capture_output=True, text=True)
print(r.stdout, end="")
print("EXIT", r.returncode)
`, args...)
			i := strings.LastIndex(out, "EXIT ")
			var code int
			fmt.Sscan(out[i+5:], &code)
			return out[:i], code
		}
		for _, node := range []string{f.goNode, f.pyNode} {
			for _, tc := range []struct {
				args []string
				// undo, run with celery after it, puts the worker back in
				// the state celery found it in, for celeriac's turn.
				undo []string
			}{
				{args: []string{"inspect", "ping", "-d", node}},
				{args: []string{"inspect", "registered", "-d", node}},
				{args: []string{"inspect", "revoked", "-d", node}},
				{args: []string{"inspect", "query_task", "nosuchid", "-d", node}},
				{args: []string{"control", "rate_limit", "tasks.add", "5/s", "-d", node}},
				{args: []string{"control", "rate_limit", "tasks.nope", "5/s", "-d", node}},
				{args: []string{"control", "time_limit", "tasks.add", "5", "10", "-d", node}},
				{args: []string{"control", "enable_events", "-d", node}, undo: []string{"control", "disable_events", "-d", node}},
				{args: []string{"control", "disable_events", "-d", node}, undo: []string{"control", "enable_events", "-d", node}},
				{args: []string{"control", "heartbeat", "-d", node}},
				{args: []string{"inspect", "ping", "-d", node, "--json"}},
				{args: []string{"control", "rate_limit", "tasks.add", "0", "-d", node, "--json"}},
			} {
				args := tc.args
				want, code := celery(args...)
				if code != 0 {
					t.Fatalf("celery %v: exit %d\n%s", args, code, want)
				}
				if tc.undo != nil {
					if out, code := celery(tc.undo...); code != 0 {
						t.Fatalf("celery %v: exit %d\n%s", tc.undo, code, out)
					}
				}
				got := mustCLI(t, bc, args...).stdout
				if normalizeJSON(got) != normalizeJSON(want) {
					t.Errorf("%v on %s:\ncelery prints:\n%s\nceleriac prints:\n%s", args, node, want, got)
				}
			}
		}
		want, code := celery("inspect", "ping", "-d", "it-cli-nobody@x", "-t", "0.3")
		r := cli(t, bc, "inspect", "ping", "-d", "it-cli-nobody@x", "-t", "0.3")
		if code == 0 || r.code == 0 || want != "" || r.stdout != "" || !strings.Contains(r.stderr, "No nodes replied within time constraint") {
			t.Errorf("nobody answering: celery exit %d %q; celeriac:\n%s", code, want, r)
		}
	})
}

// normalizeJSON makes one-line JSON outputs comparable: kombu's dumps puts
// a space after ':' and ','.
func normalizeJSON(s string) string {
	if strings.HasPrefix(s, "{") || strings.HasPrefix(s, "[") {
		return strings.NewReplacer(": ", ":", ", ", ",").Replace(s)
	}
	return s
}

func hasNode(v any, node string) bool {
	m, _ := v.(map[string]any)
	_, ok := m[node]
	return ok
}

func sorted(s ...string) []string {
	sort.Strings(s)
	return s
}

func firstQueue(v any, name string) map[string]any {
	for _, q := range v.([]any) {
		if m := q.(map[string]any); m["name"] == name {
			return m
		}
	}
	return nil
}

func activeID(v any) string {
	list, _ := v.([]any)
	if len(list) != 1 {
		return ""
	}
	id, _ := list[0].(map[string]any)["id"].(string)
	return id
}

func scheduledID(v any) string {
	list, _ := v.([]any)
	if len(list) != 1 {
		return ""
	}
	req, _ := list[0].(map[string]any)["request"].(map[string]any)
	id, _ := req["id"].(string)
	return id
}
