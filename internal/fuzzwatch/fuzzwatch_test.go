package fuzzwatch

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps what Errorf was given.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper()      {}
func (r *recorder) Name() string { return "FuzzX" }
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

var sink []byte

func TestWatchFailsAnInputThatAllocatesTooMuch(t *testing.T) {
	r := &recorder{TB: t}
	done := Watch(r, []byte("big"), 7)
	sink = make([]byte, MaxAlloc+1<<20)
	done()
	if len(r.errs) != 1 || !strings.Contains(r.errs[0], `over 256 MiB: 3 bytes "big", 7`) {
		t.Errorf("errors = %q; want one naming the input", r.errs)
	}
	r.errs = nil
	Watch(r, "small")()
	if len(r.errs) != 0 {
		t.Errorf("a small input failed: %q", r.errs)
	}
}

func TestDescribe(t *testing.T) {
	long := strings.Repeat("x", 100)
	got := describe([]any{[]byte("a\x00"), long, 3.5, true})
	want := `2 bytes "a\x00", 100 bytes "` + strings.Repeat("x", 64) + `", 3.5, true`
	if got != want {
		t.Errorf("describe = %s\nwant %s", got, want)
	}
}

func TestWatchWithinOwnLimit(t *testing.T) {
	r := &recorder{TB: t}
	done := WatchWithin(r, Limits{Alloc: 1 << 20}, "x")
	sink = make([]byte, 2<<20)
	done()
	if len(r.errs) != 1 || !strings.Contains(r.errs[0], "over 1 MiB") {
		t.Errorf("errors = %q; want one over the 1 MiB limit", r.errs)
	}
}
