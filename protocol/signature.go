package protocol

import (
	"fmt"
	"math/big"
)

// Signature dict keys (celery/canvas.py Signature.__init__).
const (
	sigTask        = "task"
	sigArgs        = "args"
	sigKwargs      = "kwargs"
	sigOptions     = "options"
	sigSubtaskType = "subtask_type"
	sigImmutable   = "immutable"
)

// DecodeSignature converts a decoded signature dict (as found in
// embed.callbacks, embed.chain, options.link, a group's kwargs.tasks, ...)
// into a Signature. "task" must be a string; "args", "kwargs", "options"
// and "subtask_type" may be missing or null (they default to empty, as in
// Celery), "immutable" may be missing or null (false). Keys Celery does
// not define, such as "chord_size", are kept in Extra. A malformed dict
// fails with a *DecodeError naming the key.
//
// The Signature shares the maps and slices of v.
func DecodeSignature(v any) (Signature, error) {
	return decodeSignature(v, "signature")
}

func decodeSignature(v any, field string) (Signature, error) {
	var s Signature
	m, ok := v.(map[string]any)
	if !ok {
		return s, fieldTypeError(field, "a signature object", v)
	}
	task, ok := m[sigTask].(string)
	if !ok {
		return s, fieldTypeError(field+".task", "a string", m[sigTask])
	}
	s.Task = task
	switch a := m[sigArgs].(type) {
	case nil:
		s.Args = []any{}
	case []any:
		s.Args = a
	default:
		return s, fieldTypeError(field+".args", "a list", a)
	}
	var err error
	if s.Kwargs, err = optionalObject(m[sigKwargs], field+".kwargs"); err != nil {
		return s, err
	}
	if s.Options, err = optionalObject(m[sigOptions], field+".options"); err != nil {
		return s, err
	}
	switch st := m[sigSubtaskType].(type) {
	case nil:
	case string:
		s.SubtaskType = st
	default:
		return s, fieldTypeError(field+".subtask_type", "a string or null", st)
	}
	switch im := m[sigImmutable].(type) {
	case nil:
	case bool:
		s.Immutable = im
	default:
		return s, fieldTypeError(field+".immutable", "a bool", im)
	}
	for k, val := range m {
		switch k {
		case sigTask, sigArgs, sigKwargs, sigOptions, sigSubtaskType, sigImmutable:
			continue
		}
		if s.Extra == nil {
			s.Extra = make(map[string]any)
		}
		s.Extra[k] = val
	}
	return s, nil
}

func optionalObject(v any, field string) (map[string]any, error) {
	switch o := v.(type) {
	case nil:
		return map[string]any{}, nil
	case map[string]any:
		return o, nil
	default:
		return nil, fieldTypeError(field, "an object", v)
	}
}

// Value returns s as the dict Celery serializes: task, args, kwargs,
// options, subtask_type (null for a plain task), immutable, plus Extra.
// Nil Args, Kwargs and Options are written as empty. The dict shares s's
// maps and slices.
func (s Signature) Value() map[string]any {
	m := make(map[string]any, 6+len(s.Extra))
	for k, v := range s.Extra {
		m[k] = v
	}
	args, kwargs, options := s.Args, s.Kwargs, s.Options
	if args == nil {
		args = []any{}
	}
	if kwargs == nil {
		kwargs = map[string]any{}
	}
	if options == nil {
		options = map[string]any{}
	}
	m[sigTask] = s.Task
	m[sigArgs] = args
	m[sigKwargs] = kwargs
	m[sigOptions] = options
	m[sigSubtaskType] = nullIfEmpty(s.SubtaskType)
	m[sigImmutable] = s.Immutable
	return m
}

