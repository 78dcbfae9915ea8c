package dashboard

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ev(typ, id string, kv ...any) map[string]any {
	m := map[string]any{"type": typ, "uuid": id, "hostname": "w1@host", "timestamp": float64(time.Now().UnixNano()) / 1e9}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// at stamps an event sec seconds into a fixed minute: the store orders
// runs by the events' timestamps.
func at(sec float64, e map[string]any) map[string]any {
	e["timestamp"] = 1.7e9 + sec
	return e
}

func TestStoreStates(t *testing.T) {
	tests := []struct {
		name   string
		events []map[string]any
		want   string
		filter string // also found by this state filter
	}{
		{"lifecycle", []map[string]any{at(1, ev("task-received", "a")), at(2, ev("task-started", "a")), at(3, ev("task-succeeded", "a"))}, StateSuccess, ""},
		// Events arrive batched and from several workers: a late
		// received never moves a finished task back.
		{"late received", []map[string]any{at(3, ev("task-succeeded", "a")), at(1, ev("task-received", "a"))}, StateSuccess, ""},
		{"late sent, from a client clock ahead", []map[string]any{at(3, ev("task-succeeded", "a")), at(9, ev("task-sent", "a"))}, StateSuccess, ""},
		{"retry then success", []map[string]any{at(1, ev("task-started", "a")), at(2, ev("task-retried", "a")), at(3, ev("task-succeeded", "a"))}, StateSuccess, ""},
		{"retried", []map[string]any{at(1, ev("task-started", "a")), at(2, ev("task-retried", "a"))}, StateRetry, StateRetry},
		// The retry's message is received at once and waits for its
		// countdown: RECEIVED, as celery.events.state has it, and still
		// what the RETRY filter finds.
		{"retried, waiting for its countdown", []map[string]any{at(1, ev("task-started", "a")), at(2, ev("task-retried", "a")),
			at(2.1, ev("task-received", "a", "retries", int64(1)))}, StateReceived, StateRetry},
		{"revoked", []map[string]any{at(1, ev("task-received", "a")), at(2, ev("task-revoked", "a", "terminated", true))}, StateRevoked, ""},
		{"revoked, then a late received", []map[string]any{at(2, ev("task-revoked", "a")), at(1, ev("task-received", "a"))}, StateRevoked, ""},
		{"failed", []map[string]any{at(1, ev("task-received", "a")), at(2, ev("task-failed", "a", "exception", "ValueError()"))}, StateFailure, ""},
		// A dead letter replayed: its new run's events are newer than the
		// failure, and the task runs again.
		{"replayed after failing", []map[string]any{at(1, ev("task-received", "a")), at(2, ev("task-failed", "a")),
			at(60, ev("task-received", "a")), at(61, ev("task-started", "a"))}, StateStarted, ""},
		{"replayed, then succeeded", []map[string]any{at(1, ev("task-received", "a")), at(2, ev("task-failed", "a")),
			at(60, ev("task-received", "a")), at(61, ev("task-started", "a")), at(62, ev("task-succeeded", "a")), at(1.5, ev("task-started", "a"))}, StateSuccess, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(10)
			for _, e := range tc.events {
				s.Apply(e)
			}
			got, ok := s.Task("a")
			if !ok || got.State != tc.want {
				t.Fatalf("state %q (known %v), want %q", got.State, ok, tc.want)
			}
			if tc.filter != "" {
				if _, n := s.Tasks(Filter{State: tc.filter}, 0, 10); n != 1 {
					t.Errorf("the %s filter finds %d tasks, want 1", tc.filter, n)
				}
			}
		})
	}
}

// TestStoreRetriedTask: what a task that retried and then succeeded shows:
// its own outcome, not the retry's exception, and no relation to itself
// (a retry's parent_id is the task's own id, a root task's root_id too).
func TestStoreRetriedTask(t *testing.T) {
	s := NewStore(10)
	s.Apply(at(1, ev("task-received", "r", "root_id", "r")))
	s.Apply(at(2, ev("task-retried", "r", "exception", "ConnectionError('down')", "traceback", "Traceback (most recent call last): ...")))
	s.Apply(at(2.1, ev("task-received", "r", "retries", int64(1), "parent_id", "r", "root_id", "r")))
	s.Apply(at(3, ev("task-succeeded", "r", "result", "'ok'")))
	got, _ := s.Task("r")
	if got.State != StateSuccess || got.Result != "'ok'" || got.Exception != "" || got.Traceback != "" {
		t.Errorf("retried, then succeeded: state %s, result %q, exception %q, traceback %q", got.State, got.Result, got.Exception, got.Traceback)
	}
	if got.ParentID != "" || got.RootID != "" || len(got.Children) != 0 {
		t.Errorf("the task is related to itself: parent %q, root %q, children %v", got.ParentID, got.RootID, got.Children)
	}
}

func TestStoreFields(t *testing.T) {
	s := NewStore(10)
	s.Apply(ev("task-received", "p", "name", "tasks.parent", "args", "(1, 2)", "kwargs", "{'x': 3}", "retries", int64(2),
		"eta", "2026-01-01T00:00:00+00:00", "expires", nil, "root_id", "p"))
	s.Apply(ev("task-received", "c", "name", "tasks.child", "parent_id", "p", "root_id", "p"))
	s.Apply(ev("task-succeeded", "p", "result", "3", "runtime", 0.25))
	s.Apply(ev("task-failed", "c", "exception", "ValueError('x')", "traceback", "Traceback...", "runtime", 0.5))
	p, _ := s.Task("p")
	if p.Name != "tasks.parent" || p.Args != "(1, 2)" || p.Kwargs != "{'x': 3}" || p.Retries != 2 || p.Result != "3" ||
		p.Runtime != 0.25 || p.ETA == "" || p.Worker != "w1@host" || len(p.Children) != 1 || p.Children[0] != "c" {
		t.Errorf("parent: %+v", p)
	}
	c, _ := s.Task("c")
	if c.ParentID != "p" || c.RootID != "p" || c.Exception != "ValueError('x')" || c.Traceback != "Traceback..." {
		t.Errorf("child: %+v", c)
	}
	series := s.Series("tasks.parent", time.Now())
	if last := series[len(series)-1]; last.Succeeded != 1 || last.P50 != 0.25 || last.P95 != 0.25 {
		t.Errorf("last minute of tasks.parent: %+v", last)
	}
	// Bad fields are ignored one by one.
	s.Apply(map[string]any{"type": "task-received", "uuid": 12})
	s.Apply(map[string]any{"type": "task-received", "uuid": "x", "retries": "many", "timestamp": "now", "name": []any{1}})
	if x, ok := s.Task("x"); !ok || x.Retries != 0 {
		t.Errorf("malformed event: %+v", x)
	}
}

func TestStoreBounds(t *testing.T) {
	s := NewStore(3)
	for i := range 5 {
		s.Apply(ev("task-received", fmt.Sprint(i), "args", strings.Repeat("x", 10*maxReprLen)))
	}
	tasks, total := s.Tasks(Filter{}, 0, 10)
	if total != 3 || tasks[0].ID != "4" || tasks[2].ID != "2" {
		t.Fatalf("kept %d tasks: %+v", total, tasks)
	}
	if _, ok := s.Task("0"); ok {
		t.Error("the oldest task was kept")
	}
	if n := len(tasks[0].Args); n > maxReprLen+8 {
		t.Errorf("args kept at %d bytes", n)
	}
	// Paging and filters.
	_, total = s.Tasks(Filter{State: StateSuccess}, 0, 10)
	if total != 0 {
		t.Errorf("SUCCESS filter matched %d", total)
	}
	page, total := s.Tasks(Filter{}, 2, 10)
	if total != 3 || len(page) != 1 || page[0].ID != "2" {
		t.Errorf("offset 2: %d %+v", total, page)
	}
}

