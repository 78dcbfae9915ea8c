package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/celeriac/celeriac/cli"
	"github.com/celeriac/celeriac/examples/demotasks"
	"github.com/celeriac/celeriac/worker"
)

// docRoot is the celeriac command as main builds it, bench included.
func docRoot() *cobra.Command {
	mux := worker.NewMux()
	demotasks.Register(mux)
	return cli.New(mux, cli.Name("celeriac"), cli.Commands(newBenchCmd()), cli.Output(io.Discard, io.Discard))
}

// TestDocCommandLines parses every `celeriac ...` command line of
// README.md and docs/*.md (code blocks and inline code) against the
// command tree: each subcommand and each flag must exist there.
func TestDocCommandLines(t *testing.T) {
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "../../README.md")
	root := docRoot()
	checked := 0
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range commandLines(string(text)) {
			checked++
			if err := checkCommandLine(root, line); err != nil {
				t.Errorf("%s: %q: %v", page, line, err)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d celeriac command lines found in the docs: is the pattern broken?", checked)
	}
}

var (
	inlineCode = regexp.MustCompile("`([^`\n]+)`")
	// proj is the README's name for a binary of the user's own, built
	// with cli.Main: its command lines are celeriac's.
	cmdStart = regexp.MustCompile(`(?:^|[\s(])(?:celeriac|proj|go run \./cmd/celeriac)(\s.*)?$`)
)

// commandLines returns the celeriac command lines of a Markdown text:
// lines of fenced code blocks (with \ continuations joined) and inline
// code spans, from the word celeriac on.
func commandLines(text string) []string {
	var spans []string
	fence := false
	var cont, para string
	prose := func() {
		// Inline code may wrap: a paragraph is read as one line.
		for _, m := range inlineCode.FindAllStringSubmatch(para, -1) {
			spans = append(spans, m[1])
		}
		para = ""
	}
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			prose()
			fence = !fence
			cont = ""
			continue
		}
		if fence {
			if strings.HasSuffix(l, "\\") {
				cont += strings.TrimSuffix(l, "\\") + " "
				continue
			}
			spans = append(spans, cont+l)
			cont = ""
			continue
		}
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "|") {
			prose()
		}
		para += " " + l
	}
	prose()
	var out []string
	for _, s := range spans {
		// A comment ends the command; so does a shell operator.
		s, _, _ = strings.Cut(s, " #")
		idx := cmdStart.FindStringSubmatchIndex(s)
		if idx == nil {
			continue
		}
		line := "celeriac"
		if idx[2] >= 0 {
			line += s[idx[2]:idx[3]]
		}
		out = append(out, line)
	}
	return out
}

// checkCommandLine walks a command line through the tree: words name
// subcommands while there are some, flags must exist on the command
// reached (its own or inherited), and a flag that takes a value skips
// the next word.
func checkCommandLine(root *cobra.Command, line string) error {
	words := strings.Fields(line)[1:]
	cmd := root
	positional := false
	for i := 0; i < len(words); i++ {
		w := words[i]
		if slices.Contains([]string{">", "|", "&", "&&", ";", "<", "2>&1", "...", "…"}, w) || strings.HasPrefix(w, ">") {
			return nil
		}
		if w == "--" {
			return nil
		}
		if strings.HasPrefix(w, "-") && len(w) > 1 {
			name, _, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
			var f *pflag.Flag
			all := allFlags(cmd)
			if strings.HasPrefix(w, "--") {
				f = all.Lookup(name)
			} else {
				// -Q, or -abc as single-letter bool flags, or -c8.
				f = all.ShorthandLookup(name[:1])
				if f != nil && len(name) > 1 && f.NoOptDefVal == "" {
					hasValue = true
				}
			}
			if f == nil && (w == "--help" || w == "-h") {
				continue // cobra adds it when the command runs
			}
			if f == nil {
				return fmt.Errorf("%s has no flag %s", cmd.CommandPath(), w)
			}
			if !hasValue && f.NoOptDefVal == "" {
				i++ // its value
			}
			continue
		}
		if positional {
			continue
		}
		if sub := findSub(cmd, w); sub != nil {
			cmd = sub
			if sub.Name() == "multi" {
				// multi parses its own arguments (Celery's multi): node
				// names, then worker flags, some for a few nodes only
				// (-c:1-3), and multi's own.
				return checkMultiLine(findSub(root, "worker"), words[i+1:])
			}
			continue
		}
		if cmd == root {
			if regexp.MustCompile(`^[a-z_-]+$`).MatchString(w) {
				return fmt.Errorf("celeriac has no command %q", w)
			}
			return nil // prose: "celeriac 0.1.0"
		}
		positional = true
	}
	return nil
}

// multiOwn are the options celery multi takes for itself.
var multiOwn = []string{"nosplash", "quiet", "verbose", "no-color", "range-prefix", "hostname", "prefix", "suffix", "cmd", "append"}

func checkMultiLine(wcmd *cobra.Command, words []string) error {
	if len(words) == 0 {
		return nil
	}
	for i := 1; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, "-") || len(w) < 2 || strings.HasPrefix(w, "$") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
		name, _, _ = strings.Cut(name, ":")
		if slices.Contains(multiOwn, name) {
			continue
		}
		all := allFlags(wcmd)
		var f *pflag.Flag
		if strings.HasPrefix(w, "--") {
			f = all.Lookup(name)
		} else if _, err := fmt.Sscan(name, new(int)); err == nil || strings.ToUpper(name) == name {
			continue // stop's signal: -9, -KILL
		} else {
			f = all.ShorthandLookup(name[:1])
		}
		if f == nil {
			return fmt.Errorf("celeriac worker (through multi) has no flag %s", w)
		}
	}
	return nil
}

func findSub(cmd *cobra.Command, name string) *cobra.Command {
	for _, c := range cmd.Commands() {
		if c.Name() == name || c.HasAlias(name) {
			return c
		}
	}
	return nil
}

// allFlags is cmd's flags and those it inherits.
func allFlags(cmd *cobra.Command) *pflag.FlagSet {
	fs := pflag.NewFlagSet(cmd.Name(), pflag.ContinueOnError)
	fs.AddFlagSet(cmd.LocalFlags())
	for c := cmd; c != nil; c = c.Parent() {
		fs.AddFlagSet(c.PersistentFlags())
	}
	return fs
}

func TestCheckCommandLine(t *testing.T) {
	root := docRoot()
	for _, tc := range []struct {
		line string
		ok   bool
	}{
		{"celeriac worker -Q celery,priority -c 8 -n web1@%h -E --metrics-addr :9808", true},
		{"celeriac -b redis://x dashboard -Q celery", true},
		{"celeriac dlq replay --reset-retries celery", true},
		{"celeriac worker --heartbeat-intervall 5", false},
		{"celeriac inspect stats --jsn", false},
		{"celeriac wroker -Q a", false},
		{"celeriac 0.1.0", true},
		{"celeriac send tasks.add 2 3 --wait > out", true},
	} {
		if err := checkCommandLine(root, tc.line); (err == nil) != tc.ok {
			t.Errorf("%q: %v, want ok=%v", tc.line, err, tc.ok)
		}
	}
	got := commandLines("run `celeriac worker -E` and\n```sh\nCELERY_X=1 celeriac worker \\\n  -Q a # comment\n```\n`celeriac_tasks_total`, `proj.tasks.add` and `proj worker\n-c 8`\n")
	want := []string{"celeriac worker -E", "celeriac worker    -Q a", "celeriac worker -c 8"}
	if !slices.Equal(got, want) {
		t.Errorf("commandLines = %q, want %q", got, want)
	}
}
