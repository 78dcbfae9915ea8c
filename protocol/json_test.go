package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

func TestDecodeJSONPythonValues(t *testing.T) {
	f := loadPyFixture(t)
	for _, c := range f.Values {
		t.Run(c.Name, func(t *testing.T) {
			got, err := DecodeJSON([]byte(c.JSON53), DecodeOptions{})
			if err != nil {
				t.Fatalf("DecodeJSON(kombu 5.3 %s): %v", c.JSON53, err)
			}
			want := untag(t, c.JSON53Decoded)
			if diff := cmp.Diff(want, got, valueOpts); diff != "" {
				t.Errorf("DecodeJSON(kombu 5.3 %s) mismatch (-want +got):\n%s", c.JSON53, diff)
			}
			if c.JSON52 == nil {
				return
			}
			got, err = DecodeJSON([]byte(*c.JSON52), DecodeOptions{})
			if err != nil {
				t.Fatalf("DecodeJSON(kombu 5.2 %s): %v", *c.JSON52, err)
			}
			want = untag(t, c.JSON52Decoded)
			if diff := cmp.Diff(want, got, valueOpts); diff != "" {
				t.Errorf("DecodeJSON(kombu 5.2 %s) mismatch (-want +got):\n%s", *c.JSON52, diff)
			}
		})
	}
}

