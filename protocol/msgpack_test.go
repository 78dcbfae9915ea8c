package protocol

import (
	"bytes"
	"errors"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

func TestDecodeMsgpackPythonValues(t *testing.T) {
	f := loadPyFixture(t)
	n := 0
	for _, c := range f.Values {
		if c.Msgpack == nil {
			continue
		}
		n++
		t.Run(c.Name, func(t *testing.T) {
			got, err := DecodeMsgpack(c.Msgpack, DecodeOptions{})
			if err != nil {
				t.Fatalf("DecodeMsgpack(%x): %v", c.Msgpack, err)
			}
			want := untag(t, c.MsgpackDecoded)
			if diff := cmp.Diff(want, got, valueOpts); diff != "" {
				t.Errorf("DecodeMsgpack(%x) mismatch (-want +got):\n%s", c.Msgpack, diff)
			}
		})
	}
	if n < 40 {
		t.Fatalf("only %d msgpack fixtures", n)
	}
}

// TestAppendMsgpackPythonBytes checks the encoder byte for byte against
// msgpack.packb(v, use_bin_type=True) where the value has no map with more
// than one key (Python keeps insertion order, celeriac sorts; the fixture
// inserts sorted, so those match too).
func TestAppendMsgpackPythonBytes(t *testing.T) {
	f := loadPyFixture(t)
	for _, c := range f.Values {
		if c.Msgpack == nil {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			v := untag(t, c.Value)
			got, err := AppendMsgpack(nil, v)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, c.Msgpack) {
				t.Errorf("AppendMsgpack(%#v)\n got %x\nwant %x", v, got, c.Msgpack)
			}
		})
	}
}

