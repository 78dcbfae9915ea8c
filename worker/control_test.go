package worker_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/worker"
)

// controlClient speaks kombu's pidbox protocol like Python's app.control.
type controlClient struct {
	t     *testing.T
	h     *harness
	reply transport.Consumer
	key   string
}

func newControlClient(t *testing.T, h *harness) *controlClient {
	t.Helper()
	key := protocol.NewID()
	cons, err := h.tr.Consume(context.Background(), []transport.Queue{{
		Name: key + ".reply.celery.pidbox", Exchange: "reply.celery.pidbox", RoutingKey: key,
	}}, transport.ConsumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cons.Stop(context.Background()) })
	return &controlClient{t: t, h: h, reply: cons, key: key}
}

// call broadcasts a command and returns the first reply's value for the
// worker, or nil when none came within the timeout.
func (c *controlClient) call(method string, args map[string]any, destination ...string) any {
	c.t.Helper()
	var dest any
	if len(destination) > 0 {
		d := make([]any, len(destination))
		for i, s := range destination {
			d[i] = s
		}
		dest = d
	}
	v, _ := c.request(method, args, map[string]any{"destination": dest, "pattern": nil, "matcher": nil})
	return v
}

// request broadcasts a command with the given selection fields
// (destination, pattern, matcher) and reports whether the worker replied
// before the timeout, and with what.
func (c *controlClient) request(method string, args, selection map[string]any) (any, bool) {
	c.t.Helper()
	ticket := protocol.NewID()
	if args == nil {
		args = map[string]any{}
	}
	req := map[string]any{
		"method": method, "arguments": args,
		"ticket": ticket, "reply_to": map[string]any{"exchange": "reply.celery.pidbox", "routing_key": c.key},
	}
	for k, v := range selection {
		req[k] = v
	}
	body, err := protocol.Marshal(protocol.ContentTypeJSON, req)
	if err != nil {
		c.t.Fatal(err)
	}
	err = c.h.tr.Publish(context.Background(), &transport.Publishing{
		Exchange: "celery.pidbox", ExchangeType: transport.Fanout,
		Message: protocol.Message{ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
			Headers: map[string]any{"clock": int64(1), "expires": 0.0}, Body: body},
	})
	if err != nil {
		c.t.Fatal(err)
	}
	timeout := time.After(2 * time.Second)
	for {
		select {
		case d := <-c.reply.Deliveries():
			_ = d.Ack(context.Background())
			if d.Message.Headers["ticket"] != ticket {
				continue
			}
			v, err := protocol.Unmarshal(d.Message.ContentType, d.Message.Body, protocol.DecodeOptions{})
			if err != nil {
				c.t.Fatal(err)
			}
			r, ok := v.(map[string]any)[c.h.w.Hostname()]
			return r, ok
		case <-timeout:
			return nil, false
		}
	}
}

