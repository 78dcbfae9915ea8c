package protocol

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Result-meta keys (celery/backends/base.py _get_result_meta) and
// exception-dict keys (prepare_exception).
const (
	rmStatus    = "status"
	rmResult    = "result"
	rmTraceback = "traceback"
	rmChildren  = "children"
	rmDateDone  = "date_done"
	rmGroupID   = "group_id"
	rmParentID  = "parent_id"
	rmName      = "name"
	rmArgs      = "args"
	rmKwargs    = "kwargs"
	rmWorker    = "worker"
	rmRetries   = "retries"
	rmQueue     = "queue"
	rmTaskID    = "task_id"

	excType    = "exc_type"
	excMessage = "exc_message"
	excModule  = "exc_module"
)

// ChildTuple is the children entry for one task id: [[id, null], null],
// what Python's AsyncResult.as_tuple() gives for a task published from
// inside another one.
func ChildTuple(id string) any { return []any{[]any{id, nil}, nil} }

// isExceptionState reports whether Celery stores an exception dict as the
// result of state s (celery.states.EXCEPTION_STATES).
func isExceptionState(s State) bool {
	return s == StateFailure || s == StateRetry || s == StateRevoked
}

// EncodeResult serializes m as the celery-task-meta document with
// contentType (JSON or msgpack), keys in Celery's order:
//
//	status, result, traceback, children, date_done, [group_id], [parent_id],
//	[name, args, kwargs, worker, retries, queue when m.Extended], task_id
//
// traceback is null when empty, children an empty list when nil, group_id
// and parent_id are written only when set. date_done is null when zero and
// otherwise naive UTC isoformat with microseconds
// ("2026-11-29T13:13:56.022287"), which is what Celery 5.2 and 5.3 write
// and what every client version (5.4+ writes an aware value) parses. An
// *ExceptionInfo (or ExceptionInfo) result is written as the exception
// dict {"exc_type", "exc_message", "exc_module"}; other results must be
// values [Marshal] accepts.
func EncodeResult(m *ResultMeta, contentType string) ([]byte, error) {
	if m == nil {
		return nil, errors.New("protocol: encode result: nil meta")
	}
	if m.Status == "" {
		return nil, errors.New("protocol: encode result: empty status")
	}
	ct := orDefault(contentType, ContentTypeJSON)
	var exc *ExceptionInfo
	switch r := m.Result.(type) {
	case *ExceptionInfo:
		exc = r
	case ExceptionInfo:
		exc = &r
	}
	children := m.Children
	if children == nil {
		children = []any{}
	}
	var dateDone any
	if !m.DateDone.IsZero() {
		dateDone = naiveUTC(m.DateDone)
	}

	o := newOrderedObject(ct, 256+len(m.Traceback))
	o.add(rmStatus, string(m.Status))
	switch {
	case exc != nil:
		o.addObject(rmResult, exc.object(ct))
	case isNilExceptionInfo(m.Result):
		o.add(rmResult, nil)
	default:
		o.add(rmResult, m.Result)
	}
	o.add(rmTraceback, nullIfEmpty(m.Traceback))
	o.add(rmChildren, children)
	o.add(rmDateDone, dateDone)
	if m.GroupID != "" {
		o.add(rmGroupID, m.GroupID)
	}
	if m.ParentID != "" {
		o.add(rmParentID, m.ParentID)
	}
	if m.Extended {
		args, kwargs := m.Args, m.Kwargs
		if args == nil {
			args = []any{}
		}
		if kwargs == nil {
			kwargs = map[string]any{}
		}
		o.add(rmName, nullIfEmpty(m.Name))
		o.add(rmArgs, args)
		o.add(rmKwargs, kwargs)
		o.add(rmWorker, nullIfEmpty(m.Worker))
		o.add(rmRetries, int64(m.Retries))
		o.add(rmQueue, nullIfEmpty(m.Queue))
	}
	o.add(rmTaskID, m.TaskID)
	data, err := o.bytes()
	if err != nil {
		return nil, fmt.Errorf("protocol: encode result %s: %w", m.TaskID, err)
	}
	return data, nil
}

// naiveUTC formats t as Python's naive datetime.isoformat() of its UTC
// wall clock: microseconds, omitted when zero.
func naiveUTC(t time.Time) string {
	t = t.UTC()
	s := t.Format("2006-01-02T15:04:05")
	if us := t.Nanosecond() / 1000; us != 0 {
		s += fmt.Sprintf(".%06d", us)
	}
	return s
}

