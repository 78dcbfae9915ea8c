package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/celeriac/celeriac/retry"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

var (
	errTransient = errors.New("transient")
	errBadInput  = errors.New("bad input")
	// errInput, in a table's wanted Decision, stands for the error the
	// case passes in, which the table cannot name.
	errInput = errors.New("the error passed in")
)

// sameError reports whether got is want, or both are
// *MaxRetriesExceededError (a fresh value each time).
func sameError(got, want error) bool {
	var gm, wm *retry.MaxRetriesExceededError
	if errors.As(want, &wm) {
		return errors.As(got, &gm) && *gm == *wm
	}
	return got == want
}

func diffDecision(got, want retry.Decision) string {
	var b strings.Builder
	if got.Retry != want.Retry {
		fmt.Fprintf(&b, "Retry = %v, want %v; ", got.Retry, want.Retry)
	}
	if got.Countdown != want.Countdown {
		fmt.Fprintf(&b, "Countdown = %v, want %v; ", got.Countdown, want.Countdown)
	}
	if !got.ETA.Equal(want.ETA) {
		fmt.Fprintf(&b, "ETA = %v, want %v; ", got.ETA, want.ETA)
	}
	if got.Exhausted != want.Exhausted {
		fmt.Fprintf(&b, "Exhausted = %v, want %v; ", got.Exhausted, want.Exhausted)
	}
	if got.MaxRetries != want.MaxRetries {
		fmt.Fprintf(&b, "MaxRetries = %v, want %v; ", got.MaxRetries, want.MaxRetries)
	}
	if !sameError(got.Err, want.Err) {
		fmt.Fprintf(&b, "Err = %#v, want %#v; ", got.Err, want.Err)
	}
	if got.Reason != want.Reason {
		fmt.Fprintf(&b, "Reason = %v, want %v; ", got.Reason, want.Reason)
	}
	return b.String()
}

func retryIn(d time.Duration, err error, reason retry.Reason, l retry.Limit) retry.Decision {
	dec := retry.Decision{Retry: true, Countdown: d, Err: err, Reason: reason, MaxRetries: l}
	if d > 0 {
		dec.ETA = testNow.Add(d)
	}
	return dec
}

