package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/celeriac/celeriac/internal/redact"
)

// ResultStore is where a drain's results go.
type ResultStore string

// Result stores.
const (
	NoResults       ResultStore = "none"
	RedisResults    ResultStore = "redis"    // database RedisResultDB of RedisURL
	PostgresResults ResultStore = "postgres" // Celery's SQLAlchemy backend, database benchDatabase of PostgresURL
)

// ResultStores lists the valid ResultStore values.
var ResultStores = []ResultStore{NoResults, RedisResults, PostgresResults}

func (r ResultStore) on() bool { return r != NoResults && r != "" }

// benchDatabase is the PostgreSQL database the benchmark creates (if
// missing) and empties before every drain: celery_taskmeta and
// celery_tasksetmeta, created by the first worker, as Celery does. A run
// refuses to start when they hold rows (a previous run leaves them empty).
const benchDatabase = "celeriac_bench"

// pgResults is the PostgreSQL result database.
type pgResults struct {
	url  string // of benchDatabase
	conn *pgx.Conn
}

// newPGResults connects to PostgresURL, creates benchDatabase when missing
// and connects to it.
func newPGResults(ctx context.Context, admin string) (*pgResults, error) {
	dbURL, conn, err := openBenchDatabase(ctx, admin)
	if err != nil {
		return nil, err
	}
	p := &pgResults{url: dbURL, conn: conn}
	if n, err := p.rows(ctx); err != nil || n > 0 {
		p.conn.Close(ctx)
		if err == nil {
			err = fmt.Errorf("%w: database %s holds %d results in celery_taskmeta/celery_tasksetmeta, which the benchmark empties; delete them yourself or use another server (--postgres)", ErrInUse, benchDatabase, n)
		}
		return nil, err
	}
	return p, nil
}

// openBenchDatabase creates benchDatabase on the server of admin when it is
// missing, and connects to it: its URL and the connection.
func openBenchDatabase(ctx context.Context, admin string) (string, *pgx.Conn, error) {
	u, err := url.Parse(admin)
	if err != nil {
		return "", nil, fmt.Errorf("postgres URL: %w", redact.Error(err))
	}
	c, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", nil, fmt.Errorf("postgres: %w", err)
	}
	var exists bool
	err = c.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", benchDatabase).Scan(&exists)
	if err == nil && !exists {
		_, err = c.Exec(ctx, "CREATE DATABASE "+benchDatabase)
	}
	c.Close(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("postgres: create database %s: %w", benchDatabase, err)
	}
	u.Path = "/" + benchDatabase
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return "", nil, fmt.Errorf("postgres: %w", err)
	}
	return u.String(), conn, nil
}

// backendURL is result_backend for Python and celeriac alike.
func (p *pgResults) backendURL() string {
	_, rest, _ := strings.Cut(p.url, "://")
	return "db+postgresql+psycopg2://" + rest
}

func (p *pgResults) tableExists(ctx context.Context) (bool, error) {
	var ok bool
	err := p.conn.QueryRow(ctx, "SELECT to_regclass('celery_taskmeta') IS NOT NULL").Scan(&ok)
	return ok, err
}

// rows counts the rows of both result tables.
func (p *pgResults) rows(ctx context.Context) (int, error) {
	total := 0
	for _, table := range []string{"celery_taskmeta", "celery_tasksetmeta"} {
		var exists bool
		if err := p.conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil || !exists {
			return total, err
		}
		var n int
		if err := p.conn.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// stored counts the stored results.
func (p *pgResults) stored(ctx context.Context) (int, error) {
	if ok, err := p.tableExists(ctx); err != nil || !ok {
		return 0, err
	}
	var n int
	err := p.conn.QueryRow(ctx, "SELECT count(*) FROM celery_taskmeta").Scan(&n)
	return n, err
}

// flush empties the result tables.
func (p *pgResults) flush(ctx context.Context) error {
	if ok, err := p.tableExists(ctx); err != nil || !ok {
		return err
	}
	_, err := p.conn.Exec(ctx, "TRUNCATE celery_taskmeta, celery_tasksetmeta")
	return err
}

// verify checks that n results are stored, all SUCCESS with a date_done.
func (p *pgResults) verify(ctx context.Context, n int) error {
	var total, ok int
	err := p.conn.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE status = 'SUCCESS' AND date_done IS NOT NULL) FROM celery_taskmeta").Scan(&total, &ok)
	if err != nil {
		return err
	}
	if total != n || ok != n {
		return fmt.Errorf("%d results stored (%d SUCCESS), want %d", total, ok, n)
	}
	return nil
}

func (p *pgResults) close() {
	if p.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.flush(ctx)
		p.conn.Close(ctx)
	}
}

// postgresCPU is the CPU time of the local PostgreSQL server: every
// postgres process's user+system time, plus, for the postmaster, that of
// its children that exited (connections come and go).
func postgresCPU() (time.Duration, bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	var ticks int64
	found := false
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !isPostgres(pid) {
			continue
		}
		f, ok := statFields(pid)
		if !ok || len(f) < 15 {
			continue
		}
		var v [4]int64
		for i := range v {
			v[i], _ = strconv.ParseInt(f[11+i], 10, 64)
		}
		ticks += v[0] + v[1]
		if ppid, err := strconv.Atoi(f[1]); err == nil && !isPostgres(ppid) {
			ticks += v[2] + v[3] // the postmaster: reaped connections
		}
		found = true
	}
	return time.Duration(ticks) * clockTick, found
}

func isPostgres(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return err == nil && strings.TrimSpace(string(b)) == "postgres"
}

var errNoPostgres = errors.New("bench: PostgreSQL results asked for but not set up")
