package dashboard

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/internal/deadletter"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

//go:embed templates/*.html static/*
var assets embed.FS

var funcs = template.FuncMap{
	"sortcol": sortColumn,
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		d := time.Since(t).Round(time.Second)
		if d < 0 {
			d = 0
		}
		return d.String() + " ago"
	},
	"clock": zoned,
	"secs": func(f float64) string {
		if f <= 0 {
			return "-"
		}
		return fmtSecs(f)
	},
	"short": func(s string) string { return clip(s, 120) },
	"join":  strings.Join,
	"add":   func(a, b int) int { return a + b },
	"loads": func(l []float64) string {
		parts := make([]string, len(l))
		for i, f := range l {
			parts[i] = strconv.FormatFloat(f, 'f', 2, 64)
		}
		return strings.Join(parts, " ")
	},
}

// withPrefix puts the URL prefix before every site-absolute link, form
// action and source of a rendered page. Only the templates can write
// `href="/`: what they interpolate is escaped, quotes included.
func withPrefix(page []byte, prefix string) []byte {
	for _, attr := range []string{`href="/`, `action="/`, `src="/`} {
		page = bytes.ReplaceAll(page, []byte(attr), []byte(attr[:len(attr)-1]+prefix+"/"))
	}
	return page
}

// prefixWriter puts the URL prefix before a site-absolute redirect.
type prefixWriter struct {
	http.ResponseWriter
	prefix string
}

func (p *prefixWriter) WriteHeader(code int) {
	if loc := p.Header().Get("Location"); strings.HasPrefix(loc, "/") && !strings.HasPrefix(loc, "//") {
		p.Header().Set("Location", p.prefix+loc)
	}
	p.ResponseWriter.WriteHeader(code)
}

func (p *prefixWriter) Flush() {
	if f, ok := p.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (p *prefixWriter) Unwrap() http.ResponseWriter { return p.ResponseWriter }

// zoned is how pages show a time: UTC, and saying so, since the workers'
// clocks and the reader's zone differ.
func zoned(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
}

var pages = template.Must(template.New("").Funcs(funcs).ParseFS(assets, "templates/*.html"))

// page is what every template gets.
type page struct {
	Title    string
	Nav      string
	Template string
	CSRF     string
	CanAct   bool // actions are offered: credentials configured, not read-only
	Authed   bool
	ReadOnly bool
	NoAuth   bool
	Flash    string
	Broker   string
	// BrokerDown is why the broker does not answer, since BrokerDownSince
	// ("" when it does).
	BrokerDown      string
	BrokerDownSince time.Time
	Stats           Stats
	Now             time.Time
	Self            string // this page's path and query, for "back" links
	Prefix          string // Options.URLPrefix
	Data            any
}

// routes are every route the dashboard serves; Handler registers each
// through guard, and the tests enumerate them.
func (d *Dashboard) routes() []route {
	return append([]route{
		{pattern: "GET /{$}", h: func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/workers", http.StatusSeeOther)
		}},
		{pattern: "GET /workers", h: d.workersPage},
		{pattern: "GET /worker/{name}", h: d.workerPage},
		{pattern: "GET /tasks", h: d.tasksPage},
		{pattern: "GET /task/{id}", h: d.taskPage},
		{pattern: "GET /stats", h: d.statsPage},
		{pattern: "GET /queues", h: d.queuesPage},
		{pattern: "GET /dlq", h: d.dlqPage, broker: true},
		{pattern: "GET /dlq/show", h: d.dlqShowPage, broker: true},
		{pattern: "GET /login", h: d.loginPage, public: true},
		{pattern: "GET /events", h: d.sse, stream: true},
		{pattern: "GET /static/{file}", h: d.static, public: true},
		{pattern: "POST /login", h: d.login, public: true},
		{pattern: "POST /logout", h: d.action(d.logout), public: true},
		{pattern: "POST /action/worker", h: d.action(d.workerAction)},
		{pattern: "POST /action/revoke", h: d.action(d.revokeAction)},
		{pattern: "POST /action/dlq/replay", h: d.action(d.replayAction), broker: true},
		{pattern: "POST /action/dlq/purge", h: d.action(d.purgeAction), broker: true},
	}, d.apiRoutes()...)
}

// Handler returns the dashboard's HTTP handler. Every request is checked
// for its Host first (see hostAllowed), then goes through guard.
func (d *Dashboard) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range d.routes() {
		mux.Handle(rt.pattern, d.guard(rt))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w.Header())
		if p := d.o.URLPrefix; p != "" {
			rest, ok := strings.CutPrefix(r.URL.Path, p)
			if !ok || rest != "" && rest[0] != '/' {
				http.NotFound(w, r)
				return
			}
			if rest == "" {
				rest = "/"
			}
			r2 := *r
			u := *r.URL
			u.Path, u.RawPath = rest, ""
			r2.URL = &u
			r = &r2
			w = &prefixWriter{ResponseWriter: w, prefix: p}
		}
		if !d.hostAllowed(r.Host) {
			http.Error(w, "unknown host: start the dashboard with --allowed-host "+clip(r.Host, 64)+" to serve this name", http.StatusMisdirectedRequest)
			return
		}
		// Forms post at most a selection of ids.
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		mux.ServeHTTP(w, r)
	})
}

