// Package memory is an in-memory result backend for tests and demos. It
// implements [backend.Backend] and [backend.Chords] with the semantics of
// Celery's Redis backend: a stored SUCCESS is never overwritten, and chord
// parts are counted like the celery-taskset-meta-<gid>.j sorted set (a part
// stored twice with identical content counts once; the chord completes when
// the count reaches the size set by SetChordSize).
//
// Nothing expires and nothing is shared between processes, so it is no
// substitute for a real backend in production. Wait blocks until a task
// reaches a ready state, which is what tests of a worker usually need.
//
//	be := memory.New()
//	defer be.Close()
//	_ = be.Store(ctx, backend.StoreRequest{Meta: &protocol.ResultMeta{TaskID: id, Status: protocol.StateSuccess, Result: int64(5)}})
//	meta, _ := be.Wait(ctx, id)
//
// memory imports backend and protocol only.
package memory
