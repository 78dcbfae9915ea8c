package sql

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// Chords started by a celeriac worker (backend.Chords) need a counter that
// Celery's database backend does not have: its Python client sends the
// celery.chord_unlock task instead, which polls the header results. With
// the SQLAlchemy schema the counter lives in celeriac's own tables next to
// Celery's: celeriac_chord (group id, size, the call that completed it)
// and celeriac_chord_part (one row per header task, its state and its
// result as JSON). With the Django schema it is django-celery-results'
// ChordCounter, which Python workers share (see chordDjango).

// CountsChords reports whether chords on this backend are completed by
// counting their parts (backend.ChordsOf): true with the Django schema,
// whose ChordCounter Python workers share; false with the SQLAlchemy
// schema, whose Python clients send celery.chord_unlock and whose Python
// workers count nothing, so a chord with header tasks on Python workers
// can only be completed by celery.chord_unlock. Chords, SetChordSize and
// ChordPartReturn still work on either schema.
func (b *Backend) CountsChords() bool { return b.schema == Django }

func (b *Backend) chordTable() string { return qualify(b.s.schema, "celeriac_chord") }
func (b *Backend) partTable() string  { return qualify(b.s.schema, "celeriac_chord_part") }

// SetChordSize records how many header tasks the chord has.
func (b *Backend) SetChordSize(ctx context.Context, groupID string, size int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if groupID == "" {
		return errors.New("sql backend: SetChordSize: empty group id")
	}
	if size <= 0 {
		return fmt.Errorf("sql backend: SetChordSize %s: chord size %d is not positive", groupID, size)
	}
	if err := b.enter(); err != nil {
		return err
	}
	defer b.inflight.Done()
	err := b.retry(ctx, "chord size", func(ctx context.Context) error {
		if b.schema == Django {
			return b.djangoChordSize(ctx, groupID, size)
		}
		_, err := b.pool.Exec(ctx, "INSERT INTO "+b.chordTable()+" (group_id, size) VALUES ($1, $2) "+
			"ON CONFLICT (group_id) DO UPDATE SET size = EXCLUDED.size", groupID, size)
		return err
	})
	if err != nil {
		return fmt.Errorf("sql backend: set chord size of %s: %w", groupID, err)
	}
	return nil
}

// ChordPartReturn counts one header task in a transaction that locks the
// chord's row, so that exactly one call per chord reports Ready, whichever
// worker (or process) makes it. A part already counted is not counted
// again. When a retry follows a commit whose answer was lost, the chord is
// recognised as completed by this very call and Ready is answered again.
func (b *Backend) ChordPartReturn(ctx context.Context, p backend.ChordPart) (backend.ChordResult, error) {
	if err := ctx.Err(); err != nil {
		return backend.ChordResult{}, err
	}
	if p.GroupID == "" || p.TaskID == "" {
		return backend.ChordResult{}, errors.New("sql backend: ChordPartReturn: group id and task id are required")
	}
	if err := b.enter(); err != nil {
		return backend.ChordResult{}, err
	}
	defer b.inflight.Done()
	var (
		res backend.ChordResult
		err error
	)
	if b.schema == Django {
		err = b.retry(ctx, "chord part", func(ctx context.Context) error {
			res, err = b.chordDjango(ctx, p)
			return err
		})
	} else {
		data, encErr := protocol.Marshal(protocol.ContentTypeJSON, exceptionValue(p.Result))
		if encErr != nil {
			return res, fmt.Errorf("sql backend: chord part %s: %w", p.TaskID, encErr)
		}
		token := rand.Text()
		err = b.retry(ctx, "chord part", func(ctx context.Context) error {
			res, err = b.chordSQLAlchemy(ctx, p, data, token)
			return err
		})
	}
	if err != nil {
		if ctx.Err() == nil {
			b.fail("chord part", p.TaskID, err)
		}
		return backend.ChordResult{}, fmt.Errorf("sql backend: chord part %s of %s: %w", p.TaskID, p.GroupID, err)
	}
	return res, nil
}

