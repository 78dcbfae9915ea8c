package protocol

import (
	"fmt"
	"math"
	"math/big"
	"time"
)

// Helpers shared by the message decoders (task, signature, envelope,
// result meta): typed access to decoded values with *DecodeError on
// mismatch.

// fieldTypeError reports that field holds got where want was expected.
func fieldTypeError(field, want string, got any) error {
	return &DecodeError{Field: field, Err: fmt.Errorf("want %s, got %s", want, valueKind(got))}
}

// valueKind names the JSON-ish kind of a decoded value for error messages.
func valueKind(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "a bool"
	case string:
		return "a string"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	case []byte:
		return "bytes"
	case time.Time:
		return "a datetime"
	default:
		if _, ok := numberValue(v); ok {
			return "a number"
		}
		return fmt.Sprintf("a %T", v)
	}
}

// requiredString returns m[key], which must be a non-empty string.
func requiredString(m map[string]any, key string) (string, error) {
	v, ok := m[key]
	if !ok || v == nil {
		return "", &DecodeError{Field: key, Err: fmt.Errorf("missing %s", key)}
	}
	s, ok := v.(string)
	if !ok {
		return "", fieldTypeError(key, "a string", v)
	}
	if s == "" {
		return "", &DecodeError{Field: key, Err: fmt.Errorf("empty %s", key)}
	}
	return s, nil
}

// optionalString returns m[key] as a string; missing or null is "".
func optionalString(m map[string]any, key string) (string, error) {
	return stringField(m[key], key)
}

// stringField returns v as a string; null is "". Errors name field.
func stringField(v any, field string) (string, error) {
	if v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fieldTypeError(field, "a string or null", v)
	}
	return s, nil
}

// optionalTime reads an ISO 8601 time (or an already decoded datetime);
// missing or null is the zero time.
func optionalTime(m map[string]any, key string) (time.Time, error) {
	switch v := m[key].(type) {
	case nil:
		return time.Time{}, nil
	case time.Time:
		return v, nil
	case string:
		t, err := ParseTime(v)
		if err != nil {
			// Celery: InvalidTaskError("invalid ETA value ...").
			return time.Time{}, &DecodeError{Field: key, Err: err}
		}
		return t, nil
	default:
		return time.Time{}, fieldTypeError(key, "an ISO 8601 string or null", v)
	}
}

// intValue converts an integral number to int.
func intValue(field string, v any) (int, error) {
	n, ok := int64Value(v)
	if !ok || n < math.MinInt || n > math.MaxInt {
		return 0, fieldTypeError(field, "an integer", v)
	}
	return int(n), nil
}

// int64Value accepts every Go integer type (transports may hand over
// int32 AMQP fields) and integral floats.
func int64Value(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case int:
		return int64(n), true
	case int32:
		return int64(n), true
	case int16:
		return int64(n), true
	case int8:
		return int64(n), true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint64:
		if n > math.MaxInt64 {
			return 0, false
		}
		return int64(n), true
	case uint:
		if uint64(n) > math.MaxInt64 {
			return 0, false
		}
		return int64(n), true
	case *big.Int:
		if n == nil || !n.IsInt64() {
			return 0, false
		}
		return n.Int64(), true
	case float64:
		if n != math.Trunc(n) || n < math.MinInt64 || n >= math.MaxInt64 {
			return 0, false
		}
		return int64(n), true
	}
	return 0, false
}

// numberValue converts any decoded number to float64.
func numberValue(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case float32:
		return float64(n), true
	case *big.Int:
		if n == nil {
			return 0, false
		}
		f, _ := new(big.Float).SetInt(n).Float64()
		return f, true
	}
	if i, ok := int64Value(v); ok {
		return float64(i), true
	}
	return 0, false
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
