package dashboard

import (
	"cmp"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

// Task states as Celery's events name them (celery.states).
const (
	StatePending  = "PENDING"
	StateReceived = "RECEIVED"
	StateStarted  = "STARTED"
	StateSuccess  = "SUCCESS"
	StateFailure  = "FAILURE"
	StateRetry    = "RETRY"
	StateRevoked  = "REVOKED"
	StateRejected = "REJECTED"
)

// States lists the states the tasks page filters by.
var States = []string{StatePending, StateReceived, StateStarted, StateRetry, StateSuccess, StateFailure, StateRevoked, StateRejected}

// eventStates maps task event types to the state they put the task in.
var eventStates = map[string]string{
	"task-sent": StatePending, "task-received": StateReceived, "task-started": StateStarted,
	"task-succeeded": StateSuccess, "task-failed": StateFailure, "task-retried": StateRetry,
	"task-revoked": StateRevoked, "task-rejected": StateRejected,
}

// ready reports whether a state is final: an event that arrives late (task
// events come batched, and from several workers) never moves a task out of
// it, as celery.events.state orders states by precedence.
func ready(s string) bool {
	return s == StateSuccess || s == StateFailure || s == StateRevoked || s == StateRejected
}

// Bounds on what one task keeps: task arguments and tracebacks are user data
// of any size, and history must stay bounded in bytes as well as in count.
const (
	maxReprLen     = 4 << 10
	maxTraceLen    = 16 << 10
	maxChildren    = 64
	maxHostLen     = 256       // a worker's hostname
	maxDocLen      = 256 << 10 // a dead letter shown decoded
	maxSamples     = 64        // runtime samples per task name and bucket
	bucketWidth    = time.Minute
	bucketsPerName = 60
)

// Task is what the dashboard knows about one task, from its events.
type Task struct {
	ID        string   `json:"id"`
	Name      string   `json:"name,omitempty"`
	State     string   `json:"state"`
	Worker    string   `json:"worker,omitempty"`
	Args      string   `json:"args,omitempty"`
	Kwargs    string   `json:"kwargs,omitempty"`
	Result    string   `json:"result,omitempty"`
	Exception string   `json:"exception,omitempty"`
	Traceback string   `json:"traceback,omitempty"`
	Retries   int64    `json:"retries,omitempty"`
	Runtime   float64  `json:"runtime,omitempty"` // seconds; 0 unknown
	ETA       string   `json:"eta,omitempty"`
	Expires   string   `json:"expires,omitempty"`
	ParentID  string   `json:"parent_id,omitempty"`
	RootID    string   `json:"root_id,omitempty"`
	Children  []string `json:"children,omitempty"`
	// Terminated: revoked with terminate=True (task-revoked's terminated).
	Terminated bool `json:"terminated,omitempty"`
	// Times from the events' timestamps (the workers' clocks).
	Sent      time.Time `json:"sent,omitzero"`
	Received  time.Time `json:"received,omitzero"`
	Started   time.Time `json:"started,omitzero"`
	Succeeded time.Time `json:"succeeded,omitzero"`
	Failed    time.Time `json:"failed,omitzero"`
	// Ended is the timestamp of the event that put the task in its final
	// state: later events of the same run do not move it, newer ones do.
	Ended   time.Time `json:"ended,omitzero"`
	Updated time.Time `json:"updated"`
}

// Worker is one worker, Python or Go, from its events and its replies to
// stats and active_queues.
type Worker struct {
	Hostname  string    `json:"hostname"`
	SWIdent   string    `json:"sw_ident,omitempty"`
	SWVer     string    `json:"sw_ver,omitempty"`
	SWSys     string    `json:"sw_sys,omitempty"`
	Freq      float64   `json:"freq,omitempty"`
	Active    int64     `json:"active"`
	Processed int64     `json:"processed"`
	Loadavg   []float64 `json:"loadavg,omitempty"`
	// LastHeartbeat is the timestamp of its last worker event; Offline is
	// set by worker-offline and cleared by any later worker event.
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"`
	Offline       bool      `json:"offline,omitempty"`
	// From remote control: pool implementation, concurrency, queues.
	Pool        string    `json:"pool,omitempty"`
	Concurrency int64     `json:"concurrency,omitempty"`
	Queues      []string  `json:"queues,omitempty"`
	LastReply   time.Time `json:"last_reply,omitzero"`
}

// Online reports whether the worker counts as alive at now: a heartbeat
// within two intervals, as celery.events.state's heartbeat_expires
// (HEARTBEAT_EXPIRE_WINDOW 200%).
func (w *Worker) Online(now time.Time) bool {
	if w.Offline || w.LastHeartbeat.IsZero() {
		return !w.Offline && !w.LastReply.IsZero() && now.Sub(w.LastReply) < time.Minute
	}
	freq := w.Freq
	if freq <= 0 {
		freq = 2
	}
	return now.Sub(w.LastHeartbeat) < time.Duration(2*freq*float64(time.Second))
}

// bucket is one minute of one task name's completions.
type bucket struct {
	start     int64 // unix minute
	succeeded int
	failed    int
	seen      int       // runtimes offered (reservoir sampling)
	runtimes  []float32 // a uniform sample of at most maxSamples
}

// nameStats are a task name's buckets, a ring of bucketsPerName.
type nameStats struct {
	buckets [bucketsPerName]bucket
}

// Store holds the dashboard's bounded history: the newest maxTasks tasks,
// at most maxWorkers workers and the per-name statistics of maxNames task
// names. It is safe for concurrent use.
type Store struct {
	mu         sync.RWMutex
	maxTasks   int
	maxWorkers int
	maxNames   int
	tasks      map[string]*Task
	// order holds task ids oldest first as a ring: head is the oldest.
	order   []string
	head    int
	workers map[string]*Worker
	names   map[string]*nameStats
	// all are every task's completions and runtimes, and waits the queue
	// waits (received to started), by minute.
	all, waits nameStats
	version    uint64
	changed    chan struct{} // closed and replaced on every change
	events     uint64        // events applied, for the status line
	now        func() time.Time
}

// NewStore returns a store keeping at most maxTasks tasks.
func NewStore(maxTasks int) *Store {
	if maxTasks <= 0 {
		maxTasks = 10000
	}
	return &Store{
		maxTasks: maxTasks, maxWorkers: 1000, maxNames: 1000,
		tasks:   make(map[string]*Task),
		workers: make(map[string]*Worker),
		names:   make(map[string]*nameStats),
		changed: make(chan struct{}),
		now:     time.Now,
	}
}

// Changed returns a channel closed at the next change, and the version it
// was taken at.
func (s *Store) Changed() (<-chan struct{}, uint64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.changed, s.version
}

// bump records a change; mu is held.
func (s *Store) bump() {
	s.version++
	close(s.changed)
	s.changed = make(chan struct{})
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut at a rune boundary so that what is shown stays valid UTF-8.
	cut := n
	for cut > 0 && cut > n-4 && (s[cut]&0xC0) == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}

func str(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case nil:
		return ""
	}
	// Written with the bounded writer: every caller clips to at most
	// maxTraceLen, and a field of an event can be large.
	b, truncated, err := protocol.AppendJSONLimit(nil, v, protocol.JSONOptions{}, maxTraceLen)
	if err != nil {
		return ""
	}
	if truncated {
		b = append(b, "…"...)
	}
	return string(b)
}