// DecodeResult parses a celery-task-meta document (or an RPC backend reply,
// which has the same keys minus date_done) serialized with contentType.
// It reads what Celery 5.2 writes (naive UTC date_done) and what 5.4+
// writes (aware date_done, in the app timezone from 5.5). For FAILURE,
// RETRY and REVOKED the result becomes an *ExceptionInfo (nil when null);
// other results keep their decoded values. Extended is set when any
// result_extended key is present. Keys this package does not model (the
// stamps of celery 5.3+) are ignored.
//
// A missing or non-string status, a mistyped key or an exception result
// that is not an exception dict fails with a *DecodeError; a content type
// that is not accepted with a *ContentTypeError.
func DecodeResult(data []byte, contentType string, opts DecodeOptions) (*ResultMeta, error) {
	v, err := Unmarshal(contentType, data, opts)
	if err != nil {
		if errors.Is(err, ErrUnsupportedContentType) {
			return nil, err
		}
		return nil, &DecodeError{Field: "result meta", Err: err}
	}
	doc, ok := v.(map[string]any)
	if !ok {
		return nil, fieldTypeError("result meta", "an object", v)
	}
	status, err := requiredString(doc, rmStatus)
	if err != nil {
		return nil, err
	}
	m := &ResultMeta{Status: State(status), Result: doc[rmResult]}
	if isExceptionState(m.Status) && m.Result != nil {
		e, err := decodeException(m.Result, rmResult)
		if err != nil {
			return nil, err
		}
		m.Result = e
	}
	strs := []struct {
		key string
		dst *string
	}{
		{rmTraceback, &m.Traceback}, {rmGroupID, &m.GroupID}, {rmParentID, &m.ParentID},
		{rmTaskID, &m.TaskID}, {rmName, &m.Name}, {rmWorker, &m.Worker}, {rmQueue, &m.Queue},
	}
	for _, s := range strs {
		if *s.dst, err = optionalString(doc, s.key); err != nil {
			return nil, err
		}
	}
	switch c := doc[rmChildren].(type) {
	case nil:
	case []any:
		m.Children = c
	default:
		return nil, fieldTypeError(rmChildren, "a list", c)
	}
	if m.DateDone, err = optionalTime(doc, rmDateDone); err != nil {
		return nil, err
	}
	// date_done is written back as naive UTC; an aware time whose UTC falls
	// outside Python's years 1..9999 (0001-01-01T00:00:00+01:00) has no such
	// form, and Python's astimezone raises OverflowError on it too.
	if y := m.DateDone.UTC().Year(); !m.DateDone.IsZero() && (y < 1 || y > 9999) {
		return nil, &DecodeError{Field: rmDateDone, Err: fmt.Errorf("protocol: time %s is outside years 1..9999 in UTC", FormatTime(m.DateDone))}
	}
	for _, k := range []string{rmName, rmArgs, rmKwargs, rmWorker, rmRetries, rmQueue} {
		if _, ok := doc[k]; ok {
			m.Extended = true
		}
	}
	switch a := doc[rmArgs].(type) {
	case nil:
	case []any:
		m.Args = a
	default:
		return nil, fieldTypeError(rmArgs, "a list", a)
	}
	switch k := doc[rmKwargs].(type) {
	case nil:
	case map[string]any:
		m.Kwargs = k
	default:
		return nil, fieldTypeError(rmKwargs, "an object", k)
	}
	if r := doc[rmRetries]; r != nil {
		if m.Retries, err = intValue(rmRetries, r); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Value returns e as the dict Celery's backends store:
// {"exc_type", "exc_message", "exc_module"}. A nil Message is written as
// an empty list (an exception without args).
func (e *ExceptionInfo) Value() map[string]any {
	msg := e.Message
	if msg == nil {
		msg = []any{}
	}
	return map[string]any{excType: e.Type, excMessage: msg, excModule: e.Module}
}

// object writes e as Celery's exception dict, keys in Celery's order.
func (e *ExceptionInfo) object(contentType string) *orderedObject {
	msg := e.Message
	if msg == nil {
		msg = []any{}
	}
	o := newOrderedObject(contentType, 64)
	o.add(excType, e.Type)
	o.add(excMessage, msg)
	o.add(excModule, e.Module)
	return o
}

func isNilExceptionInfo(v any) bool {
	e, ok := v.(*ExceptionInfo)
	return ok && e == nil
}

// Error renders e as Python prints an uncaught exception's last line:
// "ValueError: bad thing", "golden_tasks.GoldenError: ('bad', 42)".
// Builtins are not qualified by their module.
func (e *ExceptionInfo) Error() string {
	name := e.Type
	if e.Module != "" && e.Module != "builtins" {
		name = e.Module + "." + e.Type
	}
	var text string
	switch len(e.Message) {
	case 0:
	case 1:
		if s, ok := e.Message[0].(string); ok {
			text = s
		} else {
			text = Repr(e.Message[0])
		}
	default:
		text = Repr(pyTuple(e.Message))
	}
	if text == "" {
		return name
	}
	return name + ": " + text
}

// DecodeException converts a decoded exception dict into an
// *ExceptionInfo. exc_type is required. exc_message is normally a list of
// the exception's args; very old Celery stored a single value (usually a
// string), which becomes a one-element Message, as Python's
// exception_to_python treats it; a missing exc_message is [""] for the same
// reason. exc_module may be missing (Python then synthesizes the class in
// celery.exceptions).
func DecodeException(v any) (*ExceptionInfo, error) {
	return decodeException(v, "exception")
}

func decodeException(v any, field string) (*ExceptionInfo, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fieldTypeError(field, "an exception object", v)
	}
	t, err := requiredString(m, excType)
	if err != nil {
		return nil, prefixDecodeError(err, field+".")
	}
	mod, err := optionalString(m, excModule)
	if err != nil {
		return nil, prefixDecodeError(err, field+".")
	}
	e := &ExceptionInfo{Type: t, Module: mod}
	switch msg := m[excMessage].(type) {
	case []any:
		e.Message = msg
	case nil:
		// Python: cls(exc.get('exc_message', '')).
		if _, ok := m[excMessage]; ok {
			e.Message = []any{nil}
		} else {
			e.Message = []any{""}
		}
	default:
		e.Message = []any{msg}
	}
	return e, nil
}

// prefixDecodeError prepends prefix to the Field of a *DecodeError.
func prefixDecodeError(err error, prefix string) error {
	var de *DecodeError
	if errors.As(err, &de) && !strings.HasPrefix(de.Field, prefix) {
		return &DecodeError{Field: prefix + de.Field, Err: de.Err}
	}
	return err
}
