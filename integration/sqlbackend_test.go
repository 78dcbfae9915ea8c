package integration

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	sqlbackend "github.com/celeriac/celeriac/backend/sql"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	"github.com/celeriac/celeriac/worker"
)

// Python Celery 5.2.6 with Celery's SQLAlchemy database backend
// (python3-sqlalchemy, python3-psycopg2) on the PostgreSQL of .ci/setup.
// Each test keeps its tables in a schema of its own (database_table_schemas
// on both sides), dropped at the end; queues are named it_sql_*.

// pgURL returns the test database: $CELERIAC_POSTGRES_URL or the local one
// .ci/setup creates.
func pgURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("CELERIAC_POSTGRES_URL"); u != "" {
		return u
	}
	const local = "postgres://celeriac:celeriac@127.0.0.1:5432/celeriac"
	if !reachable(local) {
		unavailable(t, "no PostgreSQL at 127.0.0.1:5432 and CELERIAC_POSTGRES_URL is unset")
	}
	return local
}

// dbPlus is pgURL as Celery's result_backend: db+postgresql+psycopg2://.
func dbPlus(t testing.TB) string {
	t.Helper()
	u := pgURL(t)
	_, rest, _ := strings.Cut(u, "://")
	return "db+postgresql+psycopg2://" + rest
}

// pgSchema creates a schema for the test and drops it (CASCADE) at the end.
func pgSchema(t testing.TB) string {
	t.Helper()
	name := "it_sql_" + strings.ToLower(rand.Text()[:10])
	pgExec(t, "CREATE SCHEMA "+name)
	t.Cleanup(func() { pgExec(t, "DROP SCHEMA "+name+" CASCADE") })
	return name
}