func num(v any) (float64, bool) {
	switch v := v.(type) {
	case float64:
		return v, !math.IsNaN(v) && !math.IsInf(v, 0)
	case int64:
		return float64(v), true
	case int:
		return float64(v), true
	case uint64:
		return float64(v), true
	}
	return 0, false
}

func unixTime(f float64) time.Time {
	if f <= 0 || f > 1e11 {
		return time.Time{}
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC()
}

// Apply merges one Celery event (a decoded JSON object) into the store.
// Events it does not know are counted and otherwise ignored; malformed
// fields are ignored one by one, never fatal.
func (s *Store) Apply(ev map[string]any) {
	typ, _ := ev["type"].(string)
	ts := s.now().UTC()
	if f, ok := num(ev["timestamp"]); ok {
		if t := unixTime(f); !t.IsZero() {
			ts = t
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events++
	switch {
	case strings.HasPrefix(typ, "worker-"):
		s.applyWorker(typ, ev, ts)
	case strings.HasPrefix(typ, "task-"):
		s.applyTask(typ, ev, ts)
	default:
		return
	}
	s.bump()
}

func (s *Store) worker(host string) *Worker {
	w := s.workers[host]
	if w == nil {
		if len(s.workers) >= s.maxWorkers {
			s.evictWorker()
		}
		w = &Worker{Hostname: host}
		s.workers[host] = w
	}
	return w
}

// evictWorker drops the worker heard from longest ago.
func (s *Store) evictWorker() {
	var oldest *Worker
	for _, w := range s.workers {
		if oldest == nil || w.LastHeartbeat.Before(oldest.LastHeartbeat) {
			oldest = w
		}
	}
	if oldest != nil {
		delete(s.workers, oldest.Hostname)
	}
}

func (s *Store) applyWorker(typ string, ev map[string]any, ts time.Time) {
	host, _ := ev["hostname"].(string)
	if host == "" {
		return
	}
	host = clip(host, maxHostLen)
	w := s.worker(host)
	if v := str(ev["sw_ident"]); v != "" {
		w.SWIdent = clip(v, 64)
	}
	if v := str(ev["sw_ver"]); v != "" {
		w.SWVer = clip(v, 64)
	}
	if v := str(ev["sw_sys"]); v != "" {
		w.SWSys = clip(v, 64)
	}
	if f, ok := num(ev["freq"]); ok && f > 0 {
		w.Freq = f
	}
	if f, ok := num(ev["active"]); ok {
		w.Active = int64(f)
	}
	if f, ok := num(ev["processed"]); ok {
		w.Processed = int64(f)
	}
	if la, ok := ev["loadavg"].([]any); ok {
		w.Loadavg = w.Loadavg[:0]
		for _, v := range la[:min(len(la), 3)] {
			f, _ := num(v)
			w.Loadavg = append(w.Loadavg, f)
		}
	}
	if ts.After(w.LastHeartbeat) {
		w.LastHeartbeat = ts
	}
	w.Offline = typ == "worker-offline"
}

// task returns the task with id, adding it (and evicting the oldest task
// when full).
func (s *Store) task(id string) *Task {
	t := s.tasks[id]
	if t != nil {
		return t
	}
	t = &Task{ID: id, State: StatePending}
	if len(s.order) < s.maxTasks {
		s.order = append(s.order, id)
	} else {
		delete(s.tasks, s.order[s.head])
		s.order[s.head] = id
		s.head = (s.head + 1) % len(s.order)
	}
	s.tasks[id] = t
	return t
}

func (s *Store) applyTask(typ string, ev map[string]any, ts time.Time) {
	id, _ := ev["uuid"].(string)
	if id == "" {
		return
	}
	id = clip(id, 128)
	t := s.task(id)
	if ts.After(t.Updated) {
		t.Updated = ts
	}
	if st, ok := eventStates[typ]; ok && (!ready(t.State) || typ != "task-sent" && !t.Ended.IsZero() && ts.After(t.Ended)) {
		// A final state holds against late events of the run that ended
		// it; a worker's event stamped after that end is a new run (a
		// replayed dead letter, a redelivery) and moves the task again.
		t.State = st
		if ready(st) {
			t.Ended = ts
		}
	}
	if v := str(ev["name"]); v != "" {
		t.Name = clip(v, 256)
	}
	if v := str(ev["hostname"]); v != "" && typ != "task-sent" {
		t.Worker = clip(v, 256)
	}
	if _, ok := ev["args"]; ok {
		t.Args = clip(str(ev["args"]), maxReprLen)
	}
	if _, ok := ev["kwargs"]; ok {
		t.Kwargs = clip(str(ev["kwargs"]), maxReprLen)
	}
	if f, ok := num(ev["retries"]); ok {
		t.Retries = int64(f)
	}
	if v := str(ev["eta"]); v != "" {
		t.ETA = clip(v, 64)
	}
	if v := str(ev["expires"]); v != "" {
		t.Expires = clip(v, 64)
	}
	// A retry is sent by the task itself: its parent_id is its own id, and
	// a root task's root_id is its own too; neither is a relation.
	if v := str(ev["parent_id"]); v != "" && t.ParentID == "" && v != id {
		t.ParentID = clip(v, 128)
		if p := s.tasks[t.ParentID]; p != nil && len(p.Children) < maxChildren && !slices.Contains(p.Children, id) {
			p.Children = append(p.Children, id)
		}
	}
	if v := str(ev["root_id"]); v != "" && v != id {
		t.RootID = clip(v, 128)
	}
	switch typ {
	case "task-sent":
		t.Sent = ts
	case "task-received":
		t.Received = ts
	case "task-started":
		t.Started = ts
	case "task-succeeded":
		t.Succeeded = ts
		t.Result = clip(str(ev["result"]), maxReprLen)
		// What an earlier try or run raised is history, not this outcome.
		t.Exception, t.Traceback = "", ""
	case "task-failed", "task-retried":
		if typ == "task-failed" {
			t.Failed = ts
			t.Result = ""
		}
		t.Exception = clip(str(ev["exception"]), maxReprLen)
		t.Traceback = clip(str(ev["traceback"]), maxTraceLen)
	case "task-revoked":
		t.Terminated, _ = ev["terminated"].(bool)
	}
	if f, ok := num(ev["runtime"]); ok && f >= 0 {
		t.Runtime = f
	}
	if (typ == "task-succeeded" || typ == "task-failed") && t.Name != "" {
		s.record(t.Name, ts, typ == "task-succeeded", t.Runtime)
	}
	if typ == "task-started" && !t.Received.IsZero() && !ts.Before(t.Received) {
		// The same worker stamps both: its clock, not the producer's.
		s.waits.add(ts, true, ts.Sub(t.Received).Seconds())
	}
}

// add counts a completion (or a wait) and samples its duration.
func (ns *nameStats) add(ts time.Time, ok bool, secs float64) {
	minute := ts.Unix() / int64(bucketWidth/time.Second)
	b := &ns.buckets[int(minute%bucketsPerName)]
	if b.start != minute {
		*b = bucket{start: minute, runtimes: b.runtimes[:0]}
	}
	if ok {
		b.succeeded++
	} else {
		b.failed++
	}
	if secs <= 0 {
		return
	}
	b.seen++
	r := float32(secs)
	if len(b.runtimes) < maxSamples {
		b.runtimes = append(b.runtimes, r)
	} else if j := rand.IntN(b.seen); j < maxSamples {
		b.runtimes[j] = r
	}
}

// series returns the last bucketsPerName minutes, oldest first.
func (ns *nameStats) series(now time.Time) []Point {
	cur := now.Unix() / int64(bucketWidth/time.Second)
	out := make([]Point, 0, bucketsPerName)
	for m := cur - bucketsPerName + 1; m <= cur; m++ {
		p := Point{Time: time.Unix(m*int64(bucketWidth/time.Second), 0).UTC()}
		if ns != nil {
			if b := &ns.buckets[int(m%bucketsPerName)]; b.start == m {
				p.Succeeded, p.Failed, p.Samples = b.succeeded, b.failed, len(b.runtimes)
				p.P50, p.P95 = percentiles(b.runtimes)
			}
		}
		out = append(out, p)
	}
	return out
}

// SeriesAll returns every task's completions and runtimes by minute, and
// the queue waits (received to started; P50/P95 of each point, counts in
// Succeeded), oldest first.
func (s *Store) SeriesAll(now time.Time) (all, waits []Point) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.all.series(now), s.waits.series(now)
}

// record counts a completion in the name's minute bucket and in every
// task's.
func (s *Store) record(name string, ts time.Time, ok bool, runtime float64) {
	s.all.add(ts, ok, runtime)
	ns := s.names[name]
	if ns == nil {
		if len(s.names) >= s.maxNames {
			return
		}
		ns = &nameStats{}
		s.names[name] = ns
	}
	ns.add(ts, ok, runtime)
}

// Point is one minute of a task name's statistics.
type Point struct {
	Time      time.Time
	Succeeded int
	Failed    int
	P50, P95  float64 // seconds; 0 with no samples
	Samples   int
}

// Series returns the last bucketsPerName minutes of a name, oldest first.
func (s *Store) Series(name string, now time.Time) []Point {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.names[name].series(now)
}

func percentiles(rs []float32) (p50, p95 float64) {
	if len(rs) == 0 {
		return 0, 0
	}
	c := slices.Clone(rs)
	slices.Sort(c)
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(c)))) - 1
		return float64(c[max(0, min(i, len(c)-1))])
	}
	return at(0.50), at(0.95)
}

