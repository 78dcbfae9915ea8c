package retry_test

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/celeriac/celeriac/retry"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		give retry.Policy
		// want lists substrings of the expected problems; empty: valid.
		want []string
	}{
		{"zero Policy", retry.Policy{}, nil},
		{"everything set", retry.Policy{
			MaxRetries: retry.Limited(5), DefaultRetryDelay: 2 * time.Second,
			AutoRetryFor:     []retry.Matcher{retry.On(io.EOF), retry.OnFunc(func(error) bool { return true })},
			DontAutoRetryFor: []retry.Matcher{retry.OnAny()},
			Backoff:          3, BackoffMax: time.Minute, Jitter: retry.JitterOff,
		}, nil},
		{"NoDelay everywhere", retry.Policy{DefaultRetryDelay: retry.NoDelay, Countdown: retry.NoDelay, BackoffMax: retry.NoDelay}, nil},
		{"Limited(0) and Unlimited are fine", retry.Policy{MaxRetries: retry.Limited(0)}, nil},
		{"negative MaxRetries", retry.Policy{MaxRetries: retry.Limited(-1)}, []string{"MaxRetries is negative (-1)"}},
		{"negative DefaultRetryDelay", retry.Policy{DefaultRetryDelay: -time.Second}, []string{"DefaultRetryDelay is negative"}},
		{"negative Countdown", retry.Policy{Countdown: -2}, []string{"Countdown is negative"}},
		{"negative BackoffMax", retry.Policy{BackoffMax: -time.Minute}, []string{"BackoffMax is negative"}},
		{"fractional BackoffMax", retry.Policy{BackoffMax: 1500 * time.Millisecond}, []string{"BackoffMax 1.5s is not a whole number of seconds"}},
		{"negative Backoff", retry.Policy{Backoff: -1}, []string{"Backoff is negative (-1)"}},
		{"unknown Jitter", retry.Policy{Jitter: 7}, []string{"Jitter is not a valid value (7)"}},
		{"Countdown with Backoff", retry.Policy{Backoff: 1, Countdown: time.Second}, []string{"Countdown has no effect when Backoff is set"}},
		{"zero Matcher", retry.Policy{AutoRetryFor: []retry.Matcher{retry.On(io.EOF), {}}}, []string{"AutoRetryFor[1]: zero Matcher"}},
		{"On without targets", retry.Policy{DontAutoRetryFor: []retry.Matcher{retry.On()}}, []string{"DontAutoRetryFor[0]: retry.On without targets"}},
		{"On with a nil target", retry.Policy{AutoRetryFor: []retry.Matcher{retry.On(io.EOF, nil)}}, []string{"AutoRetryFor[0]: retry.On target 1 is nil"}},
		{"OnFunc(nil)", retry.Policy{AutoRetryFor: []retry.Matcher{retry.OnFunc(nil)}}, []string{"AutoRetryFor[0]: retry.OnFunc with a nil function"}},
		{"several problems are all reported", retry.Policy{Backoff: -1, Jitter: 9, MaxRetries: retry.Limited(-3)},
			[]string{"Backoff is negative", "Jitter is not a valid value", "MaxRetries is negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.give.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, retry.ErrInvalidPolicy) {
				t.Fatalf("Validate() = %v, want an error wrapping ErrInvalidPolicy", err)
			}
			msg := err.Error()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("Validate() = %q, want it to mention %q", msg, w)
				}
			}
			if n := strings.Count(msg, "retry: invalid policy"); n != len(tt.want) {
				t.Errorf("Validate() reports %d problems, want %d: %q", n, len(tt.want), msg)
			}
		})
	}
}

func TestLimit(t *testing.T) {
	tests := []struct {
		name          string
		give          retry.Limit
		wantN         int
		wantUnlimited bool
		wantZero      bool
		wantString    string
	}{
		{"zero is Celery's default", retry.Limit{}, 3, false, true, "default (3)"},
		{"Limited(0)", retry.Limited(0), 0, false, false, "0"},
		{"Limited(7)", retry.Limited(7), 7, false, false, "7"},
		{"Limited(-2) acts as 0", retry.Limited(-2), 0, false, false, "-2"},
		{"Unlimited", retry.Unlimited(), 0, true, false, "unlimited"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, unlimited := tt.give.Max()
			if n != tt.wantN || unlimited != tt.wantUnlimited {
				t.Errorf("Max() = %d, %v; want %d, %v", n, unlimited, tt.wantN, tt.wantUnlimited)
			}
			if got := tt.give.IsZero(); got != tt.wantZero {
				t.Errorf("IsZero() = %v, want %v", got, tt.wantZero)
			}
			if got := tt.give.String(); got != tt.wantString {
				t.Errorf("String() = %q, want %q", got, tt.wantString)
			}
		})
	}
	if retry.Limited(0) == (retry.Limit{}) {
		t.Error("Limited(0) equals the zero Limit; zero retries must be distinguishable from the default")
	}
}

func TestJitter(t *testing.T) {
	for _, tt := range []struct {
		give    retry.Jitter
		enabled bool
		str     string
	}{
		{retry.JitterDefault, true, "default (on)"},
		{retry.JitterOn, true, "on"},
		{retry.JitterOff, false, "off"},
		{retry.Jitter(9), true, "Jitter(9)"},
	} {
		if got := tt.give.Enabled(); got != tt.enabled {
			t.Errorf("%v.Enabled() = %v, want %v", tt.give, got, tt.enabled)
		}
		if got := tt.give.String(); got != tt.str {
			t.Errorf("Jitter(%d).String() = %q, want %q", uint8(tt.give), got, tt.str)
		}
	}
}

