package sql

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/celeriac/celeriac/protocol"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// pickleCase is one case of testdata/pickle_values.json, which
// testdata/gen_pickles.py writes from Python's own pickle.dumps.
type pickleCase struct {
	Name   string `json:"name"`
	Pickle string `json:"pickle"`
	Want   any    `json:"want"`
	Error  string `json:"error"`
}

func loadPickleCases(tb testing.TB) []pickleCase {
	tb.Helper()
	data, err := os.ReadFile("testdata/pickle_values.json")
	if err != nil {
		tb.Fatalf("%v (regenerate with /usr/bin/python3 backend/sql/testdata/gen_pickles.py)", err)
	}
	var doc struct {
		Cases []pickleCase `json:"cases"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		tb.Fatalf("testdata/pickle_values.json: %v", err)
	}
	return doc.Cases
}

// tagged is the Go side of gen_pickles.py's tagged(): the form in which
// the golden file gives a value, types included. It also checks the
// protocol conventions the tags cannot show (no *big.Int inside int64).
func tagged(t testing.TB, v any) any {
	t.Helper()
	switch x := v.(type) {
	case nil:
		return []any{"none"}
	case bool:
		return []any{"bool", x}
	case int64:
		return []any{"int", fmt.Sprint(x)}
	case *big.Int:
		if x.IsInt64() {
			t.Errorf("*big.Int %s fits int64", x)
		}
		return []any{"int", x.String()}
	case float64:
		return []any{"float", hex.EncodeToString(binary.BigEndian.AppendUint64(nil, math.Float64bits(x)))}
	case string:
		return []any{"str", x}
	case []byte:
		return []any{"bytes", hex.EncodeToString(x)}
	case []any:
		out := make([]any, len(x))
		for i, it := range x {
			out[i] = tagged(t, it)
		}
		return []any{"list", out}
	case map[string]any:
		items := []any{}
		for _, k := range slices.Sorted(maps.Keys(x)) {
			items = append(items, []any{k, tagged(t, x[k])})
		}
		return []any{"dict", items}
	case time.Time:
		_, off := x.Zone()
		if off == 0 && x.Location() != time.UTC {
			t.Errorf("time %v: a zero offset is time.UTC", x)
		}
		return []any{"datetime", []any{x.Year(), int(x.Month()), x.Day(), x.Hour(), x.Minute(), x.Second(), x.Nanosecond() / 1000, off}}
	case protocol.Date:
		return []any{"date", []any{x.Year, int(x.Month), x.Day}}
	case protocol.TimeOfDay:
		return []any{"time", []any{x.Hour, x.Minute, x.Second, x.Nanosecond / 1000}}
	case protocol.Decimal:
		return []any{"decimal", string(x)}
	case protocol.UUID:
		return []any{"uuid", x.Hex()}
	}
	t.Errorf("unexpected type %T in a decoded value", v)
	return nil
}

// TestDecodePickleGolden decodes the pickles Python writes for many values
// with every protocol, and refuses those it must refuse, for the reason
// it must give.
func TestDecodePickleGolden(t *testing.T) {
	cases := loadPickleCases(t)
	if len(cases) < 600 {
		t.Fatalf("only %d golden cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			p, err := hex.DecodeString(c.Pickle)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodePickle(p)
			switch c.Error {
			case "":
				if err != nil {
					t.Fatalf("DecodePickle: %v", err)
				}
				if diff := cmp.Diff(c.Want, viaJSON(t, tagged(t, got))); diff != "" {
					t.Errorf("DecodePickle() mismatch (-want +got):\n%s", diff)
				}
			case "unsafe":
				if !errors.Is(err, ErrUnsafePickle) {
					t.Fatalf("DecodePickle = %#v, %v; want ErrUnsafePickle", got, err)
				}
			case "deep":
				if !errors.Is(err, protocol.ErrTooDeep) {
					t.Fatalf("DecodePickle = %#v, %v; want ErrTooDeep", got, err)
				}
			case "error":
				if err == nil || errors.Is(err, ErrUnsafePickle) {
					t.Fatalf("DecodePickle = %#v, %v; want an error other than ErrUnsafePickle", got, err)
				}
			default:
				t.Fatalf("unknown error kind %q", c.Error)
			}
			if err != nil && !strings.HasPrefix(err.Error(), "sql backend: ") && !strings.HasPrefix(err.Error(), "protocol: ") {
				t.Errorf("error %q has no package prefix", err)
			}
		})
	}
}

// decodedForm is what DecodePickle returns for a value EncodePickle
// wrote: the exception dict for an *ExceptionInfo, a UUID's text (the
// encoder writes a str), integers as int64 when they fit, times with
// their offset.
func decodedForm(v any) any {
	switch x := v.(type) {
	case int:
		return int64(x)
	case uint64:
		return intValue(new(big.Int).SetUint64(x))
	case *big.Int:
		return intValue(x)
	case string:
		return strings.ToValidUTF8(x, "\uFFFD")
	case []any:
		out := make([]any, len(x))
		for i, it := range x {
			out[i] = decodedForm(it)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, it := range x {
			out[strings.ToValidUTF8(k, "\uFFFD")] = decodedForm(it)
		}
		return out
	case *protocol.ExceptionInfo:
		return decodedForm(x.Value())
	case protocol.UUID:
		return x.String()
	}
	return v
}

var pickleCmp = cmp.Options{
	cmpopts.EquateNaNs(),
	cmp.Comparer(func(a, b *big.Int) bool { return a.Cmp(b) == 0 }),
	cmp.Comparer(func(a, b time.Time) bool {
		_, oa := a.Zone()
		_, ob := b.Zone()
		return a.Equal(b) && oa == ob
	}),
	// Negative zero must stay negative.
	cmp.FilterValues(func(a, b float64) bool { return a == 0 && b == 0 }, cmp.Comparer(func(a, b float64) bool {
		return math.Signbit(a) == math.Signbit(b)
	})),
}

// TestDecodePickleRoundTrip reads back every value the encoder's tests
// pickle (the fixed ones and 300 random nested values).
func TestDecodePickleRoundTrip(t *testing.T) {
	vals := pickleValues()
	r := rand.New(rand.NewPCG(17, 42))
	for i := range 300 {
		vals[fmt.Sprintf("random-%03d", i)] = randomValue(r, 0)
	}
	if len(vals) < 330 {
		t.Fatalf("only %d values", len(vals))
	}
	for _, name := range slices.Sorted(maps.Keys(vals)) {
		v := vals[name]
		p, err := EncodePickle(v)
		if err != nil {
			t.Fatalf("EncodePickle(%s): %v", name, err)
		}
		got, err := DecodePickle(p)
		if err != nil {
			t.Errorf("%s: DecodePickle: %v", name, err)
			continue
		}
		if diff := cmp.Diff(decodedForm(v), got, pickleCmp); diff != "" {
			t.Errorf("%s: DecodePickle(EncodePickle()) mismatch (-want +got):\n%s", name, diff)
		}
	}
}

// pickleEqual is cmp.Equal(a, b, pickleCmp) in time linear in the
// values' size.
func pickleEqual(a, b any) bool {
	switch x := a.(type) {
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) || (x == nil) != (y == nil) {
			return false
		}
		for i := range x {
			if !pickleEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) || (x == nil) != (y == nil) {
			return false
		}
		for k, xv := range x {
			yv, ok := y[k]
			if !ok || !pickleEqual(xv, yv) {
				return false
			}
		}
		return true
	case float64:
		y, ok := b.(float64)
		return ok && (x == y && math.Signbit(x) == math.Signbit(y) || math.IsNaN(x) && math.IsNaN(y))
	case *big.Int:
		y, ok := b.(*big.Int)
		return ok && x.Cmp(y) == 0
	case time.Time:
		y, ok := b.(time.Time)
		_, ox := x.Zone()
		_, oy := y.Zone()
		return ok && x.Equal(y) && ox == oy
	case []byte:
		y, ok := b.([]byte)
		return ok && bytes.Equal(x, y) && (x == nil) == (y == nil)
	}
	return cmp.Equal(a, b, pickleCmp)
}

// nestedLists is a pickle of n lists, each inside the one before.
func nestedLists(n int) []byte {
	p := []byte{opProto, 2}
	p = append(p, bytes.Repeat([]byte{opEmptyList}, n)...)
	p = append(p, bytes.Repeat([]byte{opAppend}, n-1)...)
	return append(p, opStop)
}

func TestDecodePickleDepth(t *testing.T) {
	v, err := DecodePickle(nestedLists(protocol.MaxDepthLimit))
	if err != nil {
		t.Fatalf("%d levels: %v", protocol.MaxDepthLimit, err)
	}
	depth := 0
	for l, ok := v.([]any); ok; l, ok = l[0].([]any) {
		depth++
		if len(l) == 0 {
			break
		}
	}
	if depth != protocol.MaxDepthLimit {
		t.Errorf("depth %d, want %d", depth, protocol.MaxDepthLimit)
	}
	if _, err := DecodePickle(nestedLists(protocol.MaxDepthLimit + 1)); !errors.Is(err, protocol.ErrTooDeep) {
		t.Errorf("%d levels: err = %v, want ErrTooDeep", protocol.MaxDepthLimit+1, err)
	}
}

// sharedDoubling is a pickle of n lists, each holding the one before
// twice through the memo: a few bytes a level, 2^n leaves expanded.
func sharedDoubling(n int) []byte {
	p := []byte{opProto, 4, opEmptyList, opMemoize}
	for i := range n {
		p = append(p, opEmptyList, opMemoize, opMark, opLongBinGet)
		p = binary.LittleEndian.AppendUint32(p, uint32(2*i))
		p = append(p, opLongBinGet)
		p = binary.LittleEndian.AppendUint32(p, uint32(2*i))
		p = append(p, opAppends, opPop, opLongBinGet)
		p = binary.LittleEndian.AppendUint32(p, uint32(2*i+1))
		p = append(p, opMemoize)
	}
	return append(p, opStop)
}

// TestDecodePickleSharing: a shared container is one value in the
// result; a pickle whose value would be huge written out is refused.
func TestDecodePickleSharing(t *testing.T) {
	v, err := DecodePickle(sharedDoubling(10))
	if err != nil {
		t.Fatal(err)
	}
	l := v.([]any)
	if len(l) != 2 || reflect.ValueOf(l[0]).Pointer() != reflect.ValueOf(l[1]).Pointer() {
		t.Errorf("the shared list is not shared: %v", l)
	}
	start := time.Now()
	if _, err := DecodePickle(sharedDoubling(64)); !errors.Is(err, protocol.ErrTooLarge) {
		t.Errorf("2^64 leaves: err = %v, want ErrTooLarge", err)
	}
	// A memoized string hashed as a dict key again and again.
	long := strings.Repeat("k", 1<<20)
	p := []byte{opProto, 4, opBinUnicode}
	p = binary.LittleEndian.AppendUint32(p, uint32(len(long)))
	p = append(p, long...)
	p = append(p, opMemoize, opPop, opEmptyDict)
	for range 200 {
		p = append(p, opBinGet, 0, opNone, opSetItem)
	}
	if _, err := DecodePickle(append(p, opStop)); !errors.Is(err, protocol.ErrTooLarge) {
		t.Errorf("a 1 MiB key set 200 times: err = %v, want ErrTooLarge", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("refusing took %v", d)
	}
}

// TestDecodePickleMutationAfterMemo: APPENDS and SETITEMS after MEMOIZE
// reach the memoized object, as in Python; a set made from a list does
// not see later appends.
func TestDecodePickleMutationAfterMemo(t *testing.T) {
	// [d, d] where d = {} is memoized, then filled: both see the items.
	q := []byte{opProto, 4, opEmptyList, opMemoize, opEmptyDict, opMemoize, opAppend, opBinGet, 1, opAppend,
		opBinGet, 1, opShortBinUni, 1, 'k', opBinInt1, 7, opSetItem, opPop, opStop}
	v, err := DecodePickle(q)
	if err != nil {
		t.Fatal(err)
	}
	want := []any{map[string]any{"k": int64(7)}, map[string]any{"k": int64(7)}}
	if diff := cmp.Diff(want, v); diff != "" {
		t.Errorf("mismatch (-want +got):\n%s", diff)
	}
	// s = set(l) with l = [1], then l.append(2): s stays {1}.
	s := []byte{opProto, 2, opEmptyList, opMemoize, opBinInt1, 1, opAppend, opPop,
		opGlobal}
	s = append(s, "builtins\nset\n"...)
	s = append(s, opBinGet, 0, opTuple1, opReduce, opBinGet, 0, opBinInt1, 2, opAppend, opTuple2, opStop)
	v, err = DecodePickle(s)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]any{[]any{int64(1)}, []any{int64(1), int64(2)}}, v); diff != "" {
		t.Errorf("set then append: mismatch (-want +got):\n%s", diff)
	}
}

// TestDecodePickleUnsafeNeverRuns: the error for a refused global names
// it; nothing else happens (the pickle would create a file).
func TestDecodePickleUnsafeNeverRuns(t *testing.T) {
	marker := t.TempDir() + "/pwned"
	p := []byte("cos\nsystem\n(S'touch " + marker + "'\ntR.")
	_, err := DecodePickle(p)
	if !errors.Is(err, ErrUnsafePickle) || !strings.Contains(err.Error(), `"os.system"`) {
		t.Fatalf("err = %v, want ErrUnsafePickle naming os.system", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the pickle ran")
	}
}

func TestDecodePickleLimits(t *testing.T) {
	if _, err := DecodePickle(make([]byte, maxPickleSize+1)); !errors.Is(err, protocol.ErrTooLarge) {
		t.Errorf("oversized input: err = %v, want ErrTooLarge", err)
	}
	// A memo index past the input's length is refused before it is used
	// to size the memo.
	if _, err := DecodePickle([]byte{opNone, opLongBinPut, 0xff, 0xff, 0xff, 0x00, opStop}); err == nil {
		t.Error("LONG_BINPUT 16M in a 7-byte pickle: no error")
	}
	// Python's limit on the digits of an int written as text.
	if _, err := DecodePickle([]byte("L" + strings.Repeat("9", maxPickleIntDigits+1) + "L\n.")); err == nil {
		t.Error("LONG of 4301 digits: no error")
	}
	v, err := DecodePickle([]byte("L" + strings.Repeat("9", maxPickleIntDigits) + "L\n."))
	if err != nil {
		t.Fatalf("LONG of 4300 digits: %v", err)
	}
	if x, ok := v.(*big.Int); !ok || len(x.String()) != maxPickleIntDigits {
		t.Errorf("LONG of 4300 digits = %T", v)
	}
	// Trailing data after STOP is ignored, as pickle.loads ignores it.
	if v, err := DecodePickle([]byte("\x80\x02K\x05.garbage")); err != nil || v != int64(5) {
		t.Errorf("trailing data: %v, %v", v, err)
	}
}

// FuzzDecodePickle: no input panics or runs away, and whatever decodes
// encodes again and decodes to the same value (the encoder writes
// UUIDs as text, the decoder reads them back as such).
func FuzzDecodePickle(f *testing.F) {
	for _, c := range loadPickleCases(f) {
		p, err := hex.DecodeString(c.Pickle)
		if err != nil {
			f.Fatal(err)
		}
		if len(p) < 4096 {
			f.Add(p)
		}
	}
	for _, v := range pickleValues() {
		if p, err := EncodePickle(v); err == nil && len(p) < 4096 {
			f.Add(p)
		}
	}
	f.Add(sharedDoubling(8))
	f.Add(nestedLists(20))
	for _, p := range hostileSeeds() {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		defer fuzzwatch.WatchWithin(t, fuzzwatch.Limits{Time: fuzzMaxTime, Alloc: fuzzMaxAlloc}, data)()
		v, err := DecodePickle(data)
		if err != nil {
			if v != nil {
				t.Fatalf("DecodePickle returned %#v with error %v", v, err)
			}
			return
		}
		p, err := EncodePickle(v)
		if err != nil {
			t.Fatalf("EncodePickle(DecodePickle(%x)): %v", data, err)
		}
		if len(p) > writtenBound(data) {
			t.Fatalf("a pickle of %d bytes encodes again to %d, over %d", len(data), len(p), writtenBound(data))
		}
		w, err := DecodePickle(p)
		if err != nil {
			t.Fatalf("DecodePickle(EncodePickle(%#v)): %v", v, err)
		}
		// cmp.Diff only to show a mismatch: it takes seconds and hundreds
		// of MiB on 20 nested lists.
		if want := decodedForm(v); !pickleEqual(want, w) {
			t.Fatalf("decode, encode, decode mismatch (-first +second):\n%s", cmp.Diff(want, w, pickleCmp))
		}
		checkWrittenBound(t, data, v)
	})
}

// Limits of one FuzzDecodePickle input (decoding, encoding again and
// writing the value out), stricter than fuzzwatch's defaults.
const (
	fuzzMaxAlloc = 64 << 20
	fuzzMaxTime  = time.Second
)
