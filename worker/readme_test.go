package worker_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeExample marks a README Go snippet copied from Example functions:
// <!-- example: worker/example_test.go Example; client/example_test.go ExampleChain -->
var readmeExample = regexp.MustCompile("(?m)^<!-- example: (.+) -->\n```go\n((?s:.*?))\n```")

// TestREADMESnippets keeps the README's marked Go snippets in step with the
// Example functions they were copied from, which go test compiles (and
// runs): every line of a snippet must appear, in order, in the bodies of
// the examples its marker names. A snippet may leave lines out, not change
// them.
func TestREADMESnippets(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	marks := readmeExample.FindAllStringSubmatch(string(readme), -1)
	if len(marks) == 0 {
		t.Fatal("README has no <!-- example: ... --> snippets")
	}
	for _, m := range marks {
		var body []string
		for _, ref := range strings.Split(m[1], ";") {
			file, name, ok := strings.Cut(strings.TrimSpace(ref), " ")
			if !ok {
				t.Fatalf("marker %q: want <file> <ExampleName>", ref)
			}
			lines, err := exampleBody(filepath.Join("..", file), name)
			if err != nil {
				t.Fatalf("marker %q: %v", m[1], err)
			}
			body = append(body, lines...)
		}
		i := 0
		for _, want := range strings.Split(m[2], "\n") {
			if strings.TrimSpace(want) == "" {
				continue
			}
			for i < len(body) && body[i] != want {
				i++
			}
			if i == len(body) {
				t.Errorf("README snippet of %s: line %q is not in the example (in this order); copy the example again", m[1], want)
				break
			}
			i++
		}
	}
}

// exampleBody returns the lines of func name in file, one tab of
// indentation removed.
func exampleBody(file, name string) ([]string, error) {
	src, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	_, rest, ok := strings.Cut(string(src), "\nfunc "+name+"() {\n")
	if !ok {
		return nil, os.ErrNotExist
	}
	rest, _, _ = strings.Cut(rest, "\n}\n")
	lines := strings.Split(rest, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	return lines, nil
}