// Names returns the task names with statistics, sorted.
func (s *Store) Names() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.names))
	for n := range s.names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// UpdateWorkerInfo merges a remote-control reply into a worker.
func (s *Store) UpdateWorkerInfo(host string, f func(w *Worker)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.worker(host)
	f(w)
	w.LastReply = s.now()
	s.bump()
}

// Workers returns copies of the workers, sorted by hostname.
func (s *Store) Workers() []Worker {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Worker, 0, len(s.workers))
	for _, w := range s.workers {
		c := *w
		c.Queues = slices.Clone(w.Queues)
		c.Loadavg = slices.Clone(w.Loadavg)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Hostname < out[j].Hostname })
	return out
}

// Task returns a copy of a task.
func (s *Store) Task(id string) (Task, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	t := s.tasks[id]
	if t == nil {
		return Task{}, false
	}
	c := *t
	c.Children = slices.Clone(t.Children)
	return c, true
}

// retrying reports whether a task is between tries: a retry's new message
// is received at once (and waits for its countdown), which moves the task
// out of RETRY, as in celery.events.state; the RETRY filter still finds it.
func (t *Task) retrying() bool {
	return t.State == StateRetry || t.Retries > 0 && !ready(t.State)
}

// Filter selects tasks; zero fields select all.
type Filter struct {
	Name, State, Worker string
	Since, Until        time.Time
	// Search is a substring of the task's id, args, kwargs, result or
	// exception (Flower's search box).
	Search string
	// Sort orders the tasks by one of SortKeys, descending with a leading
	// "-"; ties, and "", keep newest (first seen) first.
	Sort string
}

