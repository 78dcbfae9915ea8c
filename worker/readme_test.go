package worker_test

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/worker"
)

// readmeExample marks a README Go snippet copied from Example functions:
// <!-- example: worker/example_test.go Example; client/example_test.go ExampleChain -->
var readmeExample = regexp.MustCompile("(?m)^<!-- example: (.+) -->\n```go\n((?s:.*?))\n```")

// docFiles are the documentation pages whose snippets and links are
// checked: README.md and docs/*.md, relative to the module root.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("no docs/*.md pages")
	}
	return append([]string{"../README.md"}, pages...)
}

// TestREADMESnippets keeps the marked Go snippets of README.md and
// docs/*.md in step with the Example functions they were copied from,
// which go test compiles (and runs): every line of a snippet must appear,
// in order, in the bodies of the examples its marker names. A snippet may
// leave lines out, not change them.
func TestREADMESnippets(t *testing.T) {
	total := 0
	for _, doc := range docFiles(t) {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		marks := readmeExample.FindAllStringSubmatch(string(text), -1)
		total += len(marks)
		for _, m := range marks {
			checkSnippet(t, doc, m[1], m[2])
		}
		// A Go block without a marker (a Config fragment) is not checked:
		// say how many, so that a copied example left unmarked shows.
		if n := strings.Count(string(text), "```go\n"); n != len(marks) {
			t.Logf("%s: %d of %d Go blocks are marked copies of examples", doc, len(marks), n)
		}
	}
	if total == 0 {
		t.Fatal("README.md and docs/*.md have no <!-- example: ... --> snippets")
	}
}

func checkSnippet(t *testing.T, doc, marker, snippet string) {
	t.Helper()
	var body []string
	for _, ref := range strings.Split(marker, ";") {
		file, name, ok := strings.Cut(strings.TrimSpace(ref), " ")
		if !ok {
			t.Errorf("%s: marker %q: want <file> <ExampleName>", doc, ref)
			return
		}
		lines, err := exampleBody(filepath.Join("..", file), name)
		if err != nil {
			t.Errorf("%s: marker %q: %v", doc, marker, err)
			return
		}
		body = append(body, lines...)
	}
	i := 0
	for _, want := range strings.Split(snippet, "\n") {
		if strings.TrimSpace(want) == "" {
			continue
		}
		for i < len(body) && body[i] != want {
			i++
		}
		if i == len(body) {
			t.Errorf("%s: snippet of %s: line %q is not in the example (in this order); copy the example again", doc, marker, want)
			return
		}
		i++
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

var (
	mdLink    = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	mdHeading = regexp.MustCompile(`^#{1,6} +(.+?) *#*$`)
	slugDrop  = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
)

// TestDocLinks checks that every relative link in README.md and docs/*.md
// names a file or directory that exists and, with a #fragment, a heading of
// that page (GitHub's anchors), so that moving a section cannot leave a
// dead link behind.
func TestDocLinks(t *testing.T) {
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(text))
		anchors[path] = a
		return a
	}
	checked := 0
	for _, doc := range docFiles(t) {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range proseLines(string(text)) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				file, frag, _ := strings.Cut(target, "#")
				path := doc
				if file != "" {
					path = filepath.Join(filepath.Dir(doc), file)
					if _, err := os.Stat(path); err != nil {
						t.Errorf("%s:%d: link %q: %v", doc, n+1, target, err)
						continue
					}
				}
				if frag == "" {
					continue
				}
				if !strings.HasSuffix(path, ".md") {
					t.Errorf("%s:%d: link %q: a fragment on a file that is not Markdown", doc, n+1, target)
					continue
				}
				if !anchorsOf(path)[frag] {
					t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", doc, n+1, target, path, frag)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: is the pattern broken?")
	}
}

