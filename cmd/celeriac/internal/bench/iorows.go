package bench

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/celeriac/celeriac/internal/redact"
)

// ioRowsTable is where bench io's tasks write a row each with
// IOOptions.PostgresURL, in the database benchDatabase: created by the
// benchmark when missing (and then dropped at its end), refused when it
// holds rows, emptied between runs.
const ioRowsTable = "bench_io_rows"

// ioRows is the PostgreSQL side of bench io.
type ioRows struct {
	url     string // of benchDatabase, for the workers
	conn    *pgx.Conn
	created bool
}

func newIORows(ctx context.Context, admin string) (*ioRows, error) {
	dbURL, conn, err := openBenchDatabase(ctx, admin)
	if err != nil {
		return nil, err
	}
	r := &ioRows{url: dbURL, conn: conn}
	var exists bool
	if err := r.conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", ioRowsTable).Scan(&exists); err != nil {
		r.conn.Close(ctx)
		return nil, err
	}
	if !exists {
		if _, err := r.conn.Exec(ctx, "CREATE TABLE "+ioRowsTable+" (id bigserial PRIMARY KEY, url text NOT NULL, worker text NOT NULL, at timestamptz NOT NULL DEFAULT now())"); err != nil {
			r.conn.Close(ctx)
			return nil, fmt.Errorf("postgres: create table %s: %w", ioRowsTable, err)
		}
		r.created = true
	} else if n, err := r.count(ctx); err != nil || n > 0 {
		r.conn.Close(ctx)
		if err == nil {
			err = fmt.Errorf("%w: the table %s of database %s holds %d rows, which the benchmark empties; delete them yourself or use another server (--postgres)", ErrInUse, ioRowsTable, benchDatabase, n)
		}
		return nil, err
	}
	return r, nil
}

func (r *ioRows) count(ctx context.Context) (int, error) {
	var n int
	err := r.conn.QueryRow(ctx, "SELECT count(*) FROM "+ioRowsTable).Scan(&n)
	return n, err
}

func (r *ioRows) empty(ctx context.Context) error {
	_, err := r.conn.Exec(ctx, "TRUNCATE "+ioRowsTable)
	return err
}

// close empties the table, or drops it when the benchmark created it.
func (r *ioRows) close(ctx context.Context) {
	if r.created {
		_, _ = r.conn.Exec(ctx, "DROP TABLE "+ioRowsTable)
	} else {
		_ = r.empty(ctx)
	}
	r.conn.Close(ctx)
}

// ioRowWriter is the celeriac worker's side: a pool of at most maxConns
// connections (PostgreSQL's default max_connections is 100, and a -c 5000
// worker must not ask for 5000).
type ioRowWriter struct{ pool *pgxpool.Pool }

func newIORowWriter(ctx context.Context, dsn string, maxConns int) (*ioRowWriter, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres URL: %w", redact.Error(err))
	}
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &ioRowWriter{pool: pool}, nil
}

func (w *ioRowWriter) write(ctx context.Context, u, worker string) error {
	_, err := w.pool.Exec(ctx, "INSERT INTO "+ioRowsTable+" (url, worker) VALUES ($1, $2)", u, worker)
	return err
}

func (w *ioRowWriter) close() { w.pool.Close() }
