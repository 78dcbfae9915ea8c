package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadBasicAuth(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		want          map[string]string
		err           string
	}{
		{"ok", "# ops\nalice:s3cret\n\nbob:pa:ss\n", map[string]string{"alice": "s3cret", "bob": "pa:ss"}, ""},
		{"no colon", "alice\n", nil, "line 1: want user:password"},
		{"empty password", "alice:\n", nil, "line 1"},
		{"empty", "# nobody\n", nil, "no user:password line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := readBasicAuth(p)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("%v %v", got, err)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestDashboardUsage(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	for _, a := range [][]string{
		{"dashboard", "extra"},
		{"dashboard", "--max-tasks", "0"},
		{"dashboard", "--basic-auth-file", missing},
		{"dashboard"}, // no broker
	} {
		_, errs, code := cli(t, append([]string{"-b", ""}, a...)...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d\n%s", a, code, exitUsage, errs)
		}
	}
}
