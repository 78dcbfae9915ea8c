package dashboard

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/memory"
)

// serve runs one request through the handler and returns the response.
func serve(d *Dashboard, method, target, host string, hdr map[string]string, body string) *http.Response {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	req.Host = host
	if body != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	d.Handler().ServeHTTP(rec, req)
	return rec.Result()
}

// routeTarget is a request target that reaches rt.
func routeTarget(rt route) (method, target string) {
	method, path, _ := strings.Cut(rt.pattern, " ")
	path = strings.ReplaceAll(path, "{$}", "")
	path = strings.ReplaceAll(path, "{id}", "t1")
	path = strings.ReplaceAll(path, "{file}", "app.css")
	if path == "/dlq/show" {
		path += "?queue=q1&id=dead-0"
	}
	return method, path
}

// TestEveryRouteNeedsCredentials (issue 26, finding 6): with credentials
// configured, every route but the login form, logout and the static
// files refuses a request without them, the event stream included; and
// every route, those too, refuses a Host that is not the dashboard's.
// The routes are enumerated from the table Handler registers.
func TestEveryRouteNeedsCredentials(t *testing.T) {
	e := newEnv(t, Options{AuthToken: "tok"})
	e.d.Store().Apply(ev("task-received", "t1", "name", "tasks.secret", "args", "('s3cret-arg',)"))
	e.deadLetters(1)
	public := map[string]bool{"GET /login": true, "POST /login": true, "POST /logout": true, "GET /static/{file}": true}
	routes := e.d.routes()
	if len(routes) < 17 {
		t.Fatalf("only %d routes", len(routes))
	}
	for _, rt := range routes {
		if rt.public != public[rt.pattern] {
			t.Errorf("%s: public %v", rt.pattern, rt.public)
		}
		method, target := routeTarget(rt)
		resp := serve(e.d, method, target, "127.0.0.1:5555", nil, "")
		b, _ := io.ReadAll(resp.Body)
		if !rt.public {
			if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusSeeOther {
				t.Errorf("%s without credentials: %d", rt.pattern, resp.StatusCode)
			}
			if strings.Contains(string(b), "s3cret") || strings.Contains(string(b), "tasks.secret") || strings.Contains(string(b), "bold") {
				t.Errorf("%s without credentials shows task data:\n%s", rt.pattern, b)
			}
		}
		for _, bad := range []string{"evil.example", "evil.example:5555", "127.0.0.1.evil.example", ""} {
			resp := serve(e.d, method, target, bad, map[string]string{"Authorization": "Bearer tok"}, "")
			if resp.StatusCode != http.StatusMisdirectedRequest {
				t.Errorf("%s with Host %q: %d", rt.pattern, bad, resp.StatusCode)
			}
		}
		if rt.stream {
			continue
		}
		resp = serve(e.d, method, target, "localhost:5555", map[string]string{"Authorization": "Bearer tok"}, "")
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusMisdirectedRequest {
			t.Errorf("%s with credentials: %d", rt.pattern, resp.StatusCode)
		}
	}
	// A path no route matches gets no further either.
	if resp := serve(e.d, "GET", "/nope", "evil.example", nil, ""); resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("unknown path, foreign Host: %d", resp.StatusCode)
	}
	// A page is sent to the login form and back.
	resp := serve(e.d, "GET", "/task/t1?x=1", "127.0.0.1", nil, "")
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/login?back=%2Ftask%2Ft1%3Fx%3D1" {
		t.Errorf("page without credentials: %d to %q", resp.StatusCode, loc)
	}
}

