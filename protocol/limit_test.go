package protocol

import (
	"math/big"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// limitValues are values whose written form has every kind of escape,
// multi-byte characters, and binary bytes, for the prefix property of
// ReprLimit and AppendJSONLimit.
func limitValues() []any {
	big1, _ := new(big.Int).SetString(strings.Repeat("9", 60), 10)
	return []any{
		nil, true, int64(-12345), 1.5, big1,
		"plain", "quote's \"both\" \\ \n\t\x00\x7f é 中文 🎉 \u2028", strings.Repeat("é🎉a", 50),
		[]byte("utf-8 text é"), []byte{0xff, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 'a', 'b', 0x80},
		time.Date(2024, 1, 2, 3, 4, 5, 6000, time.FixedZone("", -3600)),
		Date{Year: 2024, Month: 2, Day: 29}, TimeOfDay{Hour: 1, Minute: 2, Second: 3},
		Decimal("3.14159265358979323846"), UUID{1, 2, 3},
		[]any{int64(1), "two", []any{3.0, nil}, map[string]any{"k": "v", "é": []byte{0xfe}}},
		map[string]any{"a": strings.Repeat("x", 100), "b\n": []any{"é", int64(2)}, "": map[string]any{}},
		pyTuple{"one"},
		// The quote is chosen by a ' beyond the first bytes: a clipped
		// repr must still open with Python's quote (CI's FuzzJSON found
		// "000\x08000000'00000" written as '0 at limit 2).
		"000\b000000'00000", []byte("000000000'0"), map[string]any{"0000000000'0": int64(1)},
		Decimal("000000000000'0"),
	}
}

// TestReprLimitIsAPrefix: for every limit, ReprLimit and AppendJSONLimit
// write a prefix of Repr and AppendJSON, cut at a character start, no
// longer than the limit, and report truncation exactly when they cut.
func TestReprLimitIsAPrefix(t *testing.T) {
	for _, v := range limitValues() {
		full := Repr(v)
		var wholeJSON [2][]byte
		for typed := range 2 {
			b, err := AppendJSON([]byte("prefix"), v, JSONOptions{Typed: typed == 1})
			if err != nil {
				t.Fatal(err)
			}
			wholeJSON[typed] = b
		}
		for n := -1; n <= len(full)+2 || n <= len(wholeJSON[1])+2; n++ {
			s, cut := ReprLimit(v, n)
			checkPrefix(t, "ReprLimit", v, n, full, s, cut)
			for typed := range 2 {
				b, cut, err := AppendJSONLimit([]byte("prefix"), v, JSONOptions{Typed: typed == 1}, n)
				if err != nil {
					t.Fatalf("AppendJSONLimit(%#v, %d): %v", v, n, err)
				}
				if !strings.HasPrefix(string(b), "prefix") {
					t.Fatalf("AppendJSONLimit(%#v, %d) lost dst: %q", v, n, b)
				}
				checkPrefix(t, "AppendJSONLimit", v, n, string(wholeJSON[typed][6:]), string(b[6:]), cut)
			}
		}
	}
}

func checkPrefix(t *testing.T, fn string, v any, n int, full, got string, cut bool) {
	t.Helper()
	want := full
	if len(full) > max(n, 0) {
		k := max(n, 0)
		for k > 0 && !utf8.RuneStart(full[k]) {
			k--
		}
		want = full[:k]
	}
	if got != want || cut != (len(full) > max(n, 0)) {
		t.Fatalf("%s(%#v, %d) = %q, %v; want %q, %v", fn, v, n, got, cut, want, len(full) > max(n, 0))
	}
}

// TestReprLimitBounded: a value that expands when written (a datetime
// shared through 40 levels of pairs is 2^40 datetimes written out, as a
// 10 KB pickle can make) is written to the limit with work and memory
// bounded by the limit, not by the expansion.
func TestReprLimitBounded(t *testing.T) {
	var v any = time.Date(2024, 1, 2, 3, 4, 5, 6000, time.UTC)
	for range 40 {
		v = []any{v, v, map[string]any{"a": v, "b": v}}
	}
	const limit = 64 << 10
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s, cut := ReprLimit(v, limit)
	b, cutJSON, err := AppendJSONLimit(nil, v, JSONOptions{Typed: true}, limit)
	runtime.ReadMemStats(&after)
	if err != nil || !cut || !cutJSON || len(s) > limit || len(b) > limit || len(s) < limit-8 || len(b) < limit-8 {
		t.Fatalf("ReprLimit: %d bytes, cut %v; AppendJSONLimit: %d bytes, cut %v, %v", len(s), cut, len(b), cutJSON, err)
	}
	// Two outputs of 64 KiB grow by doubling: well under 1 MiB.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Errorf("allocated %d bytes for two outputs of %d", alloc, limit)
	}
}

// TestIntOverPythonsDigitLimit: an int Python would refuse to write
// (over 4300 digits) is an AppendJSON error, not a slow conversion and
// JSON no reader accepts; Repr names its size.
func TestIntOverPythonsDigitLimit(t *testing.T) {
	ok := new(big.Int).Sub(new(big.Int).Exp(big.NewInt(10), big.NewInt(maxIntDigits), nil), big.NewInt(1))
	if b, err := AppendJSON(nil, new(big.Int).Neg(ok), JSONOptions{}); err != nil || len(b) != maxIntDigits+1 {
		t.Errorf("-(10**4300-1): %d bytes, %v", len(b), err)
	}
	if s := Repr(ok); len(s) != maxIntDigits {
		t.Errorf("Repr(10**4300-1) is %d bytes", len(s))
	}
	for _, x := range []*big.Int{new(big.Int).Add(ok, big.NewInt(1)), new(big.Int).Lsh(big.NewInt(1), 1<<22)} {
		if _, err := AppendJSON(nil, x, JSONOptions{}); err == nil {
			t.Errorf("AppendJSON of an int of %d bits: no error", x.BitLen())
		}
		if s := Repr(x); s != "<int of "+big.NewInt(int64(x.BitLen())).String()+" bits>" {
			t.Errorf("Repr of an int of %d bits = %.40q", x.BitLen(), s)
		}
	}
}
