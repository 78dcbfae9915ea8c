package dashboard

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// Bounds FuzzHandler holds every request to.
const (
	fuzzMaxResponse = 1 << 20
	fuzzMaxTime     = 5 * time.Second // generous: the race detector, a shared machine
	fuzzMaxAlloc    = 128 << 20
)

var (
	fuzzOnce sync.Once
	fuzzDash *Dashboard
	fuzzErr  error
)

// fuzzDashboard is one dashboard with some of everything (tasks, workers,
// dead letters, an expanding result), with credentials and a backend,
// shared by all inputs (New and the fixture cost more than a request).
func fuzzDashboard() (*Dashboard, error) {
	fuzzOnce.Do(func() {
		tr := memory.New(memory.Config{})
		d, err := New(Options{Transport: tr, Control: nopControl{}, BrokerScheme: "memory", Queues: []string{"q1"},
			AuthToken: "tok", BasicAuth: map[string]string{"ops": "pw"}, Backend: expandingBackend{}, MaxTasks: 100})
		if err != nil {
			fuzzErr = err
			return
		}
		s := d.Store()
		s.Apply(map[string]any{"type": "worker-online", "hostname": "w1@host", "freq": 2.0, "timestamp": float64(time.Now().Unix())})
		s.Apply(ev("task-received", "t1", "name", "tasks.add", "args", "(1, 2)"))
		s.Apply(ev("task-failed", "t1", "exception", "ValueError('x')", "traceback", strings.Repeat("tb\n", 100)))
		ctx := context.Background()
		_ = tr.Publish(ctx, &transport.Publishing{RoutingKey: "q1", Message: protocol.Message{
			ContentType: "application/json", Headers: map[string]any{"id": "dead-0", "task": "tasks.fail"}, Body: []byte(`[[1], {}, {}]`)}})
		cons, err := tr.Consume(ctx, []transport.Queue{{Name: "q1"}}, transport.ConsumeOptions{})
		if err != nil {
			fuzzErr = err
			return
		}
		dl := <-cons.Deliveries()
		_ = dl.DeadLetter(ctx, transport.DeadLetterReason{Reason: "permanent", Error: "ValueError()", Time: time.Now()})
		_ = cons.Stop(ctx)
		fuzzDash = d
	})
	return fuzzDash, fuzzErr
}

