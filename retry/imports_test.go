package retry_test

import (
	"go/build"
	"strings"
	"testing"
)

// TestImportsStdlibOnly keeps retry a leaf (style R1): its non-test files
// may import only the standard library, whose paths have no dot in their
// first element.
func TestImportsStdlibOnly(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkg.Imports) == 0 {
		t.Fatal("found no imports; is the test running in the package directory?")
	}
	for _, imp := range pkg.Imports {
		if first, _, _ := strings.Cut(imp, "/"); strings.Contains(first, ".") {
			t.Errorf("retry imports %q; it must stay stdlib-only", imp)
		}
	}
}
