package connect_test

import (
	"context"
	"crypto/rand"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	sqlbackend "github.com/celeriac/celeriac/backend/sql"
	"github.com/celeriac/celeriac/transport/transporttest"
	"github.com/celeriac/celeriac/worker/connect"
)

// TestOpenSQLBackends: Celery's database result_backend strings open
// backend/sql; django-db needs DatabaseURL and tables Django migrated, and
// its errors never show the password.
func TestOpenSQLBackends(t *testing.T) {
	pg := transporttest.PostgresURL(t)
	schema := "bt_connect_" + strings.ToLower(rand.Text()[:8])
	conn, err := pgx.Connect(t.Context(), pg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	_, rest, _ := strings.Cut(pg, "://")

	for _, rb := range []string{"db+postgresql://" + rest, "db+postgresql+psycopg2://" + rest, "db+postgres://" + rest} {
		c, err := connect.Open(t.Context(), connect.Options{BrokerURL: "memory://", ResultBackend: rb,
			DatabaseTableSchemas: map[string]string{"task": schema, "group": schema}, ResultExtended: true})
		if err != nil {
			t.Fatalf("%s: %v", connect.Redact(rb), err)
		}
		if _, ok := c.Backend.(*sqlbackend.Backend); !ok {
			t.Errorf("%s: backend %T", connect.Redact(rb), c.Backend)
		}
		c.Close()
	}
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1", schema).Scan(&n); err != nil || n < 2 {
		t.Errorf("tables created in %s: %d (%v), want Celery's two and celeriac's chord tables", schema, n, err)
	}

	if _, err := connect.Open(t.Context(), connect.Options{BrokerURL: "memory://", ResultBackend: "django-db"}); err == nil || !strings.Contains(err.Error(), "CELERIAC_DATABASE_URL") {
		t.Errorf("django-db without a database URL: err = %v", err)
	}
	// The schema holds Celery's tables, not Django's: refused, pointing at
	// the migrations, password hidden.
	u, err := url.Parse(pg)
	if err != nil {
		t.Fatal(err)
	}
	pw, hasPW := u.User.Password()
	if !hasPW {
		t.Fatalf("the test database URL has no password to hide: %s", pg)
	}
	_, err = connect.Open(t.Context(), connect.Options{BrokerURL: "memory://", ResultBackend: "django-db",
		DatabaseURL: pg + "?search_path=" + schema})
	if err == nil || !strings.Contains(err.Error(), "migrate") {
		t.Fatalf("django-db on a database without Django's tables: err = %v", err)
	}
	if strings.Contains(err.Error(), ":"+pw+"@") {
		t.Errorf("error shows the password: %v", err)
	}
}
