package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
)

// The JSON API: Flower's paths, answers shaped as Flower documents them
// (not checked against a running Flower) (/api/workers, /api/tasks,
// /api/task/info/<id>, /api/task/result/<id>, /api/task/async-apply/<name>,
// /api/task/revoke/<id>, /api/task/rate-limit/<name>, /api/queues/length),
// behind the same credentials as the pages. Writes need credentials configured and
// given, no --read-only, and either the page's CSRF token or a JSON body
// (Content-Type: application/json): a form another site makes a browser
// post cannot have that type without a CORS preflight, which the dashboard
// never grants, so a browser's cached basic-auth credentials or session
// cookie cannot be borrowed.

// apiRoutes are the API's routes; routes() adds them.
func (d *Dashboard) apiRoutes() []route {
	return []route{
		{pattern: "GET /api/workers", h: d.apiWorkers},
		{pattern: "GET /api/tasks", h: d.apiTasks},
		{pattern: "GET /api/task/info/{id}", h: d.apiTaskInfo},
		{pattern: "GET /api/task/result/{id}", h: d.apiTaskResult},
		{pattern: "GET /api/queues/length", h: d.apiQueues},
		{pattern: "POST /api/task/async-apply/{name}", h: d.apiWrite(d.apiAsyncApply)},
		{pattern: "POST /api/task/revoke/{id}", h: d.apiWrite(d.apiRevoke)},
		{pattern: "POST /api/task/rate-limit/{name}", h: d.apiWrite(d.apiRateLimit)},
		{pattern: "GET /metrics", h: d.metrics},
	}
}

// maxAPITasks bounds one /api/tasks answer, as a page of the task list is
// bounded: a task holds up to 20 KiB of args, result and traceback, so an
// answer stays under 5 MiB; offset pages through the rest.
const maxAPITasks = 200

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"error": "encoding the answer failed"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func apiError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// apiWorkers is Flower's /api/workers: by worker name, what the dashboard
// knows of it; with status=true only whether each is online.
func (d *Dashboard) apiWorkers(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	out := map[string]any{}
	for _, wk := range d.store.Workers() {
		if r.URL.Query().Get("workername") != "" && wk.Hostname != r.URL.Query().Get("workername") {
			continue
		}
		if r.URL.Query().Get("status") == "true" {
			out[wk.Hostname] = wk.Online(now)
			continue
		}
		out[wk.Hostname] = map[string]any{
			"hostname": wk.Hostname, "online": wk.Online(now), "sw_ident": wk.SWIdent, "sw_ver": wk.SWVer, "sw_sys": wk.SWSys,
			"active": wk.Active, "processed": wk.Processed, "loadavg": wk.Loadavg, "freq": wk.Freq,
			"last_heartbeat": unixOrNil(wk.LastHeartbeat),
			"stats":          map[string]any{"pool": map[string]any{"implementation": wk.Pool, "max-concurrency": wk.Concurrency}},
			"active_queues":  queueList(wk.Queues),
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func queueList(names []string) []map[string]any {
	out := make([]map[string]any, 0, len(names))
	for _, n := range names {
		out = append(out, map[string]any{"name": n})
	}
	return out
}

func unixOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return float64(t.UnixNano()) / 1e9
}

// apiTask is a task in Flower's shape: times as Unix seconds, the worker's
// name under "worker".
func apiTask(t Task) map[string]any {
	m := map[string]any{
		"uuid": t.ID, "name": t.Name, "state": t.State, "worker": t.Worker, "args": t.Args, "kwargs": t.Kwargs,
		"result": t.Result, "exception": t.Exception, "traceback": t.Traceback, "retries": t.Retries,
		"runtime": t.Runtime, "eta": t.ETA, "expires": t.Expires, "parent_id": t.ParentID, "root_id": t.RootID,
		"children": t.Children, "terminated": t.Terminated,
		"sent": unixOrNil(t.Sent), "received": unixOrNil(t.Received), "started": unixOrNil(t.Started),
		"succeeded": unixOrNil(t.Succeeded), "failed": unixOrNil(t.Failed), "timestamp": unixOrNil(t.Updated),
	}
	if t.Children == nil {
		m["children"] = []string{}
	}
	return m
}

// apiTasks is Flower's /api/tasks: newest first, by task id, filtered by
// taskname, state, workername, received_start and received_end (Unix
// seconds or the filters' forms), paged by offset and limit (at most
// maxAPITasks).
func (d *Dashboard) apiTasks(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := maxAPITasks
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			apiError(w, http.StatusBadRequest, "limit: want a positive number")
			return
		}
		limit = min(n, maxAPITasks)
	}
	offset := 0
	if s := q.Get("offset"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			apiError(w, http.StatusBadRequest, "offset: want a number from 0")
			return
		}
		offset = n
	}
	f := Filter{Name: q.Get("taskname"), State: q.Get("state"), Worker: q.Get("workername"), Search: clip(q.Get("search"), 256), Sort: q.Get("sort_by")}
	if !validSort(f.Sort) {
		apiError(w, http.StatusBadRequest, "sort_by: want one of "+strings.Join(SortKeys, ", ")+", each with an optional leading -")
		return
	}
	for key, dst := range map[string]*time.Time{"received_start": &f.Since, "received_end": &f.Until} {
		if s := q.Get(key); s != "" {
			t, err := apiTime(s)
			if err != nil {
				apiError(w, http.StatusBadRequest, key+": "+err.Error())
				return
			}
			*dst = t
		}
	}
	tasks, _ := d.store.Tasks(f, offset, limit)
	// Flower answers an object keyed by task id; the order of the keys is
	// not kept by JSON decoders, so each task says its own position too.
	out := make(map[string]any, len(tasks))
	for i, t := range tasks {
		m := apiTask(t)
		m["position"] = offset + i
		out[t.ID] = m
	}
	writeJSON(w, http.StatusOK, out)
}