func TestHostAllowed(t *testing.T) {
	d := &Dashboard{o: Options{AllowedHosts: []string{"dash.internal"}}}
	ip := &Dashboard{o: Options{AllowIPHosts: true}}
	for _, tc := range []struct {
		d    *Dashboard
		host string
		want bool
	}{
		{d, "localhost", true}, {d, "LOCALHOST:5555", true}, {d, "127.0.0.1:5555", true}, {d, "127.1.2.3", true},
		{d, "[::1]:5555", true}, {d, "dash.internal:80", true}, {d, "dash.internal.", true}, {d, "Dash.Internal", true},
		{d, "evil.example", false}, {d, "localhost.evil.example", false}, {d, "10.0.0.1", false}, {d, "", false},
		{d, "dash.internal.evil.example", false}, {d, "[::1", false},
		{ip, "10.0.0.1:5555", true}, {ip, "[2001:db8::1]:5555", true}, {ip, "evil.example", false},
	} {
		if got := tc.d.hostAllowed(tc.host); got != tc.want {
			t.Errorf("Host %q (allowed %v, any IP %v): %v, want %v", tc.host, tc.d.o.AllowedHosts, tc.d.o.AllowIPHosts, got, tc.want)
		}
	}
}

// recordingDead is the memory broker with its dead-letter reads recorded.
type recordingDead struct {
	*memory.Transport
	mu    sync.Mutex
	reads []string
}

func (r *recordingDead) DeadLetters(ctx context.Context, queue string, limit int) ([]transport.DeadMessage, error) {
	_, deadline := ctx.Deadline()
	r.mu.Lock()
	r.reads = append(r.reads, fmt.Sprintf("%s limit=%d deadline=%v", queue, limit, deadline))
	r.mu.Unlock()
	return r.Transport.DeadLetters(ctx, queue, limit)
}

func (r *recordingDead) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.reads
	r.reads = nil
	return out
}

// TestDLQShowBounded (finding 7): /dlq/show reads at most the list's
// bound, with a timeout, of a queue the dashboard knows, and only with
// credentials configured (a read redelivers on RabbitMQ).
func TestDLQShowBounded(t *testing.T) {
	for _, tc := range []struct {
		name   string
		o      Options
		hdr    map[string]string
		target string
		status int
		reads  string
	}{
		{"known queue", Options{AuthToken: "tok"}, map[string]string{"Authorization": "Bearer tok"}, "/dlq/show?queue=q1&id=dead-0", 200,
			fmt.Sprintf("q1 limit=%d deadline=true", dlqListLimit)},
		{"unknown queue", Options{AuthToken: "tok"}, map[string]string{"Authorization": "Bearer tok"}, "/dlq/show?queue=other&id=x", 404, ""},
		{"list of an unknown queue", Options{AuthToken: "tok"}, map[string]string{"Authorization": "Bearer tok"}, "/dlq?queue=other", 404, ""},
		{"no credentials configured", Options{}, nil, "/dlq/show?queue=q1&id=dead-0", 403, ""},
		{"list, no credentials configured", Options{}, nil, "/dlq", 403, ""},
		{"replay of an unknown queue", Options{AuthToken: "tok"}, map[string]string{"Authorization": "Bearer tok"}, "POST /action/dlq/replay queue=other&all=1", 303, ""},
		{"purge of an unknown queue", Options{AuthToken: "tok"}, map[string]string{"Authorization": "Bearer tok"}, "POST /action/dlq/purge queue=other&all=1&confirm=yes", 303, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.o)
			e.deadLetters(1)
			rec := &recordingDead{Transport: e.tr}
			e.d.o.Transport = rec
			method, target, form := "GET", tc.target, ""
			if rest, ok := strings.CutPrefix(target, "POST "); ok {
				// An action, with the CSRF cookie and token.
				csrf := strings.Repeat("d", 32)
				target, form, _ = strings.Cut(rest, " ")
				method, form = "POST", form+"&csrf="+e.d.mac("csrf", csrf)
				tc.hdr["Cookie"] = csrfCookie + "=" + csrf
			}
			resp := serve(e.d, method, target, "127.0.0.1", tc.hdr, form)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if got := strings.Join(rec.take(), "; "); got != tc.reads {
				t.Errorf("dead-letter reads %q, want %q", got, tc.reads)
			}
		})
	}
}