func TestDecide(t *testing.T) {
	auto := retry.Policy{AutoRetryFor: []retry.Matcher{retry.On(errTransient)}}
	backoff := retry.Policy{
		AutoRetryFor: []retry.Matcher{retry.On(errTransient)},
		Backoff:      2, BackoffMax: 30 * time.Second, Jitter: retry.JitterOff,
		MaxRetries: retry.Limited(10),
	}
	excluding := retry.Policy{
		AutoRetryFor:     []retry.Matcher{retry.OnAny()},
		DontAutoRetryFor: []retry.Matcher{retry.On(errBadInput), retry.OnType[*os.PathError]()},
	}
	pathErr := &os.PathError{Op: "open", Path: "/x", Err: errTransient}
	past := testNow.Add(-time.Minute)
	future := testNow.Add(90*time.Second + 5*time.Millisecond)
	def, unl := retry.Limited(retry.DefaultMaxRetries), retry.Unlimited()
	mre := &retry.MaxRetriesExceededError{}

	tests := []struct {
		name    string
		policy  retry.Policy
		err     error
		retries int
		randn   func(int) int
		want    retry.Decision // Err: errInput stands for the err passed in
	}{
		{"nil error", auto, nil, 0, nil, retry.Decision{}},

		// Plain errors and AutoRetryFor.
		{"plain error, default policy: FAILURE", retry.Policy{}, errTransient, 0, nil,
			retry.Decision{Err: errTransient, Reason: retry.ReasonNotRetryable}},
		{"unlisted error: FAILURE", auto, errBadInput, 0, nil,
			retry.Decision{Err: errBadInput, Reason: retry.ReasonNotRetryable}},
		{"listed error: default delay", auto, errTransient, 0, nil,
			retryIn(180*time.Second, errTransient, retry.ReasonAuto, def)},
		{"listed error, last allowed retry", auto, errTransient, 2, nil,
			retryIn(180*time.Second, errTransient, retry.ReasonAuto, def)},
		{"listed error exhausted: FAILURE with the error itself", auto, errTransient, 3, nil,
			retry.Decision{Exhausted: true, Err: errTransient, Reason: retry.ReasonAuto, MaxRetries: def}},
		{"listed error, Limited(0)", retry.Policy{AutoRetryFor: auto.AutoRetryFor, MaxRetries: retry.Limited(0)}, errTransient, 0, nil,
			retry.Decision{Exhausted: true, Err: errTransient, Reason: retry.ReasonAuto, MaxRetries: retry.Limited(0)}},
		{"listed error, Unlimited at retry 1e6", retry.Policy{AutoRetryFor: auto.AutoRetryFor, MaxRetries: unl}, errTransient, 1_000_000, nil,
			retryIn(180*time.Second, errTransient, retry.ReasonAuto, unl)},
		{"listed error, fixed Countdown", retry.Policy{AutoRetryFor: auto.AutoRetryFor, Countdown: 7 * time.Second}, errTransient, 0, nil,
			retryIn(7*time.Second, errTransient, retry.ReasonAuto, def)},
		{"listed error, Countdown NoDelay", retry.Policy{AutoRetryFor: auto.AutoRetryFor, Countdown: retry.NoDelay}, errTransient, 0, nil,
			retryIn(0, errTransient, retry.ReasonAuto, def)},
		{"listed error, DefaultRetryDelay NoDelay", retry.Policy{AutoRetryFor: auto.AutoRetryFor, DefaultRetryDelay: retry.NoDelay}, errTransient, 0, nil,
			retryIn(0, errTransient, retry.ReasonAuto, def)},
		{"listed error, sub-second DefaultRetryDelay", retry.Policy{AutoRetryFor: auto.AutoRetryFor, DefaultRetryDelay: 1500 * time.Millisecond}, errTransient, 0, nil,
			retryIn(1500*time.Millisecond, errTransient, retry.ReasonAuto, def)},
		{"backoff retry 0", backoff, errTransient, 0, nil,
			retryIn(2*time.Second, errTransient, retry.ReasonAuto, retry.Limited(10))},
		{"backoff retry 3", backoff, errTransient, 3, nil,
			retryIn(16*time.Second, errTransient, retry.ReasonAuto, retry.Limited(10))},
		{"backoff capped", backoff, errTransient, 9, nil,
			retryIn(30*time.Second, errTransient, retry.ReasonAuto, retry.Limited(10))},
		{"backoff exhausted", backoff, errTransient, 10, nil,
			retry.Decision{Exhausted: true, Err: errTransient, Reason: retry.ReasonAuto, MaxRetries: retry.Limited(10)}},
		{"backoff with jitter, bottom draw: immediate, no ETA",
			retry.Policy{AutoRetryFor: auto.AutoRetryFor, Backoff: 1, MaxRetries: unl}, errTransient, 4, func(int) int { return 0 },
			retryIn(0, errTransient, retry.ReasonAuto, unl)},
		{"backoff with jitter, top draw",
			retry.Policy{AutoRetryFor: auto.AutoRetryFor, Backoff: 1, MaxRetries: unl}, errTransient, 4, func(n int) int { return n - 1 },
			retryIn(16*time.Second, errTransient, retry.ReasonAuto, unl)},
		{"backoff wins over Countdown, as in Celery",
			retry.Policy{AutoRetryFor: auto.AutoRetryFor, Backoff: 1, Jitter: retry.JitterOff, Countdown: time.Hour}, errTransient, 1, nil,
			retryIn(2*time.Second, errTransient, retry.ReasonAuto, def)},
		{"negative Backoff acts as factor 1 (Celery main: max(1.0, …))",
			retry.Policy{AutoRetryFor: auto.AutoRetryFor, Backoff: -4, Jitter: retry.JitterOff}, errTransient, 2, nil,
			retryIn(4*time.Second, errTransient, retry.ReasonAuto, def)},
		{"BackoffMax NoDelay caps at zero",
			retry.Policy{AutoRetryFor: auto.AutoRetryFor, Backoff: 1, BackoffMax: retry.NoDelay, Jitter: retry.JitterOff}, errTransient, 2, nil,
			retryIn(0, errTransient, retry.ReasonAuto, def)},
		{"negative retries count as zero", backoff, errTransient, -5, nil,
			retryIn(2*time.Second, errTransient, retry.ReasonAuto, retry.Limited(10))},
		{"wrapped listed error keeps its wrapping", auto, fmt.Errorf("fetch: %w", errTransient), 0, nil,
			retryIn(180*time.Second, errInput, retry.ReasonAuto, def)},

		// DontAutoRetryFor.
		{"DontAutoRetryFor wins over AutoRetryFor", excluding, errBadInput, 0, nil,
			retry.Decision{Err: errBadInput, Reason: retry.ReasonExcluded}},
		{"DontAutoRetryFor by type", excluding, pathErr, 0, nil,
			retry.Decision{Err: pathErr, Reason: retry.ReasonExcluded}},
		{"DontAutoRetryFor leaves other errors to AutoRetryFor", excluding, io.ErrUnexpectedEOF, 0, nil,
			retryIn(180*time.Second, io.ErrUnexpectedEOF, retry.ReasonAuto, def)},
		{"DontAutoRetryFor does not stop an explicit retry", excluding, retry.After(time.Second, errBadInput), 0, nil,
			retryIn(time.Second, errBadInput, retry.ReasonExplicit, def)},

		// Skip.
		{"Skip beats AutoRetryFor", auto, retry.Skip(errTransient), 0, nil,
			retry.Decision{Err: errTransient, Reason: retry.ReasonSkip}},
		{"Skip wrapped by middleware", auto, fmt.Errorf("mw: %w", retry.Skip(errTransient)), 0, nil,
			retry.Decision{Err: errTransient, Reason: retry.ReasonSkip}},
		{"Skip(nil) records the Skip error itself", auto, retry.Skip(nil), 0, nil,
			retry.Decision{Err: errInput, Reason: retry.ReasonSkip}},
		{"bare ErrSkip", auto, retry.ErrSkip, 0, nil,
			retry.Decision{Err: retry.ErrSkip, Reason: retry.ReasonSkip}},
		{"Skip inside an explicit retry still skips", auto, retry.After(time.Second, retry.Skip(errBadInput)), 0, nil,
			retry.Decision{Err: errBadInput, Reason: retry.ReasonSkip}},

		// Explicit retries.
		{"After", retry.Policy{}, retry.After(30*time.Second, errBadInput), 0, nil,
			retryIn(30*time.Second, errBadInput, retry.ReasonExplicit, def)},
		{"After, sub-second", retry.Policy{}, retry.After(250*time.Millisecond, errBadInput), 0, nil,
			retryIn(250*time.Millisecond, errBadInput, retry.ReasonExplicit, def)},
		{"After, negative: at once", retry.Policy{}, retry.After(-time.Hour, errBadInput), 0, nil,
			retryIn(0, errBadInput, retry.ReasonExplicit, def)},
		{"Now", retry.Policy{}, retry.Now(errBadInput), 0, nil,
			retryIn(0, errBadInput, retry.ReasonExplicit, def)},
		{"Later: DefaultRetryDelay, not the backoff", backoff, retry.Later(errBadInput), 0, nil,
			retryIn(180*time.Second, errBadInput, retry.ReasonExplicit, retry.Limited(10))},
		{"Later with a DefaultRetryDelay", retry.Policy{DefaultRetryDelay: 5 * time.Second}, retry.Later(nil), 0, nil,
			retryIn(5*time.Second, nil, retry.ReasonExplicit, def)},
		{"At in the future keeps the exact instant", retry.Policy{}, retry.At(future, errBadInput), 0, nil,
			retry.Decision{Retry: true, Countdown: future.Sub(testNow), ETA: future, Err: errBadInput, Reason: retry.ReasonExplicit, MaxRetries: def}},
		{"At in the past: at once", retry.Policy{}, retry.At(past, errBadInput), 0, nil,
			retryIn(0, errBadInput, retry.ReasonExplicit, def)},
		{"At zero time: default delay, as eta=None", retry.Policy{}, retry.At(time.Time{}, errBadInput), 0, nil,
			retryIn(180*time.Second, errBadInput, retry.ReasonExplicit, def)},
		{"explicit retry exhausted with an error: FAILURE with it", retry.Policy{}, retry.After(time.Second, errBadInput), 3, nil,
			retry.Decision{Exhausted: true, Err: errBadInput, Reason: retry.ReasonExplicit, MaxRetries: def}},
		{"explicit retry exhausted without an error: MaxRetriesExceededError", retry.Policy{}, retry.After(time.Second, nil), 3, nil,
			retry.Decision{Exhausted: true, Err: mre, Reason: retry.ReasonExplicit, MaxRetries: def}},
		{"WithMaxRetries raises the limit for this call", retry.Policy{}, retry.After(time.Second, nil).WithMaxRetries(5), 4, nil,
			retryIn(time.Second, nil, retry.ReasonExplicit, retry.Limited(5))},
		{"WithMaxRetries lowers the limit for this call", retry.Policy{}, retry.After(time.Second, errBadInput).WithMaxRetries(1), 1, nil,
			retry.Decision{Exhausted: true, Err: errBadInput, Reason: retry.ReasonExplicit, MaxRetries: retry.Limited(1)}},
		{"WithMaxRetries(0) refuses the first retry", retry.Policy{}, retry.Now(nil).WithMaxRetries(0), 0, nil,
			retry.Decision{Exhausted: true, Err: mre, Reason: retry.ReasonExplicit, MaxRetries: retry.Limited(0)}},
		{"WithMaxRetries negative acts as 0", retry.Policy{MaxRetries: unl}, retry.Now(nil).WithMaxRetries(-1), 0, nil,
			retry.Decision{Exhausted: true, Err: mre, Reason: retry.ReasonExplicit, MaxRetries: retry.Limited(0)}},
		{"explicit retry under Unlimited", retry.Policy{MaxRetries: unl}, retry.Now(errBadInput), 500, nil,
			retryIn(0, errBadInput, retry.ReasonExplicit, unl)},
		{"explicit retry wrapped by middleware", retry.Policy{}, fmt.Errorf("mw: %w", retry.After(time.Minute, errBadInput)), 0, nil,
			retryIn(time.Minute, errBadInput, retry.ReasonExplicit, def)},
		{"nil *Error inside an error: Later(nil)", retry.Policy{}, fmt.Errorf("mw: %w", (*retry.Error)(nil)), 0, nil,
			retryIn(180*time.Second, nil, retry.ReasonExplicit, def)},

		// Retry-After.
		{"Retry-After seconds overrides the backoff", backoff, retry.AfterHeader("120", errTransient), 0, nil,
			retryIn(120*time.Second, errTransient, retry.ReasonExplicit, retry.Limited(10))},
		{"Retry-After date in the future", backoff, retry.AfterHeader("Sun, 29 Nov 2026 12:05:00 GMT", errTransient), 0, nil,
			retryIn(5*time.Minute-250*time.Millisecond, errTransient, retry.ReasonExplicit, retry.Limited(10))},
		{"Retry-After date in the past: at once", backoff, retry.AfterHeader("Sun, 29 Nov 2026 11:05:00 GMT", errTransient), 0, nil,
			retryIn(0, errTransient, retry.ReasonExplicit, retry.Limited(10))},
		{"Retry-After garbage falls back to the backoff", backoff, retry.AfterHeader("soon", errTransient), 2, nil,
			retryIn(8*time.Second, errTransient, retry.ReasonExplicit, retry.Limited(10))},
		{"Retry-After empty falls back to Countdown", retry.Policy{Countdown: 9 * time.Second}, retry.AfterHeader("", errTransient), 0, nil,
			retryIn(9*time.Second, errTransient, retry.ReasonExplicit, def)},
		{"Retry-After garbage falls back to DefaultRetryDelay", retry.Policy{}, retry.AfterHeader("-1", nil), 0, nil,
			retryIn(180*time.Second, nil, retry.ReasonExplicit, def)},
		{"Retry-After is still bound by MaxRetries", retry.Policy{}, retry.AfterHeader("1", errTransient), 3, nil,
			retry.Decision{Exhausted: true, Err: errTransient, Reason: retry.ReasonExplicit, MaxRetries: def}},
		{"Retry-After with a per-call limit", retry.Policy{}, retry.AfterHeader("1", errTransient).WithMaxRetries(8), 3, nil,
			retryIn(time.Second, errTransient, retry.ReasonExplicit, retry.Limited(8))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.policy.Decide(tt.err, tt.retries, testNow, tt.randn)
			want := tt.want
			if want.Err == errInput {
				want.Err = tt.err
			}
			if diff := diffDecision(got, want); diff != "" {
				t.Errorf("Decide(%v, %d): %s", tt.err, tt.retries, diff)
			}
			// Invariants every decision keeps.
			if got.Countdown < 0 || (!got.Retry && got.Countdown != 0) || (got.Exhausted && got.Retry) {
				t.Errorf("Decide(%v, %d) breaks an invariant: %+v", tt.err, tt.retries, got)
			}
			if tt.err != nil && !got.Retry && got.Err == nil {
				t.Errorf("Decide(%v, %d) fails without an error to record", tt.err, tt.retries)
			}
		})
	}
}