func TestMatcherString(t *testing.T) {
	for _, tt := range []struct {
		give retry.Matcher
		want string
	}{
		{retry.On(io.EOF, errTransient), `On("EOF", "transient")`},
		{retry.On(nil), `On(<nil>)`},
		{retry.OnType[*valueError](), `OnType[*retry_test.valueError]`},
		{retry.OnFunc(func(error) bool { return true }), "OnFunc"},
		{retry.OnAny(), "OnAny"},
		{retry.Matcher{}, "Matcher{}"},
	} {
		if got := tt.give.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

// TestOnCopiesTargets checks that changing the caller's slice after On
// returns does not change what the matcher matches.
func TestOnCopiesTargets(t *testing.T) {
	targets := []error{errTransient}
	m := retry.On(targets...)
	targets[0] = errBadInput
	if !m.Match(errTransient) || m.Match(errBadInput) {
		t.Errorf("On changed with the caller's slice: Match(transient) = %v, Match(bad input) = %v", m.Match(errTransient), m.Match(errBadInput))
	}
}

func TestReasonString(t *testing.T) {
	want := map[retry.Reason]string{
		retry.ReasonNone: "none", retry.ReasonExplicit: "explicit", retry.ReasonAuto: "auto",
		retry.ReasonSkip: "skip", retry.ReasonExcluded: "excluded", retry.ReasonNotRetryable: "not-retryable",
		retry.Reason(200): "unknown",
	}
	for r, s := range want {
		if got := r.String(); got != s {
			t.Errorf("Reason(%d).String() = %q, want %q", uint8(r), got, s)
		}
	}
}

func TestErrorText(t *testing.T) {
	eta := time.Date(2026, 11, 29, 12, 1, 30, 0, time.UTC)
	for _, tt := range []struct {
		give error
		want string
	}{
		{retry.After(30*time.Second, errTransient), "retry: in 30s: transient"},
		{retry.After(30*time.Second, nil), "retry: in 30s"},
		{retry.Now(errTransient), "retry: in 0s: transient"},
		{retry.At(eta, errTransient), "retry: at 2026-11-29T12:01:30Z: transient"},
		{retry.Later(errTransient), "retry: after the default delay: transient"},
		{retry.AfterHeader("120", errTransient), `retry: after Retry-After "120": transient`},
		{retry.After(time.Second, errTransient).WithMaxRetries(4), "retry: in 1s: transient"},
		{(*retry.Error)(nil), "retry: after the default delay"},
		{retry.Skip(errBadInput), "retry: skip: bad input"},
		{retry.Skip(nil), "retry: skip"},
	} {
		if got := tt.give.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestErrorWrapping(t *testing.T) {
	e := retry.After(time.Second, errTransient)
	wrapped := fmt.Errorf("mw: %w", e)
	var got *retry.Error
	if !errors.As(wrapped, &got) || got != e {
		t.Errorf("errors.As did not find the *Error through a wrapper")
	}
	if !errors.Is(wrapped, errTransient) {
		t.Errorf("errors.Is(wrapped *Error, cause) = false")
	}
	if errors.Unwrap(e) != errTransient || retry.Later(nil).Unwrap() != nil || (*retry.Error)(nil).Unwrap() != nil {
		t.Errorf("Unwrap does not return the cause")
	}
	// WithMaxRetries copies: the original keeps the policy's limit.
	p := retry.Policy{MaxRetries: retry.Limited(1)}
	_ = e.WithMaxRetries(9)
	if d := p.Decide(e, 1, testNow, nil); !d.Exhausted {
		t.Errorf("WithMaxRetries changed the original *Error: %+v", d)
	}
	if d := p.Decide((*retry.Error)(nil).WithMaxRetries(9), 1, testNow, nil); !d.Retry || d.Countdown != retry.DefaultDelay {
		t.Errorf("nil *Error WithMaxRetries: %+v, want a retry after the default delay", d)
	}

	s := fmt.Errorf("mw: %w", retry.Skip(errBadInput))
	if !errors.Is(s, retry.ErrSkip) || !errors.Is(s, errBadInput) {
		t.Errorf("Skip is not found through a wrapper: Is(ErrSkip) %v, Is(cause) %v", errors.Is(s, retry.ErrSkip), errors.Is(s, errBadInput))
	}
	var ve *valueError
	if !errors.As(retry.Skip(&valueError{"v"}), &ve) || ve.msg != "v" {
		t.Errorf("errors.As does not reach the cause of Skip")
	}
	if errors.Is(errBadInput, retry.ErrSkip) {
		t.Errorf("a plain error matches ErrSkip")
	}
}

func TestMaxRetriesExceededError(t *testing.T) {
	for _, tt := range []struct {
		give retry.MaxRetriesExceededError
		want string
	}{
		{retry.MaxRetriesExceededError{TaskName: "tasks.add", TaskID: "d9c4", Args: "(1, 2)", Kwargs: "{}"},
			"Can't retry tasks.add[d9c4] args:(1, 2) kwargs:{}"},
		{retry.MaxRetriesExceededError{TaskName: "t.one", TaskID: "x", Args: "(1,)", Kwargs: "{'k': None}"},
			"Can't retry t.one[x] args:(1,) kwargs:{'k': None}"},
		{retry.MaxRetriesExceededError{TaskName: "t.none", TaskID: "y"},
			"Can't retry t.none[y] args:() kwargs:{}"},
	} {
		if got := tt.give.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
	e := &retry.MaxRetriesExceededError{}
	if e.ExcType() != "MaxRetriesExceededError" || e.ExcModule() != "celery.exceptions" {
		t.Errorf("Python exception = %s.%s, want celery.exceptions.MaxRetriesExceededError", e.ExcModule(), e.ExcType())
	}
}
