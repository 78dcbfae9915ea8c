package sql

import (
	"bufio"
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
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/celeriac/celeriac/protocol"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// python is Debian's interpreter, the one with Celery (see .ci/setup).
const python = "/usr/bin/python3"

// canon is the Go side of testdata/pickle_check.py: what Python must print
// for the value v after pickle.loads.
func canon(v any) any {
	switch x := v.(type) {
	case nil, bool:
		return x
	case string:
		return strings.ToValidUTF8(x, "\uFFFD")
	case int:
		return map[string]any{"int": fmt.Sprint(x)}
	case int64:
		return map[string]any{"int": fmt.Sprint(x)}
	case uint64:
		return map[string]any{"int": fmt.Sprint(x)}
	case *big.Int:
		return map[string]any{"int": x.String()}
	case float64:
		return map[string]any{"float": hex.EncodeToString(binary.BigEndian.AppendUint64(nil, math.Float64bits(x)))}
	case []byte:
		return map[string]any{"bytes": hex.EncodeToString(x)}
	case []any:
		out := make([]any, len(x))
		for i, it := range x {
			out[i] = canon(it)
		}
		return out
	case map[string]any:
		var items []any
		for _, k := range slices.Sorted(maps.Keys(x)) {
			items = append(items, []any{canon(k), canon(x[k])})
		}
		if items == nil {
			items = []any{}
		}
		return map[string]any{"dict": items}
	case *protocol.ExceptionInfo:
		msg := make([]any, len(x.Message))
		for i, it := range x.Message {
			msg[i] = canon(it)
		}
		return map[string]any{"dict": []any{
			[]any{"exc_message", map[string]any{"tuple": msg}},
			[]any{"exc_module", x.Module},
			[]any{"exc_type", x.Type},
		}}
	case time.Time:
		s := x.Format("2006-01-02T15:04:05")
		if x.Nanosecond() >= 1000 {
			s += fmt.Sprintf(".%06d", x.Nanosecond()/1000)
		}
		if x.Location() != time.UTC {
			s += x.Format("-07:00")
		}
		return map[string]any{"datetime": s}
	case protocol.Date:
		return map[string]any{"date": x.String()}
	case protocol.TimeOfDay:
		s := fmt.Sprintf("%02d:%02d:%02d", x.Hour, x.Minute, x.Second)
		if us := x.Nanosecond / 1000; us != 0 {
			s += fmt.Sprintf(".%06d", us)
		}
		return map[string]any{"time": s}
	case protocol.Decimal:
		return map[string]any{"decimal": string(x)}
	case protocol.UUID:
		return x.String()
	}
	panic(fmt.Sprintf("canon: %T", v))
}

// pythonLoads unpickles each pickle in Python and returns the canonical
// JSON of each value.
func pythonLoads(t *testing.T, pickles [][]byte) []any {
	t.Helper()
	var in bytes.Buffer
	for _, p := range pickles {
		in.WriteString(hex.EncodeToString(p))
		in.WriteByte('\n')
	}
	cmd := exec.CommandContext(t.Context(), python, "testdata/pickle_check.py")
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	var got []any
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var v any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("python printed %q: %v", sc.Text(), err)
		}
		got = append(got, v)
	}
	if len(got) != len(pickles) {
		t.Fatalf("python answered %d values for %d pickles", len(got), len(pickles))
	}
	return got
}

