package protocol

import (
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestUUID(t *testing.T) {
	want := UUID{0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x12, 0x34, 0x56, 0x78}
	for _, s := range []string{
		"12345678-1234-5678-9abc-def012345678",
		"12345678123456789abcdef012345678",
		"{12345678-1234-5678-9ABC-DEF012345678}",
		"urn:uuid:12345678-1234-5678-9abc-def012345678",
		"1234-5678-1234-5678-9abc-def0-1234-5678",
	} {
		got, err := ParseUUID(s)
		if err != nil {
			t.Errorf("ParseUUID(%q): %v", s, err)
			continue
		}
		if got != want {
			t.Errorf("ParseUUID(%q) = %v, want %v", s, got, want)
		}
	}
	if got := want.String(); got != "12345678-1234-5678-9abc-def012345678" {
		t.Errorf("String() = %q", got)
	}
	if got := want.Hex(); got != "12345678123456789abcdef012345678" {
		t.Errorf("Hex() = %q", got)
	}
	for _, bad := range []string{"", "1234", "12345678-1234-5678-9abc-def01234567g", "12345678-1234-5678-9abc-def0123456789"} {
		if _, err := ParseUUID(bad); err == nil {
			t.Errorf("ParseUUID(%q) succeeded", bad)
		}
	}
	v4, err := want.withVersion(4)
	if err != nil || v4.String() != "12345678-1234-4678-9abc-def012345678" {
		t.Errorf("withVersion(4) = %v, %v", v4, err)
	}
	if _, err := want.withVersion(6); err == nil {
		t.Error("withVersion(6) succeeded; Python allows 1 to 5")
	}
}

func TestDateAndTimeOfDay(t *testing.T) {
	if got := (Date{Year: 33, Month: 2, Day: 3}).String(); got != "0033-02-03" {
		t.Errorf("Date.String() = %q", got)
	}
	if got := (TimeOfDay{Hour: 1, Minute: 2, Second: 3, Nanosecond: 450000}).String(); got != "01:02:03.000450" {
		t.Errorf("TimeOfDay.String() = %q", got)
	}
	if got := (TimeOfDay{Hour: 23}).String(); got != "23:00:00" {
		t.Errorf("TimeOfDay.String() = %q", got)
	}
	for _, bad := range []string{"2024-02-30", "2024-1-02", "02024-01-01", "2024-01-02T25:00:00", "x"} {
		if _, err := ParseDate(bad); err == nil {
			t.Errorf("ParseDate(%q) succeeded", bad)
		}
	}
	for _, bad := range []string{"24:00:00", "01:02:03+00:00", "1:02", "01:02:03.", "01:60"} {
		if _, err := ParseTimeOfDay(bad); err == nil {
			t.Errorf("ParseTimeOfDay(%q) succeeded", bad)
		}
	}
	if got, err := ParseTimeOfDay("01:02"); err != nil || got != (TimeOfDay{Hour: 1, Minute: 2}) {
		t.Errorf("ParseTimeOfDay(01:02) = %v, %v", got, err)
	}
}

func TestParseDecimal(t *testing.T) {
	for _, ok := range []string{"0", "-0", "+1.5", "1.", ".5", "1E+3", "1e-7", "NaN", "nan123", "sNaN", "-Infinity", "inf", "Inf", "123456789012345678901234567890"} {
		if _, err := ParseDecimal(ok); err != nil {
			t.Errorf("ParseDecimal(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-", ".", "1e", "1e+", "1.2.3", "abc", " 1", "1_000", "NaNx", "infinit", "0x10", "1e5.5"} {
		if _, err := ParseDecimal(bad); err == nil {
			t.Errorf("ParseDecimal(%q) succeeded", bad)
		}
	}
}

func TestToValue(t *testing.T) {
	ts := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name string
		give any
		want any
	}{
		{"int", 5, int64(5)},
		{"uint64 big", uint64(math.MaxUint64), new(big.Int).SetUint64(math.MaxUint64)},
		{"uintptr kind", uintptr(3), int64(3)},
		{"float32 digits", float32(0.1), 0.1},
		{"small big int", big.NewInt(3), int64(3)},
		{"nil big", (*big.Int)(nil), nil},
		{"named int", State("x"), "x"},
		{"slice", []string{"a"}, []any{"a"}},
		{"array", [2]int{1, 2}, []any{int64(1), int64(2)}},
		{"nested any", []any{int8(1), map[string]any{"k": uint16(2)}}, []any{int64(1), map[string]any{"k": int64(2)}}},
		{"map", map[string][]int{"a": {1}}, map[string]any{"a": []any{int64(1)}}},
		{"struct", point{X: 1, Y: 1.5}, map[string]any{"x": int64(1), "y": 1.5}},
		{"pointer", ptr(int32(4)), int64(4)},
		{"pointer to time", &ts, ts},
		{"nil map", map[string]int(nil), nil},
		{"text", textEnum(0), "off"},
		{"json number int", json.Number("12"), int64(12)},
		{"json number float", json.Number("1e2"), 100.0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ToValue(tt.give)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, valueOpts); diff != "" {
				t.Errorf("ToValue(%#v) mismatch (-want +got):\n%s", tt.give, diff)
			}
		})
	}
	// The result does not alias the input's containers.
	in := []any{map[string]any{"k": int64(1)}}
	out, _ := ToValue(in)
	out.([]any)[0].(map[string]any)["k"] = int64(2)
	if in[0].(map[string]any)["k"] != int64(1) {
		t.Error("ToValue output aliases its input")
	}
}

