package retry_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/celeriac/celeriac/retry"
)

// valueError and typeError stand for the Python exceptions of
// gen_decisions.py: ValueError is listed in autoretry_for, TypeError is not.
type valueError struct{ msg string }

func (e *valueError) Error() string { return e.msg }

type typeError struct{ msg string }

func (e *typeError) Error() string { return e.msg }

// decisionsGolden is testdata/decisions.json, written by gen_decisions.py
// from real Celery tasks.
type decisionsGolden struct {
	Celery string `json:"celery"`
	Cases  []struct {
		Task    string `json:"task"`
		Policy  string `json:"policy"`
		Action  string `json:"action"`
		Retries int    `json:"retries"`
		Outcome struct {
			Retry     bool     `json:"retry"`
			Countdown *float64 `json:"countdown"`
			ETAOffset *float64 `json:"eta_offset"`
			Exc       *string  `json:"exc"`
			Message   string   `json:"message"`
		} `json:"outcome"`
	} `json:"cases"`
}

// celeryPolicies are the Go spelling of gen_decisions.py's POLICIES.
func celeryPolicies() map[string]retry.Policy {
	listed := []retry.Matcher{retry.OnType[*valueError]()}
	return map[string]retry.Policy{
		"defaults":            {},
		"auto":                {AutoRetryFor: listed},
		"auto_max1":           {AutoRetryFor: listed, MaxRetries: retry.Limited(1)},
		"auto_max0":           {AutoRetryFor: listed, MaxRetries: retry.Limited(0)},
		"auto_unlimited":      {AutoRetryFor: listed, MaxRetries: retry.Unlimited()},
		"auto_delay5":         {AutoRetryFor: listed, DefaultRetryDelay: 5 * time.Second},
		"auto_countdown7":     {AutoRetryFor: listed, Countdown: 7 * time.Second},
		"auto_backoff":        {AutoRetryFor: listed, Backoff: 1, Jitter: retry.JitterOff},
		"auto_backoff3_max10": {AutoRetryFor: listed, Backoff: 3, BackoffMax: 10 * time.Second, Jitter: retry.JitterOff},
		// Celery ignores retry_kwargs' countdown once retry_backoff is set;
		// Validate reports this combination, Decide must still agree.
		"auto_backoff_countdown7": {AutoRetryFor: listed, Backoff: 2, Jitter: retry.JitterOff, Countdown: 7 * time.Second},
		"auto_backoff_jitter_top": {AutoRetryFor: listed, Backoff: 1, BackoffMax: 20 * time.Second},
	}
}

// celeryAction is the Go spelling of gen_decisions.py's ACTIONS: the error
// the handler returns, given the ValueError it ran into.
func celeryAction(t *testing.T, action string, exc error) error {
	switch action {
	case "raise_listed":
		return exc
	case "raise_unlisted":
		return &typeError{"bad input"}
	case "retry_exc":
		return retry.Later(exc)
	case "retry_noexc":
		return retry.Later(nil)
	case "retry_countdown30":
		return retry.After(30*time.Second, exc)
	case "retry_countdown0":
		return retry.Now(exc)
	case "retry_eta":
		return retry.At(testNow.Add(90*time.Second), exc)
	case "retry_noexc_max5":
		return retry.Later(nil).WithMaxRetries(5)
	case "retry_exc_max1":
		return retry.Later(exc).WithMaxRetries(1)
	}
	t.Fatalf("action %q has no Go spelling; update celeryAction", action)
	return nil
}

