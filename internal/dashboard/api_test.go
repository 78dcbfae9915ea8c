package dashboard

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// request sends one API request; body is sent as JSON when it starts with
// "{", else as a form.
func (e *env) request(method, path, body string, hdr map[string]string) (int, string) {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	switch {
	case strings.HasPrefix(body, "{"):
		req.Header.Set("Content-Type", "application/json")
	case body != "":
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAPIReads: Flower's read paths and shapes, behind the credentials.
func TestAPIReads(t *testing.T) {
	e := newEnv(t, Options{AuthToken: "tok"})
	bearer := map[string]string{"Authorization": "Bearer tok"}
	now := float64(time.Now().UnixNano()) / 1e9
	e.d.store.Apply(map[string]any{"type": "worker-heartbeat", "hostname": "w1@host", "timestamp": now, "freq": 2.0, "sw_ident": "py-celery"})
	e.d.store.Apply(at(1, ev("task-received", "t1", "name", "tasks.add", "args", "(1, 2)")))
	e.d.store.Apply(at(2, ev("task-succeeded", "t1", "result", "3")))
	e.d.store.Apply(at(3, ev("task-received", "t2", "name", "tasks.mul")))

	if code, body := e.request("GET", "/api/tasks", "", nil); code != http.StatusUnauthorized || !strings.Contains(body, `"error"`) {
		t.Errorf("without credentials: %d %s, want 401 in JSON", code, body)
	}
	var workers map[string]map[string]any
	code, body := e.request("GET", "/api/workers", "", bearer)
	if code != 200 || json.Unmarshal([]byte(body), &workers) != nil || workers["w1@host"]["online"] != true || workers["w1@host"]["sw_ident"] != "py-celery" {
		t.Errorf("/api/workers: %d %s", code, body)
	}
	if _, body := e.request("GET", "/api/workers?status=true", "", bearer); body != `{"w1@host":true}` {
		t.Errorf("/api/workers?status=true: %s", body)
	}
	var tasks map[string]map[string]any
	code, body = e.request("GET", "/api/tasks?state=SUCCESS", "", bearer)
	if code != 200 || json.Unmarshal([]byte(body), &tasks) != nil || len(tasks) != 1 || tasks["t1"]["result"] != "3" ||
		tasks["t1"]["name"] != "tasks.add" || tasks["t1"]["received"] != 1.7e9+1 {
		t.Errorf("/api/tasks?state=SUCCESS: %d %s", code, body)
	}
	tasks = nil
	if _, body := e.request("GET", "/api/tasks?limit=1", "", bearer); json.Unmarshal([]byte(body), &tasks) != nil || len(tasks) != 1 || tasks["t2"] == nil {
		t.Errorf("/api/tasks?limit=1 (newest first): %s", body)
	}
	if code, _ := e.request("GET", "/api/tasks?limit=x", "", bearer); code != http.StatusBadRequest {
		t.Errorf("/api/tasks?limit=x: %d", code)
	}
	var info map[string]any
	if _, body := e.request("GET", "/api/task/info/t1", "", bearer); json.Unmarshal([]byte(body), &info) != nil || info["state"] != "SUCCESS" || info["uuid"] != "t1" {
		t.Errorf("/api/task/info/t1: %s", body)
	}
	if code, _ := e.request("GET", "/api/task/info/nope", "", bearer); code != http.StatusNotFound {
		t.Errorf("/api/task/info/nope: %d", code)
	}
	if code, body := e.request("GET", "/api/queues/length", "", bearer); code != 200 || !strings.Contains(body, `{"messages":0,"messages_ready":0,"name":"q1"}`) {
		t.Errorf("/api/queues/length: %d %s", code, body)
	}
	code, body = e.request("GET", "/metrics", "", bearer)
	for _, want := range []string{"celeriac_dashboard_tasks 2\n", `celeriac_dashboard_tasks_by_state{state="SUCCESS"} 1`,
		`celeriac_dashboard_workers{status="online"} 1`, "celeriac_dashboard_broker_up 1\n"} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s: %d\n%s", want, code, body)
		}
	}
}

