package worker

import (
	"context"
	"fmt"
	"os"
	"path"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// Remote control (kombu's pidbox): the worker answers Python's
// `celery inspect` / `celery control` and app.control.* calls.

const (
	pidboxExchange = "celery.pidbox"
	replyExchange  = "reply.celery.pidbox"
)

// controlRequest is a pidbox message body.
type controlRequest struct {
	method      string
	arguments   map[string]any
	destination []string
	pattern     string
	matcher     string
	ticket      string
	replyEx     string
	replyKey    string
}

func parseControl(body any) (controlRequest, bool) {
	m, ok := body.(map[string]any)
	if !ok {
		return controlRequest{}, false
	}
	var r controlRequest
	r.method, _ = m["method"].(string)
	r.arguments, _ = m["arguments"].(map[string]any)
	if r.arguments == nil {
		r.arguments = map[string]any{}
	}
	if d, ok := m["destination"].([]any); ok {
		for _, v := range d {
			if s, ok := v.(string); ok {
				r.destination = append(r.destination, s)
			}
		}
	}
	r.pattern, _ = m["pattern"].(string)
	r.matcher, _ = m["matcher"].(string)
	r.ticket, _ = m["ticket"].(string)
	if rt, ok := m["reply_to"].(map[string]any); ok {
		r.replyEx, _ = rt["exchange"].(string)
		r.replyKey, _ = rt["routing_key"].(string)
	}
	return r, r.method != ""
}

// forMe applies destination and pattern/matcher selection as kombu's
// Node.handle_message does: a non-empty destination list wins; a pattern
// counts only together with a matcher; otherwise every node handles the
// request.
func (r controlRequest) forMe(hostname string) bool {
	if len(r.destination) > 0 {
		return slices.Contains(r.destination, hostname)
	}
	if r.pattern != "" && r.matcher != "" {
		return matchNode(hostname, r.pattern, r.matcher)
	}
	return true
}

// matchNode is kombu.matcher.match for the two matchers kombu registers:
// "glob" (fnmatch.fnmatch) and "pcre" (re.match, anchored at the start).
// A pattern Go's regexp cannot compile, or an unknown matcher (kombu raises
// MatcherNotInstalled), selects nothing.
func matchNode(hostname, pattern, matcher string) bool {
	// The pattern comes off the wire: compiling a regular expression is
	// linear in it, but a megabyte of it per control message is CPU spent
	// for nobody. Node names are short, and so are kombu's patterns.
	if len(pattern) > maxNodePattern {
		return false
	}
	var expr string
	switch matcher {
	case "glob":
		expr = globRegexp(pattern)
	case "pcre":
		expr = `^(?:` + pattern + `)`
	default:
		return false
	}
	re, err := regexp.Compile(expr)
	return err == nil && re.MatchString(hostname)
}

// maxNodePattern bounds a remote-control destination pattern.
const maxNodePattern = 1024

// globRegexp translates a shell pattern as Python's fnmatch.translate does:
// * and ? match any character (a '/' too), [seq] and [!seq] are character
// sets, an unclosed [ is literal, and the whole name must match.
func globRegexp(pat string) string {
	var b strings.Builder
	b.WriteString(`^(?s:`)
	for i := 0; i < len(pat); {
		switch c := pat[i]; c {
		case '*':
			b.WriteString(`.*`)
			i++
		case '?':
			b.WriteString(`.`)
			i++
		case '[':
			j := i + 1
			if j < len(pat) && pat[j] == '!' {
				j++
			}
			if j < len(pat) && pat[j] == ']' {
				j++
			}
			for j < len(pat) && pat[j] != ']' {
				j++
			}
			if j >= len(pat) {
				b.WriteString(`\[`)
				i++
				continue
			}
			set := pat[i+1 : j]
			i = j + 1
			b.WriteByte('[')
			if rest, ok := strings.CutPrefix(set, "!"); ok {
				b.WriteByte('^')
				set = rest
			}
			for _, r := range set {
				if r == '\\' || r == '[' || r == ']' || r == '^' {
					b.WriteByte('\\')
				}
				b.WriteRune(r)
			}
			b.WriteByte(']')
		default:
			r, n := utf8.DecodeRuneInString(pat[i:])
			b.WriteString(regexp.QuoteMeta(string(r)))
			i += n
		}
	}
	b.WriteString(`)\z`)
	return b.String()
}

// control serves remote-control requests on the worker's pidbox queue.
type control struct {
	w   *Worker
	sub transport.Subscription
}

func (w *Worker) startControl(ctx context.Context) (*control, error) {
	sub, err := w.tr.Subscribe(ctx, transport.Broadcast{
		Exchange:     pidboxExchange,
		ExchangeType: transport.Fanout,
		Queue:        w.cfg.Hostname + ".celery.pidbox",
		// Celery's control_queue_ttl and control_queue_expires.
		QueueArguments: map[string]any{"x-message-ttl": int64(300000), "x-expires": int64(10000)},
	})
	if err != nil {
		return nil, err
	}
	c := &control{w: w, sub: sub}
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		for d := range sub.Deliveries() {
			c.handle(d)
		}
	}()
	return c, nil
}

