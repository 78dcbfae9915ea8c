package integration

import (
	"context"
	"crypto/rand"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	sqlbackend "github.com/celeriac/celeriac/backend/sql"
	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
)

// TestSQLAlchemyBackendGoClient: a Go caller with results in Celery's
// SQLAlchemy tables, against a Python Celery worker and a celeriac worker
// sharing a queue, each also with a queue of its own. Get waits on rows
// either worker writes (NOTIFY from celeriac, the fallback poll for
// Python's) and decodes their pickles: values of every type the
// restricted decoder reads, exceptions as TaskError. A chord built in Go
// is completed by celery.chord_unlock, which the client sends as
// Celery's fallback_chord_unlock does and whichever worker takes it runs
// (celeriac's reads the header results Python stored as pickles). Forget
// deletes the row.
func TestSQLAlchemyBackendGoClient(t *testing.T) {
	suffix := strings.ToLower(rand.Text()[:8])
	schema, queue := pgSchema(t), "it_sql_q_"+suffix
	pyQueue, goQueue := "it_sql_py_"+suffix, "it_sql_go_"+suffix
	env := sqlEnv(t, schema, queue)
	startPythonWorker(t, env, "it_sql", "-Q", queue+","+pyQueue, "-c", "2", "-n", "py@it-sql-go", "--without-mingle", "--without-gossip")
	deleteAMQP(t, pyQueue)
	sqlWorkerConfig(t, sqlbackend.Config{
		URL: dbPlus(t), Extended: true,
		TableSchemas: map[string]string{"task": schema, "group": schema},
	}, sqlHandlers(), "celeriac@it-sql-go", queue, goQueue)

	be, err := sqlbackend.New(t.Context(), sqlbackend.Config{
		URL: dbPlus(t), TableSchemas: map[string]string{"task": schema, "group": schema},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	tr, _ := amqpTransport(t, amqptransport.Config{})
	c := client.New(tr, client.Config{Backend: be, DefaultQueue: queue})
	ctx := t.Context()
	get := func(r *client.AsyncResult) (any, error) {
		t.Helper()
		gctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		v, err := r.Get(gctx)
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Get(%s): no result in 90s", r.ID)
		}
		return v, err
	}
	send := func(name string, args []any, opts ...client.SendOption) *client.AsyncResult {
		t.Helper()
		r, err := c.Send(ctx, name, args, nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	worker := func(id string) string {
		t.Helper()
		rows := pgQuery(t, "SELECT worker FROM "+schema+".celery_taskmeta WHERE task_id = $1", id)
		if len(rows) != 1 {
			t.Fatalf("task %s: %d rows", id, len(rows))
		}
		return rows[0][0]
	}
	add := func(x, y int) client.Signature { return client.NewSignature("it_sql.add", []any{x, y}, nil) }

	// Sums on each worker's own queue, then on the shared one.
	for _, w := range []struct{ queue, worker string }{{pyQueue, "py@it-sql-go"}, {goQueue, "celeriac@it-sql-go"}, {queue, ""}} {
		for i := range 3 {
			r := send("it_sql.add", []any{i, 2}, client.Queue(w.queue))
			if v, err := get(r); err != nil || v != int64(i+2) {
				t.Fatalf("add(%d, 2) on %s = %#v, %v; want %d", i, w.queue, v, err, i+2)
			}
			if got := worker(r.ID); w.worker != "" && got != w.worker {
				t.Errorf("add on %s ran on %s, want %s", w.queue, got, w.worker)
			}
		}
	}

	// Every type the decoder reads, pickled by Python's worker.
	v, err := get(send("it_sql.pyvalues", nil, client.Queue(pyQueue)))
	if err != nil {
		t.Fatalf("pyvalues: %v", err)
	}
	want := map[string]any{
		"int": int64(-7), "big": new(big.Int).Lsh(big.NewInt(1), 70), "float": 1.5, "str": "héllo ✓",
		"bytes": []byte{0, 0xff}, "tuple": []any{int64(1), "a"}, "set": []any{int64(3)}, "none": nil,
		"list": []any{true, false}, "when": time.Date(2026, 12, 2, 7, 0, 0, 123456000, time.UTC),
		"aware": time.Date(2026, 12, 2, 7, 0, 0, 0, time.FixedZone("", 5*3600+1800)),
		"day":   protocol.Date{Year: 2024, Month: 2, Day: 29}, "clock": protocol.TimeOfDay{Hour: 23, Minute: 59, Second: 1},
		"amount": protocol.Decimal("-12.50"), "id": protocol.UUID{0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78},
		"keys": map[string]any{"1": "int key", "null": "none key"},
	}
	if diff := cmp.Diff(want, v, sqlValueCmp); diff != "" {
		t.Errorf("Python's values read in Go (-want +got):\n%s", diff)
	}
	// The same through celeriac's encoder (a UUID is written as its text).
	v, err = get(send("it_sql.values", nil, client.Queue(goQueue)))
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	want = map[string]any{
		"int": int64(-7), "big": new(big.Int).Lsh(big.NewInt(1), 63), "float": 1.5, "str": "héllo ✓", "bytes": []byte{0, 255},
		"list": []any{int64(1), nil, true}, "dict": map[string]any{"a": "b"},
		"when": time.Date(2026, 12, 2, 7, 0, 0, 123456000, time.UTC),
	}
	if diff := cmp.Diff(want, v, sqlValueCmp); diff != "" {
		t.Errorf("celeriac's values read in Go (-want +got):\n%s", diff)
	}
	// A class outside the allow-list: stored by Python, never built here.
	v, err = get(send("it_sql.pyobject", nil, client.Queue(pyQueue)))
	if p, ok := v.(sqlbackend.PickledResult); err != nil || !ok || !errors.Is(p.Err, sqlbackend.ErrUnsafePickle) || !strings.Contains(p.Err.Error(), "fractions.Fraction") {
		t.Errorf("pyobject = %#v, %v; want a PickledResult refusing fractions.Fraction", v, err)
	}

	// Chords of 20: celery.chord_unlock goes to the body's queue. On
	// celeriac's queue it reads the header results Python's worker stored
	// (pickles in celery_taskmeta); on Python's it reads celeriac's; on
	// the shared queue the header is split between the workers, and so
	// may the chord_unlock retries be.
	for _, ch := range []struct{ header, body, bodyWorker string }{
		{pyQueue, goQueue, "celeriac@it-sql-go"}, {goQueue, pyQueue, "py@it-sql-go"}, {queue, queue, ""}, {queue, queue, ""},
	} {
		var header []client.Signature
		for i := range 20 {
			header = append(header, client.NewSignature("it_sql.add", []any{i, i}, nil, client.Queue(ch.header)))
		}
		r, err := c.Apply(ctx, client.Chord(header, client.NewSignature("it_sql.tsum", nil, nil, client.Queue(ch.body))))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := get(r); err != nil || v != int64(380) {
			t.Fatalf("chord of 20 on db+, header on %s, body on %s = %#v, %v; want 380", ch.header, ch.body, v, err)
		}
		if got := worker(r.ID); ch.bodyWorker != "" && got != ch.bodyWorker {
			t.Errorf("chord body on %s ran on %s, want %s", ch.body, got, ch.bodyWorker)
		}
	}
	workers := pgQuery(t, "SELECT worker, count(*) FROM "+schema+".celery_taskmeta WHERE name = 'it_sql.add' AND queue = $1 GROUP BY worker ORDER BY worker", queue)
	t.Logf("shared-queue add tasks per worker: %v", workers)
	if len(workers) != 2 {
		t.Errorf("shared-queue add tasks per worker: %v, want both workers", workers)
	}

	// Each step gets the one before's result as its first argument.
	plus := func(y int) client.Signature { return client.NewSignature("it_sql.add", []any{y}, nil) }
	r, err := c.Apply(ctx, client.Chain(add(1, 2), plus(3), plus(4)))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := get(r); err != nil || v != int64(10) {
		t.Fatalf("chain = %#v, %v; want 10", v, err)
	}

	// A failure from each worker: the exception dict, pickled, is a
	// TaskError with its type, module, arguments and traceback.
	for _, q := range []string{pyQueue, goQueue} {
		r := send("it_sql.fail", []any{"bad thing"}, client.Queue(q))
		_, err := get(r)
		var te *client.TaskError
		if !errors.As(err, &te) {
			t.Fatalf("Get of a failure on %s = %v, want a TaskError", q, err)
		}
		if te.State != protocol.StateFailure || te.Type != "ValueError" || te.Module != "builtins" || te.TaskID != r.ID ||
			!cmp.Equal(te.Args, []any{"bad thing", int64(42)}) || !strings.Contains(te.Traceback, "ValueError") {
			t.Errorf("failure on %s: %+v", q, te)
		}
		if err := r.Forget(ctx); err != nil {
			t.Fatal(err)
		}
		if st, err := r.State(ctx); err != nil || st != protocol.StatePending {
			t.Fatalf("State after Forget = %s, %v; want PENDING", st, err)
		}
	}
}

// sqlValueCmp compares decoded values: big integers by value, times by
// instant and offset.
var sqlValueCmp = cmp.Options{
	cmp.Comparer(func(a, b *big.Int) bool { return a.Cmp(b) == 0 }),
	cmp.Comparer(func(a, b time.Time) bool {
		_, oa := a.Zone()
		_, ob := b.Zone()
		return a.Equal(b) && oa == ob
	}),
}
