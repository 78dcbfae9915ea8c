package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/examples/demotasks"
	"github.com/celeriac/celeriac/transport"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// The dashboard's browser tests drive `celeriac dashboard` in headless
// Chromium (Debian's chromium package, through chromedp) while a Python
// Celery worker and a celeriac worker run on the same broker. On Redis the
// test has a redis-server of its own, so that the pages show only its
// workers; on RabbitMQ it uses the shared broker with queues and node names
// of its own (it-dash-*). Screenshots of every page go to
// $CELERIAC_ARTIFACTS/dashboard-<broker>/ (default: a directory under
// $TMPDIR, logged).

// chromiumBin finds Debian's chromium.
func chromiumBin(t *testing.T) string {
	t.Helper()
	for _, name := range []string{os.Getenv("CELERIAC_CHROMIUM"), "chromium", "chromium-browser"} {
		if name == "" {
			continue
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	unavailable(t, "chromium not installed (apt-get install chromium; .ci/setup does)")
	return ""
}

// artifactDir is where the test's screenshots go.
func artifactDir(t *testing.T, name string) string {
	t.Helper()
	base := os.Getenv("CELERIAC_ARTIFACTS")
	if base == "" {
		base = filepath.Join(os.TempDir(), "celeriac-artifacts")
	}
	dir := filepath.Join(base, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// dashEnv is one run of the browser test.
type dashEnv struct {
	t         *testing.T
	broker    string
	backend   string
	q, goQ    string // shared queue, the Go worker's own queue
	pyQ       string // the Python worker's own queue
	dlx       string // RabbitMQ: goQ's dead-letter exchange
	goNode    string
	pyNode    string
	url       string // the dashboard's root, its prefix included
	prefix    string // --url-prefix, "" for none
	brokerAPI bool   // RabbitMQ: --broker-api given, unacked counts known
	shots     string
	ctx       context.Context // the browser tab
	dialogs   atomic.Int32
	pyEnv     map[string]string
	brokenDir string // dash.fragile fails while <dir>/broken exists
}

// fragileHandler fails for good while the marker file exists: a task whose
// downstream is broken, then fixed, the case replay is for.
func fragileHandler(marker string) worker.HandlerFunc {
	return func(ctx context.Context, t *worker.Task) (any, error) {
		if _, err := os.Stat(marker); err == nil {
			return nil, worker.NewException("RuntimeError", "downstream is broken")
		}
		return "fixed", nil
	}
}

// startDashGoWorker runs a celeriac worker in this process: the demo tasks
// plus dash.fragile (acks_late, so that a failure dead-letters it).
func (e *dashEnv) startGoWorker() {
	t := e.t
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := connect.Open(ctx, connect.Options{BrokerURL: e.broker, ResultBackend: e.backend})
	if err != nil {
		t.Fatal(err)
	}
	mux := worker.NewMux()
	demotasks.Register(mux)
	mux.HandleFunc("dash.fragile", fragileHandler(filepath.Join(e.brokenDir, "broken")), worker.AcksLate(true))
	cfg := worker.Config{
		Queues: []string{e.q, e.goQ}, Concurrency: 2, Hostname: e.goNode, Backend: conn.Backend,
		SendTaskEvents: true, HeartbeatInterval: time.Second, Logger: zap.NewNop(),
	}
	if e.dlx != "" {
		cfg.QueueArguments = map[string]map[string]any{e.goQ: {"x-dead-letter-exchange": e.dlx}}
		if _, err := conn.Transport.(*amqptransport.Transport).DeclareDeadLetter(ctx, e.goQ); err != nil {
			t.Fatal(err)
		}
	}
	w, err := worker.New(conn.Transport, mux, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the celeriac worker did not stop")
		}
		if e.dlx != "" {
			dctx, c := context.WithTimeout(context.Background(), 10*time.Second)
			defer c()
			tr := conn.Transport.(*amqptransport.Transport)
			_ = tr.DeleteQueue(dctx, tr.DeadLetterQueue(e.goQ))
		}
		conn.Close()
	})
}

// send has the Python client send a task and returns its id.
func (e *dashEnv) send(name string, args []any, countdown float64, queue string) string {
	e.t.Helper()
	return e.sendN(1, name, args, countdown, queue)[0]
}

// sendN has the Python client send n copies of a task and returns their
// ids.
func (e *dashEnv) sendN(n int, name string, args []any, countdown float64, queue string) []string {
	e.t.Helper()
	spec := map[string]any{"name": name, "args": args, "queue": queue, "count": n}
	if countdown > 0 {
		spec["countdown"] = countdown
	}
	if queue == e.goQ && e.dlx != "" {
		spec["dlx"] = e.dlx
	}
	b, _ := json.Marshal(spec)
	out := runPython(e.t, time.Minute, e.pyEnv, "import runpy, sys; sys.argv = ['it_dash_send.py'] + sys.argv[1:]; runpy.run_module('it_dash_send', run_name='__main__')", string(b))
	ids := strings.Fields(out)
	if len(ids) != n || slices.ContainsFunc(ids, func(id string) bool { return len(id) != 36 }) {
		e.t.Fatalf("python sent %q", out)
	}
	return ids
}

// sendCanvas has the Python client send a chain or a chord (see
// it_dash_send.py) to the shared queue, so that both workers run its
// members; it returns the last task's id and every member's.
func (e *dashEnv) sendCanvas(kind string) (string, []string) {
	e.t.Helper()
	b, _ := json.Marshal(map[string]any{"canvas": kind, "queue": e.q})
	out := runPython(e.t, time.Minute, e.pyEnv, "import runpy, sys; sys.argv = ['it_dash_send.py'] + sys.argv[1:]; runpy.run_module('it_dash_send', run_name='__main__')", string(b))
	var r struct {
		ID  string
		IDs []string
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.ID) != 36 || len(r.IDs) < 3 {
		e.t.Fatalf("python sent the %s %q: %v", kind, out, err)
	}
	return r.ID, r.IDs
}

// fetch requests a path of the dashboard's server from the page, as its
// script would: with the page's session cookie and no other credentials.
// path is absolute: the caller adds the prefix.
func (e *dashEnv) fetch(method, path string) (int, string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	init := `{}`
	if method != "GET" {
		// JSON, so that a write needs no CSRF token (docs/dashboard.md).
		init = `{method: ` + jsq(method) + `, headers: {'Content-Type': 'application/json'}, body: '{}'}`
	}
	out, err := chromedp.Run(ctx, chromedp.Evaluate[string](`fetch(`+jsq(path)+`, `+init+`).then(async r => JSON.stringify({status: r.status, body: await r.text()}))`, chromedp.EvalAwaitPromise))
	if err != nil {
		e.t.Fatalf("fetch %s %s: %v", method, path, err)
	}
	var r struct {
		Status int
		Body   string
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		e.t.Fatalf("fetch %s: %v", path, err)
	}
	return r.Status, r.Body
}

// api GETs an API path (under the prefix) from the page and decodes its
// JSON answer into v.
func (e *dashEnv) api(path string, v any) {
	e.t.Helper()
	code, body := e.fetch("GET", e.prefix+path)
	if code != 200 {
		e.t.Fatalf("GET %s: %d %s", path, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		e.t.Fatalf("GET %s: %v\n%s", path, err, body)
	}
}

func (e *dashEnv) run(actions ...chromedp.Action[chromedp.Void]) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		e.t.Fatalf("browser: %v", err)
	}
}

// click clicks the first element a CSS selector matches, in the page's
// own script: the live part of a page is replaced when it changes, so a
// node found a moment ago may be gone by the time a mouse event reaches it.
func (e *dashEnv) click(sel string) {
	e.t.Helper()
	e.waitJS("click "+sel, `(() => { const el = document.querySelector(`+jsq(sel)+`); if (!el) return false; el.click(); return true })()`)
}

// waitJS polls a JavaScript expression until it is true: the page changes
// by itself (server-sent events) or after a reload the test asks for.
func (e *dashEnv) waitJS(what, expr string) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if n := e.dialogs.Load(); n > 0 {
			e.t.Fatalf("%s: %d JavaScript dialog(s) opened: a script of the page's data ran", what, n)
		}
		// A page being replaced (a form posted) has no context to
		// evaluate in for a moment: that is a "not yet".
		ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
			html, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.outerHTML : ''`))
			cancel()
			e.t.Fatalf("%s: not within 60 s (last error %v); the page:\n%s", what, err, html)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (e *dashEnv) shot(name string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		e.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(e.shots, name+".png"), buf, 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *dashEnv) text(sel string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.querySelector(`+jsq(sel)+`)||{}).textContent || ''`))
	if err != nil {
		e.t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

func (e *dashEnv) nav(path string) {
	e.t.Helper()
	e.run(chromedp.Navigate(e.url + path))
}

// jsq quotes s for a JavaScript expression.
func jsq(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestDashboardBrowser: the acceptance test of `celeriac dashboard`, in a
// real browser, on Redis and RabbitMQ.
func TestDashboardBrowser(t *testing.T) {
	chromium := chromiumBin(t)
	pythonBin(t)
	for _, broker := range []string{"redis", "rabbitmq"} {
		t.Run(broker, func(t *testing.T) {
			r := cliRand()
			e := &dashEnv{t: t, q: "it_dash_" + r, goQ: "it_dash_go_" + r, pyQ: "it_dash_py_" + r,
				goNode: "it-dash-go-" + r + "@celeriac", pyNode: "it-dash-py-" + r + "@celeriac",
				brokenDir: t.TempDir(), shots: artifactDir(t, "dashboard-"+broker)}
			switch broker {
			case "redis":
				own := startOwnRedis(t, "", nil)
				e.broker, e.backend = own.URL(0), own.URL(1)
			case "rabbitmq":
				// A vhost of its own: on the shared one the dashboard also
				// sees every other suite's workers and tasks (the gray
				// matrix's 10 000 flt.record tasks pushed this test's task
				// off the tasks page, CI 4 December 2026).
				e.broker, e.backend = ownVhost(t, amqpURL(t), "it_dash_"+r), redisDBURL(t, cliRedisDB)
				e.dlx = e.goQ + ".dlx"
			}
			var extra []string
			if broker == "rabbitmq" {
				// On RabbitMQ the dashboard runs behind a path, as behind a
				// reverse proxy, and every step below goes through it.
				e.prefix = "/flower"
				extra = append(extra, "--url-prefix", e.prefix)
				if api := rabbitAPIURL(t, e.broker); api != "" {
					e.brokerAPI = true
					extra = append(extra, "--broker-api", api)
				}
			}
			bc := brokerCase{broker, e.broker, e.backend}
			t.Cleanup(func() { deleteQueue(t, bc, e.q); deleteQueue(t, bc, e.goQ); deleteQueue(t, bc, e.pyQ) })
			e.pyEnv = map[string]string{"IT_BROKER": e.broker, "IT_BACKEND": e.backend, "IT_QUEUE": e.q}
			e.startGoWorker()
			// No -E: the dashboard turns task events on (enable_events).
			startPythonWorker(t, e.pyEnv, "it_cli_app", "-Q", e.q+","+e.pyQ, "-n", e.pyNode, "-c", "2", "--without-mingle", "--without-gossip")
			port := freePort(t)
			args := append([]string{"-b", e.broker, "--result-backend", e.backend, "dashboard", "--listen", fmt.Sprintf("127.0.0.1:%d", port),
				"--auth-token", "it-token", "--refresh", "1s", "-Q", e.q + "," + e.goQ}, extra...)
			startProc(t, "celeriac dashboard", "./cmd/celeriac", procOptions{Ready: "dashboard ready", Stop: syscall.SIGTERM}, args...)
			e.url = fmt.Sprintf("http://127.0.0.1:%d%s", port, e.prefix)
			testDashboardInBrowser(t, e, chromium)
		})
	}
}

func testDashboardInBrowser(t *testing.T, e *dashEnv, chromium string) {
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 900),
		// Chromium's own temporary files go where the test cleans up.
		chromedp.Env("TMPDIR="+t.TempDir()))
	defer cancelAlloc()
	// Any alert() would be an escaping failure: dialogs are counted, and
	// every wait fails once one opened.
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithListener(func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			e.dialogs.Add(1)
		}
	}))
	defer cancel()
	e.ctx = ctx
	// The first Run starts the browser and must not have a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}

	// Before logging in, every page sends the browser to the login form
	// (with --auth-token, reading needs the token too), showing no data.
	e.nav("/workers")
	e.waitJS("sent to the login form", `location.pathname === `+jsq(e.prefix+"/login")+` && !!document.querySelector('input[name=token]') && !document.querySelector('tr.worker')`)

	// Log in with the token: it brings the browser back to /workers.
	e.run(chromedp.SendKeys(chromedp.CSS(`input[name=token]`), "it-token"), chromedp.Submit(chromedp.CSS(`input[name=token]`)))

	// Both workers appear, with their software.
	e.waitJS("both workers online", fmt.Sprintf(`(() => { const g = document.querySelector('tr[data-worker=%s]'), p = document.querySelector('tr[data-worker=%s]');
		return !!g && !!p && g.textContent.includes('online') && p.textContent.includes('online') && g.textContent.includes('celeriac') && p.textContent.includes('py-celery') })()`,
		jsq(e.goNode), jsq(e.pyNode)))
	e.shot("workers")
	if e.prefix != "" {
		e.waitJS("every link and form under the prefix", fmt.Sprintf(`(() => { const els = [...document.querySelectorAll('a[href^="/"], form[action^="/"]')];
			return els.length > 5 && els.every(el => (el.getAttribute('href') || el.getAttribute('action')).startsWith(%s)) })()`, jsq(e.prefix+"/")))
		for _, path := range []string{"/workers", "/api/workers", "/events"} {
			if code, _ := e.fetch("GET", path); code != 404 {
				t.Errorf("%s outside the prefix: %d, want 404", path, code)
			}
		}
	}
	// A form whose CSRF token was tampered with is refused.
	e.waitJS("tamper with the CSRF token", fmt.Sprintf(`(() => { const f = document.querySelector('tr[data-worker=%s] form'); if (!f) return false;
		f.querySelector('input[name=csrf]').value = '0'.repeat(64); f.querySelector('button[value=shutdown]').click(); return true })()`, jsq(e.goNode)))
	e.waitJS("refused with a wrong CSRF token", `(document.getElementById('denied')||{}).textContent?.startsWith('missing or wrong CSRF token') === true`)
	e.nav("/workers")
	e.waitJS("the celeriac worker still online", fmt.Sprintf(`(document.querySelector('tr[data-worker=%s]')||{}).textContent?.includes('online') === true`, jsq(e.goNode)))
	// Ping from the UI reaches the Python worker.
	e.click(fmt.Sprintf(`tr[data-worker=%s] button[value=ping]`, jsq(e.pyNode)))
	e.waitJS("ping reply", `(document.getElementById('flash')||{}).textContent?.includes('pong') === true`)

	// A task sent from Python appears live in the stream (no reload: a
	// marker set on the page survives) and succeeds.
	e.nav("/tasks")
	e.waitJS("the page is live", `document.getElementById('live-state').textContent === 'live'`)
	e.waitJS("a marker on the page", `(window.itMarker = 1) === 1`)
	id := e.send("tasks.add", []any{2, 3}, 0, e.q)
	e.waitJS("the task appears live and succeeds", fmt.Sprintf(`(() => { const r = document.querySelector('tr[data-task=%s]'); return !!r && r.dataset.state === 'SUCCESS' })()`, jsq(id)))
	e.waitJS("no reload", `window.itMarker === 1`)
	e.shot("tasks")
	e.click(fmt.Sprintf(`tr[data-task=%s] a`, jsq(id)))
	e.waitJS("detail page", `!!document.getElementById('task-result')`)
	if got := e.text("#task-result"); got != "5" {
		t.Errorf("task result %q, want 5", got)
	}
	e.waitJS("the stored result", `(document.getElementById('backend-value')||{}).textContent === '5'`)
	e.shot("task")

	// The JSON API, with the page's own session, answers what the pages
	// show.
	var workers map[string]struct {
		Online       bool
		SWIdent      string                  `json:"sw_ident"`
		ActiveQueues []struct{ Name string } `json:"active_queues"`
	}
	e.api("/api/workers", &workers)
	for node, sw := range map[string]string{e.goNode: "celeriac", e.pyNode: "py-celery"} {
		w := workers[node]
		if !w.Online || w.SWIdent != sw || !slices.ContainsFunc(w.ActiveQueues, func(q struct{ Name string }) bool { return q.Name == e.q }) {
			t.Errorf("/api/workers[%s] = %+v", node, w)
		}
	}
	type apiTask struct {
		UUID, Name, State, Result, Args string
		Position                        *int
	}
	var found map[string]apiTask
	e.api("/api/tasks?search="+id[:13], &found)
	if tk := found[id]; len(found) != 1 || tk.Name != "tasks.add" || tk.State != "SUCCESS" || tk.Result != "5" || tk.Position == nil {
		t.Errorf("/api/tasks?search=%s = %+v", id[:13], found)
	}
	var info apiTask
	e.api("/api/task/info/"+id, &info)
	if info.UUID != id || info.State != "SUCCESS" || info.Args != "[2, 3]" {
		t.Errorf("/api/task/info/%s = %+v", id, info)
	}
	if code, body := e.fetch("GET", e.prefix+"/api/task/info/"+strings.Repeat("0", 36)); code != 404 || !strings.Contains(body, `"error"`) {
		t.Errorf("/api/task/info of an unknown task: %d %s", code, body)
	}

	// A chain and a chord (behind a first step) sent from Python, their
	// members run by both workers: the last task's page shows the whole
	// workflow as a tree, every member with its state.
	for _, kind := range []string{"chain", "chord"} {
		last, ids := e.sendCanvas(kind)
		e.nav("/task/" + last)
		e.waitJS("the "+kind+"'s workflow, all succeeded", fmt.Sprintf(`(() => { const ids = %s, rows = [...document.querySelectorAll('#task-workflow tr.wf')];
			return rows.length === ids.length && ids.every(id => { const r = document.querySelector('#task-workflow tr.wf[data-task="' + id + '"]');
				return !!r && r.querySelector('.st').textContent === 'SUCCESS' }) })()`, mustJSON(ids)))
		want := map[string]string{"chain": "51", "chord": "5"}[kind]
		if got := e.text("#task-result"); got != want {
			t.Errorf("the %s's last task's result %q, want %s", kind, got, want)
		}
		// A chain's steps each under the one before; the chord's members
		// under the first step, and its body under the task that sent it:
		// the first step (the parent the chain gave it) when Python's
		// worker joins the chord, else a member.
		depths := map[string]string{"chain": "[[0], [1], [2]]", "chord": "[[0], [1], [1], [1, 2]]"}[kind]
		e.waitJS("the "+kind+"'s members nested", fmt.Sprintf(`%s.every((d, i) => d.includes(Number(document.querySelector('#task-workflow tr.wf[data-task="' + %s[i] + '"]').dataset.depth)))`, depths, mustJSON(ids)))
		e.shot("workflow-" + kind)
	}

	// The XSS task: its args render as text and nothing runs.
	xid := e.send("tasks.echo", []any{"<script>alert(1)</script>"}, 0, e.goQ)
	e.nav("/task/" + xid)
	// The stored result may be there before the task's events: wait for
	// the events' args.
	e.waitJS("the XSS task's args, as text", `(document.getElementById('task-args')||{}).textContent?.includes('<script>alert(1)</script>') === true`)
	e.waitJS("the XSS task succeeded", `(document.getElementById('task-state')||{}).textContent === 'SUCCESS'`)
	e.waitJS("only the page's own script", `document.querySelectorAll('script').length === 1`)
	e.nav("/tasks")
	e.waitJS("the XSS task in the stream", fmt.Sprintf(`!!document.querySelector('tr[data-task=%s]')`, jsq(xid)))
	// The search box: typed and submitted, it leaves the XSS task alone
	// in the stream (found by its args), and says so in the address.
	e.run(chromedp.SendKeys(chromedp.CSS(`input[name=q]`), "alert(1)"), chromedp.Submit(chromedp.CSS(`input[name=q]`)))
	e.waitJS("the search's one row", fmt.Sprintf(`new URLSearchParams(location.search).get('q') === 'alert(1)' && location.pathname === %s &&
		document.querySelectorAll('tr.task').length === 1 && !!document.querySelector('tr.task[data-task=%s]')`, jsq(e.prefix+"/tasks"), jsq(xid)))
	e.shot("tasks-search")
	// A column header sorts the whole history by it, then the reverse.
	e.nav("/tasks")
	sortedBy := func(order string) string {
		cmp := "<="
		if order == "-name" {
			cmp = ">="
		}
		return fmt.Sprintf(`(() => {
			if (new URLSearchParams(location.search).get('sort') !== %s) return false;
			const names = [...document.querySelectorAll('tr.task td:nth-child(2)')].map(td => td.textContent);
			return names.length > 1 && names.every((n, i) => i === 0 || names[i-1] %s n) && names[0] !== names[names.length-1];
		})()`, jsq(order), cmp)
	}
	e.click(`a[data-sort=name]`)
	e.waitJS("tasks sorted by name", sortedBy("name"))
	e.click(`a[data-sort=name]`)
	e.waitJS("tasks sorted by name, descending", sortedBy("-name"))
	e.shot("tasks-sorted")
	e.nav("/tasks")
	if n := e.dialogs.Load(); n != 0 {
		t.Errorf("%d dialogs", n)
	}
	e.shot("tasks-xss")

	// A failed acks_late task is dead-lettered; replay after the fix and it
	// succeeds.
	marker := filepath.Join(e.brokenDir, "broken")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	did := e.send("dash.fragile", []any{"order-42"}, 0, e.goQ)
	dlqPage := "/dlq?queue=" + e.goQ
	e.nav(dlqPage)
	e.waitJS("the dead letter is listed", fmt.Sprintf(`!!document.querySelector('tr.dead-letter[data-task=%s]')`, jsq(did)))
	e.shot("dlq")
	e.click(fmt.Sprintf(`tr.dead-letter[data-task=%s] a.show`, jsq(did)))
	e.waitJS("the dead letter decoded", `(document.getElementById('dead-doc')||{}).textContent?.includes('dash.fragile') === true`)
	if doc := e.text("#dead-doc"); !strings.Contains(doc, "order-42") {
		t.Errorf("decoded dead letter:\n%s", doc)
	}
	if got := e.text("#dead-error"); !strings.Contains(got, "downstream is broken") {
		t.Errorf("dead letter's error %q", got)
	}
	e.shot("dlq-show")
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	e.nav(dlqPage)
	e.click(fmt.Sprintf(`tr.dead-letter[data-task=%s] input[type=checkbox]`, jsq(did)))
	e.click(`button.replay-selected`)
	e.waitJS("replayed", `(document.getElementById('flash')||{}).textContent?.startsWith('replayed 1 message(s)') === true`)
	e.nav("/task/" + did)
	e.waitJS("the replayed task succeeds", `(document.getElementById('backend-state')||{}).textContent === 'SUCCESS'`)

	// Purge asks first; only the confirmation deletes.
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	pid := e.send("dash.fragile", []any{"order-43"}, 0, e.goQ)
	e.nav(dlqPage)
	e.waitJS("the second dead letter", fmt.Sprintf(`!!document.querySelector('tr.dead-letter[data-task=%s]')`, jsq(pid)))
	e.click(fmt.Sprintf(`tr.dead-letter[data-task=%s] input[type=checkbox]`, jsq(pid)))
	e.click(`button.purge-selected`)
	e.waitJS("the confirmation", `!!document.getElementById('confirm-purge')`)
	// It names the dead letters by task id (on Redis the store's id is a
	// delivery tag, which tells a person nothing).
	if got := e.text("#confirm"); !strings.Contains(got, pid) || !strings.Contains(got, "dash.fragile") {
		t.Errorf("the purge confirmation does not name task %s:\n%s", pid, got)
	}
	e.shot("purge-confirm")
	if n := e.deadCount(); n != 1 {
		t.Fatalf("%d dead letters while the purge waits for confirmation, want 1", n)
	}
	e.click(`#confirm-purge`)
	e.waitJS("purged", `(document.getElementById('flash')||{}).textContent?.startsWith('purged 1 dead letter(s)') === true`)
	if n := e.deadCount(); n != 0 {
		t.Errorf("%d dead letters after the purge", n)
	}

	// A task that retried, then succeeded, shows its outcome, not the
	// retry's exception, and is not its own parent, root or child.
	fid := e.send("tasks.flaky", []any{1}, 0, e.goQ)
	e.nav("/task/" + fid)
	e.waitJS("the flaky task succeeds after one retry", `(document.getElementById('task-state')||{}).textContent === 'SUCCESS' &&
		(document.getElementById('task-result')||{}).textContent?.includes('succeeded after 1 retries') === true`)
	e.waitJS("no exception, no relation to itself", `!document.getElementById('task-exception') &&
		document.getElementById('task-parent').textContent === '' && document.getElementById('task-root').textContent === '' &&
		document.getElementById('task-children').textContent.trim() === ''`)
	// Times say their zone; a task id stays on one line.
	if got := e.text("#live"); !strings.Contains(got, " UTC") {
		t.Errorf("the task page's times have no zone:\n%s", got)
	}
	e.waitJS("the task id on one line", `document.getElementById('task-id').getClientRects().length === 1 && document.getElementById('task-id').getBoundingClientRect().height < 30`)
	e.shot("task-retried")

	// An unregistered task is visible (the worker sends task-failed, as
	// Celery's consumer does) and its dead letter says why, on both brokers.
	uid := e.send("dash.nope", []any{1}, 0, e.goQ)
	e.nav("/task/" + uid)
	e.waitJS("the unregistered task failed", `(document.getElementById('task-state')||{}).textContent === 'FAILURE' &&
		(document.getElementById('task-exception')||{}).textContent === "NotRegistered('dash.nope')"`)
	e.nav(dlqPage)
	e.waitJS("its dead letter says why", fmt.Sprintf(`(() => { const r = document.querySelector('tr.dead-letter[data-task=%s]');
		return !!r && r.querySelector('td.reason').textContent === 'not-registered' && r.querySelector('td.dead-error').textContent.includes('NotRegistered') })()`, jsq(uid)))
	e.shot("dlq-unregistered")

	// Revoke from the UI stops a countdown task, held by the Python worker
	// (its own queue) and by the celeriac worker (its own queue).
	sentAt := time.Now()
	revoked := []string{e.send("tasks.add", []any{40, 2}, 8, e.pyQ), e.send("tasks.add", []any{40, 3}, 8, e.goQ)}
	for _, cid := range revoked {
		e.nav("/task/" + cid)
		e.waitJS("the countdown task is received", `['RECEIVED','PENDING'].includes((document.getElementById('task-state')||{}).textContent) && !!document.getElementById('revoke')`)
		e.click(`#revoke`)
		e.waitJS("revoke sent", `(document.getElementById('flash')||{}).textContent?.startsWith('revoke '+`+jsq(cid)+`) === true`)
	}
	for i, cid := range revoked {
		e.nav("/task/" + cid)
		e.waitJS("the task is revoked when due", `(document.getElementById('task-state')||{}).textContent === 'REVOKED'`)
		if i == 0 {
			e.shot("task-revoked")
		}
	}
	// Past their countdown the tasks have not run.
	time.Sleep(time.Until(sentAt.Add(10 * time.Second)))
	for _, cid := range revoked {
		e.nav("/task/" + cid)
		if st, w := e.text("#task-state"), e.text("#task-worker"); st != "REVOKED" {
			t.Errorf("countdown task on %s: %s after its countdown", w, st)
		}
		if res := cliResultOf(t, brokerCase{"", e.broker, e.backend}, cid); res != nil && res.Status == "SUCCESS" {
			t.Errorf("the revoked task ran: %+v", res)
		}
	}

	// The other pages render (and are kept as screenshots). Two countdown
	// tasks held by each worker are unacked on its own queue: counted on
	// Redis (kombu's unacked hash) and, through --broker-api, on RabbitMQ.
	// Two, so that the revoked task above, unacked until its countdown
	// and in RabbitMQ's statistics a few seconds longer, cannot pass
	// for them.
	held := append(e.sendN(2, "tasks.add", []any{1, 1}, 600, e.pyQ), e.sendN(2, "tasks.add", []any{1, 2}, 600, e.goQ)...)
	e.nav("/queues")
	e.waitJS("queues", fmt.Sprintf(`!!document.querySelector('tr.queue[data-queue=%s]')`, jsq(e.q)))
	wantUnacked := "2"
	if e.prefix != "" && !e.brokerAPI {
		wantUnacked = "?"
	}
	for _, q := range []string{e.pyQ, e.goQ} {
		e.waitJS("the held task unacked on "+q, fmt.Sprintf(`(document.querySelector('tr.queue[data-queue=%s] td.unacked')||{}).textContent === %s`, jsq(q), jsq(wantUnacked)))
	}
	e.waitJS("nothing unacked on the shared queue", fmt.Sprintf(`['0', '?'].includes((document.querySelector('tr.queue[data-queue=%s] td.unacked')||{}).textContent)`, jsq(e.q)))
	e.shot("queues")
	// The API reads the same samples; it is asked again while a sample
	// taken before the page's is still the last.
	queueLength := func() string {
		var lengths struct {
			ActiveQueues []struct {
				Name     string
				Messages *int
				Unacked  *int `json:"messages_unacknowledged"`
			} `json:"active_queues"`
		}
		e.api("/api/queues/length", &lengths)
		for _, q := range lengths.ActiveQueues {
			if q.Name == e.pyQ {
				return "messages " + mustJSON(q.Messages) + ", messages_unacknowledged " + mustJSON(q.Unacked)
			}
		}
		return "not listed"
	}
	want := "messages 0, messages_unacknowledged 2"
	if wantUnacked == "?" {
		want = "messages 0, messages_unacknowledged null"
	}
	for i := 0; ; i++ {
		got := queueLength()
		if got == want {
			if i > 0 {
				t.Logf("/api/queues/length agreed with the page after %d more request(s)", i)
			}
			break
		}
		if i == 50 {
			t.Errorf("/api/queues/length for %s: %s, want %s", e.pyQ, got, want)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Revoked through the API, so that no worker runs them later.
	for _, hid := range held {
		if code, body := e.fetch("POST", e.prefix+"/api/task/revoke/"+hid); code != 200 || !strings.Contains(body, "Revoked") {
			t.Errorf("POST /api/task/revoke/%s: %d %s", hid, code, body)
		}
	}
	e.nav("/stats")
	e.waitJS("plots", `document.querySelectorAll('svg.plot').length > 0`)
	e.shot("stats")
	if n := e.dialogs.Load(); n != 0 {
		t.Errorf("%d JavaScript dialogs opened", n)
	}

	// A worker's page: what it answers to stats, registered and
	// active_queues, for the Python worker and the celeriac worker.
	for _, wk := range []struct{ node, task string }{{e.pyNode, "tasks.add"}, {e.goNode, "dash.fragile"}} {
		e.nav("/worker/" + wk.node)
		e.waitJS("the worker page of "+wk.node, fmt.Sprintf(`(document.getElementById('worker-registered')||{}).textContent?.includes(%s) === true &&
			(document.getElementById('worker-queues')||{}).textContent?.includes(%s) === true && !!document.getElementById('worker-stats')`, jsq(wk.task), jsq(e.q)))
	}
	e.shot("worker")

	// Shutting a worker down asks first, naming it; cancelling leaves it
	// running.
	e.nav("/workers")
	e.click(fmt.Sprintf(`tr[data-worker=%s] button[value=shutdown]`, jsq(e.goNode)))
	e.waitJS("the shutdown confirmation", `!!document.getElementById('confirm-shutdown')`)
	if got := e.text("#confirm"); !strings.Contains(got, e.goNode) {
		t.Errorf("the shutdown confirmation does not name %s:\n%s", e.goNode, got)
	}
	e.shot("shutdown-confirm")
	e.click(`#cancel-shutdown`)
	e.waitJS("the celeriac worker still online after cancelling", fmt.Sprintf(`location.pathname === %s && (document.querySelector('tr[data-worker=%s]')||{}).textContent?.includes('online') === true`, jsq(e.prefix+"/workers"), jsq(e.goNode)))

	// Reading works without JavaScript: a tab with scripts disabled gets
	// the same stream, rendered by the server.
	noJS, cancelNoJS := chromedp.NewContext(ctx)
	defer cancelNoJS()
	tctx, cancelT := context.WithTimeout(noJS, 60*time.Second)
	defer cancelT()
	err := chromedp.Do(tctx,
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
			return err
		}),
		chromedp.Navigate(e.url+"/tasks?state=SUCCESS"))
	var html string
	if err == nil {
		// With scripts on, the page says "live" within a moment (the
		// other tab did); give it that moment to prove it stays static.
		time.Sleep(2 * time.Second)
		html, err = chromedp.Run(tctx, chromedp.OuterHTML(chromedp.CSS("body")))
	}
	if err != nil {
		t.Fatalf("tab without JavaScript: %v", err)
	}
	if !strings.Contains(html, `data-task="`+id+`"`) || !strings.Contains(html, `<span id="live-state">static</span>`) {
		t.Errorf("the tasks page without JavaScript:\n%s", html)
	}
}

