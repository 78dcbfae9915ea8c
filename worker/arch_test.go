package worker_test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// TestImportGraph enforces the architecture (style.md R1): protocol and
// retry are leaves, transport and backend are contracts, the worker never
// imports an adapter, adapters never import the worker, a Go caller's
// client needs no worker (client and the worker share internal/publish, so
// that a message looks the same whoever sends it), and nothing imports
// cmd or examples (cmd/celeriac runs the example tasks, by design).
func TestImportGraph(t *testing.T) {
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports", "github.com/celeriac/celeriac/...").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	const mod = "github.com/celeriac/celeriac/"
	dec := json.NewDecoder(strings.NewReader(string(out)))
	imports := map[string][]string{}
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		imports[strings.TrimPrefix(p.ImportPath, mod)] = p.Imports
	}
	adapters := []string{"transport/amqp", "transport/redis", "transport/memory", "backend/redis", "backend/memory", "backend/rpc", "backend/sql"}
	isAdapter := func(p string) bool {
		for _, a := range adapters {
			if p == a {
				return true
			}
		}
		return false
	}
	rules := []struct {
		pkg   string
		allow func(dep string) bool // project-internal deps allowed
		third func(dep string) bool // third-party deps allowed
	}{
		{"protocol", func(string) bool { return false }, func(d string) bool { return strings.HasPrefix(d, "github.com/vmihailenco/") }},
		{"retry", func(string) bool { return false }, func(string) bool { return false }},
		{"transport", func(d string) bool { return d == "protocol" }, func(string) bool { return false }},
		{"backend", func(d string) bool { return d == "protocol" }, func(string) bool { return false }},
		{"internal/publish", func(d string) bool { return d == "protocol" || d == "transport" }, nil},
		{"client", func(d string) bool {
			return d == "protocol" || d == "transport" || d == "backend" || d == "internal/publish"
		}, nil},
		{"worker", func(d string) bool {
			return d == "protocol" || d == "retry" || d == "transport" || d == "backend" || d == "internal/publish"
		}, nil},
	}
	for _, r := range rules {
		deps, ok := imports[r.pkg]
		if !ok {
			t.Errorf("package %s not found", r.pkg)
			continue
		}
		for _, d := range deps {
			if strings.HasPrefix(d, mod) {
				if dep := strings.TrimPrefix(d, mod); !r.allow(dep) {
					t.Errorf("%s imports %s", r.pkg, dep)
				}
			} else if strings.Contains(strings.SplitN(d, "/", 2)[0], ".") && r.third != nil && !r.third(d) {
				t.Errorf("%s imports third-party %s", r.pkg, d)
			}
		}
	}
	for pkg, deps := range imports {
		for _, d := range deps {
			dep := strings.TrimPrefix(d, mod)
			if !strings.HasPrefix(d, mod) {
				continue
			}
			if isAdapter(pkg) && (dep == "worker" || strings.HasPrefix(dep, "worker/")) {
				t.Errorf("adapter %s imports %s", pkg, dep)
			}
			if strings.HasPrefix(dep, "cmd/") && !strings.HasPrefix(pkg, "cmd/") {
				t.Errorf("%s imports %s", pkg, dep)
			}
			if strings.HasPrefix(dep, "examples/") && !strings.HasPrefix(pkg, "examples/") && pkg != "cmd/celeriac" {
				t.Errorf("%s imports %s", pkg, dep)
			}
		}
	}
}
