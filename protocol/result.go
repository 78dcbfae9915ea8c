package protocol

import "time"

// State is a Celery task state as stored in a result backend.
type State string

// Task states (celery/states.py).
const (
	StatePending  State = "PENDING"
	StateReceived State = "RECEIVED"
	StateStarted  State = "STARTED"
	StateSuccess  State = "SUCCESS"
	StateFailure  State = "FAILURE"
	StateRetry    State = "RETRY"
	StateRevoked  State = "REVOKED"
	StateRejected State = "REJECTED"
	StateIgnored  State = "IGNORED"
)

// Ready reports whether s is final (SUCCESS, FAILURE or REVOKED).
func (s State) Ready() bool {
	return s == StateSuccess || s == StateFailure || s == StateRevoked
}

// ResultMeta is the document Celery stores under celery-task-meta-<id>.
type ResultMeta struct {
	TaskID string
	Status State
	// Result is the return value; for FAILURE, RETRY and REVOKED it is an
	// *ExceptionInfo; for STARTED it is {"pid": int, "hostname": str}.
	Result any
	// Traceback is null on the wire when empty.
	Traceback string
	// Children are stored as AsyncResult.as_tuple() values, e.g.
	// [[["<id>", null], null]]; see [ChildTuple].
	Children []any
	// DateDone is set for ready states; zero is null on the wire.
	DateDone time.Time
	GroupID  string
	ParentID string

	// Extended, when true, writes the result_extended fields below.
	Extended bool
	Name     string
	Args     []any
	Kwargs   map[string]any
	Worker   string
	Retries  int
	Queue    string
}

// ExceptionInfo is how a non-pickle result backend stores an exception:
// {"exc_type", "exc_message" (a list of the exception's args), "exc_module"}.
// Python's client rebuilds the exception from it.
type ExceptionInfo struct {
	Type    string
	Message []any
	Module  string
}