// rabbitAPIURL is RabbitMQ's management API next to the AMQP broker
// ($CELERIAC_RABBITMQ_API_URL, else port 15672 of its host, the broker's
// credentials), "" when it does not answer: the dashboard then runs
// without --broker-api and shows unacked counts as unknown.
func rabbitAPIURL(t *testing.T, amqpURL string) string {
	t.Helper()
	api := os.Getenv("CELERIAC_RABBITMQ_API_URL")
	if api == "" {
		u, err := url.Parse(amqpURL)
		if err != nil {
			t.Fatal(err)
		}
		api = "http://" + net.JoinHostPort(u.Hostname(), "15672") + "/api/"
	}
	u, err := url.Parse(api)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", u.Host, 3*time.Second)
	if err != nil {
		if requireBrokers() {
			t.Fatalf("RabbitMQ's management API does not answer at %s (rabbitmq-plugins enable rabbitmq_management; .ci/setup does): %v", u.Redacted(), err)
		}
		t.Logf("RabbitMQ's management API does not answer at %s: unacked counts unknown", u.Redacted())
		return ""
	}
	c.Close()
	return api
}

// deadCount reads the Go queue's dead letters from the broker itself.
func (e *dashEnv) deadCount() int {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := connect.Open(ctx, connect.Options{BrokerURL: e.broker})
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	msgs, err := conn.Transport.(transport.DeadLetterStore).DeadLetters(ctx, e.goQ, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return len(msgs)
}
