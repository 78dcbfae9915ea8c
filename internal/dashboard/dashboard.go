// Package dashboard is `celeriac dashboard`: a web UI for one broker and
// result backend showing the workers (Python and Go alike, from Celery's
// events and remote control), the task stream and each task's detail,
// per-name throughput and runtime plots, queue depths and the dead letters,
// with the actions an operator needs (revoke, replay, purge, pool and rate
// limit changes, shutdown).
//
// Pages are rendered on the server with html/template and readable without
// JavaScript; one small script makes them live through server-sent events.
// History is bounded in memory (and optionally saved to a file), as
// Flower's is. With credentials configured every page needs them; every
// action is a POST that needs them and a CSRF token; without configured
// credentials, or with ReadOnly, there are no actions. docs/security.md
// states the threat model.
package dashboard

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// Controller sends remote-control commands; *client.Control is one.
type Controller interface {
	Call(ctx context.Context, method string, args map[string]any, o client.ControlOptions) ([]client.Reply, error)
	Cast(ctx context.Context, method string, args map[string]any, o client.ControlOptions) error
}

// Options configure a Dashboard.
type Options struct {
	// Transport is the broker connection: events are read from it, and it
	// answers queue depths (transport.Admin) and dead letters
	// (transport.DeadLetterStore).
	Transport transport.Transport
	// BrokerScheme is "amqp", "redis" or "memory", for display.
	BrokerScheme string
	// Backend, when set, supplies results the events did not carry.
	Backend backend.Backend
	// Inspector, when set, reports queue details beyond the depth
	// transport.Admin gives (consumers, priorities).
	Inspector QueueInspector
	// Control sends remote-control commands; default client.NewControl(Transport).
	Control Controller
	// Client sends the tasks /api/task/async-apply asks for; nil refuses
	// them.
	Client TaskSender
	// Queues are shown on the queues and dead-letters pages in addition to
	// those the workers report consuming.
	Queues []string
	// MaxTasks bounds the task history (default 10000, as Flower's
	// max_tasks).
	MaxTasks int
	// PersistFile, when set, is loaded at start and saved every
	// PersistEvery (default 1 min) and when Run returns.
	PersistFile  string
	PersistEvery time.Duration
	// AuthToken and BasicAuth (user → password) are the credentials the
	// dashboard accepts. With either, every page needs them. With
	// neither, pages are public and actions and dead letters refused.
	AuthToken string
	BasicAuth map[string]string
	// AllowedHosts are the host names (without port) requests may name in
	// their Host header besides loopback names and addresses; any other
	// Host is refused (421), so that a DNS-rebinding page cannot read
	// the dashboard through a browser.
	AllowedHosts []string
	// AllowIPHosts accepts any IP address as Host (an address cannot be
	// rebound); the command sets it when listening on all interfaces.
	AllowIPHosts bool
	// ReadOnly refuses every action and sends no remote-control command
	// at all (not even EnableEvents' or the refresh's stats queries).
	ReadOnly bool
	// EnableEvents broadcasts enable_events every RefreshEvery so that
	// workers started without -E send task events (Flower does the same).
	EnableEvents bool
	// RefreshEvery is how often workers are asked for stats and queues and
	// queue depths are sampled (default 10 s).
	RefreshEvery time.Duration
	// ControlTimeout bounds the wait for workers' replies (default 1 s).
	ControlTimeout time.Duration
	// URLPrefix serves the dashboard under a path ("/flower", say) for a
	// reverse proxy that forwards that path unchanged: requests outside it
	// are not found, and every link, form, redirect and the event stream
	// carry it.
	URLPrefix string
	Logger    *zap.Logger
}

// cleanPrefix normalizes a URL prefix to "/a/b": a path of plain segments,
// so that it can be written into pages and headers as it is.
func cleanPrefix(p string) (string, error) {
	p = "/" + strings.Trim(p, "/")
	if p == "/" {
		return "", nil
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", fmt.Errorf("dashboard: URL prefix %q: want a path such as /flower", p)
		}
		for _, c := range seg {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-._~", c)) {
				return "", fmt.Errorf("dashboard: URL prefix %q: only letters, digits and -._~ in its segments", p)
			}
		}
	}
	return p, nil
}

// TaskSender sends a task: *client.Client.
type TaskSender interface {
	Send(ctx context.Context, name string, args []any, kwargs map[string]any, opts ...client.SendOption) (*client.AsyncResult, error)
}