// TestAPIWrites: async-apply, revoke and rate-limit, and what refuses them:
// no credentials, --read-only, and a form (a cross-site post) without the
// CSRF token.
func TestAPIWrites(t *testing.T) {
	e := newEnv(t, Options{AuthToken: "tok"})
	bearer := map[string]string{"Authorization": "Bearer tok"}
	code, body := e.request("POST", "/api/task/async-apply/tasks.add", `{"args": [1, 2], "kwargs": {"z": 3}, "queue": "q1"}`, bearer)
	var sent struct {
		ID    string `json:"task-id"`
		State string `json:"state"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &sent) != nil || len(sent.ID) != 36 || sent.State != "PENDING" {
		t.Fatalf("async-apply: %d %s", code, body)
	}
	if n, _ := e.tr.Len(t.Context(), "q1"); n != 1 {
		t.Errorf("async-apply: %d messages in q1, want 1", n)
	}
	if code, body := e.request("POST", "/api/task/async-apply/tasks.add", `{"args": {"not": "a list"}}`, bearer); code != http.StatusBadRequest {
		t.Errorf("async-apply with bad args: %d %s", code, body)
	}
	if code, _ := e.request("POST", "/api/task/revoke/t9?terminate=true", `{}`, bearer); code != 200 {
		t.Errorf("revoke: %d", code)
	}
	if got := e.ctl.take(); len(got) != 1 || got[0] != `revoke {"signal":"SIGTERM","task_id":["t9"],"terminate":true} []` {
		t.Errorf("revoke sent %q", got)
	}
	if code, _ := e.request("POST", "/api/task/rate-limit/tasks.add", `{"ratelimit": "5/m", "workername": "w@h"}`, bearer); code != 200 {
		t.Errorf("rate-limit: %d", code)
	}
	if got := e.ctl.take(); len(got) != 1 || got[0] != `rate_limit {"rate_limit":"5/m","task_name":"tasks.add"} [w@h]` {
		t.Errorf("rate-limit sent %q", got)
	}

	for _, bad := range []struct {
		what string
		e    *env
		body string
		hdr  map[string]string
		want int
	}{
		{"no credentials", e, `{}`, nil, http.StatusUnauthorized},
		{"wrong token", e, `{}`, map[string]string{"Authorization": "Bearer nope"}, http.StatusUnauthorized},
		{"a form without the CSRF token", e, "args=1", bearer, http.StatusForbidden},
		{"another origin", e, `{}`, map[string]string{"Authorization": "Bearer tok", "Origin": "http://evil.example"}, http.StatusForbidden},
		{"read-only", newEnv(t, Options{AuthToken: "tok", ReadOnly: true}), `{}`, bearer, http.StatusForbidden},
		{"no credentials configured", newEnv(t, Options{}), `{}`, nil, http.StatusForbidden},
	} {
		code, body := bad.e.request("POST", "/api/task/revoke/t9", bad.body, bad.hdr)
		if code != bad.want {
			t.Errorf("%s: %d %s, want %d", bad.what, code, body, bad.want)
		}
		if got := bad.e.ctl.take(); len(got) != 0 {
			t.Errorf("%s: sent %q", bad.what, got)
		}
	}
}

// TestAPITasksSortBy: /api/tasks takes Flower's sort_by.
func TestAPITasksSortBy(t *testing.T) {
	e := newEnv(t, Options{AuthToken: "tok"})
	bearer := map[string]string{"Authorization": "Bearer tok"}
	e.d.store.Apply(at(1, ev("task-received", "t1", "name", "tasks.z")))
	e.d.store.Apply(at(2, ev("task-received", "t2", "name", "tasks.a")))
	var tasks map[string]map[string]any
	if _, body := e.request("GET", "/api/tasks?sort_by=-name&limit=1", "", bearer); json.Unmarshal([]byte(body), &tasks) != nil || len(tasks) != 1 || tasks["t1"] == nil {
		t.Errorf("sort_by=-name&limit=1: %v, want t1 (tasks.z)", tasks)
	}
	if code, body := e.request("GET", "/api/tasks?sort_by=args", "", bearer); code != http.StatusBadRequest || !strings.Contains(body, "sort_by") {
		t.Errorf("sort_by=args: %d %s, want 400", code, body)
	}
}