func startControlled(t *testing.T) (*harness, *controlClient) {
	h := newHarness(t, worker.Config{Hostname: "w1@test"})
	h.mux.HandleFunc("tasks.add", add, worker.RateLimit("100/s"))
	h.mux.HandleFunc("tasks.sleep", func(ctx context.Context, t *worker.Task) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	h.start()
	h.wait(h.send("tasks.add", []any{int64(1), int64(1)}, nil))
	return h, newControlClient(t, h)
}

func TestControlPingRegisteredStats(t *testing.T) {
	h, c := startControlled(t)
	if got := c.call("ping", nil); got.(map[string]any)["ok"] != "pong" {
		t.Fatalf("ping = %v", got)
	}
	// A ping for another node is not answered: TestControlSelection and
	// TestControlForMe, without waiting out another reply timeout here.
	reg := c.call("registered", nil).([]any)
	if len(reg) != 2 || reg[0] != "tasks.add [rate_limit=100/s]" || reg[1] != "tasks.sleep" {
		t.Fatalf("registered = %v", reg)
	}
	stats := c.call("stats", nil).(map[string]any)
	if stats["total"].(map[string]any)["tasks.add"] != int64(1) {
		t.Fatalf("stats total = %v", stats["total"])
	}
	if b := stats["broker"].(map[string]any); b["transport"] != "memory" {
		t.Fatalf("stats broker = %v, want transport memory", b)
	}
	if pool := stats["pool"].(map[string]any); pool["max-concurrency"] == nil {
		t.Fatalf("stats pool = %v", pool)
	}
	if got := c.call("no_such_command", nil).(map[string]any); !strings.Contains(got["error"].(string), "KeyError") {
		t.Fatalf("unknown command = %v", got)
	}
	_ = h
}

func TestControlActiveAndTerminate(t *testing.T) {
	h, c := startControlled(t)
	id := h.send("tasks.sleep", nil, nil)
	var active []any
	// The warm-up task of startControlled stays active for a moment after
	// its result is stored: wait for this one alone.
	eventually(t, "task active", func() bool {
		active, _ = c.call("active", nil).([]any)
		if len(active) != 1 {
			return false
		}
		info, _ := active[0].(map[string]any)
		return info["id"] == id
	})
	info := active[0].(map[string]any)
	if info["id"] != id || info["name"] != "tasks.sleep" || info["hostname"] != "w1@test" {
		t.Fatalf("active info = %v", info)
	}
	got := c.call("revoke", map[string]any{"task_id": id, "terminate": true, "signal": "SIGTERM"}).(map[string]any)
	if got["ok"] != "terminate: "+id {
		t.Fatalf("revoke terminate = %v", got)
	}
	m := h.wait(id)
	if m.Status != protocol.StateRevoked || exc(t, m).Message[0] != "terminated" {
		t.Fatalf("terminated task: %s %+v", m.Status, m.Result)
	}
}

func TestControlRevokeHeldETATask(t *testing.T) {
	h, c := startControlled(t)
	id := h.send("tasks.add", []any{int64(1), int64(2)}, nil, client.Countdown(time.Hour))
	eventually(t, "task scheduled", func() bool {
		s, _ := c.call("scheduled", nil).([]any)
		return len(s) == 1
	})
	got := c.call("revoke", map[string]any{"task_id": []any{id}}).(map[string]any)
	if got["ok"] != "tasks "+id+" flagged as revoked" {
		t.Fatalf("revoke = %v", got)
	}
	m := h.wait(id)
	if m.Status != protocol.StateRevoked || exc(t, m).Message[0] != "revoked" {
		t.Fatalf("revoked task: %s %+v", m.Status, m.Result)
	}
	if rv := c.call("revoked", nil).([]any); len(rv) != 1 || rv[0] != id {
		t.Fatalf("revoked list = %v", rv)
	}
	// A revoked id that arrives later is not run either.
	id2 := h.send("tasks.add", []any{int64(1), int64(2)}, nil, client.TaskID(id))
	if id2 != id {
		t.Fatal("task id not kept")
	}
	if n, _ := h.tr.Len(context.Background(), "q"); n != 0 {
		eventually(t, "revoked redelivery consumed", func() bool { n, _ := h.tr.Len(context.Background(), "q"); return n == 0 })
	}
	// Consumed without running: had it run, SUCCESS would have replaced
	// REVOKED.
	eventually(t, "no task active", func() bool { a, _ := c.call("active", nil).([]any); return len(a) == 0 })
	if m, err := h.be.Get(context.Background(), id); err != nil || m.Status != protocol.StateRevoked {
		t.Fatalf("revoked task that arrived again: %+v, %v; want REVOKED", m, err)
	}
}

// TestControlReserved: inspect reserved lists the prefetched tasks that
// wait for a slot, and not the running one.
func TestControlReserved(t *testing.T) {
	h := newHarness(t, worker.Config{Hostname: "w3@test", Concurrency: 1, ShutdownTimeout: 100 * time.Millisecond})
	h.mux.HandleFunc("tasks.add", add)
	h.mux.HandleFunc("tasks.sleep", func(ctx context.Context, t *worker.Task) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	h.start()
	c := newControlClient(t, h)
	running := h.send("tasks.sleep", nil, nil)
	waiting := []string{h.send("tasks.add", []any{int64(1), int64(2)}, nil), h.send("tasks.add", []any{int64(3), int64(4)}, nil)}
	var reserved []any
	eventually(t, "two tasks reserved", func() bool {
		reserved, _ = c.call("reserved", nil).([]any)
		return len(reserved) == 2
	})
	for i, r := range reserved {
		info := r.(map[string]any)
		if info["id"] != waiting[i] || info["name"] != "tasks.add" || info["acknowledged"] != false {
			t.Errorf("reserved[%d] = %v, want %s unacknowledged", i, info, waiting[i])
		}
	}
	active, _ := c.call("active", nil).([]any)
	if len(active) != 1 || active[0].(map[string]any)["id"] != running {
		t.Fatalf("active = %v, want only %s", active, running)
	}
}

// TestControlEnableEventsAtRunTime: enable_events makes a running worker
// send task events, disable_events stops them, as with celery control.
func TestControlEnableEventsAtRunTime(t *testing.T) {
	h := newHarness(t, worker.Config{Hostname: "w4@test"})
	h.mux.HandleFunc("tasks.add", add)
	sub, err := h.tr.Subscribe(context.Background(), transport.Broadcast{Exchange: "celeryev", ExchangeType: transport.Topic, BindingKey: "task.#"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	h.start()
	c := newControlClient(t, h)
	taskEvents := func(wait time.Duration, id string) []string {
		var types []string
		deadline := time.After(wait)
		for {
			select {
			case d := <-sub.Deliveries():
				for _, m := range decodeEvents(t, d) {
					if m["uuid"] == id {
						types = append(types, m["type"].(string))
						if m["type"] == "task-succeeded" {
							return types
						}
					}
				}
			case <-deadline:
				return types
			}
		}
	}
	quiet := h.send("tasks.add", []any{int64(1), int64(1)}, nil)
	h.wait(quiet)
	if got := taskEvents(300*time.Millisecond, quiet); len(got) != 0 {
		t.Fatalf("task events before enable_events: %v", got)
	}
	if got := c.call("enable_events", nil).(map[string]any); got["ok"] != "task events enabled" {
		t.Fatalf("enable_events = %v", got)
	}
	loud := h.send("tasks.add", []any{int64(2), int64(2)}, nil)
	if got := taskEvents(10*time.Second, loud); !slices.Contains(got, "task-received") || !slices.Contains(got, "task-succeeded") {
		t.Fatalf("task events after enable_events: %v", got)
	}
	if got := c.call("disable_events", nil).(map[string]any); got["ok"] != "task events disabled" {
		t.Fatalf("disable_events = %v", got)
	}
	again := h.send("tasks.add", []any{int64(3), int64(3)}, nil)
	h.wait(again)
	if got := taskEvents(300*time.Millisecond, again); len(got) != 0 {
		t.Fatalf("task events after disable_events: %v", got)
	}
}

func TestControlRateLimitAndEvents(t *testing.T) {
	_, c := startControlled(t)
	for _, tc := range []struct {
		method string
		args   map[string]any
		want   string
		key    string
	}{
		{"rate_limit", map[string]any{"task_name": "tasks.add", "rate_limit": "10/m"}, "new rate limit set successfully", "ok"},
		{"rate_limit", map[string]any{"task_name": "tasks.add", "rate_limit": int64(0)}, "rate limit disabled successfully", "ok"},
		{"rate_limit", map[string]any{"task_name": "tasks.add", "rate_limit": nil}, "rate limit disabled successfully", "ok"},
		// celery control rate_limit sends the string; Celery's reply then
		// says set (the limit is off all the same).
		{"rate_limit", map[string]any{"task_name": "tasks.add", "rate_limit": "0"}, "new rate limit set successfully", "ok"},
		{"rate_limit", map[string]any{"task_name": "tasks.add", "rate_limit": "ten"}, "Invalid rate limit string: worker: invalid rate limit \"ten\"", "error"},
		{"rate_limit", map[string]any{"task_name": "tasks.nope", "rate_limit": "1/s"}, "unknown task", "error"},
		{"time_limit", map[string]any{"task_name": "tasks.add", "hard": 10.0, "soft": 5.0}, "time limits set successfully", "ok"},
		{"enable_events", nil, "task events enabled", "ok"},
		{"enable_events", nil, "task events already enabled", "ok"},
		{"disable_events", nil, "task events disabled", "ok"},
		{"add_consumer", map[string]any{"queue": "extra"}, "add consumer extra", "ok"},
		{"cancel_consumer", map[string]any{"queue": "extra"}, "no longer consuming from extra", "ok"},
	} {
		got, _ := c.call(tc.method, tc.args).(map[string]any)
		if got[tc.key] != tc.want {
			t.Errorf("%s %v = %v, want %s=%q", tc.method, tc.args, got, tc.key, tc.want)
		}
	}
}

func TestEventsHeartbeatAndTaskEvents(t *testing.T) {
	h := newHarness(t, worker.Config{Hostname: "w2@test", SendTaskEvents: true, HeartbeatInterval: 50 * time.Millisecond})
	h.mux.HandleFunc("tasks.add", add)
	sub, err := h.tr.Subscribe(context.Background(), transport.Broadcast{Exchange: "celeryev", ExchangeType: transport.Topic, BindingKey: "#"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	h.start()
	id := h.send("tasks.add", []any{int64(2), int64(2)}, nil)
	h.wait(id)
	seen := map[string]map[string]any{}
	deadline := time.After(10 * time.Second)
	for seen["worker-heartbeat"] == nil || seen["task-succeeded"] == nil {
		select {
		case d := <-sub.Deliveries():
			for _, m := range decodeEvents(t, d) {
				seen[m["type"].(string)] = m
			}
		case <-deadline:
			t.Fatalf("events seen: %v", keys(seen))
		}
	}
	for _, typ := range []string{"worker-online", "task-received", "task-started", "task-succeeded"} {
		if seen[typ] == nil {
			t.Errorf("no %s event (saw %v)", typ, keys(seen))
		}
	}
	if s := seen["task-succeeded"]; s["uuid"] != id || s["result"] != "4" || s["hostname"] != "w2@test" {
		t.Errorf("task-succeeded = %v", s)
	}
	if hb := seen["worker-heartbeat"]; hb["freq"] != 0.05 || hb["sw_ident"] != "celeriac" {
		t.Errorf("heartbeat = %v", hb)
	}
}

// decodeEvents decodes an event message: one event, or a list of them
// (Celery's grouped events).
func decodeEvents(t *testing.T, d *transport.Delivery) []map[string]any {
	t.Helper()
	v, err := protocol.Unmarshal(d.Message.ContentType, d.Message.Body, protocol.DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	evs, ok := v.([]any)
	if !ok {
		evs = []any{v}
	}
	out := make([]map[string]any, 0, len(evs))
	for _, e := range evs {
		m, ok := e.(map[string]any)
		if !ok {
			t.Fatalf("event %v is not a map", e)
		}
		out = append(out, m)
	}
	return out
}

func keys(m map[string]map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestControlClientAgainstWorker(t *testing.T) {
	h, _ := startControlled(t)
	c := client.NewControl(h.tr)
	replies, err := c.Call(context.Background(), "ping", nil, client.ControlOptions{Timeout: 2 * time.Second, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(replies) != 1 || replies[0].Hostname != "w1@test" || replies[0].Value.(map[string]any)["ok"] != "pong" {
		t.Fatalf("replies = %+v", replies)
	}
	replies, err = c.Call(context.Background(), "ping", nil, client.ControlOptions{Timeout: 200 * time.Millisecond, Pattern: "w9@*"})
	if err != nil || len(replies) != 0 {
		t.Fatalf("pattern w9@* answered: %+v %v", replies, err)
	}
	replies, err = c.Call(context.Background(), "ping", nil, client.ControlOptions{Timeout: 2 * time.Second, Pattern: "w1@*", Limit: 1})
	if err != nil || len(replies) != 1 {
		t.Fatalf("pattern w1@* not answered: %+v %v", replies, err)
	}
}

// TestControlConsumerAgainAfterCancel: a queue cancelled with
// cancel_consumer and added again with add_consumer is consumed again.
func TestControlConsumerAgainAfterCancel(t *testing.T) {
	h, c := startControlled(t)
	for _, step := range []struct{ method, want string }{
		{"add_consumer", "add consumer extra"},
		{"cancel_consumer", "no longer consuming from extra"},
		{"add_consumer", "add consumer extra"},
	} {
		got, _ := c.call(step.method, map[string]any{"queue": "extra"}).(map[string]any)
		if got["ok"] != step.want {
			t.Fatalf("%s = %v, want ok=%q", step.method, got, step.want)
		}
	}
	id := h.send("tasks.add", []any{int64(2), int64(3)}, nil, client.Queue("extra"))
	if m := h.wait(id); m.Status != protocol.StateSuccess {
		t.Fatalf("task on the re-added queue: %s %v", m.Status, m.Result)
	}
	qs, _ := c.call("active_queues", nil).([]any)
	var names []string
	for _, q := range qs {
		names = append(names, q.(map[string]any)["name"].(string))
	}
	if strings.Join(names, ",") != "extra,q" {
		t.Fatalf("active_queues names = %v, want [extra q]", names)
	}
}

// TestControlHeartbeatReplies: like a Python worker, the worker answers a
// heartbeat request that asks for a reply (celery control heartbeat) with
// null, so that the caller sees which workers got it.
func TestControlHeartbeatReplies(t *testing.T) {
	_, c := startControlled(t)
	v, replied := c.request("heartbeat", nil, nil)
	if !replied || v != nil {
		t.Fatalf("heartbeat reply = %v (replied %v), want null", v, replied)
	}
}

// TestControlSelection: a worker replies to a request selected for it and
// stays silent otherwise, end to end over the pidbox. The selection rules
// themselves are table-tested on the parsed request (TestControlForMe), so
// this waits out the reply timeout only once.
func TestControlSelection(t *testing.T) {
	_, c := startControlled(t) // node w1@test
	if _, replied := c.request("ping", nil, map[string]any{"pattern": "w1@*", "matcher": "glob"}); !replied {
		t.Error("selected by pattern, did not reply")
	}
	if _, replied := c.request("ping", nil, map[string]any{"destination": []any{"w2@test"}}); replied {
		t.Error("not a destination, replied")
	}
}

// TestUnknownTaskSendsTaskFailed: as Celery's consumer (on_unknown_task), a
// task no handler knows is reported with task-failed, so that Flower and
// the dashboard show it and why.
func TestUnknownTaskSendsTaskFailed(t *testing.T) {
	h := newHarness(t, worker.Config{Hostname: "w3@test", SendTaskEvents: true})
	h.mux.HandleFunc("tasks.add", add)
	sub, err := h.tr.Subscribe(context.Background(), transport.Broadcast{Exchange: "celeryev", ExchangeType: transport.Topic, BindingKey: "#"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	h.start()
	id := h.send("tasks.nope", nil, nil)
	h.wait(id)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case d := <-sub.Deliveries():
			for _, m := range decodeEvents(t, d) {
				if m["type"] == "task-failed" {
					if m["uuid"] != id || m["exception"] != "NotRegistered('tasks.nope')" || m["hostname"] != "w3@test" {
						t.Fatalf("task-failed = %v", m)
					}
					return
				}
			}
		case <-deadline:
			t.Fatal("no task-failed event for the unregistered task")
		}
	}
}