// viaJSON turns v into what encoding/json reads back, to compare with
// Python's output.
func viaJSON(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func pickleValues() map[string]any {
	big1, _ := new(big.Int).SetString("-123456789012345678901234567890", 10)
	pow, _ := new(big.Int).SetString("-18446744073709551616", 10) // -2^64
	est := time.FixedZone("EST", -5*3600)
	ist := time.FixedZone("IST", 5*3600+1800)
	return map[string]any{
		"none": nil, "true": true, "false": false,
		"zero": int64(0), "small": int64(255), "256": int64(256), "neg1": int64(-1),
		"int32max": int64(math.MaxInt32), "int32min": int64(math.MinInt32),
		"int32max+1": int64(math.MaxInt32 + 1), "int32min-1": int64(math.MinInt32 - 1),
		"int64max": int64(math.MaxInt64), "int64min": int64(math.MinInt64),
		"uint64max": uint64(math.MaxUint64), "-128": int64(-128), "-129": int64(-129), "-32768": int64(-32768),
		"bigneg": big1, "-2^64": pow, "-2^63": new(big.Int).Lsh(big.NewInt(-1), 63),
		"float": 1.5, "float0": 0.0, "negzero": math.Copysign(0, -1), "inf": math.Inf(1), "nan": math.NaN(),
		"tiny": 5e-324, "huge": 1.7976931348623157e308,
		"str": "héllo ✓ 日本 \x00 \U0001F600", "empty": "", "badutf8": "a\xffb",
		"bytes": []byte{0, 1, 255}, "longbytes": bytes.Repeat([]byte{7}, 300),
		"longstr":    strings.Repeat("x", 70000),
		"list":       []any{int64(1), "two", nil, []any{}, map[string]any{}},
		"dict":       map[string]any{"a": int64(1), "b": []any{true, nil}, "": "empty key"},
		"exception":  &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad thing", int64(42)}, Module: "builtins"},
		"exc-noargs": &protocol.ExceptionInfo{Type: "Retry", Module: "celery.exceptions"},
		"started":    map[string]any{"pid": int64(8789), "hostname": "w1@testhost"},
		"utc":        time.Date(2026, 11, 29, 13, 13, 55, 990025000, time.UTC),
		"utc-whole":  time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		"est":        time.Date(1999, 12, 31, 23, 59, 59, 1000, est),
		"ist":        time.Date(2000, 2, 29, 0, 0, 0, 0, ist),
		"date":       protocol.Date{Year: 2024, Month: 2, Day: 29},
		"timeofday":  protocol.TimeOfDay{Hour: 23, Minute: 1, Second: 2, Nanosecond: 123456000},
		"decimal":    protocol.Decimal("-12.50"),
		"uuid":       protocol.UUID{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12},
	}
}

func TestPickleLoadsInPython(t *testing.T) {
	vals := pickleValues()
	names := slices.Sorted(maps.Keys(vals))
	// Seeded random nested values: the same cases every run.
	r := rand.New(rand.NewPCG(17, 42))
	for i := range 300 {
		name := fmt.Sprintf("random-%03d", i)
		vals[name] = randomValue(r, 0)
		names = append(names, name)
	}
	var pickles [][]byte
	for _, n := range names {
		p, err := EncodePickle(vals[n])
		if err != nil {
			t.Fatalf("EncodePickle(%s): %v", n, err)
		}
		pickles = append(pickles, p)
	}
	got := pythonLoads(t, pickles)
	for i, n := range names {
		want := viaJSON(t, canon(vals[n]))
		if !reflect.DeepEqual(want, got[i]) {
			t.Errorf("%s: Python read %v, want %v", n, got[i], want)
		}
	}
}

// TestPickleConvertsOtherTypes: Go values outside the value model are
// pickled as the JSON result serializer would carry them.
func TestPickleConvertsOtherTypes(t *testing.T) {
	type point struct {
		X int    `json:"x"`
		Y string `json:"y"`
	}
	cases := map[string]struct{ in, want any }{
		"struct":   {point{1, "a"}, map[string]any{"x": int64(1), "y": "a"}},
		"typedmap": {map[string]int{"a": 1}, map[string]any{"a": int64(1)}},
		"slice":    {[]string{"a", "b"}, []any{"a", "b"}},
		"int":      {int(7), int64(7)},
		"float32":  {float32(0.5), 0.5},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := EncodePickle(c.in)
			if err != nil {
				t.Fatal(err)
			}
			want, err := EncodePickle(c.want)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("EncodePickle(%#v) = %x, want %x", c.in, got, want)
			}
		})
	}
}

func TestPickleCycleIsAnError(t *testing.T) {
	m := map[string]any{}
	m["self"] = m
	// ErrUnencodable tells the worker that writing again cannot help.
	if _, err := EncodePickle(m); !errors.Is(err, protocol.ErrUnencodable) {
		t.Fatalf("a cyclic value: err = %v, want ErrUnencodable", err)
	}
	if _, err := EncodePickle(make(chan int)); !errors.Is(err, protocol.ErrUnencodable) {
		t.Fatalf("a channel: err = %v, want ErrUnencodable", err)
	}
}

