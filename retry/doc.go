// Package retry holds Celery's retry policy: which errors are retried, how
// long to wait (retry_backoff, retry_backoff_max, retry_jitter and
// default_retry_delay, with Celery's exact formula) and when to give up
// (max_retries). It also defines the errors a handler returns to steer
// retries explicitly.
//
// The package is pure and imports only the standard library.
package retry
