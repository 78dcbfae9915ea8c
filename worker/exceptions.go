package worker

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/celeriac/celeriac/protocol"
)

// Python exception modules Celery uses for its own exceptions.
const (
	moduleBuiltins = "builtins"
	moduleCelery   = "celery.exceptions"
	moduleBilliard = "billiard.exceptions"
)

// pythonException is implemented by errors that name their Python class,
// such as retry.MaxRetriesExceededError.
type pythonException interface {
	error
	ExcType() string
	ExcModule() string
}

// notRegisteredError is the NotRegistered failure of an unknown task name.
type notRegisteredError struct{ name string }

func (e *notRegisteredError) Error() string { return fmt.Sprintf("task %q not registered", e.name) }
func (e *notRegisteredError) Unwrap() error { return ErrTaskNotRegistered }

// timeLimitError is a hard time limit that fired.
type timeLimitError struct{ limit float64 }

func (e *timeLimitError) Error() string { return fmt.Sprintf("TimeLimitExceeded(%g)", e.limit) }
func (e *timeLimitError) Unwrap() error { return ErrTimeLimitExceeded }

// revokedError is why a task was not run (or stopped): "revoked",
// "expired" or "terminated".
type revokedError struct{ why string }

func (e *revokedError) Error() string { return "task " + e.why }
func (e *revokedError) Unwrap() error { return ErrRevoked }

// exceptionOf maps a handler error to the exception Python will see.
func exceptionOf(err error) *protocol.ExceptionInfo {
	var ex *Exception
	if errors.As(err, &ex) {
		mod := ex.Module
		if mod == "" {
			mod = moduleBuiltins
		}
		args := ex.Args
		if args == nil {
			msg := ""
			if ex.Err != nil {
				msg = ex.Err.Error()
			}
			args = []any{msg}
		}
		return &protocol.ExceptionInfo{Type: ex.Type, Module: mod, Message: args}
	}
	var py pythonException
	if errors.As(err, &py) {
		return &protocol.ExceptionInfo{Type: py.ExcType(), Module: py.ExcModule(), Message: []any{py.Error()}}
	}
	var nr *notRegisteredError
	if errors.As(err, &nr) {
		return &protocol.ExceptionInfo{Type: "NotRegistered", Module: moduleCelery, Message: []any{nr.name}}
	}
	var tl *timeLimitError
	if errors.As(err, &tl) {
		return &protocol.ExceptionInfo{Type: "TimeLimitExceeded", Module: moduleBilliard, Message: []any{tl.limit}}
	}
	var rv *revokedError
	if errors.As(err, &rv) {
		return &protocol.ExceptionInfo{Type: "TaskRevokedError", Module: moduleCelery, Message: []any{rv.why}}
	}
	if errors.Is(err, ErrSoftTimeLimitExceeded) {
		return &protocol.ExceptionInfo{Type: "SoftTimeLimitExceeded", Module: moduleBilliard, Message: []any{"SoftTimeLimitExceeded()"}}
	}
	var pe *PanicError
	if errors.As(err, &pe) {
		return &protocol.ExceptionInfo{Type: "RuntimeError", Module: moduleBuiltins, Message: []any{pe.Error()}}
	}
	var be *bindError
	if errors.As(err, &be) {
		return &protocol.ExceptionInfo{Type: "TypeError", Module: moduleBuiltins, Message: []any{be.Error()}}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &protocol.ExceptionInfo{Type: "TimeoutError", Module: moduleBuiltins, Message: []any{err.Error()}}
	}
	return &protocol.ExceptionInfo{Type: "Exception", Module: moduleBuiltins, Message: []any{err.Error()}}
}

// bindError marks argument binding failures: Python's TypeError, and never
// worth a retry.
type bindError struct{ err error }

func (e *bindError) Error() string { return e.err.Error() }
func (e *bindError) Unwrap() error { return e.err }

// excRepr renders an exception as Python's repr would: ValueError('x').
func excRepr(ex *protocol.ExceptionInfo) string {
	parts := make([]string, len(ex.Message))
	for i, a := range ex.Message {
		parts[i] = protocol.Repr(a)
	}
	return ex.Type + "(" + strings.Join(parts, ", ") + ")"
}

// traceback renders a Python-style traceback text for a Go failure: what a
// person reading result.traceback in Python needs — the task, the Go error
// chain and, for panics, the goroutine stack.
func traceback(t *Task, err error, ex *protocol.ExceptionInfo) string {
	var b strings.Builder
	b.WriteString("Traceback (most recent call last):\n")
	fmt.Fprintf(&b, "  File \"celeriac\", in %s (task %s, worker %s, retries %d)\n", t.Name, t.ID, t.Hostname, t.Retries)
	var pe *PanicError
	if errors.As(err, &pe) && len(pe.Stack) > 0 {
		b.WriteString("  Go panic stack:\n")
		for _, line := range strings.Split(strings.TrimRight(string(pe.Stack), "\n"), "\n") {
			b.WriteString("    ")
			b.WriteString(line)
			b.WriteByte('\n')
		}
	} else if err != nil {
		b.WriteString("  Go error chain:\n")
		for e, depth := err, 0; e != nil && depth < 16; e, depth = errors.Unwrap(e), depth+1 {
			fmt.Fprintf(&b, "    %s: %s\n", reflect.TypeOf(e), e.Error())
		}
	}
	msg := ""
	if len(ex.Message) == 1 {
		if s, ok := ex.Message[0].(string); ok {
			msg = s
		} else {
			msg = protocol.Repr(ex.Message[0])
		}
	} else if len(ex.Message) > 1 {
		parts := make([]string, len(ex.Message))
		for i, a := range ex.Message {
			parts[i] = protocol.Repr(a)
		}
		msg = "(" + strings.Join(parts, ", ") + ")"
	}
	name := ex.Type
	if ex.Module != moduleBuiltins && ex.Module != "" {
		name = ex.Module + "." + ex.Type
	}
	if msg == "" {
		b.WriteString(name + "\n")
	} else {
		b.WriteString(name + ": " + msg + "\n")
	}
	return b.String()
}