// Clone returns a deep copy of s, so that options can be changed (a
// task_id assigned, a chain step's args prepended) without touching the
// message s came from.
func (s Signature) Clone() Signature {
	c := s
	if s.Args != nil {
		c.Args = cloneValue(s.Args).([]any)
	}
	if s.Kwargs != nil {
		c.Kwargs = cloneValue(s.Kwargs).(map[string]any)
	}
	if s.Options != nil {
		c.Options = cloneValue(s.Options).(map[string]any)
	}
	if s.Extra != nil {
		c.Extra = cloneValue(s.Extra).(map[string]any)
	}
	return c
}

// cloneValue deep-copies lists, objects, byte slices and big integers;
// other values are immutable.
func cloneValue(v any) any {
	switch v := v.(type) {
	case []any:
		c := make([]any, len(v))
		for i, e := range v {
			c[i] = cloneValue(e)
		}
		return c
	case map[string]any:
		c := make(map[string]any, len(v))
		for k, e := range v {
			c[k] = cloneValue(e)
		}
		return c
	case []byte:
		return append([]byte(nil), v...)
	case *big.Int:
		if v == nil {
			return v
		}
		return new(big.Int).Set(v)
	}
	return v
}

// optionString returns Options[key] as a string, or "".
func (s Signature) optionString(key string) string {
	v, _ := s.Options[key].(string)
	return v
}

// TaskID is options.task_id: the id pre-assigned by the client (chain
// steps, chord bodies), or "" when the publisher must choose one.
func (s Signature) TaskID() string { return s.optionString("task_id") }

// Queue is options.queue, or "" when routing decides.
func (s Signature) Queue() string { return s.optionString("queue") }

// GroupID is options.group_id, or "".
func (s Signature) GroupID() string { return s.optionString("group_id") }

// ReplyTo is options.reply_to, or "".
func (s Signature) ReplyTo() string { return s.optionString("reply_to") }

// Priority is options.priority and whether it is set to an integer.
func (s Signature) Priority() (int, bool) {
	n, ok := int64Value(s.Options["priority"])
	if !ok {
		return 0, false
	}
	return int(n), true
}

// Link decodes options.link (one signature or a list): the callbacks to
// apply when the task succeeds.
func (s Signature) Link() ([]Signature, error) { return s.signatures("link") }

// LinkError decodes options.link_error (one signature or a list): the
// errbacks to apply when the task fails.
func (s Signature) LinkError() ([]Signature, error) { return s.signatures("link_error") }

func (s Signature) signatures(key string) ([]Signature, error) {
	switch v := s.Options[key].(type) {
	case nil:
		return nil, nil
	case map[string]any:
		sig, err := decodeSignature(v, "options."+key)
		if err != nil {
			return nil, err
		}
		return []Signature{sig}, nil
	default:
		return decodeSignatureList(v, "options."+key)
	}
}

// Tasks decodes kwargs.tasks of a "group" or "chain" signature: the member
// signatures, in order.
func (s Signature) Tasks() ([]Signature, error) {
	if s.SubtaskType != "group" && s.SubtaskType != "chain" {
		return nil, &DecodeError{Field: "signature.subtask_type", Err: fmt.Errorf("%q signature has no tasks", s.SubtaskType)}
	}
	return decodeSignatureList(s.Kwargs["tasks"], "kwargs.tasks")
}

// ChordHeader decodes kwargs.header of a "chord" signature: the group whose
// results the body receives.
func (s Signature) ChordHeader() (Signature, error) {
	if s.SubtaskType != "chord" {
		return Signature{}, &DecodeError{Field: "signature.subtask_type", Err: fmt.Errorf("%q signature is not a chord", s.SubtaskType)}
	}
	return decodeSignature(s.Kwargs["header"], "kwargs.header")
}

// ChordBody decodes kwargs.body of a "chord" signature: the callback.
func (s Signature) ChordBody() (Signature, error) {
	if s.SubtaskType != "chord" {
		return Signature{}, &DecodeError{Field: "signature.subtask_type", Err: fmt.Errorf("%q signature is not a chord", s.SubtaskType)}
	}
	return decodeSignature(s.Kwargs["body"], "kwargs.body")
}
