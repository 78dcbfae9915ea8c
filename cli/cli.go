// Package cli turns a [worker.Mux] into a complete command line: the
// worker (every flag, the JSON config file, Prometheus metrics, health
// endpoints and tracing), beat (periodic tasks), and the tools a Celery
// user reaches for — send, inspect, control, status, purge, dlq and
// dashboard — with the tasks of the Mux registered. The celeriac command is this package around the
// example tasks; a team's own binary is a few lines:
//
//	func main() {
//		mux := worker.NewMux()
//		mux.HandleFunc("proj.tasks.resize", resize)
//		cli.Main(mux)
//	}
//
// Configuration comes from flags, then the environment (CELERY_BROKER_URL,
// CELERY_RESULT_BACKEND), then a JSON file of Celery settings (--config).
//
// Exit codes: 0 success, 1 the command failed, 2 bad flags or arguments,
// 3 no worker replied (inspect, control).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	goredis "github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// Exit codes.
const (
	exitOK      = 0
	exitError   = 1
	exitUsage   = 2
	exitNoReply = 3
)

// UsageError marks an error caused by the command line itself: the
// command exits with status 2 and points at --help. Commands added with
// [Commands] return it for their own usage mistakes.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

func usagef(format string, args ...any) error { return UsageError{fmt.Errorf(format, args...)} }

// noReplyError is Celery's "No nodes replied within time constraint", in
// Celery's words so that scripts written for `celery inspect` still match.
type noReplyError struct{}

func (noReplyError) Error() string { return "No nodes replied within time constraint" }

var errNoReply error = noReplyError{}

// Option configures the command line built by [New], [Run] and [Main].
type Option func(*options)

type options struct {
	name           string
	commands       []*cobra.Command
	stdout, stderr io.Writer
	onLogger       func(*zap.Logger) // nil, or told about the logger (Main)

	workerFlags     []func(*pflag.FlagSet)
	defaults        map[string]string
	onStart, onStop []func(context.Context) error

	// dryRun, for tests, receives the worker's resolved configuration
	// instead of a worker being run.
	dryRun func(worker.Config, connect.Options)
}

// Name sets the command's name, shown in help and errors (default: the
// program's file name in [Main], "celeriac" otherwise).
func Name(name string) Option { return func(o *options) { o.name = name } }

// Commands adds commands of the program's own next to the built-in ones.
// They see the global flags (--broker, --config, --loglevel, ...) and may
// return [UsageError] for mistakes on their command line.
func Commands(cmds ...*cobra.Command) Option {
	return func(o *options) { o.commands = append(o.commands, cmds...) }
}

// Output sets where commands write their output and logs (default
// os.Stdout and os.Stderr).
func Output(stdout, stderr io.Writer) Option {
	return func(o *options) { o.stdout, o.stderr = stdout, stderr }
}

func newOptions(opts []Option) *options {
	o := &options{name: "celeriac", stdout: os.Stdout, stderr: os.Stderr}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

// Main runs the command line of the process (os.Args) with the tasks of
// mux and exits with its status. Call it from main, after registering
// every task.
func Main(mux *worker.Mux, opts ...Option) {
	// go-redis logs connection failures through a logger of its own, a
	// process global: only the process (not Run, which tests call
	// concurrently) may set it. Its lines go through zap so that
	// --log-format json output stays JSON.
	onLogger := func(o *options) {
		o.onLogger = func(log *zap.Logger) { goredis.SetLogger(redisLogger{log.Named("go-redis")}) }
	}
	name := Name(filepath.Base(os.Args[0]))
	os.Exit(Run(context.Background(), mux, os.Args[1:], append([]Option{name, onLogger}, opts...)...))
}

// redisLogger routes go-redis's log lines to zap at debug level: the
// transports log the failures that matter themselves, rate-limited.
type redisLogger struct{ log *zap.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug(fmt.Sprintf(format, v...))
}

// Run executes the command line args (without the program name) with the
// tasks of mux and returns the exit status: 0 success, 1 the command
// failed, 2 bad flags or arguments, 3 no worker replied.
func Run(ctx context.Context, mux *worker.Mux, args []string, opts ...Option) int {
	o := newOptions(opts)
	root, g := newRoot(mux, o)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	for _, c := range g.closers {
		c()
	}
	if err == nil {
		return exitOK
	}
	var code exitCode
	if errors.As(err, &code) {
		// The command printed what went wrong (multi).
		return int(code)
	}
	name := root.Name()
	if cmd != nil && cmd != root {
		name = cmd.CommandPath()
	}
	fmt.Fprintf(o.stderr, "%s: %v\n", name, err)
	var ue UsageError
	switch {
	case errors.As(err, &ue) || isFlagError(err) || isCommandError(err):
		switch {
		case cmd == nil || cmd == root:
			fmt.Fprintf(o.stderr, "run '%s --help' for the commands\n", root.Name())
		default:
			fmt.Fprintf(o.stderr, "usage: %s\nrun '%s --help' for details\n", cmd.UseLine(), cmd.CommandPath())
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

// New returns the root command with the tasks of mux, for callers that
// run cobra themselves. [Run] adds the exit statuses and error messages.
func New(mux *worker.Mux, opts ...Option) *cobra.Command {
	root, _ := newRoot(mux, newOptions(opts))
	return root
}

func newRoot(mux *worker.Mux, o *options) (*cobra.Command, *globalFlags) {
	g := &globalFlags{stderr: o.stderr, onLogger: o.onLogger, hooks: o}
	root := &cobra.Command{
		Use:   o.name,
		Short: "A Celery-protocol-compatible task worker in Go",
		Long: o.name + ` runs Go handlers for Celery tasks on the same RabbitMQ or Redis
queues as Python Celery, and speaks Celery's remote control and events.

Broker and result backend come from --broker/--result-backend, the
CELERY_BROKER_URL/CELERY_RESULT_BACKEND environment variables, or a JSON
file of Celery settings (--config), in that order.`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error { return g.load(cmd) },
		Version:           version(),
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return flagError{err} })
	root.CompletionOptions.DisableDefaultCmd = true
	g.register(root)
	root.SetOut(o.stdout)
	root.SetErr(o.stderr)
	root.SetVersionTemplate("{{.Name}} {{.Version}}\n")
	wcmd := newWorkerCmd(g, mux)
	root.AddCommand(wcmd, newSendCmd(g), newInspectCmd(g), newControlCmd(g),
		newStatusCmd(g), newDLQCmd(g), newPurgeCmd(g), newDashboardCmd(g), newBeatCmd(g),
		newResultCmd(g), newReportCmd(g, mux), newVersionCmd(), newEventsCmd(g), newMultiCmd(g), newStagedCmd(g))
	root.AddCommand(o.commands...)
	applyDefaults(o, root, wcmd, g)
	return root, g
}

// args checks positional arguments, reporting problems as usage errors.
func args(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if err := v(cmd, a); err != nil {
			return UsageError{err}
		}
		return nil
	}
}
