package sql

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// django-celery-results' tables (app label django_celery_results).
const (
	djangoCounterTable = `"django_celery_results_chordcounter"`
)

// djangoTaskColumns are the TaskResult columns celeriac writes, as of
// django-celery-results 2.4 (migration 0011 added periodic_task_name).
var djangoTaskColumns = []string{"task_id", "status", "content_type", "content_encoding", "result",
	"date_created", "date_done", "traceback", "meta", "task_args", "task_kwargs", "task_name", "worker", "periodic_task_name"}

// checkDjango verifies that Django's migrations created the tables:
// celeriac never creates or alters them.
func (b *Backend) checkDjango(ctx context.Context) error {
	cols, err := b.columns(ctx, b.s.taskTable)
	if err != nil {
		return fmt.Errorf("%w (run Django's migrate with django_celery_results installed)", err)
	}
	var missing []string
	for _, c := range djangoTaskColumns {
		if !cols[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("sql backend: %s lacks %s: migrate to django-celery-results 2.4 or later", b.s.taskTable, strings.Join(missing, ", "))
	}
	for _, t := range []string{b.s.groupTable, djangoCounterTable} {
		if _, err := b.columns(ctx, t); err != nil {
			return fmt.Errorf("%w (run Django's migrate)", err)
		}
	}
	return nil
}

// encodeContent is django-celery-results' encode_content: the serialized
// value, base64 for a binary serializer (msgpack), and the content type
// and encoding to store next to it.
func (b *Backend) encodeContent(v any) (content, contentType, encoding string, err error) {
	data, err := protocol.Marshal(b.s.contentType, v)
	if err != nil {
		return "", "", "", err
	}
	if b.s.contentType == protocol.ContentTypeMsgpack {
		return base64.StdEncoding.EncodeToString(data), b.s.contentType, "binary", nil
	}
	return string(data), b.s.contentType, "utf-8", nil
}

// decodeContent is decode_content: the stored text, by the row's own
// content type and encoding.
func decodeContent(content, contentType, encoding string) (any, error) {
	data := []byte(content)
	if encoding == "binary" {
		d, err := base64.StdEncoding.DecodeString(content)
		if err != nil {
			return nil, err
		}
		data = d
	}
	return protocol.Unmarshal(contentType, data, protocol.DecodeOptions{})
}

// djangoStore builds the upsert of TaskResultManager.store_result:
// get_or_create by task_id, then every field set; date_created on insert,
// date_done (auto_now) at each save. A stored SUCCESS is kept.
func (b *Backend) djangoStore(m *protocol.ResultMeta) (string, []any, error) {
	result, ct, enc, err := b.encodeContent(exceptionValue(m.Result))
	if err != nil {
		return "", nil, fmt.Errorf("encode result: %w", err)
	}
	children := m.Children
	if children == nil {
		children = []any{}
	}
	meta, _, _, err := b.encodeContent(map[string]any{"children": children})
	if err != nil {
		return "", nil, fmt.Errorf("encode meta: %w", err)
	}
	var taskArgs, taskKwargs, taskName, worker any
	if m.Extended {
		// Celery sends argsrepr and kwargsrepr, and the backend stores
		// them encoded: a JSON string holding "(2, 3)".
		a, _, _, err := b.encodeContent(protocol.ReprArgs(m.Args))
		if err != nil {
			return "", nil, err
		}
		kw, _, _, err := b.encodeContent(protocol.ReprKwargs(m.Kwargs))
		if err != nil {
			return "", nil, err
		}
		taskArgs, taskKwargs = a, kw
		taskName, worker = nullString(trunc(m.Name, 255)), nullString(trunc(m.Worker, 100))
	}
	// date_done is auto_now: the time of the save, which for a ready
	// state is when the task finished (DateDone).
	done := time.Now().UTC()
	if m.Status.Ready() && !m.DateDone.IsZero() {
		done = m.DateDone.UTC()
	}
	q := "INSERT INTO " + b.s.taskTable + " AS t (task_id, status, content_type, content_encoding, result, date_created, date_done, " +
		"traceback, meta, task_args, task_kwargs, task_name, worker, periodic_task_name) " +
		"VALUES ($1, $2, $3, $4, $5, now(), $6, $7, $8, $9, $10, $11, $12, NULL) " +
		"ON CONFLICT (task_id) DO UPDATE SET status = EXCLUDED.status, content_type = EXCLUDED.content_type, " +
		"content_encoding = EXCLUDED.content_encoding, result = EXCLUDED.result, date_done = EXCLUDED.date_done, " +
		"traceback = EXCLUDED.traceback, meta = EXCLUDED.meta, task_args = EXCLUDED.task_args, " +
		"task_kwargs = EXCLUDED.task_kwargs, task_name = EXCLUDED.task_name, worker = EXCLUDED.worker, " +
		"periodic_task_name = EXCLUDED.periodic_task_name WHERE t.status IS DISTINCT FROM 'SUCCESS'"
	args := []any{trunc(m.TaskID, 255), string(m.Status), ct, enc, result, done, nullString(m.Traceback), meta,
		taskArgs, taskKwargs, taskName, worker}
	return q, args, nil
}

func (b *Backend) djangoGet(ctx context.Context, taskID string) (*protocol.ResultMeta, error) {
	var (
		status, ct, enc              string
		result, tb, meta, name, wrkr *string
		done                         *time.Time
	)
	err := b.pool.QueryRow(ctx, "SELECT status, content_type, content_encoding, result, date_done, traceback, meta, task_name, worker FROM "+
		b.s.taskTable+" WHERE task_id = $1", taskID).Scan(&status, &ct, &enc, &result, &done, &tb, &meta, &name, &wrkr)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, backend.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	m := &protocol.ResultMeta{TaskID: taskID, Status: protocol.State(status), Traceback: deref(tb)}
	if done != nil && m.Status.Ready() {
		m.DateDone = done.UTC()
	}
	if result != nil {
		v, err := decodeContent(*result, ct, enc)
		if err != nil {
			return nil, fmt.Errorf("decode result: %w", err)
		}
		m.Result = v
		switch m.Status {
		case protocol.StateFailure, protocol.StateRetry, protocol.StateRevoked:
			if e, err := protocol.DecodeException(v); err == nil {
				m.Result = e
			}
		}
	}
	if meta != nil {
		if v, err := decodeContent(*meta, ct, enc); err == nil {
			if mm, ok := v.(map[string]any); ok {
				m.Children, _ = mm["children"].([]any)
			}
		}
	}
	if name != nil || wrkr != nil {
		m.Extended = true
		m.Name, m.Worker = deref(name), deref(wrkr)
	}
	return m, nil
}

// A ChordCounter row: sub_tasks is the JSON list of the header's result
// tuples ([[task_id, null], null]) and count the parts still to come.
// The Python client creates it (apply_chord) with the whole header; a
// chord a celeriac worker starts knows only its size, so SetChordSize
// writes size null slots, and each part fills the slot of its group
// index. Python parts decrement count like Go parts do.

func (b *Backend) djangoChordSize(ctx context.Context, groupID string, size int) error {
	slots, err := json.Marshal(make([]any, size))
	if err != nil {
		return err
	}
	_, err = b.pool.Exec(ctx, "INSERT INTO "+djangoCounterTable+" (group_id, sub_tasks, count) VALUES ($1, $2, $3) ON CONFLICT (group_id) DO NOTHING",
		groupID, string(slots), size)
	return err
}

// chordDjango is django-celery-results' on_chord_part_return: under SELECT
// ... FOR UPDATE of the group's ChordCounter, count one part; the part that
// brings count to 0 deletes the counter and reads the header's results
// from the task table, in header order. A part without a counter is not
// counted (Python logs "Can't find ChordCounter"). The part's own state is
// written first when the task table has none, so the results are complete
// even when the worker's own store of it failed.
func (b *Backend) chordDjango(ctx context.Context, p backend.ChordPart) (backend.ChordResult, error) {
	var res backend.ChordResult
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		res = backend.ChordResult{}
		var (
			subTasks string
			count    int64
		)
		err := tx.QueryRow(ctx, "SELECT sub_tasks, count FROM "+djangoCounterTable+" WHERE group_id = $1 FOR UPDATE", p.GroupID).Scan(&subTasks, &count)
		if errors.Is(err, pgx.ErrNoRows) {
			b.s.log.Debug("sql backend: no ChordCounter for the group: part not counted", zap.String("group_id", p.GroupID), zap.String("task_id", p.TaskID))
			return nil
		}
		if err != nil {
			return err
		}
		var tuples []any
		if err := json.Unmarshal([]byte(subTasks), &tuples); err != nil {
			return fmt.Errorf("ChordCounter %s: sub_tasks: %w", p.GroupID, err)
		}
		ids := make([]string, len(tuples))
		sparse := false
		for i, t := range tuples {
			if t == nil {
				sparse = true
				continue
			}
			ids[i] = tupleID(t)
		}
		if sparse {
			slot := -1
			if slices.Contains(ids, p.TaskID) {
				return nil // counted before
			}
			if p.GroupIndex != nil && *p.GroupIndex >= 0 && *p.GroupIndex < len(tuples) && tuples[*p.GroupIndex] == nil {
				slot = *p.GroupIndex
			} else {
				for i := len(tuples) - 1; i >= 0; i-- {
					if tuples[i] == nil {
						slot = i
						break
					}
				}
			}
			tuples[slot] = protocol.ChildTuple(p.TaskID)
			ids[slot] = p.TaskID
		}
		meta := &protocol.ResultMeta{TaskID: p.TaskID, Status: p.State, Result: p.Result, Children: []any{}}
		if p.State.Ready() {
			meta.DateDone = time.Now().UTC()
		}
		q, args, err := b.djangoStore(meta)
		if err != nil {
			return err
		}
		q, _, _ = strings.Cut(q, " ON CONFLICT")
		if _, err := tx.Exec(ctx, q+" ON CONFLICT (task_id) DO NOTHING", args...); err != nil {
			return err
		}
		count--
		if count > 0 {
			data, err := json.Marshal(tuples)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, "UPDATE "+djangoCounterTable+" SET count = $2, sub_tasks = $3 WHERE group_id = $1", p.GroupID, count, string(data))
			return err
		}
		if _, err := tx.Exec(ctx, "DELETE FROM "+djangoCounterTable+" WHERE group_id = $1", p.GroupID); err != nil {
			return err
		}
		res.Ready = true
		res.Results, err = b.djangoParts(ctx, tx, p.GroupID, ids)
		return err
	})
	return res, err
}