// Dashboard serves the UI. Create it with New, run its background work with
// Run, and serve Handler.
type Dashboard struct {
	o     Options
	store *Store
	log   *zap.Logger
	// secret keys the CSRF tokens and the session table; new per process.
	secret   []byte
	sessions sessionTable
	limiter  loginLimiter

	deadMu sync.Mutex // see serialDead

	qmu     sync.Mutex
	samples map[string]*queueSample
	sampled time.Time
	// brokerErr is why the last sample reached no queue at all ("" when
	// one answered), since brokerDown.
	brokerErr  string
	brokerDown time.Time

	askMu sync.Mutex
	asked map[string]workerAsked // see workerReplies
}

// BrokerDown reports whether the last queue sample reached the broker for
// no queue, why, and since when.
func (d *Dashboard) BrokerDown() (string, time.Time) {
	d.qmu.Lock()
	defer d.qmu.Unlock()
	return d.brokerErr, d.brokerDown
}

// New returns a dashboard; it loads PersistFile when set.
func New(o Options) (*Dashboard, error) {
	if o.Transport == nil {
		return nil, errors.New("dashboard: no transport")
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Control == nil {
		o.Control = client.NewControl(o.Transport)
	}
	if o.URLPrefix != "" {
		p, err := cleanPrefix(o.URLPrefix)
		if err != nil {
			return nil, err
		}
		o.URLPrefix = p
	}
	if o.RefreshEvery <= 0 {
		o.RefreshEvery = 10 * time.Second
	}
	if o.ControlTimeout <= 0 {
		o.ControlTimeout = time.Second
	}
	if o.PersistEvery <= 0 {
		o.PersistEvery = time.Minute
	}
	d := &Dashboard{o: o, store: NewStore(o.MaxTasks), log: o.Logger, secret: make([]byte, 32), samples: map[string]*queueSample{}}
	if _, err := rand.Read(d.secret); err != nil {
		return nil, err
	}
	if o.PersistFile != "" {
		if err := d.store.Load(o.PersistFile); err != nil {
			return nil, fmt.Errorf("dashboard: load %s: %w", o.PersistFile, err)
		}
	}
	return d, nil
}

// Store is the dashboard's history.
func (d *Dashboard) Store() *Store { return d.store }

// Run subscribes to Celery's events and refreshes worker and queue
// information until ctx ends. It returns the subscription's error, or nil
// when ctx ended.
func (d *Dashboard) Run(ctx context.Context) error {
	sub, err := d.o.Transport.Subscribe(ctx, transport.Broadcast{
		Exchange: "celeryev", ExchangeType: transport.Topic, BindingKey: "#",
		Queue: "celeryev.celeriac-dashboard-" + protocol.NewID(),
		// As Celery's monitors: the queue goes when the dashboard does.
		QueueArguments: map[string]any{"x-expires": int64(60000), "x-message-ttl": int64(60000)},
	})
	if err != nil {
		return fmt.Errorf("dashboard: subscribe to events: %w", err)
	}
	defer sub.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.refreshLoop(ctx)
	}()
	if d.o.PersistFile != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(d.o.PersistEvery)
			defer t.Stop()
			for {
				select {
				case <-t.C:
				case <-ctx.Done():
					return
				}
				if err := d.store.Save(d.o.PersistFile); err != nil {
					d.log.Warn("saving history failed", zap.String("file", d.o.PersistFile), zap.Error(err))
				}
			}
		}()
		defer func() {
			if err := d.store.Save(d.o.PersistFile); err != nil {
				d.log.Warn("saving history failed", zap.String("file", d.o.PersistFile), zap.Error(err))
			}
		}()
	}
	for {
		select {
		case dl, ok := <-sub.Deliveries():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("dashboard: the event subscription ended")
			}
			d.ingest(dl.Message)
		case <-ctx.Done():
			return nil
		}
	}
}

// ingest applies one event message: an event, or a list of them
// (task.multi).
func (d *Dashboard) ingest(m protocol.Message) {
	v, err := protocol.Unmarshal(m.ContentType, m.Body, protocol.DecodeOptions{})
	if err != nil {
		d.log.Debug("undecodable event", zap.Error(err))
		return
	}
	switch v := v.(type) {
	case map[string]any:
		d.store.Apply(v)
	case []any:
		for _, e := range v {
			if ev, ok := e.(map[string]any); ok {
				d.store.Apply(ev)
			}
		}
	}
}

