// Command celeriac is celeriac's command line: a worker for the example
// tasks, and the tools a Celery user reaches for — send (celery call),
// inspect, control and status (against Python and Go workers alike), dlq
// (list and replay dead letters), purge, bench (celeriac against Python
// Celery and a bare consume loop on the same brokers), and dashboard (a web
// UI for workers, tasks, queues and dead letters).
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
	"strings"

	goredis "github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"go.uber.org/zap"
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

// noReplyError is Celery's "No nodes replied within time constraint", in
// Celery's words so that scripts written for `celery inspect` still match.
type noReplyError struct{}

func (noReplyError) Error() string { return "No nodes replied within time constraint" }

var errNoReply error = noReplyError{}

func main() {
	// go-redis logs connection failures through a logger of its own, a
	// process global: only the process (not run, which tests call
	// concurrently) may set it. Its lines go through zap so that
	// --log-format json output stays JSON.
	os.Exit(runWith(context.Background(), os.Args[1:], os.Stdout, os.Stderr, func(log *zap.Logger) {
		goredis.SetLogger(redisLogger{log.Named("go-redis")})
	}))
}

// redisLogger routes go-redis's log lines to zap at debug level: the
// transports log the failures that matter themselves, rate-limited.
type redisLogger struct{ log *zap.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug(fmt.Sprintf(format, v...))
}

// run executes the command line and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, args, stdout, stderr, nil)
}

// runWith is run with a hook that sees the logger once the flags are parsed.
func runWith(ctx context.Context, args []string, stdout, stderr io.Writer, onLogger func(*zap.Logger)) int {
	root := newRoot(stderr, onLogger)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	name := "celeriac"
	if cmd != nil && cmd != root {
		name = cmd.CommandPath()
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	var ue usageError
	switch {
	case errors.As(err, &ue) || isFlagError(err) || isCommandError(err):
		switch {
		case cmd == nil || cmd == root:
			fmt.Fprintf(stderr, "run 'celeriac --help' for the commands\n")
		default:
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

// isCommandError recognises cobra's unknown (sub)command error, which it
// returns as plain text.
func isCommandError(err error) bool {
	return strings.HasPrefix(err.Error(), "unknown command ")
}

func newRoot(stderr io.Writer, onLogger func(*zap.Logger)) *cobra.Command {
	g := &globalFlags{stderr: stderr, onLogger: onLogger}
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
		newStatusCmd(g), newDLQCmd(g), newPurgeCmd(g), newBenchCmd(g), newDashboardCmd(g))
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
