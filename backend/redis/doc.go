// Package redis is Celery's Redis result backend (result_backend =
// redis://...), written so that Python's AsyncResult.get() behaves as if a
// Python worker had stored the result.
//
// # Keys and commands
//
// A task's state is the document protocol.EncodeResult produces, stored under
// celery-task-meta-<task id> with SETEX (SET when results do not expire) and
// PUBLISHed on the channel of the same name. Python clients waiting in
// .get() are subscribed to that channel; without the PUBLISH they would hang
// until their timeout. Both commands run in one Lua script that first reads
// the key and leaves a stored SUCCESS alone, so a redelivered or late copy of
// a task can never replace its result.
//
// Chords use Celery's keys under celery-taskset-meta-<group id>: .j (a
// sorted set of the encoded parts [1, task_id, state, result] scored by
// group_index, or a list with UnorderedChords), .t (parts added by
// Task.replace) and .s (the chord size the client writes before publishing
// the last header task). [Backend.ChordPartReturn] runs Celery's
// on_chord_part_return sequence in one script, so Go and Python workers can
// share the header tasks of one chord and exactly one of them fires the body.
//
// # Waiting for results
//
// [Backend.Wait] is the Go side of AsyncResult.get(): it wakes on the
// PUBLISH of the task's result. The Waits of a Backend share one pub/sub
// connection, as the .get() calls of a Celery app share its
// ResultConsumer: the first Wait opens it and Close closes it. One
// goroutine reads it and hands each document to the Waits of its channel;
// another sends SUBSCRIBE when a channel gets its first Wait and
// UNSUBSCRIBE when its last one leaves, in batches; a third reads the
// result keys (MGET, in batches) once each subscription is confirmed, so
// that results stored before it are found. go-redis reconnects a dropped
// connection and subscribes its channels again; the confirmations have
// every key read again, which finds the results whose PUBLISH fell in the
// gap. A PING goes out when the connection is quiet, and a connection that
// leaves it unanswered is replaced. Every 5 s the waited-for keys are read
// again (one MGET per 1024), so a writer that stores without PUBLISHing
// (gocelery, celery-rs), which would hang Python's .get(), delays a Wait
// instead of stalling it. A thousand waiting callers thus cost one
// connection and no goroutine of their own.
//
// # Global rate limits
//
// [Backend.Reserve] implements backend.RateLimiter, the limit the worker
// applies to tasks registered with worker.GlobalRateLimit: a token bucket
// per name under <GlobalKeyPrefix>celeriac.ratelimit.<name>, a hash of the
// token count and the time (µs) it was stored. One script per reservation
// adds the refill since then by Redis's clock (TIME, so all workers share
// one clock), takes a token, may leave the count below zero (the caller
// waits for the debt to be paid back: debt/rate) and sets a TTL after which
// the idle bucket, full again, vanishes. Nothing refills buckets in the
// background.
//
// # Serializer
//
// The backend stores no content type: a Python client decodes results with
// its own result_serializer. Config.Serializer must therefore match the
// clients' result_serializer (json by default), whatever serializer the
// task messages use.
//
// # Idempotency claims
//
// Backend is also a backend.IdempotencyStore, the store behind
// worker.Idempotent for a fleet of workers: one key per idempotency key,
// <GlobalKeyPrefix>celeriac.idem.<key>, holding "b"+owner while a holder
// runs the effect and "d"+result once it happened. Claim, Extend, Complete
// and Release are each one script, so a claim is atomic across every
// worker. A claim is a lease, the key's PX expiry: the holder renews it
// while it runs, and when the holder dies the key expires and the next
// delivery claims it. A result is kept for the keep duration given to
// Complete. The keys all carry a TTL, so only maxmemory-policy noeviction
// (the default) guarantees Redis does not drop them early; a Redis without
// persistence forgets them when it restarts.
//
// # Group commit
//
// Concurrent Store calls are written together. A Store that finds no round
// trip in flight sends its script at once from the caller's goroutine; the
// stores that arrive meanwhile queue up, and when that round trip returns a
// goroutine sends all of them as one pipeline, then the next queue, until
// none is left. N concurrent writers thus cost about one round trip instead
// of N, and a lone Store pays no hand-off between goroutines.
//
//	be, err := redis.New(redis.Config{URL: "redis://127.0.0.1:6379/1"})
//	if err != nil { ... }
//	defer be.Close()
//	err = be.Store(ctx, backend.StoreRequest{Meta: &protocol.ResultMeta{
//		TaskID: id, Status: protocol.StateSuccess, Result: int64(5), DateDone: time.Now()}})
//
// redis imports backend and protocol, go-redis (as goredis) and zap.
package redis
