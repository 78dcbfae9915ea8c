package worker

import (
	"context"
	"errors"
	"fmt"
	"reflect"
)

var (
	ctxType = reflect.TypeFor[context.Context]()
	errType = reflect.TypeFor[error]()
)

// Func registers an ordinary Go function as the handler of a task, so that
// it needs no unpacking of []any:
//
//	worker.Func(mux, "tasks.add", func(ctx context.Context, a, b int) (int, error) {
//		return a + b, nil
//	})
//
// f takes a context.Context first, then one parameter per positional
// argument of the task, bound with the rules of Task.Bind; it returns
// (result, error) or just error. A call with the wrong number or types of
// arguments fails with TypeError, as in Python, and is never retried.
// Options are those of Mux.Handle. Func panics, at registration, when f has
// another shape.
func Func(m *Mux, name string, f any, opts ...TaskOption) {
	fv, err := checkFunc(f)
	if err != nil {
		panic(fmt.Sprintf("worker: Func(%q): %v", name, err))
	}
	ft := fv.Type()
	m.Handle(name, HandlerFunc(func(ctx context.Context, t *Task) (any, error) {
		in := make([]reflect.Value, ft.NumIn())
		in[0] = reflect.ValueOf(ctx)
		dst := make([]any, ft.NumIn()-1)
		for i := range dst {
			p := reflect.New(ft.In(i + 1))
			dst[i] = p.Interface()
			in[i+1] = p.Elem()
		}
		if len(t.Kwargs) > 0 {
			return nil, &bindError{err: errors.New("protocol: keyword arguments: this task takes positional arguments only (worker.Func); use worker.FuncKwargs")}
		}
		if err := t.Bind(dst...); err != nil {
			return nil, err
		}
		return callFunc(fv, in)
	}), opts...)
}

// FuncKwargs registers a function whose task is called with keyword
// arguments (Python's add.delay(a=2, b=3)), bound into a struct with the
// rules of Task.BindKwargsStrict, which are Python's: fields are named by
// `celery:"name"` or `json:"name"` tags; a keyword no field takes and a
// missing one fail with TypeError, unless the field is optional
// (`celery:",optional"`, `json:",omitempty"` or a pointer). A handler that
// wants to ignore unknown keywords binds with Task.BindKwargs itself.
//
//	type addArgs struct{ A, B int `celery:",required"` }
//	worker.FuncKwargs(mux, "tasks.add", func(ctx context.Context, a addArgs) (int, error) {
//		return a.A + a.B, nil
//	})
//
// Positional arguments are refused with TypeError.
func FuncKwargs[K any, R any](m *Mux, name string, f func(context.Context, K) (R, error), opts ...TaskOption) {
	if f == nil {
		panic(fmt.Sprintf("worker: FuncKwargs(%q): nil function", name))
	}
	m.Handle(name, HandlerFunc(func(ctx context.Context, t *Task) (any, error) {
		if len(t.Args) > 0 {
			return nil, &bindError{err: fmt.Errorf("protocol: got %d positional arguments; this task takes keyword arguments only", len(t.Args))}
		}
		var k K
		if err := t.BindKwargsStrict(&k); err != nil {
			return nil, err
		}
		return f(ctx, k)
	}), opts...)
}

// checkFunc validates Func's function shape.
func checkFunc(f any) (reflect.Value, error) {
	fv := reflect.ValueOf(f)
	if !fv.IsValid() || fv.Kind() != reflect.Func || fv.IsNil() {
		return fv, fmt.Errorf("want a function, got %T", f)
	}
	ft := fv.Type()
	switch {
	case ft.IsVariadic():
		return fv, errors.New("variadic functions are not supported")
	case ft.NumIn() == 0 || ft.In(0) != ctxType:
		return fv, errors.New("the first parameter must be a context.Context")
	case ft.NumOut() == 1 && ft.Out(0) == errType, ft.NumOut() == 2 && ft.Out(1) == errType:
		return fv, nil
	}
	return fv, fmt.Errorf("want results (R, error) or error, got %s", ft)
}

func callFunc(fv reflect.Value, in []reflect.Value) (any, error) {
	out := fv.Call(in)
	errV := out[len(out)-1]
	var err error
	if !errV.IsNil() {
		err = errV.Interface().(error)
	}
	if len(out) == 1 || err != nil {
		return nil, err
	}
	return out[0].Interface(), nil
}
