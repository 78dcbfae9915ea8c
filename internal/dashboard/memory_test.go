package dashboard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport/memory"
)

// memEvents is how many task events the memory test feeds the dashboard,
// and memLimitMiB the resident set it must stay under (peak, whole
// process). README's "Dashboard" section states the measured figures.
const (
	memEvents   = 100_000
	memLimitMiB = 64
)

// TestMemoryBound feeds 100 000 task events (received, started, then
// succeeded or failed with a traceback; args of about 200 bytes; 50 task
// names) through the dashboard's event path with the default history
// (--max-tasks 10000) in a child process of its own, and checks its peak
// resident set. A child, so that no other test's memory counts.
func TestMemoryBound(t *testing.T) {
	if os.Getenv("CELERIAC_DASH_MEM_CHILD") == "1" {
		memChild(t)
		return
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/self/status")
	}
	sizes := []int{10000, 100000}
	if raceEnabled {
		sizes = sizes[:1] // the figures that matter come from the run without -race
	}
	for _, maxTasks := range sizes {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMemoryBound$", "-test.count=1")
		cmd.Env = append(os.Environ(), "CELERIAC_DASH_MEM_CHILD=1", "CELERIAC_DASH_MEM_MAXTASKS="+strconv.Itoa(maxTasks))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("child: %v\n%s", err, out.String())
		}
		var rss, hwm, tasks int
		for _, line := range strings.Split(out.String(), "\n") {
			if rest, ok := strings.CutPrefix(line, "MEMORY "); ok {
				fmt.Sscanf(rest, "rss_kib=%d hwm_kib=%d tasks=%d", &rss, &hwm, &tasks)
			}
		}
		if hwm == 0 {
			t.Fatalf("no MEMORY line from the child:\n%s", out.String())
		}
		t.Logf("MEMORY max-tasks=%d: %d events, %d tasks kept, RSS %.1f MiB after, peak %.1f MiB",
			maxTasks, memEvents, tasks, float64(rss)/1024, float64(hwm)/1024)
		if tasks != min(maxTasks, memEvents/3+1) && tasks != min(maxTasks, memEvents/3) {
			t.Errorf("max-tasks=%d: %d tasks kept", maxTasks, tasks)
		}
		// The race detector's shadow memory roughly triples the figure:
		// under -race only a gross regression fails. .ci/test also runs
		// this test without -race.
		limit := memLimitMiB
		if raceEnabled {
			limit *= 4
		}
		if maxTasks == 10000 && hwm > limit*1024 {
			t.Errorf("peak RSS %.1f MiB, over the bound of %d MiB (race detector: %v)", float64(hwm)/1024, limit, raceEnabled)
		}
	}
}

func memChild(t *testing.T) {
	maxTasks, _ := strconv.Atoi(os.Getenv("CELERIAC_DASH_MEM_MAXTASKS"))
	tr := memory.New(memory.Config{})
	defer tr.Close()
	d, err := New(Options{Transport: tr, Control: &fakeControl{}, MaxTasks: maxTasks})
	if err != nil {
		t.Fatal(err)
	}
	args := "('" + strings.Repeat("payload-", 24) + "', 42, {'k': [1, 2, 3]})"
	trace := "Traceback (most recent call last):\n" + strings.Repeat("  File \"/app/tasks.py\", line 12, in run\n    do_it()\n", 8) + "ValueError: boom"
	ts := float64(time.Now().Unix())
	for i := 0; i < memEvents; i++ {
		n := i / 3
		id := fmt.Sprintf("%08x-0000-4000-8000-%012x", n, n)
		ev := map[string]any{"uuid": id, "hostname": "celery@worker-" + strconv.Itoa(n%8), "timestamp": ts + float64(i)/1000}
		switch i % 3 {
		case 0:
			ev["type"], ev["name"], ev["args"], ev["kwargs"] = "task-received", "tasks.name"+strconv.Itoa(n%50), args, "{'x': 1}"
		case 1:
			ev["type"] = "task-started"
		case 2:
			if n%10 == 0 {
				ev["type"], ev["exception"], ev["traceback"], ev["runtime"] = "task-failed", "ValueError('boom')", trace, 0.02
			} else {
				ev["type"], ev["result"], ev["runtime"] = "task-succeeded", "'ok'", 0.001*float64(n%100)
			}
		}
		body, _ := json.Marshal([]any{ev})
		d.ingest(protocol.Message{ContentType: "application/json", Body: body})
	}
	runtime.GC()
	debug.FreeOSMemory()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	var rss, hwm int
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "VmRSS:" {
			rss, _ = strconv.Atoi(f[1])
		}
		if len(f) >= 2 && f[0] == "VmHWM:" {
			hwm, _ = strconv.Atoi(f[1])
		}
	}
	fmt.Printf("MEMORY rss_kib=%d hwm_kib=%d tasks=%d\n", rss, hwm, d.store.Stats().Tasks)
}
