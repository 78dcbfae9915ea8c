package prommetrics_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/prommetrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestScrapeShowsTheRun(t *testing.T) {
	tr := memory.New(memory.Config{})
	defer tr.Close()
	be := membackend.New()
	defer be.Close()
	m := prommetrics.New(nil)
	mux := worker.NewMux()
	mux.HandleFunc("tasks.ok", func(ctx context.Context, t *worker.Task) (any, error) { return 1, nil })
	mux.HandleFunc("tasks.bad", func(ctx context.Context, t *worker.Task) (any, error) {
		return nil, worker.NewException("ValueError", "x")
	})
	w, err := worker.New(tr, mux, worker.Config{Queues: []string{"q"}, Backend: be, Observer: m})
	if err != nil {
		t.Fatal(err)
	}
	m.Watch(w)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	p := client.New(tr, client.Config{DefaultQueue: "q"})
	var ids []string
	for _, name := range []string{"tasks.ok", "tasks.ok", "tasks.ok", "tasks.ok", "tasks.ok", "tasks.bad", "tasks.unknown"} {
		r, err := p.Send(context.Background(), name, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	for _, id := range ids {
		wctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := be.Wait(wctx, id); err != nil {
			t.Fatal(err)
		}
		c()
	}
	srv := httptest.NewServer(m.Handler(func(context.Context) error { return nil }))
	defer srv.Close()
	body := get(t, srv.URL+"/metrics")
	for _, want := range []string{
		`celeriac_tasks_finished_total{outcome="succeeded",task="tasks.ok"} 5`,
		`celeriac_tasks_finished_total{outcome="failed",task="tasks.bad"} 1`,
		`celeriac_tasks_received_total{task="tasks.ok"} 5`,
		`celeriac_messages_rejected_total{reason="not-registered"} 1`,
		`celeriac_task_runtime_seconds_count{task="tasks.ok"} 5`,
		`celeriac_concurrency `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if got := get(t, srv.URL+"/readyz"); got != "ok\n" {
		t.Errorf("/readyz = %q", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := srvClient().Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func srvClient() *http.Client { return &http.Client{Timeout: 5 * time.Second} }

type fakeBroker struct{ n int64 }

func (f fakeBroker) Reconnects() int64 { return f.n }

type fakeCluster struct {
	fakeBroker
	node string
}

func (f *fakeCluster) Failovers() int64    { return 2 }
func (f *fakeCluster) Node() string        { return f.node }
func (f *fakeCluster) Unreplicated() int64 { return 7 }

func TestBrokerNode(t *testing.T) {
	m := prommetrics.New(nil)
	b := &fakeCluster{fakeBroker: fakeBroker{n: 5}, node: "amqp://guest:xxxxx@b:5672//"}
	m.WatchBroker(b)
	m.WatchBackend(b)
	m.WatchBackend(struct{}{}) // nothing to count: ignored
	srv := httptest.NewServer(m.Handler(nil))
	defer srv.Close()
	body := get(t, srv.URL+"/metrics")
	for _, want := range []string{
		"celeriac_broker_reconnects_total 5",
		"celeriac_broker_failovers_total 2",
		`celeriac_broker_node{node="amqp://guest:xxxxx@b:5672//"} 1`,
		"celeriac_broker_unreplicated_writes_total 7",
		"celeriac_result_backend_unreplicated_writes_total 7",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %q in:\n%s", want, body)
		}
	}
	b.node = "" // an outage: no node
	if body := get(t, srv.URL+"/metrics"); strings.Contains(body, "celeriac_broker_node{") {
		t.Errorf("a node is reported during an outage:\n%s", body)
	}
}

func TestBrokerReconnectsCounter(t *testing.T) {
	m := prommetrics.New(nil)
	m.WatchBroker(fakeBroker{n: 3})
	m.WatchBroker(struct{}{}) // no counter: ignored
	srv := httptest.NewServer(m.Handler(nil))
	defer srv.Close()
	if body := get(t, srv.URL+"/metrics"); !strings.Contains(body, "celeriac_broker_reconnects_total 3") {
		t.Fatalf("no reconnect counter in:\n%s", body)
	}
}

// TestProbes: /livez and /healthz answer while the process runs, whatever
// the broker does; /readyz says what is not ready, with 503.
func TestProbes(t *testing.T) {
	var down error
	srv := httptest.NewServer(prommetrics.New(nil).Handler(func(context.Context) error { return down }))
	defer srv.Close()
	probe := func(path string) (int, string) {
		resp, err := srvClient().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		down       error
		path, body string
		code       int
	}{
		{nil, "/livez", "ok\n", 200},
		{nil, "/healthz", "ok\n", 200},
		{nil, "/readyz", "ok\n", 200},
		{errors.New("broker: connection refused"), "/livez", "ok\n", 200},
		{errors.New("broker: connection refused"), "/healthz", "ok\n", 200},
		{errors.New("broker: connection refused"), "/readyz", "not ready: broker: connection refused\n", 503},
	} {
		down = tc.down
		if code, body := probe(tc.path); code != tc.code || body != tc.body {
			t.Errorf("%s (down: %v) = %d %q, want %d %q", tc.path, tc.down, code, body, tc.code, tc.body)
		}
	}
}

func TestConsumerRestartsCounted(t *testing.T) {
	m := prommetrics.New(nil)
	m.ConsumerRestarted("no-progress")
	m.ConsumerRestarted("no-progress")
	srv := httptest.NewServer(m.Handler(nil))
	defer srv.Close()
	if body := get(t, srv.URL+"/metrics"); !strings.Contains(body, `celeriac_consumer_restarts_total{reason="no-progress"} 2`) {
		t.Fatalf("no consumer restart count in:\n%s", body)
	}
}

// TestReadyzAnswersWhenTheCheckHangs: a readiness check stuck on a dead
// connection (one that ignores its context) still gets a 503 at the
// probe's deadline instead of hanging the probe.
func TestReadyzAnswersWhenTheCheckHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stuck := make(chan struct{})
		h := prommetrics.New(nil).Handler(func(context.Context) error { <-stuck; return nil })
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "no answer within 2s") {
			t.Errorf("/readyz with a hung check = %d %q, want 503 and why", rec.Code, rec.Body.String())
		}
		close(stuck)
	})
}
