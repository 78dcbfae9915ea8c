package worker

import (
	"time"

	"github.com/celeriac/celeriac/retry"
)

// TaskOptions are per-task settings given at registration; they override the
// worker-wide defaults in Config. Nil pointers and zero durations mean "use
// the worker default".
type TaskOptions struct {
	// AcksLate acknowledges the message after the task ran (acks_late).
	AcksLate *bool
	// TimeLimit (hard) and SoftTimeLimit; the message's timelimit header
	// overrides them.
	TimeLimit     time.Duration
	SoftTimeLimit time.Duration
	// RateLimit is Celery's rate_limit for this worker: "10/s", "100/m",
	// "1000/h", or a number meaning per second. Empty means no limit.
	RateLimit string
	// IgnoreResult stores nothing on success (ignore_result).
	IgnoreResult *bool
	// TrackStarted stores STARTED when the task starts (track_started).
	TrackStarted *bool
	// AcksOnFailure overrides Config.AcksOnFailure.
	AcksOnFailure *bool
	// Queue is where this worker's producer sends the task when no queue is
	// given (a per-task route).
	Queue string
	// GlobalRateLimit caps starts of this task across all workers sharing
	// Config.GlobalRateLimiter, in Celery's rate syntax. GlobalRateKey names
	// the bucket (default: the task name), so several tasks can share one
	// limit (a downstream API); GlobalRateBurst is the bucket size (default 1).
	GlobalRateLimit string
	GlobalRateKey   string
	GlobalRateBurst int

	// rate and globalRate are the parsed limits.
	rate, globalRate Rate

	// Retry is the task's retry policy (autoretry_for, max_retries,
	// retry_backoff, ...); nil means Config.Retry.
	Retry *retry.Policy
}

// TaskOption sets one of the TaskOptions at registration.
type TaskOption func(*TaskOptions)

// AcksLate sets acks_late for the task.
func AcksLate(v bool) TaskOption { return func(t *TaskOptions) { t.AcksLate = &v } }

// TimeLimit sets the task's hard and soft time limits (zero: none).
func TimeLimit(hard, soft time.Duration) TaskOption {
	return func(t *TaskOptions) { t.TimeLimit, t.SoftTimeLimit = hard, soft }
}

// RateLimit sets the task's per-worker rate limit in Celery's syntax.
func RateLimit(limit string) TaskOption { return func(t *TaskOptions) { t.RateLimit = limit } }

// IgnoreResult sets ignore_result for the task.
func IgnoreResult(v bool) TaskOption { return func(t *TaskOptions) { t.IgnoreResult = &v } }

// TrackStarted sets track_started for the task.
func TrackStarted(v bool) TaskOption { return func(t *TaskOptions) { t.TrackStarted = &v } }

// AcksOnFailure sets whether a terminal failure acknowledges the task's
// message instead of dead-lettering it (see Config.AcksOnFailure).
func AcksOnFailure(v bool) TaskOption {
	return func(t *TaskOptions) { t.AcksOnFailure = &v }
}

// Queue routes the task to a queue when this process publishes it.
func Queue(name string) TaskOption { return func(t *TaskOptions) { t.Queue = name } }

// Retry sets the task's retry policy.
func Retry(p retry.Policy) TaskOption { return func(t *TaskOptions) { t.Retry = &p } }

// GlobalRateLimit caps the task across all workers: limit in Celery's syntax
// ("5/s"), key names a bucket shared by several tasks ("" = task name).
func GlobalRateLimit(limit, key string, burst int) TaskOption {
	return func(t *TaskOptions) { t.GlobalRateLimit, t.GlobalRateKey, t.GlobalRateBurst = limit, key, burst }
}

// parse validates and parses the rate limits.
func (o *TaskOptions) parse() error {
	var err error
	if o.rate, err = ParseRate(o.RateLimit); err != nil {
		return err
	}
	if o.globalRate, err = ParseRate(o.GlobalRateLimit); err != nil {
		return err
	}
	return nil
}
