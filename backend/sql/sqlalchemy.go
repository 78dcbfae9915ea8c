package sql

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// extendedColumns are TaskExtended's, in Celery's order.
var extendedColumns = []string{"name", "args", "kwargs", "worker", "retries", "queue"}

// prepareSQLAlchemy creates what Celery's models define and is missing:
// the sequences task_id_sequence and taskset_id_sequence, the tables
// celery_taskmeta (with TaskExtended's columns when Extended) and
// celery_tasksetmeta, under the configured names and schemas; plus
// celeriac's chord tables. The DDL is what SQLAlchemy's create_all emits
// for PostgreSQL. Concurrent workers serialize on an advisory lock, and
// IF NOT EXISTS keeps Python's create_all and this from failing each
// other.
func (b *Backend) prepareSQLAlchemy(ctx context.Context) error {
	s := b.s
	ext := ""
	if s.extended {
		ext = "\tname VARCHAR(155),\n\targs BYTEA,\n\tkwargs BYTEA,\n\tworker VARCHAR(155),\n\tretries INTEGER,\n\tqueue VARCHAR(155),\n"
	}
	ddl := []string{
		"SELECT pg_advisory_xact_lock(hashtext('celeriac.sql.prepare'))",
		"CREATE SEQUENCE IF NOT EXISTS " + s.taskSeq,
		"CREATE TABLE IF NOT EXISTS " + s.taskTable + " (\n\tid INTEGER NOT NULL,\n\ttask_id VARCHAR(155),\n\tstatus VARCHAR(50),\n\tresult BYTEA,\n\tdate_done TIMESTAMP WITHOUT TIME ZONE,\n\ttraceback TEXT,\n" + ext + "\tPRIMARY KEY (id),\n\tUNIQUE (task_id)\n)",
		"CREATE SEQUENCE IF NOT EXISTS " + s.groupSeq,
		"CREATE TABLE IF NOT EXISTS " + s.groupTable + " (\n\tid INTEGER NOT NULL,\n\ttaskset_id VARCHAR(155),\n\tresult BYTEA,\n\tdate_done TIMESTAMP WITHOUT TIME ZONE,\n\tPRIMARY KEY (id),\n\tUNIQUE (taskset_id)\n)",
		"CREATE TABLE IF NOT EXISTS " + b.chordTable() + " (\n\tgroup_id VARCHAR(155) PRIMARY KEY,\n\tsize INTEGER,\n\tcompleted_by TEXT,\n\tcreated TIMESTAMP WITHOUT TIME ZONE NOT NULL DEFAULT (now() AT TIME ZONE 'utc')\n)",
		"CREATE TABLE IF NOT EXISTS " + b.partTable() + " (\n\tgroup_id VARCHAR(155) NOT NULL,\n\ttask_id VARCHAR(155) NOT NULL,\n\tgroup_index INTEGER,\n\tseq BIGSERIAL,\n\tstate VARCHAR(50) NOT NULL,\n\tresult BYTEA,\n\tPRIMARY KEY (group_id, task_id)\n)",
	}
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for _, q := range ddl {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("sql backend: %s: %w", firstLine(q), err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	cols, err := b.columns(ctx, s.taskTable)
	if err != nil {
		return err
	}
	b.hasExtended = true
	for _, c := range extendedColumns {
		if !cols[c] {
			b.hasExtended = false
		}
	}
	if s.extended && !b.hasExtended {
		return fmt.Errorf("sql backend: result_extended is on but %s has no %s columns (it was created without result_extended; add them or turn it off)",
			s.taskTable, strings.Join(extendedColumns, ", "))
	}
	return nil
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// columns returns the column names of a table.
func (b *Backend) columns(ctx context.Context, table string) (map[string]bool, error) {
	rows, err := b.pool.Query(ctx, "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped", table)
	if err != nil {
		return nil, fmt.Errorf("sql backend: columns of %s: %w", table, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("sql backend: columns of %s: %w", table, err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("sql backend: table %s does not exist", table)
	}
	cols := make(map[string]bool, len(names))
	for _, n := range names {
		cols[n] = true
	}
	return cols, nil
}

// sqlaStore builds the upsert of one state: Celery's _update_result sets
// every column from the meta; the WHERE keeps a stored SUCCESS.
func (b *Backend) sqlaStore(m *protocol.ResultMeta) (string, []any, error) {
	// PickleType stores None as NULL, not as a pickle of None.
	var result any
	if v := resultValue(m); v != nil {
		p, err := EncodePickle(v)
		if err != nil {
			return "", nil, err
		}
		result = p
	}
	cols := []string{"task_id", "status", "result", "date_done", "traceback"}
	args := []any{m.TaskID, string(m.Status), result, naive(m.DateDone), nullString(m.Traceback)}
	if b.hasExtended {
		var name, a, kw, worker, queue, retries any
		var err error
		if m.Extended {
			encArgs := m.Args
			if encArgs == nil {
				encArgs = []any{}
			}
			encKwargs := m.Kwargs
			if encKwargs == nil {
				encKwargs = map[string]any{}
			}
			if a, err = protocol.Marshal(b.s.contentType, encArgs); err != nil {
				return "", nil, fmt.Errorf("encode args: %w", err)
			}
			if kw, err = protocol.Marshal(b.s.contentType, encKwargs); err != nil {
				return "", nil, fmt.Errorf("encode kwargs: %w", err)
			}
			name, worker, queue = nullString(trunc(m.Name, 155)), nullString(trunc(m.Worker, 155)), nullString(trunc(m.Queue, 155))
			retries = int32(m.Retries)
		}
		cols = append(cols, extendedColumns...)
		args = append(args, name, a, kw, worker, retries, queue)
	}
	// The sequence's name is a bind parameter (nextval takes a regclass),
	// never quoted into the text by hand.
	args = append(args, b.s.taskSeq)
	var q strings.Builder
	fmt.Fprintf(&q, "INSERT INTO %s AS t (id, %s) VALUES (nextval($%d::regclass)", b.s.taskTable, strings.Join(cols, ", "), len(args))
	for i := range cols {
		fmt.Fprintf(&q, ", $%d", i+1)
	}
	q.WriteString(") ON CONFLICT (task_id) DO UPDATE SET ")
	for i, c := range cols[1:] {
		if i > 0 {
			q.WriteString(", ")
		}
		fmt.Fprintf(&q, "%s = EXCLUDED.%s", c, c)
	}
	q.WriteString(" WHERE t.status IS DISTINCT FROM 'SUCCESS'")
	return q.String(), args, nil
}

// PickledResult is the Result [Backend.Get] returns on the SQLAlchemy
// schema for a stored pickle that [DecodePickle] refuses: one naming a
// class outside its allow-list (an exception pickled with
// result_serializer = "pickle", an instance of an application class;
// Err wraps [ErrUnsafePickle] then), or one that is malformed, too large
// or nested too deeply, or a result column over 16 MiB, which is not
// fetched (Err wraps protocol.ErrTooLarge). It keeps such a value apart
// from None (a NULL column, Result nil); the value itself is not read.
type PickledResult struct {
	Size int   // bytes
	Err  error // why DecodePickle refused it
}

func (p PickledResult) String() string {
	return fmt.Sprintf("<pickled result, %d bytes, not decoded: %v>", p.Size, p.Err)
}

// resultValue is what Celery's encode_result stores for the state: the
// return value, or the exception as its dict.
func resultValue(m *protocol.ResultMeta) any {
	return m.Result
}

func (b *Backend) sqlaGet(ctx context.Context, taskID string) (*protocol.ResultMeta, error) {
	cols := "status, date_done, traceback, " + resultColumn + ", octet_length(result)"
	if b.hasExtended {
		cols += ", " + strings.Join(extendedColumns, ", ")
	}
	row := b.pool.QueryRow(ctx, "SELECT "+cols+" FROM "+b.s.taskTable+" WHERE task_id = $1", taskID)
	var (
		status                  string
		done                    *time.Time
		tb, name, worker, queue *string
		args, kwargs            []byte
		retries                 *int32
		result                  []byte
		size                    *int64
	)
	dest := []any{&status, &done, &tb, &result, &size}
	if b.hasExtended {
		dest = append(dest, &name, &args, &kwargs, &worker, &retries, &queue)
	}
	if err := row.Scan(dest...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, backend.ErrNotFound
		}
		return nil, err
	}
	m := &protocol.ResultMeta{TaskID: taskID, Status: protocol.State(status), Traceback: deref(tb)}
	if done != nil {
		m.DateDone = done.UTC()
	}
	if size != nil {
		m.Result = decodeSQLAResult(m.Status, result, *size)
	}
	if b.hasExtended && (name != nil || args != nil || worker != nil) {
		m.Extended = true
		m.Name, m.Worker, m.Queue = deref(name), deref(worker), deref(queue)
		if retries != nil {
			m.Retries = int(*retries)
		}
		if err := b.decodeArgs(m, args, kwargs); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// maxResultColumn is the largest result column read: a larger one is a
// PickledResult wrapping protocol.ErrTooLarge, and its bytes stay in the
// database (resultColumn), so that a hostile row costs neither the
// transfer nor the decoding.
const maxResultColumn = 16 << 20

// resultColumn selects the result column up to maxResultColumn bytes,
// NULL beyond; octet_length(result) follows it.
var resultColumn = fmt.Sprintf("CASE WHEN octet_length(result) <= %d THEN result END", maxResultColumn)

// decodeSQLAResult reads the result column, of size bytes (data is nil
// beyond maxResultColumn): the pickle of the return value, or for
// FAILURE, RETRY and REVOKED of Celery's exception dict, which becomes an
// *protocol.ExceptionInfo as on every other backend. A pickle the
// restricted decoder refuses is a PickledResult.
func decodeSQLAResult(state protocol.State, data []byte, size int64) any {
	if size > maxResultColumn || int64(len(data)) != size {
		return PickledResult{Size: int(size), Err: fmt.Errorf("%w: sql backend: a result column of %d bytes exceeds %d", protocol.ErrTooLarge, size, maxResultColumn)}
	}
	v, err := DecodePickle(data)
	if err != nil {
		return PickledResult{Size: len(data), Err: err}
	}
	switch state {
	case protocol.StateFailure, protocol.StateRetry, protocol.StateRevoked:
		if e, err := protocol.DecodeException(v); err == nil {
			return e
		}
	}
	return v
}

// decodeArgs reads the args and kwargs columns, encoded with the result
// serializer as Celery encodes them.
func (b *Backend) decodeArgs(m *protocol.ResultMeta, args, kwargs []byte) error {
	opts := protocol.DecodeOptions{}
	if len(args) > 0 {
		v, err := protocol.Unmarshal(b.s.contentType, args, opts)
		if err != nil {
			return fmt.Errorf("decode args: %w", err)
		}
		m.Args, _ = v.([]any)
	}
	if len(kwargs) > 0 {
		v, err := protocol.Unmarshal(b.s.contentType, kwargs, opts)
		if err != nil {
			return fmt.Errorf("decode kwargs: %w", err)
		}
		m.Kwargs, _ = v.(map[string]any)
	}
	return nil
}

// naive is a date_done as Celery writes it: UTC wall-clock time in a
// TIMESTAMP WITHOUT TIME ZONE, or NULL.
func naive(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return time.Date(u.Year(), u.Month(), u.Day(), u.Hour(), u.Minute(), u.Second(), u.Nanosecond()/1000*1000, time.UTC)
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// trunc cuts s to at most n characters (VARCHAR(n) counts characters).
func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n])
}
