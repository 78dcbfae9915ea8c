package bench

import (
	"bytes"
	"math"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{5, 5, 1}, 5},
	} {
		in := slices.Clone(tc.in)
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", in, got, tc.want)
		}
		if !slices.Equal(in, tc.in) {
			t.Errorf("median reordered its input: %v", tc.in)
		}
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median(nil) is not NaN")
	}
}

func TestPercentiles(t *testing.T) {
	ms := make([]float64, 1000)
	for i := range ms {
		ms[i] = float64(1000 - i) // 1000 .. 1, unsorted
	}
	got := percentiles(ms)
	// Nearest rank: the 500th, 900th and 990th smallest.
	if want := (pstats{500, 900, 990, 1000}); got != want {
		t.Errorf("percentiles = %+v, want %+v", got, want)
	}
	if one := percentiles([]float64{7}); one != (pstats{7, 7, 7, 7}) {
		t.Errorf("percentiles of one value = %+v", one)
	}
}

func TestThousands(t *testing.T) {
	for in, want := range map[float64]string{
		0: "0", 999: "999", 1000: "1 000", 20000: "20 000", 1234567: "1 234 567",
		-1500: "-1 500", 38610.4: "38 610", math.NaN(): "—",
	} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestSummarizeSkipsStalledRuns(t *testing.T) {
	runs := []Drain{{N: 100, Seconds: 1}, {N: 100, Stalled: "stuck"}, {N: 100, Seconds: 4}, {N: 100, Seconds: 2}}
	s := summarize(runs, validDrain, func(d Drain) float64 { return d.Seconds })
	if s.valid != 3 || s.all != 4 || s.med != 2 || s.lo != 1 || s.hi != 4 {
		t.Errorf("summary = %+v", s)
	}
	if got := s.fmtRange(1); got != "2.0 (1.0–4.0)" {
		t.Errorf("fmtRange = %q", got)
	}
	if got := stalledNote(s); got != " (1 of 4 runs stalled)" {
		t.Errorf("stalledNote = %q", got)
	}
	none := summarize(runs[1:2], validDrain, func(d Drain) float64 { return d.Seconds })
	if none.fmt(0) != "—" || none.fmtRange(0) != "—" {
		t.Errorf("a summary without valid runs prints %q / %q", none.fmt(0), none.fmtRange(0))
	}
}

// TestMarkdownRatios: the ratios in the report come from the medians of
// the rows they name, and the best Python pool is the fastest one.
func TestMarkdownRatios(t *testing.T) {
	d := func(secs float64) Drain {
		return Drain{N: 1000, Seconds: secs, CPU: 20 * time.Millisecond, PeakRSS: 25e6, BrokerCPU: -1}
	}
	r := &Report{
		Options: Options{Reps: 3, Concurrency: 100},
		Machine: "test machine",
		Start:   time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC),
		Drains: []DrainGroup{{Broker: "Redis", Task: Noop, N: 1000, Rows: []DrainRow{
			{Kind: Celeriac, Label: Celeriac.label(100), Runs: []Drain{d(0.05), d(0.04), d(0.06)}}, // 20 000/s
			{Kind: Ceiling, Label: Ceiling.label(0), Runs: []Drain{d(0.04), d(0.04), d(0.04)}},     // 25 000/s
			{Kind: Batched, Label: Batched.label(0), Runs: []Drain{d(0.02), d(0.02), d(0.02)}},     // 50 000/s
			{Kind: Prefork, Label: Prefork.label(0), Runs: []Drain{d(1), d(1), d(1)}},              // 1 000/s
			{Kind: Solo, Label: Solo.label(0), Runs: []Drain{d(0.5), {N: 1000, Stalled: "x"}, d(0.5)}},
		}}},
	}
	var b bytes.Buffer
	r.Markdown(&b)
	out := b.String()
	for _, want := range []string{
		"| Redis | none | no-op | 20 000 | 2 000 (solo) | 25 000 | 50 000 | **10.00** | **0.80** | 0.40 |",
		"| Redis | none | no-op ×1 000 | Python solo | 0.500 (1 of 3 runs stalled) |",
		"Machine: test machine.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestSampleTree(t *testing.T) {
	// A child that burns CPU for a moment, then sleeps: the tree's CPU
	// and RSS include it.
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	time.Sleep(500 * time.Millisecond)
	self := sampleTree(os.Getpid())
	if self.rss <= 0 || self.cpu <= 0 {
		t.Fatalf("sampleTree(self) = %+v", self)
	}
	if !slices.Contains(treePIDs(os.Getpid()), cmd.Process.Pid) {
		t.Fatalf("treePIDs(self) = %v lacks the child %d", treePIDs(os.Getpid()), cmd.Process.Pid)
	}
	child := sampleTree(cmd.Process.Pid)
	if child.rss <= 0 {
		t.Fatalf("child's RSS = %d", child.rss)
	}
	if gone := sampleTree(1 << 30); gone != (procSample{}) {
		t.Errorf("a process that does not exist reads as %+v", gone)
	}
}

func TestHopeless(t *testing.T) {
	const limit = 180 * time.Second
	for _, tc := range []struct {
		elapsed  time.Duration
		done, n  int
		hopeless bool
	}{
		{5 * time.Second, 0, 100, false},     // too early to tell
		{11 * time.Second, 0, 100, true},     // nothing at all
		{11 * time.Second, 50, 100, false},   // 22 s projected
		{11 * time.Second, 5, 100, true},     // 220 s projected
		{181 * time.Second, 99, 100, true},   // past the limit
		{100 * time.Second, 100, 100, false}, // done
	} {
		if got := hopeless(tc.elapsed, limit, tc.done, tc.n) != ""; got != tc.hopeless {
			t.Errorf("hopeless(%v, %d of %d) = %v, want %v", tc.elapsed, tc.done, tc.n, got, tc.hopeless)
		}
	}
}

// TestOTLPSink: the sink answers an OTLP/HTTP export as a collector does
// (200, protobuf), so a traced worker's exporter reports no error.
func TestOTLPSink(t *testing.T) {
	s, err := startOTLPSink()
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	resp, err := http.Post(s.url+"/v1/traces", "application/x-protobuf", strings.NewReader("\x0a\x00"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-protobuf" {
		t.Fatalf("sink answered %s %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	if s.requests.Load() != 1 || s.bytes.Load() != 2 {
		t.Fatalf("sink counted %d requests, %d bytes", s.requests.Load(), s.bytes.Load())
	}
}