// apiTime reads Unix seconds or the task filter's time forms.
func apiTime(s string) (time.Time, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if t := unixTime(f); !t.IsZero() {
			return t, nil
		}
		return time.Time{}, errors.New("out of range")
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04", "2006-01-02 15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.New("want Unix seconds or a time such as 2026-12-04 10:30 (UTC)")
}

func (d *Dashboard) apiTaskInfo(w http.ResponseWriter, r *http.Request) {
	t, ok := d.store.Task(r.PathValue("id"))
	if !ok {
		apiError(w, http.StatusNotFound, "unknown task: no event seen for it")
		return
	}
	writeJSON(w, http.StatusOK, apiTask(t))
}

// apiTaskResult is Flower's /api/task/result/<id>, from the result backend.
func (d *Dashboard) apiTaskResult(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if d.o.Backend == nil {
		apiError(w, http.StatusServiceUnavailable, "no result backend configured (--result-backend)")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	meta, err := d.o.Backend.Get(ctx, id)
	if err != nil {
		apiError(w, http.StatusBadGateway, "result backend: "+clip(err.Error(), 300))
		return
	}
	out := map[string]any{"task-id": id, "state": string(meta.Status), "result": nil}
	if meta.Status.Ready() {
		out["result"] = describe(meta, maxReprLen)
	}
	if meta.Traceback != "" {
		out["traceback"] = clip(meta.Traceback, maxTraceLen)
	}
	writeJSON(w, http.StatusOK, out)
}

// apiQueues is Flower's /api/queues/length.
func (d *Dashboard) apiQueues(w http.ResponseWriter, r *http.Request) {
	var list []map[string]any
	for _, s := range d.queues(r.Context()) {
		// messages_ready and messages_unacknowledged are the names of
		// RabbitMQ's management API, which Flower's answer passes on.
		q := map[string]any{"name": s.Name, "messages": s.Depth, "messages_ready": s.Depth}
		switch {
		case s.Err != "":
			q["messages"], q["messages_ready"], q["error"] = nil, nil, s.Err
		case s.Unacked >= 0:
			q["messages_unacknowledged"] = s.Unacked
			if s.UnackedAtLeast {
				q["messages_unacknowledged_at_least"] = true
			}
		}
		if s.Consumers >= 0 {
			q["consumers"] = s.Consumers
		}
		list = append(list, q)
	}
	if list == nil {
		list = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"active_queues": list})
}

