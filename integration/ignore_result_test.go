package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/celeriac/celeriac/worker"
)

// TestIgnoreResultPrecedence pins a known difference: which ignore_result
// wins when the message and the task disagree. A task declared
// ignore_result=True (celeriac: worker.IgnoreResult(true)) is sent with
// send_task, which puts ignore_result: false in the message. Celery 5.2
// to 5.5 store nothing (either one saying so ignores the result); Celery
// 5.6.3 stores the result, the message's explicit value winning
// (celery/celery#10184). celeriac keeps 5.2–5.5's rule on every version:
// it cannot tell which Celery sent a message, and 5.2–5.5 producers send
// false for every apply_async unless told otherwise, so 5.6's rule would
// store the results of every ignore_result task they send. An explicit
// ignore_result=True in the message is obeyed everywhere.
func TestIgnoreResultPrecedence(t *testing.T) {
	bc := workerBrokers(t)[0] // Redis broker and results
	pyQ, goQ := uniqueQueue(t, bc), uniqueQueue(t, bc)
	pw := startPythonWorker(t, map[string]string{"IT_BROKER": bc.broker, "IT_BACKEND": bc.backend}, "it_ign_app",
		"-Q", pyQ, "-c", "1", "-P", "solo", "-n", "ign-"+pyQ+"@%h",
		"--without-heartbeat", "--without-mingle", "--without-gossip")
	gw := startGoWorker(t, bc, goQ, worker.Config{}, func(m *worker.Mux) {
		m.HandleFunc("it_ign.quiet", func(_ context.Context, t *worker.Task) (any, error) {
			var x int
			return x, t.Bind(&x)
		}, worker.IgnoreResult(true))
	})
	out := runPython(t, 90*time.Second, map[string]string{"IT_BROKER": bc.broker, "IT_BACKEND": bc.backend,
		"IT_PYQ": pyQ, "IT_GOQ": goQ}, `
import os, time, celery
app = celery.Celery(broker=os.environ["IT_BROKER"], backend=os.environ["IT_BACKEND"])
ids = []
for q in (os.environ["IT_PYQ"], os.environ["IT_GOQ"]):
    ids.append(app.send_task("it_ign.quiet", args=[7], queue=q).id)                      # message says false
    ids.append(app.send_task("it_ign.quiet", args=[8], queue=q, ignore_result=True).id)  # message says true
print("IDS", " ".join(ids))
`)
	ids := outputIDs(out)
	if len(ids) != 4 {
		t.Fatalf("python printed %q", out)
	}
	// No result to wait for: the workers' own records of the runs.
	deadline := time.Now().Add(60 * time.Second)
	for {
		goRuns := gw.ran("it_ign.quiet")
		pyRuns := strings.Count(pw.Log(), "succeeded in")
		if goRuns == 2 && pyRuns == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runs: celeriac %d, Python %d, want 2 each\n%s", goRuns, pyRuns, pw.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	states := resultStates(t, bc, ids)
	stored := func(id string) bool { return states[id] == "SUCCESS" }
	pyFalse, pyTrue, goFalse, goTrue := stored(ids[0]), stored(ids[1]), stored(ids[2]), stored(ids[3])
	t.Logf("IGNORE_RESULT celery-%s: message false -> stored %t, message true -> stored %t | celeriac: %t, %t",
		celeryVersion(), pyFalse, pyTrue, goFalse, goTrue)
	wantPy := celeryVersion() >= "5.6"
	if pyFalse != wantPy {
		t.Errorf("Python Celery %s stored the result of an ignore_result task sent with ignore_result: false: %t, want %t",
			celeryVersion(), pyFalse, wantPy)
	}
	if pyTrue || goTrue {
		t.Errorf("a result stored although the message says ignore_result: true (Python %t, celeriac %t)", pyTrue, goTrue)
	}
	if goFalse {
		t.Errorf("celeriac stored the result of a task registered IgnoreResult(true): the documented rule is 5.2–5.5's")
	}
}