// SortKeys are the orders of Filter.Sort: the tasks table's columns that
// have one.
var SortKeys = []string{"name", "state", "worker", "received", "eta", "runtime"}

// validSort reports whether s is a Filter.Sort.
func validSort(s string) bool {
	return s == "" || slices.Contains(SortKeys, strings.TrimPrefix(s, "-"))
}

// sortCompare compares two tasks by key (ascending).
func sortCompare(key string, a, b *Task) int {
	switch key {
	case "name":
		return strings.Compare(a.Name, b.Name)
	case "state":
		return strings.Compare(a.State, b.State)
	case "worker":
		return strings.Compare(a.Worker, b.Worker)
	case "received":
		return a.Received.Compare(b.Received)
	case "eta":
		return strings.Compare(a.ETA, b.ETA)
	case "runtime":
		return cmp.Compare(a.Runtime, b.Runtime)
	}
	return 0
}

func (f Filter) match(t *Task) bool {
	if f.Name != "" && !strings.Contains(t.Name, f.Name) {
		return false
	}
	if f.State != "" && t.State != f.State && !(f.State == StateRetry && t.retrying()) {
		return false
	}
	if f.Worker != "" && !strings.Contains(t.Worker, f.Worker) {
		return false
	}
	if f.Search != "" && !strings.Contains(t.ID, f.Search) && !strings.Contains(t.Args, f.Search) &&
		!strings.Contains(t.Kwargs, f.Search) && !strings.Contains(t.Result, f.Search) && !strings.Contains(t.Exception, f.Search) {
		return false
	}
	if !f.Since.IsZero() && t.Updated.Before(f.Since) {
		return false
	}
	if !f.Until.IsZero() && t.Updated.After(f.Until) {
		return false
	}
	return true
}

