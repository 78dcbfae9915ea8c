package retry_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	"github.com/celeriac/celeriac/retry"
)

// A task that retries a flaky dependency with exponential backoff (Celery's
// retry_backoff=True, retry_backoff_max=60, retry_jitter=False,
// max_retries=6): the delays double from 1 s and are capped at 60 s, and the
// seventh failure is final.
func ExamplePolicy_Decide_backoff() {
	errUnavailable := errors.New("payments: 503 service unavailable")
	p := retry.Policy{
		AutoRetryFor: []retry.Matcher{retry.On(errUnavailable)},
		MaxRetries:   retry.Limited(6),
		Backoff:      1,
		BackoffMax:   60 * time.Second,
		Jitter:       retry.JitterOff,
	}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for retries := 0; retries <= 6; retries++ {
		d := p.Decide(errUnavailable, retries, now, nil)
		if d.Retry {
			fmt.Printf("failure %d: retry in %v\n", retries+1, d.Countdown)
		} else {
			fmt.Printf("failure %d: give up (exhausted %v): %v\n", retries+1, d.Exhausted, d.Err)
		}
	}
	// Output:
	// failure 1: retry in 1s
	// failure 2: retry in 2s
	// failure 3: retry in 4s
	// failure 4: retry in 8s
	// failure 5: retry in 16s
	// failure 6: retry in 32s
	// failure 7: give up (exhausted true): payments: 503 service unavailable
}

// With jitter on (Celery's default), each delay is a random whole number of
// seconds between 0 and the backoff. The random source is the caller's.
func ExampleBackoffInterval() {
	rng := rand.New(rand.NewPCG(1, 2))
	for retries := range 4 {
		exact := retry.BackoffInterval(1, retries, 600*time.Second, false, nil)
		jittered := retry.BackoffInterval(1, retries, 600*time.Second, true, rng.IntN)
		fmt.Printf("retry %d: backoff %v, jittered within [0s, %v]: %v\n",
			retries, exact, exact, jittered >= 0 && jittered <= exact)
	}
	// Output:
	// retry 0: backoff 1s, jittered within [0s, 1s]: true
	// retry 1: backoff 2s, jittered within [0s, 2s]: true
	// retry 2: backoff 4s, jittered within [0s, 4s]: true
	// retry 3: backoff 8s, jittered within [0s, 8s]: true
}

// A handler asks for a retry itself, as Celery's
// `raise self.retry(exc=exc, countdown=30)` does, and marks bad input as
// permanent. Middleware may wrap either error.
func ExampleAfter() {
	errTimeout := errors.New("smtp: timeout")
	errBadAddress := errors.New("smtp: 550 no such user")
	send := func(to string) error {
		switch to {
		case "slow@example.com":
			return retry.After(30*time.Second, errTimeout)
		case "nobody@example.com":
			return retry.Skip(errBadAddress)
		}
		return nil
	}

	var p retry.Policy // Celery's defaults: max_retries=3, nothing auto-retried
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, to := range []string{"slow@example.com", "nobody@example.com"} {
		err := fmt.Errorf("send to %s: %w", to, send(to))
		d := p.Decide(err, 0, now, nil)
		if d.Retry {
			fmt.Printf("%s: retry at %s (%v), record %q\n", to, d.ETA.Format(time.TimeOnly), d.Reason, d.Err)
		} else {
			fmt.Printf("%s: fail now (%v), record %q\n", to, d.Reason, d.Err)
		}
	}
	// On the fourth attempt the limit is reached: FAILURE with the error.
	d := p.Decide(retry.After(30*time.Second, errTimeout), 3, now, nil)
	fmt.Printf("attempt 4: retry=%v exhausted=%v, record %q\n", d.Retry, d.Exhausted, d.Err)
	// Output:
	// slow@example.com: retry at 12:00:30 (explicit), record "smtp: timeout"
	// nobody@example.com: fail now (skip), record "smtp: 550 no such user"
	// attempt 4: retry=false exhausted=true, record "smtp: timeout"
}

// An HTTP 429 or 503 carries Retry-After, in seconds or as a date; the
// server's delay overrides the policy's backoff, and a missing or invalid
// header falls back to the backoff.
func ExampleAfterHeader() {
	errThrottled := errors.New("partner API: 429 too many requests")
	p := retry.Policy{Backoff: 2, Jitter: retry.JitterOff}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, header := range []string{"120", "Sun, 29 Nov 2026 12:05:00 GMT", "Sun, 29 Nov 2026 11:00:00 GMT", ""} {
		d := p.Decide(retry.AfterHeader(header, errThrottled), 1, now, nil)
		fmt.Printf("Retry-After %q: retry in %v\n", header, d.Countdown)
	}
	// Output:
	// Retry-After "120": retry in 2m0s
	// Retry-After "Sun, 29 Nov 2026 12:05:00 GMT": retry in 5m0s
	// Retry-After "Sun, 29 Nov 2026 11:00:00 GMT": retry in 0s
	// Retry-After "": retry in 4s
}

