package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/celeriac/celeriac/cli"
	"github.com/celeriac/celeriac/examples/demotasks"
	"github.com/celeriac/celeriac/worker"
)

// TestBenchIsACommand: bench rides on cli.Commands, and its mistakes are
// usage errors (exit 2) like the built-in commands' are.
func TestBenchIsACommand(t *testing.T) {
	mux := worker.NewMux()
	demotasks.Register(mux)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--help"}, 0, "bench"},
		{[]string{"bench", "--redis-dbs", "8,4", "--brokers", "kafka"}, 2, `unknown broker "kafka"`},
		{[]string{"bench", "extra"}, 2, `unknown command "extra"`},
		{[]string{"bench"}, 2, "--redis-dbs: name two empty Redis databases"},
		{[]string{"bench", "--redis-dbs", "8"}, 2, "want BROKER,RESULTS"},
		{[]string{"bench", "--redis-dbs", "4,4"}, 2, "must differ"},
	} {
		var out, errb bytes.Buffer
		code := cli.Run(t.Context(), mux, tc.args, cli.Output(&out, &errb), cli.Commands(newBenchCmd()))
		if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.want) {
			t.Errorf("%v: exit %d, want %d with %q\nstdout:\n%s\nstderr:\n%s", tc.args, code, tc.code, tc.want, &out, &errb)
		}
	}
}
