package protocol

import (
	"math"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestReprPython(t *testing.T) {
	f := loadPyFixture(t)
	for _, c := range f.Values {
		if c.Name == "datetime_naive" {
			continue // Go times always have an offset
		}
		t.Run(c.Name, func(t *testing.T) {
			v := untag(t, c.Value)
			if got := Repr(v); got != c.Repr {
				t.Errorf("Repr(%#v)\n got %s\nwant %s", v, got, c.Repr)
			}
		})
	}
}

func TestSafeReprPython(t *testing.T) {
	f := loadPyFixture(t)
	check := func(t *testing.T, v any, want map[string]string) {
		t.Helper()
		for limit, w := range want {
			n := 0
			if limit != "None" {
				var err error
				if n, err = strconv.Atoi(limit); err != nil {
					t.Fatal(err)
				}
			}
			if got := SafeRepr(v, n); got != w {
				t.Errorf("SafeRepr(%#v, %s)\n got %q\nwant %q", v, limit, got, w)
			}
		}
	}
	for _, c := range f.Values {
		if c.Name == "datetime_naive" {
			continue
		}
		t.Run(c.Name, func(t *testing.T) { check(t, untag(t, c.Value), c.SafeRepr) })
	}
	for i, c := range f.Args {
		t.Run("args "+strconv.Itoa(i), func(t *testing.T) {
			args := untag(t, c.Args).([]any)
			check(t, pyTuple(args), c.SafeRepr)
			if got, want := ReprArgs(args), c.SafeRepr["1024"]; got != want {
				t.Errorf("ReprArgs(%#v)\n got %q\nwant %q", args, got, want)
			}
			if got := Repr(pyTuple(args)); got != c.Repr {
				t.Errorf("Repr(tuple %#v)\n got %q\nwant %q", args, got, c.Repr)
			}
		})
	}
}

func TestRepr(t *testing.T) {
	tests := []struct {
		give any
		want string
	}{
		{nil, "None"},
		{true, "True"},
		{int64(-3), "-3"},
		{new(big.Int).Lsh(big.NewInt(1), 64), "18446744073709551616"},
		{1.0, "1.0"},
		{1e16, "1e+16"},
		{1e15, "1000000000000000.0"},
		{0.0001, "0.0001"},
		{1e-5, "1e-05"},
		{1.5e-300, "1.5e-300"},
		{math.Inf(-1), "-inf"},
		{math.NaN(), "nan"},
		{math.Copysign(0, -1), "-0.0"},
		{"it's", `"it's"`},
		{`it's "x"`, `'it\'s "x"'`},
		{"\x00\t\u0085\u00e9\u200b\U0001F600\U000E0001", `'\x00\t\x85é\u200b😀\U000e0001'`},
		{"a\xffb", "'a\ufffdb'"},
		{[]byte("it's\x00\xff"), `b"it's\x00\xff"`},
		{[]any{int64(1), "a", nil}, "[1, 'a', None]"},
		{map[string]any{"b": int64(1), "a": []any{}}, "{'a': [], 'b': 1}"},
		{pyTuple{int64(1)}, "(1,)"},
		{pyTuple{}, "()"},
		{time.Date(2024, 1, 2, 3, 4, 0, 0, time.UTC), "datetime.datetime(2024, 1, 2, 3, 4, tzinfo=datetime.timezone.utc)"},
		{time.Date(2024, 1, 2, 3, 4, 0, 7000, time.FixedZone("", -3600)),
			"datetime.datetime(2024, 1, 2, 3, 4, 0, 7, tzinfo=datetime.timezone(datetime.timedelta(days=-1, seconds=82800)))"},
		{Date{2024, 1, 2}, "datetime.date(2024, 1, 2)"},
		{TimeOfDay{Hour: 1, Minute: 2}, "datetime.time(1, 2)"},
		{Decimal("1.5"), "Decimal('1.5')"},
		{UUID{}, "UUID('00000000-0000-0000-0000-000000000000')"},
		{[]int{1, 2}, "[1, 2]"},
		{point{X: 1}, "{'x': 1, 'y': 0}"},
		{make(chan int), "<unrepresentable chan int>"},
	}
	for _, tt := range tests {
		if got := Repr(tt.give); got != tt.want {
			t.Errorf("Repr(%#v) = %s, want %s", tt.give, got, tt.want)
		}
	}
}

func TestReprArgs(t *testing.T) {
	tests := []struct {
		give []any
		want string
	}{
		{nil, "()"},
		{[]any{int64(2)}, "(2,)"},
		{[]any{int64(2), int64(3)}, "(2, 3)"},
		{[]any{"it's", "a\nb"}, "('it\\'s', 'a\nb')"}, // saferepr does not escape
		{[]any{[]any{[]any{[]any{int64(1)}}}}, "([[[...]]],)"},
	}
	for _, tt := range tests {
		if got := ReprArgs(tt.give); got != tt.want {
			t.Errorf("ReprArgs(%#v) = %q, want %q", tt.give, got, tt.want)
		}
	}
	long := ReprArgs([]any{strings.Repeat("x", 5000)})
	if n := len(long); n > ReprMaxSize+10 {
		t.Errorf("ReprArgs of a 5000-char string is %d chars, want about %d", n, ReprMaxSize)
	}
	if got, want := ReprKwargs(nil), "{}"; got != want {
		t.Errorf("ReprKwargs(nil) = %q, want %q", got, want)
	}
	if got, want := ReprKwargs(map[string]any{"b": int64(1), "a": "x"}), "{'a': 'x', 'b': 1}"; got != want {
		t.Errorf("ReprKwargs = %q, want %q", got, want)
	}
}

func TestSafeReprOrderedDict(t *testing.T) {
	d := OrderedDict{Keys: []string{"z", "a"}, Values: map[string]any{"z": int64(1),
		"a": OrderedDict{Keys: []string{"y", "b"}, Values: map[string]any{"y": []any{int64(1)}, "b": "s"}}}}
	if got, want := SafeRepr(d, ReprMaxSize), "{'z': 1, 'a': {'y': [1], 'b': 's'}}"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
