package protocol

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// BindKwargsStrict is [BindKwargs] with Python's rules for calling a
// function with keyword arguments, for a struct dst: a keyword no field
// takes is refused (`kwargs.x: unexpected keyword argument`, as Python's
// "got an unexpected keyword argument 'x'"), and so is a missing one
// (`kwargs.x: required but missing`) unless its field is optional: tagged
// `celery:",optional"` or `json:",omitempty"`, or a pointer. A map dst is
// bound as by BindKwargs.
func BindKwargsStrict(kwargs map[string]any, dst any) error {
	rv := reflect.ValueOf(dst)
	if rv.Kind() == reflect.Pointer && !rv.IsNil() && rv.Elem().Kind() == reflect.Struct {
		known := map[string]bool{}
		var missing []string
		for _, f := range reflect.VisibleFields(rv.Elem().Type()) {
			name, _, ok := fieldName(f)
			if !ok {
				continue
			}
			known[name] = true
			if _, present := kwargs[name]; !present && !optionalField(f) {
				missing = append(missing, name)
			}
		}
		var unknown []string
		for k := range kwargs {
			if !known[k] {
				unknown = append(unknown, k)
			}
		}
		// Sorted so that the error names the same key every time.
		slices.Sort(unknown)
		if len(unknown) > 0 {
			return &BindError{Path: "kwargs." + unknown[0], Err: errors.New("unexpected keyword argument")}
		}
		if len(missing) > 0 {
			return &BindError{Path: "kwargs." + missing[0], Err: errors.New("required but missing")}
		}
	}
	return BindKwargs(kwargs, dst)
}

func optionalField(f reflect.StructField) bool {
	if f.Type.Kind() == reflect.Pointer {
		return true
	}
	if tag, ok := f.Tag.Lookup("celery"); ok {
		_, opts, _ := strings.Cut(tag, ",")
		if slices.Contains(strings.Split(opts, ","), "optional") {
			return true
		}
	}
	if tag, ok := f.Tag.Lookup("json"); ok {
		_, opts, _ := strings.Cut(tag, ",")
		if slices.Contains(strings.Split(opts, ","), "omitempty") {
			return true
		}
	}
	return false
}

// KwargsOf lays out a struct (or a pointer to one) as keyword arguments
// named the way [BindKwargs] reads them (celery tags, then json tags, then
// the field name), so that a struct shared by a caller and a task binds
// back into itself. A zero field tagged `json:",omitempty"` or
// `celery:",optional"` is left out. ok is false when v is not a struct.
func KwargsOf(v any) (kwargs map[string]any, ok bool, err error) {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return nil, false, nil
		}
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct || rv.Type() == timeType || rv.Type() == dateType ||
		rv.Type() == timeOfDayType || rv.Type() == decimalType || rv.Type() == bigIntType {
		return nil, false, nil
	}
	kwargs = map[string]any{}
	for _, f := range reflect.VisibleFields(rv.Type()) {
		name, _, ok := fieldName(f)
		if !ok {
			continue
		}
		fv, err := rv.FieldByIndexErr(f.Index)
		if err != nil {
			continue // a field promoted through a nil embedded pointer
		}
		if fv.IsZero() && optionalField(f) && f.Type.Kind() != reflect.Pointer {
			continue
		}
		val, err := ToValue(fv.Interface())
		if err != nil {
			return nil, true, fmt.Errorf("kwargs.%s: %w", name, err)
		}
		kwargs[name] = val
	}
	return kwargs, true, nil
}