func (b *Backend) chordSQLAlchemy(ctx context.Context, p backend.ChordPart, data []byte, token string) (backend.ChordResult, error) {
	var res backend.ChordResult
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		res = backend.ChordResult{}
		if _, err := tx.Exec(ctx, "INSERT INTO "+b.chordTable()+" (group_id) VALUES ($1) ON CONFLICT DO NOTHING", p.GroupID); err != nil {
			return err
		}
		var (
			size        *int32
			completedBy *string
		)
		if err := tx.QueryRow(ctx, "SELECT size, completed_by FROM "+b.chordTable()+" WHERE group_id = $1 FOR UPDATE",
			p.GroupID).Scan(&size, &completedBy); err != nil {
			return err
		}
		if completedBy != nil {
			if *completedBy != token {
				return nil // completed before: a late or repeated part
			}
		} else {
			var idx any
			if p.GroupIndex != nil {
				idx = int32(*p.GroupIndex)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+b.partTable()+" (group_id, task_id, group_index, state, result) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
				p.GroupID, p.TaskID, idx, string(p.State), data); err != nil {
				return err
			}
			if size == nil {
				return nil
			}
			var n int64
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+b.partTable()+" WHERE group_id = $1", p.GroupID).Scan(&n); err != nil {
				return err
			}
			if n < int64(*size) {
				return nil
			}
			if _, err := tx.Exec(ctx, "UPDATE "+b.chordTable()+" SET completed_by = $2 WHERE group_id = $1", p.GroupID, token); err != nil {
				return err
			}
		}
		rows, err := tx.Query(ctx, "SELECT task_id, group_index, state, result FROM "+b.partTable()+
			" WHERE group_id = $1 ORDER BY group_index NULLS LAST, seq", p.GroupID)
		if err != nil {
			return err
		}
		defer rows.Close()
		res.Ready = true
		for rows.Next() {
			var (
				id, state string
				idx       *int32
				raw       []byte
			)
			if err := rows.Scan(&id, &idx, &state, &raw); err != nil {
				return err
			}
			part := backend.ChordPart{GroupID: p.GroupID, TaskID: id, State: protocol.State(state)}
			if idx != nil {
				i := int(*idx)
				part.GroupIndex = &i
			}
			part.Result, err = decodePartResult(part.State, protocol.ContentTypeJSON, raw)
			if err != nil {
				part = chordFailure(p.GroupID, fmt.Sprintf("chord part %s does not decode: %v", id, err))
			}
			res.Results = append(res.Results, part)
		}
		return rows.Err()
	})
	return res, err
}

// decodePartResult decodes a stored result; exception states give an
// *protocol.ExceptionInfo when the value is Celery's exception dict.
func decodePartResult(state protocol.State, contentType string, raw []byte) (any, error) {
	if raw == nil {
		return nil, nil
	}
	v, err := protocol.Unmarshal(contentType, raw, protocol.DecodeOptions{})
	if err != nil {
		return nil, err
	}
	switch state {
	case protocol.StateFailure, protocol.StateRetry, protocol.StateRevoked:
		if e, err := protocol.DecodeException(v); err == nil {
			return e, nil
		}
	}
	return v, nil
}

// chordFailure is a synthetic failed part standing for a problem with the
// chord itself; its TaskID is empty.
func chordFailure(groupID, msg string) backend.ChordPart {
	return backend.ChordPart{GroupID: groupID, State: protocol.StateFailure,
		Result: &protocol.ExceptionInfo{Type: "ChordError", Message: []any{msg}, Module: "celery.exceptions"}}
}

// exceptionValue converts a *protocol.ExceptionInfo into the dict Celery
// stores; other values pass through.
func exceptionValue(v any) any {
	if e, ok := v.(*protocol.ExceptionInfo); ok && e != nil {
		return e.Value()
	}
	return v
}

