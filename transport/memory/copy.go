package memory

import (
	"fmt"
	"maps"
	"math"
	"math/big"
	"reflect"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

// maxDepth bounds the nesting of header and property values. It also stops a
// value that contains itself (a map holding itself) from recursing forever.
const maxDepth = 256

// importMessage returns the broker's own copy of m with every header and
// extra property value converted to the protocol value types, as a real
// broker round trip would leave them: Go ints become int64, float32 becomes
// float64, typed slices and maps become []any and map[string]any. A value no
// broker could carry (a struct, a channel, a func) is an error.
func importMessage(m *protocol.Message) (stored, error) {
	var s stored
	s.msg = *m
	var err error
	if s.msg.Headers, s.nestedHeaders, err = importMap(m.Headers, "header"); err != nil {
		return stored{}, err
	}
	if s.msg.Properties.Extra, s.nestedExtra, err = importMap(m.Properties.Extra, "property"); err != nil {
		return stored{}, err
	}
	s.msg.Body = cloneBytes(m.Body)
	return s, nil
}

// stored is a message as the broker keeps it: immutable once stored, with
// the keys whose values are mutable containers listed, so that a consumer's
// copy is a fast map clone plus a deep copy of just those values.
type stored struct {
	msg           protocol.Message
	nestedHeaders []string
	nestedExtra   []string
}

// importMap copies m with importValue and lists the keys holding containers.
// Values that already have a protocol type, the usual case, make the copy a
// plain map clone.
func importMap(m map[string]any, what string) (map[string]any, []string, error) {
	if m == nil {
		return nil, nil, nil
	}
	var nested []string
	convert := false
	for k, v := range m {
		switch v.(type) {
		case nil, bool, string, int64, float64, time.Time,
			protocol.Date, protocol.TimeOfDay, protocol.Decimal, protocol.UUID:
		case []any, map[string]any, []byte, *big.Int:
			nested = append(nested, k)
		default:
			convert = true
		}
	}
	out := maps.Clone(m)
	if convert {
		nested = nested[:0]
		for k, v := range m {
			nv, err := importValue(v, 1)
			if err != nil {
				return nil, nil, fmt.Errorf("memory: %s %q: %w", what, k, err)
			}
			out[k] = nv
			switch nv.(type) {
			case []any, map[string]any, []byte, *big.Int:
				nested = append(nested, k)
			}
		}
		return out, nested, nil
	}
	for _, k := range nested {
		nv, err := importValue(m[k], 1)
		if err != nil {
			return nil, nil, fmt.Errorf("memory: %s %q: %w", what, k, err)
		}
		out[k] = nv
	}
	return out, nested, nil
}

func importValue(v any, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d levels", maxDepth)
	}
	switch x := v.(type) {
	case nil, bool, string, int64, float64, time.Time,
		protocol.Date, protocol.TimeOfDay, protocol.Decimal, protocol.UUID:
		return x, nil
	case int:
		return int64(x), nil
	case int8:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case uint:
		return importUint(uint64(x)), nil
	case uint64:
		return importUint(x), nil
	case float32:
		return float64(x), nil
	case *big.Int:
		if x == nil {
			return nil, nil
		}
		if x.IsInt64() {
			return x.Int64(), nil
		}
		return new(big.Int).Set(x), nil
	case []byte:
		return cloneBytes(x), nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			ne, err := importValue(e, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = ne
		}
		return out, nil
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			ne, err := importValue(e, depth+1)
			if err != nil {
				return nil, fmt.Errorf("key %q: %w", k, err)
			}
			out[k] = ne
		}
		return out, nil
	}
	return importReflect(reflect.ValueOf(v), depth)
}

func importUint(u uint64) any {
	if u > math.MaxInt64 {
		return new(big.Int).SetUint64(u)
	}
	return int64(u)
}

// importReflect handles typed slices and maps ([]string, map[string]int, ...)
// that Go callers naturally build.
func importReflect(rv reflect.Value, depth int) (any, error) {
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			return nil, nil
		}
		out := make([]any, rv.Len())
		for i := range out {
			e, err := importValue(rv.Index(i).Interface(), depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = e
		}
		return out, nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			break
		}
		if rv.IsNil() {
			return nil, nil
		}
		out := make(map[string]any, rv.Len())
		it := rv.MapRange()
		for it.Next() {
			k := it.Key().String()
			e, err := importValue(it.Value().Interface(), depth+1)
			if err != nil {
				return nil, fmt.Errorf("key %q: %w", k, err)
			}
			out[k] = e
		}
		return out, nil
	case reflect.String:
		return rv.String(), nil
	case reflect.Bool:
		return rv.Bool(), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return importUint(rv.Uint()), nil
	case reflect.Float32, reflect.Float64:
		return rv.Float(), nil
	}
	return nil, fmt.Errorf("unsupported value type %T", rv.Interface())
}

// exportMessage returns a deep copy of the broker's message for a consumer,
// so that nothing the consumer does to it reaches the broker or other
// consumers.
func exportMessage(s *stored) protocol.Message {
	out := s.msg
	out.Headers = exportMap(s.msg.Headers, s.nestedHeaders)
	out.Properties.Extra = exportMap(s.msg.Properties.Extra, s.nestedExtra)
	out.Body = cloneBytes(s.msg.Body)
	return out
}

func exportMap(m map[string]any, nested []string) map[string]any {
	if m == nil {
		return nil
	}
	out := maps.Clone(m)
	for _, k := range nested {
		out[k] = cloneValue(m[k])
	}
	return out
}

func cloneMap(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = cloneValue(v)
	}
	return out
}

func cloneValue(v any) any {
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = cloneValue(e)
		}
		return out
	case map[string]any:
		return cloneMap(x)
	case []byte:
		return cloneBytes(x)
	case *big.Int:
		return new(big.Int).Set(x)
	}
	return v
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}