func (c *control) close() { _ = c.sub.Close() }

func (c *control) handle(d *transport.Delivery) {
	w := c.w
	if v, ok := d.Message.Headers["clock"]; ok {
		if n, ok := publish.ToInt(v); ok {
			w.clock.Adjust(int64(n))
		}
	}
	body, err := protocol.Unmarshal(d.Message.ContentType, d.Message.Body, protocol.DecodeOptions{MaxDepth: 64, MaxBodySize: 1 << 20})
	if err != nil {
		w.log.Warn("undecodable remote-control message", zap.Error(err))
		return
	}
	req, ok := parseControl(body)
	if !ok || !req.forMe(w.cfg.Hostname) {
		return
	}
	w.log.Debug("remote control", zap.String("method", req.method), zap.Any("arguments", req.arguments))
	reply, send := c.dispatch(req)
	if !send || req.ticket == "" || req.replyKey == "" {
		return
	}
	c.reply(req, reply)
}

func (c *control) reply(req controlRequest, value any) {
	w := c.w
	data, err := protocol.Marshal(protocol.ContentTypeJSON, map[string]any{w.cfg.Hostname: value})
	if err != nil {
		data, _ = protocol.Marshal(protocol.ContentTypeJSON, map[string]any{w.cfg.Hostname: map[string]any{"error": err.Error()}})
	}
	ex := req.replyEx
	if ex == "" {
		ex = replyExchange
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = w.tr.Publish(ctx, &transport.Publishing{
		Exchange: ex, ExchangeType: transport.Direct, RoutingKey: req.replyKey, NoConfirm: true,
		Message: protocol.Message{
			ContentType: protocol.ContentTypeJSON, ContentEncoding: "utf-8",
			Headers:    map[string]any{"ticket": req.ticket, "clock": w.clock.Tick()},
			Properties: protocol.Properties{DeliveryMode: 1},
			Body:       data,
		},
	})
	if err != nil {
		w.log.Warn("remote-control reply failed", zap.String("method", req.method), zap.Error(err))
	}
}

func ok(v string) map[string]any  { return map[string]any{"ok": v} }
func nok(v string) map[string]any { return map[string]any{"error": v} }

// dispatch runs one command; send is false for commands without a reply.
func (c *control) dispatch(req controlRequest) (reply any, send bool) {
	w := c.w
	a := req.arguments
	switch req.method {
	case "ping":
		return ok("pong"), true
	case "registered", "dump_tasks":
		return w.registered(), true
	case "active", "dump_active":
		safe, _ := a["safe"].(bool)
		return w.activeInfo(safe), true
	case "reserved", "dump_reserved":
		return w.inLoop(func(l *loop) any { return l.reservedInfo() }), true
	case "scheduled", "dump_schedule":
		return w.inLoop(func(l *loop) any { return l.scheduledInfo() }), true
	case "revoked", "dump_revoked":
		ids := make([]any, 0)
		for id := range w.revoked.snapshot(time.Now()) {
			ids = append(ids, id)
		}
		return ids, true
	case "query_task":
		return w.queryTask(stringList(a["ids"])), true
	case "stats":
		return w.stats(), true
	case "active_queues":
		return w.activeQueues(), true
	case "clock":
		return map[string]any{"clock": w.clock.Value()}, true
	case "revoke":
		terminate, _ := a["terminate"].(bool)
		return w.revokeCommand(stringList(a["task_id"]), terminate), true
	case "terminate":
		return w.revokeCommand(stringList(a["task_id"]), true), true
	case "rate_limit":
		name, _ := a["task_name"].(string)
		return w.setRateLimit(name, a["rate_limit"]), true
	case "time_limit":
		name, _ := a["task_name"].(string)
		return w.setTimeLimit(name, a["hard"], a["soft"]), true
	case "enable_events":
		if w.events.taskEvents.Swap(true) {
			return ok("task events already enabled"), true
		}
		return ok("task events enabled"), true
	case "disable_events":
		if !w.events.taskEvents.Swap(false) {
			return ok("task events already disabled"), true
		}
		return ok("task events disabled"), true
	case "heartbeat":
		f := w.events.workerFields(5)
		w.events.send("worker-heartbeat", f)
		// Celery's handler returns None, which kombu sends back when the
		// request asks for a reply (celery control heartbeat does).
		return nil, true
	case "add_consumer":
		q, _ := a["queue"].(string)
		return w.addConsumer(q), true
	case "cancel_consumer":
		q, _ := a["queue"].(string)
		return w.cancelConsumer(q), true
	case "shutdown":
		w.log.Warn("remote shutdown requested")
		w.requestShutdown()
		return nil, false
	case "hello":
		from, _ := a["from_node"].(string)
		if from == w.cfg.Hostname {
			return nil, true
		}
		if rv, ok := a["revoked"].(map[string]any); ok {
			now := time.Now()
			for id := range rv {
				w.revoked.add(now, id)
			}
		}
		revoked := map[string]any{}
		for id, at := range w.revoked.snapshot(time.Now()) {
			revoked[id] = float64(at.UnixNano()) / 1e9
		}
		return map[string]any{"revoked": revoked, "clock": w.clock.Tick()}, true
	case "pool_grow", "pool_shrink":
		n := 1
		if v, ok := publish.ToInt(a["n"]); ok && v > 0 {
			n = v
		}
		if req.method == "pool_shrink" {
			n = -n
		}
		return w.resize(n), true
	case "conf":
		return map[string]any{}, true
	case "report":
		return ok(fmt.Sprintf("celeriac %s worker %s", Version, w.cfg.Hostname)), true
	case "autoscale":
		maxN, minN := 0, -1 // unchanged
		if v, ok := publish.ToInt(a["max"]); ok && v > 0 {
			maxN = v
		}
		if v, ok := publish.ToInt(a["min"]); ok && v >= 0 {
			minN = v
		}
		r, _ := w.inLoop(func(l *loop) any {
			mx, mn, on := l.updateAutoscale(maxN, minN)
			if !on {
				return nil
			}
			return [2]int{mx, mn}
		}).([2]int)
		if r == [2]int{} {
			return map[string]any{"error": "ValueError('Autoscale not enabled')"}, true
		}
		return ok(fmt.Sprintf("autoscale now max=%d min=%d", r[0], r[1])), true
	case "memsample", "memdump", "objgraph", "pool_restart", "election":
		return nok("not supported by celeriac"), true
	}
	return map[string]any{"error": fmt.Sprintf("KeyError(%s)", protocol.Repr(req.method))}, true
}

func stringList(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// registered lists task names as Celery's registered command does: sorted,
// with "[rate_limit=...]" for rate-limited tasks.
func (w *Worker) registered() []any {
	names := w.mux.Names()
	out := make([]any, 0, len(names))
	for _, n := range names {
		o, _ := w.mux.options(n)
		if o.RateLimit != "" {
			out = append(out, fmt.Sprintf("%s [rate_limit=%s]", n, o.RateLimit))
			continue
		}
		out = append(out, n)
	}
	return out
}

// requestInfo is Celery's Request.info().
func (w *Worker) requestInfo(m *protocol.TaskMessage, d *transport.Delivery, started time.Time, acked, safe bool) map[string]any {
	var args, kwargs any = m.Args, m.Kwargs
	if safe {
		args, kwargs = protocol.ReprArgs(m.Args), protocol.ReprKwargs(m.Kwargs)
	}
	var timeStart any
	if !started.IsZero() {
		timeStart = float64(started.UnixNano()) / 1e9
	}
	var pid any
	if !started.IsZero() {
		pid = int64(os.Getpid())
	}
	return map[string]any{
		"id":           m.ID,
		"name":         m.Name,
		"args":         args,
		"kwargs":       kwargs,
		"type":         m.Name,
		"hostname":     w.cfg.Hostname,
		"time_start":   timeStart,
		"acknowledged": acked,
		"delivery_info": map[string]any{
			"exchange":    d.Exchange,
			"routing_key": d.RoutingKey,
			"priority":    int64(m.Priority),
			"redelivered": d.Redelivered,
		},
		"worker_pid": pid,
	}
}

func (w *Worker) activeInfo(safe bool) []any {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]any, 0, len(w.active))
	for a := range w.active {
		out = append(out, w.requestInfo(a.task.Message, a.delivery, a.started, a.acked, safe))
	}
	return out
}

