package protocol

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

type upperText string

func (u *upperText) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		return errors.New("empty")
	}
	*u = upperText(strings.ToUpper(string(b)))
	return nil
}

type jsonPair struct{ A, B int }

func (p *jsonPair) UnmarshalJSON(b []byte) error {
	_, err := fmt.Sscanf(string(b), "[%d, %d]", &p.A, &p.B)
	return err
}

type Base struct {
	ID   int    `celery:"id,required"`
	Note string `json:"note"`
}

type order struct {
	Base
	Lines   []line            `json:"lines"`
	Meta    map[string]string `celery:"meta"`
	When    time.Time         `json:"when"`
	Skipped string            `json:"-"`
	Ignored string            `celery:"-"`
	Price   *float64          `json:"price"`
	Any     any               `json:"any"`
	Exact   int
	// hidden is unexported: binding must leave it alone even when the
	// object has a "hidden" key.
	hidden int
}

type line struct {
	SKU string `json:"sku"`
	Qty uint8  `json:"qty"`
}

func TestBind(t *testing.T) {
	when := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	price := 9.5
	u, _ := ParseUUID("12345678-1234-5678-1234-567812345678")
	big70 := new(big.Int).Lsh(big.NewInt(1), 70)
	tests := []struct {
		name string
		src  any
		dst  any // pointer to a zero value of the target type
		want any // the value dst should point to
	}{
		{"int", int64(3), new(int), 3},
		{"int8 edge", int64(-128), new(int8), int8(-128)},
		{"uint from int", int64(255), new(uint8), uint8(255)},
		{"uint64 from big", new(big.Int).SetUint64(math.MaxUint64), new(uint64), uint64(math.MaxUint64)},
		{"int from integral float", 2.0, new(int), 2},
		{"int from go int", 7, new(int64), int64(7)},
		{"float from int", int64(2), new(float64), 2.0},
		{"float32", 1.5, new(float32), float32(1.5)},
		{"float from big", big70, new(float64), math.Pow(2, 70)},
		{"nan", math.NaN(), new(float64), math.NaN()},
		{"string", "é", new(string), "é"},
		{"string from bytes", []byte("raw"), new(string), "raw"},
		{"string from uuid", u, new(string), "12345678-1234-5678-1234-567812345678"},
		{"string from time", when, new(string), "2024-01-02T03:04:05+00:00"},
		{"string from decimal", Decimal("1.5"), new(string), "1.5"},
		{"named string", "SUCCESS", new(State), StateSuccess},
		{"bool", true, new(bool), true},
		{"slice", []any{int64(1), int64(2)}, new([]int), []int{1, 2}},
		{"nil slice", nil, new([]int), []int(nil)},
		{"bytes from bytes", []byte{0xff}, new([]byte), []byte{0xff}},
		{"bytes from string", "hi", new([]byte), []byte("hi")},
		{"array", []any{"a", "b"}, new([2]string), [2]string{"a", "b"}},
		{"map", map[string]any{"a": int64(1)}, new(map[string]int), map[string]int{"a": 1}},
		{"nested", []any{[]any{1.5}, []any{}}, new([][]float64), [][]float64{{1.5}, {}}},
		{"pointer", int64(4), new(*int), ptr(4)},
		{"nil pointer", nil, new(*int), (*int)(nil)},
		{"any", map[string]any{"x": nil}, new(any), any(map[string]any{"x": nil})},
		{"any nil", nil, new(any), any(nil)},
		{"time from time", when, new(time.Time), when},
		{"time from string", "2024-01-02T03:04:05Z", new(time.Time), when},
		{"date from string", "2024-01-02", new(Date), Date{2024, 1, 2}},
		{"date from kombu 5.2 text", "2024-01-02T00:00:00", new(Date), Date{2024, 1, 2}},
		{"date from time", when, new(Date), Date{2024, 1, 2}},
		{"time of day", "01:02:03.5", new(TimeOfDay), TimeOfDay{1, 2, 3, 500000000}},
		{"decimal from string", "1.50", new(Decimal), Decimal("1.50")},
		{"decimal from int", int64(7), new(Decimal), Decimal("7")},
		{"decimal from float", 0.1, new(Decimal), Decimal("0.1")},
		{"uuid from string", "12345678123456781234567812345678", new(UUID), u},
		{"uuid from bytes", u[:], new(UUID), u},
		{"big from int", int64(-5), new(big.Int), *big.NewInt(-5)},
		{"big pointer", big70, new(*big.Int), big70},
		{"text unmarshaler", "abc", new(upperText), upperText("ABC")},
		{"json unmarshaler", []any{int64(1), int64(2)}, new(jsonPair), jsonPair{1, 2}},
		{"struct", map[string]any{
			"id": int64(7), "note": "n", "lines": []any{map[string]any{"sku": "A", "qty": int64(2), "extra": true}},
			"meta": map[string]any{"k": "v"}, "when": "2024-01-02T03:04:05+00:00", "Skipped": "x", "Ignored": "y",
			"price": 9.5, "any": []any{nil}, "Exact": int64(3), "hidden": int64(1), "unknown": "ignored",
		}, new(order), order{
			Base: Base{ID: 7, Note: "n"}, Lines: []line{{"A", 2}}, Meta: map[string]string{"k": "v"},
			When: when, Price: &price, Any: []any{nil}, Exact: 3,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := Bind(tt.src, tt.dst); err != nil {
				t.Fatalf("Bind(%#v): %v", tt.src, err)
			}
			if o, ok := tt.dst.(*order); ok && o.hidden != 0 {
				t.Errorf("Bind set the unexported field to %d", o.hidden)
			}
			got := derefAny(tt.dst)
			if diff := cmp.Diff(tt.want, got, valueOpts, cmp.AllowUnexported(order{}, big.Int{})); diff != "" {
				t.Errorf("Bind(%#v) mismatch (-want +got):\n%s", tt.src, diff)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// derefAny returns the value a pointer made by new() points to.
func derefAny(p any) any {
	switch x := p.(type) {
	case *int:
		return *x
	case *int8:
		return *x
	case *int64:
		return *x
	case *uint8:
		return *x
	case *uint64:
		return *x
	case *float32:
		return *x
	case *float64:
		return *x
	case *string:
		return *x
	case *State:
		return *x
	case *bool:
		return *x
	case *[]int:
		return *x
	case *[]byte:
		return *x
	case *[2]string:
		return *x
	case *map[string]int:
		return *x
	case *[][]float64:
		return *x
	case **int:
		return *x
	case *any:
		return *x
	case *time.Time:
		return *x
	case *Date:
		return *x
	case *TimeOfDay:
		return *x
	case *Decimal:
		return *x
	case *UUID:
		return *x
	case *big.Int:
		return *x
	case **big.Int:
		return *x
	case *upperText:
		return *x
	case *jsonPair:
		return *x
	case *order:
		return *x
	}
	panic(fmt.Sprintf("derefAny: add %T", p))
}

func TestBindErrors(t *testing.T) {
	tests := []struct {
		name string
		src  any
		dst  any
		want string
	}{
		{"string to int", "x", new(int), `protocol: cannot bind string "x" to int`},
		{"overflow", int64(300), new(int8), "protocol: cannot bind int 300 to int8: out of range"},
		{"negative uint", int64(-1), new(uint), "protocol: cannot bind int -1 to uint: out of range"},
		{"big to int64", new(big.Int).Lsh(big.NewInt(1), 64), new(int64), "protocol: cannot bind int 18446744073709551616 to int64: out of range"},
		{"fraction to int", 2.5, new(int), "protocol: cannot bind float 2.5 to int"},
		{"huge float to int", 1e30, new(int64), "out of range"},
		{"float32 overflow", 1e300, new(float32), "protocol: cannot bind float 1e+300 to float32: out of range"},
		{"none to int", nil, new(int), "protocol: cannot bind None to int"},
		{"none to struct", nil, new(line), "protocol: cannot bind None to protocol.line"},
		{"int to bool", int64(1), new(bool), "cannot bind int 1 to bool"},
		{"list to string", []any{}, new(string), "cannot bind list of length 0 to string"},
		{"binary bytes to string", []byte{0xff}, new(string), "cannot bind bytes of length 1 to string"},
		{"array length", []any{"a"}, new([2]string), "length differs"},
		{"non-string map key", map[string]any{}, new(map[int]int), "keys must be strings"},
		{"element path", []any{int64(1), "x"}, new([]int), `protocol: [1]: cannot bind string "x" to int`},
		{"struct path", map[string]any{"lines": []any{map[string]any{"qty": int64(256)}}, "id": int64(1)}, new(order),
			"protocol: lines[0].qty: cannot bind int 256 to uint8: out of range"},
		{"required", map[string]any{"note": "x"}, new(order), "protocol: id: required but missing"},
		{"map path", map[string]any{"k": int64(1)}, new(map[string]string), "protocol: k: cannot bind int 1 to string"},
		{"bad time", "soon", new(time.Time), `cannot bind string "soon" to time.Time: protocol: invalid ISO 8601 time "soon"`},
		{"bad uuid", "x", new(UUID), "invalid UUID"},
		{"bad decimal", "1.2.3", new(Decimal), "invalid decimal"},
		{"text unmarshaler error", "", new(upperText), "cannot bind string \"\" to protocol.upperText: empty"},
		{"interface not implemented", int64(1), new(error), "cannot bind int 1 to error"},
		{"unsupported kind", int64(1), new(chan int), "cannot bind int 1 to chan int"},
		{"long string shortened", strings.Repeat("y", 100), new(int), `"` + strings.Repeat("y", 40) + `…"`},
		{"not a pointer", int64(1), 0, "destination must be a non-nil pointer, not int"},
		{"nil pointer", int64(1), (*int)(nil), "destination must be a non-nil pointer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Bind(tt.src, tt.dst)
			if err == nil {
				t.Fatalf("Bind(%#v, %T) succeeded, want an error", tt.src, tt.dst)
			}
			var be *BindError
			if !errors.As(err, &be) {
				t.Fatalf("error %v is not a *BindError", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestBindArgs(t *testing.T) {
	var a, b int
	var s string
	if err := BindArgs([]any{int64(2), int64(3), "x"}, &a, &b, &s); err != nil {
		t.Fatal(err)
	}
	if a != 2 || b != 3 || s != "x" {
		t.Errorf("BindArgs bound %d, %d, %q", a, b, s)
	}
	tests := []struct {
		name string
		args []any
		dst  []any
		want string
	}{
		{"missing", []any{int64(1)}, []any{&a, &b}, "protocol: arg 1: missing: got 1 positional arguments, want 2"},
		{"none at all", nil, []any{&a}, "protocol: arg 0: missing"},
		{"extra", []any{int64(1), int64(2)}, []any{&a}, "protocol: arg 1: unexpected: got 2 positional arguments, want 1"},
		{"mismatch", []any{int64(1), "x"}, []any{&a, &b}, `protocol: arg 1: cannot bind string "x" to int`},
		{"nested", []any{[]any{int64(1), []any{"x"}}}, []any{&[]any{}}, ""},
		{"nested path", []any{[]any{[]any{"x"}}}, []any{&[][]int{}}, `protocol: arg 0[0][0]: cannot bind string "x" to int`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := BindArgs(tt.args, tt.dst...)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || err.Error() != tt.want && !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("BindArgs error %v, want %q", err, tt.want)
			}
		})
	}
}

func TestBindKwargs(t *testing.T) {
	var o order
	err := BindKwargs(map[string]any{"id": int64(1), "lines": []any{map[string]any{"sku": int64(5)}}}, &o)
	if want := `protocol: kwargs.lines[0].sku: cannot bind int 5 to string`; err == nil || err.Error() != want {
		t.Errorf("BindKwargs error %v, want %q", err, want)
	}
	var m map[string]any
	if err := BindKwargs(nil, &m); err != nil || m == nil || len(m) != 0 {
		t.Errorf("BindKwargs(nil) = %v, %v; want an empty map", m, err)
	}
	var kw struct {
		Order struct {
			ID int `celery:"id"`
		} `celery:"order"`
	}
	err = BindKwargs(map[string]any{"order": map[string]any{"id": "x"}}, &kw)
	if want := `protocol: kwargs.order.id: cannot bind string "x" to int`; err == nil || err.Error() != want {
		t.Errorf("BindKwargs error %v, want %q", err, want)
	}
}

// TestBindDecoded binds values straight from the decoders, as handlers
// will.
func TestBindDecoded(t *testing.T) {
	body := []byte(`[[2, 3.5, "x", [1, 2], {"__type__": "uuid", "__value__": {"hex": "12345678123456781234567812345678"}}], {"when": "2024-01-02T03:04:05+00:00"}, null]`)
	v, err := Unmarshal(ContentTypeJSON, body, DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	parts := v.([]any)
	var (
		n    int
		f    float64
		s    string
		list []int8
		id   string
	)
	if err := BindArgs(parts[0].([]any), &n, &f, &s, &list, &id); err != nil {
		t.Fatal(err)
	}
	var kw struct {
		When time.Time `celery:"when,required"`
	}
	if err := BindKwargs(parts[1].(map[string]any), &kw); err != nil {
		t.Fatal(err)
	}
	if n != 2 || f != 3.5 || s != "x" || len(list) != 2 || id != "12345678-1234-5678-1234-567812345678" || kw.When.Year() != 2024 {
		t.Errorf("bound %v %v %q %v %q %v", n, f, s, list, id, kw.When)
	}
}
