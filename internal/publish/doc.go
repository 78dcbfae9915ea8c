// Package publish builds and publishes Celery task messages: the code
// behind client.Client (apply_async, send_task, canvas) and the worker's own
// publishing (retries, callbacks, chain steps, chord bodies), so that a
// message sent from Go looks the same whoever sends it.
package publish
