package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// WorkerFlags lets the program add flags of its own to the worker command
// (a database URL, a feature switch). f is called once, while the command
// is built; read the variables it binds in an [OnStart] hook, which runs
// after the command line is parsed.
func WorkerFlags(f func(*pflag.FlagSet)) Option {
	return func(o *options) { o.workerFlags = append(o.workerFlags, f) }
}

// Defaults sets defaults in code for flags of the worker command or the
// global ones, by flag name without dashes: {"queues": "a,b",
// "concurrency": "8", "broker": "amqp://..."}. They show in --help. What
// the command line, the environment and the config file say still wins:
// a default for "broker" or "result-backend" applies only when neither
// the flag, CELERY_BROKER_URL/CELERY_RESULT_BACKEND nor the config file
// names one. A name that is no flag, or a value the flag rejects, is a
// programming error: [New] panics.
func Defaults(flags map[string]string) Option {
	return func(o *options) {
		if o.defaults == nil {
			o.defaults = map[string]string{}
		}
		for k, v := range flags {
			o.defaults[k] = v
		}
	}
}

// OnStart adds a hook that runs when the worker starts, after the command
// line and the config file are read and before it connects to the broker:
// open a database pool there. An error stops the worker before it takes
// any task (exit status 1). Hooks run in the order given.
func OnStart(f func(ctx context.Context) error) Option {
	return func(o *options) { o.onStart = append(o.onStart, f) }
}

// OnStop adds a hook that runs once the worker has stopped: after the
// warm shutdown, when no task is running any more, so that a task never
// sees its database pool closed. It runs when an OnStart hook ran, even if
// the worker then failed; hooks run in reverse order, with a context that
// is not cancelled. Its error is the command's when the worker itself
// stopped cleanly.
func OnStop(f func(ctx context.Context) error) Option {
	return func(o *options) { o.onStop = append(o.onStop, f) }
}

// applyDefaults sets o.defaults on the flags of cmd (the worker) and root
// (global). broker and result-backend are kept aside: they come after the
// environment and the config file.
func applyDefaults(o *options, root, cmd *cobra.Command, g *globalFlags) {
	g.codeDefaults = map[string]bool{}
	for name, v := range o.defaults {
		switch name {
		case "broker":
			g.defaultBroker = v
			continue
		case "result-backend":
			g.defaultBackend = v
			continue
		}
		fl := cmd.Flags().Lookup(name)
		if fl == nil {
			fl = root.PersistentFlags().Lookup(name)
		}
		if fl == nil {
			panic(fmt.Sprintf("cli.Defaults: no flag --%s", name))
		}
		if err := fl.Value.Set(v); err != nil {
			panic(fmt.Sprintf("cli.Defaults: --%s %q: %v", name, v, err))
		}
		fl.DefValue = v
		// A default set in code is still a default: the config file's
		// setting wins over it, as over the built-in one (Value.Set does
		// not mark the flag Changed). The worker treats it as given where
		// no setting competes (codeDefaults).
		g.codeDefaults[name] = true
	}
}
