package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/internal/deadletter"
)

// workerPageData is one worker's page: what its events said, and what it
// answers now to stats, registered, active_queues and active (Flower's
// worker page), each bounded.
type workerPageData struct {
	Worker     Worker
	Known      bool
	Online     bool
	Asked      bool // remote control was asked (not --read-only)
	Err        string
	Prefetch   string
	PoolMax    string
	Autoscale  string
	PID        string
	Registered []string
	Queues     []string
	Totals     []taskCount
	Active     []activeTask
	Stats      string // the whole stats reply, indented, clipped
}

type taskCount struct {
	Name  string
	Count string
}

type activeTask struct{ ID, Name, Args, Started string }

// maxWorkerList bounds each list of a worker page.
const maxWorkerList = 500

func (d *Dashboard) workerPage(w http.ResponseWriter, r *http.Request) {
	name := clip(r.PathValue("name"), maxHostLen)
	data := workerPageData{Worker: Worker{Hostname: name}}
	for _, wk := range d.store.Workers() {
		if wk.Hostname == name {
			data.Worker, data.Known, data.Online = wk, true, wk.Online(time.Now())
		}
	}
	if !d.o.ReadOnly {
		data.Asked = true
		d.workerReplies(r.Context(), name, &data)
	}
	status := http.StatusOK
	if !data.Known && data.Err != "" {
		status = http.StatusNotFound
	}
	d.render(w, r, status, page{Title: "Worker " + name, Nav: "workers", Template: "worker", Data: data})
}

// workerAsked is a worker's replies, kept for RefreshEvery: the page is
// live, and every event would otherwise ask the worker four questions.
type workerAsked struct {
	at   time.Time
	data workerPageData
}

// maxAskedWorkers bounds the replies kept.
const maxAskedWorkers = 64

// workerReplies fills data from the worker's replies, asked again when
// older than RefreshEvery.
func (d *Dashboard) workerReplies(ctx context.Context, name string, data *workerPageData) {
	d.askMu.Lock()
	a, ok := d.asked[name]
	d.askMu.Unlock()
	if !ok || time.Since(a.at) >= d.o.RefreshEvery {
		a = workerAsked{}
		d.askWorker(ctx, name, &a.data)
		// The replies are as old as their arrival: a worker that takes its
		// whole control timeout to answer keeps them for RefreshEvery too.
		a.at = time.Now()
		d.askMu.Lock()
		if d.asked == nil || len(d.asked) >= maxAskedWorkers {
			d.asked = map[string]workerAsked{}
		}
		d.asked[name] = a
		d.askMu.Unlock()
	}
	r := a.data
	data.Err, data.Prefetch, data.PoolMax, data.Autoscale, data.PID = r.Err, r.Prefetch, r.PoolMax, r.Autoscale, r.PID
	data.Registered, data.Queues, data.Totals, data.Active, data.Stats = r.Registered, r.Queues, r.Totals, r.Active, r.Stats
}

// askWorker fills data from the worker's replies, asked at once.
func (d *Dashboard) askWorker(ctx context.Context, name string, data *workerPageData) {
	o := client.ControlOptions{Destination: []string{name}, Limit: 1, Timeout: max(d.o.ControlTimeout, 3*time.Second)}
	methods := []string{"stats", "registered", "active_queues", "active"}
	replies := make([]any, len(methods))
	errs := make([]error, len(methods))
	var wg sync.WaitGroup
	for i, m := range methods {
		wg.Go(func() {
			rs, err := d.o.Control.Call(ctx, m, nil, o)
			if err == nil && len(rs) == 0 {
				err = fmt.Errorf("no reply to %s", m)
			}
			if err == nil {
				replies[i] = rs[0].Value
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if errs[0] != nil {
		data.Err = "the worker did not answer: " + clip(errs[0].Error(), 200)
	}
	if st, ok := replies[0].(map[string]any); ok {
		data.Stats = clip(indentJSON(deadletter.JSONable(st)), maxDocLen)
		if f, ok := num(st["prefetch_count"]); ok {
			data.Prefetch = fmt.Sprint(int64(f))
		}
		data.PID = str(st["pid"])
		if pool, ok := st["pool"].(map[string]any); ok {
			if f, ok := num(pool["max-concurrency"]); ok {
				data.PoolMax = fmt.Sprint(int64(f))
			}
		}
		// Celery's stats carry the autoscaler's info at the top level.
		if as, ok := st["autoscaler"].(map[string]any); ok {
			data.Autoscale = fmt.Sprintf("max %v, min %v, now %v", as["max"], as["min"], as["qty"])
		}
		if totals, ok := st["total"].(map[string]any); ok {
			for k, v := range totals {
				data.Totals = append(data.Totals, taskCount{Name: clip(k, 256), Count: str(v)})
			}
			sort.Slice(data.Totals, func(i, j int) bool { return data.Totals[i].Name < data.Totals[j].Name })
			data.Totals = data.Totals[:min(len(data.Totals), maxWorkerList)]
		}
	}
	if list, ok := replies[1].([]any); ok {
		for _, t := range list[:min(len(list), maxWorkerList)] {
			data.Registered = append(data.Registered, clip(str(t), 256))
		}
		slices.Sort(data.Registered)
	}
	if list, ok := replies[2].([]any); ok {
		for _, q := range list[:min(len(list), maxWorkerList)] {
			if m, ok := q.(map[string]any); ok {
				data.Queues = append(data.Queues, clip(str(m["name"]), 256))
			}
		}
	}
	if list, ok := replies[3].([]any); ok {
		for _, t := range list[:min(len(list), maxWorkerList)] {
			m, _ := t.(map[string]any)
			a := activeTask{ID: clip(str(m["id"]), 128), Name: clip(str(m["name"]), 256), Args: clip(str(m["args"]), 300)}
			if f, ok := num(m["time_start"]); ok {
				a.Started = zoned(unixTime(f))
			}
			data.Active = append(data.Active, a)
		}
	}
}