func (l *loop) reservedInfo() any {
	out := make([]any, 0)
	for _, q := range l.ready.qs {
		for _, p := range q {
			out = append(out, l.w.requestInfo(p.m, p.d, time.Time{}, false, false))
		}
	}
	for _, p := range l.held {
		if !p.eta {
			out = append(out, l.w.requestInfo(p.m, p.d, time.Time{}, false, false))
		}
	}
	return out
}

func (l *loop) scheduledInfo() any {
	out := make([]any, 0)
	for _, p := range l.held {
		if p.eta {
			out = append(out, map[string]any{
				"eta":      protocol.FormatTime(p.m.ETA),
				"priority": int64(6),
				"request":  l.w.requestInfo(p.m, p.d, time.Time{}, false, false),
			})
		}
	}
	return out
}

func (w *Worker) queryTask(ids []string) map[string]any {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	out := map[string]any{}
	w.mu.Lock()
	for a := range w.active {
		if id := a.task.ID; want[id] {
			out[id] = []any{"active", w.requestInfo(a.task.Message, a.delivery, a.started, a.acked, false)}
		}
	}
	w.mu.Unlock()
	w.inLoop(func(l *loop) any {
		each := func(p *pending) {
			if want[p.m.ID] {
				out[p.m.ID] = []any{"reserved", w.requestInfo(p.m, p.d, time.Time{}, false, false)}
			}
		}
		for _, q := range l.ready.qs {
			for _, p := range q {
				each(p)
			}
		}
		for _, p := range l.held {
			each(p)
		}
		return nil
	})
	return out
}