// TestReadOnlySendsNoControl (finding 8): a read-only dashboard sends no
// remote-control command, EnableEvents or not.
func TestReadOnlySendsNoControl(t *testing.T) {
	e := newEnv(t, Options{ReadOnly: true, EnableEvents: true, RefreshEvery: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- e.d.Run(ctx) }()
	// Each refresh samples the queues and bumps the version: wait for a
	// few refreshes.
	_, v0 := e.d.Store().Changed()
	for {
		ch, v := e.d.Store().Changed()
		if v >= v0+3 {
			break
		}
		<-ch
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if calls := e.ctl.take(); len(calls) > 0 {
		t.Errorf("read-only sent %q", calls)
	}
}

// TestSafeBack (finding 9): a "back" that a browser would read as another
// site is refused, whatever hides it.
func TestSafeBack(t *testing.T) {
	for _, bad := range []string{
		"/\t/evil.example/phish", "/\n/evil.example", "/\r/evil.example", "/\\evil.example", "/\\/evil.example",
		"//evil.example", "https://evil.example", "javascript:alert(1)", "evil.example", "/\x00/evil", "/\x7f/x",
		"/\u0085/x", "//%09/evil", "/" + strings.Repeat("a", 3000),
	} {
		if got := safeBack(bad, "/def"); got != "/def" {
			t.Errorf("safeBack(%q) = %q", bad, got)
		}
	}
	for _, good := range []string{"/workers", "/tasks?name=a&page=2", "/task/abc%2F", "/dlq?queue=q1#x", "/%09/evil.example"} {
		if got := safeBack(good, "/def"); got != good {
			t.Errorf("safeBack(%q) = %q", good, got)
		}
	}
	e := newEnv(t, Options{AuthToken: "tok"})
	c := e.client()
	resp, _ := e.post(c, "/login", url.Values{"csrf": {e.csrf(c)}, "token": {"tok"}, "back": {"/\t/evil.example/phish"}}, nil)
	if loc := resp.Header.Get("Location"); loc != "/workers" {
		t.Errorf("login redirects to %q", loc)
	}
	resp, _ = e.post(c, "/action/worker", url.Values{"csrf": {e.csrf(c)}, "op": {"ping"}, "worker": {"w"}, "back": {"/\t/evil.example/phish"}}, nil)
	if loc, _ := url.Parse(resp.Header.Get("Location")); loc == nil || loc.Path != "/workers" || loc.Host != "" {
		t.Errorf("action redirects to %q", resp.Header.Get("Location"))
	}
}

// TestOriginNull (finding 10): "Origin: null" is another origin.
func TestOriginNull(t *testing.T) {
	e := newEnv(t, Options{AuthToken: "tok"})
	c := e.client()
	for _, origin := range []string{"null", "http://evil.example", "file://", "garbage"} {
		resp, _ := e.post(c, "/action/worker", url.Values{"csrf": {e.csrf(c)}, "op": {"ping"}, "worker": {"w"}},
			map[string]string{"Authorization": "Bearer tok", "Origin": origin})
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("Origin %q: %d", origin, resp.StatusCode)
		}
	}
	if calls := e.ctl.take(); len(calls) > 0 {
		t.Errorf("sent %q", calls)
	}
	resp, _ := e.post(c, "/action/worker", url.Values{"csrf": {e.csrf(c)}, "op": {"ping"}, "worker": {"w"}},
		map[string]string{"Authorization": "Bearer tok", "Origin": e.srv.URL})
	if resp.StatusCode != http.StatusSeeOther {
		t.Errorf("same origin: %d", resp.StatusCode)
	}
}

// TestSessions (finding 11): a login is a random session id, not a
// function of the token; logout ends it on the server; it expires.
func TestSessions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		d, err := New(Options{Transport: tr, Control: &fakeControl{}, AuthToken: "tok"})
		if err != nil {
			t.Fatal(err)
		}
		login := func() string {
			// The CSRF cookie and token from the login page.
			resp := serve(d, "GET", "/login", "127.0.0.1", nil, "")
			var csrf string
			for _, c := range resp.Cookies() {
				if c.Name == csrfCookie {
					csrf = c.Value
				}
			}
			form := url.Values{"csrf": {d.mac("csrf", csrf)}, "token": {"tok"}}.Encode()
			resp = serve(d, "POST", "/login", "127.0.0.1", map[string]string{"Cookie": csrfCookie + "=" + csrf}, form)
			for _, c := range resp.Cookies() {
				if c.Name == authCookie {
					return c.Value
				}
			}
			t.Fatalf("login: %d, no session cookie", resp.StatusCode)
			return ""
		}
		get := func(session string) int {
			return serve(d, "GET", "/workers", "127.0.0.1", map[string]string{"Cookie": authCookie + "=" + session}, "").StatusCode
		}
		s1, s2 := login(), login()
		if s1 == s2 || s1 == d.mac("auth", "tok") || len(s1) < 32 {
			t.Errorf("session ids %q and %q", s1, s2)
		}
		if get(s1) != 200 || get(s2) != 200 {
			t.Fatal("a session does not authenticate")
		}
		if get("forged") == 200 {
			t.Fatal("a forged session authenticates")
		}
		// Logout ends s1 on the server, even if the browser kept it.
		csrf := strings.Repeat("a", 32)
		form := url.Values{"csrf": {d.mac("csrf", csrf)}}.Encode()
		serve(d, "POST", "/logout", "127.0.0.1", map[string]string{"Cookie": csrfCookie + "=" + csrf + "; " + authCookie + "=" + s1}, form)
		if get(s1) == 200 {
			t.Error("a session survives logout")
		}
		if get(s2) != 200 {
			t.Error("logout ended another session")
		}
		time.Sleep(sessionTTL)
		if get(s2) == 200 {
			t.Error("a session survives its expiry")
		}
	})
}

