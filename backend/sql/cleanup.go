package sql

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cleanup deletes results older than ResultExpires, as Celery's
// backend.cleanup() does (celery.backend_cleanup, which celery beat sends
// every day at 4 am): rows whose date_done is older in the task and group
// tables, and, with the SQLAlchemy schema, celeriac's chord rows created
// before then.
func (b *Backend) Cleanup(ctx context.Context) error {
	if err := b.enter(); err != nil {
		return err
	}
	defer b.inflight.Done()
	var stmts []string
	var cutoff any
	if b.schema == Django {
		cutoff = time.Now().Add(-b.s.expires)
		stmts = []string{
			"DELETE FROM " + b.s.taskTable + " WHERE date_done < $1",
			"DELETE FROM " + b.s.groupTable + " WHERE date_done < $1",
		}
	} else {
		cutoff = naive(time.Now().Add(-b.s.expires))
		stmts = []string{
			"DELETE FROM " + b.s.taskTable + " WHERE date_done < $1",
			"DELETE FROM " + b.s.groupTable + " WHERE date_done < $1",
			"DELETE FROM " + b.partTable() + " p USING " + b.chordTable() + " c WHERE p.group_id = c.group_id AND c.created < $1",
			"DELETE FROM " + b.chordTable() + " WHERE created < $1",
		}
	}
	err := b.retry(ctx, "cleanup", func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			for _, q := range stmts {
				if _, err := tx.Exec(ctx, q, cutoff); err != nil {
					return err
				}
			}
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("sql backend: cleanup: %w", err)
	}
	return nil
}