// apiWrite guards a write: as action, but the CSRF token may be replaced by
// a JSON body (see the top of this file), and refusals are JSON.
func (d *Dashboard) apiWrite(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		isJSON := ct == "application/json"
		if !isJSON {
			if err := r.ParseForm(); err != nil {
				apiError(w, http.StatusBadRequest, "bad form")
				return
			}
		}
		switch {
		case d.o.ReadOnly:
			apiError(w, http.StatusForbidden, "the dashboard runs with --read-only: no actions")
			return
		case !d.authConfigured():
			apiError(w, http.StatusForbidden, "actions need credentials: start the dashboard with --auth-token or --basic-auth-file")
			return
		case !d.authenticated(r):
			apiError(w, http.StatusUnauthorized, "this action needs credentials")
			return
		case !sameOrigin(r):
			apiError(w, http.StatusForbidden, "a request from another origin")
			return
		case !isJSON && !d.checkCSRF(r):
			apiError(w, http.StatusForbidden, "send a JSON body (Content-Type: application/json) or the page's CSRF token")
			return
		}
		d.log.Info("dashboard API action", zap.String("path", r.URL.Path), zap.String("remote", r.RemoteAddr))
		h(w, r)
	}
}

// apiBody reads a write's parameters: the JSON body's fields, else the
// form's and the query's (Flower takes both).
func apiBody(r *http.Request) (map[string]any, error) {
	out := map[string]any{}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct == "application/json" {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, errors.New("the body is too large or unreadable")
		}
		if len(strings.TrimSpace(string(b))) > 0 {
			v, err := protocol.Unmarshal("application/json", b, protocol.DecodeOptions{})
			if err != nil {
				return nil, fmt.Errorf("the body is not a JSON object: %v", err)
			}
			m, ok := v.(map[string]any)
			if !ok {
				return nil, errors.New("the body is not a JSON object")
			}
			out = m
		}
	}
	for k, v := range r.URL.Query() {
		if _, ok := out[k]; !ok && len(v) > 0 {
			out[k] = v[0]
		}
	}
	for k, v := range r.PostForm {
		if _, ok := out[k]; !ok && len(v) > 0 && k != "csrf" {
			out[k] = v[0]
		}
	}
	return out, nil
}

// apiAsyncApply is Flower's /api/task/async-apply/<name>: args, kwargs and
// the options queue, countdown and eta (ISO 8601) from the JSON body.
func (d *Dashboard) apiAsyncApply(w http.ResponseWriter, r *http.Request) {
	if d.o.Client == nil {
		apiError(w, http.StatusServiceUnavailable, "this dashboard cannot send tasks")
		return
	}
	body, err := apiBody(r)
	if err != nil {
		apiError(w, http.StatusBadRequest, err.Error())
		return
	}
	name := r.PathValue("name")
	args, _ := body["args"].([]any)
	if body["args"] != nil && args == nil {
		apiError(w, http.StatusBadRequest, "args: want a JSON array")
		return
	}
	kwargs, _ := body["kwargs"].(map[string]any)
	if body["kwargs"] != nil && kwargs == nil {
		apiError(w, http.StatusBadRequest, "kwargs: want a JSON object")
		return
	}
	var opts []client.SendOption
	if q, _ := body["queue"].(string); q != "" {
		opts = append(opts, client.Queue(q))
	}
	if c, ok := num(body["countdown"]); ok && c > 0 {
		opts = append(opts, client.Countdown(time.Duration(c*float64(time.Second))))
	}
	if s, _ := body["eta"].(string); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			apiError(w, http.StatusBadRequest, "eta: want an ISO 8601 time with its zone")
			return
		}
		opts = append(opts, client.ETA(t))
	}
	res, err := d.o.Client.Send(r.Context(), name, args, kwargs, opts...)
	if err != nil {
		apiError(w, http.StatusBadGateway, "sending the task failed: "+clip(err.Error(), 300))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"task-id": res.ID, "state": "PENDING"})
}

// apiRevoke is Flower's /api/task/revoke/<id>?terminate=true&signal=SIGTERM.
func (d *Dashboard) apiRevoke(w http.ResponseWriter, r *http.Request) {
	body, err := apiBody(r)
	if err != nil {
		apiError(w, http.StatusBadRequest, err.Error())
		return
	}
	id := r.PathValue("id")
	args := map[string]any{"task_id": []any{id}}
	if t := fmt.Sprint(body["terminate"]); t == "true" || t == "1" {
		sig, _ := body["signal"].(string)
		if sig == "" {
			sig = "SIGTERM"
		}
		args["terminate"], args["signal"] = true, clip(sig, 16)
	}
	replies, err := d.o.Control.Call(r.Context(), "revoke", args, client.ControlOptions{Timeout: d.o.ControlTimeout})
	if err != nil {
		apiError(w, http.StatusBadGateway, "revoke: "+clip(err.Error(), 300))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"message": fmt.Sprintf("Revoked '%s'", id), "replies": len(replies)})
}

