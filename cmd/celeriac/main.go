// Command celeriac is celeriac's command line: a worker for the example
// tasks, and the tools a Celery user reaches for — send (celery call),
// inspect and control (against Python and Go workers alike), dlq (list and
// replay dead letters) and purge.
//
// Configuration comes from flags, then the environment (CELERY_BROKER_URL,
// CELERY_RESULT_BACKEND), then a JSON file of Celery settings (--config).
//
// Exit codes: 0 success, 1 the command failed, 2 bad flags or arguments,
// 3 no worker replied (inspect, control).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK      = 0
	exitError   = 1
	exitUsage   = 2
	exitNoReply = 3
)

// usageError marks errors caused by the command line itself.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

var errNoReply = errors.New("no nodes replied within time constraint")

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	name := "celeriac"
	if cmd != nil && cmd != root {
		name += " " + cmd.Name()
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	var ue usageError
	switch {
	case errors.As(err, &ue) || isFlagError(err):
		if cmd != nil {
			fmt.Fprintf(stderr, "usage: %s\nrun '%s --help' for details\n", cmd.UseLine(), cmd.CommandPath())
		}
		return exitUsage
	case errors.Is(err, errNoReply):
		return exitNoReply
	}
	return exitError
}

// flagError wraps cobra's flag and argument errors.
type flagError struct{ error }

func isFlagError(err error) bool {
	var fe flagError
	return errors.As(err, &fe)
}

func newRoot() *cobra.Command {
	g := &globalFlags{}
	root := &cobra.Command{
		Use:   "celeriac",
		Short: "A Celery-protocol-compatible task worker in Go",
		Long: `celeriac runs Go handlers for Celery tasks on the same RabbitMQ or Redis
queues as Python Celery, and speaks Celery's remote control and events.

Broker and result backend come from --broker/--result-backend, the
CELERY_BROKER_URL/CELERY_RESULT_BACKEND environment variables, or a JSON
file of Celery settings (--config), in that order.`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error { return g.load() },
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return flagError{err} })
	root.CompletionOptions.DisableDefaultCmd = true
	g.register(root)
	root.AddCommand(newWorkerCmd(g), newSendCmd(g), newInspectCmd(g), newControlCmd(g),
		newDLQCmd(g), newPurgeCmd(g))
	return root
}

// args checks positional arguments, reporting problems as usage errors.
func args(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if err := v(cmd, a); err != nil {
			return usageError{err}
		}
		return nil
	}
}