// Tasks returns the matching tasks newest first (by first sight), skipping
// offset and returning at most limit, and how many matched in all.
func (s *Store) Tasks(f Filter, offset, limit int) ([]Task, int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if f.Sort != "" && validSort(f.Sort) {
		return s.sortedTasks(f, offset, limit)
	}
	var out []Task
	total := 0
	n := len(s.order)
	for i := n - 1; i >= 0; i-- {
		t := s.tasks[s.order[(s.head+i)%n]]
		if t == nil || !f.match(t) {
			continue
		}
		if total >= offset && len(out) < limit {
			c := *t
			c.Children = slices.Clone(t.Children)
			out = append(out, c)
		}
		total++
	}
	return out, total
}

// sortedTasks is Tasks in f.Sort's order: every match is held (as a
// pointer, at most the store's size) and sorted, then the page copied.
// Called with s.mu held.
func (s *Store) sortedTasks(f Filter, offset, limit int) ([]Task, int) {
	key, desc := strings.CutPrefix(f.Sort, "-")
	var match []*Task
	n := len(s.order)
	for i := n - 1; i >= 0; i-- {
		if t := s.tasks[s.order[(s.head+i)%n]]; t != nil && f.match(t) {
			match = append(match, t)
		}
	}
	// Stable: equal keys stay newest first.
	slices.SortStableFunc(match, func(a, b *Task) int {
		c := sortCompare(key, a, b)
		if desc {
			c = -c
		}
		return c
	})
	var out []Task
	for i := offset; i >= 0 && i < len(match) && len(out) < limit; i++ {
		c := *match[i]
		c.Children = slices.Clone(match[i].Children)
		out = append(out, c)
	}
	return out, len(match)
}

