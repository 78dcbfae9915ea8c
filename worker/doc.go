// Package worker runs Go handlers for Celery tasks: it consumes task messages
// from a transport, dispatches them by task name to handlers registered on a
// Mux, honours countdown/ETA, expires, time limits, acks_late and retries as
// Celery does, and writes results to a backend in Celery's format.
package worker