func (d *Dashboard) refreshLoop(ctx context.Context) {
	t := time.NewTicker(d.o.RefreshEvery)
	defer t.Stop()
	for {
		d.refresh(ctx)
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// refresh asks the workers for their pool and queues, turns on task events
// when asked to, and samples the queues. Read-only, it only samples the
// queues: a read-only dashboard sends no remote-control command.
func (d *Dashboard) refresh(ctx context.Context) {
	if d.o.ReadOnly {
		d.sampleQueues(ctx)
		return
	}
	co := client.ControlOptions{Timeout: d.o.ControlTimeout}
	if d.o.EnableEvents {
		if err := d.o.Control.Cast(ctx, "enable_events", nil, co); err != nil && ctx.Err() == nil {
			d.log.Debug("enable_events failed", zap.Error(err))
		}
	}
	if replies, err := d.o.Control.Call(ctx, "stats", nil, co); err == nil {
		for _, r := range replies {
			m, _ := r.Value.(map[string]any)
			pool, _ := m["pool"].(map[string]any)
			d.store.UpdateWorkerInfo(clip(r.Hostname, maxHostLen), func(w *Worker) {
				if impl := str(pool["implementation"]); impl != "" {
					w.Pool = clip(impl, 128)
				} else if _, ok := pool["processes"]; ok {
					// Celery's prefork pool reports its processes
					// but not its implementation.
					w.Pool = "prefork"
				}
				if c, ok := num(pool["max-concurrency"]); ok {
					w.Concurrency = int64(c)
				}
			})
		}
	}
	if replies, err := d.o.Control.Call(ctx, "active_queues", nil, co); err == nil {
		for _, r := range replies {
			list, _ := r.Value.([]any)
			var names []string
			for _, q := range list {
				if m, ok := q.(map[string]any); ok {
					if n := str(m["name"]); n != "" && len(names) < 100 {
						names = append(names, clip(n, 256))
					}
				}
			}
			sort.Strings(names)
			d.store.UpdateWorkerInfo(clip(r.Hostname, maxHostLen), func(w *Worker) { w.Queues = names })
		}
	}
	d.sampleQueues(ctx)
}

// queueNames are the configured queues and those workers consume, without
// pidbox and event queues.
func (d *Dashboard) queueNames() []string {
	names := slices.Clone(d.o.Queues)
	for _, w := range d.store.Workers() {
		for _, q := range w.Queues {
			if !strings.HasSuffix(q, ".pidbox") && !strings.HasPrefix(q, "celeryev.") && !slices.Contains(names, q) {
				names = append(names, q)
			}
		}
	}
	sort.Strings(names)
	if len(names) > 200 {
		names = names[:200]
	}
	return names
}

// queueSample is one queue's last sampled state.
type queueSample struct {
	Name      string
	Depth     int
	Consumers int // -1 unknown
	// Rate is the change of depth per second since the previous sample
	// (positive: filling up).
	Rate        float64
	HasRate     bool
	MaxPriority int // RabbitMQ x-max-priority; -1 unknown or n/a
	Bands       []band
	// Unacked, UnackedAtLeast, UnackedErr, PublishRate, AckRate and
	// HasRates are QueueDetail's.
	Unacked              int
	UnackedAtLeast       bool
	UnackedErr           string
	PublishRate, AckRate float64
	HasRates             bool
	Err                  string
	at                   time.Time
}

type band struct{ Priority, Len int }

const errCannotCount = "this transport cannot count messages"

// QueueInspector is what the queues page needs beyond transport.Admin:
// RabbitMQ's consumers and max priority, Redis's priority bands. The
// command adapts the transports to it.
type QueueInspector interface {
	Inspect(ctx context.Context, queue string) (QueueDetail, error)
}

// QueueDetail is what a QueueInspector reports.
type QueueDetail struct {
	Depth       int
	Consumers   int // -1 unknown
	MaxPriority int // -1 unknown or not applicable
	Bands       []QueueBand
	// Unacked counts the messages delivered to consumers and not yet
	// acknowledged (-1 unknown, UnackedErr says why): running acks_late
	// tasks, and those prefetched. With UnackedAtLeast it is a lower
	// bound: the count stopped at its bound.
	Unacked        int
	UnackedAtLeast bool
	UnackedErr     string
	// PublishRate and AckRate are messages per second in and
	// acknowledged, when the broker says (HasRates).
	PublishRate, AckRate float64
	HasRates             bool
}

// UnackedCounter is implemented by a QueueInspector that counts the
// unacknowledged messages of every queue in one pass, as Redis keeps them
// in one hash for all: the dashboard asks it once per sample, and its
// counts replace Inspect's.
type UnackedCounter interface {
	CountUnacked(ctx context.Context) (UnackedCounts, error)
}

// UnackedCounts are an UnackedCounter's answer: by queue (a queue it does
// not name has none), and whether they are lower bounds.
type UnackedCounts struct {
	ByQueue map[string]int
	AtLeast bool
}

// QueueBand is one Redis priority band.
type QueueBand struct{ Priority, Len int }

func (d *Dashboard) sampleQueues(ctx context.Context) []queueSample {
	names := d.queueNames()
	now := time.Now()
	out := make([]queueSample, 0, len(names))
	var counts *UnackedCounts
	countErr := ""
	if uc, ok := d.o.Inspector.(UnackedCounter); ok && len(names) > 0 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := uc.CountUnacked(cctx)
		cancel()
		if err != nil {
			countErr = clip(err.Error(), 300)
		} else {
			counts = &c
		}
	}
	for _, q := range names {
		s := queueSample{Name: q, Consumers: -1, MaxPriority: -1, Unacked: -1, at: now}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		admin, isAdmin := d.o.Transport.(transport.Admin)
		switch {
		case d.o.Inspector != nil:
			det, err := d.o.Inspector.Inspect(cctx, q)
			if err != nil {
				s.Err = err.Error()
				break
			}
			s.Depth, s.Consumers, s.MaxPriority = det.Depth, det.Consumers, det.MaxPriority
			for _, b := range det.Bands {
				s.Bands = append(s.Bands, band(b))
			}
			s.Unacked, s.UnackedAtLeast, s.UnackedErr = det.Unacked, det.UnackedAtLeast, clip(det.UnackedErr, 300)
			s.PublishRate, s.AckRate, s.HasRates = det.PublishRate, det.AckRate, det.HasRates
			switch {
			case counts != nil:
				s.Unacked, s.UnackedAtLeast, s.UnackedErr = counts.ByQueue[q], counts.AtLeast, ""
			case countErr != "":
				s.Unacked, s.UnackedAtLeast, s.UnackedErr = -1, false, countErr
			}
		case isAdmin:
			n, err := admin.Len(cctx, q)
			if err != nil {
				s.Err = err.Error()
			}
			s.Depth = n
		default:
			s.Err = errCannotCount
		}
		cancel()
		d.qmu.Lock()
		if prev := d.samples[q]; prev != nil && s.Err == "" && prev.Err == "" {
			if dt := now.Sub(prev.at).Seconds(); dt > 0.5 {
				s.Rate, s.HasRate = float64(s.Depth-prev.Depth)/dt, true
			} else {
				s.Rate, s.HasRate = prev.Rate, prev.HasRate
			}
		}
		c := s
		d.samples[q] = &c
		d.qmu.Unlock()
		out = append(out, s)
	}
	// Every queue failing is the broker, not a queue: the pages say so
	// rather than show last figures as current.
	down := ""
	for i, s := range out {
		if s.Err == "" || s.Err == errCannotCount {
			down = ""
			break
		}
		if i == 0 {
			down = s.Err
		}
	}
	d.qmu.Lock()
	switch {
	case down == "":
		d.brokerErr, d.brokerDown = "", time.Time{}
	case d.brokerErr == "":
		d.brokerErr, d.brokerDown = clip(down, 300), now
		d.log.Warn("the broker does not answer", zap.String("error", down))
	default:
		d.brokerErr = clip(down, 300)
	}
	d.sampled = now
	for q := range d.samples {
		if !slices.Contains(names, q) {
			delete(d.samples, q)
		}
	}
	d.qmu.Unlock()
	d.store.touch()
	return out
}

// queues returns the last samples, sampling now when they are older than
// the refresh interval.
func (d *Dashboard) queues(ctx context.Context) []queueSample {
	d.qmu.Lock()
	fresh := time.Since(d.sampled) < d.o.RefreshEvery
	var out []queueSample
	if fresh {
		for _, s := range d.samples {
			out = append(out, *s)
		}
	}
	d.qmu.Unlock()
	if !fresh {
		return d.sampleQueues(ctx)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
