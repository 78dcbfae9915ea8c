package worker

import (
	"strings"
	"testing"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// TestMatchNodeGlob checks the glob matcher against Python's
// fnmatch.fnmatch (expected values computed with CPython 3).
func TestMatchNodeGlob(t *testing.T) {
	for _, tc := range []struct {
		name, pattern string
		want          bool
	}{
		{"celery@web1", "celery@web*", true},
		{"celery@web1", "*@web?", true},
		{"celery@web1", "celery@web[0-9]", true},
		{"celery@web1", "celery@web[!1]", false},
		{"celery@web1", "celery@web[!2]", true},
		{"a/b", "a*b", true},
		{"a[b", "a[b", true},
		{"a[", "a[", true},
		{"a]", "a]", true},
		{"x", "[]x]", true},
		{"]", "[]]", true},
		{"!", "[!]", false},
		{"a", "[!]", false},
		{"^", "[^]", true},
		{"a", "[^]", false},
		{"a\\b", "a\\b", true},
		{"a\\b", "a[\\]b", true},
		{"ab", "a.b", false},
		{"a.b", "a.b", true},
		{"A", "a", false},
		{"a+b", "a+b", true},
		{"é@h", "?@h", true},
		{"a\nb", "a*b", true},
		{"", "", true},
		{"x", "", false},
		{"abc", "a[b-c]c", true},
		{"a-c", "a[a-]c", true},
		{"celery@web1", "celery@web1x", false},
	} {
		if got := matchNode(tc.name, tc.pattern, "glob"); got != tc.want {
			t.Errorf("glob %q against %q = %v, want %v (regexp %s)", tc.pattern, tc.name, got, tc.want, globRegexp(tc.pattern))
		}
	}
}

// FuzzMatchNode: patterns come off the wire. No input may panic, and a
// pattern without glob syntax matches exactly the name it spells.
func FuzzMatchNode(f *testing.F) {
	for _, s := range []string{"celery@web*", "w[!1]@h", "[", "[!]", "a\\b", "(", "é?", "\xff*"} {
		f.Add("celery@web1", s)
	}
	f.Fuzz(func(t *testing.T, name, pattern string) {
		defer fuzzwatch.Watch(t, name, pattern)()
		matchNode(name, pattern, "glob")
		matchNode(name, pattern, "pcre")
		if len(name) <= maxNodePattern && !strings.ContainsAny(name, "*?[") && !matchNode(name, name, "glob") {
			t.Fatalf("literal glob %q does not match itself (regexp %s)", name, globRegexp(name))
		}
	})
}

// TestControlForMe: destination, pattern and matcher select nodes as
// kombu's Node.handle_message does: a pattern counts only with a matcher,
// "glob" is fnmatch, "pcre" is re.match (anchored at the start).
func TestControlForMe(t *testing.T) {
	for _, tc := range []struct {
		sel  map[string]any
		want bool
	}{
		{map[string]any{}, true},
		{map[string]any{"destination": []any{}}, true},
		{map[string]any{"destination": nil}, true},
		{map[string]any{"destination": []any{"w1@test"}}, true},
		{map[string]any{"destination": []any{"w2@test", "w1@test"}}, true},
		{map[string]any{"destination": []any{"w2@test"}}, false},
		{map[string]any{"destination": []any{int64(1), "w1@test"}}, true},
		{map[string]any{"destination": []any{"w2@test"}, "pattern": "w1*", "matcher": "glob"}, false},
		{map[string]any{"pattern": "w1@*", "matcher": "glob"}, true},
		{map[string]any{"pattern": "W1@*", "matcher": "glob"}, false},
		{map[string]any{"pattern": "w[0-9]@test", "matcher": "glob"}, true},
		{map[string]any{"pattern": "w[!1]@test", "matcher": "glob"}, false},
		{map[string]any{"pattern": "w[!2]@test", "matcher": "glob"}, true},
		{map[string]any{"pattern": "w?@t*", "matcher": "glob"}, true},
		{map[string]any{"pattern": "test", "matcher": "glob"}, false},
		{map[string]any{"pattern": "w1@*", "matcher": nil}, true}, // no matcher: no selection
		{map[string]any{"pattern": "nobody", "matcher": nil}, true},
		{map[string]any{"pattern": "w1", "matcher": "pcre"}, true},
		{map[string]any{"pattern": "test", "matcher": "pcre"}, false}, // re.match is anchored
		{map[string]any{"pattern": ".*test$", "matcher": "pcre"}, true},
		{map[string]any{"pattern": "(", "matcher": "pcre"}, false},
		{map[string]any{"pattern": "w1@*", "matcher": "nosuch"}, false},
	} {
		body := map[string]any{"method": "ping", "arguments": map[string]any{}}
		for k, v := range tc.sel {
			body[k] = v
		}
		req, ok := parseControl(body)
		if !ok {
			t.Fatalf("parseControl(%v) refused a ping", body)
		}
		if got := req.forMe("w1@test"); got != tc.want {
			t.Errorf("selection %v: for w1@test = %v, want %v", tc.sel, got, tc.want)
		}
	}
}

// TestMatchNodeLongPattern: a pattern longer than any node name's worth is
// refused before it is compiled.
func TestMatchNodeLongPattern(t *testing.T) {
	long := strings.Repeat("a", maxNodePattern+1)
	if matchNode(long, long, "glob") || matchNode("a", "a|"+long, "pcre") {
		t.Error("a pattern over maxNodePattern matched")
	}
	if !matchNode("a", "a|"+strings.Repeat("b", 100), "pcre") {
		t.Error("a short pattern did not match")
	}
}