// apiRateLimit is Flower's /api/task/rate-limit/<name> with ratelimit and
// workername (all workers when absent).
func (d *Dashboard) apiRateLimit(w http.ResponseWriter, r *http.Request) {
	body, err := apiBody(r)
	if err != nil {
		apiError(w, http.StatusBadRequest, err.Error())
		return
	}
	rate := strings.TrimSpace(fmt.Sprint(body["ratelimit"]))
	if body["ratelimit"] == nil || rate == "" {
		apiError(w, http.StatusBadRequest, "ratelimit: want a rate (10/s, 5/m, 0 to disable)")
		return
	}
	o := client.ControlOptions{Timeout: d.o.ControlTimeout}
	if wn, _ := body["workername"].(string); wn != "" {
		o.Destination, o.Limit, o.Timeout = []string{wn}, 1, max(d.o.ControlTimeout, 5*time.Second)
	}
	replies, err := d.o.Control.Call(r.Context(), "rate_limit", map[string]any{"task_name": r.PathValue("name"), "rate_limit": rate}, o)
	if err != nil {
		apiError(w, http.StatusBadGateway, "rate_limit: "+clip(err.Error(), 300))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"message": replyText(replies, nil)})
}

// metrics is the dashboard's own state in Prometheus' text format: what
// it holds, and the queues and workers as it last saw them.
func (d *Dashboard) metrics(w http.ResponseWriter, r *http.Request) {
	var b strings.Builder
	st := d.store.Stats()
	fmt.Fprintf(&b, "# HELP celeriac_dashboard_events_total Celery events the dashboard has read.\n# TYPE celeriac_dashboard_events_total counter\nceleriac_dashboard_events_total %d\n", st.Events)
	fmt.Fprintf(&b, "# HELP celeriac_dashboard_tasks Tasks in the dashboard's history.\n# TYPE celeriac_dashboard_tasks gauge\nceleriac_dashboard_tasks %d\n", st.Tasks)
	byState := d.store.CountByState()
	states := make([]string, 0, len(byState))
	for s := range byState {
		states = append(states, s)
	}
	sort.Strings(states)
	b.WriteString("# HELP celeriac_dashboard_tasks_by_state Tasks in the history by state.\n# TYPE celeriac_dashboard_tasks_by_state gauge\n")
	for _, s := range states {
		fmt.Fprintf(&b, "celeriac_dashboard_tasks_by_state{state=\"%s\"} %d\n", promLabel(s), byState[s])
	}
	online, offline := 0, 0
	now := time.Now()
	for _, wk := range d.store.Workers() {
		if wk.Online(now) {
			online++
		} else {
			offline++
		}
	}
	fmt.Fprintf(&b, "# HELP celeriac_dashboard_workers Workers seen, by status.\n# TYPE celeriac_dashboard_workers gauge\nceleriac_dashboard_workers{status=\"online\"} %d\nceleriac_dashboard_workers{status=\"offline\"} %d\n", online, offline)
	down, _ := d.BrokerDown()
	up := 1
	if down != "" {
		up = 0
	}
	fmt.Fprintf(&b, "# HELP celeriac_dashboard_broker_up Whether the last queue sample reached the broker.\n# TYPE celeriac_dashboard_broker_up gauge\nceleriac_dashboard_broker_up %d\n", up)
	b.WriteString("# HELP celeriac_dashboard_queue_messages Ready messages per queue at the last sample.\n# TYPE celeriac_dashboard_queue_messages gauge\n")
	d.qmu.Lock()
	names := make([]string, 0, len(d.samples))
	for n := range d.samples {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if s := d.samples[n]; s.Err == "" {
			fmt.Fprintf(&b, "celeriac_dashboard_queue_messages{queue=\"%s\"} %d\n", promLabel(n), s.Depth)
		}
	}
	b.WriteString("# HELP celeriac_dashboard_queue_unacked Messages delivered and not yet acknowledged per queue at the last sample, where the broker counts them (a lower bound on Redis when the count reached its bound).\n# TYPE celeriac_dashboard_queue_unacked gauge\n")
	for _, n := range names {
		if s := d.samples[n]; s.Err == "" && s.Unacked >= 0 {
			fmt.Fprintf(&b, "celeriac_dashboard_queue_unacked{queue=\"%s\"} %d\n", promLabel(n), s.Unacked)
		}
	}
	d.qmu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = io.WriteString(w, b.String())
}

// promLabel escapes a label value as Prometheus' text format wants it.
func promLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}
