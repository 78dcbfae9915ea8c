package protocol

// Loader for testdata/python_values.json, the fixtures written by Python
// itself (testdata/gen_values.py), and value comparison helpers shared by
// the codec tests.

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

type pyValueCase struct {
	Name            string
	Value           json.RawMessage
	Repr            string
	JSON52          *string         `json:"json_52"`
	JSON52Decoded   json.RawMessage `json:"json_52_decoded"`
	JSON53          string          `json:"json_53"`
	JSON53Decoded   json.RawMessage `json:"json_53_decoded"`
	JSONPlainSorted string          `json:"json_plain_sorted"`
	JSONTypedSorted string          `json:"json_typed_sorted"`
	Msgpack         []byte
	MsgpackDecoded  json.RawMessage `json:"msgpack_decoded"`
	SafeRepr        map[string]string
}

type pyInputCase struct {
	Input string
	Error bool
	Value json.RawMessage
}

type pyBinaryInputCase struct {
	Input []byte
	Error bool
	Why   string
	Value json.RawMessage
}

type pyFixture struct {
	Python        string
	Msgpack       string
	Values        []pyValueCase
	JSONInputs    []pyInputCase       `json:"json_inputs"`
	MsgpackInputs []pyBinaryInputCase `json:"msgpack_inputs"`
	TimeFormat    []struct {
		Value json.RawMessage
		ISO   string
	} `json:"time_format"`
	TimeParse []pyInputCase `json:"time_parse"`
	Args      []struct {
		Args     json.RawMessage
		SafeRepr map[string]string
		Repr     string
	}
	Compressed []struct {
		Plain, Zlib, Bz2, Gzip []byte
	}
}

func loadPyFixture(tb testing.TB) *pyFixture {
	tb.Helper()
	data, err := os.ReadFile("testdata/python_values.json")
	if err != nil {
		tb.Fatal(err)
	}
	var f pyFixture
	if err := json.Unmarshal(data, &f); err != nil {
		tb.Fatalf("testdata/python_values.json: %v", err)
	}
	if len(f.Values) == 0 || len(f.JSONInputs) == 0 {
		tb.Fatal("testdata/python_values.json has no cases")
	}
	return &f
}

// extValue stands for a msgpack extension Python keeps as ExtType, which
// celeriac refuses.
type extValue struct{ code int }

// untag converts the fixture's tagged form (see gen_values.py) into the
// value celeriac should produce.
func untag(tb testing.TB, raw json.RawMessage) any {
	tb.Helper()
	var t []any
	if err := json.Unmarshal(raw, &t); err != nil {
		tb.Fatalf("tagged value %s: %v", raw, err)
	}
	v, err := untagValue(t)
	if err != nil {
		tb.Fatalf("tagged value %s: %v", raw, err)
	}
	return v
}

func untagValue(t []any) (any, error) {
	if len(t) == 0 {
		return nil, fmt.Errorf("empty tag")
	}
	num := func(x any) int { return int(x.(float64)) }
	switch t[0] {
	case "none":
		return nil, nil
	case "bool":
		return t[1].(bool), nil
	case "int":
		s := t[1].(string)
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return n, nil
		}
		b, ok := new(big.Int).SetString(s, 10)
		if !ok {
			return nil, fmt.Errorf("bad int %q", s)
		}
		return b, nil
	case "float":
		return strconv.ParseFloat(t[1].(string), 64)
	case "str":
		return t[1].(string), nil
	case "bytes":
		return base64.StdEncoding.DecodeString(t[1].(string))
	case "list":
		items := t[1].([]any)
		out := make([]any, len(items))
		for i, it := range items {
			v, err := untagValue(it.([]any))
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case "dict":
		out := map[string]any{}
		for _, kv := range t[1].([]any) {
			pair := kv.([]any)
			v, err := untagValue(pair[1].([]any))
			if err != nil {
				return nil, err
			}
			out[pair[0].(string)] = v
		}
		return out, nil
	case "datetime":
		p := t[1].([]any)
		loc := time.UTC
		if p[7] != nil && num(p[7]) != 0 {
			loc = time.FixedZone("", num(p[7]))
		}
		return time.Date(num(p[0]), time.Month(num(p[1])), num(p[2]), num(p[3]), num(p[4]), num(p[5]), num(p[6])*1000, loc), nil
	case "date":
		p := t[1].([]any)
		return Date{Year: num(p[0]), Month: time.Month(num(p[1])), Day: num(p[2])}, nil
	case "time":
		p := t[1].([]any)
		return TimeOfDay{Hour: num(p[0]), Minute: num(p[1]), Second: num(p[2]), Nanosecond: num(p[3]) * 1000}, nil
	case "decimal":
		return Decimal(t[1].(string)), nil
	case "uuid":
		var u UUID
		_, err := hex.Decode(u[:], []byte(t[1].(string)))
		return u, err
	case "timestamp":
		p := t[1].([]any)
		return time.Unix(int64(p[0].(float64)), int64(p[1].(float64))).UTC(), nil
	case "ext":
		return extValue{code: num(t[1].([]any)[0])}, nil
	}
	return nil, fmt.Errorf("unknown tag %v", t[0])
}

// valueOpts compares decoded values exactly: big ints by value, floats
// bit-for-bit in sign (NaN equals NaN), times by instant and offset.
var valueOpts = cmp.Options{
	cmp.Comparer(func(a, b *big.Int) bool {
		if a == nil || b == nil {
			return a == b
		}
		return a.Cmp(b) == 0
	}),
	cmp.Comparer(func(a, b float64) bool {
		if math.IsNaN(a) || math.IsNaN(b) {
			return math.IsNaN(a) && math.IsNaN(b)
		}
		return a == b && math.Signbit(a) == math.Signbit(b)
	}),
	cmp.Comparer(func(a, b time.Time) bool {
		_, oa := a.Zone()
		_, ob := b.Zone()
		return a.Equal(b) && oa == ob
	}),
}

// truncMicro drops sub-microsecond precision from every time in v, for
// comparing with Python, which keeps microseconds only.
func truncMicro(v any) any {
	switch x := v.(type) {
	case time.Time:
		return x.Truncate(time.Microsecond)
	case TimeOfDay:
		x.Nanosecond -= x.Nanosecond % 1000
		return x
	case []any:
		out := make([]any, len(x))
		for i, el := range x {
			out[i] = truncMicro(el)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, el := range x {
			out[k] = truncMicro(el)
		}
		return out
	}
	return v
}

// valueEqual compares values as valueOpts does, in linear time. cmp.Diff
// goes exponential on deeply nested one-element lists (it re-compares
// elements while searching for an edit script), so fuzz targets compare
// with this and only describe a mismatch.
func valueEqual(a, b any) bool {
	switch x := a.(type) {
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) || (x == nil) != (y == nil) {
			return false
		}
		for i := range x {
			if !valueEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) || (x == nil) != (y == nil) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !valueEqual(v, w) {
				return false
			}
		}
		return true
	}
	return cmp.Equal(a, b, valueOpts)
}