func ExampleParseRetryAfter() {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, v := range []string{"30", "Sun, 29 Nov 2026 12:01:00 GMT", "soon"} {
		d, ok := retry.ParseRetryAfter(v, now)
		fmt.Println(d, ok)
	}
	// Output:
	// 30s true
	// 1m0s true
	// 0s false
}

// Errors are matched like Python exception classes: by identity through
// wrapping (On), by type (OnType) or by a predicate (OnFunc). A match in
// DontAutoRetryFor wins.
func ExampleMatcher() {
	type httpError struct{ error }
	errReset := errors.New("connection reset")
	errNotFound := &httpError{errors.New("HTTP 404")}
	p := retry.Policy{
		AutoRetryFor:     []retry.Matcher{retry.On(errReset), retry.OnType[*httpError]()},
		DontAutoRetryFor: []retry.Matcher{retry.OnFunc(func(err error) bool { return errors.Is(err, errNotFound) })},
		Backoff:          1,
		Jitter:           retry.JitterOff,
	}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, err := range []error{
		fmt.Errorf("read: %w", errReset),
		&httpError{errors.New("HTTP 502")},
		errNotFound,
		errors.New("division by zero"),
	} {
		d := p.Decide(err, 0, now, nil)
		fmt.Printf("%v: retry=%v (%v)\n", err, d.Retry, d.Reason)
	}
	// Output:
	// read: connection reset: retry=true (auto)
	// HTTP 502: retry=true (auto)
	// HTTP 404: retry=false (excluded)
	// division by zero: retry=false (not-retryable)
}

// A policy that never retries, and one that retries forever.
func ExampleLimited() {
	err := errors.New("flaky")
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	never := retry.Policy{AutoRetryFor: []retry.Matcher{retry.OnAny()}, MaxRetries: retry.Limited(0)}
	forever := retry.Policy{AutoRetryFor: []retry.Matcher{retry.OnAny()}, MaxRetries: retry.Unlimited()}
	fmt.Println(never.Decide(err, 0, now, nil).Retry, forever.Decide(err, 1_000_000, now, nil).Retry)
	// Output:
	// false true
}

// When an explicit retry without an error runs out, the task fails with
// Celery's MaxRetriesExceededError; the worker fills in the task fields.
func ExampleMaxRetriesExceededError() {
	var p retry.Policy
	d := p.Decide(retry.Later(nil), 3, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC), nil)
	var mre *retry.MaxRetriesExceededError
	if errors.As(d.Err, &mre) {
		mre.TaskName, mre.TaskID, mre.Args, mre.Kwargs = "tasks.add", "7f1c", "(2, 2)", "{}"
	}
	fmt.Println(d.Exhausted, d.Err)
	// Output:
	// true Can't retry tasks.add[7f1c] args:(2, 2) kwargs:{}
}

// Celery's
//
//	@app.task(autoretry_for=(OSError, Unavailable), dont_autoretry_for=(CardDeclined,),
//	          retry_backoff=True, retry_backoff_max=60, max_retries=5)
//
// as a Policy (the worker takes it with worker.Retry), the delays it waits
// before each retry, and what it does with each error.
func ExamplePolicy() {
	errUnavailable := errors.New("gateway: 503 service unavailable")
	errCardDeclined := errors.New("gateway: card declined")
	p := retry.Policy{
		AutoRetryFor:     []retry.Matcher{retry.OnType[*net.OpError](), retry.On(errUnavailable)},
		DontAutoRetryFor: []retry.Matcher{retry.On(errCardDeclined)},
		MaxRetries:       retry.Limited(5),
		Backoff:          1, // 1, 2, 4, 8, 16 s, each jittered to [0, n]
		BackoffMax:       60 * time.Second,
	}
	if err := p.Validate(); err != nil {
		fmt.Println(err)
		return
	}

	// The backoff before retry r (0 for the first), without the jitter:
	// the upper bound of the random delay.
	var delays []time.Duration
	for r := range 5 {
		delays = append(delays, retry.BackoffInterval(p.Backoff, r, p.BackoffMax, false, nil))
	}
	fmt.Println(delays)

	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, err := range []error{
		&net.OpError{Op: "dial", Err: errors.New("connection refused")},
		fmt.Errorf("charge: %w", errUnavailable),
		fmt.Errorf("charge: %w", errCardDeclined),
		errors.New("division by zero"),
	} {
		d := p.Decide(err, 0, now, rand.IntN)
		fmt.Printf("%v: retry=%v (%v)\n", err, d.Retry, d.Reason)
	}
	// Output:
	// [1s 2s 4s 8s 16s]
	// dial: connection refused: retry=true (auto)
	// charge: gateway: 503 service unavailable: retry=true (auto)
	// charge: gateway: card declined: retry=false (excluded)
	// division by zero: retry=false (not-retryable)
}