// TestDecideMatcherKinds checks each matcher kind as AutoRetryFor, through
// wrapping.
func TestDecideMatcherKinds(t *testing.T) {
	opErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	timeoutErr := fmt.Errorf("call: %w", context.DeadlineExceeded) // implements net.Error
	tests := []struct {
		name  string
		m     retry.Matcher
		err   error
		match bool
	}{
		{"On sentinel", retry.On(errTransient), errTransient, true},
		{"On sentinel wrapped twice", retry.On(errTransient), fmt.Errorf("a: %w", fmt.Errorf("b: %w", errTransient)), true},
		{"On one of several", retry.On(errBadInput, io.EOF), io.EOF, true},
		{"On other sentinel", retry.On(errTransient), errBadInput, false},
		{"On in a joined error", retry.On(errTransient), errors.Join(errBadInput, errTransient), true},
		{"On without targets", retry.On(), errTransient, false},
		{"On nil target", retry.On(nil), errTransient, false},
		{"OnType pointer type", retry.OnType[*net.OpError](), fmt.Errorf("x: %w", opErr), true},
		{"OnType other type", retry.OnType[*os.PathError](), opErr, false},
		{"OnType interface", retry.OnType[net.Error](), timeoutErr, true},
		{"OnType interface not implemented", retry.OnType[interface {
			error
			Temporary() bool
		}](), errTransient, false},
		{"OnFunc", retry.OnFunc(func(err error) bool { return strings.Contains(err.Error(), "503") }), errors.New("HTTP 503"), true},
		{"OnFunc false", retry.OnFunc(func(err error) bool { return false }), errTransient, false},
		{"OnFunc nil", retry.OnFunc(nil), errTransient, false},
		{"OnAny", retry.OnAny(), errBadInput, true},
		{"zero Matcher", retry.Matcher{}, errTransient, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.m.Match(tt.err); got != tt.match {
				t.Errorf("%v.Match(%v) = %v, want %v", tt.m, tt.err, got, tt.match)
			}
			if tt.m.Match(nil) {
				t.Errorf("%v.Match(nil) = true", tt.m)
			}
			p := retry.Policy{AutoRetryFor: []retry.Matcher{tt.m}}
			if got := p.Decide(tt.err, 0, testNow, nil).Retry; got != tt.match {
				t.Errorf("Decide with AutoRetryFor %v: Retry = %v, want %v", tt.m, got, tt.match)
			}
		})
	}
}