// WorkflowNode is a task of a workflow, at its depth under the root.
type WorkflowNode struct {
	Task
	Depth int
}

// Indent is the depth as the page indents it (at most 8 steps).
func (n WorkflowNode) Indent() int { return min(n.Depth, 8) }

// Workflow returns the tasks of root's workflow that the history holds:
// root, then every task whose root_id is root, each under its parent
// (depth first, in the order the parent saw them), at most limit. A task
// whose parent is not held comes after, at depth 1.
func (s *Store) Workflow(root string, limit int) []WorkflowNode {
	s.mu.RLock()
	defer s.mu.RUnlock()
	kids := map[string][]*Task{}
	var members []*Task
	for _, t := range s.tasks {
		if t.RootID == root && t.ID != root {
			members = append(members, t)
		}
	}
	sort.Slice(members, func(i, j int) bool {
		a, b := members[i], members[j]
		if !a.Received.Equal(b.Received) {
			return a.Received.Before(b.Received)
		}
		return a.ID < b.ID
	})
	for _, t := range members {
		parent := t.ParentID
		if parent == "" || (s.tasks[parent] == nil && parent != root) {
			parent = root
		}
		kids[parent] = append(kids[parent], t)
	}
	var out []WorkflowNode
	seen := map[string]bool{}
	var walk func(t *Task, depth int)
	walk = func(t *Task, depth int) {
		if len(out) >= limit || seen[t.ID] {
			return
		}
		seen[t.ID] = true
		c := *t
		c.Children = nil
		out = append(out, WorkflowNode{Task: c, Depth: depth})
		for _, k := range kids[t.ID] {
			walk(k, depth+1)
		}
	}
	if rt := s.tasks[root]; rt != nil {
		walk(rt, 0)
	} else {
		for _, k := range kids[root] {
			walk(k, 1)
		}
	}
	return out
}

// Stats are counts for the status line.
type Stats struct {
	Tasks, Workers int
	Events         uint64
	Version        uint64
}

// CountByState counts the tasks in the history by state.
func (s *Store) CountByState() map[string]int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := map[string]int{}
	for _, t := range s.tasks {
		out[t.State]++
	}
	return out
}

// Stats returns the store's counts.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return Stats{Tasks: len(s.tasks), Workers: len(s.workers), Events: s.events, Version: s.version}
}

// snapshot is the persistence file's content.
type snapshot struct {
	Version int      `json:"version"`
	Tasks   []Task   `json:"tasks"`
	Workers []Worker `json:"workers"`
}

// Save writes the tasks and workers to path atomically (a temporary file
// renamed over it).
func (s *Store) Save(path string) error {
	s.mu.RLock()
	snap := snapshot{Version: 1}
	n := len(s.order)
	for i := 0; i < n; i++ {
		if t := s.tasks[s.order[(s.head+i)%n]]; t != nil {
			snap.Tasks = append(snap.Tasks, *t)
		}
	}
	for _, w := range s.workers {
		snap.Workers = append(snap.Workers, *w)
	}
	data, err := json.Marshal(snap)
	s.mu.RUnlock()
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Load reads a file Save wrote; a missing file is no error. Tasks beyond
// the store's bound keep the newest.
func (s *Store) Load(path string) error {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var snap snapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range snap.Tasks {
		t := snap.Tasks[i]
		if t.ID == "" {
			continue
		}
		p := s.task(t.ID)
		*p = t
		if len(p.Children) > maxChildren {
			p.Children = p.Children[:maxChildren]
		}
	}
	for i := range snap.Workers {
		w := snap.Workers[i]
		if w.Hostname == "" {
			continue
		}
		w.Hostname = clip(w.Hostname, maxHostLen)
		*s.worker(w.Hostname) = w
	}
	s.bump()
	return nil
}

// touch records a change that the events did not bring (a replay, a
// purge, a new queue sample), so that live pages fetch themselves again.
func (s *Store) touch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bump()
}