// TestFailedLoginsLimited (finding 11): failed logins by bearer token,
// basic auth and the form are logged, and a client that fails too often
// is answered 429, even with the right credentials, until the window has
// passed.
func TestFailedLoginsLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		core, logs := observer.New(zap.WarnLevel)
		d, err := New(Options{Transport: tr, Control: &fakeControl{}, AuthToken: "tok", BasicAuth: map[string]string{"ops": "pw"},
			Logger: zap.New(core)})
		if err != nil {
			t.Fatal(err)
		}
		basic := func(u, p string) map[string]string {
			r, _ := http.NewRequest("GET", "/", nil)
			r.SetBasicAuth(u, p)
			return map[string]string{"Authorization": r.Header.Get("Authorization")}
		}
		csrf := strings.Repeat("b", 32)
		formLogin := func(tok string) int {
			form := url.Values{"csrf": {d.mac("csrf", csrf)}, "token": {tok}}.Encode()
			return serve(d, "POST", "/login", "127.0.0.1", map[string]string{"Cookie": csrfCookie + "=" + csrf}, form).StatusCode
		}
		for i := range loginFailures {
			var status int
			switch i % 3 {
			case 0:
				status = serve(d, "GET", "/workers", "127.0.0.1", map[string]string{"Authorization": "Bearer nope"}, "").StatusCode
			case 1:
				status = serve(d, "GET", "/workers", "127.0.0.1", basic("ops", "nope"), "").StatusCode
			case 2:
				status = formLogin("nope")
			}
			if status != http.StatusUnauthorized {
				t.Fatalf("failure %d: %d", i, status)
			}
		}
		methods := map[string]int{}
		for _, l := range logs.FilterMessage("dashboard: failed login").All() {
			methods[l.ContextMap()["method"].(string)]++
		}
		if methods["bearer"] == 0 || methods["basic"] == 0 || methods["form"] == 0 || logs.Len() != loginFailures {
			t.Errorf("logged %d failed logins: %v", logs.Len(), methods)
		}
		// Blocked, right credentials or not, by every method.
		if s := serve(d, "GET", "/workers", "127.0.0.1", map[string]string{"Authorization": "Bearer tok"}, "").StatusCode; s != http.StatusTooManyRequests {
			t.Errorf("bearer while blocked: %d", s)
		}
		if s := serve(d, "GET", "/workers", "127.0.0.1", basic("ops", "pw"), "").StatusCode; s != http.StatusTooManyRequests {
			t.Errorf("basic while blocked: %d", s)
		}
		if s := formLogin("tok"); s != http.StatusTooManyRequests {
			t.Errorf("form while blocked: %d", s)
		}
		// Another client is not blocked.
		req := httptest.NewRequest("GET", "/workers", nil)
		req.Host, req.RemoteAddr = "127.0.0.1", "192.0.2.7:1234"
		req.Header.Set("Authorization", "Bearer tok")
		rec := httptest.NewRecorder()
		d.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Errorf("another client: %d", rec.Code)
		}
		time.Sleep(loginWindow)
		if s := serve(d, "GET", "/workers", "127.0.0.1", map[string]string{"Authorization": "Bearer tok"}, "").StatusCode; s != http.StatusOK {
			t.Errorf("after the window: %d", s)
		}
	})
}

