package sql

import (
	"context"
	"crypto/rand"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/backendtest"
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
		Unstored: []string{"Result", "Children", "GroupID", "ParentID"},
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