// proseLines returns the lines of a Markdown text, those inside fenced code
// blocks blanked (a link in code is not a link).
func proseLines(text string) []string {
	lines := strings.Split(text, "\n")
	fence := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fence = !fence
			lines[i] = ""
			continue
		}
		if fence {
			lines[i] = ""
		}
	}
	return lines
}

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown text: lower case, punctuation dropped, spaces to hyphens, and
// -1, -2 ... on repeats.
func headingAnchors(text string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, l := range proseLines(text) {
		m := mdHeading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		slug := strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

func TestHeadingAnchors(t *testing.T) {
	for _, tc := range []struct{ heading, anchor string }{
		{"# Quorum queues and native delayed delivery (Celery 5.5)", "quorum-queues-and-native-delayed-delivery-celery-55"},
		{"## Celery 5.2.6 and 5.5.2", "celery-526-and-552"},
		{"## The `celeriac` command", "the-celeriac-command"},
		{"## Running on a RabbitMQ cluster / with Sentinel", "running-on-a-rabbitmq-cluster--with-sentinel"},
		{"### Queue order: `-Q high,low`", "queue-order--q-highlow"},
		{"## Idempotency (exactly-once effects under at-least-once delivery)", "idempotency-exactly-once-effects-under-at-least-once-delivery"},
	} {
		if a := headingAnchors(tc.heading + "\n"); !a[tc.anchor] {
			t.Errorf("%q: anchors %v, want %q", tc.heading, a, tc.anchor)
		}
	}
	a := headingAnchors("# A\n```\n# not a heading\n```\n## A\n")
	if !a["a"] || !a["a-1"] || a["not-a-heading"] {
		t.Errorf("repeats and code: %v", a)
	}
}

// TestDocStructFields: a docs table whose header names a Go struct
// (`worker.Config`, `retry.Policy`) lists fields of that struct in that
// column, so a renamed or removed field cannot stay documented.
func TestDocStructFields(t *testing.T) {
	structs := map[string]reflect.Type{
		"`worker.Config`": reflect.TypeFor[worker.Config](),
		"`retry.Policy`":  reflect.TypeFor[retry.Policy](),
	}
	ident := regexp.MustCompile("`([A-Z][A-Za-z0-9]*)`")
	checked := 0
	for _, doc := range docFiles(t) {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		col, typ := -1, reflect.Type(nil)
		for n, line := range proseLines(string(text)) {
			if !strings.HasPrefix(line, "|") {
				col = -1
				continue
			}
			cells := strings.Split(strings.Trim(line, "|"), "|")
			if col < 0 {
				for i, c := range cells {
					if st, ok := structs[strings.TrimSpace(c)]; ok {
						col, typ = i, st
					}
				}
				continue
			}
			if col >= len(cells) || strings.HasPrefix(strings.TrimSpace(cells[0]), "---") {
				continue
			}
			for _, m := range ident.FindAllStringSubmatch(cells[col], -1) {
				checked++
				if _, ok := typ.FieldByName(m[1]); !ok {
					t.Errorf("%s:%d: %s has no field %s", doc, n+1, typ, m[1])
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d fields checked: are the tables still there?", checked)
	}
}

// repoPath is inline code that names a file or directory of the
// repository: a path under one of its top-level directories.
var repoPath = regexp.MustCompile("`((?:\\.ci|backend|beat|cli|client|cmd|docs|examples|integration|internal|protocol|retry|transport|worker)/[^`\\s*{}<>]*)`")

// goSymbol is the tail of worker/otelenv.New: a package path and a name,
// not a file.
var goSymbol = regexp.MustCompile(`\.[A-Z]\w*$`)

// TestDocPaths: a repository path named in inline code (`cli/dlq_test.go`,
// `examples/payments`) exists, so that moving code cannot leave the docs
// pointing at where it was.
func TestDocPaths(t *testing.T) {
	checked := 0
	for _, doc := range docFiles(t) {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range proseLines(string(text)) {
			for _, m := range repoPath.FindAllStringSubmatch(line, -1) {
				p := strings.TrimRight(m[1], ".,:;")
				if goSymbol.MatchString(p) {
					continue
				}
				checked++
				if _, err := os.Stat(filepath.Join("..", p)); err != nil {
					t.Errorf("%s:%d: `%s` does not exist", doc, n+1, p)
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d paths checked: is the pattern broken?", checked)
	}
}
