package memory

import (
	"errors"
	"math"
	"math/big"
	"strings"
	"testing"

	"github.com/celeriac/celeriac/protocol"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

func TestTopicMatch(t *testing.T) {
	tests := []struct {
		pattern, key string
		want         bool
	}{
		{"a.b.c", "a.b.c", true},
		{"a.b.c", "a.b", false},
		{"a.b", "a.b.c", false},
		{"*", "a", true},
		{"*", "a.b", false},
		{"*.online", "worker.online", true},
		{"*.online", "x.worker.online", false},
		{"a.*.c", "a.b.c", true},
		{"a.*.c", "a.c", false},
		{"a.*.c", "a.b.b.c", false},
		{"#", "", true},
		{"#", "a", true},
		{"#", "a.b.c", true},
		{"a.#", "a", true},
		{"a.#", "a.b.c", true},
		{"a.#", "ab", false},
		{"worker.#", "workers.x", false},
		{"#.c", "c", true},
		{"#.c", "a.b.c", true},
		{"#.c", "a.b.cd", false},
		{"a.#.c", "a.c", true},
		{"a.#.c", "a.x.y.c", true},
		{"a.#.c", "a.x.y", false},
		{"#.#", "a.b", true},
		{"#.*", "", true}, // "" is one empty word
		{"*.#.*", "a", false},
		{"*.#.*", "a.b", true},
		{"", "", true},
		{"", "a", false},
		{"a..b", "a..b", true},
	}
	for _, tt := range tests {
		if got := topicMatch(tt.pattern, tt.key); got != tt.want {
			t.Errorf("topicMatch(%q, %q) = %v, want %v", tt.pattern, tt.key, got, tt.want)
		}
	}
}

// naiveTopicMatch is the obvious exponential recursion over words, the
// oracle for FuzzTopicMatch.
func naiveTopicMatch(p, k []string) bool {
	if len(p) == 0 {
		return len(k) == 0
	}
	switch p[0] {
	case "#":
		for i := 0; i <= len(k); i++ {
			if naiveTopicMatch(p[1:], k[i:]) {
				return true
			}
		}
		return false
	case "*":
		return len(k) > 0 && naiveTopicMatch(p[1:], k[1:])
	}
	return len(k) > 0 && k[0] == p[0] && naiveTopicMatch(p[1:], k[1:])
}

func FuzzTopicMatch(f *testing.F) {
	for _, s := range [][2]string{
		{"worker.#", "worker.online"}, {"*.online", "worker.online"}, {"a.#.c", "a.x.y.c"},
		{"#.#.#", "a.b"}, {"*.*", "a"}, {"", ""}, {"a..#", "a.."},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, key string) {
		defer fuzzwatch.Watch(t, pattern, key)()
		p, k := strings.Split(pattern, "."), strings.Split(key, ".")
		// The oracle is exponential in the number of "#": keep it small.
		if len(p) > 12 || len(k) > 12 {
			t.Skip()
		}
		if got, want := topicMatch(pattern, key), naiveTopicMatch(p, k); got != want {
			t.Errorf("topicMatch(%q, %q) = %v, oracle says %v", pattern, key, got, want)
		}
	})
}

// TestImportValues: header values become what the Redis and AMQP adapters
// deliver for them.
func TestImportValues(t *testing.T) {
	huge := new(big.Int).SetUint64(math.MaxUint64)
	tests := []struct {
		name string
		give any
		want any
	}{
		{"int", 7, int64(7)},
		{"int8", int8(-8), int64(-8)},
		{"int32", int32(-32), int64(-32)},
		{"uint16", uint16(16), int64(16)},
		{"uint64 small", uint64(64), int64(64)},
		{"uint64 huge", uint64(math.MaxUint64), huge},
		{"float32", float32(1.5), float64(1.5)},
		{"float32 shortest digits", float32(0.1), 0.1},
		{"float32 nested", []any{map[string]any{"f": float32(0.1)}}, []any{map[string]any{"f": 0.1}}},
		{"pointer", func() *int { i := 3; return &i }(), int64(3)},
		{"nil pointer", (*int)(nil), nil},
		{"big in range", big.NewInt(5), int64(5)},
		{"big out of range", huge, huge},
		{"nil big", (*big.Int)(nil), nil},
		{"strings", []string{"a", "b"}, []any{"a", "b"}},
		{"ints", []int{1, 2}, []any{int64(1), int64(2)}},
		{"array", [2]bool{true, false}, []any{true, false}},
		{"string map", map[string]string{"k": "v"}, map[string]any{"k": "v"}},
		{"nested", map[string]any{"l": []any{map[string]int{"n": 1}}}, map[string]any{"l": []any{map[string]any{"n": int64(1)}}}},
		{"nil slice", []string(nil), nil},
		{"named string", protocol.State("SUCCESS"), "SUCCESS"},
		{"decimal stays", protocol.Decimal("1.50"), protocol.Decimal("1.50")},
		{"bytes", []byte{0, 1}, []byte{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := importMessage(&protocol.Message{Headers: map[string]any{"h": tt.give, "ok": int64(1)}})
			if err != nil {
				t.Fatalf("importMessage(header %#v): %v", tt.give, err)
			}
			if got := s.msg.Headers["h"]; !valueEqual(got, tt.want) {
				t.Errorf("header %#v imported as %#v (%T), want %#v (%T)", tt.give, got, got, tt.want, tt.want)
			}
		})
	}
}