// stats is Celery's stats reply, with the fields monitors read.
func (w *Worker) stats() map[string]any {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	total := map[string]any{}
	w.mu.Lock()
	for name, n := range w.totals {
		total[name] = n
	}
	w.mu.Unlock()
	conc := w.concurrency()
	prefetch := w.inLoop(func(l *loop) any { return int64(l.prefetchSet) })
	st := map[string]any{
		"total":  total,
		"pid":    int64(os.Getpid()),
		"clock":  fmt.Sprint(w.clock.Value()),
		"uptime": int64(time.Since(w.startedAt).Seconds()),
		"pool": map[string]any{
			"implementation":           "celeriac:goroutines",
			"max-concurrency":          int64(conc),
			"processes":                []any{int64(os.Getpid())},
			"max-tasks-per-child":      nil,
			"put-guarded-by-semaphore": false,
			"timeouts":                 []any{w.cfg.SoftTimeLimit.Seconds(), w.cfg.TimeLimit.Seconds()},
		},
		"broker":         map[string]any{"transport": transportName(w.tr)},
		"prefetch_count": prefetch,
		"rusage": map[string]any{
			"utime":    float64(ru.Utime.Sec) + float64(ru.Utime.Usec)/1e6,
			"stime":    float64(ru.Stime.Sec) + float64(ru.Stime.Usec)/1e6,
			"maxrss":   ru.Maxrss,
			"minflt":   ru.Minflt,
			"majflt":   ru.Majflt,
			"nvcsw":    ru.Nvcsw,
			"nivcsw":   ru.Nivcsw,
			"inblock":  ru.Inblock,
			"oublock":  ru.Oublock,
			"ixrss":    ru.Ixrss,
			"idrss":    ru.Idrss,
			"isrss":    ru.Isrss,
			"nswap":    ru.Nswap,
			"msgsnd":   ru.Msgsnd,
			"msgrcv":   ru.Msgrcv,
			"nsignals": ru.Nsignals,
		},
		"sw_ident": "celeriac",
		"sw_ver":   Version,
	}
	if as, _ := w.inLoop(func(l *loop) any { return l.autoscaleInfo() }).(map[string]any); as != nil {
		st["autoscaler"] = as
	}
	return st
}

// transportName names a transport as kombu's stats do ("redis", "amqp"):
// the last element of its package path ("memory" for transport/memory).
func transportName(tr transport.Transport) string {
	t := reflect.TypeOf(tr)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.PkgPath() == "" {
		return fmt.Sprintf("%T", tr)
	}
	return path.Base(t.PkgPath())
}