// UnlockChord implements backend.ChordUnlocker for Celery's SQLAlchemy
// schema: the Python client's celery.chord_unlock lists the header's task
// ids, and the chord is ready when every one of them has a ready outcome:
// in celeriac_chord_part, where each header task a celeriac worker ran
// recorded it through ChordPartReturn, or else in celery_taskmeta, where
// a Python worker stored it (SUCCESS, FAILURE or REVOKED), read with
// [DecodePickle]. A result there that DecodePickle refuses as Python
// would not (an object of an application class, a value over the
// decoder's bounds) leaves the chord not ready here, as every Python
// header did before the decoder existed: its chord_unlock is then
// completed by a Python worker (Celery retries the task, so a Python
// worker on the same queue takes it up). A malformed pickle, which no
// worker reads, makes that part a ChordError failure.
func (b *Backend) UnlockChord(ctx context.Context, groupID string, taskIDs []string, claimant string) (backend.ChordResult, error) {
	if err := ctx.Err(); err != nil {
		return backend.ChordResult{}, err
	}
	if groupID == "" || claimant == "" {
		return backend.ChordResult{}, errors.New("sql backend: UnlockChord: group id and claimant are required")
	}
	if b.schema == Django {
		return backend.ChordResult{}, errors.New("sql backend: django-celery-results counts chords itself; it has no chord_unlock")
	}
	if err := b.enter(); err != nil {
		return backend.ChordResult{}, err
	}
	defer b.inflight.Done()
	var res backend.ChordResult
	err := b.retry(ctx, "chord unlock", func(ctx context.Context) error {
		res = backend.ChordResult{}
		return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+b.chordTable()+" (group_id, size) VALUES ($1, $2) ON CONFLICT DO NOTHING", groupID, len(taskIDs)); err != nil {
				return err
			}
			var completedBy *string
			if err := tx.QueryRow(ctx, "SELECT completed_by FROM "+b.chordTable()+" WHERE group_id = $1 FOR UPDATE", groupID).Scan(&completedBy); err != nil {
				return err
			}
			if completedBy != nil && *completedBy != claimant {
				return backend.ErrChordDone
			}
			rows, err := tx.Query(ctx, "SELECT task_id, state, result FROM "+b.partTable()+" WHERE group_id = $1 AND task_id = ANY($2)", groupID, taskIDs)
			if err != nil {
				return err
			}
			found := map[string]backend.ChordPart{}
			for rows.Next() {
				var (
					id, state string
					raw       []byte
				)
				if err := rows.Scan(&id, &state, &raw); err != nil {
					rows.Close()
					return err
				}
				part := backend.ChordPart{GroupID: groupID, TaskID: id, State: protocol.State(state)}
				if part.Result, err = decodePartResult(part.State, protocol.ContentTypeJSON, raw); err != nil {
					part = chordFailure(groupID, fmt.Sprintf("chord part %s does not decode: %v", id, err))
				}
				found[id] = part
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			var missing []string
			for _, id := range taskIDs {
				if _, ok := found[id]; !ok {
					missing = append(missing, id)
				}
			}
			if len(missing) > 0 {
				if err := b.pythonParts(ctx, tx, groupID, missing, found); err != nil {
					return err
				}
			}
			for _, id := range taskIDs {
				if _, ok := found[id]; !ok {
					return nil // not ready: some part has not returned
				}
			}
			if completedBy == nil {
				if _, err := tx.Exec(ctx, "UPDATE "+b.chordTable()+" SET completed_by = $2 WHERE group_id = $1", groupID, claimant); err != nil {
					return err
				}
			}
			res.Ready = true
			for i, id := range taskIDs {
				part := found[id]
				idx := i
				part.GroupIndex = &idx
				res.Results = append(res.Results, part)
			}
			return nil
		})
	})
	if err != nil {
		return backend.ChordResult{}, fmt.Errorf("sql backend: unlock chord %s: %w", groupID, err)
	}
	return res, nil
}

// pythonReads reports whether a result DecodePickle refused with err is
// one Python's unpickler reads: an object of a class outside the
// allow-list, or a value over the decoder's bounds (which are not
// Python's). A Python worker's chord_unlock then completes the chord.
// Any other refusal is a malformed pickle that Python refuses too.
func pythonReads(err error) bool {
	return errors.Is(err, ErrUnsafePickle) || errors.Is(err, protocol.ErrTooLarge) || errors.Is(err, protocol.ErrTooDeep)
}

// pythonParts adds to found the header tasks among ids whose ready outcome
// is in the task table (stored by a Python worker) and decodes.
func (b *Backend) pythonParts(ctx context.Context, tx pgx.Tx, groupID string, ids []string, found map[string]backend.ChordPart) error {
	rows, err := tx.Query(ctx, "SELECT task_id, status, "+resultColumn+", octet_length(result) FROM "+b.s.taskTable+
		" WHERE task_id = ANY($1) AND status IN ('SUCCESS', 'FAILURE', 'REVOKED')", ids)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id, state string
			raw       []byte
			size      *int64
		)
		if err := rows.Scan(&id, &state, &raw, &size); err != nil {
			return err
		}
		part := backend.ChordPart{GroupID: groupID, TaskID: id, State: protocol.State(state)}
		if size != nil {
			part.Result = decodeSQLAResult(part.State, raw, *size)
			if r, refused := part.Result.(PickledResult); refused {
				if pythonReads(r.Err) {
					continue
				}
				// Python's chord_unlock cannot read it either: the chord
				// fails, naming the part, instead of waiting forever.
				part = chordFailure(groupID, fmt.Sprintf("chord part %s: its stored result does not unpickle: %v", id, r.Err))
				part.TaskID = id
			}
		}
		found[id] = part
	}
	return rows.Err()
}