// Server returns an HTTP server for Handler with timeouts on every phase
// of a request, so that a slow or idle client cannot hold a connection
// (the event stream sets its own deadlines).
func (d *Dashboard) Server() *http.Server {
	return &http.Server{
		Handler:           d.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      handlerTimeout + 10*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          zap.NewStdLog(d.log.Named("http")),
	}
}

func (d *Dashboard) static(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	b, err := assets.ReadFile("static/" + name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	switch {
	case strings.HasSuffix(name, ".js"):
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	case strings.HasSuffix(name, ".css"):
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
	}
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(b)
}

// render writes a page, or only its live part when the script asks for it
// (X-Fragment), rendering into a buffer first so that a template error is
// a clean 500, never half a page.
func (d *Dashboard) render(w http.ResponseWriter, r *http.Request, status int, p page) {
	p.CSRF = d.csrfToken(w, r)
	p.ReadOnly = d.o.ReadOnly
	p.NoAuth = !d.authConfigured()
	p.CanAct = !d.o.ReadOnly && d.authConfigured()
	p.Authed = d.authenticated(r)
	p.Broker = d.o.BrokerScheme
	if p.Authed || !d.authConfigured() {
		p.Stats = d.store.Stats()
		p.BrokerDown, p.BrokerDownSince = d.BrokerDown()
	}
	p.Now = time.Now()
	p.Self = r.URL.RequestURI()
	if p.Flash == "" {
		p.Flash = r.URL.Query().Get("msg")
	}
	name := p.Template
	if r.Header.Get("X-Fragment") == "1" {
		name += "-live"
	}
	p.Prefix = d.o.URLPrefix
	var buf bytes.Buffer
	if err := pages.ExecuteTemplate(&buf, name, p); err != nil {
		d.log.Error("rendering a page failed", zap.String("template", name), zap.Error(err))
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	out := buf.Bytes()
	if p.Prefix != "" {
		out = withPrefix(out, p.Prefix)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(out)
}

type workerRow struct {
	Worker
	Online bool
}

func (d *Dashboard) workersPage(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	var rows []workerRow
	for _, wk := range d.store.Workers() {
		rows = append(rows, workerRow{Worker: wk, Online: wk.Online(now)})
	}
	d.render(w, r, http.StatusOK, page{Title: "Workers", Nav: "workers", Template: "workers", Data: rows})
}

const pageSize = 50

// pageSizes are the task list's page sizes on offer; the largest bounds a
// page's size in bytes as pageSize did (a task row shows at most ~1 KiB).
var pageSizes = []int{20, 50, 100, 200}

type tasksData struct {
	Filter  Filter
	Since   string
	Until   string
	States  []string
	Tasks   []Task
	Total   int
	Page    int
	Pages   int
	PrevURL string
	NextURL string
	// SortURLs link each sortable column to its order: ascending, or
	// descending when it is already ascending.
	SortURLs   map[string]string
	FilterOpen bool
	Size       int
	Sizes      []int
}

// sortCol is a sortable column header of the tasks table.
type sortCol struct {
	Key, Label, URL string
	Dir             string // "asc", "desc" or "" (not the order)
	Aria            string // aria-sort
}

func sortColumn(urls map[string]string, current, key, label string) sortCol {
	c := sortCol{Key: key, Label: label, URL: urls[key]}
	switch current {
	case key:
		c.Dir, c.Aria = "asc", "ascending"
	case "-" + key:
		c.Dir, c.Aria = "desc", "descending"
	}
	return c
}

// parseWhen reads a time filter: RFC 3339, "2006-01-02T15:04" (an HTML
// datetime-local field, UTC), or a duration back from now ("15m").
func parseWhen(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time (2006-01-02T15:04:05, RFC 3339) or a duration back from now (15m)", s)
}

func (d *Dashboard) tasksPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	now := time.Now()
	data := tasksData{States: States, Since: q.Get("since"), Until: q.Get("until")}
	data.Filter = Filter{Name: q.Get("name"), State: strings.ToUpper(q.Get("state")), Worker: q.Get("worker"), Search: clip(q.Get("q"), 256)}
	if s := q.Get("sort"); validSort(s) {
		data.Filter.Sort = s
	}
	size := pageSize
	if n, err := strconv.Atoi(q.Get("size")); err == nil && slices.Contains(pageSizes, n) {
		size = n
	}
	data.Size, data.Sizes = size, pageSizes
	var flash string
	var err error
	if data.Filter.Since, err = parseWhen(data.Since, now); err != nil {
		flash = "since: " + err.Error()
	}
	if data.Filter.Until, err = parseWhen(data.Until, now); err != nil {
		flash = "until: " + err.Error()
	}
	data.Page, _ = strconv.Atoi(q.Get("page"))
	data.Page = max(data.Page, 1)
	data.Tasks, data.Total = d.store.Tasks(data.Filter, (data.Page-1)*size, size)
	data.Pages = max(1, (data.Total+size-1)/size)
	linkSorted := func(p int, sort string) string {
		v := url.Values{}
		for _, k := range []string{"q", "name", "state", "worker", "since", "until", "size"} {
			if s := q.Get(k); s != "" {
				v.Set(k, s)
			}
		}
		if sort != "" {
			v.Set("sort", sort)
		}
		v.Set("page", strconv.Itoa(p))
		return "/tasks?" + v.Encode()
	}
	link := func(p int) string { return linkSorted(p, data.Filter.Sort) }
	data.SortURLs = map[string]string{}
	for _, k := range SortKeys {
		next := k
		if data.Filter.Sort == k {
			next = "-" + k
		}
		data.SortURLs[k] = linkSorted(1, next)
	}
	if data.Page > 1 {
		data.PrevURL = link(data.Page - 1)
	}
	if data.Page < data.Pages {
		data.NextURL = link(data.Page + 1)
	}
	d.render(w, r, http.StatusOK, page{Title: "Tasks", Nav: "tasks", Template: "tasks", Data: data, Flash: flash})
}

type taskData struct {
	Task     Task
	Known    bool
	Children []Task
	// From the result backend.
	Backend      bool
	BackendState string
	BackendValue string
	BackendTrace string
	BackendErr   string
	// Revocable: not in a final state.
	Revocable bool
	// Workflow is the canvas the task is part of, when it has more than
	// the task itself: every task of its root, as a tree.
	Workflow     []WorkflowNode
	WorkflowRoot string
}

// maxWorkflow bounds the tasks a workflow view lists.
const maxWorkflow = 200

func (d *Dashboard) taskPage(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	t, known := d.store.Task(id)
	data := taskData{Task: t, Known: known}
	if !known {
		data.Task = Task{ID: id, State: StatePending}
	}
	for _, c := range t.Children {
		if ct, ok := d.store.Task(c); ok {
			data.Children = append(data.Children, ct)
		} else {
			data.Children = append(data.Children, Task{ID: c})
		}
	}
	if be := d.o.Backend; be != nil && id != "" {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		meta, err := be.Get(ctx, id)
		cancel()
		switch {
		case errors.Is(err, backend.ErrNotFound):
		case err != nil:
			data.BackendErr = err.Error()
		default:
			data.Backend = true
			data.BackendState = string(meta.Status)
			data.BackendValue = describe(meta, maxReprLen)
			data.BackendTrace = clip(meta.Traceback, maxTraceLen)
			for _, c := range meta.Children {
				if cid := childID(c); cid != "" && !containsTask(data.Children, cid) && len(data.Children) < maxChildren {
					ct, ok := d.store.Task(cid)
					if !ok {
						ct = Task{ID: cid}
					}
					data.Children = append(data.Children, ct)
				}
			}
			if !known {
				data.Task.State = data.BackendState
			}
		}
	}
	if !known && !data.Backend {
		d.render(w, r, http.StatusNotFound, page{Title: "Task " + id, Nav: "tasks", Template: "task", Data: data})
		return
	}
	data.Revocable = !ready(data.Task.State)
	root := data.Task.RootID
	if root == "" {
		root = id // a root task's root_id is itself, which the store drops
	}
	if wf := d.store.Workflow(root, maxWorkflow); len(wf) > 1 {
		data.Workflow, data.WorkflowRoot = wf, root
	}
	d.render(w, r, http.StatusOK, page{Title: "Task " + id, Nav: "tasks", Template: "task", Data: data})
}

func containsTask(ts []Task, id string) bool {
	for _, t := range ts {
		if t.ID == id {
			return true
		}
	}
	return false
}

// childID reads a task id from a result's children entry: Celery stores
// each as a result tuple ((id, parent), None) or [[id, None], None].
func childID(v any) string {
	for range 3 {
		switch x := v.(type) {
		case string:
			return x
		case []any:
			if len(x) == 0 {
				return ""
			}
			v = x[0]
		default:
			return ""
		}
	}
	return ""
}

// describe is a result's repr (an exception's as Celery shows it) in at
// most limit bytes: written with the bounded writer, since a small
// result (a pickle of shared parts) can expand a thousandfold.
func describe(m *protocol.ResultMeta, limit int) string {
	var b strings.Builder
	v := m.Result
	if ex, ok := v.(*protocol.ExceptionInfo); ok {
		b.WriteString(clip(ex.Type, 256))
		b.WriteString("(")
		for i, a := range ex.Message {
			if i > 0 {
				b.WriteString(", ")
			}
			if b.Len() >= limit {
				break
			}
			s, _ := protocol.ReprLimit(a, limit-b.Len())
			b.WriteString(s)
		}
		b.WriteString(")")
		return clip(b.String(), limit)
	}
	s, truncated := protocol.ReprLimit(v, limit)
	if truncated {
		s += "…"
	}
	return s
}

type statsRow struct {
	Name      string
	Succeeded int
	Failed    int
	P50, P95  float64
	Plot      template.HTML
}

func (d *Dashboard) statsPage(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	var rows []statsRow
	for _, n := range d.store.Names() {
		series := d.store.Series(n, now)
		row := statsRow{Name: n, Plot: plot(n, series)}
		for _, p := range series {
			row.Succeeded += p.Succeeded
			row.Failed += p.Failed
		}
		if last := lastWith(series); last != nil {
			row.P50, row.P95 = last.P50, last.P95
		}
		rows = append(rows, row)
	}
	all, waits := d.store.SeriesAll(now)
	data := statsData{Rows: rows, All: plot("all tasks", all), Waits: plot("queue wait", waits)}
	// The last minute that has passed: the current one is partial.
	if len(all) >= 2 {
		m := all[len(all)-2]
		data.OKPerSec, data.FailPerSec = float64(m.Succeeded)/60, float64(m.Failed)/60
	}
	if last := lastWith(all); last != nil {
		data.RunP50, data.RunP95 = last.P50, last.P95
	}
	if last := lastWith(waits); last != nil {
		data.WaitP50, data.WaitP95 = last.P50, last.P95
	}
	for _, p := range all {
		data.Any = data.Any || p.Succeeded+p.Failed > 0
	}
	d.render(w, r, http.StatusOK, page{Title: "Throughput and runtime", Nav: "stats", Template: "stats", Data: data})
}

// statsData is the throughput page: every task's figures, then per name.
type statsData struct {
	Rows                 []statsRow
	All, Waits           template.HTML
	Any                  bool
	OKPerSec, FailPerSec float64
	RunP50, RunP95       float64
	WaitP50, WaitP95     float64
}

func lastWith(ps []Point) *Point {
	for i := len(ps) - 1; i >= 0; i-- {
		if ps[i].Samples > 0 {
			return &ps[i]
		}
	}
	return nil
}

func (d *Dashboard) queuesPage(w http.ResponseWriter, r *http.Request) {
	d.render(w, r, http.StatusOK, page{Title: "Queues", Nav: "queues", Template: "queues", Data: d.queues(r.Context())})
}

type deadRow struct {
	ID, TaskID, TaskName, Reason, Error string
	Retries                             string
	Time                                time.Time
}

type dlqQueue struct {
	Name  string
	Rows  []deadRow
	Err   string
	More  bool
	Count int
}

type dlqData struct {
	Queues   []dlqQueue
	Selected string
	Names    []string
}

const dlqListLimit = 200

func (d *Dashboard) deadStore() (transport.DeadLetterStore, error) {
	s, ok := d.o.Transport.(transport.DeadLetterStore)
	if !ok {
		return nil, fmt.Errorf("the %s transport keeps no dead letters", d.o.BrokerScheme)
	}
	return serialDead{s, &d.deadMu}, nil
}

// serialDead runs one dead-letter operation at a time. On RabbitMQ a
// listing takes each dead letter off its queue and puts it back, so two
// listings at once (a page and its live refresh) would each miss what the
// other holds.
type serialDead struct {
	s  transport.DeadLetterStore
	mu *sync.Mutex
}

func (s serialDead) DeadLetters(ctx context.Context, queue string, limit int) ([]transport.DeadMessage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.s.DeadLetters(ctx, queue, limit)
}

func (s serialDead) Replay(ctx context.Context, queue string, ids []string, opts transport.ReplayOptions) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.s.Replay(ctx, queue, ids, opts)
}

func (s serialDead) PurgeDead(ctx context.Context, queue string, ids []string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.s.PurgeDead(ctx, queue, ids)
}

func (d *Dashboard) dlqPage(w http.ResponseWriter, r *http.Request) {
	data := dlqData{Selected: r.URL.Query().Get("queue"), Names: d.queueNames()}
	store, err := d.deadStore()
	if err != nil {
		d.render(w, r, http.StatusOK, page{Title: "Dead letters", Nav: "dlq", Template: "dlq", Data: data, Flash: err.Error()})
		return
	}
	names := data.Names
	if data.Selected != "" {
		if !slices.Contains(names, data.Selected) {
			d.render(w, r, http.StatusNotFound, page{Title: "Dead letters", Nav: "dlq", Template: "dlq", Data: data,
				Flash: "no such queue: the dashboard shows the queues given with -Q and those the workers consume"})
			return
		}
		names = []string{data.Selected}
	}
	for _, q := range names {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		msgs, err := store.DeadLetters(ctx, q, dlqListLimit+1)
		cancel()
		dq := dlqQueue{Name: q}
		if err != nil {
			dq.Err = err.Error()
		}
		if len(msgs) > dlqListLimit {
			msgs, dq.More = msgs[:dlqListLimit], true
		}
		for _, m := range msgs {
			errText := d.deadError(r.Context(), m, false)
			dq.Rows = append(dq.Rows, deadRow{
				ID: m.ID, TaskID: deadletter.TaskID(m), TaskName: deadletter.TaskName(m),
				Reason: deadReason(m, errText), Error: clip(errText, 300), Time: m.Reason.Time,
				Retries: fmt.Sprint(m.Message.Headers["retries"]),
			})
		}
		dq.Count = len(dq.Rows)
		data.Queues = append(data.Queues, dq)
	}
	d.render(w, r, http.StatusOK, page{Title: "Dead letters", Nav: "dlq", Template: "dlq", Data: data})
}

type dlqShowData struct {
	Queue string
	ID    string
	Doc   string
	Error string
}

// deadReason is a dead letter's reason: the worker's (Redis), else, where
// RabbitMQ says only "rejected", the one its error names.
func deadReason(m transport.DeadMessage, errText string) string {
	if m.Reason.Reason == "rejected" {
		switch {
		case strings.HasPrefix(errText, "NotRegistered("):
			return "not-registered"
		case strings.HasPrefix(errText, "InvalidTaskError("):
			return "invalid"
		}
	}
	return m.Reason.Reason
}

// deadError is why a dead letter's task failed: what the worker recorded
// with it (Redis), else, since RabbitMQ's dead-letter exchange records only
// "rejected", the exception of the task's failure event, else (when asked,
// it costs a round trip) the stored result.
func (d *Dashboard) deadError(ctx context.Context, m transport.DeadMessage, backendToo bool) string {
	if m.Reason.Error != "" {
		return m.Reason.Error
	}
	id := deadletter.TaskID(m)
	if t, ok := d.store.Task(id); ok && t.Exception != "" {
		return t.Exception
	}
	if backendToo && d.o.Backend != nil && id != "" {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if meta, err := d.o.Backend.Get(ctx, id); err == nil && meta.Status == protocol.StateFailure {
			return describe(meta, maxReprLen)
		}
	}
	return ""
}

func (d *Dashboard) dlqShowPage(w http.ResponseWriter, r *http.Request) {
	q, id := r.URL.Query().Get("queue"), r.URL.Query().Get("id")
	data := dlqShowData{Queue: q, ID: id}
	store, err := d.deadStore()
	if err != nil {
		d.render(w, r, http.StatusNotFound, page{Title: "Dead letter", Nav: "dlq", Template: "dlqshow", Data: data, Flash: err.Error()})
		return
	}
	if !slices.Contains(d.queueNames(), q) {
		d.render(w, r, http.StatusNotFound, page{Title: "Dead letter", Nav: "dlq", Template: "dlqshow", Data: data,
			Flash: "no such queue: the dashboard shows the queues given with -Q and those the workers consume"})
		return
	}
	// The same bound and timeout as the list a dead letter is picked
	// from: a lookup never reads a whole queue.
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	msgs, err := store.DeadLetters(ctx, q, dlqListLimit)
	cancel()
	if err != nil {
		d.render(w, r, http.StatusBadGateway, page{Title: "Dead letter", Nav: "dlq", Template: "dlqshow", Data: data, Flash: err.Error()})
		return
	}
	m, ok := deadletter.Find(msgs, id)
	if !ok {
		d.render(w, r, http.StatusNotFound, page{Title: "Dead letter", Nav: "dlq", Template: "dlqshow", Data: data,
			Flash: fmt.Sprintf("no dead letter %q among the first %d of %s", clip(id, 128), dlqListLimit, q)})
		return
	}
	data.Doc = clip(indentJSON(deadletter.Doc(m)), maxDocLen)
	data.Error = d.deadError(r.Context(), m, true)
	d.render(w, r, http.StatusOK, page{Title: "Dead letter " + id, Nav: "dlq", Template: "dlqshow", Data: data})
}

func (d *Dashboard) loginPage(w http.ResponseWriter, r *http.Request) {
	d.render(w, r, http.StatusOK, page{Title: "Log in", Template: "login", Data: safeBack(r.URL.Query().Get("back"), "")})
}

// login takes the token from the form and, when right, sets the login
// cookie (an HMAC of the token, so that the cookie is worthless after a
// restart with another token).
func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	if !d.checkCSRF(r) {
		d.deny(w, r, http.StatusForbidden, "missing or wrong CSRF token: reload the page and try again")
		return
	}
	if d.tooMany(w, r) {
		return
	}
	tok := d.o.AuthToken
	if tok == "" || !equal(r.PostFormValue("token"), tok) {
		d.loginFailed(r, "form", "")
		d.render(w, r, http.StatusUnauthorized, page{Title: "Log in", Template: "login", Flash: "wrong token", Data: safeBack(r.PostFormValue("back"), "")})
		return
	}
	id := randomHex(16)
	d.sessions.add(d.mac("session", id), time.Now())
	http.SetCookie(w, &http.Cookie{Name: authCookie, Value: id, Path: "/", MaxAge: int(sessionTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, safeBack(r.PostFormValue("back"), "/workers"), http.StatusSeeOther)
}

// logout ends the login session, on the server: the cookie is worthless
// afterwards even if kept.
func (d *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(authCookie); err == nil {
		d.sessions.remove(d.mac("session", c.Value))
	}
	http.SetCookie(w, &http.Cookie{Name: authCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

func (d *Dashboard) deny(w http.ResponseWriter, r *http.Request, status int, msg string) {
	d.render(w, r, status, page{Title: "Not allowed", Template: "denied", Data: msg})
}

// action wraps a mutating handler: read-only mode, credentials, then CSRF,
// in that order; an action that passes is logged.
func (d *Dashboard) action(h func(w http.ResponseWriter, r *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		isLogout := r.URL.Path == "/logout"
		switch {
		case d.o.ReadOnly && !isLogout:
			d.deny(w, r, http.StatusForbidden, "the dashboard runs with --read-only: no actions")
			return
		case !d.authConfigured() && !isLogout:
			d.deny(w, r, http.StatusForbidden, "actions need credentials: start the dashboard with --auth-token or --basic-auth-file")
			return
		case !d.authenticated(r) && !isLogout:
			d.needLogin(w, r)
			return
		case !d.checkCSRF(r):
			d.deny(w, r, http.StatusForbidden, "missing or wrong CSRF token: reload the page and try again")
			return
		}
		if !isLogout {
			d.log.Info("dashboard action", zap.String("path", r.URL.Path), zap.String("remote", r.RemoteAddr),
				zap.Any("form", redactForm(r.PostForm)))
		}
		h(w, r)
	}
}

func redactForm(f url.Values) map[string][]string {
	out := map[string][]string{}
	for k, v := range f {
		if k == "csrf" || k == "token" {
			continue
		}
		out[k] = v
	}
	return out
}

// done redirects back to where the action was asked, with its outcome.
func done(w http.ResponseWriter, r *http.Request, def, msg string) {
	back := safeBack(r.PostFormValue("back"), def)
	u, err := url.Parse(back)
	if err != nil {
		u = &url.URL{Path: def}
	}
	q := u.Query()
	q.Set("msg", msg)
	u.RawQuery = q.Encode()
	http.Redirect(w, r, u.String(), http.StatusSeeOther)
}

// workerOps are the per-worker actions and the remote-control method each
// sends.
var workerOps = map[string]string{
	"ping": "ping", "shutdown": "shutdown", "pool_grow": "pool_grow", "pool_shrink": "pool_shrink",
	"enable_events": "enable_events", "disable_events": "disable_events", "rate_limit": "rate_limit",
	"autoscale": "autoscale", "add_consumer": "add_consumer", "cancel_consumer": "cancel_consumer",
	"time_limit": "time_limit",
}

// workerBack is where a worker action returns: the worker's page when it
// was asked from there.
func workerBack(r *http.Request) string {
	return safeBack(r.PostFormValue("back"), "/workers")
}

func (d *Dashboard) workerAction(w http.ResponseWriter, r *http.Request) {
	op, host := r.PostFormValue("op"), r.PostFormValue("worker")
	method, ok := workerOps[op]
	if !ok || host == "" {
		http.Error(w, "unknown action or no worker", http.StatusBadRequest)
		return
	}
	// The worker page shows what the action changed, not replies kept
	// from before it.
	d.askMu.Lock()
	delete(d.asked, host)
	d.askMu.Unlock()
	args := map[string]any{}
	switch op {
	case "pool_grow", "pool_shrink":
		n, err := strconv.Atoi(r.PostFormValue("n"))
		if err != nil || n < 1 {
			n = 1
		}
		args["n"] = int64(n)
	case "rate_limit":
		task, rate := strings.TrimSpace(r.PostFormValue("task_name")), strings.TrimSpace(r.PostFormValue("rate_limit"))
		if task == "" || rate == "" {
			done(w, r, workerBack(r), "rate limit: give a task name and a rate (10/s, 5/m, 0 to disable)")
			return
		}
		args["task_name"], args["rate_limit"] = task, rate
	case "autoscale":
		hi, err1 := strconv.Atoi(r.PostFormValue("max"))
		lo, err2 := strconv.Atoi(r.PostFormValue("min"))
		if err1 != nil || err2 != nil || hi < 1 || lo < 0 || lo > hi {
			done(w, r, workerBack(r), "autoscale: give max and min, 0 <= min <= max")
			return
		}
		args["max"], args["min"] = int64(hi), int64(lo)
	case "add_consumer", "cancel_consumer":
		q := strings.TrimSpace(r.PostFormValue("queue"))
		if q == "" {
			done(w, r, workerBack(r), op+": give a queue")
			return
		}
		args["queue"] = clip(q, 256)
	case "time_limit":
		task := strings.TrimSpace(r.PostFormValue("task_name"))
		soft, err1 := strconv.ParseFloat(r.PostFormValue("soft"), 64)
		hard, err2 := strconv.ParseFloat(r.PostFormValue("hard"), 64)
		if task == "" || err1 != nil || err2 != nil || soft < 0 || hard < 0 {
			done(w, r, workerBack(r), "time limit: give a task name and soft and hard limits in seconds (0: none)")
			return
		}
		args["task_name"], args["soft"], args["hard"] = clip(task, 256), soft, hard
	}
	// One named worker: the call returns at its reply, so a busy worker
	// may take longer than a broadcast's collection time.
	o := client.ControlOptions{Destination: []string{host}, Limit: 1, Timeout: max(d.o.ControlTimeout, 5*time.Second)}
	if op == "shutdown" {
		if r.PostFormValue("confirm") != "yes" {
			d.render(w, r, http.StatusOK, page{Title: "Confirm shutdown", Nav: "workers", Template: "confirm-shutdown",
				Data: struct{ Worker string }{host}})
			return
		}
		if err := d.o.Control.Cast(r.Context(), method, args, o); err != nil {
			done(w, r, "/workers", "shutdown: "+err.Error())
			return
		}
		done(w, r, "/workers", "shutdown sent to "+host)
		return
	}
	replies, err := d.o.Control.Call(r.Context(), method, args, o)
	done(w, r, workerBack(r), op+" "+host+": "+replyText(replies, err))
}

// replyText sums up remote-control replies for a person.
func replyText(replies []client.Reply, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	if len(replies) == 0 {
		return "no reply within the timeout"
	}
	sort.Slice(replies, func(i, j int) bool { return replies[i].Hostname < replies[j].Hostname })
	var parts []string
	for i, rp := range replies {
		if i == 100 {
			parts = append(parts, fmt.Sprintf("and %d more", len(replies)-i))
			break
		}
		v := rp.Value
		if m, ok := v.(map[string]any); ok {
			if okv, has := m["ok"]; has {
				v = okv
			} else if e, has := m["error"]; has {
				v = "error: " + str(e)
			}
		}
		s, isStr := v.(string)
		if !isStr {
			s, _ = protocol.ReprLimit(v, 300)
		}
		parts = append(parts, clip(rp.Hostname, maxHostLen)+" → "+clip(s, 300))
	}
	return strings.Join(parts, "; ")
}

func (d *Dashboard) revokeAction(w http.ResponseWriter, r *http.Request) {
	id := r.PostFormValue("id")
	if id == "" {
		http.Error(w, "no task id", http.StatusBadRequest)
		return
	}
	args := map[string]any{"task_id": []any{id}}
	what := "revoke"
	if r.PostFormValue("terminate") != "" {
		args["terminate"], args["signal"] = true, "SIGTERM"
		what = "revoke (terminate)"
	}
	replies, err := d.o.Control.Call(r.Context(), "revoke", args, client.ControlOptions{Timeout: d.o.ControlTimeout})
	done(w, r, "/task/"+url.PathEscape(id), what+" "+id+": "+replyText(replies, err))
}

// selection reads the dead letters a form names: every "id" field, or all
// of the queue's with all=1. It returns an error when neither is given, so
// that an empty selection never means "all".
func selection(r *http.Request) (ids []string, all bool, err error) {
	if r.PostFormValue("all") == "1" {
		return nil, true, nil
	}
	for _, id := range r.PostForm["id"] {
		if id = strings.TrimSpace(id); id != "" {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil, false, errors.New("select dead letters first (or use the \"all\" button)")
	}
	return ids, false, nil
}

func dlqBack(q string) string { return "/dlq?queue=" + url.QueryEscape(q) }

func (d *Dashboard) replayAction(w http.ResponseWriter, r *http.Request) {
	q := r.PostFormValue("queue")
	store, err := d.deadStore()
	if err != nil || q == "" {
		done(w, r, "/dlq", fmt.Sprint("replay: ", err, " queue ", q))
		return
	}
	if !slices.Contains(d.queueNames(), q) {
		done(w, r, "/dlq", "replay: no such queue: the dashboard acts on the queues given with -Q and those the workers consume")
		return
	}
	given, _, err := selection(r)
	if err != nil {
		done(w, r, dlqBack(q), "replay: "+err.Error())
		return
	}
	ids, err := deadletter.ResolveIDs(r.Context(), store, q, given)
	if err != nil {
		done(w, r, dlqBack(q), "replay: "+err.Error())
		return
	}
	reset := r.PostFormValue("reset_retries") != ""
	n, err := store.Replay(r.Context(), q, ids, transport.ReplayOptions{ResetRetries: reset})
	msg := fmt.Sprintf("replayed %d message(s) to %s", n, q)
	if reset {
		msg += " with retries reset"
	}
	if err != nil {
		msg += "; error: " + err.Error()
	}
	d.store.touch()
	done(w, r, dlqBack(q), msg)
}

type confirmData struct {
	Queue string
	IDs   []string // as given: what the confirmation posts again
	Items []confirmItem
	All   bool
	Count int
	Back  string
}

// confirmItem is a dead letter as the confirmation names it: by its task,
// not by the store's id (a delivery tag on Redis).
type confirmItem struct{ TaskID, TaskName string }

// purgeAction deletes dead letters for good, so it asks first: without
// confirm=yes it shows what would go and a button that repeats the request
// with confirm=yes.
func (d *Dashboard) purgeAction(w http.ResponseWriter, r *http.Request) {
	q := r.PostFormValue("queue")
	store, err := d.deadStore()
	if err != nil || q == "" {
		done(w, r, "/dlq", fmt.Sprint("purge: ", err, " queue ", q))
		return
	}
	if !slices.Contains(d.queueNames(), q) {
		done(w, r, "/dlq", "purge: no such queue: the dashboard acts on the queues given with -Q and those the workers consume")
		return
	}
	given, all, err := selection(r)
	if err != nil {
		done(w, r, dlqBack(q), "purge: "+err.Error())
		return
	}
	ids, err := deadletter.ResolveIDs(r.Context(), store, q, given)
	if err != nil {
		done(w, r, dlqBack(q), "purge: "+err.Error())
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		cd := confirmData{Queue: q, IDs: given, All: all, Count: len(ids), Back: safeBack(r.PostFormValue("back"), dlqBack(q))}
		if !all {
			ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
			msgs, _ := store.DeadLetters(ctx, q, dlqListLimit)
			cancel()
			for _, id := range ids {
				item := confirmItem{TaskID: id}
				if m, ok := deadletter.Find(msgs, id); ok {
					item = confirmItem{TaskID: deadletter.TaskID(m), TaskName: deadletter.TaskName(m)}
				}
				cd.Items = append(cd.Items, item)
			}
		}
		if all {
			msgs, err := store.DeadLetters(r.Context(), q, 0)
			if err != nil {
				done(w, r, dlqBack(q), "purge: "+err.Error())
				return
			}
			cd.Count = len(msgs)
		}
		d.render(w, r, http.StatusOK, page{Title: "Confirm purge", Nav: "dlq", Template: "confirm", Data: cd})
		return
	}
	n, err := store.PurgeDead(r.Context(), q, ids)
	msg := fmt.Sprintf("purged %d dead letter(s) of %s", n, q)
	if err != nil {
		msg += "; error: " + err.Error()
	}
	d.store.touch()
	done(w, r, dlqBack(q), msg)
}

// The event stream's own deadlines, in place of the server's: each write
// must complete within sseWriteWindow, and a stream ends after sseMaxLife
// (the browser's EventSource reconnects, and is checked again).
var (
	sseWriteWindow = 30 * time.Second
	sseMaxLife     = 30 * time.Minute
)

// sse streams a "change" event whenever the history changes, at most twice
// a second, and a comment every 15 s to keep proxies from closing it. The
// page's script then fetches its own live part again.
func (d *Dashboard) sse(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), sseMaxLife)
	defer cancel()
	// The server's read deadline (the request's) would otherwise end the
	// stream; its write deadline is replaced by one per write.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	write := func(s string) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(sseWriteWindow))
		if _, err := io.WriteString(w, s); err != nil {
			return false
		}
		fl.Flush()
		return true
	}
	// Watch before answering: a change right after the client hears from
	// us must not be missed.
	ch, _ := d.store.Changed()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	_ = rc.SetWriteDeadline(time.Now().Add(sseWriteWindow))
	w.WriteHeader(http.StatusOK)
	if !write("retry: 2000\n\n") {
		return
	}
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-keep.C:
			if !write(": keep-alive\n\n") {
				return
			}
		case <-ch:
			ch, _ = d.store.Changed()
			st := d.store.Stats()
			down, since := d.BrokerDown()
			data, _ := json.Marshal(map[string]any{"version": st.Version, "tasks": st.Tasks, "workers": st.Workers,
				"broker_down": down, "broker_down_since": zoned(since)})
			if !write("event: change\ndata: " + string(data) + "\n\n") {
				return
			}
			select {
			case <-time.After(500 * time.Millisecond):
			case <-ctx.Done():
				return
			}
		}
	}
}
