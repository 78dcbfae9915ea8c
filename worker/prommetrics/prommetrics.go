// Package prommetrics exposes a celeriac worker's metrics to Prometheus:
// tasks received, started and finished by task name and outcome, run-time
// histograms, waits (countdown/ETA and rate limits), messages rejected before
// any handler ran, and gauges for running, ready and held tasks, prefetch
// and concurrency. Handler serves /metrics, /healthz and /readyz.
//
//	m := prommetrics.New(prometheus.NewRegistry())
//	w, _ := worker.New(tr, mux, worker.Config{Observer: m})
//	m.Watch(w)
//	go http.ListenAndServe(":9808", m.Handler(readyFunc))
package prommetrics

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/worker"
)

const namespace = "celeriac"

// Metrics implements worker.Observer with Prometheus metrics.
type Metrics struct {
	reg      *prometheus.Registry
	received *prometheus.CounterVec
	started  *prometheus.CounterVec
	finished *prometheus.CounterVec
	runtime  *prometheus.HistogramVec
	waits    *prometheus.CounterVec
	waitSecs *prometheus.HistogramVec
	rejected *prometheus.CounterVec
	lost     *prometheus.CounterVec
	restarts *prometheus.CounterVec
	gauges   *statsCollector
}

var (
	_ worker.Observer     = (*Metrics)(nil)
	_ worker.LossObserver = (*Metrics)(nil)

	_ worker.ConsumerObserver = (*Metrics)(nil)
)

// New registers celeriac's metrics on reg (a new registry when nil).
func New(reg *prometheus.Registry) *Metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		reg: reg,
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "tasks_received_total",
			Help: "Task messages received, by task name."}, []string{"task"}),
		started: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "tasks_started_total",
			Help: "Task runs started, by task name."}, []string{"task"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "tasks_finished_total",
			Help: "Task runs finished, by task name and outcome (succeeded, failed, retried, rejected, dead-lettered, revoked, ignored)."},
			[]string{"task", "outcome"}),
		runtime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "task_runtime_seconds",
			Help:    "Handler run time, by task name.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}},
			[]string{"task"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "task_waits_total",
			Help: "Tasks that had to wait before starting, by task name and reason (eta, rate-limit, global-rate-limit)."},
			[]string{"task", "reason"}),
		waitSecs: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "task_wait_seconds",
			Help:    "How long tasks were scheduled to wait, by reason.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10)}, []string{"reason"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "messages_rejected_total",
			Help: "Messages dead-lettered before any handler ran, by reason (invalid, content-type, too-large, not-registered, ...)."},
			[]string{"reason"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "results_lost_total",
			Help: "Task states that could not be stored within the settle budget (the result backend stayed down), by state."},
			[]string{"state"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "consumer_restarts_total",
			Help: "Consumers the watchdog rebuilt because nothing was received while messages were ready and the worker had room, by reason (no-progress)."},
			[]string{"reason"}),
		gauges: &statsCollector{},
	}
	reg.MustRegister(m.received, m.started, m.finished, m.runtime, m.waits, m.waitSecs, m.rejected, m.lost, m.restarts, m.gauges,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry returns the registry the metrics are registered on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Watch adds the gauges of w (running, ready, held, prefetch, concurrency).
func (m *Metrics) Watch(w *worker.Worker) { m.gauges.set(w) }

// WatchBroker adds the broker connection's metrics for a transport that
// reports them: celeriac_broker_reconnects_total (transport/amqp and
// transport/redis count their reconnections), and with several failover
// URLs (transport/amqp) celeriac_broker_failovers_total, the reconnections
// that landed on another node, and celeriac_broker_node, 1 with the node in
// use as its label (its URL, password hidden), none during an outage.
func (m *Metrics) WatchBroker(tr any) {
	if rc, ok := tr.(interface{ Reconnects() int64 }); ok {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace,
			Name: "broker_reconnects_total", Help: "Times the broker connection was re-established after it was lost."},
			func() float64 { return float64(rc.Reconnects()) }))
	}
	if fo, ok := tr.(interface{ Failovers() int64 }); ok {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace,
			Name: "broker_failovers_total", Help: "Broker reconnections that landed on another node than the one lost."},
			func() float64 { return float64(fo.Failovers()) }))
	}
	if n, ok := tr.(interface{ Node() string }); ok {
		m.reg.MustRegister(nodeCollector{node: n.Node})
	}
	m.watchUnreplicated(tr, "broker_unreplicated_writes_total",
		"Broker writes (acks, publishes) not acknowledged by the wanted replicas in time (Redis WAIT): a failover would lose them.")
}