// activeQueues lists consumed queues as kombu's Queue.as_dict.
func (w *Worker) activeQueues() []any {
	qs, _ := w.inLoop(func(l *loop) any { return l.cons.Queues() }).([]transport.Queue)
	out := make([]any, 0, len(qs))
	for _, q := range qs {
		ex := q.Exchange
		if ex == "" {
			ex = q.Name
		}
		typ := q.ExchangeType
		if typ == "" {
			typ = transport.Direct
		}
		rk := q.RoutingKey
		if rk == "" {
			rk = q.Name
		}
		var args any
		if len(q.Arguments) > 0 {
			args = q.Arguments
		}
		out = append(out, map[string]any{
			"name": q.Name,
			"exchange": map[string]any{"name": ex, "type": typ, "arguments": nil, "durable": true,
				"passive": false, "auto_delete": false, "delivery_mode": nil, "no_declare": false},
			"routing_key": rk, "queue_arguments": args, "binding_arguments": nil, "consumer_arguments": nil,
			"durable": true, "exclusive": false, "auto_delete": false, "no_ack": false, "alias": nil,
			"bindings": []any{}, "no_declare": nil, "expires": nil, "message_ttl": nil,
			"max_length": nil, "max_length_bytes": nil, "max_priority": nil,
		})
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].(map[string]any)["name"].(string) < out[j].(map[string]any)["name"].(string)
	})
	return out
}

// revokeCommand flags ids as revoked; tasks this worker holds (ETA or
// ready) are dropped at once with REVOKED stored; with terminate, running
// ones have their context cancelled (cause ErrRevoked).
func (w *Worker) revokeCommand(ids []string, terminate bool) map[string]any {
	now := time.Now()
	w.revoked.add(now, ids...)
	w.inLoop(func(l *loop) any {
		l.dropRevoked()
		return nil
	})
	if terminate {
		var terminated []string
		want := make(map[string]bool, len(ids))
		for _, id := range ids {
			want[id] = true
		}
		found := make(map[string]bool, len(ids))
		w.mu.Lock()
		// Every run of a revoked id ends: a redelivered copy running beside
		// the first is the same task.
		for a := range w.active {
			if id := a.task.ID; want[id] {
				a.terminated.Store(true)
				a.cancel(ErrRevoked)
				found[id] = true
			}
		}
		w.mu.Unlock()
		for _, id := range ids {
			if found[id] && !slices.Contains(terminated, id) {
				terminated = append(terminated, id)
			}
		}
		if len(terminated) == 0 {
			return ok("terminate: tasks unknown")
		}
		return ok("terminate: " + strings.Join(terminated, ", "))
	}
	w.log.Info("tasks flagged as revoked", zap.Strings("task_ids", ids))
	return ok("tasks " + strings.Join(ids, ", ") + " flagged as revoked")
}

func (w *Worker) setRateLimit(name string, v any) map[string]any {
	limit := ""
	switch v := v.(type) {
	case string:
		limit = v
	case nil:
	default:
		limit = protocol.Repr(v)
	}
	if _, err := ParseRate(limit); err != nil {
		return nok(fmt.Sprintf("Invalid rate limit string: %v", err))
	}
	found, err := w.mux.setOptions(name, func(o *TaskOptions) { o.RateLimit = limit })
	if !found {
		return nok("unknown task")
	}
	if err != nil {
		return nok(err.Error())
	}
	// The reply follows Celery's `if not rate_limit`: only a false value
	// (None, "", 0) says disabled. "0" from `celery control rate_limit`
	// is a non-empty string there, so it says set, though both disable.
	if falsy(v) {
		return ok("rate limit disabled successfully")
	}
	return ok("new rate limit set successfully")
}

// falsy is Python truthiness for decoded JSON/msgpack scalars.
func falsy(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case string:
		return v == ""
	case bool:
		return !v
	case int64:
		return v == 0
	case float64:
		return v == 0
	}
	return false
}

func (w *Worker) setTimeLimit(name string, hard, soft any) map[string]any {
	h, _ := publish.ToFloat(hard)
	s, _ := publish.ToFloat(soft)
	found, _ := w.mux.setOptions(name, func(o *TaskOptions) {
		o.TimeLimit, o.SoftTimeLimit = publish.Seconds(h), publish.Seconds(s)
	})
	if !found {
		return nok("unknown task")
	}
	return ok("time limits set successfully")
}

func (w *Worker) addConsumer(queue string) map[string]any {
	if queue == "" {
		return nok("missing queue")
	}
	r := w.inLoop(func(l *loop) any { return l.addQueue(queue) })
	if err, _ := r.(error); err != nil {
		return nok(err.Error())
	}
	return ok("add consumer " + queue)
}

func (w *Worker) cancelConsumer(queue string) map[string]any {
	r := w.inLoop(func(l *loop) any { return l.cancelQueue(queue) })
	if err, _ := r.(error); err != nil {
		return nok(err.Error())
	}
	return ok("no longer consuming from " + queue)
}

func (w *Worker) resize(delta int) map[string]any {
	w.inLoop(func(l *loop) any {
		l.concurrency = max(1, l.concurrency+delta)
		return nil
	})
	if delta > 0 {
		return ok("pool will grow")
	}
	return ok("pool will shrink")
}