// TestDecideMatchesCelery replays every case Celery decided, with the error
// returned as is and wrapped by a middleware.
func TestDecideMatchesCelery(t *testing.T) {
	var g decisionsGolden
	readJSON(t, "testdata/decisions.json", &g)
	if g.Celery == "" || len(g.Cases) < 400 {
		t.Fatalf("testdata/decisions.json holds %d cases from celery %q; regenerate it with gen_decisions.py", len(g.Cases), g.Celery)
	}
	policies := celeryPolicies()
	// Celery's random source was replaced by one that always draws the top.
	top := func(n int) int { return n - 1 }
	for _, c := range g.Cases {
		p, ok := policies[c.Policy]
		if !ok {
			t.Fatalf("policy %q has no Go spelling; update celeryPolicies", c.Policy)
		}
		exc := &valueError{fmt.Sprintf("flaky %d", c.Retries)}
		handlerErr := celeryAction(t, c.Action, exc)
		for _, wrapped := range []bool{false, true} {
			err := handlerErr
			if wrapped {
				err = fmt.Errorf("middleware: %w", err)
			}
			name := fmt.Sprintf("%s (wrapped %v)", c.Task, wrapped)
			d := p.Decide(err, c.Retries, testNow, top)
			want := c.Outcome
			if d.Retry != want.Retry {
				t.Errorf("%s: Retry = %v, Celery %v (decision %+v)", name, d.Retry, want.Retry, d)
				continue
			}
			if want.Retry {
				var wantCountdown time.Duration
				switch {
				case want.Countdown != nil:
					wantCountdown = time.Duration(*want.Countdown * float64(time.Second))
				case want.ETAOffset != nil:
					wantCountdown = time.Duration(*want.ETAOffset * float64(time.Second))
				default:
					t.Fatalf("%s: Celery retried without a countdown or eta", name)
				}
				if d.Countdown != wantCountdown {
					t.Errorf("%s: Countdown = %v, Celery %v", name, d.Countdown, wantCountdown)
				}
				wantETA := time.Time{}
				if wantCountdown > 0 {
					wantETA = testNow.Add(wantCountdown)
				}
				if !d.ETA.Equal(wantETA) {
					t.Errorf("%s: ETA = %v, want %v", name, d.ETA, wantETA)
				}
				if d.Exhausted {
					t.Errorf("%s: Exhausted with a retry", name)
				}
			}
			checkExc(t, name, d.Err, want.Exc, want.Message, c.Task, c.Retries)
		}
	}
}

// checkExc compares the recorded error with the Python exception Celery
// recorded (none, ValueError, TypeError or MaxRetriesExceededError).
func checkExc(t *testing.T, name string, got error, wantType *string, wantMsg, task string, retries int) {
	t.Helper()
	if wantType == nil {
		if got != nil {
			t.Errorf("%s: Err = %v, Celery records no exception", name, got)
		}
		return
	}
	var msg string
	switch *wantType {
	case "ValueError":
		var e *valueError
		if !errors.As(got, &e) {
			t.Errorf("%s: Err = %#v, want the ValueError", name, got)
			return
		}
		msg = e.msg
	case "TypeError":
		var e *typeError
		if !errors.As(got, &e) {
			t.Errorf("%s: Err = %#v, want the TypeError", name, got)
			return
		}
		msg = e.msg
	case "MaxRetriesExceededError":
		var e *retry.MaxRetriesExceededError
		if !errors.As(got, &e) {
			t.Errorf("%s: Err = %#v, want *MaxRetriesExceededError", name, got)
			return
		}
		// The worker fills these in; the text must then be Celery's.
		e.TaskName, e.TaskID, e.Args, e.Kwargs = task, fmt.Sprintf("id-%d", retries), "(1, 'a')", "{'k': None}"
		msg = e.Error()
	default:
		t.Fatalf("%s: Celery exception %q has no Go counterpart", name, *wantType)
	}
	if wantMsg != "" && msg != wantMsg {
		t.Errorf("%s: exception message %q, Celery %q", name, msg, wantMsg)
	}
}

func TestDecideCeleryPoliciesValidate(t *testing.T) {
	for name, p := range celeryPolicies() {
		err := p.Validate()
		if name == "auto_backoff_countdown7" {
			if !errors.Is(err, retry.ErrInvalidPolicy) {
				t.Errorf("%s: Validate() = %v, want it to report Countdown with Backoff", name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: Validate() = %v", name, err)
		}
	}
}
