package retry

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Celery's defaults for a task's retry options (celery/app/task.py and
// celery/app/autoretry.py). A zero [Policy] field means the matching default.
const (
	DefaultMaxRetries = 3                 // Task.max_retries
	DefaultDelay      = 180 * time.Second // Task.default_retry_delay
	DefaultBackoffMax = 600 * time.Second // Task.retry_backoff_max
)

// NoDelay, as the value of [Policy.DefaultRetryDelay], [Policy.Countdown] or
// [Policy.BackoffMax], stands for an explicit zero ("retry at once", "cap the
// backoff at zero"). It exists because the zero value of those fields means
// Celery's default, as go-redis does with -1 for its timeouts.
const NoDelay time.Duration = -1

// ErrInvalidPolicy is wrapped by every error [Policy.Validate] returns.
var ErrInvalidPolicy = errors.New("retry: invalid policy")

// Limit is a maximum number of retries: Celery's max_retries. The zero Limit
// means Celery's default, [DefaultMaxRetries]. Build other values with
// [Limited] and [Unlimited].
type Limit struct {
	n    int
	kind limitKind
}

type limitKind uint8

const (
	limitDefault limitKind = iota
	limitFinite
	limitUnlimited
)

// Limited returns a Limit of n retries. Limited(0) means a failure is never
// retried. A negative n is reported by [Policy.Validate] and otherwise acts
// as 0, as it does in Celery (retries+1 > n always holds).
func Limited(n int) Limit { return Limit{n: n, kind: limitFinite} }

// Unlimited returns the Limit that never runs out: Celery's
// max_retries=None.
func Unlimited() Limit { return Limit{kind: limitUnlimited} }

// IsZero reports whether l is the zero Limit, which stands for a default:
// [DefaultMaxRetries] in a [Policy], the policy's limit in an [*Error].
func (l Limit) IsZero() bool { return l.kind == limitDefault }

// Max returns the number of retries l allows, resolving the zero Limit to
// [DefaultMaxRetries]. unlimited is true for [Unlimited], and n is then 0.
func (l Limit) Max() (n int, unlimited bool) {
	switch l.kind {
	case limitUnlimited:
		return 0, true
	case limitFinite:
		return max(l.n, 0), false
	default:
		return DefaultMaxRetries, false
	}
}

// String returns the limit as a number, "unlimited", or "default (3)".
func (l Limit) String() string {
	switch l.kind {
	case limitUnlimited:
		return "unlimited"
	case limitFinite:
		return strconv.Itoa(l.n)
	default:
		return "default (" + strconv.Itoa(DefaultMaxRetries) + ")"
	}
}

// resolved returns l with the zero Limit replaced by Limited(3), so that a
// Decision says which limit applied.
func (l Limit) resolved() Limit {
	if l.kind == limitDefault {
		return Limited(DefaultMaxRetries)
	}
	return l
}

// exceeded reports whether a retry numbered retries (the value the new
// message's retries header would carry) is refused. Celery's test is
// `max_retries is not None and retries > max_retries`.
func (l Limit) exceeded(retries int) bool {
	n, unlimited := l.Max()
	return !unlimited && retries > n
}

// Jitter is Celery's retry_jitter, whose default is true: the zero value
// therefore means "on", and JitterOff is how to turn it off.
type Jitter uint8

const (
	JitterDefault Jitter = iota // Celery's default: on
	JitterOn                    // full jitter: a random whole second in [0, backoff]
	JitterOff                   // the exact backoff
)

// Enabled reports whether jitter applies.
func (j Jitter) Enabled() bool { return j != JitterOff }

// String returns "default (on)", "on" or "off".
func (j Jitter) String() string {
	switch j {
	case JitterDefault:
		return "default (on)"
	case JitterOn:
		return "on"
	case JitterOff:
		return "off"
	default:
		return "Jitter(" + strconv.Itoa(int(j)) + ")"
	}
}

// Policy is a task's retry configuration, with Celery's option names. The
// zero Policy is Celery's default task: up to 3 retries, only when the handler
// asks for one (no error is retried automatically), 180 s apart.
//
// A Policy is a plain value: copy it freely; it is safe for concurrent use as
// long as nobody modifies it.
type Policy struct {
	// MaxRetries is Celery's max_retries. Zero means 3; use [Limited](0)
	// for no retries at all and [Unlimited] for Celery's None.
	MaxRetries Limit

	// DefaultRetryDelay is Celery's default_retry_delay: the countdown of an
	// explicit retry that names no time ([Later]), and of an automatic retry
	// when neither Backoff nor Countdown is set. Zero means 180 s; [NoDelay]
	// means at once.
	DefaultRetryDelay time.Duration

	// AutoRetryFor is Celery's autoretry_for: an error matched by any of
	// these is retried without the handler asking. Empty means no error is.
	AutoRetryFor []Matcher

	// DontAutoRetryFor is Celery's dont_autoretry_for (Celery 5.3+): an error
	// matched by any of these is never retried automatically, even when
	// AutoRetryFor matches it too. Explicit retries are not affected.
	DontAutoRetryFor []Matcher

	// Backoff is Celery's retry_backoff for automatic retries: 0 (Celery's
	// False, the default) turns exponential backoff off, 1 is Celery's True,
	// and n > 1 is the factor: the countdown of retry number r (0 for the
	// first) is min(BackoffMax, n * 2**r) seconds, jittered. See
	// [BackoffInterval].
	Backoff int

	// BackoffMax is Celery's retry_backoff_max, the cap on the backoff.
	// Celery takes whole seconds (int()), so a fraction is dropped; Validate
	// reports one. Zero means 600 s; [NoDelay] caps the backoff at zero.
	BackoffMax time.Duration

	// Jitter is Celery's retry_jitter: whether the backoff is replaced by a
	// random whole number of seconds between 0 and itself. The zero value is
	// Celery's default, on.
	Jitter Jitter

	// Countdown is the countdown of Celery's retry_kwargs for automatic
	// retries without Backoff (Celery overwrites it when retry_backoff is
	// set, and Validate reports setting both). Zero means unset, so
	// DefaultRetryDelay applies; [NoDelay] means at once.
	Countdown time.Duration
}

// Validate reports settings that make no sense: negative limits, factors or
// durations (other than [NoDelay]), a BackoffMax with a fraction of a second,
// an unknown Jitter, a zero [Matcher], or Countdown together with Backoff.
// Each problem is its own error, joined; all wrap [ErrInvalidPolicy].
// [Policy.Decide] does not call it and never panics on a bad Policy.
func (p Policy) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidPolicy}, args...)...))
	}
	if p.MaxRetries.kind == limitFinite && p.MaxRetries.n < 0 {
		bad("MaxRetries is negative (%d)", p.MaxRetries.n)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"DefaultRetryDelay", p.DefaultRetryDelay}, {"BackoffMax", p.BackoffMax}, {"Countdown", p.Countdown}} {
		if f.d < 0 && f.d != NoDelay {
			bad("%s is negative (%v); use retry.NoDelay for zero", f.name, f.d)
		}
	}
	if p.BackoffMax > 0 && p.BackoffMax%time.Second != 0 {
		bad("BackoffMax %v is not a whole number of seconds", p.BackoffMax)
	}
	if p.Backoff < 0 {
		bad("Backoff is negative (%d)", p.Backoff)
	}
	if p.Jitter > JitterOff {
		bad("Jitter is not a valid value (%d)", p.Jitter)
	}
	if p.Backoff != 0 && p.Countdown != 0 {
		bad("Countdown has no effect when Backoff is set")
	}
	for i, m := range p.AutoRetryFor {
		if err := m.validate(); err != "" {
			bad("AutoRetryFor[%d]: %s", i, err)
		}
	}
	for i, m := range p.DontAutoRetryFor {
		if err := m.validate(); err != "" {
			bad("DontAutoRetryFor[%d]: %s", i, err)
		}
	}
	return errors.Join(errs...)
}

// retryDelay is the effective default_retry_delay.
func (p Policy) retryDelay() time.Duration { return orDefault(p.DefaultRetryDelay, DefaultDelay) }

// backoffMax is the effective retry_backoff_max.
func (p Policy) backoffMax() time.Duration { return orDefault(p.BackoffMax, DefaultBackoffMax) }

// autoCountdown is the countdown Celery's autoretry wrapper passes to
// Task.retry for the failure of attempt number retries.
func (p Policy) autoCountdown(retries int, randn func(int) int) time.Duration {
	if p.Backoff != 0 {
		// Celery main: factor=int(max(1.0, retry_backoff)) whenever
		// retry_backoff is truthy, so a negative factor acts as 1.
		return BackoffInterval(max(p.Backoff, 1), retries, p.backoffMax(), p.Jitter.Enabled(), randn)
	}
	if p.Countdown != 0 {
		return max(p.Countdown, 0)
	}
	return p.retryDelay()
}

// orDefault resolves a duration field: zero is the default, any negative
// value (NoDelay, or nonsense Validate reports) is zero.
func orDefault(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	default:
		return d
	}
}