func TestStorePersist(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.json")
	s := NewStore(10)
	s.Apply(ev("task-succeeded", "a", "name", "n", "result", "1"))
	s.Apply(map[string]any{"type": "worker-heartbeat", "hostname": "w1@host", "sw_ident": "py-celery", "sw_ver": "5.2.6", "freq": 2.0, "timestamp": float64(time.Now().Unix())})
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	s2 := NewStore(10)
	if err := s2.Load(path); err != nil {
		t.Fatal(err)
	}
	if a, ok := s2.Task("a"); !ok || a.State != StateSuccess || a.Result != "1" {
		t.Errorf("task after load: %+v", a)
	}
	if ws := s2.Workers(); len(ws) != 1 || ws[0].SWVer != "5.2.6" {
		t.Errorf("workers after load: %+v", ws)
	}
	if err := NewStore(1).Load(filepath.Join(t.TempDir(), "missing")); err != nil {
		t.Errorf("a missing file: %v", err)
	}
}

func TestWorkerOnline(t *testing.T) {
	now := time.Now()
	tests := []struct {
		w    Worker
		want bool
	}{
		{Worker{LastHeartbeat: now.Add(-time.Second), Freq: 2}, true},
		{Worker{LastHeartbeat: now.Add(-5 * time.Second), Freq: 2}, false},
		{Worker{LastHeartbeat: now, Freq: 2, Offline: true}, false},
		{Worker{LastReply: now}, true},
		{Worker{}, false},
	}
	for i, tc := range tests {
		if got := tc.w.Online(now); got != tc.want {
			t.Errorf("%d: online %v, want %v", i, got, tc.want)
		}
	}
}

// fakeControl records the commands sent.
type fakeControl struct {
	mu    sync.Mutex
	calls []string
}

func (f *fakeControl) Call(_ context.Context, method string, args map[string]any, o client.ControlOptions) ([]client.Reply, error) {
	f.record(method, args, o)
	host := "w1@host"
	if len(o.Destination) > 0 {
		host = o.Destination[0]
	}
	return []client.Reply{{Hostname: host, Value: map[string]any{"ok": "done <b>"}}}, nil
}

func (f *fakeControl) Cast(_ context.Context, method string, args map[string]any, o client.ControlOptions) error {
	f.record(method, args, o)
	return nil
}

func (f *fakeControl) record(method string, args map[string]any, o client.ControlOptions) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, _ := json.Marshal(args)
	f.calls = append(f.calls, fmt.Sprintf("%s %s %v", method, b, o.Destination))
}

func (f *fakeControl) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

type env struct {
	t     *testing.T
	d     *Dashboard
	srv   *httptest.Server
	ctl   *fakeControl
	tr    *memory.Transport
	queue string
}

func newEnv(t *testing.T, o Options) *env {
	t.Helper()
	tr := memory.New(memory.Config{})
	t.Cleanup(func() { tr.Close() })
	ctl := &fakeControl{}
	o.Transport, o.Control, o.BrokerScheme = tr, ctl, "memory"
	o.Client = client.New(tr, client.Config{})
	o.Queues = append(o.Queues, "q1")
	d, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)
	return &env{t: t, d: d, srv: srv, ctl: ctl, tr: tr, queue: "q1"}
}

