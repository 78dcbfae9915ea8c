package retry

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// Matcher selects errors for [Policy.AutoRetryFor] and
// [Policy.DontAutoRetryFor], as an exception class does in Celery's
// autoretry_for. Build one with [On], [OnType], [OnFunc] or [OnAny]. Matchers
// look through wrapping (errors.Is, errors.As), so middleware may wrap a
// handler's error without changing how it is retried.
//
// The zero Matcher matches nothing; [Policy.Validate] reports it.
type Matcher struct {
	match func(error) bool
	desc  string
	// problem, when set, is why Validate rejects the matcher.
	problem string
}

// On matches an error for which errors.Is(err, target) holds for any of the
// targets: sentinel errors, or values with an Is method.
func On(targets ...error) Matcher {
	ts := append([]error(nil), targets...) // later changes to the caller's slice must not leak in
	names := make([]string, len(ts))
	problem := ""
	if len(ts) == 0 {
		problem = "retry.On without targets matches nothing"
	}
	for i, t := range ts {
		if t == nil {
			problem = fmt.Sprintf("retry.On target %d is nil and matches nothing", i)
			names[i] = "<nil>"
			continue
		}
		names[i] = fmt.Sprintf("%q", t.Error())
	}
	return Matcher{
		match: func(err error) bool {
			for _, t := range ts {
				if t != nil && errors.Is(err, t) {
					return true
				}
			}
			return false
		},
		desc:    "On(" + strings.Join(names, ", ") + ")",
		problem: problem,
	}
}

// OnType matches an error whose chain holds a T, in the sense of errors.As:
// the Go counterpart of listing an exception class. T may be a concrete error
// type (*net.OpError) or an interface (net.Error).
func OnType[T error]() Matcher {
	return Matcher{
		match: func(err error) bool {
			var target T
			return errors.As(err, &target)
		},
		desc: "OnType[" + reflect.TypeFor[T]().String() + "]",
	}
}

// OnFunc matches an error for which f returns true. f must be safe for
// concurrent use; it is only called with non-nil errors.
func OnFunc(f func(err error) bool) Matcher {
	m := Matcher{match: f, desc: "OnFunc"}
	if f == nil {
		m.problem = "retry.OnFunc with a nil function matches nothing"
	}
	return m
}

// OnAny matches every error: Celery's autoretry_for=(Exception,).
func OnAny() Matcher {
	return Matcher{match: func(error) bool { return true }, desc: "OnAny"}
}

// Match reports whether m selects err. It is false for a nil err and for
// the zero Matcher.
func (m Matcher) Match(err error) bool {
	if err == nil || m.match == nil {
		return false
	}
	return m.match(err)
}

// String describes the matcher, for logs and test failures.
func (m Matcher) String() string {
	if m.desc == "" {
		return "Matcher{}"
	}
	return m.desc
}

func (m Matcher) validate() string {
	if m.match == nil && m.problem == "" {
		return "zero Matcher matches nothing; build one with retry.On, OnType, OnFunc or OnAny"
	}
	return m.problem
}

// matchAny reports whether any of ms selects err.
func matchAny(ms []Matcher, err error) bool {
	for _, m := range ms {
		if m.Match(err) {
			return true
		}
	}
	return false
}
