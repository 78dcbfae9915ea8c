// Package fuzzwatch bounds a fuzz target's inputs in time and memory: Go's
// fuzzer reports a panic or a failed input, but an input that hangs only
// stalls the worker that runs it, and -fuzztime then ends the run with a
// PASS. Every fuzz target of celeriac guards each input with Watch.
package fuzzwatch

import (
	"cmp"
	"flag"
	"fmt"
	"runtime/metrics"
	"testing"
	"time"
)

const (
	// MaxTime is how long one input may take while fuzzing. Every
	// decoder is linear or bounded, so a legitimate input takes
	// milliseconds; the margin is for a loaded 2-core machine, where a
	// fuzz worker minimising an input shares the cores with others.
	MaxTime = 5 * time.Second
	// MaxTimeSeeds applies when the seeds run as a plain test (go test,
	// -race, a busy machine): it catches a hang, not a slow input, which
	// fuzzing itself catches.
	MaxTimeSeeds = 60 * time.Second
	// MaxAlloc is how much one input may allocate.
	MaxAlloc = 256 << 20
)

// Watch fails the input (the fuzz function's arguments, for the message)
// if it runs longer than MaxTime (fuzzing) or MaxTimeSeeds, or allocates
// more than MaxAlloc; call the function it returns when the input is done.
// The timer panics, since a runaway input never returns to fail the test:
// the fuzzer then records the input that crashed its worker, as it does
// for any panic.
//
//	f.Fuzz(func(t *testing.T, data []byte) {
//		defer fuzzwatch.Watch(t, data)()
//		...
//	})
func Watch(t testing.TB, input ...any) (done func()) {
	t.Helper()
	return WatchWithin(t, Limits{}, input...)
}

// Limits are a target's own bounds, stricter than the defaults; a zero
// field takes the default (MaxTime, MaxTimeSeeds, MaxAlloc).
type Limits struct {
	Time, TimeSeeds time.Duration
	Alloc           uint64
}

// WatchWithin is Watch with a target's own limits.
func WatchWithin(t testing.TB, l Limits, input ...any) (done func()) {
	t.Helper()
	l.Time, l.TimeSeeds = cmp.Or(l.Time, MaxTime), cmp.Or(l.TimeSeeds, MaxTimeSeeds)
	l.Alloc = cmp.Or(l.Alloc, MaxAlloc)
	limit := l.TimeSeeds
	if fl := flag.Lookup("test.fuzz"); fl != nil && fl.Value.String() != "" {
		limit = l.Time
	}
	name := t.Name()
	timer := time.AfterFunc(limit, func() {
		panic(fmt.Sprintf("%s: an input ran over %v: %s", name, limit, describe(input)))
	})
	before := allocated()
	return func() {
		timer.Stop()
		if n := allocated() - before; n > l.Alloc {
			t.Errorf("an input allocated %d MiB, over %d MiB: %s", n>>20, l.Alloc>>20, describe(input))
		}
	}
}

// allocated is the bytes allocated so far. runtime/metrics reads it
// without stopping the world, which runtime.ReadMemStats does: twice per
// input, that would cost the fuzzer a good share of its executions.
func allocated() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// describe quotes the first 64 bytes of each argument, and its length.
func describe(input []any) string {
	var b []byte
	for i, v := range input {
		if i > 0 {
			b = append(b, ", "...)
		}
		switch x := v.(type) {
		case []byte:
			b = fmt.Appendf(b, "%d bytes %.64q", len(x), x)
		case string:
			b = fmt.Appendf(b, "%d bytes %.64q", len(x), x)
		default:
			s := fmt.Sprint(x)
			if len(s) > 64 {
				s = s[:64] + "..."
			}
			b = append(b, s...)
		}
	}
	return string(b)
}