// tupleID reads the task id of a result tuple [[id, parent], children].
func tupleID(t any) string {
	if l, ok := t.([]any); ok && len(l) > 0 {
		if inner, ok := l[0].([]any); ok && len(inner) > 0 {
			s, _ := inner[0].(string)
			return s
		}
		s, _ := l[0].(string)
		return s
	}
	return ""
}

// djangoParts reads the header's results in header order. A part that is
// missing or not ready becomes a ChordError: Python's backend would leave
// such a chord unfired forever, silently.
func (b *Backend) djangoParts(ctx context.Context, tx pgx.Tx, groupID string, ids []string) ([]backend.ChordPart, error) {
	rows, err := tx.Query(ctx, "SELECT task_id, status, result, content_type, content_encoding FROM "+b.s.taskTable+" WHERE task_id = ANY($1)", ids)
	if err != nil {
		return nil, err
	}
	type stored struct {
		status, ct, enc string
		result          *string
	}
	found := map[string]stored{}
	for rows.Next() {
		var (
			id string
			s  stored
		)
		if err := rows.Scan(&id, &s.status, &s.result, &s.ct, &s.enc); err != nil {
			rows.Close()
			return nil, err
		}
		found[id] = s
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	parts := make([]backend.ChordPart, 0, len(ids))
	for i, id := range ids {
		s, ok := found[id]
		if id == "" || !ok || !protocol.State(s.status).Ready() {
			parts = append(parts, chordFailure(groupID, fmt.Sprintf("chord header part %d (%s) has no ready result", i, id)))
			continue
		}
		idx := i
		part := backend.ChordPart{GroupID: groupID, GroupIndex: &idx, TaskID: id, State: protocol.State(s.status)}
		if s.result != nil {
			v, err := decodeContent(*s.result, s.ct, s.enc)
			if err != nil {
				parts = append(parts, chordFailure(groupID, fmt.Sprintf("chord part %s does not decode: %v", id, err)))
				continue
			}
			part.Result = v
			switch part.State {
			case protocol.StateFailure, protocol.StateRevoked:
				if e, err := protocol.DecodeException(v); err == nil {
					part.Result = e
				}
			}
		}
		parts = append(parts, part)
	}
	return parts, nil
}
