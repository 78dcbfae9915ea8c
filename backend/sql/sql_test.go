package sql

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/backendtest"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// testSchema creates a schema no other test uses and drops it (with the
// tables in it) when the test ends.
func testSchema(t testing.TB) string {
	t.Helper()
	name := "bt_sql_" + strings.ToLower(rand.Text()[:10])
	execSQL(t, "CREATE SCHEMA "+name)
	t.Cleanup(func() { execSQL(t, "DROP SCHEMA "+name+" CASCADE") })
	return name
}

// execSQL runs statements on a connection of its own.
func execSQL(t testing.TB, sqls ...string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, transporttest.PostgresURL(t))
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

// newSQLAlchemy returns a backend whose tables live in a fresh schema.
func newSQLAlchemy(t testing.TB, cfg Config) *Backend {
	t.Helper()
	schema := testSchema(t)
	cfg.URL = "db+postgresql+psycopg2" + strings.TrimPrefix(transporttest.PostgresURL(t), "postgres")
	cfg.Schema = SQLAlchemy
	cfg.TableSchemas = map[string]string{"task": schema, "group": schema}
	b, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b
}

func TestConformanceSQLAlchemy(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		return newSQLAlchemy(t, Config{Extended: true})
	}, backendtest.Features{
		Chords:   true,
		Unstored: []string{"Children", "GroupID", "ParentID"},
	})
}

// newDjango returns a backend on django-celery-results' tables, loaded
// from testdata/django_tables.sql into a fresh schema that the URL's
// search_path selects.
func newDjango(t testing.TB, cfg Config) (*Backend, string) {
	t.Helper()
	schema := testSchema(t)
	ddl, err := os.ReadFile("testdata/django_tables.sql")
	if err != nil {
		t.Fatal(err)
	}
	execSQL(t, strings.ReplaceAll(string(ddl), "SCHEMA.", schema+"."))
	cfg.URL = transporttest.PostgresURL(t) + "?search_path=" + schema
	cfg.Schema = Django
	b, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b, schema
}

func TestConformanceDjango(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		b, _ := newDjango(t, Config{Extended: true})
		return b
	}, backendtest.Features{
		Chords:         true,
		ChordSizeFirst: true,
		IndexedChords:  true,
		Unstored:       []string{"GroupID", "ParentID", "Args", "Kwargs", "Retries", "Queue"},
	})
}

// TestStoreRefusesTooLongTaskID: a value PostgreSQL refuses is an error
// marked ErrUnencodable (no retry can help), counted, and not retried.
func TestStoreRefusesTooLongTaskID(t *testing.T) {
	b := newSQLAlchemy(t, Config{})
	defer b.Close()
	id := strings.Repeat("x", maxTaskIDLen+1)
	err := b.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess}})
	if !errors.Is(err, protocol.ErrUnencodable) {
		t.Fatalf("Store of a %d-character id: err = %v, want ErrUnencodable", len(id), err)
	}
	if st := b.Stats(); st.StoreFailures != 1 || st.StoreRetries != 0 {
		t.Errorf("stats %+v, want one failure and no retry", st)
	}
}

