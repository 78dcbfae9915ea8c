package bench

import (
	"bytes"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestParseIOWorkers(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // the workers' names, joined; "" for an error
	}{
		{"celeriac:100, gevent:500", "celeriac -c 100|Python gevent -c 500"},
		{"prefork:16,threads:100,solo:1", "Python prefork -c 16|Python threads -c 100|Python solo -c 1"},
		{"threads:100:2000", "Python threads -c 100"},
		{"threads@5.6:100,gevent@5.5:500:10", "Python threads -c 100 (Celery 5.6)|Python gevent -c 500 (Celery 5.5)"},
		{"celeriac@5.6:100", ""},
		{"threads@:100", ""},
		{"threads:100:0", ""},
		{"threads:100:2:3", ""},
		{"celeriac", ""},
		{"celeriac:0", ""},
		{"eventlet:10", ""},
		{"", ""},
	} {
		ws, err := ParseIOWorkers(tc.in)
		var names []string
		for _, w := range ws {
			names = append(names, w.String())
		}
		if got := strings.Join(names, "|"); got != tc.want || (err != nil) != (tc.want == "") {
			t.Errorf("ParseIOWorkers(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestPercentilesOf(t *testing.T) {
	var d []time.Duration
	for i := 1000; i >= 1; i-- { // unsorted on purpose
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	p := percentilesOf(d)
	if p.P50 != 500*time.Millisecond || p.P99 != 990*time.Millisecond || p.P999 != 999*time.Millisecond {
		t.Errorf("percentilesOf(1..1000 ms) = %+v", p)
	}
	if d[0] != time.Second {
		t.Error("percentilesOf sorted its argument")
	}
	if (percentilesOf(nil) != Percentiles{}) {
		t.Error("percentilesOf(nil) is not zero")
	}
	if p := percentilesOf([]time.Duration{7}); p.P50 != 7 || p.P999 != 7 {
		t.Errorf("one sample: %+v", p)
	}
}

func TestWriteIOReport(t *testing.T) {
	var b bytes.Buffer
	WriteIOReport(&b, IOReport{Options: IOOptions{N: 10, Loads: []float64{0.5}}, Results: []IOResult{
		{Worker: IOWorker{Kind: "celeriac", Concurrency: 100}, N: 10, Throughput: 1900, E2E: Percentiles{P50: 51 * time.Millisecond}, CPUPerTask: 40 * time.Microsecond,
			PeakRSS: 30e6, RedisCPU: 9500 * time.Nanosecond, Loads: []IOLoad{{Fraction: 0.5, Rate: 950, E2E: Percentiles{P50: 50500 * time.Microsecond, P99: 60 * time.Millisecond}}}},
		{Worker: IOWorker{Kind: "gevent", Concurrency: 500}, Err: "the worker exited: boom\nlog"},
	}})
	out := b.String()
	for _, want := range []string{"| celeriac -c 100 | 10 | 1900 | 0.0 / 0.0 ms | 51.0 / 0.0 / 0.0 ms | 40 µs | 30 MB | 9.5 µs |",
		"| Python gevent -c 500 |  | failed: the worker exited: boom |", "| celeriac -c 100 | 950/s: 50.5 / 60.0 |", "| Python gevent -c 500 | - |"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestWriteIOReportResults(t *testing.T) {
	for _, tc := range []struct {
		name string
		load IOLoad
		want []string
		not  []string
	}{
		{"go only", IOLoad{Fraction: 0.5, Rate: 150, GoN: 3000, E2E: Percentiles{P50: 52 * time.Millisecond, P99: 60 * time.Millisecond},
			Result: Percentiles{P50: 54 * time.Millisecond, P99: 70 * time.Millisecond}},
			[]string{"| Python threads -c 100 | 150/s: 52.0 / 60.0; result 54.0 / 70.0 |", "AsyncResult.Get"}, []string{"Python get 0"}},
		{"both clients", IOLoad{Fraction: 0.5, Rate: 150, GoN: 1000, PyN: 2000, E2E: Percentiles{P50: 52 * time.Millisecond, P99: 60 * time.Millisecond},
			Result: Percentiles{P50: 54 * time.Millisecond, P99: 70 * time.Millisecond}, PyResult: Percentiles{P50: 55 * time.Millisecond, P99: 90 * time.Millisecond}},
			[]string{"| 150/s: 52.0 / 60.0; result 54.0 / 70.0; Python get 55.0 / 90.0 (2000) |", "AsyncResult.get()", "up to 50 of the arrivals"}, nil},
		// Every arrival was the Python client's: no Go result to show.
		{"python only", IOLoad{Fraction: 0.5, Rate: 50, PyN: 1000, E2E: Percentiles{P50: 52 * time.Millisecond, P99: 60 * time.Millisecond},
			PyResult: Percentiles{P50: 55 * time.Millisecond, P99: 90 * time.Millisecond}},
			[]string{"| 50/s: 52.0 / 60.0; Python get 55.0 / 90.0 (1000) |"}, []string{"result 0.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			WriteIOReport(&b, IOReport{Options: IOOptions{N: 10, Loads: []float64{0.5}, Results: true}, Results: []IOResult{
				{Worker: IOWorker{Kind: "threads", Concurrency: 100}, N: 10, Throughput: 300, Loads: []IOLoad{tc.load}},
			}})
			out := b.String()
			for _, want := range tc.want {
				if !strings.Contains(out, want) {
					t.Errorf("report lacks %q:\n%s", want, out)
				}
			}
			for _, not := range tc.not {
				if strings.Contains(out, not) {
					t.Errorf("report has %q:\n%s", not, out)
				}
			}
		})
	}
}

// TestResultWaitsCounts: wait reports the Gets that have not returned by
// its limit, and keeps the latencies of those that have.
func TestResultWaitsCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &resultWaits{ctx: t.Context()}
		block := make(chan struct{})
		for i := range 3 {
			w.n++
			w.wg.Go(func() {
				if i == 2 {
					<-block
				}
				w.mu.Lock()
				w.took = append(w.took, time.Duration(i))
				w.mu.Unlock()
			})
		}
		got, err := w.wait(time.Minute)
		if len(got) != 2 || err == nil || !strings.Contains(err.Error(), "1 results not read within 1m0s") {
			t.Errorf("wait = %v, %v; want 2 latencies and 1 not read", got, err)
		}
		close(block)
		w.wg.Wait()
	})
}