func TestDecodeMsgpackPythonInputs(t *testing.T) {
	f := loadPyFixture(t)
	for _, c := range f.MsgpackInputs {
		t.Run(c.Why+"/"+string(c.Input), func(t *testing.T) {
			got, err := DecodeMsgpack(c.Input, DecodeOptions{})
			var want any
			if !c.Error {
				want = untag(t, c.Value)
			}
			if ext, ok := want.(extValue); ok {
				// Python hands unknown extensions over as ExtType
				// objects; celeriac has no such value and refuses them.
				if err == nil || !strings.Contains(err.Error(), "unsupported extension type") {
					t.Fatalf("DecodeMsgpack(%x) = %v, %v; want the extension %d refused", c.Input, got, err, ext.code)
				}
				return
			}
			if c.Error {
				if err == nil {
					t.Fatalf("DecodeMsgpack(%x) = %#v; Python refuses it (%s)", c.Input, got, c.Why)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeMsgpack(%x): %v; Python accepts it", c.Input, err)
			}
			if diff := cmp.Diff(want, got, valueOpts); diff != "" {
				t.Errorf("DecodeMsgpack(%x) mismatch (-want +got):\n%s", c.Input, diff)
			}
		})
	}
}

func TestDecodeMsgpack(t *testing.T) {
	tests := []struct {
		name string
		give []byte
		want any
	}{
		{"positive fixint", []byte{0x05}, int64(5)},
		{"negative fixint", []byte{0xff}, int64(-1)},
		{"uint8", []byte{0xcc, 0xff}, int64(255)},
		{"int16", []byte{0xd1, 0x80, 0x00}, int64(-32768)},
		{"uint32", []byte{0xce, 0xff, 0xff, 0xff, 0xff}, int64(math.MaxUint32)},
		{"uint64 in int64 range", []byte{0xcf, 0, 0, 0, 0, 0, 0, 0, 1}, int64(1)},
		{"uint64 max", []byte{0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, new(big.Int).SetUint64(math.MaxUint64)},
		{"float32 widened exactly", []byte{0xca, 0x3f, 0xc0, 0, 0}, 1.5},
		{"float64", []byte{0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}, 1.5},
		{"str", []byte{0xa3, 'a', 'b', 'c'}, "abc"},
		{"empty bin", []byte{0xc4, 0x00}, []byte{}},
		{"nested", []byte{0x92, 0x80, 0x90}, []any{map[string]any{}, []any{}}},
		{"duplicate keys last wins", []byte{0x82, 0xa1, 'a', 0x01, 0xa1, 'a', 0x02}, map[string]any{"a": int64(2)}},
		{"bin key", []byte{0x81, 0xc4, 0x01, 'k', 0xc0}, map[string]any{"k": nil}},
		{"timestamp32", []byte{0xd6, 0xff, 0, 0, 0, 1}, time.Unix(1, 0).UTC()},
		{"timestamp64", []byte{0xd7, 0xff, 0, 0, 0, 0x14, 0, 0, 0, 1}, time.Unix(1, 5).UTC()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeMsgpack(tt.give, DecodeOptions{})
			if err != nil {
				t.Fatalf("DecodeMsgpack(%x): %v", tt.give, err)
			}
			if diff := cmp.Diff(tt.want, got, valueOpts); diff != "" {
				t.Errorf("DecodeMsgpack(%x) mismatch (-want +got):\n%s", tt.give, diff)
			}
		})
	}
}

func TestDecodeMsgpackErrors(t *testing.T) {
	deep := append(bytes.Repeat([]byte{0x91}, 300), 0xc0)
	tests := []struct {
		name    string
		give    []byte
		opts    DecodeOptions
		wantErr error
		wantMsg string
	}{
		{name: "empty", give: nil, wantMsg: "unexpected end"},
		{name: "array32 of 4e9", give: []byte{0xdd, 0xff, 0xff, 0xff, 0xff}, wantMsg: "exceeds the 0 bytes left"},
		{name: "map32 of 4e9", give: []byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xc0}, wantMsg: "exceeds the 1 bytes left"},
		{name: "str32 of 4 GiB", give: []byte{0xdb, 0xff, 0xff, 0xff, 0xff, 'a'}, wantMsg: "exceeds the 1 bytes left"},
		{name: "bin32 of 4 GiB", give: []byte{0xc6, 0xff, 0xff, 0xff, 0xff}, wantMsg: "exceeds the 0 bytes left"},
		{name: "ext32 of 4 GiB", give: []byte{0xc9, 0xff, 0xff, 0xff, 0xff, 0xff}, wantMsg: "exceeds the 0 bytes left"},
		{name: "invalid utf-8", give: []byte{0xa2, 0xff, 0xfe}, wantMsg: "invalid UTF-8"},
		{name: "never used code", give: []byte{0xc1}, wantMsg: "invalid code 0xc1"},
		{name: "truncated array", give: []byte{0x92, 0x01}, wantMsg: "array of 2 elements exceeds the 1 bytes left"},
		{name: "truncated element", give: []byte{0x92, 0xcd, 0x01}, wantMsg: "unexpected end"},
		{name: "truncated int", give: []byte{0xcd, 0x01}, wantMsg: "unexpected end"},
		{name: "extra data", give: []byte{0x01, 0x02}, wantMsg: "extra data"},
		{name: "int key", give: []byte{0x81, 0x01, 0x02}, wantMsg: "not a str or bin"},
		{name: "binary bin key", give: []byte{0x81, 0xc4, 0x01, 0x88, 0x30}, wantMsg: "bin map key is not UTF-8"},
		{name: "unknown ext", give: []byte{0xd4, 0x05, 0x00}, wantMsg: "unsupported extension type 5"},
		{name: "bad timestamp size", give: []byte{0xd5, 0xff, 0, 0}, wantMsg: "timestamp extension of 2 bytes"},
		{name: "timestamp nanoseconds", give: []byte{0xc7, 12, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0}, wantMsg: "out of range"},
		{name: "too deep", give: deep, wantErr: ErrTooDeep},
		{name: "too large", give: bytes.Repeat([]byte{0xc0}, 11), opts: DecodeOptions{MaxBodySize: 10}, wantErr: ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeMsgpack(tt.give, tt.opts)
			if err == nil {
				t.Fatalf("DecodeMsgpack(%x) = %#v, want an error", tt.give, got)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error %v, want errors.Is %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q, want it to contain %q", err, tt.wantMsg)
			}
			if !strings.HasPrefix(err.Error(), "protocol: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

// TestDecodeMsgpackHugeHeaderAllocation makes sure a length header is
// never trusted for allocation: a 5-byte array32 header claiming 4e9
// elements must fail without allocating anything like its claim.
func TestDecodeMsgpackHugeHeaderAllocation(t *testing.T) {
	data := []byte{0xdd, 0xee, 0x6b, 0x28, 0x00}
	allocs := testing.AllocsPerRun(10, func() {
		if _, err := DecodeMsgpack(data, DecodeOptions{}); err == nil {
			t.Fatal("no error")
		}
	})
	if allocs > 20 {
		t.Errorf("%v allocations for a refused 5-byte document", allocs)
	}
}

func TestAppendMsgpack(t *testing.T) {
	tests := []struct {
		name string
		give any
		want any // decoded back
	}{
		{"time as iso text", time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC), "2024-01-02T03:04:05+00:00"},
		{"date", Date{2024, 1, 2}, "2024-01-02"},
		{"time of day", TimeOfDay{Hour: 1, Minute: 2, Second: 3, Nanosecond: 4000}, "01:02:03.000004"},
		{"decimal", Decimal("1.5"), "1.5"},
		{"uuid", UUID{15: 1}, "00000000-0000-0000-0000-000000000001"},
		{"uint64", uint64(math.MaxUint64), new(big.Int).SetUint64(math.MaxUint64)},
		{"float32", float32(1.5), 1.5},
		{"struct", point{X: 1, Y: 2}, map[string]any{"x": int64(1), "y": int64(2)}},
		{"typed slice", []string{"a"}, []any{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data, err := AppendMsgpack(nil, tt.give)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeMsgpack(data, DecodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, valueOpts); diff != "" {
				t.Errorf("DecodeMsgpack(AppendMsgpack(%#v)) mismatch (-want +got):\n%s", tt.give, diff)
			}
		})
	}
}

func TestAppendMsgpackErrors(t *testing.T) {
	cyclic := map[string]any{}
	cyclic["self"] = cyclic
	wide := new(big.Int).Lsh(big.NewInt(1), 64)
	if _, err := AppendMsgpack(nil, wide); err == nil || !strings.Contains(err.Error(), "wider than 64 bits") {
		t.Errorf("AppendMsgpack(2**64) error %v, want wider than 64 bits", err)
	}
	if _, err := AppendMsgpack(nil, cyclic); !errors.Is(err, ErrTooDeep) {
		t.Errorf("AppendMsgpack(cyclic) error %v, want ErrTooDeep", err)
	}
	prefix := []byte("keep")
	out, err := AppendMsgpack(prefix, make(chan int))
	if err == nil {
		t.Fatal("AppendMsgpack(chan) succeeded")
	}
	if string(out) != "keep" {
		t.Errorf("AppendMsgpack returned %q on error, want dst unchanged", out)
	}
}

func TestMsgpackRoundTrip(t *testing.T) {
	g := newValueGen(3)
	g.bytes, g.fits64 = true, true
	for i := range 3000 {
		v := g.value(4)
		data, err := AppendMsgpack([]byte{0xaa}, v)
		if err != nil {
			t.Fatalf("AppendMsgpack(%#v): %v", v, err)
		}
		got, err := DecodeMsgpack(data[1:], DecodeOptions{})
		if err != nil {
			t.Fatalf("case %d: DecodeMsgpack(%x): %v", i, data, err)
		}
		if !valueEqual(v, got) {
			diff := cmp.Diff(v, got, valueOpts)
			t.Fatalf("case %d: round trip mismatch (-want +got):\n%s", i, diff)
		}
	}
}

// plainValue maps a decoded msgpack value to what AppendMsgpack writes
// for it: times become their ISO text.
func plainValue(v any) any {
	switch x := v.(type) {
	case time.Time:
		return FormatTime(x)
	case []any:
		out := make([]any, len(x))
		for i, el := range x {
			out[i] = plainValue(el)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, el := range x {
			out[k] = plainValue(el)
		}
		return out
	}
	return v
}

func FuzzMsgpack(f *testing.F) {
	fx := loadPyFixture(f)
	for _, c := range fx.Values {
		if c.Msgpack != nil {
			f.Add(c.Msgpack)
		}
	}
	for _, c := range fx.MsgpackInputs {
		f.Add(c.Input)
	}
	opts := DecodeOptions{MaxDepth: 64, MaxBodySize: 1 << 20}
	f.Fuzz(func(t *testing.T, data []byte) {
		defer fuzzwatch.Watch(t, data)()
		v, err := DecodeMsgpack(data, opts)
		if err != nil {
			if v != nil {
				t.Fatalf("DecodeMsgpack returned %#v with error %v", v, err)
			}
			return
		}
		out, err := AppendMsgpack(nil, v)
		if err != nil {
			t.Fatalf("AppendMsgpack(%#v) of a decoded value: %v", v, err)
		}
		v2, err := DecodeMsgpack(out, DecodeOptions{MaxDepth: 200, MaxBodySize: math.MaxInt})
		if err != nil {
			t.Fatalf("DecodeMsgpack(%x) of re-encoded %x: %v", out, data, err)
		}
		if want := plainValue(v); !valueEqual(want, v2) {
			t.Fatalf("re-encode round trip of %x mismatch:\nwant %#v\n got %#v", data, want, v2)
		}
	})
}

func BenchmarkDecodeMsgpack(b *testing.B) {
	for _, bc := range []struct {
		name string
		json []byte
	}{{"typical", benchBodyTypical}, {"nested2KB", benchNestedBody(b)}} {
		v, err := DecodeJSON(bc.json, DecodeOptions{})
		if err != nil {
			b.Fatal(err)
		}
		data, err := AppendMsgpack(nil, v)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeMsgpack(data, DecodeOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkAppendMsgpack(b *testing.B) {
	for _, bc := range []struct {
		name string
		json []byte
	}{{"typical", benchBodyTypical}, {"nested2KB", benchNestedBody(b)}} {
		v, err := DecodeJSON(bc.json, DecodeOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			buf := make([]byte, 0, 4096)
			b.ReportAllocs()
			for b.Loop() {
				if buf, err = AppendMsgpack(buf[:0], v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
