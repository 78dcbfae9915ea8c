package worker

import (
	"errors"
	"fmt"
)

// Errors the worker reports or handlers return.
var (
	// ErrWorkerClosed is returned by Run on a worker that already ran.
	ErrWorkerClosed = errors.New("worker: closed")
	// ErrIgnore, returned by a handler, acknowledges the message and stores
	// no state (Celery's Ignore).
	ErrIgnore = errors.New("worker: ignore task")
	// ErrTaskNotRegistered: no handler for the task name. The message is
	// rejected without requeue and FAILURE (NotRegistered) is stored.
	ErrTaskNotRegistered = errors.New("worker: task not registered")
	// ErrSoftTimeLimitExceeded is the cause of a handler's ctx cancellation at
	// the soft time limit (context.Cause(ctx)). A handler that returns it (or
	// ctx.Err()) fails with Celery's SoftTimeLimitExceeded.
	ErrSoftTimeLimitExceeded = errors.New("worker: soft time limit exceeded")
	// ErrTimeLimitExceeded: the hard time limit passed; the task is recorded
	// as failed and its slot is given to the next task.
	ErrTimeLimitExceeded = errors.New("worker: hard time limit exceeded")
	// ErrRevoked is the cause of a handler's ctx cancellation when the task is
	// revoked with terminate=True.
	ErrRevoked = errors.New("worker: task revoked")
	// ErrShutdown is the cause of a handler's ctx cancellation at a cold
	// shutdown.
	ErrShutdown = errors.New("worker: worker shutting down")
)

// ShutdownError is Run's error when the shutdown cut running tasks short:
// the shutdown timeout passed (or Close asked for a cold shutdown) while
// they ran. Cancelled tasks whose messages were still unacknowledged
// (acks_late) went back to the broker. Abandoned handlers ignored their
// context and were still running when Run returned; their outcome is not
// recorded and their acks_late messages come back from the broker once
// the transport closes.
type ShutdownError struct {
	// Cancelled is how many running tasks the shutdown cancelled.
	Cancelled int
	// Abandoned is how many handler calls were still running when Run
	// returned.
	Abandoned int
}

func (e *ShutdownError) Error() string {
	if e.Abandoned == 0 {
		return fmt.Sprintf("worker: shutdown cancelled %d running tasks", e.Cancelled)
	}
	return fmt.Sprintf("worker: shutdown cancelled %d running tasks and abandoned %d still running", e.Cancelled, e.Abandoned)
}

// Is makes errors.Is(err, ErrShutdown) hold.
func (e *ShutdownError) Is(target error) bool { return target == ErrShutdown }

// RejectError asks the worker to reject the message (Celery's Reject).
type RejectError struct {
	Err     error
	Requeue bool
}

// Reject returns an error that makes the worker reject the message: requeued
// when requeue is true, otherwise dead-lettered.
func Reject(err error, requeue bool) error { return &RejectError{Err: err, Requeue: requeue} }

func (e *RejectError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("worker: reject (requeue=%t)", e.Requeue)
	}
	return fmt.Sprintf("worker: reject (requeue=%t): %v", e.Requeue, e.Err)
}

// Unwrap returns the cause.
func (e *RejectError) Unwrap() error { return e.Err }

// PanicError is a handler panic, recovered. The task fails with it; Stack is
// the goroutine's stack, stored as the traceback.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// Exception is an error as Python sees it: the exception type, its module
// and its args. Return one (or wrap one) from a handler to choose the
// exception a Python client's AsyncResult.get() raises:
//
//	return nil, worker.NewException("ValueError", "amount must be positive")
//
// Without one, a failure reaches Python as builtins.Exception with the
// error's text.
type Exception struct {
	// Type is the exception class name, e.g. "ValueError" or
	// "MyError" (qualified names such as "Outer.Inner" work too).
	Type string
	// Module is the module that defines Type; "builtins" when empty. Python
	// rebuilds the class from a loaded module, or makes a synthetic
	// Exception subclass of that name when it cannot.
	Module string
	// Args are the exception's args (exc_message); nil means the wrapped
	// error's text.
	Args []any
	// Err is the Go error, kept for errors.Is/As and logs.
	Err error
}

// NewException returns an Exception of the given builtins type with args.
func NewException(pyType string, args ...any) *Exception {
	return &Exception{Type: pyType, Module: "builtins", Args: args}
}

// AsException wraps err so that Python sees it as the given builtins type.
func AsException(err error, pyType string) error {
	if err == nil {
		return nil
	}
	return &Exception{Type: pyType, Module: "builtins", Err: err}
}

func (e *Exception) Error() string {
	switch {
	case e.Err != nil:
		return e.Err.Error()
	case len(e.Args) == 1:
		return fmt.Sprintf("%s: %v", e.Type, e.Args[0])
	case len(e.Args) > 1:
		return fmt.Sprintf("%s: %v", e.Type, e.Args)
	}
	return e.Type
}

// Unwrap returns the Go error.
func (e *Exception) Unwrap() error { return e.Err }