func randomValue(r *rand.Rand, depth int) any {
	n := 12
	if depth > 3 {
		n = 8
	}
	switch r.IntN(n) {
	case 0:
		return nil
	case 1:
		return r.IntN(2) == 0
	case 2:
		return int64(r.Uint64())
	case 3:
		return int64(r.IntN(600) - 300)
	case 4:
		return math.Float64frombits(r.Uint64())
	case 5:
		b := make([]byte, r.IntN(20))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return string(b)
	case 6:
		b := make([]byte, r.IntN(300))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return b
	case 7:
		return new(big.Int).Lsh(big.NewInt(int64(r.IntN(2000)-1000)), uint(r.IntN(200)))
	case 8, 9:
		l := make([]any, r.IntN(5))
		for i := range l {
			l[i] = randomValue(r, depth+1)
		}
		return l
	default:
		m := map[string]any{}
		for range r.IntN(5) {
			m[fmt.Sprint(r.IntN(100))] = randomValue(r, depth+1)
		}
		return m
	}
}

var pickleSeeds = []string{`null`, `[1, "a", {"b": [true, 1.5]}]`, `{"__type__": "datetime", "__value__": "2026-01-02T03:04:05.000006+05:30"}`,
	`{"__type__": "bytes", "__value__": "AAEC"}`, `123456789012345678901234567890`, `-9223372036854775809`,
	`{"__type__": "decimal", "__value__": "1.25"}`, `{"__type__": "date", "__value__": "2024-02-29"}`,
	`{"__type__": "time", "__value__": "23:59:59.000001"}`, `{"__type__": "datetime", "__value__": "0001-01-01T00:00:00-08:00"}`,
	`"\ud800"`, `[[[[[]]]]]`, `{"": {"": null}}`, `1e308`, `-0.0`}

// TestPickleFuzzCorpusInPython replays the fuzz seeds and the corpus in
// testdata/fuzz/FuzzEncodePickle through Python's pickle.loads.
func TestPickleFuzzCorpusInPython(t *testing.T) {
	inputs := [][]byte{}
	for _, s := range pickleSeeds {
		inputs = append(inputs, []byte(s))
	}
	files, _ := filepath.Glob("testdata/fuzz/FuzzEncodePickle/*")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		_, arg, ok := strings.Cut(string(data), "[]byte(")
		if !ok {
			t.Fatalf("%s: not a corpus file", f)
		}
		s, err := strconv.Unquote(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(arg), ")")))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		inputs = append(inputs, []byte(s))
	}
	var (
		pickles [][]byte
		values  []any
	)
	for _, in := range inputs {
		for _, ct := range []string{protocol.ContentTypeJSON, protocol.ContentTypeMsgpack} {
			v, err := protocol.Unmarshal(ct, in, protocol.DecodeOptions{})
			if err != nil {
				continue
			}
			p, err := EncodePickle(v)
			if err != nil {
				continue
			}
			pickles, values = append(pickles, p), append(values, v)
		}
	}
	if len(pickles) < len(pickleSeeds) {
		t.Fatalf("only %d of %d inputs decoded", len(pickles), len(inputs))
	}
	got := pythonLoads(t, pickles)
	for i, v := range values {
		if want := viaJSON(t, canon(v)); !reflect.DeepEqual(want, got[i]) {
			t.Errorf("%#v: Python read %v, want %v", v, got[i], want)
		}
	}
}

// FuzzEncodePickle: any value the JSON and msgpack decoders produce
// pickles without panicking, and the pickle is framed (PROTO 3 ... STOP).
// TestPickleFuzzCorpusInPython replays the corpus through Python.
func FuzzEncodePickle(f *testing.F) {
	for _, s := range pickleSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		defer fuzzwatch.Watch(t, data)()
		for _, ct := range []string{protocol.ContentTypeJSON, protocol.ContentTypeMsgpack} {
			v, err := protocol.Unmarshal(ct, data, protocol.DecodeOptions{})
			if err != nil {
				continue
			}
			p, err := EncodePickle(v)
			if err != nil {
				continue
			}
			if len(p) < 3 || p[0] != opProto || p[1] != pickleProtocol || p[len(p)-1] != opStop {
				t.Fatalf("pickle of %#v is not framed: %x", v, p)
			}
			again, _ := EncodePickle(v)
			if !bytes.Equal(p, again) {
				t.Fatalf("pickle of %#v differs between calls", v)
			}
		}
	})
}