// client returns a browser-like client with a cookie jar that does not
// follow redirects.
func (e *env) client() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func (e *env) get(c *http.Client, path string) (int, string) {
	e.t.Helper()
	resp, err := c.Get(e.srv.URL + path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// csrf loads a page and returns the CSRF token its forms carry.
func (e *env) csrf(c *http.Client) string {
	e.t.Helper()
	_, body := e.get(c, "/login")
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		e.t.Fatalf("no csrf token in the page:\n%s", body)
	}
	return m[1]
}

// login logs c in with the form and token tok.
func (e *env) login(c *http.Client, tok string) {
	e.t.Helper()
	resp, _ := e.post(c, "/login", url.Values{"csrf": {e.csrf(c)}, "token": {tok}}, nil)
	if resp.StatusCode != http.StatusSeeOther {
		e.t.Fatalf("login: %d", resp.StatusCode)
	}
}

// forgetFailures clears the failed-login count (the tests fail logins
// from one address on purpose).
func (e *env) forgetFailures() {
	e.d.limiter.mu.Lock()
	e.d.limiter.m = nil
	e.d.limiter.mu.Unlock()
}

func (e *env) post(c *http.Client, path string, form url.Values, hdr map[string]string) (*http.Response, string) {
	e.t.Helper()
	req, _ := http.NewRequest("POST", e.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// deadLetters puts n messages of queue q into the memory broker's dead
// letters, as a worker does when tasks fail for good.
func (e *env) deadLetters(n int) []string {
	e.t.Helper()
	ctx := e.t.Context()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("dead-%d", i)
		ids = append(ids, id)
		err := e.tr.Publish(ctx, &transport.Publishing{RoutingKey: e.queue, Message: protocol.Message{
			ContentType: "application/json", Headers: map[string]any{"id": id, "task": "tasks.fail", "retries": int64(3)},
			Body: []byte(`[["<script>alert(1)</script>"], {}, {}]`),
		}})
		if err != nil {
			e.t.Fatal(err)
		}
	}
	cons, err := e.tr.Consume(ctx, []transport.Queue{{Name: e.queue}}, transport.ConsumeOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for range n {
		d := <-cons.Deliveries()
		if err := d.DeadLetter(ctx, transport.DeadLetterReason{Reason: "permanent", Error: "ValueError('<b>bold</b>')", Time: time.Now()}); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := cons.Stop(ctx); err != nil {
		e.t.Fatal(err)
	}
	return ids
}

func (e *env) deadCount() int {
	e.t.Helper()
	msgs, err := e.tr.DeadLetters(e.t.Context(), e.queue, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return len(msgs)
}

const xss = "<script>alert(1)</script>"

// TestPagesEscape renders every page with user data that holds markup and
// checks that it comes out as text.
func TestPagesEscape(t *testing.T) {
	e := newEnv(t, Options{AuthToken: "tok"})
	s := e.d.Store()
	s.Apply(map[string]any{"type": "worker-online", "hostname": "w<i>1</i>@host", "sw_ident": xss, "sw_ver": "1", "freq": 2.0,
		"timestamp": float64(time.Now().Unix())})
	s.Apply(ev("task-received", "t1", "name", "tasks.<b>x</b>", "args", "('"+xss+"',)", "kwargs", "{'k': '"+xss+"'}"))
	s.Apply(ev("task-failed", "t1", "exception", "ValueError('"+xss+"')", "traceback", xss, "runtime", 0.1))
	s.Apply(ev("task-received", `"><script>alert(2)</script>`, "name", "n"))
	e.deadLetters(1)
	c := e.client()
	e.login(c, "tok")
	for _, path := range []string{"/workers", "/tasks", "/tasks?name=" + url.QueryEscape(xss), "/task/t1", "/stats", "/queues",
		"/dlq", "/dlq?queue=q1", "/dlq/show?queue=q1&id=dead-0", "/login?back=" + url.QueryEscape(`"><script>alert(3)</script>`),
		"/tasks?msg=" + url.QueryEscape(xss), "/task/" + url.PathEscape(xss)} {
		code, body := e.get(c, path)
		if code != http.StatusOK && code != http.StatusNotFound {
			t.Errorf("GET %s: %d", path, code)
		}
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<b>") || strings.Contains(body, "<i>1") {
			t.Errorf("GET %s: unescaped markup in the page:\n%s", path, body)
		}
	}
	_, body := e.get(c, "/task/t1")
	if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("the task's args are not shown as text:\n%s", body)
	}
	// Fragments (what the script swaps in) are escaped the same way.
	req, _ := http.NewRequest("GET", e.srv.URL+"/tasks", nil)
	req.Header.Set("X-Fragment", "1")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(b), "<html") || !strings.Contains(string(b), "&lt;script&gt;") || strings.Contains(string(b), "<script>alert") {
		t.Errorf("fragment:\n%s", b)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("CSP %q", csp)
	}
}

func TestTasksFilters(t *testing.T) {
	e := newEnv(t, Options{})
	s := e.d.Store()
	for i := range 120 {
		name := "tasks.add"
		if i%2 == 1 {
			name = "tasks.mul"
		}
		s.Apply(ev("task-received", fmt.Sprintf("id-%03d", i), "name", name))
	}
	s.Apply(ev("task-succeeded", "id-000"))
	c := e.client()
	_, body := e.get(c, "/tasks")
	if !strings.Contains(body, "120 task(s) · page 1 of 3") || !strings.Contains(body, "id-119") || strings.Contains(body, "id-069") {
		t.Errorf("first page:\n%s", body)
	}
	_, body = e.get(c, "/tasks?page=3")
	if !strings.Contains(body, "id-000") || strings.Contains(body, "id-119") {
		t.Errorf("page 3 misses the oldest task")
	}
	_, body = e.get(c, "/tasks?name=mul")
	if !strings.Contains(body, "60 task(s)") {
		t.Errorf("name filter: %s", body[:min(len(body), 2000)])
	}
	_, body = e.get(c, "/tasks?state=SUCCESS")
	if !strings.Contains(body, "1 task(s)") || !strings.Contains(body, "id-000") {
		t.Errorf("state filter")
	}
	_, body = e.get(c, "/tasks?worker=nobody")
	if !strings.Contains(body, "0 task(s)") {
		t.Errorf("worker filter")
	}
	_, body = e.get(c, "/tasks?since=1h&until="+url.QueryEscape(time.Now().Add(time.Hour).UTC().Format(time.RFC3339)))
	if !strings.Contains(body, "120 task(s)") {
		t.Errorf("time filter")
	}
	_, body = e.get(c, "/tasks?since="+url.QueryEscape(time.Now().Add(time.Hour).UTC().Format("2006-01-02T15:04")))
	if !strings.Contains(body, "0 task(s)") {
		t.Errorf("since in the future")
	}
	_, body = e.get(c, "/tasks?since=yesterday")
	if !strings.Contains(body, "is not a time") {
		t.Errorf("a bad time is not reported")
	}
}

// actionCase is one action and the form that asks for it.
type actionCase struct {
	path string
	form url.Values
	// effect reports whether the action took effect since the last call.
	effect func(e *env) bool
	// prep, when set, runs before the case (dead letters to act on).
	prep func(e *env)
}

func actionCases(e *env) []actionCase {
	called := func(e *env) bool { return len(e.ctl.take()) > 0 }
	var cases []actionCase
	for _, op := range []string{"ping", "shutdown", "pool_grow", "pool_shrink", "enable_events", "disable_events"} {
		form := url.Values{"op": {op}, "worker": {"w1@host"}}
		if op == "shutdown" {
			form.Set("confirm", "yes")
		}
		cases = append(cases, actionCase{"/action/worker", form, called, nil})
	}
	cases = append(cases,
		actionCase{"/action/worker", url.Values{"op": {"rate_limit"}, "worker": {"w1@host"}, "task_name": {"tasks.add"}, "rate_limit": {"10/s"}}, called, nil},
		actionCase{"/action/revoke", url.Values{"id": {"t1"}}, called, nil},
		actionCase{"/action/revoke", url.Values{"id": {"t1"}, "terminate": {"1"}}, called, nil},
	)
	before := 0
	deadChanged := func(e *env) bool {
		n := e.deadCount()
		changed := n != before
		before = n
		return changed
	}
	// Each dead-letter case starts from dead-0 and dead-1 (the purged
	// ones published again, the replayed ones dead-lettered again).
	seed := func(e *env) {
		if n, _ := e.tr.Len(e.t.Context(), e.queue); n > 0 {
			e.deadLetters(n)
		}
		if e.deadCount() == 0 {
			e.deadLetters(2)
		}
		before = e.deadCount()
	}
	cases = append(cases,
		actionCase{"/action/dlq/replay", url.Values{"queue": {"q1"}, "id": {"dead-0"}}, deadChanged, seed},
		actionCase{"/action/dlq/replay", url.Values{"queue": {"q1"}, "all": {"1"}, "reset_retries": {"1"}}, deadChanged, seed},
		actionCase{"/action/dlq/purge", url.Values{"queue": {"q1"}, "id": {"dead-1"}, "confirm": {"yes"}}, deadChanged, seed},
		actionCase{"/action/dlq/purge", url.Values{"queue": {"q1"}, "all": {"1"}, "confirm": {"yes"}}, deadChanged, seed},
	)
	return cases
}

// TestActionsNeedCredentialsAndCSRF tries every action without
// credentials, with wrong credentials, without a CSRF token, with a wrong
// one and from another origin, in read-only mode and with no credentials
// configured: each is refused and changes nothing. With credentials and
// the right token each takes effect.
func TestActionsNeedCredentialsAndCSRF(t *testing.T) {
	e := newEnv(t, Options{AuthToken: "tok", BasicAuth: map[string]string{"ops": "pw"}})
	ro := newEnv(t, Options{AuthToken: "tok", ReadOnly: true})
	none := newEnv(t, Options{})
	for _, x := range []*env{ro, none} {
		x.deadLetters(2)
	}
	bearer := map[string]string{"Authorization": "Bearer tok"}
	basic := func(u, p string) map[string]string {
		r, _ := http.NewRequest("GET", "/", nil)
		r.SetBasicAuth(u, p)
		return map[string]string{"Authorization": r.Header.Get("Authorization")}
	}
	for i, ac := range actionCases(e) {
		name := fmt.Sprintf("%d %s %v", i, ac.path, ac.form)
		if ac.prep != nil {
			ac.prep(e)
		}
		e.forgetFailures()
		for _, bad := range []struct {
			what   string
			env    *env
			hdr    map[string]string
			csrf   string // "good", "wrong", ""
			status int
		}{
			{"no credentials", e, nil, "good", http.StatusUnauthorized},
			{"wrong token", e, map[string]string{"Authorization": "Bearer nope"}, "good", http.StatusUnauthorized},
			{"wrong password", e, basic("ops", "nope"), "good", http.StatusUnauthorized},
			{"unknown user", e, basic("root", "pw"), "good", http.StatusUnauthorized},
			{"no CSRF token", e, bearer, "", http.StatusForbidden},
			{"wrong CSRF token", e, bearer, "wrong", http.StatusForbidden},
			{"another origin", e, map[string]string{"Authorization": "Bearer tok", "Origin": "http://evil.example"}, "good", http.StatusForbidden},
			{"read-only", ro, bearer, "good", http.StatusForbidden},
			{"no credentials configured", none, nil, "good", http.StatusForbidden},
		} {
			c := bad.env.client()
			form := url.Values{}
			for k, v := range ac.form {
				form[k] = v
			}
			switch bad.csrf {
			case "good":
				form.Set("csrf", bad.env.csrf(c))
			case "wrong":
				bad.env.csrf(c) // the cookie is set
				form.Set("csrf", strings.Repeat("0", 64))
			}
			resp, _ := bad.env.post(c, ac.path, form, bad.hdr)
			if resp.StatusCode != bad.status {
				t.Errorf("%s, %s: status %d, want %d", name, bad.what, resp.StatusCode, bad.status)
			}
			if bad.env == e && ac.effect(e) {
				t.Errorf("%s, %s: the action took effect", name, bad.what)
			}
			if bad.env != e && len(bad.env.ctl.take()) > 0 {
				t.Errorf("%s, %s: a command was sent", name, bad.what)
			}
		}
		// With the right credentials (alternately the token and basic
		// auth) and the right token, it works.
		e.forgetFailures()
		c := e.client()
		form := url.Values{"csrf": {e.csrf(c)}}
		for k, v := range ac.form {
			form[k] = v
		}
		hdr := bearer
		if i%2 == 1 {
			hdr = basic("ops", "pw")
		}
		resp, _ := e.post(c, ac.path, form, hdr)
		if resp.StatusCode != http.StatusSeeOther {
			t.Errorf("%s with credentials: status %d", name, resp.StatusCode)
		}
		if !ac.effect(e) {
			t.Errorf("%s with credentials: no effect", name)
		}
	}
	if ro.deadCount() != 2 || none.deadCount() != 2 {
		t.Error("a refused action changed dead letters")
	}
}

// TestLoginCookie: the token entered in the login form becomes a cookie
// that authenticates actions; a wrong token does not.
func TestLoginCookie(t *testing.T) {
	e := newEnv(t, Options{AuthToken: "tok"})
	c := e.client()
	csrf := e.csrf(c)
	if resp, _ := e.post(c, "/login", url.Values{"csrf": {csrf}, "token": {"nope"}}, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d", resp.StatusCode)
	}
	if resp, _ := e.post(c, "/login", url.Values{"token": {"tok"}}, nil); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("login without CSRF token: %d", resp.StatusCode)
	}
	resp, _ := e.post(c, "/login", url.Values{"csrf": {csrf}, "token": {"tok"}, "back": {"//evil.example/"}}, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/workers" {
		t.Fatalf("login: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp, _ = e.post(c, "/action/worker", url.Values{"csrf": {csrf}, "op": {"ping"}, "worker": {"w1@host"}, "back": {"/workers"}}, nil)
	if resp.StatusCode != http.StatusSeeOther || len(e.ctl.take()) != 1 {
		t.Fatalf("ping after login: %d", resp.StatusCode)
	}
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if loc.Path != "/workers" || !strings.Contains(loc.Query().Get("msg"), "done <b>") {
		t.Errorf("redirect to %s", loc)
	}
	_, body := e.get(c, loc.String())
	if !strings.Contains(body, "done &lt;b&gt;") {
		t.Errorf("the outcome is not shown as text")
	}
	e.post(c, "/logout", url.Values{"csrf": {csrf}}, nil)
	if resp, _ := e.post(c, "/action/worker", url.Values{"csrf": {csrf}, "op": {"ping"}, "worker": {"w1@host"}}, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("after logout: %d", resp.StatusCode)
	}
}

// TestWorkerActionsSend checks what each worker action sends.
func TestWorkerActionsSend(t *testing.T) {
	e := newEnv(t, Options{AuthToken: "tok"})
	c := e.client()
	csrf := e.csrf(c)
	bearer := map[string]string{"Authorization": "Bearer tok"}
	for _, tc := range []struct {
		form url.Values
		want string
	}{
		{url.Values{"op": {"pool_grow"}, "n": {"3"}}, `pool_grow {"n":3} [w@h]`},
		{url.Values{"op": {"pool_shrink"}}, `pool_shrink {"n":1} [w@h]`},
		{url.Values{"op": {"rate_limit"}, "task_name": {"tasks.add"}, "rate_limit": {"5/m"}}, `rate_limit {"rate_limit":"5/m","task_name":"tasks.add"} [w@h]`},
		{url.Values{"op": {"shutdown"}, "confirm": {"yes"}}, `shutdown {} [w@h]`},
	} {
		tc.form.Set("csrf", csrf)
		tc.form.Set("worker", "w@h")
		e.post(c, "/action/worker", tc.form, bearer)
		if got := e.ctl.take(); len(got) != 1 || got[0] != tc.want {
			t.Errorf("%v sent %q, want %q", tc.form, got, tc.want)
		}
	}
	e.post(c, "/action/revoke", url.Values{"csrf": {csrf}, "id": {"t9"}, "terminate": {"1"}}, bearer)
	if got := e.ctl.take(); len(got) != 1 || got[0] != `revoke {"signal":"SIGTERM","task_id":["t9"],"terminate":true} []` {
		t.Errorf("revoke terminate sent %q", got)
	}
}

// TestShutdownAsksFirst: shutting a worker down takes a second click, on a
// confirmation page that names the worker; offline workers are listed
// apart, with nothing to act on.
func TestShutdownAsksFirst(t *testing.T) {
	e := newEnv(t, Options{AuthToken: "tok"})
	c := e.client()
	csrf := e.csrf(c)
	bearer := map[string]string{"Authorization": "Bearer tok"}
	resp, body := e.post(c, "/action/worker", url.Values{"csrf": {csrf}, "op": {"shutdown"}, "worker": {"w@h"}}, bearer)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="confirm-shutdown"`) || !strings.Contains(body, "w@h") {
		t.Fatalf("shutdown without confirmation: %d\n%s", resp.StatusCode, body)
	}
	if got := e.ctl.take(); len(got) != 0 {
		t.Fatalf("an unconfirmed shutdown sent %q", got)
	}
	resp, _ = e.post(c, "/action/worker", url.Values{"csrf": {csrf}, "op": {"shutdown"}, "worker": {"w@h"}, "confirm": {"yes"}}, bearer)
	if got := e.ctl.take(); resp.StatusCode != http.StatusSeeOther || len(got) != 1 || got[0] != `shutdown {} [w@h]` {
		t.Fatalf("confirmed shutdown: %d, sent %q", resp.StatusCode, got)
	}

	now := float64(time.Now().UnixNano()) / 1e9
	e.d.store.Apply(map[string]any{"type": "worker-heartbeat", "hostname": "up@h", "timestamp": now, "freq": 2.0})
	e.d.store.Apply(map[string]any{"type": "worker-offline", "hostname": "gone@h", "timestamp": now})
	e.login(c, "tok")
	_, page := e.get(c, "/workers")
	on, off, found := strings.Cut(page, `id="workers-offline"`)
	if !found || !strings.Contains(on, `data-worker="up@h"`) || strings.Contains(on, `data-worker="gone@h"`) ||
		!strings.Contains(off, `data-worker="gone@h"`) || strings.Contains(off, "<button") {
		t.Errorf("workers page: online and offline workers not apart, or actions on an offline one:\n%s", page)
	}
}

// TestPurgeAsksFirst: a purge without confirm=yes shows a confirmation
// page and deletes nothing; the page's form purges.
func TestPurgeAsksFirst(t *testing.T) {
	e := newEnv(t, Options{AuthToken: "tok"})
	e.deadLetters(3)
	c := e.client()
	csrf := e.csrf(c)
	bearer := map[string]string{"Authorization": "Bearer tok"}
	resp, body := e.post(c, "/action/dlq/purge", url.Values{"csrf": {csrf}, "queue": {"q1"}, "all": {"1"}}, bearer)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="confirm-purge"`) || !strings.Contains(body, "all 3") {
		t.Fatalf("purge all: %d\n%s", resp.StatusCode, body)
	}
	if n := e.deadCount(); n != 3 {
		t.Fatalf("%d dead letters after an unconfirmed purge", n)
	}
	resp, body = e.post(c, "/action/dlq/purge", url.Values{"csrf": {csrf}, "queue": {"q1"}, "id": {"dead-1"}}, bearer)
	if !strings.Contains(body, "dead-1") || e.deadCount() != 3 {
		t.Fatalf("purge one: %d\n%s", resp.StatusCode, body)
	}
	resp, _ = e.post(c, "/action/dlq/purge", url.Values{"csrf": {csrf}, "queue": {"q1"}, "id": {"dead-1"}, "confirm": {"yes"}}, bearer)
	if resp.StatusCode != http.StatusSeeOther || e.deadCount() != 2 {
		t.Fatalf("confirmed purge: %d, %d left", resp.StatusCode, e.deadCount())
	}
	// An empty selection is refused, never taken as "all".
	e.post(c, "/action/dlq/purge", url.Values{"csrf": {csrf}, "queue": {"q1"}, "confirm": {"yes"}}, bearer)
	e.post(c, "/action/dlq/replay", url.Values{"csrf": {csrf}, "queue": {"q1"}}, bearer)
	if n := e.deadCount(); n != 2 {
		t.Fatalf("an empty selection changed the dead letters: %d left", n)
	}
	// Unknown ids: nothing done.
	resp, _ = e.post(c, "/action/dlq/replay", url.Values{"csrf": {csrf}, "queue": {"q1"}, "id": {"dead-0", "nope"}}, bearer)
	if loc := resp.Header.Get("Location"); !strings.Contains(loc, "nothing+done") || e.deadCount() != 2 {
		t.Fatalf("replay with an unknown id: %s, %d left", loc, e.deadCount())
	}
	// Replay with reset: the message is back in its queue with retries 0.
	e.post(c, "/action/dlq/replay", url.Values{"csrf": {csrf}, "queue": {"q1"}, "id": {"dead-0"}, "reset_retries": {"1"}}, bearer)
	if n, _ := e.tr.Len(t.Context(), "q1"); n != 1 || e.deadCount() != 1 {
		t.Fatalf("after replay: %d ready, %d dead", n, e.deadCount())
	}
}

// TestEventsStream: a change to the history reaches an SSE client.
func TestEventsStream(t *testing.T) {
	e := newEnv(t, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	rd := bufio.NewReader(resp.Body)
	if line, _ := rd.ReadString('\n'); !strings.HasPrefix(line, "retry:") {
		t.Fatalf("first line %q", line)
	}
	e.d.Store().Apply(ev("task-received", "a"))
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line == "event: change\n" {
			break
		}
	}
	// The event carries the counts the page header shows.
	if line, _ := rd.ReadString('\n'); !strings.Contains(line, `"tasks":1`) {
		t.Errorf("change event data %q", line)
	}
}

// TestRunIngests: Run subscribes to the celeryev exchange, reads single
// events and task.multi lists, and asks workers for stats and queues.
func TestRunIngests(t *testing.T) {
	e := newEnv(t, Options{EnableEvents: true, RefreshEvery: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- e.d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	pub := func(rk string, body any) {
		b, _ := json.Marshal(body)
		if err := e.tr.Publish(ctx, &transport.Publishing{Exchange: "celeryev", ExchangeType: transport.Topic, RoutingKey: rk,
			Message: protocol.Message{ContentType: "application/json", Body: b}}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The subscription starts asynchronously: publish until seen.
		pub("worker.heartbeat", map[string]any{"type": "worker-heartbeat", "hostname": "py@h", "sw_ident": "py-celery", "freq": 2.0, "timestamp": float64(time.Now().Unix())})
		pub("task.multi", []any{ev("task-received", "m1", "name", "tasks.add"), ev("task-succeeded", "m1", "result", "3")})
		pub("task.x", "not an event")
		pub("task.y", []any{1, "x"})
		if m1, ok := e.d.Store().Task("m1"); ok && m1.State == StateSuccess && len(e.d.Store().Workers()) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("events not ingested")
		}
		time.Sleep(20 * time.Millisecond)
	}
	calls := strings.Join(e.ctl.take(), "\n")
	for _, want := range []string{"enable_events", "stats", "active_queues"} {
		if !strings.Contains(calls, want) {
			t.Errorf("Run did not send %s: %s", want, calls)
		}
	}
}

func FuzzIngest(f *testing.F) {
	f.Add([]byte(`{"type":"task-received","uuid":"a","args":"()","timestamp":1.5}`))
	f.Add([]byte(`[{"type":"task-succeeded","uuid":"a","runtime":0.1,"name":"n"},{"type":"worker-offline","hostname":"h"}]`))
	f.Add([]byte(`{"type":"worker-heartbeat","hostname":"h","loadavg":[1,2,3,4],"freq":1e308,"timestamp":-1}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		defer fuzzwatch.Watch(t, body)()
		d, err := New(Options{Transport: memory.New(memory.Config{}), Control: &fakeControl{}, MaxTasks: 4})
		if err != nil {
			t.Fatal(err)
		}
		defer d.o.Transport.Close()
		d.ingest(protocol.Message{ContentType: "application/json", Body: body})
		d.store.Tasks(Filter{}, 0, 10)
		d.store.Workers()
		for _, n := range d.store.Names() {
			plot(n, d.store.Series(n, time.Now()))
		}
	})
}

type fakeInspector map[string]QueueDetail

func (f fakeInspector) Inspect(_ context.Context, q string) (QueueDetail, error) {
	d, ok := f[q]
	if !ok {
		return QueueDetail{}, fmt.Errorf("no queue <%s>", q)
	}
	return d, nil
}

// TestQueuesPage: depths from transport.Admin, and what an inspector adds
// (consumers, RabbitMQ's max priority, Redis's bands), rates between
// samples, and errors shown as text.
func TestQueuesPage(t *testing.T) {
	e := newEnv(t, Options{RefreshEvery: 5 * time.Second})
	for range 3 {
		if err := e.tr.Publish(t.Context(), &transport.Publishing{RoutingKey: "q1", Message: protocol.Message{ContentType: "application/json", Body: []byte("[]")}}); err != nil {
			t.Fatal(err)
		}
	}
	c := e.client()
	_, body := e.get(c, "/queues")
	if !strings.Contains(body, `<td class="depth">3</td>`) {
		t.Fatalf("depth of q1:\n%s", body)
	}
	// The previous sample is made 10 s old rather than waited for.
	e.d.qmu.Lock()
	e.d.samples["q1"].at = e.d.samples["q1"].at.Add(-10 * time.Second)
	e.d.sampled = e.d.sampled.Add(-10 * time.Second)
	e.d.qmu.Unlock()
	if _, err := e.tr.Purge(t.Context(), "q1"); err != nil {
		t.Fatal(err)
	}
	_, body = e.get(c, "/queues")
	if !strings.Contains(body, `<td class="depth">0</td>`) || !regexp.MustCompile(`<td>-0\.[23]\d/s</td>`).MatchString(body) {
		t.Fatalf("after purge, want depth 0 at about -0.30/s:\n%s", body)
	}

	e = newEnv(t, Options{RefreshEvery: time.Millisecond, Queues: []string{"rabbit", "redis", "gone"}, Inspector: fakeInspector{
		"q1":     {Depth: 1, Consumers: 2, MaxPriority: 0},
		"rabbit": {Depth: 7, Consumers: 1, MaxPriority: 10},
		"redis":  {Depth: 5, Consumers: -1, MaxPriority: -1, Bands: []QueueBand{{0, 2}, {3, 0}, {6, 0}, {9, 3}}},
	}})
	_, body = e.get(e.client(), "/queues")
	for _, want := range []string{"x-max-priority 10", "band 0: 2", "band 9: 3", `<td class="depth">7</td>`, "no queue &lt;gone&gt;", "<td>none</td>"} {
		if !strings.Contains(body, want) {
			t.Errorf("queues page lacks %q:\n%s", want, body)
		}
	}
}

// TestBrokerDownBanner: when no queue can be sampled, the pages say the
// broker does not answer (banner, header) and show depths as unknown, not
// as 0.
func TestBrokerDownBanner(t *testing.T) {
	e := newEnv(t, Options{AuthToken: "tok"})
	c := e.client()
	e.login(c, "tok")
	e.d.sampleQueues(t.Context())
	if _, body := e.get(c, "/queues"); strings.Contains(body, `id="broker-down">The broker`) || !strings.Contains(body, `<td class="depth">0</td>`) {
		t.Fatalf("broker up: banner shown or depth missing:\n%s", body)
	}
	e.tr.Close()
	e.d.sampleQueues(t.Context())
	_, body := e.get(c, "/queues")
	if !strings.Contains(body, `id="broker-down">The broker does not answer since `) || !strings.Contains(body, " UTC: ") ||
		!strings.Contains(body, `<span id="live-state">broker down</span>`) {
		t.Errorf("broker down: no banner:\n%s", body)
	}
	if strings.Contains(body, `<td class="depth">0</td>`) || !strings.Contains(body, `<span class="unknown"`) {
		t.Errorf("broker down: depth not shown as unknown:\n%s", body)
	}
	if down, since := e.d.BrokerDown(); down == "" || since.IsZero() {
		t.Errorf("BrokerDown() = %q, %v", down, since)
	}
}

// TestTasksSearchAndPageSize: the search box finds a task by a part of its
// id, args, kwargs, result or exception; the page size is one on offer.
func TestTasksSearchAndPageSize(t *testing.T) {
	e := newEnv(t, Options{})
	s := e.d.store
	s.Apply(at(1, ev("task-received", "aaaa-1111", "name", "tasks.add", "args", "(1, 2)", "kwargs", "{'order': 'A-77'}")))
	s.Apply(at(2, ev("task-received", "bbbb-2222", "name", "tasks.add", "args", "('x',)", "eta", "2026-12-04T10:00:00+00:00")))
	s.Apply(at(3, ev("task-failed", "bbbb-2222", "exception", "KeyError('sku-9')")))
	for i := range 60 {
		s.Apply(at(4+float64(i), ev("task-received", fmt.Sprintf("filler-%02d", i), "name", "tasks.noop")))
	}
	c := e.client()
	for q, want := range map[string]string{"1111": "aaaa-1111", "A-77": "aaaa-1111", "sku-9": "bbbb-2222", "'x'": "bbbb-2222"} {
		_, body := e.get(c, "/tasks?q="+url.QueryEscape(q))
		if !strings.Contains(body, "1 task(s)") || !strings.Contains(body, `data-task="`+want+`"`) {
			t.Errorf("search %q does not find %s alone:\n%s", q, want, body)
		}
	}
	if _, body := e.get(c, "/tasks?q=bbbb"); !strings.Contains(body, "2026-12-04T10:00:00") {
		t.Errorf("no ETA column:\n%s", body)
	}
	_, body := e.get(c, "/tasks?size=20")
	if n := strings.Count(body, `<tr class="task"`); n != 20 || !strings.Contains(body, "page 1 of 4") || !strings.Contains(body, "size=20") {
		t.Errorf("size=20: %d rows", n)
	}
	if _, body := e.get(c, "/tasks?size=100000"); strings.Count(body, `<tr class="task"`) != 50 {
		t.Errorf("a page size not on offer is not refused for the default")
	}
}

// workerControl answers a worker page's questions as a celeriac worker
// does, and records the rest.
type workerControl struct{ fakeControl }

func (c *workerControl) Call(ctx context.Context, method string, args map[string]any, o client.ControlOptions) ([]client.Reply, error) {
	var v any
	switch method {
	case "stats":
		v = map[string]any{"pid": int64(4242), "prefetch_count": int64(400),
			"pool":       map[string]any{"max-concurrency": int64(100)},
			"autoscaler": map[string]any{"max": int64(100), "min": int64(10), "qty": int64(40)},
			"total":      map[string]any{"tasks.add": int64(7), "<b>tasks.x</b>": int64(1)}}
	case "registered":
		v = []any{"tasks.mul", "tasks.add [rate_limit=10/s]"}
	case "active_queues":
		v = []any{map[string]any{"name": "celery"}, map[string]any{"name": "high"}}
	case "active":
		v = []any{map[string]any{"id": "t-run", "name": "tasks.sleep", "args": []any{5}, "time_start": 1.7e9}}
	default:
		return c.fakeControl.Call(ctx, method, args, o)
	}
	return []client.Reply{{Hostname: o.Destination[0], Value: v}}, nil
}

// TestWorkerPage: a worker's page shows its replies to stats, registered,
// active_queues and active, escaped, and offers Flower's controls, which
// send what Celery's remote control expects and come back to the page.
func TestWorkerPage(t *testing.T) {
	tr := memory.New(memory.Config{})
	t.Cleanup(func() { tr.Close() })
	ctl := &workerControl{}
	d, err := New(Options{Transport: tr, Control: ctl, BrokerScheme: "memory", AuthToken: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)
	e := &env{t: t, d: d, srv: srv, ctl: &ctl.fakeControl, tr: tr, queue: "q1"}
	c := e.client()
	e.login(c, "tok")
	code, body := e.get(c, "/worker/w1@host")
	for _, want := range []string{"100 slots", "autoscale: max 100, min 10, now 40", `id="worker-prefetch">400<`, "pid 4242",
		"tasks.add [rate_limit=10/s]", "celery, high", "t-run", "&lt;b&gt;tasks.x&lt;/b&gt;", `value="autoscale"`, `value="add_consumer"`, `value="time_limit"`} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("worker page lacks %s (%d)", want, code)
		}
	}
	if strings.Contains(body, "<b>tasks.x</b>") {
		t.Error("a task name from a reply is not escaped")
	}
	csrf := e.csrf(c)
	bearer := map[string]string{"Authorization": "Bearer tok"}
	for _, tc := range []struct {
		form url.Values
		want string
	}{
		{url.Values{"op": {"autoscale"}, "max": {"20"}, "min": {"2"}}, `autoscale {"max":20,"min":2} [w@h]`},
		{url.Values{"op": {"add_consumer"}, "queue": {"high"}}, `add_consumer {"queue":"high"} [w@h]`},
		{url.Values{"op": {"cancel_consumer"}, "queue": {"high"}}, `cancel_consumer {"queue":"high"} [w@h]`},
		{url.Values{"op": {"time_limit"}, "task_name": {"tasks.add"}, "soft": {"10"}, "hard": {"20"}}, `time_limit {"hard":20,"soft":10,"task_name":"tasks.add"} [w@h]`},
		{url.Values{"op": {"autoscale"}, "max": {"2"}, "min": {"5"}}, ""},
		{url.Values{"op": {"add_consumer"}}, ""},
	} {
		tc.form.Set("csrf", csrf)
		tc.form.Set("worker", "w@h")
		tc.form.Set("back", "/worker/w@h")
		resp, _ := e.post(c, "/action/worker", tc.form, bearer)
		got := ctl.take()
		if tc.want == "" && len(got) != 0 || tc.want != "" && (len(got) != 1 || got[0] != tc.want) {
			t.Errorf("%v sent %q, want %q", tc.form, got, tc.want)
		}
		if loc := resp.Header.Get("Location"); !strings.HasPrefix(loc, "/worker/w@h") {
			t.Errorf("%v went back to %q", tc.form, loc)
		}
	}
}

// TestURLPrefix: behind a reverse proxy at /flower every link, form,
// redirect and the event stream carry the prefix, and nothing answers
// outside it.
func TestURLPrefix(t *testing.T) {
	e := newEnv(t, Options{AuthToken: "tok", URLPrefix: "/flower/"})
	c := e.client()
	if code, _ := e.get(c, "/workers"); code != http.StatusNotFound {
		t.Errorf("/workers outside the prefix: %d", code)
	}
	if code, _ := e.get(c, "/flowerx/workers"); code != http.StatusNotFound {
		t.Errorf("/flowerx/workers: %d", code)
	}
	resp, err := c.Get(e.srv.URL + "/flower/tasks")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/flower/login?back=%2Ftasks") {
		t.Fatalf("unauthenticated: %d to %q", resp.StatusCode, loc)
	}
	_, body := e.get(c, "/flower/login")
	m := csrfRE.FindStringSubmatch(body)
	if m == nil || !strings.Contains(body, `action="/flower/login"`) || !strings.Contains(body, `href="/flower/static/app.css"`) {
		t.Fatalf("login page without the prefix:\n%s", body)
	}
	resp, _ = e.post(c, "/flower/login", url.Values{"csrf": {m[1]}, "token": {"tok"}, "back": {"/tasks"}}, nil)
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/flower/tasks" {
		t.Fatalf("login: %d to %q", resp.StatusCode, loc)
	}
	code, body := e.get(c, "/flower/workers")
	if code != 200 || !strings.Contains(body, `data-prefix="/flower"`) || !strings.Contains(body, `href="/flower/tasks"`) ||
		strings.Contains(body, `href="/tasks"`) || strings.Contains(body, `action="/action`) {
		t.Errorf("workers page: %d\n%s", code, body)
	}
	if code, body := e.get(c, "/flower/api/workers"); code != 200 || !strings.HasPrefix(body, "{") {
		t.Errorf("/flower/api/workers: %d %s", code, body)
	}
	for _, bad := range []string{"a/../b", "x y", "/ok/", "a//b"} {
		_, err := New(Options{Transport: e.tr, URLPrefix: bad})
		if (err == nil) != (bad == "/ok/") {
			t.Errorf("URLPrefix %q: %v", bad, err)
		}
	}
}

// TestStatsAllTasks: the throughput page leads with every task's
// completions and runtimes, and the queue wait (received to started).
func TestStatsAllTasks(t *testing.T) {
	e := newEnv(t, Options{})
	now := float64(time.Now().UnixNano()) / 1e9
	for i, name := range []string{"tasks.a", "tasks.b", "tasks.b"} {
		id := fmt.Sprintf("s%d", i)
		e.d.store.Apply(map[string]any{"type": "task-received", "uuid": id, "name": name, "hostname": "w", "timestamp": now - 3})
		e.d.store.Apply(map[string]any{"type": "task-started", "uuid": id, "hostname": "w", "timestamp": now - 1})
		e.d.store.Apply(map[string]any{"type": "task-succeeded", "uuid": id, "hostname": "w", "timestamp": now, "runtime": 0.5})
	}
	e.d.store.Apply(map[string]any{"type": "task-failed", "uuid": "s9", "name": "tasks.a", "hostname": "w", "timestamp": now})
	all, waits := e.d.store.SeriesAll(time.Now())
	last, lastWait := all[len(all)-1], waits[len(waits)-1]
	if last.Succeeded != 3 || last.Failed != 1 || last.P50 != 0.5 || lastWait.Succeeded != 3 || lastWait.P50 < 1.99 || lastWait.P50 > 2.01 {
		t.Errorf("all %+v, waits %+v", last, lastWait)
	}
	_, body := e.get(e.client(), "/stats")
	if !strings.Contains(body, `id="stats-all"`) || !strings.Contains(body, "queue wait p50 2") || strings.Count(body, `<svg class="plot"`) < 4 {
		t.Errorf("stats page:\n%s", body)
	}
}

// TestWorkflow: a task's page shows the canvas it is part of, as a tree
// under its root: a chain's steps under the step that sent them, a
// group's members side by side, with their states.
func TestWorkflow(t *testing.T) {
	e := newEnv(t, Options{})
	s := e.d.store
	s.Apply(at(1, ev("task-received", "root", "name", "tasks.a", "root_id", "root")))
	s.Apply(at(2, ev("task-succeeded", "root", "result", "1")))
	s.Apply(at(3, ev("task-received", "g1", "name", "tasks.b", "root_id", "root", "parent_id", "root")))
	s.Apply(at(4, ev("task-received", "g2", "name", "tasks.b", "root_id", "root", "parent_id", "root")))
	s.Apply(at(5, ev("task-failed", "g2", "exception", "ValueError('g2')")))
	s.Apply(at(6, ev("task-received", "body", "name", "tasks.sum", "root_id", "root", "parent_id", "g1")))
	s.Apply(at(7, ev("task-received", "other", "name", "tasks.x", "root_id", "elsewhere")))
	wf := s.Workflow("root", 10)
	var got []string
	for _, n := range wf {
		got = append(got, fmt.Sprintf("%s@%d:%s", n.ID, n.Depth, n.State))
	}
	if want := "root@0:SUCCESS g1@1:RECEIVED body@2:RECEIVED g2@1:FAILURE"; strings.Join(got, " ") != want {
		t.Errorf("workflow %q, want %q", strings.Join(got, " "), want)
	}
	if n := len(s.Workflow("root", 2)); n != 2 {
		t.Errorf("limit 2: %d tasks", n)
	}
	_, body := e.get(e.client(), "/task/body")
	if !strings.Contains(body, `id="task-workflow"`) || !strings.Contains(body, `data-task="g2" data-depth="1"`) || !strings.Contains(body, "ValueError(&#39;g2&#39;)") ||
		!strings.Contains(body, `<strong>body</strong>`) || strings.Contains(body, `data-task="other"`) || strings.Contains(body, "style=") {
		t.Errorf("task page of a workflow member:\n%s", body)
	}
	if _, body := e.get(e.client(), "/task/other"); strings.Contains(body, `id="task-workflow"`) {
		t.Error("a task alone shows a workflow")
	}
}

// TestWorkerPageAsksOncePerRefresh: the worker page is live; its refreshes
// within RefreshEvery reuse the worker's replies instead of asking again.
func TestWorkerPageAsksOncePerRefresh(t *testing.T) {
	tr := memory.New(memory.Config{})
	t.Cleanup(func() { tr.Close() })
	ctl := &countingControl{}
	d, err := New(Options{Transport: tr, Control: ctl, BrokerScheme: "memory", RefreshEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)
	e := &env{t: t, d: d, srv: srv, tr: tr}
	c := e.client()
	for range 5 {
		if code, body := e.get(c, "/worker/w1@host"); code != 200 || !strings.Contains(body, "pid 4242") {
			t.Fatalf("worker page: %d", code)
		}
	}
	if n := ctl.calls.Load(); n != 4 {
		t.Errorf("5 views asked %d questions, want the first view's 4", n)
	}
}

type countingControl struct {
	workerControl
	calls atomic.Int32
}

func (c *countingControl) Call(ctx context.Context, method string, args map[string]any, o client.ControlOptions) ([]client.Reply, error) {
	c.calls.Add(1)
	return c.workerControl.Call(ctx, method, args, o)
}

// countingInspector is a fakeInspector that also counts unacked messages
// in one pass, as the Redis adapter does.
type countingInspector struct {
	fakeInspector
	counts UnackedCounts
	err    error
}

func (c countingInspector) CountUnacked(context.Context) (UnackedCounts, error) {
	return c.counts, c.err
}

// TestQueuesUnacked: the unacked column and /api/queues/length show the
// inspector's count, a lower bound as "≥N", and an unknown one as "?" with
// the reason, never as 0; a one-pass counter's counts replace Inspect's.
func TestQueuesUnacked(t *testing.T) {
	insp := fakeInspector{
		"q1":     {Depth: 1, Consumers: 2, Unacked: 3, PublishRate: 1.5, AckRate: 0.25, HasRates: true},
		"nomgmt": {Depth: 2, Consumers: 1, Unacked: -1},
		"failed": {Depth: 2, Consumers: 1, Unacked: -1, UnackedErr: "management API <x>: 401 Unauthorized"},
	}
	e := newEnv(t, Options{RefreshEvery: time.Millisecond, Queues: []string{"nomgmt", "failed"}, Inspector: insp})
	_, body := e.get(e.client(), "/queues")
	for _, want := range []string{`<td class="unacked">3</td>`, "1.50/s / 0.25/s", "give --broker-api", "401 Unauthorized", "management API &lt;x&gt;"} {
		if !strings.Contains(body, want) {
			t.Errorf("queues page lacks %q:\n%s", want, body)
		}
	}
	if n := strings.Count(body, `<td class="unacked"><span class="unknown"`); n != 2 {
		t.Errorf("%d unknown unacked counts, want 2:\n%s", n, body)
	}
	_, body = e.get(e.client(), "/api/queues/length")
	for _, want := range []string{`{"consumers":2,"messages":1,"messages_ready":1,"messages_unacknowledged":3,"name":"q1"}`, `{"consumers":1,"messages":2,"messages_ready":2,"name":"nomgmt"}`} {
		if !strings.Contains(body, want) {
			t.Errorf("/api/queues/length lacks %s:\n%s", want, body)
		}
	}

	_, body = e.get(e.client(), "/metrics")
	if !strings.Contains(body, `celeriac_dashboard_queue_unacked{queue="q1"} 3`) || strings.Contains(body, `celeriac_dashboard_queue_unacked{queue="nomgmt"}`) {
		t.Errorf("/metrics:\n%s", body)
	}

	e = newEnv(t, Options{RefreshEvery: time.Millisecond, Queues: []string{"nomgmt"}, Inspector: countingInspector{
		fakeInspector: insp, counts: UnackedCounts{ByQueue: map[string]int{"q1": 1000, "other": 5}, AtLeast: true}}})
	_, body = e.get(e.client(), "/queues")
	if !strings.Contains(body, "≥1000</span>") || !strings.Contains(body, "≥0</span>") {
		t.Errorf("lower bounds not marked:\n%s", body)
	}
	_, body = e.get(e.client(), "/api/queues/length")
	if !strings.Contains(body, `"messages_unacknowledged":1000,"messages_unacknowledged_at_least":true`) {
		t.Errorf("/api/queues/length: %s", body)
	}
	e = newEnv(t, Options{RefreshEvery: time.Millisecond, Inspector: countingInspector{fakeInspector: insp, err: fmt.Errorf("redis: unacked: <boom>")}})
	if _, body = e.get(e.client(), "/queues"); !strings.Contains(body, `title="redis: unacked: &lt;boom&gt;">?</span>`) {
		t.Errorf("count error not shown:\n%s", body)
	}
}

// TestTasksSort: the sortable columns order the whole history (not the
// page), toggle between ascending and descending, keep the other filters,
// and keep newest first among equal keys; an unknown order is the default.
func TestTasksSort(t *testing.T) {
	e := newEnv(t, Options{})
	s := e.d.store
	s.Apply(at(1, ev("task-received", "t-b", "name", "tasks.b", "hostname", "w2@h")))
	s.Apply(at(2, ev("task-received", "t-a", "name", "tasks.a", "hostname", "w1@h")))
	s.Apply(at(3, ev("task-received", "t-c", "name", "tasks.c", "hostname", "w1@h")))
	s.Apply(at(4, ev("task-succeeded", "t-c", "runtime", 0.5, "hostname", "w1@h")))
	s.Apply(at(5, ev("task-succeeded", "t-a", "runtime", 2.0, "hostname", "w1@h")))
	s.Apply(at(6, ev("task-succeeded", "t-b", "runtime", 1.0, "hostname", "w2@h")))
	order := func(body string) string {
		var ids []string
		for _, part := range strings.Split(body, `<tr class="task" data-task="`)[1:] {
			id, _, _ := strings.Cut(part, `"`)
			ids = append(ids, id)
		}
		return strings.Join(ids, ",")
	}
	c := e.client()
	for _, tc := range []struct{ query, want string }{
		{"", "t-c,t-a,t-b"}, // newest first
		{"sort=name", "t-a,t-b,t-c"},
		{"sort=-name", "t-c,t-b,t-a"},
		{"sort=runtime", "t-c,t-b,t-a"},
		{"sort=-runtime", "t-a,t-b,t-c"},
		{"sort=worker", "t-c,t-a,t-b"}, // w1 (newest first), then w2
		{"sort=received", "t-b,t-a,t-c"},
		{"sort=name&size=20&page=1&worker=w1", "t-a,t-c"},
		{"sort=bogus", "t-c,t-a,t-b"},
	} {
		_, body := e.get(c, "/tasks?"+tc.query)
		if got := order(body); got != tc.want {
			t.Errorf("/tasks?%s: %s, want %s", tc.query, got, tc.want)
		}
	}
	_, body := e.get(c, "/tasks?sort=name&worker=w1")
	if !strings.Contains(body, `aria-sort="ascending"><a href="/tasks?page=1&amp;sort=-name&amp;worker=w1" data-sort="name">Name ▲</a>`) {
		t.Errorf("the sorted column does not offer the reverse order with the filters kept:\n%s", body)
	}
	if !strings.Contains(body, `<a href="/tasks?page=1&amp;sort=runtime&amp;worker=w1" data-sort="runtime">Runtime</a>`) {
		t.Errorf("another column does not offer its order:\n%s", body)
	}
	if tasks, total := s.Tasks(Filter{Sort: "-runtime"}, 1, 1); total != 3 || len(tasks) != 1 || tasks[0].ID != "t-b" {
		t.Errorf("Tasks(-runtime, offset 1, limit 1) = %v, %d", tasks, total)
	}
}