// ownJSON is a struct that says how it is written: ToValueStrict accepts
// it, unlike a plain struct.
type ownJSON struct{ N int }

func (o ownJSON) MarshalJSON() ([]byte, error) {
	return []byte(`{"n": ` + strconv.Itoa(o.N) + `}`), nil
}

func TestToValueStrict(t *testing.T) {
	ts := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name string
		give any
		want any
	}{
		{"int", 5, int64(5)},
		{"uint8", uint8(200), int64(200)},
		{"uint64 big", uint64(math.MaxUint64), new(big.Int).SetUint64(math.MaxUint64)},
		{"float32 digits", float32(0.1), 0.1},
		{"float32 in a slice", []float32{0.1, 2}, []any{0.1, 2.0}},
		{"float32 nested", map[string]any{"k": []any{float32(0.1)}}, map[string]any{"k": []any{0.1}}},
		{"named string", State("x"), "x"},
		{"duration", time.Second, int64(time.Second)},
		{"strings", []string{"a"}, []any{"a"}},
		{"string map", map[string]int{"a": 1}, map[string]any{"a": int64(1)}},
		{"array", [2]int{1, 2}, []any{int64(1), int64(2)}},
		{"pointer", ptr(int32(4)), int64(4)},
		{"nil pointer", (*int)(nil), nil},
		{"pointer to time", &ts, ts},
		{"nil map", map[int]string(nil), nil},
		{"text", textEnum(1), "on"},
		{"json number", json.Number("12"), int64(12)},
		{"own MarshalJSON", ownJSON{N: 3}, map[string]any{"n": int64(3)}},
		{"bytes", []byte("hi"), []byte("hi")},
		{"byte array", [2]byte{1, 2}, []byte{1, 2}},
		{"value types stay", []any{Decimal("1.50"), UUID{1}, Date{Year: 2024, Month: 1, Day: 2}}, []any{Decimal("1.50"), UUID{1}, Date{Year: 2024, Month: 1, Day: 2}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ToValueStrict(tt.give)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, valueOpts); diff != "" {
				t.Errorf("ToValueStrict(%#v) mismatch (-want +got):\n%s", tt.give, diff)
			}
			// What both accept, both convert alike.
			loose, err := ToValue(tt.give)
			if err != nil {
				t.Fatalf("ToValue(%#v): %v", tt.give, err)
			}
			if diff := cmp.Diff(loose, got, valueOpts); diff != "" {
				t.Errorf("ToValueStrict and ToValue differ on %#v (-ToValue +ToValueStrict):\n%s", tt.give, diff)
			}
		})
	}

	cyclic := map[string]any{}
	cyclic["self"] = cyclic
	refused := []struct {
		name string
		give any
		want error
	}{
		{"struct", point{X: 1}, ErrUnencodable},
		{"struct in a slice", []any{int64(1), point{}}, ErrUnencodable},
		{"struct in a map", map[string]any{"k": point{}}, ErrUnencodable},
		{"pointer to struct", &point{}, ErrUnencodable},
		{"int-keyed map", map[int]string{1: "a"}, ErrUnencodable},
		{"chan", make(chan int), ErrUnencodable},
		{"func", func() {}, ErrUnencodable},
		{"complex", complex(1, 2), ErrUnencodable},
		{"cyclic map", cyclic, ErrTooDeep},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ToValueStrict(tt.give)
			if !errors.Is(err, tt.want) {
				t.Fatalf("ToValueStrict(%T) = %#v, %v; want an error wrapping %v", tt.give, got, err, tt.want)
			}
		})
	}

	// The result shares no memory with the input, []byte included.
	b := []byte("ab")
	in := []any{b, map[string]any{"b": b}}
	out, err := ToValueStrict(in)
	if err != nil {
		t.Fatal(err)
	}
	b[0] = 'X'
	if got := out.([]any)[0].([]byte); string(got) != "ab" {
		t.Errorf("ToValueStrict output shares a []byte with its input: %q", got)
	}
	if got := out.([]any)[1].(map[string]any)["b"].([]byte); string(got) != "ab" {
		t.Errorf("ToValueStrict output shares a nested []byte with its input: %q", got)
	}
}

func TestUUID4(t *testing.T) {
	var b [16]byte
	for i := range b {
		b[i] = 0xff
	}
	u := UUID4(b).String()
	if u != "ffffffff-ffff-4fff-bfff-ffffffffffff" {
		t.Fatalf("UUID4(all ones) = %s", u)
	}
	if got, err := ParseUUID(u); err != nil || got.String() != u {
		t.Fatalf("ParseUUID(%s) = %v, %v", u, got, err)
	}
}
