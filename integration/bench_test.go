package integration

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestBenchCommand runs `celeriac bench` small, on both brokers, with every
// worker and section: the benchmark anyone can rerun must keep working. It
// checks the report, not the figures (CI machines are noisy): every row
// ran, celeriac and the ceiling never stalled, and the ratios are numbers.
// The benchmark gets Redis dbs 8 and 4 (--redis-dbs), which must be empty,
// and the queue bench_q; it leaves them empty.
func TestBenchCommand(t *testing.T) {
	bin := celeriacBin(t)
	args := []string{"bench",
		"--redis", redisURL(t), "--redis-dbs", "8,4", "--amqp", amqpURL(t), "--python", pythonBin(t),
		"-n", "300", "--reps", "1", "--tasks", "noop", "--latency", "40",
		"--sweep", "1,100", "--sweep-tasks", "200", "--eta", "200",
		"--workers", "celeriac,ceiling,ceiling-batched,solo", "--stall", "15s", "--timeout", "60s"}
	cmd := exec.Command(bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("celeriac bench: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), out)
	}
	t.Logf("celeriac bench took %v", time.Since(start).Round(time.Second))
	report := string(out)
	for _, section := range []string{"## Drain", "Ratios, from the medians above", "## Round trip", "## Concurrency", "## Held ETA tasks", "Machine: "} {
		if !strings.Contains(report, section) {
			t.Errorf("report lacks %q", section)
		}
	}
	// 2 brokers x 2 result settings x 4 workers drain rows; celeriac's and
	// the ceilings' with a rate (Python's solo pool may stall on RabbitMQ,
	// as perf-anchors.md reports, and is then shown as stalled).
	drainRow := regexp.MustCompile(`(?m)^\| (Redis|RabbitMQ) \| (none|Redis) \| no-op ×300 \| [^|]+ \|`)
	if n := len(drainRow.FindAllString(report, -1)); n != 16 {
		t.Errorf("%d drain rows, want 16:\n%s", n, report)
	}
	goRow := regexp.MustCompile(`(?m)^\| (Redis|RabbitMQ) \| (none|Redis) \| no-op ×300 \| (celeriac|ceiling)[^|]* \| [0-9.]+[^|]* \| [0-9 ]+ \|`)
	if n := len(goRow.FindAllString(report, -1)); n != 12 {
		t.Errorf("%d celeriac and ceiling drain rows with figures, want 12:\n%s", n, report)
	}
	// celeriac against the ceiling, per variant, as a number.
	ratioRow := regexp.MustCompile(`(?m)^\| (Redis|RabbitMQ) \| (none|Redis) \| no-op \| [0-9 ]+ \| [^|]+ \| [0-9 ]+ \| [0-9 ]+ \| [^|]+ \| \*\*[0-9.]+\*\* \| [0-9.]+ \|$`)
	if n := len(ratioRow.FindAllString(report, -1)); n != 4 {
		t.Errorf("%d ratio rows, want 4:\n%s", n, report)
	}
	for _, line := range strings.Split(report, "\n") {
		if strings.Contains(line, "celeriac") && strings.Contains(line, "stalled") {
			t.Errorf("celeriac stalled: %s", line)
		}
		if strings.Contains(line, "ceiling") && strings.Contains(line, "stalled") {
			t.Errorf("the ceiling stalled: %s", line)
		}
	}
	// Round trips: 2 clients x 2 brokers x 4 workers.
	latRow := regexp.MustCompile(`(?m)^\| (Redis|RabbitMQ) \| (AsyncResult\.get\(\)|own subscriber) \| [^|]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|`)
	if n := len(latRow.FindAllString(report, -1)); n != 16 {
		t.Errorf("%d round-trip rows, want 16:\n%s", n, report)
	}
	// Held ETA tasks: celeriac's bytes per task on both brokers.
	etaRow := regexp.MustCompile(`(?m)^\| (Redis|RabbitMQ) \| celeriac -c 100 \| [0-9.]+ \| [0-9.]+ \| [0-9 ]+ \|`)
	if n := len(etaRow.FindAllString(report, -1)); n != 2 {
		t.Errorf("%d celeriac ETA rows with figures, want 2:\n%s", n, report)
	}
}