func TestWriteIOReportFleetAndHeader(t *testing.T) {
	var b bytes.Buffer
	start := time.Date(2026, 12, 4, 8, 0, 0, 0, time.UTC)
	WriteIOReport(&b, IOReport{Options: IOOptions{N: 10}, Command: "celeriac bench io --redis-db 9", Machine: "2 cores", Start: start, End: start.Add(20 * time.Minute),
		Fleet: []IOFleet{
			{Worker: IOWorker{Kind: "celeriac", Concurrency: 1000}, Processes: 2, N: 100, Throughput: 5000, CPUPerTask: 120 * time.Microsecond, RedisCPU: 40 * time.Microsecond,
				Rate: 2500, Load: IOFleetLoad{N: 50, CPUPerTask: 150 * time.Microsecond, RedisCPU: 50 * time.Microsecond, E2E: Percentiles{P50: 51 * time.Millisecond, P99: 70 * time.Millisecond}}},
			{Worker: IOWorker{Kind: "threads", Concurrency: 100}, Processes: 2, N: 100, Throughput: 500, CPUPerTask: time.Millisecond, RedisCPU: 110 * time.Microsecond, Rate: 250, Err: "late\nrest"},
			{Worker: IOWorker{Kind: "threads", Concurrency: 100}, Processes: 4, Err: "no\nmore"},
		}})
	out := b.String()
	for _, want := range []string{"Run 2026-12-04 08:00 UTC (20m0s). Machine: 2 cores.", "Command: `celeriac bench io --redis-db 9`.",
		"| celeriac -c 1000 | 2 | 5000 | 120 µs | 40.0 µs | 2500/s | 150 µs | 50.0 µs | 51.0 / 70.0 ms | 20000 |",
		"| Python threads -c 100 | 2 | 500 | 1000 µs | 110.0 µs | failed: late |  |  |  | — |",
		"| Python threads -c 100 | 4 | failed: no |"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestWriteIOPlot(t *testing.T) {
	var b bytes.Buffer
	WriteIOPlot(&b, IOReport{Results: []IOResult{
		{Worker: IOWorker{Kind: "celeriac", Concurrency: 1000}, Loads: []IOLoad{{Rate: 1300, E2E: Percentiles{P99: 65 * time.Millisecond}}, {Rate: 4700, E2E: Percentiles{P99: 185 * time.Millisecond}}}},
		{Worker: IOWorker{Kind: "threads", Concurrency: 100, Celery: "5.6"}, Loads: []IOLoad{{Rate: 85, E2E: Percentiles{P99: 57 * time.Millisecond}}, {Rate: 300, Err: "timeout"}}},
		{Worker: IOWorker{Kind: "gevent", Concurrency: 500}, Err: "failed"},
	}})
	out := b.String()
	if !strings.HasPrefix(out, "<svg ") || !strings.HasSuffix(out, "</svg>\n") {
		t.Fatalf("not an SVG document:\n%s", out)
	}
	if got := strings.Count(out, "<polyline"); got != 2 {
		t.Errorf("%d lines, want 2 (a worker without a level draws none)", got)
	}
	if got := strings.Count(out, "<circle"); got != 3 {
		t.Errorf("%d points, want 3 (a failed level is left out)", got)
	}
	for _, want := range []string{"celeriac -c 1000", "Python threads -c 100 (Celery 5.6)", ">10 ms<", ">1000 ms<", ">10000<"} {
		if !strings.Contains(out, want) {
			t.Errorf("plot lacks %q", want)
		}
	}
	// Twelve workers: the two past the ten colours are dashed.
	var many IOReport
	for i := range 12 {
		many.Results = append(many.Results, IOResult{Worker: IOWorker{Kind: "celeriac", Concurrency: i + 1},
			Loads: []IOLoad{{Rate: 100, E2E: Percentiles{P99: 60 * time.Millisecond}}}})
	}
	var mb bytes.Buffer
	WriteIOPlot(&mb, many)
	if got := strings.Count(mb.String(), `stroke-dasharray="6 3"`); got != 4 {
		t.Errorf("%d dashed strokes, want 4 (two lines and their legend keys)", got)
	}
	if strings.Contains(mb.String(), `fill="#1f77b4" stroke-dasharray`) {
		t.Errorf("a point got the dash")
	}
	var empty bytes.Buffer
	WriteIOPlot(&empty, IOReport{})
	if !strings.Contains(empty.String(), "no open-loop level completed") {
		t.Errorf("empty plot: %s", empty.String())
	}
}

func TestWriteIOReportPostgres(t *testing.T) {
	var b bytes.Buffer
	WriteIOReport(&b, IOReport{Options: IOOptions{N: 10, PostgresURL: "postgres://x"}, Results: []IOResult{
		{Worker: IOWorker{Kind: "celeriac", Concurrency: 100}, N: 10, Throughput: 500, PostgresCPU: 225 * time.Microsecond},
		{Worker: IOWorker{Kind: "gevent", Concurrency: 500}, Err: "boom"},
	}})
	out := b.String()
	for _, want := range []string{"Every task also INSERTs a row into PostgreSQL.", "| PostgreSQL CPU per task |", "| 0.0 µs | 225 µs |",
		"| Python gevent -c 500 |  | failed: boom |  |  |  |  |  |  |"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestWriteIOReportRabbitMQ(t *testing.T) {
	var b bytes.Buffer
	WriteIOReport(&b, IOReport{Options: IOOptions{N: 10, Broker: "amqp"}, Results: []IOResult{
		{Worker: IOWorker{Kind: "celeriac", Concurrency: 100}, N: 10, Throughput: 1900, RedisCPU: 95 * time.Microsecond},
	}, Fleet: []IOFleet{{Worker: IOWorker{Kind: "celeriac", Concurrency: 100}, Processes: 1, N: 10, Throughput: 1900, RedisCPU: 100 * time.Microsecond,
		Rate: 950, Load: IOFleetLoad{N: 10, RedisCPU: 125 * time.Microsecond}}}})
	out := b.String()
	for _, want := range []string{"from RabbitMQ.", "| RabbitMQ CPU per task |", "| 95.0 µs |", "| RabbitMQ CPU per task | e2e p50 / p99 | tasks/s per RabbitMQ core |", "| 100.0 µs | 950/s |", "| 125.0 µs | 0.0 / 0.0 ms | 8000 |"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Redis") {
		t.Errorf("a RabbitMQ report names Redis:\n%s", out)
	}
}