// TestAppendJSONPythonBytes checks the encoder byte for byte against
// Python's json.dumps(v, sort_keys=True).
func TestAppendJSONPythonBytes(t *testing.T) {
	f := loadPyFixture(t)
	for _, c := range f.Values {
		if c.Name == "datetime_naive" {
			continue // Go has no naive times: celeriac writes +00:00, by design
		}
		t.Run(c.Name, func(t *testing.T) {
			v := untag(t, c.Value)
			got, err := AppendJSON(nil, v, JSONOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != c.JSONPlainSorted {
				t.Errorf("AppendJSON(plain)\n got %s\nwant %s", got, c.JSONPlainSorted)
			}
			got, err = AppendJSON(nil, v, JSONOptions{Typed: true})
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != c.JSONTypedSorted {
				t.Errorf("AppendJSON(typed)\n got %s\nwant %s", got, c.JSONTypedSorted)
			}
		})
	}
}

func TestDecodeJSONPythonInputs(t *testing.T) {
	f := loadPyFixture(t)
	for _, c := range f.JSONInputs {
		t.Run(c.Input, func(t *testing.T) {
			got, err := DecodeJSON([]byte(c.Input), DecodeOptions{})
			if c.Error {
				if err == nil {
					t.Fatalf("DecodeJSON(%q) = %#v; Python refuses it", c.Input, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeJSON(%q): %v; Python accepts it", c.Input, err)
			}
			want := untag(t, c.Value)
			if diff := cmp.Diff(want, got, valueOpts); diff != "" {
				t.Errorf("DecodeJSON(%q) mismatch (-want +got):\n%s", c.Input, diff)
			}
		})
	}
}

func TestDecodeJSON(t *testing.T) {
	u := UUID{0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78}
	tests := []struct {
		name string
		give string
		want any
	}{
		{"int", "42", int64(42)},
		{"negative zero int", "-0", int64(0)},
		{"18 digits", "999999999999999999", int64(999999999999999999)},
		{"max int64", "9223372036854775807", int64(math.MaxInt64)},
		{"min int64", "-9223372036854775808", int64(math.MinInt64)},
		{"big", "9223372036854775808", new(big.Int).Lsh(big.NewInt(1), 63)},
		{"float no fraction", "1.0", 1.0},
		{"exponent is float", "1e2", 100.0},
		{"upper exponent", "2E-1", 0.2},
		{"negative zero float", "-0.0", math.Copysign(0, -1)},
		{"overflow is inf", "1e999", math.Inf(1)},
		{"nan", "NaN", math.NaN()},
		{"string escapes", `"a\"b\\c\/d\b\f\n\r\t"`, "a\"b\\c/d\b\f\n\r\t"},
		{"surrogate pair", `"\ud83d\ude00"`, "\U0001F600"},
		{"lone high surrogate", `"\ud800x"`, "\ufffdx"},
		{"high then non-low", `"\ud800\u0041"`, "\ufffdA"},
		{"raw utf-8", `"日本"`, "日本"},
		{"nested", `{"a": [1, {"b": null}], "c": true}`, map[string]any{"a": []any{int64(1), map[string]any{"b": nil}}, "c": true}},
		{"duplicate keys last wins", `{"a": 1, "a": 2}`, map[string]any{"a": int64(2)}},
		{"typed uuid", `{"__type__": "uuid", "__value__": {"hex": "12345678123456781234567812345678"}}`, u},
		{"typed uuid version", `{"__type__": "uuid", "__value__": {"hex": "12345678123456781234567812345678", "version": 4}}`,
			UUID{0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x46, 0x78, 0x92, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78}},
		{"typed datetime", `{"__type__": "datetime", "__value__": "2024-01-02T03:04:05+00:00"}`, time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)},
		{"typed bytes", `{"__type__": "bytes", "__value__": "raw"}`, []byte("raw")},
		{"typed base64", `{"__type__": "base64", "__value__": "/wA="}`, []byte{0xff, 0}},
		{"three keys is a dict", `{"__type__": "date", "__value__": "x", "y": 1}`, map[string]any{"__type__": "date", "__value__": "x", "y": int64(1)}},
		{"whitespace", " \t\r\n[ 1 ,\n2 ] \n", []any{int64(1), int64(2)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeJSON([]byte(tt.give), DecodeOptions{})
			if err != nil {
				t.Fatalf("DecodeJSON(%s): %v", tt.give, err)
			}
			if diff := cmp.Diff(tt.want, got, valueOpts); diff != "" {
				t.Errorf("DecodeJSON(%s) mismatch (-want +got):\n%s", tt.give, diff)
			}
		})
	}
}

func TestDecodeJSONErrors(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		opts    DecodeOptions
		wantErr error  // matched with errors.Is, if set
		wantMsg string // substring of the message
	}{
		{name: "empty", give: "", wantMsg: "unexpected end"},
		{name: "trailing garbage", give: "[1] x", wantMsg: "extra data"},
		{name: "trailing comma", give: "[1,]", wantMsg: "unexpected character"},
		{name: "leading zero", give: "01", wantMsg: "extra data"},
		{name: "control char", give: "\"a\x01\"", wantMsg: "control character"},
		{name: "invalid utf-8", give: "\"\xff\"", wantMsg: "invalid UTF-8"},
		{name: "bad escape", give: `"\x"`, wantMsg: "invalid escape"},
		{name: "short unicode escape", give: `"\u12"`, wantMsg: `\u escape`},
		{name: "unterminated string", give: `"abc`, wantMsg: "unterminated string"},
		{name: "unterminated array", give: `[1`, wantMsg: "unterminated array"},
		{name: "unterminated object", give: `{"a": 1`, wantMsg: "unterminated object"},
		{name: "key not string", give: `{1: 2}`, wantMsg: "string key"},
		{name: "missing colon", give: `{"a" 1}`, wantMsg: "expected ':'"},
		{name: "unknown typed", give: `{"__type__": "nope", "__value__": 1}`, wantMsg: `unsupported __type__ "nope"`},
		{name: "typed wrong value", give: `{"__type__": "datetime", "__value__": 1}`, wantMsg: "with a int __value__"},
		{name: "typed bad datetime", give: `{"__type__": "datetime", "__value__": "yesterday"}`, wantMsg: "invalid ISO 8601"},
		{name: "typed bad uuid", give: `{"__type__": "uuid", "__value__": {"hex": "12"}}`, wantMsg: "invalid UUID"},
		{name: "typed uuid extra key", give: `{"__type__": "uuid", "__value__": {"hex": "12345678123456781234567812345678", "int": 1}}`, wantMsg: `unsupported key "int"`},
		{name: "typed bad base64", give: `{"__type__": "base64", "__value__": "!!"}`, wantMsg: "invalid base64"},
		{name: "too many digits", give: strings.Repeat("7", 4301), wantMsg: "exceeds Python's limit"},
		{name: "too deep", give: strings.Repeat("[", 300) + strings.Repeat("]", 300), wantErr: ErrTooDeep},
		{name: "too deep objects", give: strings.Repeat(`{"a":`, 11) + "1" + strings.Repeat("}", 11), opts: DecodeOptions{MaxDepth: 10}, wantErr: ErrTooDeep},
		{name: "too large", give: `"` + strings.Repeat("a", 100) + `"`, opts: DecodeOptions{MaxBodySize: 100}, wantErr: ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeJSON([]byte(tt.give), tt.opts)
			if err == nil {
				t.Fatalf("DecodeJSON(%.40q) = %v, want an error", tt.give, got)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("DecodeJSON(%.40q) error %v, want errors.Is %v", tt.give, err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("DecodeJSON(%.40q) error %q, want it to contain %q", tt.give, err, tt.wantMsg)
			}
			if !strings.HasPrefix(err.Error(), "protocol: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

// TestDecodeJSONDeepInput feeds 10 MB of '[' with the depth bound raised
// past its cap: the decoder must stop at MaxDepthLimit, not exhaust the
// stack.
func TestDecodeJSONDeepInput(t *testing.T) {
	data := bytes.Repeat([]byte("["), 10<<20)
	_, err := DecodeJSON(data, DecodeOptions{MaxDepth: math.MaxInt})
	if !errors.Is(err, ErrTooDeep) {
		t.Fatalf("DecodeJSON(10 MB of '[') error %v, want ErrTooDeep", err)
	}
	if !strings.Contains(err.Error(), "exceeds 10000") {
		t.Errorf("error %q does not name the capped depth", err)
	}
	// Exactly at the bound is fine.
	ok := strings.Repeat("[", 256) + strings.Repeat("]", 256)
	if _, err := DecodeJSON([]byte(ok), DecodeOptions{}); err != nil {
		t.Errorf("DecodeJSON(depth 256): %v", err)
	}
}

func TestAppendJSON(t *testing.T) {
	loc := time.FixedZone("", 5*3600+1800)
	tests := []struct {
		name  string
		give  any
		plain string
		typed string // empty: same as plain
	}{
		{"nil", nil, "null", ""},
		{"floats stay floats", []any{1.0, float32(0.1), math.Copysign(0, -1), 1e16, 1e-5, 123.456}, "[1.0, 0.1, -0.0, 1e+16, 1e-05, 123.456]", ""},
		{"non-finite", []any{math.NaN(), math.Inf(1), math.Inf(-1)}, "[NaN, Infinity, -Infinity]", ""},
		{"go ints", []any{int8(-1), uint8(255), int(7), uint64(math.MaxUint64)}, "[-1, 255, 7, 18446744073709551615]", ""},
		{"big int", new(big.Int).Lsh(big.NewInt(1), 70), "1180591620717411303424", ""},
		{"nil big int", (*big.Int)(nil), "null", ""},
		{"ensure_ascii", "é\U0001F600\x7f\"\\\n\x00", `"\u00e9\ud83d\ude00\u007f\"\\\n\u0000"`, ""},
		{"invalid utf-8", "a\xffb", `"a\ufffdb"`, ""},
		{"sorted keys", map[string]any{"b": 1, "a": 2, "": 3}, `{"": 3, "a": 2, "b": 1}`, ""},
		{"time", time.Date(2024, 1, 2, 3, 4, 5, 6000, loc), `"2024-01-02T03:04:05.000006+05:30"`,
			`{"__type__": "datetime", "__value__": "2024-01-02T03:04:05.000006+05:30"}`},
		{"date", Date{2024, 1, 2}, `"2024-01-02"`, `{"__type__": "date", "__value__": "2024-01-02"}`},
		{"time of day", TimeOfDay{Hour: 1, Minute: 2, Second: 3}, `"01:02:03"`, `{"__type__": "time", "__value__": "01:02:03"}`},
		{"decimal", Decimal("1.50"), `"1.50"`, `{"__type__": "decimal", "__value__": "1.50"}`},
		{"uuid", UUID{0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78},
			`"12345678-1234-5678-1234-567812345678"`, `{"__type__": "uuid", "__value__": {"hex": "12345678123456781234567812345678"}}`},
		{"utf-8 bytes", []byte("raw"), `"raw"`, `{"__type__": "bytes", "__value__": "raw"}`},
		{"binary bytes", []byte{0xff, 0}, `{"__type__": "base64", "__value__": "/wA="}`, ""},
		{"nil bytes", []byte(nil), "null", ""},
		{"empty containers", []any{[]any{}, map[string]any{}}, "[[], {}]", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AppendJSON([]byte("prefix:"), tt.give, JSONOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if want := "prefix:" + tt.plain; string(got) != want {
				t.Errorf("AppendJSON(plain) = %s, want %s", got, want)
			}
			typed := tt.typed
			if typed == "" {
				typed = tt.plain
			}
			got, err = AppendJSON(nil, tt.give, JSONOptions{Typed: true})
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != typed {
				t.Errorf("AppendJSON(typed) = %s, want %s", got, typed)
			}
		})
	}
}

type point struct {
	X     int     `json:"x"`
	Y     float64 `json:"y"`
	Label string  `json:"label,omitempty"`
}

type textEnum int

func (e textEnum) MarshalText() ([]byte, error) { return []byte([]string{"off", "on"}[e]), nil }

type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

type failingMarshaler struct{}

func (failingMarshaler) MarshalJSON() ([]byte, error) { return nil, errors.New("boom") }

func TestAppendJSONGoValues(t *testing.T) {
	ts := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name string
		give any
		want string
	}{
		{"struct via encoding/json", point{X: 1, Y: 2.5}, `{"x": 1, "y": 2.5}`},
		{"pointer to struct", &point{X: 1, Label: "é"}, `{"label": "\u00e9", "x": 1, "y": 0}`},
		{"typed slice", []int{1, 2}, "[1, 2]"},
		{"typed float slice", []float64{1, 2.5}, "[1.0, 2.5]"},
		{"typed map", map[string]float32{"a": 0.1}, `{"a": 0.1}`},
		{"int keyed map", map[int]string{2: "b", 1: "a"}, `{"1": "a", "2": "b"}`},
		{"array of bytes", [2]byte{'h', 'i'}, `"hi"`},
		{"text marshaler", textEnum(1), `"on"`},
		{"json marshaler", rawJSON(`{"n": 1.5, "l": [true]}`), `{"l": [true], "n": 1.5}`},
		{"pointer to time", &ts, `"2024-01-02T03:04:05+00:00"`},
		{"nil pointer", (*point)(nil), "null"},
		{"nil typed slice", []string(nil), "null"},
		{"nested any", []any{map[string]any{"p": point{X: 3}}}, `[{"p": {"x": 3, "y": 0}}]`},
		{"named string", State("SUCCESS"), `"SUCCESS"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AppendJSON(nil, tt.give, JSONOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("AppendJSON(%#v) = %s, want %s", tt.give, got, tt.want)
			}
		})
	}
}

func TestAppendJSONErrors(t *testing.T) {
	cyclic := map[string]any{}
	cyclic["self"] = cyclic
	list := []any{nil}
	list[0] = list
	tests := []struct {
		name    string
		give    any
		wantErr error
		wantMsg string
	}{
		{"cyclic map", cyclic, ErrTooDeep, "cyclic"},
		{"cyclic list", list, ErrTooDeep, "cyclic"},
		{"channel", make(chan int), nil, "cannot encode"},
		{"func in struct", struct{ F func() }{}, nil, "json: unsupported type"},
		{"complex", complex(1, 2), nil, "cannot encode"},
		{"marshaler error", failingMarshaler{}, nil, "boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := AppendJSON(nil, tt.give, JSONOptions{})
			if err == nil {
				t.Fatal("AppendJSON succeeded, want an error")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error %v, want errors.Is %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q, want it to contain %q", err, tt.wantMsg)
			}
		})
	}
}

// TestJSONRoundTrip checks DecodeJSON(AppendJSON(v)) == v for generated
// values: typed envelopes carry every value type, the plain form every
// JSON-native one.
func TestJSONRoundTrip(t *testing.T) {
	for _, typed := range []bool{false, true} {
		g := newValueGen(1)
		g.typed = typed
		for i := range 3000 {
			v := g.value(4)
			data, err := AppendJSON(nil, v, JSONOptions{Typed: typed})
			if err != nil {
				t.Fatalf("AppendJSON(%#v): %v", v, err)
			}
			got, err := DecodeJSON(data, DecodeOptions{})
			if err != nil {
				t.Fatalf("case %d: DecodeJSON(%s): %v", i, data, err)
			}
			if !valueEqual(v, got) {
				diff := cmp.Diff(v, got, valueOpts)
				t.Fatalf("case %d typed=%v: round trip of %s mismatch (-want +got):\n%s", i, typed, data, diff)
			}
		}
	}
}

// TestDecodeJSONMatchesEncodingJSON is a differential check against
// encoding/json for documents both accept: same structure, and numbers
// agree once Python's int/float split is taken into account.
func TestDecodeJSONMatchesEncodingJSON(t *testing.T) {
	g := newValueGen(2)
	for range 1000 {
		v := g.value(4)
		data, err := AppendJSON(nil, v, JSONOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var std any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(&std); err != nil {
			continue // NaN, Infinity: outside standard JSON
		}
		ours, err := DecodeJSON(data, DecodeOptions{})
		if err != nil {
			t.Fatalf("DecodeJSON(%s): %v", data, err)
		}
		if diff := cmp.Diff(normaliseStd(std), normaliseOurs(ours), valueOpts); diff != "" {
			t.Fatalf("DecodeJSON(%s) disagrees with encoding/json (-std +ours):\n%s", data, diff)
		}
	}
}

func normaliseStd(v any) any {
	switch x := v.(type) {
	case json.Number:
		return x.String()
	case []any:
		for i := range x {
			x[i] = normaliseStd(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = normaliseStd(x[k])
		}
	}
	return v
}

// normaliseOurs renders numbers as the text AppendJSON writes for them.
func normaliseOurs(v any) any {
	switch x := v.(type) {
	case int64, float64, *big.Int:
		b, _ := AppendJSON(nil, x, JSONOptions{})
		return string(b)
	case []any:
		for i := range x {
			x[i] = normaliseOurs(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = normaliseOurs(x[k])
		}
	}
	return v
}

func FuzzJSON(f *testing.F) {
	fx := loadPyFixture(f)
	for _, c := range fx.Values {
		f.Add([]byte(c.JSON53))
		f.Add([]byte(c.JSONPlainSorted))
		if c.JSON52 != nil {
			f.Add([]byte(*c.JSON52))
		}
	}
	for _, c := range fx.JSONInputs {
		f.Add([]byte(c.Input))
	}
	opts := DecodeOptions{MaxDepth: 64, MaxBodySize: 1 << 20}
	f.Fuzz(func(t *testing.T, data []byte) {
		defer fuzzwatch.Watch(t, data)()
		v, err := DecodeJSON(data, opts)
		if err != nil {
			if v != nil {
				t.Fatalf("DecodeJSON returned %#v with error %v", v, err)
			}
			return
		}
		out, err := AppendJSON(nil, v, JSONOptions{Typed: true})
		if err != nil {
			t.Fatalf("AppendJSON(%#v) of a decoded value: %v", v, err)
		}
		v2, err := DecodeJSON(out, DecodeOptions{MaxBodySize: math.MaxInt, MaxDepth: 200})
		if err != nil {
			t.Fatalf("DecodeJSON(%s) of re-encoded %q: %v", out, data, err)
		}
		if want := truncMicro(v); !valueEqual(want, v2) {
			t.Fatalf("re-encode round trip of %q via %s mismatch:\nwant %#v\n got %#v", data, out, want, v2)
		}
		// The bounded writers write a prefix of the whole text, whatever
		// the limit.
		limit := len(data) % (len(out) + 2)
		b, cut, err := AppendJSONLimit(nil, v, JSONOptions{Typed: true}, limit)
		if err != nil || len(b) > limit || cut != (len(out) > limit) || !bytes.HasPrefix(out, b) || cut && len(b) < limit-3 {
			t.Fatalf("AppendJSONLimit(%d) = %q, %v, %v; whole %q", limit, b, cut, err, out)
		}
		r := Repr(v)
		s, cut := ReprLimit(v, limit)
		if len(s) > limit || cut != (len(r) > limit) || !strings.HasPrefix(r, s) || cut && len(s) < limit-3 {
			t.Fatalf("ReprLimit(%d) = %q, %v; whole %q", limit, s, cut, r)
		}
	})
}

var (
	benchBodyTypical = []byte(`[[2, 3], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]`)
)

func benchNestedBody(b *testing.B) []byte {
	fx := loadPyFixture(b)
	for _, c := range fx.Values {
		if c.Name == "nested_body" {
			if len(c.JSONPlainSorted) < 1800 || len(c.JSONPlainSorted) > 2600 {
				b.Fatalf("nested body is %d bytes, want about 2 KB", len(c.JSONPlainSorted))
			}
			return []byte(c.JSONPlainSorted)
		}
	}
	b.Fatal("no nested_body fixture")
	return nil
}

func BenchmarkDecodeJSON(b *testing.B) {
	for _, bc := range []struct {
		name string
		data []byte
	}{{"typical", benchBodyTypical}, {"nested2KB", benchNestedBody(b)}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeJSON(bc.data, DecodeOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkAppendJSON(b *testing.B) {
	for _, bc := range []struct {
		name string
		data []byte
	}{{"typical", benchBodyTypical}, {"nested2KB", benchNestedBody(b)}} {
		v, err := DecodeJSON(bc.data, DecodeOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			buf := make([]byte, 0, 4096)
			b.SetBytes(int64(len(bc.data)))
			b.ReportAllocs()
			for b.Loop() {
				if buf, err = AppendJSON(buf[:0], v, JSONOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
