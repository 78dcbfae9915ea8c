// Package backend is the contract for result backends: where task states and
// results are written in Celery's format so that Python's AsyncResult can read
// them.
//
// Adapters live in sub-packages: backend/redis (Celery's Redis backend:
// celery-task-meta-<id> with SETEX and PUBLISH, chords), backend/rpc
// (replies to reply_to over the broker) and backend/memory (tests). All of
// them pass the conformance suite in backend/backendtest.
//
// backend imports only protocol.
package backend
