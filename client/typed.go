package client

import (
	"context"
	"fmt"

	"github.com/celeriac/celeriac/protocol"
)

// Typed is a typed reference to a task whose arguments are an Args and
// whose result is a Result: the caller's mirror of worker.FuncKwargs and
// worker.Func.
//
//	type addArgs struct{ A, B int }
//	add := client.NewTyped[addArgs, int](c, "tasks.add")
//	sum, err := add.Call(ctx, addArgs{A: 2, B: 3})
//
// A struct is sent as keyword arguments named as worker.FuncKwargs binds
// them (celery tags, then json tags: see protocol.KwargsOf), so one struct
// serves both sides; a map is sent as keyword arguments through
// protocol.ToValue; an array or slice is sent as positional arguments, which is how a
// task registered with worker.Func (or a Python task called as add(2, 3))
// is called:
//
//	add := client.NewTyped[[2]int, int](c, "tasks.add")
//	sum, err := add.Call(ctx, [2]int{2, 3})
//
// The result is bound into Result with protocol.Bind.
type Typed[Args, Result any] struct {
	c    *Client
	name string
	opts []SendOption
}

// NewTyped returns a typed reference to task name, sent with opts.
func NewTyped[Args, Result any](c *Client, name string, opts ...SendOption) Typed[Args, Result] {
	return Typed[Args, Result]{c: c, name: name, opts: opts}
}

// Send sends the task with args as its keyword or positional arguments.
func (t Typed[Args, Result]) Send(ctx context.Context, args Args, opts ...SendOption) (TypedResult[Result], error) {
	pos, kw, err := argsOf(args)
	if err != nil {
		return TypedResult[Result]{}, fmt.Errorf("client: %s: %w", t.name, err)
	}
	r, err := t.c.Send(ctx, t.name, pos, kw, append(append([]SendOption(nil), t.opts...), opts...)...)
	if err != nil {
		return TypedResult[Result]{}, err
	}
	return TypedResult[Result]{AsyncResult: r}, nil
}

// Call sends the task and waits for its result.
func (t Typed[Args, Result]) Call(ctx context.Context, args Args, opts ...SendOption) (Result, error) {
	r, err := t.Send(ctx, args, opts...)
	if err != nil {
		var zero Result
		return zero, err
	}
	return r.Get(ctx)
}

// Signature returns the task's signature with args, for a canvas.
func (t Typed[Args, Result]) Signature(args Args, opts ...SendOption) (Signature, error) {
	pos, kw, err := argsOf(args)
	if err != nil {
		return Signature{}, fmt.Errorf("client: %s: %w", t.name, err)
	}
	return NewSignature(t.name, pos, kw, append(append([]SendOption(nil), t.opts...), opts...)...), nil
}

// argsOf splits a Typed call's Args into positional or keyword arguments.
func argsOf(args any) ([]any, map[string]any, error) {
	if kw, ok, err := protocol.KwargsOf(args); ok {
		return nil, kw, err
	}
	v, err := protocol.ToValue(args)
	if err != nil {
		return nil, nil, err
	}
	switch v := v.(type) {
	case map[string]any:
		return nil, v, nil
	case []any:
		return v, nil, nil
	case nil:
		return nil, nil, nil
	}
	return nil, nil, fmt.Errorf("arguments must encode as an object (a struct or a map: keyword arguments) or a list (an array or slice: positional arguments), not %T", args)
}

// TypedResult is the result of a Typed task.
type TypedResult[Result any] struct {
	*AsyncResult
}

// Get waits for the task and binds its return value into a Result; a
// failure is a *TaskError, a value that does not fit Result a bind error.
func (r TypedResult[Result]) Get(ctx context.Context) (Result, error) {
	var out Result
	v, err := r.AsyncResult.Get(ctx)
	if err != nil {
		return out, err
	}
	if err := protocol.Bind(v, &out); err != nil {
		return out, fmt.Errorf("client: result of %s: %w", r.ID, err)
	}
	return out, nil
}