// TestStoreColumns: the stored row holds exactly the pickle of the
// result and the JSON of args/kwargs that Celery's own backend writes.
func TestStoreColumns(t *testing.T) {
	b := newSQLAlchemy(t, Config{Extended: true})
	defer b.Close()
	m := &protocol.ResultMeta{TaskID: "bt-cols", Status: protocol.StateFailure, Traceback: "Traceback...",
		Result:   &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad"}, Module: "builtins"},
		DateDone: time.Date(2026, 12, 2, 7, 0, 0, 123456789, time.UTC), Extended: true, Name: "tasks.add",
		Args: []any{int64(2), "x"}, Kwargs: map[string]any{"k": true}, Worker: "w@h", Retries: 3, Queue: "q"}
	if err := b.Store(t.Context(), backend.StoreRequest{Meta: m}); err != nil {
		t.Fatal(err)
	}
	var (
		result, args, kwargs []byte
		done                 time.Time
		retries              int32
	)
	err := b.pool.QueryRow(t.Context(), "SELECT result, date_done, args, kwargs, retries FROM "+b.s.taskTable+" WHERE task_id = $1", m.TaskID).
		Scan(&result, &done, &args, &kwargs, &retries)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := EncodePickle(m.Result)
	if !bytes.Equal(result, want) {
		t.Errorf("result column %q, want %q", result, want)
	}
	if !done.Equal(time.Date(2026, 12, 2, 7, 0, 0, 123456000, time.UTC)) {
		t.Errorf("date_done %v, want microseconds of %v", done, m.DateDone)
	}
	if string(args) != `[2, "x"]` || string(kwargs) != `{"k": true}` || retries != 3 {
		t.Errorf("args %s kwargs %s retries %d", args, kwargs, retries)
	}
	got, err := b.Get(t.Context(), m.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	// The pickle reads back: Celery's exception dict as an ExceptionInfo.
	if diff := cmp.Diff(m.Result, got.Result); diff != "" {
		t.Errorf("Get: Result mismatch (-want +got):\n%s", diff)
	}
	// None is NULL, as PickleType stores it: Get says nil.
	if err := b.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "bt-none", Status: protocol.StateSuccess}}); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Get(t.Context(), "bt-none"); err != nil || got.Result != nil {
		t.Errorf("Get of a None result: %#v, %v", got, err)
	}
}

// TestGroupCommitIsolatesARefusedValue: stores written together in one
// transaction do not fail with a neighbour whose value PostgreSQL refuses.
func TestGroupCommitIsolatesARefusedValue(t *testing.T) {
	b := newSQLAlchemy(t, Config{})
	defer b.Close()
	const n = 200
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("bt-gc-%03d", i)
			if i%50 == 7 {
				id = strings.Repeat("y", maxTaskIDLen+i)
			}
			errs[i] = b.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess, Result: int64(i)}})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if i%50 == 7 {
			if !errors.Is(err, protocol.ErrUnencodable) {
				t.Errorf("store %d (id too long): err = %v, want ErrUnencodable", i, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("store %d: %v", i, err)
		} else if _, err := b.Get(t.Context(), fmt.Sprintf("bt-gc-%03d", i)); err != nil {
			t.Errorf("get %d: %v", i, err)
		}
	}
}

// TestUnlockChord: not ready until every listed part returned, then ready
// once for its claimant (again for the same claimant), ErrChordDone for
// any other.
func TestUnlockChord(t *testing.T) {
	b := newSQLAlchemy(t, Config{})
	defer b.Close()
	gid := "bt-unlock"
	ids := []string{"p0", "p1", "p2"}
	for i, id := range ids[:2] {
		if _, err := b.ChordPartReturn(t.Context(), backend.ChordPart{GroupID: gid, TaskID: id, State: protocol.StateSuccess, Result: int64(i * 10)}); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := b.UnlockChord(t.Context(), gid, ids, "u1"); err != nil || r.Ready {
		t.Fatalf("two of three parts: %+v, %v; want not ready", r, err)
	}
	if _, err := b.ChordPartReturn(t.Context(), backend.ChordPart{GroupID: gid, TaskID: "p2", State: protocol.StateFailure,
		Result: &protocol.ExceptionInfo{Type: "KeyError", Message: []any{"k"}, Module: "builtins"}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		r, err := b.UnlockChord(t.Context(), gid, ids, "u1")
		if err != nil || !r.Ready || len(r.Results) != 3 {
			t.Fatalf("all parts: %+v, %v", r, err)
		}
		if r.Results[1].Result != int64(10) || *r.Results[2].GroupIndex != 2 || r.Results[2].State != protocol.StateFailure {
			t.Errorf("results %+v", r.Results)
		}
		if e, ok := r.Results[2].Result.(*protocol.ExceptionInfo); !ok || e.Type != "KeyError" {
			t.Errorf("failed part's result %#v", r.Results[2].Result)
		}
	}
	if _, err := b.UnlockChord(t.Context(), gid, ids, "u2"); !errors.Is(err, backend.ErrChordDone) {
		t.Fatalf("another claimant: err = %v, want ErrChordDone", err)
	}
}

// TestCleanup deletes results older than ResultExpires and keeps newer ones
// (and those without date_done), on both schemas.
func TestCleanup(t *testing.T) {
	old, recent := time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour)
	for name, b := range map[string]*Backend{"sqlalchemy": newSQLAlchemy(t, Config{}), "django": func() *Backend { b, _ := newDjango(t, Config{}); return b }()} {
		t.Run(name, func(t *testing.T) {
			defer b.Close()
			for id, done := range map[string]time.Time{"old": old, "recent": recent} {
				if err := b.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess, DateDone: done}}); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: "running", Status: protocol.StateStarted}}); err != nil {
				t.Fatal(err)
			}
			if err := b.Cleanup(t.Context()); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Get(t.Context(), "old"); !errors.Is(err, backend.ErrNotFound) {
				t.Errorf("old result: err = %v, want ErrNotFound", err)
			}
			for _, id := range []string{"recent", "running"} {
				if _, err := b.Get(t.Context(), id); err != nil {
					t.Errorf("%s: %v", id, err)
				}
			}
		})
	}
}