// TestServerTimeouts (finding 12): the server times out every phase of a
// request, and the event stream outlives those timeouts by its own
// deadlines, up to sseMaxLife.
func TestServerTimeouts(t *testing.T) {
	e := newEnv(t, Options{})
	srv := e.d.Server()
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 || srv.MaxHeaderBytes <= 0 {
		t.Fatalf("server without timeouts: %+v", srv)
	}
	// Short timeouts, so that the test does not wait 30 s.
	srv.ReadTimeout, srv.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()

	// A POST whose body never comes is cut off.
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\ncsrf=")
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadAll(conn); err != nil {
		t.Errorf("the server held a stalled body: %v", err)
	}

	// The stream outlives the server's read and write timeouts.
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://"+ln.Addr().String()+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, _ := rd.ReadString('\n'); !strings.HasPrefix(line, "retry:") {
		t.Fatalf("first line %q", line)
	}
	time.Sleep(2 * srv.WriteTimeout) // past both timeouts
	e.d.Store().Apply(ev("task-received", "a"))
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended at the server's timeout: %v", err)
		}
		if line == "event: change\n" {
			break
		}
	}
}

// TestStreamEnds: the event stream ends at sseMaxLife.
func TestStreamEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memory.New(memory.Config{})
		defer tr.Close()
		d, err := New(Options{Transport: tr, Control: &fakeControl{}})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		rec := httptest.NewRecorder()
		go func() {
			defer close(done)
			d.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "http://127.0.0.1/events", nil))
		}()
		time.Sleep(sseMaxLife)
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("the stream outlived sseMaxLife")
		}
	})
}

// TestHostnameClipped (finding 13): a worker's hostname is stored clipped.
func TestHostnameClipped(t *testing.T) {
	e := newEnv(t, Options{})
	huge := strings.Repeat("h", 4<<20)
	e.d.Store().Apply(map[string]any{"type": "worker-online", "hostname": huge, "freq": 2.0, "timestamp": float64(time.Now().Unix())})
	ws := e.d.Store().Workers()
	if len(ws) != 1 || len(ws[0].Hostname) > maxHostLen+len("…") {
		t.Fatalf("hostname stored at %d bytes", len(ws[0].Hostname))
	}
	_, body := e.get(e.client(), "/workers")
	if len(body) > 64<<10 {
		t.Errorf("workers page of %d bytes", len(body))
	}
}

// expandingBackend returns a result that is small as a value (shared
// parts) and huge written out.
type expandingBackend struct{ fail bool }

func (b expandingBackend) Store(context.Context, backend.StoreRequest) error { return nil }
func (b expandingBackend) Close() error                                      { return nil }
func (b expandingBackend) Get(_ context.Context, id string) (*protocol.ResultMeta, error) {
	if id == "missing" {
		return nil, backend.ErrNotFound
	}
	var v any = "0123456789"
	for range 26 {
		v = []any{v, v} // 2^26 leaves written out: about 900 MB of repr
	}
	m := &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess, Result: v}
	if b.fail {
		m.Status, m.Result = protocol.StateFailure, &protocol.ExceptionInfo{Type: "ValueError", Message: []any{v, v}}
	}
	return m, nil
}

// TestResultWrittenBounded: a result that expands when written costs the
// task page no more than its display limit (the bounded writers).
func TestResultWrittenBounded(t *testing.T) {
	for _, fail := range []bool{false, true} {
		e := newEnv(t, Options{Backend: expandingBackend{fail: fail}})
		code, body := e.get(e.client(), "/task/big")
		if code != 200 || len(body) > 64<<10 || !strings.Contains(body, "0123456789") {
			t.Errorf("failure %v: %d, %d bytes", fail, code, len(body))
		}
	}
}
