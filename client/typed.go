package client

import (
	"context"
	"fmt"

	"github.com/celeriac/celeriac/protocol"
)

// Typed is a typed reference to a task whose keyword arguments are the
// fields of Args and whose result is a Result: the caller's mirror of
// worker.FuncKwargs.
//
//	type addArgs struct{ A, B int }
//	add := client.NewTyped[addArgs, int](c, "tasks.add")
//	sum, err := add.Call(ctx, addArgs{A: 2, B: 3})
//
// Args is sent through protocol.ToValue, so its json tags name the keyword
// arguments (worker.FuncKwargs reads json tags too); it must encode as an
// object. The result is bound into Result with protocol.Bind.
type Typed[Args, Result any] struct {
	c    *Client
	name string
	opts []SendOption
}

// NewTyped returns a typed reference to task name, sent with opts.
func NewTyped[Args, Result any](c *Client, name string, opts ...SendOption) Typed[Args, Result] {
	return Typed[Args, Result]{c: c, name: name, opts: opts}
}

// Send sends the task with args as its keyword arguments.
func (t Typed[Args, Result]) Send(ctx context.Context, args Args, opts ...SendOption) (TypedResult[Result], error) {
	kw, err := kwargsOf(args)
	if err != nil {
		return TypedResult[Result]{}, fmt.Errorf("client: %s: %w", t.name, err)
	}
	r, err := t.c.Send(ctx, t.name, nil, kw, append(append([]SendOption(nil), t.opts...), opts...)...)
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
	kw, err := kwargsOf(args)
	if err != nil {
		return Signature{}, fmt.Errorf("client: %s: %w", t.name, err)
	}
	return NewSignature(t.name, nil, kw, append(append([]SendOption(nil), t.opts...), opts...)...), nil
}

func kwargsOf(args any) (map[string]any, error) {
	v, err := protocol.ToValue(args)
	if err != nil {
		return nil, err
	}
	switch v := v.(type) {
	case map[string]any:
		return v, nil
	case nil:
		return nil, nil
	}
	return nil, fmt.Errorf("arguments must encode as an object (a struct or a map), not %T", args)
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
