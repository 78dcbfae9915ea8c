// Command celeriac is celeriac's command line around the example tasks of
// examples/demotasks: a worker, and the tools a Celery user reaches for —
// send (celery call), inspect, control and status (against Python and Go
// workers alike), dlq (list and replay dead letters), purge, and dashboard
// (a web UI for workers, tasks, queues and dead letters) — all from package
// cli, which a program with its own tasks uses the same way. bench
// (celeriac against Python Celery and a bare consume loop on the same
// brokers) is this command's own.
//
// Exit codes: 0 success, 1 the command failed, 2 bad flags or arguments,
// 3 no worker replied (inspect, control).
package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/celeriac/celeriac/cli"
	"github.com/celeriac/celeriac/examples/demotasks"
	"github.com/celeriac/celeriac/worker"
)

func main() {
	mux := worker.NewMux()
	demotasks.Register(mux)
	cli.Main(mux, cli.Name("celeriac"), cli.Commands(newBenchCmd()))
}

func usagef(format string, a ...any) error { return cli.UsageError{Err: fmt.Errorf(format, a...)} }

// args checks positional arguments, reporting problems as usage errors.
func args(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if err := v(cmd, a); err != nil {
			return cli.UsageError{Err: err}
		}
		return nil
	}
}
