package integration

import (
	"context"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sqlbackend "github.com/celeriac/celeriac/backend/sql"
	"github.com/celeriac/celeriac/worker"
)

// A small Django project (testdata/django: Debian's python3-django 3.2 and
// python3-django-celery-results 2.4) migrates its tables into a schema of
// the test database, then sends tasks to a celeriac worker whose result
// backend is django-db.

// djangoEnv is the environment of testdata/django/dj_client.py and of its
// Celery worker.
func djangoEnv(t *testing.T, schema, queue string) map[string]string {
	t.Helper()
	dir, err := filepath.Abs("testdata/django")
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"DJANGO_DB": pgURL(t) + "?search_path=" + schema, "BROKER": amqpURL(t), "QUEUE": queue,
		"PYTHONPATH": dir, "DJANGO_SETTINGS_MODULE": "djproj.settings",
	}
}

func pyDjango(t *testing.T, timeout time.Duration, env map[string]string, fn string, args ...string) []map[string]any {
	t.Helper()
	out := runPython(t, timeout, env, "import sys, dj_client; getattr(dj_client, sys.argv[1])(*sys.argv[2:])", append([]string{fn}, args...)...)
	return parseLines(t, out)
}

// djangoHandlers are the Go side of djproj's tasks; bodies counts the runs
// of it_dj.tsum (chord bodies).
func djangoHandlers(bodies *atomic.Int64) *worker.Mux {
	mux := worker.NewMux()
	mux.HandleFunc("it_dj.add", func(ctx context.Context, t *worker.Task) (any, error) {
		var x, y int64
		if err := t.Bind(&x, &y); err != nil {
			return nil, err
		}
		return x + y, nil
	})
	mux.HandleFunc("it_dj.tsum", func(ctx context.Context, t *worker.Task) (any, error) {
		bodies.Add(1)
		var xs []int64
		if err := t.Bind(&xs); err != nil {
			return nil, err
		}
		var s int64
		for _, x := range xs {
			s += x
		}
		return s, nil
	})
	mux.HandleFunc("it_dj.fail", func(ctx context.Context, t *worker.Task) (any, error) {
		var msg string
		if err := t.Bind(&msg); err != nil {
			return nil, err
		}
		return nil, worker.NewException("ValueError", msg, int64(42))
	})
	return mux
}

func djangoSetup(t *testing.T) (schema, queue string, env map[string]string) {
	t.Helper()
	schema, queue = pgSchema(t), "it_sql_dj_"+strings.ToLower(rand.Text()[:8])
	env = djangoEnv(t, schema, queue)
	got := pyDjango(t, 2*time.Minute, env, "migrate")
	if len(got) != 1 || got[0]["migrated"] != true {
		t.Fatalf("migrate: %v", got)
	}
	if v, _ := got[0]["celery"].(string); !strings.HasPrefix(v, celeryVersion()+".") {
		t.Fatalf("the Django project runs Celery %v, want %s: %v", v, celeryVersion(), got)
	}
	t.Logf("Celery %v, Django %v, django-celery-results %v", got[0]["celery"], got[0]["django"], got[0]["django_celery_results"])
	return schema, queue, env
}

// TestDjangoBackendPythonClient: AsyncResult.get() through django-db, the
// ORM's TaskResult rows, a failure, a chord of 20 counted in
// django-celery-results' ChordCounter by the celeriac worker, and the admin
// changelist listing every task.
func TestDjangoBackendPythonClient(t *testing.T) {
	schema, queue, env := djangoSetup(t)
	var bodies atomic.Int64
	sqlWorkerConfig(t, sqlbackend.Config{URL: pgURL(t) + "?search_path=" + schema, Schema: sqlbackend.Django, Extended: true},
		djangoHandlers(&bodies), "celeriac@it-dj", queue)
	lines := pyDjango(t, 3*time.Minute, env, "client", "get,failure,chord,admin")
	t.Logf("python: %v", lines)
	steps := map[string]map[string]any{}
	for _, l := range lines {
		steps[fmt.Sprint(l["step"])] = l
	}
	get := steps["get"]
	row, _ := get["row"].(map[string]any)
	if get["value"] != float64(5) || get["state"] != "SUCCESS" || row["status"] != "SUCCESS" || row["result"] != "5" ||
		row["worker"] != "celeriac@it-dj" || row["task_name"] != "it_dj.add" || row["task_args"] != `"(2, 3)"` ||
		row["task_kwargs"] != `"{}"` || row["content_type"] != "application/json" || row["meta"] != `{"children": []}` {
		t.Errorf("get: %v", get)
	}
	f := steps["failure"]
	frow, _ := f["row"].(map[string]any)
	if f["state"] != "FAILURE" || mustJSON(f["result"]) != `["ValueError",["bad thing",42]]` ||
		!strings.Contains(fmt.Sprint(f["traceback"]), "ValueError") || frow["status"] != "FAILURE" ||
		frow["result"] != `{"exc_message": ["bad thing", 42], "exc_module": "builtins", "exc_type": "ValueError"}` {
		t.Errorf("failure: %v", f)
	}
	if c := steps["chord"]; c["value"] != float64(380) || c["state"] != "SUCCESS" || c["counters"] != float64(0) {
		t.Errorf("chord: %v", c)
	}
	if n := bodies.Load(); n != 1 {
		t.Errorf("the chord body ran %d times, want once", n)
	}
	a := steps["admin"]
	if a["status"] != float64(200) || mustJSON(a["listed"]) != mustJSON(a["ids"]) {
		t.Errorf("admin changelist: %v", a)
	}
	if ids, _ := a["ids"].([]any); len(ids) < 22 {
		t.Errorf("admin: %d task results, want the 22 tasks of this test", len(ids))
	}
}

// TestDjangoBackendChordMixedWorkers: a Python worker and a celeriac worker
// share the header of a chord of 20 (one queue); the ChordCounter is
// decremented by both, and the body, routed to a queue only celeriac
// consumes, runs exactly once with every header result.
func TestDjangoBackendChordMixedWorkers(t *testing.T) {
	schema, queue, env := djangoSetup(t)
	bodyQueue := queue + "_body"
	env["BODY_QUEUE"] = bodyQueue
	startPythonWorker(t, env, "djproj", "-Q", queue, "-c", "2", "-n", "py@it-dj", "--without-mingle", "--without-gossip")
	var bodies atomic.Int64
	sqlWorkerConfig(t, sqlbackend.Config{URL: pgURL(t) + "?search_path=" + schema, Schema: sqlbackend.Django, Extended: true},
		djangoHandlers(&bodies), "celeriac@it-dj", queue, bodyQueue)
	for range 3 {
		lines := pyDjango(t, 3*time.Minute, env, "client", "chord")
		if c := lines[0]; c["value"] != float64(380) || c["state"] != "SUCCESS" || c["counters"] != float64(0) {
			t.Errorf("chord: %v", c)
		}
	}
	if n := bodies.Load(); n != 3 {
		t.Errorf("3 chord bodies ran %d times", n)
	}
	workers := pgQuery(t, "SELECT worker, count(*) FROM "+schema+".django_celery_results_taskresult WHERE task_name = 'it_dj.add' GROUP BY worker ORDER BY worker")
	t.Logf("header tasks per worker: %v", workers)
	if len(workers) != 2 {
		t.Errorf("header tasks per worker: %v, want both workers", workers)
	}
}