// WatchBackend adds celeriac_result_backend_unreplicated_writes_total for a
// result backend that waits for replicas (backend/redis with
// WaitReplicas).
func (m *Metrics) WatchBackend(be any) {
	m.watchUnreplicated(be, "result_backend_unreplicated_writes_total",
		"Result writes not acknowledged by the wanted replicas in time (Redis WAIT): a failover would lose them.")
}

func (m *Metrics) watchUnreplicated(v any, name, help string) {
	if u, ok := v.(interface{ Unreplicated() int64 }); ok {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help},
			func() float64 { return float64(u.Unreplicated()) }))
	}
}

// nodeCollector exports the broker node in use as a label, read at scrape
// time.
type nodeCollector struct{ node func() string }

var nodeDesc = prometheus.NewDesc(namespace+"_broker_node",
	"The broker node the worker consumes from (1, with its URL as label; absent while disconnected).", []string{"node"}, nil)

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- nodeDesc }

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	if n := c.node(); n != "" {
		ch <- prometheus.MustNewConstMetric(nodeDesc, prometheus.GaugeValue, 1, n)
	}
}

// TaskReceived implements worker.Observer.
func (m *Metrics) TaskReceived(name string) { m.received.WithLabelValues(name).Inc() }

// TaskWaiting implements worker.Observer.
func (m *Metrics) TaskWaiting(name, reason string, d time.Duration) {
	m.waits.WithLabelValues(name, reason).Inc()
	m.waitSecs.WithLabelValues(reason).Observe(d.Seconds())
}

// TaskStarted implements worker.Observer.
func (m *Metrics) TaskStarted(name string) { m.started.WithLabelValues(name).Inc() }

// TaskFinished implements worker.Observer.
func (m *Metrics) TaskFinished(name string, o worker.Outcome, runtime time.Duration) {
	m.finished.WithLabelValues(name, string(o)).Inc()
	if runtime > 0 {
		m.runtime.WithLabelValues(name).Observe(runtime.Seconds())
	}
}

// MessageRejected implements worker.Observer.
func (m *Metrics) MessageRejected(reason string) { m.rejected.WithLabelValues(reason).Inc() }

// ResultLost implements worker.LossObserver.
func (m *Metrics) ResultLost(state protocol.State) { m.lost.WithLabelValues(string(state)).Inc() }

// ConsumerRestarted implements worker.ConsumerObserver.
func (m *Metrics) ConsumerRestarted(reason string) { m.restarts.WithLabelValues(reason).Inc() }

// Handler serves /metrics, /livez and /healthz (the process answers: a
// liveness probe) and /readyz (ready reports nil: for a worker, that its
// broker connection works). /livez is the name Kubernetes' own components
// use; /healthz stays for the probes written before it.
func (m *Metrics) Handler(ready func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	live := func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	}
	mux.HandleFunc("/livez", live)
	mux.HandleFunc("/healthz", live)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if ready != nil {
			if err := readyWithin(r.Context(), 2*time.Second, ready); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		w.Write([]byte("ok\n"))
	})
	return mux
}

// readyWithin runs ready with a deadline and returns at the deadline even
// if ready does not: a check stuck on a blackholed connection (a client
// that does not honour its context while it dials) must not hang the probe,
// whose timeout would then say nothing about why.
func readyWithin(ctx context.Context, d time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- ready(ctx) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer within %s", d)
	}
}

// statsCollector reads worker.Stats at scrape time.
type statsCollector struct {
	w *worker.Worker
}

var (
	descRunning     = prometheus.NewDesc(namespace+"_tasks_running", "Tasks running now.", nil, nil)
	descReady       = prometheus.NewDesc(namespace+"_tasks_ready", "Tasks received and waiting for a free slot.", nil, nil)
	descHeldETA     = prometheus.NewDesc(namespace+"_tasks_held_eta", "Countdown/ETA tasks held in memory.", nil, nil)
	descHeldRate    = prometheus.NewDesc(namespace+"_tasks_held_rate_limit", "Tasks waiting for a rate-limit token.", nil, nil)
	descPrefetch    = prometheus.NewDesc(namespace+"_prefetch", "Current prefetch bound.", nil, nil)
	descConcurrency = prometheus.NewDesc(namespace+"_concurrency", "Tasks that may run at once.", nil, nil)
)

func (c *statsCollector) set(w *worker.Worker) { c.w = w }

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRunning, descReady, descHeldETA, descHeldRate, descPrefetch, descConcurrency} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	if c.w == nil {
		return
	}
	s := c.w.Stats()
	for d, v := range map[*prometheus.Desc]int{descRunning: s.Running, descReady: s.Ready, descHeldETA: s.HeldETA,
		descHeldRate: s.HeldRate, descPrefetch: s.Prefetch, descConcurrency: s.Concurrency} {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
}
