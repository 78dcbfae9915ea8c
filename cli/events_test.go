package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/celeriac/celeriac/protocol"
)

// TestEvdumpFormat: events print as Celery's evdump prints them
// (celery/events/dumper.py): host, UTC time, the type in words, a task's
// name, id and arguments from its task-received, the other fields sorted.
func TestEvdumpFormat(t *testing.T) {
	var b strings.Builder
	d := &evdump{w: &b, names: map[string]string{}}
	msg := func(body string) protocol.Message {
		return protocol.Message{ContentType: "application/json", Body: []byte(body)}
	}
	d.message(msg(`{"type": "worker-online", "hostname": "celery@h", "timestamp": 1700000000.5, "freq": 2.0, "sw_ident": "py-celery"}`))
	d.message(msg(`[{"type": "task-received", "hostname": "celery@h", "timestamp": 1700000001, "uuid": "id1", "name": "tasks.add", "args": "(2, 3)", "kwargs": "{}", "retries": 0},
		{"type": "task-succeeded", "hostname": "celery@h", "timestamp": 1700000001.25, "uuid": "id1", "result": "5", "runtime": 0.01}]`))
	d.message(msg(`{"type": "worker-offline", "hostname": "celery@h", "timestamp": "soon"}`))
	d.message(msg(`{not json`))
	want := []string{
		"celery@h [2023-11-14 22:13:20.500000] worker online: freq=2.0, sw_ident=py-celery",
		"celery@h [2023-11-14 22:13:21.000000] task received: tasks.add(id1) args=(2, 3) kwargs={} retries=0",
		"celery@h [2023-11-14 22:13:21.250000] task succeeded: tasks.add(id1) args=(2, 3) kwargs={} result=5, runtime=0.01",
		"celery@h [?] worker offline ",
		"?? undecodable event",
	}
	got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(got), len(want), b.String())
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("line %d:\n got %q\nwant %q", i, got[i], want[i])
		}
	}
}

// TestEventsDump: celeriac events --dump prints a worker's online event and
// its task events (-E) on both brokers.
func TestEventsDump(t *testing.T) {
	eachBroker(t, func(t *testing.T, bc brokerCase) {
		ctx, cancel := context.WithCancel(t.Context())
		var out, errb syncBuffer
		done := make(chan int, 1)
		go func() { done <- run(ctx, []string{"-b", bc.broker, "events", "--dump"}, &out, &errb) }()
		defer func() { cancel(); <-done }()
		waitFor(t, func() bool { return strings.Contains(out.String(), "-> evdump: starting capture...") })
		q := uniqueQueue(t, bc)
		node := "cli-ev-" + q + "@test"
		goWorker(t, bc, q, node, "-E")
		if r := celeriac(t, "-b", bc.broker, "--result-backend", bc.backend, "send", "-Q", q, "tasks.add", "2", "3", "--wait"); r.code != exitOK {
			t.Fatalf("send: %s", r)
		}
		waitFor(t, func() bool {
			s := out.String()
			return strings.Contains(s, node+" [") && strings.Contains(s, "worker online") &&
				strings.Contains(s, "task succeeded: tasks.add(") && strings.Contains(s, "result=5")
		})
		if s := errb.String(); strings.Contains(s, "INFO") {
			t.Errorf("events is not quiet:\n%s", s)
		}
	})
}
