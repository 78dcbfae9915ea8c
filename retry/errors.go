package retry

import (
	"errors"
	"strconv"
	"time"
)

// ErrSkip marks an error that must never be retried: the task fails at once
// with FAILURE, whatever the policy says. Return [Skip](err) to attach it to
// a cause; errors.Is(err, ErrSkip) finds it through any wrapping.
var ErrSkip = errors.New("retry: skip")

// Skip marks err as permanent (a 400, a validation error): it is never
// retried, even if [Policy.AutoRetryFor] matches it or it wraps an
// [*Error]. The returned error matches both ErrSkip and err with errors.Is
// and errors.As. The failure is recorded with err itself, or with the Skip
// error if err is nil.
func Skip(err error) error { return &skipError{err: err} }

type skipError struct{ err error }

func (e *skipError) Error() string {
	if e.err == nil {
		return ErrSkip.Error()
	}
	return ErrSkip.Error() + ": " + e.err.Error()
}

func (e *skipError) Unwrap() error { return e.err }

// Is makes errors.Is(err, ErrSkip) true without putting ErrSkip in the
// chain, so that errors.Unwrap still yields the cause.
func (e *skipError) Is(target error) bool { return target == ErrSkip }

// Error is what a handler returns to ask for a retry explicitly: Celery's
// `raise self.retry(exc=err, countdown=…)`. Build it with [After], [At],
// [Now], [Later] or [AfterHeader]; the worker finds it with errors.As, so
// middleware may wrap it.
//
// An explicit retry happens whatever [Policy.AutoRetryFor] and
// [Policy.DontAutoRetryFor] say, unless the retry limit is reached: then the
// task fails with the wrapped error, or with [*MaxRetriesExceededError] when
// there is none (see [Policy.Decide]).
type Error struct {
	err  error
	when when
	// countdown for whenCountdown, eta for whenETA, header for whenHeader.
	countdown time.Duration
	eta       time.Time
	header    string
	// max overrides the policy's MaxRetries when not zero.
	max Limit
}

type when uint8

const (
	whenDefault   when = iota // Policy.DefaultRetryDelay
	whenCountdown             // a fixed delay
	whenETA                   // a point in time
	whenHeader                // an HTTP Retry-After value
)

// After asks for a retry in d: Celery's self.retry(exc=err, countdown=d). A
// d of zero or less retries at once. err, which may be nil, is recorded with
// the RETRY state and is the final exception if the retry is refused.
func After(d time.Duration, err error) *Error {
	return &Error{err: err, when: whenCountdown, countdown: d}
}

// Now asks for an immediate retry: After(0, err).
func Now(err error) *Error { return After(0, err) }

// At asks for a retry at t: Celery's self.retry(exc=err, eta=t). A t in the
// past retries at once. The zero t means no eta, so, as in Celery,
// [Policy.DefaultRetryDelay] applies.
func At(t time.Time, err error) *Error {
	if t.IsZero() {
		return Later(err)
	}
	return &Error{err: err, when: whenETA, eta: t}
}

// Later asks for a retry after the policy's [Policy.DefaultRetryDelay]:
// Celery's self.retry(exc=err) with neither countdown nor eta.
func Later(err error) *Error { return &Error{err: err, when: whenDefault} }

// AfterHeader asks for a retry when the server says: value is an HTTP
// Retry-After header (from a 429 or 503), delay-seconds or an HTTP-date,
// parsed by [ParseRetryAfter] against the time passed to [Policy.Decide]. A
// server-dictated delay overrides the policy's backoff. An empty or invalid
// value falls back to the delay the policy gives an automatic retry (the
// backoff, else Countdown, else DefaultRetryDelay), so a 429 without a usable
// header still backs off.
func AfterHeader(value string, err error) *Error {
	return &Error{err: err, when: whenHeader, header: value}
}

// WithMaxRetries returns a copy of e whose retry limit is n instead of the
// policy's, for this decision only: Celery's self.retry(max_retries=n),
// which does not carry over to later attempts either. A negative n acts
// as 0.
func (e *Error) WithMaxRetries(n int) *Error {
	c := e.orLater()
	c.max = Limited(max(n, 0))
	return &c
}

// Error describes the request in the manner of Celery's Retry exception
// ("Retry in 30s: …").
func (e *Error) Error() string {
	c := e.orLater()
	var s string
	switch c.when {
	case whenCountdown:
		s = "retry: in " + c.countdown.String()
	case whenETA:
		s = "retry: at " + c.eta.Format(time.RFC3339Nano)
	case whenHeader:
		s = "retry: after Retry-After " + strconv.Quote(c.header)
	default:
		s = "retry: after the default delay"
	}
	if c.err != nil {
		s += ": " + c.err.Error()
	}
	return s
}

// Unwrap returns the error the handler passed, which may be nil.
func (e *Error) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.err
}

// orLater treats a nil *Error as Later(nil), so that a nil pointer that
// reaches the worker inside an interface still means "retry", never a panic.
func (e *Error) orLater() Error {
	if e == nil {
		return Error{}
	}
	return *e
}

// MaxRetriesExceededError is the final exception of a task that asked for
// an explicit retry without an error once its retries ran out: Celery's
// celery.exceptions.MaxRetriesExceededError. [Policy.Decide] returns it with
// the task fields empty; the worker fills them in before recording it, so
// that Error() reads exactly as Celery's message, which Python clients see.
type MaxRetriesExceededError struct {
	// TaskName is the Celery task name, e.g. "tasks.add".
	TaskName string
	// TaskID is the task id.
	TaskID string
	// Args is the Python repr of the positional arguments as a tuple, as
	// Celery prints them: "(1, 'a')", "(1,)" or "()" (the default when empty).
	Args string
	// Kwargs is the Python repr of the keyword arguments: "{'k': None}", or
	// "{}" (the default when empty).
	Kwargs string
}

// Error returns Celery's text, "Can't retry <name>[<id>] args:<args>
// kwargs:<kwargs>". It has no package prefix because it becomes the
// exc_message Python clients read.
func (e *MaxRetriesExceededError) Error() string {
	args, kwargs := e.Args, e.Kwargs
	if args == "" {
		args = "()"
	}
	if kwargs == "" {
		kwargs = "{}"
	}
	return "Can't retry " + e.TaskName + "[" + e.TaskID + "] args:" + args + " kwargs:" + kwargs
}

// ExcType is the exception's Python class name, for the result backend's
// exc_type field.
func (e *MaxRetriesExceededError) ExcType() string { return "MaxRetriesExceededError" }

// ExcModule is the exception's Python module, for the result backend's
// exc_module field: a Python client then raises the real Celery exception.
func (e *MaxRetriesExceededError) ExcModule() string { return "celery.exceptions" }
