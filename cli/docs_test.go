package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/celeriac/celeriac/worker"
)

// docs/configuration.md is checked against the command tree itself, so
// that it cannot document a flag that does not exist or a default that
// changed: it carries a reference of the flags and settings generated
// from the tree, and every flag it names must exist. (Every `celeriac ...`
// command line of the docs is parsed by cmd/celeriac's TestDocCommandLines,
// on the tree with bench.)

var updateDocs = flag.Bool("update", false, "rewrite the generated part of docs/configuration.md")

const (
	configDoc    = "../docs/configuration.md"
	genBegin     = "<!-- BEGIN GENERATED: go test ./cli -run TestConfigurationDoc -update -->"
	genEnd       = "<!-- END GENERATED -->"
	regenerateAs = "go test ./cli -run TestConfigurationDoc -update"
)

// docRoot is the command tree the docs describe.
func docRoot() *cobra.Command {
	root, _ := newRoot(worker.NewMux(), newOptions([]Option{Output(io.Discard, io.Discard)}))
	return root
}

// TestConfigurationDoc compares the generated reference in
// docs/configuration.md with what the command tree and the config file's
// settings are now.
func TestConfigurationDoc(t *testing.T) {
	doc, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok1 := strings.Cut(string(doc), genBegin)
	_, after, ok2 := strings.Cut(rest, genEnd)
	if !ok1 || !ok2 {
		t.Fatalf("%s lacks the markers %q and %q", configDoc, genBegin, genEnd)
	}
	want := genBegin + "\n" + configReference(docRoot(), settingNames()) + genEnd
	if got := genBegin + rest[:len(rest)-len(after)]; got != want {
		if *updateDocs {
			if err := os.WriteFile(configDoc, []byte(before+want+after), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("%s: the generated flag and settings reference is out of date; run\n\t%s\nand review the diff", configDoc, regenerateAs)
	}
}

// settingNames are the Celery settings --config reads.
func settingNames() []string {
	names := slices.Collect(func(yield func(string) bool) {
		for n := range knownSettings() {
			if !yield(n) {
				return
			}
		}
	})
	sort.Strings(names)
	return names
}

var (
	envName     = regexp.MustCompile(`\$([A-Z][A-Z0-9_]+)`)
	settingWord = regexp.MustCompile(`\b[a-z]+(?:_[a-z]+)+\b`)
)

// celerySettings are the names a flag's usage may cite: the settings of
// the --config file and the broker transport options.
func celerySettings() map[string]bool {
	known := knownSettings()
	t := reflect.TypeFor[transportOpts]()
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" {
			known[name] = true
		}
	}
	return known
}

// configReference renders the flags every command takes, the worker's,
// and the settings of the --config file.
func configReference(root *cobra.Command, settings []string) string {
	var b strings.Builder
	b.WriteString("\n### Flags of every command\n\n")
	flagTable(&b, root.PersistentFlags())
	for _, c := range root.Commands() {
		if c.Name() != "worker" {
			continue
		}
		fmt.Fprintf(&b, "\n### `celeriac %s`\n\n", c.Name())
		flagTable(&b, c.LocalNonPersistentFlags())
	}
	b.WriteString("\n### Settings of the `--config` file\n\n")
	b.WriteString("A JSON object with these keys (Celery's names, lower case); any other key is named in a warning at start-up:\n\n")
	for i, s := range settings {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "`%s`", s)
	}
	b.WriteString(".\n\n")
	return b.String()
}

func flagTable(b *strings.Builder, fs *pflag.FlagSet) {
	settings := celerySettings()
	b.WriteString("| flag | default | Celery setting | environment | meaning |\n|---|---|---|---|---|\n")
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		name := "`--" + f.Name + "`"
		if f.Shorthand != "" {
			name = "`-" + f.Shorthand + "`, " + name
		}
		def := ""
		if f.DefValue != "" && f.DefValue != "[]" && !(f.Value.Type() == "bool" && f.DefValue == "false") {
			def = "`" + f.DefValue + "`"
		}
		var env []string
		for _, m := range envName.FindAllStringSubmatch(f.Usage, -1) {
			env = append(env, "`"+m[1]+"`")
		}
		var set []string
		for _, w := range settingWord.FindAllString(f.Usage, -1) {
			if settings[w] && !slices.Contains(set, "`"+w+"`") {
				set = append(set, "`"+w+"`")
			}
		}
		usage := strings.ReplaceAll(f.Usage, "|", `\|`)
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", name, def, strings.Join(set, ", "), strings.Join(env, ", "), usage)
	})
}

var flagSpan = regexp.MustCompile(`^(--[a-z][a-z0-9-]*|-[a-zA-Z])(?:[ =]|$)`)

// TestConfigurationDocFlags: every flag docs/configuration.md names in
// inline code (its tables name flags without a command) is a flag of
// some celeriac command.
func TestConfigurationDocFlags(t *testing.T) {
	text, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		allFlags(c).VisitAll(func(f *pflag.Flag) {
			known["--"+f.Name] = true
			if f.Shorthand != "" {
				known["-"+f.Shorthand] = true
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(docRoot())
	checked := 0
	for n, line := range strings.Split(string(text), "\n") {
		for _, m := range inlineCode.FindAllStringSubmatch(line, -1) {
			f := flagSpan.FindStringSubmatch(m[1])
			if f == nil {
				continue
			}
			checked++
			if !known[f[1]] {
				t.Errorf("%s:%d: %s is no flag of any celeriac command", configDoc, n+1, f[1])
			}
		}
	}
	if checked == 0 {
		t.Fatal("no flags found in the page: is the pattern broken?")
	}
}

var inlineCode = regexp.MustCompile("`([^`\n]+)`")

// allFlags is cmd's flags and those it inherits.
func allFlags(cmd *cobra.Command) *pflag.FlagSet {
	fs := pflag.NewFlagSet(cmd.Name(), pflag.ContinueOnError)
	fs.AddFlagSet(cmd.LocalFlags())
	for c := cmd; c != nil; c = c.Parent() {
		fs.AddFlagSet(c.PersistentFlags())
	}
	return fs
}
