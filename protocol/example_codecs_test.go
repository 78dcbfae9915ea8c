package protocol_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

func ExampleUnmarshal() {
	// The body of tasks.add(2, 3) as Celery publishes it.
	body := []byte(`[[2, 3.0], {"when": {"__type__": "date", "__value__": "2024-01-02"}}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]`)
	v, err := protocol.Unmarshal(protocol.ContentTypeJSON, body, protocol.DecodeOptions{})
	if err != nil {
		panic(err)
	}
	parts := v.([]any)
	args, kwargs := parts[0].([]any), parts[1].(map[string]any)
	fmt.Printf("%T %T %v\n", args[0], args[1], kwargs["when"])

	_, err = protocol.Unmarshal(protocol.ContentTypePickle, []byte{0x80}, protocol.DecodeOptions{})
	fmt.Println(err)
	// Output:
	// int64 float64 2024-01-02
	// protocol: refusing to deserialize "application/x-python-serialize" (pickle is never decoded)
}

func ExampleMarshal() {
	result := map[string]any{
		"total": 5.0, // stays a float for Python
		"ids":   []int{1, 2},
		"at":    time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	data, err := protocol.Marshal(protocol.ContentTypeJSON, result)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(data))

	typed, err := protocol.AppendJSON(nil, protocol.Decimal("1.50"), protocol.JSONOptions{Typed: true})
	if err != nil {
		panic(err)
	}
	fmt.Println(string(typed))
	// Output:
	// {"at": "2024-01-02T03:04:05+00:00", "ids": [1, 2], "total": 5.0}
	// {"__type__": "decimal", "__value__": "1.50"}
}

func ExampleParseTime() {
	eta, err := protocol.ParseTime("2026-11-29T18:49:39.713054+05:30")
	if err != nil {
		panic(err)
	}
	fmt.Println(eta.UTC())
	naive, _ := protocol.ParseTime("2030-01-01T12:00:00") // naive means UTC
	fmt.Println(protocol.FormatTime(naive))
	// Output:
	// 2026-11-29 13:19:39.713054 +0000 UTC
	// 2030-01-01T12:00:00+00:00
}

func ExampleFormatTime() {
	ist := time.FixedZone("IST", 5*3600+1800)
	fmt.Println(protocol.FormatTime(time.Date(2024, 1, 2, 3, 4, 5, 0, ist)))
	fmt.Println(protocol.FormatTime(time.Date(2024, 1, 2, 3, 4, 5, 123456789, time.UTC)))
	// Output:
	// 2024-01-02T03:04:05+05:30
	// 2024-01-02T03:04:05.123456+00:00
}

func ExampleBindArgs() {
	args := []any{int64(2), int64(3), "x"} // decoded positional arguments
	var a, b int
	var label string
	if err := protocol.BindArgs(args, &a, &b, &label); err != nil {
		panic(err)
	}
	fmt.Println(a+b, label)

	var n int
	fmt.Println(protocol.BindArgs([]any{"seven"}, &n))
	fmt.Println(protocol.BindArgs(nil, &n))
	// Output:
	// 5 x
	// protocol: arg 0: cannot bind string "seven" to int
	// protocol: arg 0: missing: got 0 positional arguments, want 1
}

func ExampleBindKwargs() {
	kwargs := map[string]any{"order": map[string]any{"id": int64(42), "lines": []any{"a", "b"}}, "rush": true}
	var kw struct {
		Order struct {
			ID    int64    `celery:"id,required"`
			Lines []string `json:"lines"`
		} `celery:"order"`
		Rush bool `celery:"rush"`
	}
	if err := protocol.BindKwargs(kwargs, &kw); err != nil {
		panic(err)
	}
	fmt.Println(kw.Order.ID, kw.Order.Lines, kw.Rush)
	// Output:
	// 42 [a b] true
}

func ExampleReprArgs() {
	fmt.Println(protocol.ReprArgs([]any{int64(2), int64(3)}))
	fmt.Println(protocol.ReprArgs([]any{"it's", 1.0, nil}))
	fmt.Println(protocol.Repr(map[string]any{"a": []any{1e16, true}}))
	// Output:
	// (2, 3)
	// ('it\'s', 1.0, None)
	// {'a': [1e+16, True]}
}

func ExampleDecompress() {
	body := []byte(`[[2, 3], {}, null]`)
	z, err := protocol.Compress(protocol.CompressionZlib, body)
	if err != nil {
		panic(err)
	}
	out, err := protocol.Decompress(protocol.CompressionZlib, z, 1<<20)
	fmt.Println(string(out), err)
	// Output:
	// [[2, 3], {}, null] <nil>
}

func ExampleToValueStrict() {
	v, err := protocol.ToValueStrict(map[string]any{"n": 3, "ratio": float32(0.1), "tags": []string{"a"}})
	fmt.Println(v, err)

	type point struct{ X, Y int }
	_, err = protocol.ToValueStrict(point{1, 2})
	fmt.Println(errors.Is(err, protocol.ErrUnencodable))
	loose, _ := protocol.ToValue(point{1, 2})
	fmt.Println(loose)
	// Output:
	// map[n:3 ratio:0.1 tags:[a]] <nil>
	// true
	// map[X:1 Y:2]
}

func ExampleReprLimit() {
	// Pairs of one pair, forty times over: 2^40 strings written out,
	// shown in 60 bytes without building the rest.
	var v any = "shared"
	for range 40 {
		v = []any{v, v}
	}
	s, truncated := protocol.ReprLimit(v, 60)
	fmt.Println(s+"…", truncated)
	// Output: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['shared', 'shared'],… true
}

func ExampleAppendJSONLimit() {
	v := map[string]any{"when": time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC), "data": []byte{0xff, 0xfe}}
	b, truncated, err := protocol.AppendJSONLimit(nil, v, protocol.JSONOptions{Typed: true}, 60)
	fmt.Println(string(b), truncated, err)
	// Output: {"data": {"__type__": "base64", "__value__": "//4="}, "when" true <nil>
}