// TestDecideJitterUsesPolicy checks that the jitter setting reaches the
// random source: on by default, off with JitterOff.
func TestDecideJitterUsesPolicy(t *testing.T) {
	calls := 0
	randn := func(n int) int { calls++; return 0 }
	p := retry.Policy{AutoRetryFor: []retry.Matcher{retry.OnAny()}, Backoff: 1, MaxRetries: retry.Unlimited()}
	if d := p.Decide(errTransient, 5, testNow, randn); d.Countdown != 0 || calls != 1 {
		t.Errorf("default jitter: Countdown %v after %d draws, want 0 after 1", d.Countdown, calls)
	}
	p.Jitter = retry.JitterOn
	if d := p.Decide(errTransient, 5, testNow, randn); d.Countdown != 0 || calls != 2 {
		t.Errorf("JitterOn: Countdown %v after %d draws, want 0 after 2", d.Countdown, calls)
	}
	p.Jitter = retry.JitterOff
	if d := p.Decide(errTransient, 5, testNow, randn); d.Countdown != 32*time.Second || calls != 2 {
		t.Errorf("JitterOff: Countdown %v after %d draws, want 32s and no draw", d.Countdown, calls)
	}
	// An exhausted decision draws nothing.
	p.Jitter, p.MaxRetries = retry.JitterOn, retry.Limited(1)
	if d := p.Decide(errTransient, 1, testNow, randn); !d.Exhausted || calls != 2 {
		t.Errorf("exhausted: %+v after %d draws, want exhausted and no draw", d, calls)
	}
}

