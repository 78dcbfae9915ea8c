// Package sql is Celery's database result backends on PostgreSQL, written
// so that Python reads what a celeriac worker stores as if a Python worker
// had stored it:
//
//   - [SQLAlchemy]: Celery's own DatabaseBackend (result_backend =
//     "db+postgresql://..." with any +driver, such as +psycopg2). The
//     tables celery_taskmeta and celery_tasksetmeta, with the sequences
//     task_id_sequence and taskset_id_sequence, are created when missing,
//     with the DDL SQLAlchemy's create_all emits for Celery's models
//     (TaskExtended's name, args, kwargs, worker, retries and queue with
//     result_extended), under database_table_names and
//     database_table_schemas ([Config.TableNames], [Config.TableSchemas]).
//   - [Django]: django-celery-results 2.4/2.5 (result_backend =
//     "django-db"): django_celery_results_taskresult,
//     _chordcounter and _groupresult, which Django's migrations create;
//     celeriac checks them and never creates or alters them.
//
// # The pickled result column
//
// Celery's models declare result as SQLAlchemy's PickleType: the column
// holds pickle.dumps of the return value (for an exception, Celery's
// {"exc_type", "exc_message", "exc_module"} dict). [EncodePickle] writes
// that pickle for the values Go handlers return. [DecodePickle] reads it
// back with a restricted decoder that interprets the pickle as data and
// never imports or calls anything: it knows the opcodes of protocols 0 to
// 5 for None, bools, numbers, strings, bytes, lists, tuples, dicts and
// sets, and a short allow-list of classes it recognises by name and reads
// from their pickled state (datetime's datetime, date and time with a
// fixed-offset timezone, decimal.Decimal, uuid.UUID); any other class or
// function is refused with [ErrUnsafePickle], and input size, nesting,
// memo and the work a pickle can cause are bounded. [Backend.Get] on the
// SQLAlchemy schema returns the decoded value as Result (an exception
// dict, for FAILURE, RETRY and REVOKED, as an *protocol.ExceptionInfo, as
// every backend does), nil for None (a NULL column), and a
// [PickledResult] (its size and the decoder's error) for a pickle the
// decoder refuses, such as an exception Python stored with
// result_serializer = "pickle" or an object of an application class.
// args and kwargs are encoded with the result serializer, as Celery
// encodes them.
//
// # Writes
//
// Every Store is one upsert (INSERT ... ON CONFLICT (task_id) DO UPDATE)
// whose WHERE leaves a stored SUCCESS alone. Connections come from a pgx
// pool; every statement runs under [Config.StatementTimeout], set on the
// client and as the server's statement_timeout. A transient failure (the
// server restarting or shutting down, a dropped connection, a statement
// timeout, a serialization failure) is retried with backoff until the
// caller's context ends, so the caller's budget bounds the retries; a
// write that is given up is logged and counted ([Backend.Stats]).
// Concurrent stores are committed together: one transaction (one round trip
// and one WAL flush) for up to 64, each transaction under the statement
// timeout; a store waits in the queue as long as its caller allows, so a
// slow database is not sent copies of stores still waiting their turn.
//
// # Waiting for results
//
// [Backend.Wait] (which client.AsyncResult.Get uses) does not only poll,
// as Celery's client does on this backend: every Store also sends
// pg_notify(Config.NotifyChannel, task id) in the transaction that writes
// the state, and Wait LISTENs on a connection of its own, so it wakes as
// soon as a celeriac worker stores the result. Rows written by Python
// workers are not notified; Wait finds them by polling (5 ms, doubling up
// to 500 ms). Config.NoNotify turns the notification off.
//
// # Chords
//
// Python clients of Celery's database backend do not count chord parts:
// they send celery.chord_unlock, which polls the header's results. The
// worker runs it with [Backend.UnlockChord] (backend.ChordUnlocker): every
// header task a celeriac worker ran recorded its outcome as JSON in
// celeriac's own table celeriac_chord_part, and the first chord_unlock that
// finds all of them claims the chord in celeriac_chord. Parts a Python
// worker ran exist only as pickles in celery_taskmeta, where UnlockChord
// reads them with DecodePickle; a result the decoder refuses keeps the
// chord waiting for Celery's own chord_unlock on a Python worker. Chords a
// celeriac worker starts ([backend.Chords]) are counted in the same tables,
// in one transaction per part that locks the chord's row: exactly one part
// completes it.
//
// django-celery-results counts chords natively, in ChordCounter: the
// Python client creates it with the header's result tuples, and each part
// decrements it under SELECT ... FOR UPDATE. celeriac does the same, so Go
// and Python workers share a chord's header and the part that brings the
// count to zero, whichever worker runs it, fires the body once. The
// results are read from the task table in header order. Like Python's, a
// header task delivered twice (a redelivery after a crash) counts twice on
// a counter the Python client created; the body then fails with a
// ChordError naming the part that is not ready, where Python's backend
// would never fire it. A counter a celeriac worker created keeps one slot
// per part and counts each once.
//
// sql imports backend and protocol, pgx and zap.
package sql