// TestUnlockChordReadsTaskTable: a header task a Python worker ran has its
// outcome only in celery_taskmeta, as a pickle; UnlockChord reads it
// there, and waits on one that is not ready or that the decoder refuses.
func TestUnlockChordReadsTaskTable(t *testing.T) {
	b := newSQLAlchemy(t, Config{})
	defer b.Close()
	store := func(id string, st protocol.State, result any) {
		t.Helper()
		if err := b.Store(t.Context(), backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: id, Status: st, Result: result}}); err != nil {
			t.Fatal(err)
		}
	}
	gid := "bt-unlock-py"
	ids := []string{"q0", "q1", "q2"}
	if _, err := b.ChordPartReturn(t.Context(), backend.ChordPart{GroupID: gid, TaskID: "q0", State: protocol.StateSuccess, Result: "celeriac"}); err != nil {
		t.Fatal(err)
	}
	store("q1", protocol.StateSuccess, map[string]any{"from": "python", "n": int64(7)})
	store("q2", protocol.StateStarted, map[string]any{"pid": int64(1), "hostname": "py@h"})
	if r, err := b.UnlockChord(t.Context(), gid, ids, "u1"); err != nil || r.Ready {
		t.Fatalf("q2 started: %+v, %v; want not ready", r, err)
	}
	exc := &protocol.ExceptionInfo{Type: "KeyError", Message: []any{"k"}, Module: "builtins"}
	store("q2", protocol.StateFailure, exc)
	r, err := b.UnlockChord(t.Context(), gid, ids, "u1")
	if err != nil || !r.Ready {
		t.Fatalf("all ready: %+v, %v", r, err)
	}
	var got []any
	for i, p := range r.Results {
		if p.TaskID != ids[i] || p.GroupIndex == nil || *p.GroupIndex != i {
			t.Errorf("part %d: %+v", i, p)
		}
		got = append(got, p.State, p.Result)
	}
	want := []any{protocol.StateSuccess, "celeriac", protocol.StateSuccess, map[string]any{"from": "python", "n": int64(7)}, protocol.StateFailure, exc}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("UnlockChord results mismatch (-want +got):\n%s", diff)
	}

	// An application object Python pickled: not read, so not ready.
	// pickle.dumps(Thing(), 4) with Thing a class of __main__ and x = 1.
	obj, _ := hex.DecodeString("80049523000000000000008c085f5f6d61696e5f5f948c055468696e679493942981947d948c0178944b0173622e")
	execSQL(t, "INSERT INTO "+b.s.taskTable+" (id, task_id, status, result) VALUES (nextval("+quoteLiteral(b.s.taskSeq)+"), 'r0', 'SUCCESS', '\\x"+hex.EncodeToString(obj)+"')")
	m, err := b.Get(t.Context(), "r0")
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := m.Result.(PickledResult); !ok || !errors.Is(p.Err, ErrUnsafePickle) {
		t.Fatalf("Get(r0).Result = %#v; want a refused pickle", m.Result)
	}
	if r, err := b.UnlockChord(t.Context(), "bt-unlock-obj", []string{"r0"}, "u2"); err != nil || r.Ready {
		t.Fatalf("a refused pickle: %+v, %v; want not ready", r, err)
	}
}