func valueEqual(a, b any) bool {
	if x, ok := a.(*big.Int); ok {
		y, ok := b.(*big.Int)
		return ok && x.Cmp(y) == 0
	}
	switch x := a.(type) {
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
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
		if !ok || len(x) != len(y) {
			return false
		}
		for k := range x {
			if !valueEqual(x[k], y[k]) {
				return false
			}
		}
		return true
	case []byte:
		y, ok := b.([]byte)
		return ok && string(x) == string(y)
	}
	return a == b
}

func TestImportRejects(t *testing.T) {
	cyclic := map[string]any{}
	cyclic["self"] = cyclic
	cyclicSlice := []any{nil}
	cyclicSlice[0] = cyclicSlice
	tests := []struct {
		name string
		give any
	}{
		{"struct", struct{ A int }{1}},
		{"chan", make(chan int)},
		{"func", func() {}},
		{"pointer to struct", &struct{ A int }{1}},
		{"int-keyed map", map[int]string{1: "a"}},
		{"cyclic map", cyclic},
		{"cyclic slice", cyclicSlice},
		{"NaN", math.NaN()},
		{"float32 +Inf", float32(math.Inf(1))},
		{"NaN in a list", []any{1.5, math.NaN()}},
		{"-Inf in a typed map", map[string]float64{"f": math.Inf(-1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := importMessage(&protocol.Message{Headers: map[string]any{"h": tt.give, "ok": int64(1)}})
			if err == nil {
				t.Fatalf("importMessage accepted a %T header", tt.give)
			}
			if !errors.Is(err, protocol.ErrUnencodable) && !errors.Is(err, protocol.ErrTooDeep) {
				t.Errorf("error %v wraps neither protocol.ErrUnencodable nor protocol.ErrTooDeep", err)
			}
			if !strings.Contains(err.Error(), `header "h"`) {
				t.Errorf("error %q does not name the header", err)
			}
		})
	}
	_, err := importMessage(&protocol.Message{Properties: protocol.Properties{Extra: map[string]any{"p": struct{}{}}}})
	if err == nil || !strings.Contains(err.Error(), `property "p"`) {
		t.Errorf("bad extra property: %v", err)
	}
	if errors.Unwrap(err) == nil {
		t.Errorf("error %v wraps nothing", err)
	}
}

func TestReadyQueueOrder(t *testing.T) {
	var r readyQueue
	push := func(p int, id string, front bool) {
		e := &entry{priority: p, routingKey: id}
		if front {
			r.pushFront(e)
		} else {
			r.pushBack(e)
		}
	}
	// Enough to make a level's ring buffer wrap and grow.
	for i := range 40 {
		push(i%3, string(rune('A'+i%26))+string(rune('0'+i/26)), false)
	}
	push(1, "front", true)
	if r.len() != 41 {
		t.Fatalf("len = %d", r.len())
	}
	var got []string
	last := math.MaxInt
	for e := r.pop(); e != nil; e = r.pop() {
		if e.priority > last {
			t.Fatalf("priority %d after %d", e.priority, last)
		}
		last = e.priority
		got = append(got, e.routingKey)
	}
	if len(got) != 41 || got[0] != "C0" || got[13] != "front" {
		t.Errorf("order: %v", got)
	}
	if r.len() != 0 || r.clear() != 0 {
		t.Error("not empty after popping everything")
	}
}
