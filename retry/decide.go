package retry

import (
	"errors"
	"time"
)

// Reason says which rule produced a [Decision].
type Reason uint8

const (
	// ReasonNone: the error was nil; there is nothing to decide.
	ReasonNone Reason = iota
	// ReasonExplicit: the handler returned an [*Error].
	ReasonExplicit
	// ReasonAuto: [Policy.AutoRetryFor] matched the error.
	ReasonAuto
	// ReasonSkip: the error matches [ErrSkip].
	ReasonSkip
	// ReasonExcluded: [Policy.DontAutoRetryFor] matched the error.
	ReasonExcluded
	// ReasonNotRetryable: no rule asks for a retry, so the task fails at
	// once, as an exception outside autoretry_for does in Celery.
	ReasonNotRetryable
)

// String returns the reason as a short lowercase word, for logs.
func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonExplicit:
		return "explicit"
	case ReasonAuto:
		return "auto"
	case ReasonSkip:
		return "skip"
	case ReasonExcluded:
		return "excluded"
	case ReasonNotRetryable:
		return "not-retryable"
	default:
		return "unknown"
	}
}

// Decision is what to do with a failed attempt: publish a retry (Celery's
// RETRY state) or fail the task (FAILURE).
type Decision struct {
	// Retry is true when the task is to be published again with its
	// retries header set to the current count + 1.
	Retry bool
	// Countdown is how long from now the retry should run; zero when Retry
	// is false. Never negative.
	Countdown time.Duration
	// ETA is now + Countdown, or the zero time when Countdown is zero:
	// Celery publishes an immediate retry without an eta.
	ETA time.Time
	// Exhausted is true when a retry was asked for (explicitly or by
	// AutoRetryFor) but the limit was reached, so Retry is false.
	Exhausted bool
	// MaxRetries is the limit that was applied when a retry was asked for:
	// the policy's (the zero Limit resolved to [Limited](3)), or the
	// override of [Error.WithMaxRetries]. It is the zero Limit when no
	// retry was asked for.
	MaxRetries Limit
	// Err is the exception to record. With Retry it goes with the RETRY
	// state and may be nil (an explicit retry without an error: Celery
	// stores a null result). Otherwise it is the FAILURE exception: the
	// error the handler passed to the retry request or to [Skip], the
	// handler's error itself, or, for an exhausted explicit retry without
	// an error, a [*MaxRetriesExceededError] whose task fields the worker
	// fills in. Err is nil only with Reason ReasonNone or a retry.
	Err error
	// Reason is the rule that decided.
	Reason Reason
}

// Decide applies Celery's retry rules to err, the error a handler returned on
// attempt number retries (the message's retries header: 0 the first time).
// now is the current time, used for ETAs and HTTP dates; randn is the random
// source for jitter, as in [BackoffInterval]. Decide is pure: the same
// arguments and randn draws give the same Decision.
//
// The rules, in order, with Celery's semantics (celery/app/task.py
// Task.retry, celery/app/autoretry.py):
//
//  1. err matches [ErrSkip]: FAILURE now with Skip's cause.
//  2. err wraps an [*Error] (an explicit retry): retry, unless retries+1
//     exceeds the limit (the policy's MaxRetries, or the per-call
//     override); then FAILURE with the error passed to the request, or
//     with [*MaxRetriesExceededError] if there was none. AutoRetryFor and
//     DontAutoRetryFor play no part.
//  3. err matches DontAutoRetryFor: FAILURE now with err.
//  4. err matches AutoRetryFor: retry with the backoff if Backoff is set,
//     else Countdown if set, else DefaultRetryDelay; on exhaustion FAILURE
//     with err itself, never MaxRetriesExceededError, because Celery's
//     autoretry calls task.retry(exc=exc).
//  5. Anything else: FAILURE now with err.
//
// The worker handles its own outcomes (Reject, Ignore, revocation) before
// calling Decide; an OnAny matcher would otherwise claim them. A nil err
// gives the zero Decision. Retries below zero count as zero. Decide does not
// validate p; see [Policy.Validate].
func (p Policy) Decide(err error, retries int, now time.Time, randn func(n int) int) Decision {
	if err == nil {
		return Decision{}
	}
	retries = max(retries, 0)
	if errors.Is(err, ErrSkip) {
		cause := err
		var s *skipError
		if errors.As(err, &s) && s.err != nil {
			cause = s.err
		}
		return Decision{Err: cause, Reason: ReasonSkip}
	}
	var re *Error
	if errors.As(err, &re) {
		return p.explicit(re.orLater(), retries, now, randn)
	}
	if matchAny(p.DontAutoRetryFor, err) {
		return Decision{Err: err, Reason: ReasonExcluded}
	}
	if !matchAny(p.AutoRetryFor, err) {
		return Decision{Err: err, Reason: ReasonNotRetryable}
	}
	d := Decision{Err: err, Reason: ReasonAuto, MaxRetries: p.MaxRetries.resolved()}
	if p.MaxRetries.exceeded(retries + 1) {
		d.Exhausted = true
		return d
	}
	return d.retryIn(p.autoCountdown(retries, randn), now)
}

func (p Policy) explicit(e Error, retries int, now time.Time, randn func(int) int) Decision {
	d := Decision{Err: e.err, Reason: ReasonExplicit, MaxRetries: p.MaxRetries.resolved()}
	if !e.max.IsZero() {
		d.MaxRetries = e.max
	}
	if d.MaxRetries.exceeded(retries + 1) {
		d.Exhausted = true
		if d.Err == nil {
			d.Err = &MaxRetriesExceededError{}
		}
		return d
	}
	switch e.when {
	case whenCountdown:
		return d.retryIn(e.countdown, now)
	case whenETA:
		if !e.eta.After(now) {
			return d.retryIn(0, now)
		}
		// Keep the caller's instant exactly rather than now+Sub, which
		// could differ by the monotonic reading.
		d.Retry, d.Countdown, d.ETA = true, e.eta.Sub(now), e.eta
		return d
	case whenHeader:
		if delay, ok := ParseRetryAfter(e.header, now); ok {
			return d.retryIn(delay, now)
		}
		return d.retryIn(p.autoCountdown(retries, randn), now)
	default:
		return d.retryIn(p.retryDelay(), now)
	}
}

func (d Decision) retryIn(countdown time.Duration, now time.Time) Decision {
	d.Retry = true
	d.Countdown = max(countdown, 0)
	if d.Countdown > 0 {
		d.ETA = now.Add(d.Countdown)
	}
	return d
}