// FuzzHandler sends the dashboard requests of any method, path, query,
// form and headers (and with or without credentials and the CSRF token)
// and checks that none panics, takes long, allocates much or answers
// more than fuzzMaxResponse bytes, that every answer carries the security
// headers, and that no redirect leaves the dashboard.
func FuzzHandler(f *testing.F) {
	f.Add("GET", "/workers", "", "", "", byte(1))
	f.Add("GET", "/tasks", "name=<script>&state=x&page=99999999999999999999&since=-1h&until=9999-99-99", "", "", byte(1))
	f.Add("GET", "/task/big", "", "", "", byte(1))
	f.Add("GET", "/task/"+strings.Repeat("%ff", 100), "", "", "", byte(1))
	f.Add("GET", "/dlq/show", "queue=q1&id=dead-0", "", "", byte(1))
	f.Add("GET", "/dlq", "queue=q1", "", "", byte(3))
	f.Add("GET", "/login", "back=/\t/evil.example", "", "", byte(0))
	f.Add("POST", "/login", "", "token=tok&back=%2F%09%2Fevil.example%2Fphish", "", byte(2))
	f.Add("POST", "/action/worker", "", "op=rate_limit&worker=w1@host&task_name=x&rate_limit=1/s&back=//evil", "null", byte(3))
	f.Add("POST", "/action/dlq/purge", "", "queue=q1&all=1", "", byte(3))
	f.Add("POST", "/action/revoke", "", "id=t1&terminate=1&back=/\\evil", "http://127.0.0.1", byte(3))
	f.Add("GET", "/static/../templates/layout.html", "", "", "", byte(0))
	f.Add("GET", "/events", "", "", "", byte(0))
	f.Add("GET", "/api/tasks", "limit=99999999999999999999&offset=-1&received_start=1e308&state=FAILURE", "", "", byte(1))
	f.Add("GET", "/api/task/info/t1", "", "", "", byte(1))
	f.Add("GET", "/api/workers", "status=true", "", "", byte(0))
	f.Add("POST", "/api/task/async-apply/tasks.add", "", `{"args": [1, [2, [3]]], "kwargs": {"a": {}}, "eta": "x"}`, "", byte(33))
	f.Add("POST", "/api/task/revoke/t1", "terminate=true&signal=SIGKILL", "{}", "", byte(33))
	f.Add("POST", "/api/task/rate-limit/tasks.add", "", `{"ratelimit": 5}`, "http://evil.example", byte(33))
	f.Add("GET", "/metrics", "", "", "", byte(1))
	f.Fuzz(func(t *testing.T, method, path, query, form, origin string, flags byte) {
		defer fuzzwatch.Watch(t, method, path, query, form, origin, flags)()
		d, err := fuzzDashboard()
		if err != nil {
			t.Fatal(err)
		}
		if path == "/events" && flags&1 != 0 {
			return // a stream, by design unbounded in time
		}
		req := &http.Request{
			Method: method, URL: &url.URL{Path: path, RawQuery: query}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{}, Host: "127.0.0.1:5555", RemoteAddr: "192.0.2.1:1234",
			Body: http.NoBody, RequestURI: (&url.URL{Path: path, RawQuery: query}).RequestURI(),
		}
		if form != "" {
			req.Body = httpBody(form)
			req.ContentLength = int64(len(form))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if flags&1 != 0 {
			req.Header.Set("Authorization", "Bearer tok")
		}
		if flags&2 != 0 {
			csrf := strings.Repeat("c", 32)
			req.AddCookie(&http.Cookie{Name: csrfCookie, Value: csrf})
			if req.Body != http.NoBody {
				req.Body = httpBody(form + "&csrf=" + d.mac("csrf", csrf))
				req.ContentLength = -1
			}
		}
		if flags&4 != 0 {
			req.Header.Set("X-Fragment", "1")
		}
		if flags&8 != 0 {
			req.Host = origin
		}
		if flags&16 != 0 {
			req.RemoteAddr = origin // any text: no client key may fail
		}
		if flags&32 != 0 && form != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		// Forget failed logins: the fuzzer would block itself.
		d.limiter.mu.Lock()
		d.limiter.m = nil
		d.limiter.mu.Unlock()

		rec := httptest.NewRecorder()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		done := make(chan struct{})
		go func() {
			defer close(done)
			d.Handler().ServeHTTP(rec, req)
		}()
		select {
		case <-done:
		case <-time.After(fuzzMaxTime):
			t.Fatalf("%s %q?%q took over %v", method, path, query, fuzzMaxTime)
		}
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > fuzzMaxAlloc {
			t.Errorf("%s %q?%q allocated %d bytes", method, path, query, n)
		}
		if n := rec.Body.Len(); n > fuzzMaxResponse {
			t.Errorf("%s %q?%q answered %d bytes", method, path, query, n)
		}
		if rec.Header().Get("Content-Security-Policy") == "" {
			t.Errorf("%s %q: no security headers", method, path)
		}
		if loc := rec.Header().Get("Location"); loc != "" {
			// As a browser reads it: tabs and newlines dropped (and
			// leading controls and spaces), backslashes as slashes. A
			// path-absolute reference ("/x", never "//x") has no host.
			norm := strings.NewReplacer("\t", "", "\n", "", "\r", "", "\\", "/").Replace(loc)
			norm = strings.TrimLeft(norm, "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f ")
			if !strings.HasPrefix(norm, "/") || strings.HasPrefix(norm, "//") {
				t.Errorf("%s %q?%q redirects off the dashboard: %q", method, path, query, loc)
			}
		}
	})
}

// nopControl answers every command and keeps nothing (fakeControl's
// record would grow with every input).
type nopControl struct{}

func (nopControl) Call(context.Context, string, map[string]any, client.ControlOptions) ([]client.Reply, error) {
	return []client.Reply{{Hostname: "w1@host", Value: map[string]any{"ok": "pong"}}}, nil
}

func (nopControl) Cast(context.Context, string, map[string]any, client.ControlOptions) error {
	return nil
}

type body struct{ *strings.Reader }

func (body) Close() error { return nil }

func httpBody(s string) body { return body{strings.NewReader(s)} }