func pgExec(t testing.TB, sqls ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgURL(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	for _, q := range sqls {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// pgQuery returns the rows of a query as strings.
func pgQuery(t testing.TB, q string, args ...any) [][]string {
	t.Helper()
	return pgQueryURL(t, pgURL(t), q, args...)
}

// pgQueryURL is pgQuery on the database at url.
func pgQueryURL(t testing.TB, url, q string, args ...any) [][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var out [][]string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		row := make([]string, len(vals))
		for i, v := range vals {
			row[i] = fmt.Sprint(v)
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// sqlEnv is the environment of testdata/py/it_sql.py.
func sqlEnv(t testing.TB, schema, queue string) map[string]string {
	return map[string]string{"IT_BROKER": amqpURL(t), "IT_DB": dbPlus(t), "IT_SCHEMA": schema, "IT_QUEUE": queue}
}

func pySQL(t *testing.T, timeout time.Duration, env map[string]string, fn string, args ...string) []map[string]any {
	t.Helper()
	out := runPython(t, timeout, env, "import sys, it_sql; getattr(it_sql, sys.argv[1])(*sys.argv[2:])", append([]string{fn}, args...)...)
	return parseLines(t, out)
}

// sqlHandlers are the Go side of it_sql's tasks.
func sqlHandlers() *worker.Mux {
	mux := worker.NewMux()
	mux.HandleFunc("it_sql.add", func(ctx context.Context, t *worker.Task) (any, error) {
		var x, y int64
		if err := t.Bind(&x, &y); err != nil {
			return nil, err
		}
		return x + y, nil
	})
	mux.HandleFunc("it_sql.tsum", func(ctx context.Context, t *worker.Task) (any, error) {
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
	mux.HandleFunc("it_sql.fail", func(ctx context.Context, t *worker.Task) (any, error) {
		var msg string
		if err := t.Bind(&msg); err != nil {
			return nil, err
		}
		return nil, worker.NewException("ValueError", msg, int64(42))
	})
	mux.HandleFunc("it_sql.values", func(ctx context.Context, t *worker.Task) (any, error) {
		return map[string]any{
			"int": int64(-7), "big": uint64(1) << 63, "float": 1.5, "str": "héllo ✓", "bytes": []byte{0, 255},
			"list": []any{int64(1), nil, true}, "dict": map[string]any{"a": "b"},
			"when": time.Date(2026, 12, 2, 7, 0, 0, 123456000, time.UTC),
		}, nil
	})
	return mux
}

// sqlWorker runs a celeriac worker on queue with a SQLAlchemy backend in
// schema until the test ends.
func sqlWorker(t *testing.T, schema, queue, hostname string) *sqlbackend.Backend {
	t.Helper()
	return sqlWorkerConfig(t, sqlbackend.Config{
		URL: dbPlus(t), Extended: true,
		TableSchemas: map[string]string{"task": schema, "group": schema},
	}, sqlHandlers(), hostname, queue)
}

// sqlWorkerConfig runs a celeriac worker on queues with the backend cfg
// configures until the test ends.
func sqlWorkerConfig(t *testing.T, cfg sqlbackend.Config, mux *worker.Mux, hostname string, queues ...string) *sqlbackend.Backend {
	t.Helper()
	be, err := sqlbackend.New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("sql backend: %v", err)
	}
	tr, _ := amqpTransport(t, amqptransport.Config{})
	deleteAMQP(t, queues...)
	w, err := worker.New(tr, mux, worker.Config{
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), Queues: queues, Concurrency: 8, Backend: be, ResultExtended: true, Hostname: hostname,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := w.Run(ctx); err != nil {
			t.Errorf("worker Run: %v", err)
		}
	})
	t.Cleanup(func() {
		stop()
		wg.Wait()
		_ = be.Close()
	})
	return be
}

// TestSQLAlchemyBackendPythonClient: Python Celery sends tasks to a
// celeriac worker and reads every result back through Celery's own
// DatabaseBackend: values, state, traceback, date_done, the extended
// fields, a failure, a chain, a group and a chord of 20.
func TestSQLAlchemyBackendPythonClient(t *testing.T) {
	schema, queue := pgSchema(t), "it_sql_q_"+strings.ToLower(rand.Text()[:8])
	sqlWorker(t, schema, queue, "celeriac@it-sql")
	lines := pySQL(t, 3*time.Minute, sqlEnv(t, schema, queue), "client", "get,values,failure,chain,group,chord,chordfail")
	t.Logf("python: %v", lines)
	steps := map[string]map[string]any{}
	for _, l := range lines {
		steps[fmt.Sprint(l["step"])] = l
	}
	get := steps["get"]
	if get["value"] != float64(5) || get["state"] != "SUCCESS" || get["name"] != "it_sql.add" ||
		get["worker"] != "celeriac@it-sql" || get["queue"] != queue || get["retries"] != float64(0) ||
		mustJSON(get["args"]) != "[2,3]" || mustJSON(get["kwargs"]) != "{}" || get["traceback"] != nil {
		t.Errorf("get: %v", get)
	}
	if d, _ := get["date_done"].([]any); len(d) != 2 || d[0] != "datetime" {
		t.Errorf("date_done = %v, want a datetime", get["date_done"])
	} else if done, err := time.Parse("2006-01-02T15:04:05.999999", fmt.Sprint(d[1])); err != nil || time.Since(done) > 5*time.Minute || time.Since(done) < -time.Minute {
		t.Errorf("date_done = %v (%v), want a naive UTC time of the last minutes", d[1], err)
	}
	wantValues := `{'big': 9223372036854775808, 'bytes': b'\x00\xff', 'dict': {'a': 'b'}, 'float': 1.5, 'int': -7, 'list': [1, None, True], 'str': 'héllo ✓', 'when': datetime.datetime(2026, 12, 2, 7, 0, 0, 123456)}`
	if v := steps["values"]; v["value"] != wantValues {
		t.Errorf("values: Python read\n%v\nwant\n%v", v["value"], wantValues)
	}
	f := steps["failure"]
	if f["state"] != "FAILURE" || mustJSON(f["result"]) != `["ValueError",["bad thing",42]]` ||
		mustJSON(f["raised"]) != `["ValueError",["bad thing",42]]` || !strings.Contains(fmt.Sprint(f["traceback"]), "ValueError") {
		t.Errorf("failure: %v", f)
	}
	if c := steps["chain"]; c["value"] != float64(112) || c["parent"] != float64(12) || c["state"] != "SUCCESS" {
		t.Errorf("chain: %v", c)
	}
	if g := steps["group"]; mustJSON(g["value"]) != "[0,2,4,6,8,10,12,14,16,18]" || g["ready"] != true || mustJSON(g["states"]) != `["SUCCESS"]` {
		t.Errorf("group: %v", g)
	}
	// The chord's header runs here, and so does the celery.chord_unlock
	// the Python client sends to the body's queue: celeriac's built-in
	// reads the header's outcomes from celeriac_chord_part.
	if c := steps["chord"]; c["value"] != float64(380) || c["state"] != "SUCCESS" {
		t.Errorf("chord: %v", c)
	}
	// A failed header part fails the body with Celery's ChordError.
	if c := steps["chordfail"]; c["state"] != "FAILURE" || !strings.Contains(mustJSON(c["result"]), `ChordError`) ||
		!strings.Contains(mustJSON(c["result"]), `raised ValueError('header part', 42)`) {
		t.Errorf("chord with a failing header part: %v", c)
	}

	// celery.backend_cleanup (what celery beat sends daily) deletes the
	// results older than result_expires (1 day), here the adds of the group.
	pgExec(t, "UPDATE "+schema+".celery_taskmeta SET date_done = date_done - interval '3 days' WHERE task_id IN (SELECT task_id FROM "+
		schema+".celery_taskmeta WHERE name = 'it_sql.add' ORDER BY id LIMIT 5)")
	before := pgQuery(t, "SELECT count(*) FROM "+schema+".celery_taskmeta")[0][0]
	if c := pySQL(t, time.Minute, sqlEnv(t, schema, queue), "client", "cleanup")[0]; c["state"] != "SUCCESS" {
		t.Errorf("backend_cleanup: %v", c)
	}
	after := pgQuery(t, "SELECT count(*), count(*) FILTER (WHERE date_done < now() AT TIME ZONE 'utc' - interval '1 day') FROM "+schema+".celery_taskmeta")[0]
	var nb, na int
	fmt.Sscan(before, &nb)
	fmt.Sscan(after[0], &na)
	t.Logf("backend_cleanup: %d rows before, %d after (its own result included)", nb, na)
	if after[1] != "0" || na != nb-5+1 {
		t.Errorf("backend_cleanup: %d rows before, %d after, %s expired left; want 5 deleted and its own result added", nb, na, after[1])
	}
}

// TestSQLAlchemyBackendMixedWorkers: a Python worker and a celeriac worker
// consume the same queue and write to the same tables; the Python client
// reads all 40 results, and both workers ran some of them.
func TestSQLAlchemyBackendMixedWorkers(t *testing.T) {
	schema, queue := pgSchema(t), "it_sql_q_"+strings.ToLower(rand.Text()[:8])
	env := sqlEnv(t, schema, queue)
	startPythonWorker(t, env, "it_sql", "-Q", queue, "-c", "2", "-n", "py@it-sql", "--without-mingle", "--without-gossip")
	sqlWorker(t, schema, queue, "celeriac@it-sql")
	lines := pySQL(t, 3*time.Minute, env, "many", "40")
	results, _ := lines[0]["results"].([]any)
	if len(results) != 40 {
		t.Fatalf("python read %d results, want 40: %v", len(results), lines)
	}
	ran := map[string]int{}
	for i, r := range results {
		pair, _ := r.([]any)
		if len(pair) != 2 || pair[0] != float64(i+1000) {
			t.Errorf("result %d = %v, want %d", i, r, i+1000)
			continue
		}
		ran[fmt.Sprint(pair[1])]++
	}
	t.Logf("tasks run per worker: %v", ran)
	if ran["celeriac@it-sql"] == 0 || ran["py@it-sql"] == 0 || len(ran) != 2 {
		t.Errorf("tasks run per worker: %v, want both workers to run some", ran)
	}
}

// TestSQLAlchemyBackendTablesMatchCelery: the tables celeriac creates are
// the tables Celery's models create (SQLAlchemy's create_all), column by
// column, with the same constraints and sequences.
func TestSQLAlchemyBackendTablesMatchCelery(t *testing.T) {
	pySchema, goSchema := pgSchema(t), pgSchema(t)
	pySQL(t, time.Minute, sqlEnv(t, pySchema, "unused"), "create_tables")
	be, err := sqlbackend.New(t.Context(), sqlbackend.Config{
		URL: dbPlus(t), Extended: true, TableSchemas: map[string]string{"task": goSchema, "group": goSchema},
	})
	if err != nil {
		t.Fatal(err)
	}
	be.Close()
	describe := func(schema string) [][]string {
		cols := pgQuery(t, `SELECT table_name, column_name, data_type, coalesce(character_maximum_length, 0), is_nullable, coalesce(column_default, '')
			FROM information_schema.columns WHERE table_schema = $1 AND table_name LIKE 'celery_%' ORDER BY table_name, ordinal_position`, schema)
		cons := pgQuery(t, `SELECT tc.table_name, tc.constraint_type, kcu.column_name FROM information_schema.table_constraints tc
			JOIN information_schema.key_column_usage kcu ON tc.constraint_name = kcu.constraint_name AND tc.table_schema = kcu.table_schema
			WHERE tc.table_schema = $1 AND tc.table_name LIKE 'celery_%' ORDER BY 1, 2, 3`, schema)
		seqs := pgQuery(t, `SELECT sequence_name, data_type, start_value, increment FROM information_schema.sequences WHERE sequence_schema = $1 AND sequence_name NOT LIKE 'celeriac%' ORDER BY 1`, schema)
		return append(append(cols, cons...), seqs...)
	}
	py, gone := describe(pySchema), describe(goSchema)
	if len(py) < 10 {
		t.Fatalf("Celery created only %v", py)
	}
	if mustJSON(py) != mustJSON(gone) {
		t.Errorf("tables differ:\nCelery:   %v\nceleriac: %v", py, gone)
	}
}

// TestSQLAlchemyBackendChordMixedWorkers: a chord of 20 whose header a
// Python worker and a celeriac worker share; its body, and so the
// celery.chord_unlock the client sends with it, go to a queue only the
// Python worker consumes. Celery's chord_unlock reads every header result,
// the pickles celeriac wrote included, and fires the body once.
func TestSQLAlchemyBackendChordMixedWorkers(t *testing.T) {
	schema, queue := pgSchema(t), "it_sql_q_"+strings.ToLower(rand.Text()[:8])
	bodyQueue := queue + "_body"
	env := sqlEnv(t, schema, queue)
	env["IT_BODY_QUEUE"] = bodyQueue
	deleteAMQP(t, bodyQueue)
	startPythonWorker(t, env, "it_sql", "-Q", queue+","+bodyQueue, "-c", "2", "-n", "py@it-sql", "--without-mingle", "--without-gossip")
	sqlWorker(t, schema, queue, "celeriac@it-sql")
	for range 2 {
		c := pySQL(t, 3*time.Minute, env, "client", "chord")[0]
		if c["value"] != float64(380) || c["state"] != "SUCCESS" {
			t.Errorf("chord: %v", c)
		}
		t.Logf("header workers: %v", c["header_workers"])
	}
	workers := pgQuery(t, "SELECT worker, count(*) FROM "+schema+".celery_taskmeta WHERE name = 'it_sql.add' GROUP BY worker ORDER BY worker")
	t.Logf("header tasks per worker: %v", workers)
	if len(workers) != 2 {
		t.Errorf("header tasks per worker: %v, want both workers", workers)
	}
	bodies := pgQuery(t, "SELECT count(*) FROM "+schema+".celery_taskmeta WHERE name = 'it_sql.tsum'")
	if bodies[0][0] != "2" {
		t.Errorf("%s chord bodies ran, want 2 (one per chord)", bodies[0][0])
	}
}