func BenchmarkDecide(b *testing.B) {
	p := retry.Policy{
		AutoRetryFor:     []retry.Matcher{retry.On(errTransient), retry.OnType[*net.OpError]()},
		DontAutoRetryFor: []retry.Matcher{retry.On(errBadInput)},
		Backoff:          1,
		MaxRetries:       retry.Unlimited(),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	errs := map[string]error{
		"auto":     fmt.Errorf("fetch: %w", errTransient),
		"explicit": retry.After(time.Second, errBadInput),
		"fail":     errors.New("boom"),
	}
	for name, err := range errs {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				p.Decide(err, i%16, testNow, rng.IntN)
			}
		})
	}
}

// FuzzDecide builds arbitrary (also invalid) policies and handler errors and
// checks that Decide never panics and that every Decision is coherent.
func FuzzDecide(f *testing.F) {
	f.Add(uint8(0), 3, 0, int64(0), uint8(0), int64(0), int64(0), 0, uint8(0), int64(0), "", 0)
	f.Add(uint8(1), 5, 2, int64(60e9), uint8(2), int64(0), int64(5e9), 4, uint8(1), int64(30e9), "120", 7)
	f.Add(uint8(2), -1, -3, int64(-1), uint8(9), int64(-5), int64(-1), -2, uint8(5), int64(-1), "Sun, 29 Nov 2026 12:05:00 GMT", -4)
	f.Add(uint8(1), 0, 1<<40, int64(1<<62), uint8(0), int64(1), int64(1), 1<<40, uint8(4), int64(1<<62), "garbage", 1<<50)
	f.Fuzz(func(t *testing.T, limitKind uint8, n, backoff int, backoffMax int64, jitter uint8,
		countdown, defaultDelay int64, retries int, errKind uint8, d int64, header string, draw int) {
		defer fuzzwatch.Watch(t, limitKind, n, backoff, backoffMax, jitter, countdown, defaultDelay, retries, errKind, d, header, draw)()
		p := retry.Policy{
			Backoff: backoff, BackoffMax: time.Duration(backoffMax), Jitter: retry.Jitter(jitter),
			Countdown: time.Duration(countdown), DefaultRetryDelay: time.Duration(defaultDelay),
			AutoRetryFor:     []retry.Matcher{retry.On(errTransient), {}},
			DontAutoRetryFor: []retry.Matcher{retry.On(errBadInput), retry.OnFunc(nil)},
		}
		switch limitKind % 3 {
		case 1:
			p.MaxRetries = retry.Limited(n)
		case 2:
			p.MaxRetries = retry.Unlimited()
		}
		var err error
		switch errKind % 10 {
		case 0:
			err = errTransient
		case 1:
			err = retry.After(time.Duration(d), errTransient)
		case 2:
			err = retry.At(testNow.Add(time.Duration(d)), nil)
		case 3:
			err = retry.AfterHeader(header, errBadInput).WithMaxRetries(n)
		case 4:
			err = retry.Skip(retry.Later(nil))
		case 5:
			err = errBadInput
		case 6:
			err = fmt.Errorf("mw: %w", retry.Now(nil))
		case 7:
			err = errors.New("unlisted")
		case 8:
			err = nil
		case 9:
			err = fmt.Errorf("mw: %w", (*retry.Error)(nil))
		}
		randn := func(k int) int { return draw % max(k, 1) } // may be negative: Decide must clamp
		dec := p.Decide(err, retries, testNow, randn)
		if dec.Countdown < 0 {
			t.Fatalf("negative Countdown: %+v", dec)
		}
		if dec.Retry && dec.Exhausted {
			t.Fatalf("Retry and Exhausted: %+v", dec)
		}
		if !dec.Retry && (dec.Countdown != 0 || !dec.ETA.IsZero()) {
			t.Fatalf("a failure carries a time: %+v", dec)
		}
		if dec.Retry && (dec.Countdown == 0) != dec.ETA.IsZero() {
			t.Fatalf("ETA and Countdown disagree: %+v", dec)
		}
		if err == nil && dec != (retry.Decision{}) {
			t.Fatalf("nil error gave %+v", dec)
		}
		if err != nil && !dec.Retry && dec.Err == nil {
			t.Fatalf("failure without an error to record: %+v", dec)
		}
		if (dec.Retry || dec.Exhausted) != !dec.MaxRetries.IsZero() {
			t.Fatalf("MaxRetries %v does not match whether a retry was asked for: %+v", dec.MaxRetries, dec)
		}
	})
}
