package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
)

// The remote-control commands, as Celery 5.2's Panel declares them (name,
// positional arguments and their types, variadic list argument), so that
// `celeriac inspect X a b` sends what `celery inspect X a b` sends.

type argKind int

const (
	argStr argKind = iota
	argInt
	argFloat
	argBool
)

// remoteArg is one positional argument of a command.
type remoteArg struct {
	name     string
	kind     argKind
	required bool
}

// remoteCmd is one inspect or control command.
type remoteCmd struct {
	name string
	help string
	args []remoteArg
	// variadic names the list argument that takes the remaining words
	// (revoke's task_id); variadicMin is how many it needs.
	variadic    string
	variadicMin int
	// noReply: workers do not answer (shutdown); the command is cast.
	noReply bool
}

func (c remoteCmd) signature() string {
	var parts []string
	for _, a := range c.args {
		if a.required {
			parts = append(parts, "<"+a.name+">")
		} else {
			parts = append(parts, "["+a.name+"]")
		}
	}
	if c.variadic != "" {
		if c.variadicMin > 0 {
			parts = append(parts, "<"+c.variadic+">...")
		} else {
			parts = append(parts, "["+c.variadic+"...]")
		}
	}
	return strings.Join(parts, " ")
}

// arguments converts the words after the command name into the request's
// arguments, as celery.bin.control._compile_arguments does, reporting
// missing, extra and malformed words as usage errors.
func (c remoteCmd) arguments(words []string) (map[string]any, error) {
	out := map[string]any{}
	usage := func(format string, a ...any) error {
		return usagef("%s %s: %s", c.name, c.signature(), fmt.Sprintf(format, a...))
	}
	i := 0
	for ; i < len(words) && i < len(c.args); i++ {
		a := c.args[i]
		v, err := convertArg(a.kind, words[i])
		if err != nil {
			return nil, usage("argument %s: %v", a.name, err)
		}
		out[a.name] = v
	}
	if i < len(c.args) && c.args[i].required {
		return nil, usage("missing %s", c.args[i].name)
	}
	rest := words[i:]
	if c.variadic == "" {
		if len(rest) > 0 {
			return nil, usage("unexpected argument %q", rest[0])
		}
		return out, nil
	}
	if len(rest) < c.variadicMin {
		return nil, usage("missing %s", c.variadic)
	}
	list := make([]any, len(rest))
	for j, w := range rest {
		list[j] = w
	}
	out[c.variadic] = list
	return out, nil
}

func convertArg(k argKind, s string) (any, error) {
	switch k {
	case argInt:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not an integer", s)
		}
		return n, nil
	case argFloat:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%q is not a number", s)
		}
		return f, nil
	case argBool:
		// Python's distutils strtobool, which Celery uses.
		switch strings.ToLower(s) {
		case "y", "yes", "t", "true", "on", "1":
			return true, nil
		case "n", "no", "f", "false", "off", "0":
			return false, nil
		}
		return nil, fmt.Errorf("%q is not a truth value (yes/no, true/false, on/off, 1/0)", s)
	}
	return s, nil
}

var inspectCmds = []remoteCmd{
	{name: "active", help: "tasks running now"},
	{name: "active_queues", help: "queues consumed"},
	{name: "clock", help: "the workers' logical clocks"},
	{name: "conf", help: "configuration (Python workers)", args: []remoteArg{{"with_defaults", argBool, false}}},
	{name: "memdump", help: "memory samples (Python workers)", args: []remoteArg{{"samples", argInt, false}}},
	{name: "memsample", help: "sample memory use (Python workers)"},
	{name: "objgraph", help: "graph of uncollected objects (Python workers)",
		args: []remoteArg{{"type", argStr, false}, {"num", argInt, false}, {"max_depth", argInt, false}}},
	{name: "ping", help: "ping workers"},
	{name: "query_task", help: "state of tasks by id", variadic: "ids", variadicMin: 1},
	{name: "registered", help: "registered tasks", variadic: "taskinfoitems"},
	{name: "report", help: "a short report"},
	{name: "reserved", help: "tasks received and waiting for a slot"},
	{name: "revoked", help: "revoked task ids"},
	{name: "scheduled", help: "countdown/ETA tasks held by workers"},
	{name: "stats", help: "worker statistics"},
}

var controlCmds = []remoteCmd{
	{name: "add_consumer", help: "start consuming a queue",
		args: []remoteArg{{"queue", argStr, true}, {"exchange", argStr, false}, {"exchange_type", argStr, false}, {"routing_key", argStr, false}}},
	{name: "autoscale", help: "change autoscale bounds (Python workers)", args: []remoteArg{{"max", argInt, false}, {"min", argInt, false}}},
	{name: "cancel_consumer", help: "stop consuming a queue", args: []remoteArg{{"queue", argStr, true}}},
	{name: "disable_events", help: "stop sending task events"},
	{name: "enable_events", help: "send task events (for Flower, celery events)"},
	{name: "heartbeat", help: "send a worker-heartbeat event now"},
	{name: "pool_grow", help: "run N more tasks at once", args: []remoteArg{{"n", argInt, false}}},
	{name: "pool_restart", help: "restart the pool (Python workers)"},
	{name: "pool_shrink", help: "run N fewer tasks at once", args: []remoteArg{{"n", argInt, false}}},
	{name: "rate_limit", help: `set a task's rate limit ("10/s", "5/m", "0" disables)`,
		args: []remoteArg{{"task_name", argStr, true}, {"rate_limit", argStr, true}}},
	{name: "revoke", help: "revoke tasks by id (--terminate stops running ones)", variadic: "task_id", variadicMin: 1},
	{name: "shutdown", help: "warm shutdown (workers do not reply)", noReply: true},
	{name: "terminate", help: "terminate running tasks by id", args: []remoteArg{{"signal", argStr, true}},
		variadic: "task_id", variadicMin: 1},
	{name: "time_limit", help: "set a task's time limits in seconds",
		args: []remoteArg{{"task_name", argStr, true}, {"soft", argFloat, true}, {"hard", argFloat, false}}},
}

func commandHelp(cmds []remoteCmd) string {
	var b strings.Builder
	for _, c := range cmds {
		fmt.Fprintf(&b, "  %-44s %s\n", strings.TrimSpace(c.name+" "+c.signature()), c.help)
	}
	return b.String()
}

func findCmd(cmds []remoteCmd, name string) (remoteCmd, error) {
	names := make([]string, len(cmds))
	for i, c := range cmds {
		if c.name == name {
			return c, nil
		}
		names[i] = c.name
	}
	return remoteCmd{}, usagef("unknown command %q (one of %s)", name, strings.Join(names, ", "))
}

// secondsValue is a duration flag that takes Celery's float seconds ("1",
// "0.5") as well as Go durations ("1500ms").
type secondsValue struct{ d *time.Duration }

func (v secondsValue) String() string {
	if v.d == nil {
		return ""
	}
	return strconv.FormatFloat(v.d.Seconds(), 'f', -1, 64)
}

func (v secondsValue) Set(s string) error {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f < 0 || math.IsNaN(f) || f > math.MaxInt64/float64(time.Second) {
			return fmt.Errorf("%q: want a positive number of seconds", s)
		}
		*v.d = seconds(f)
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("%q: want seconds (1.5) or a duration (1500ms)", s)
	}
	*v.d = d
	return nil
}

func (v secondsValue) Type() string { return "seconds" }

type controlFlags struct {
	destination string
	pattern     string
	matcher     string
	timeout     time.Duration
	jsonOut     bool
}

func (f *controlFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	f.timeout = time.Second
	fl.StringVarP(&f.destination, "destination", "d", "", "comma-separated node names (default: all workers)")
	fl.StringVar(&f.pattern, "pattern", "", "select nodes whose name matches (a glob, see --matcher)")
	fl.StringVar(&f.matcher, "matcher", "glob", "how --pattern matches: glob (fnmatch) or pcre (a regular expression, anchored at the start)")
	fl.VarP(secondsValue{&f.timeout}, "timeout", "t", "seconds to wait for replies (1.5, or a duration: 1500ms)")
	fl.BoolVarP(&f.jsonOut, "json", "j", false, "print replies as JSON")
}

func (f *controlFlags) options() (client.ControlOptions, error) {
	o := client.ControlOptions{Timeout: f.timeout}
	for _, d := range strings.Split(f.destination, ",") {
		if d = strings.TrimSpace(d); d != "" {
			o.Destination = append(o.Destination, d)
		}
	}
	// As kombu: with named destinations, stop once each has answered.
	o.Limit = len(o.Destination)
	if f.pattern != "" {
		switch f.matcher {
		case "glob", "pcre":
		default:
			return o, usagef("--matcher must be glob or pcre, not %q", f.matcher)
		}
		o.Pattern, o.Matcher = f.pattern, f.matcher
	}
	return o, nil
}

const remoteLong = `Replies are printed as 'celery %s' prints them; --json prints them as JSON.
The exit status is 3 when no worker replied within --timeout (Celery exits
with 69), 2 for a command line error, 1 when the broker cannot be reached.

Workers are selected with --destination (node names) or --pattern; on
RabbitMQ every worker of the virtual host receives the broadcast, on Redis
every worker of the database.`

func newInspectCmd(g *globalFlags) *cobra.Command {
	f := &controlFlags{}
	cmd := &cobra.Command{
		Use:   "inspect COMMAND [ARG...]",
		Short: "Ask workers (Python or Go) about their state, like `celery inspect`",
		Long: "Broadcast an inspect command to Celery workers, Python or Go, and print\neach worker's reply.\n\nCommands:\n" +
			commandHelp(inspectCmds) + "\n" + fmt.Sprintf(remoteLong, "inspect"),
		Example: `  celeriac inspect ping
  celeriac inspect active -d celery@web1,celery@web2
  celeriac inspect registered --pattern 'celery@web*'
  celeriac inspect stats --json -t 2
  celeriac inspect query_task 1f4c2b0e-...`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := findCmd(inspectCmds, a[0])
			if err != nil {
				return err
			}
			arguments, err := c.arguments(a[1:])
			if err != nil {
				return err
			}
			return broadcast(cmd, g, f, c, arguments, true)
		},
	}
	f.register(cmd)
	return cmd
}

func newControlCmd(g *globalFlags) *cobra.Command {
	f := &controlFlags{}
	var terminate bool
	var signal string
	cmd := &cobra.Command{
		Use:   "control COMMAND [ARG...]",
		Short: "Tell workers (Python or Go) to do something, like `celery control`",
		Long: "Broadcast a control command to Celery workers, Python or Go, and print\neach worker's reply.\n\nCommands:\n" +
			commandHelp(controlCmds) + "\n" + fmt.Sprintf(remoteLong, "control") +
			"\n\nshutdown expects no reply: it is sent, and the command exits 0.",
		Example: `  celeriac control revoke 1f4c2b0e-... --terminate
  celeriac control rate_limit tasks.add 10/s -d celery@web1
  celeriac control time_limit tasks.sleep 30 60
  celeriac control add_consumer priority -d celery@web1
  celeriac control shutdown -d celery@web1`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := findCmd(controlCmds, a[0])
			if err != nil {
				return err
			}
			arguments, err := c.arguments(a[1:])
			if err != nil {
				return err
			}
			if c.name == "revoke" && terminate {
				arguments["terminate"] = true
				arguments["signal"] = signal
			} else if cmd.Flags().Changed("terminate") || cmd.Flags().Changed("signal") {
				if c.name != "revoke" {
					return usagef("--terminate and --signal go with revoke")
				}
			}
			return broadcast(cmd, g, f, c, arguments, false)
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&terminate, "terminate", false, "revoke: also stop the tasks that are running")
	cmd.Flags().StringVar(&signal, "signal", "SIGTERM", "revoke --terminate: the signal a Python worker sends")
	return cmd
}

func newStatusCmd(g *globalFlags) *cobra.Command {
	f := &controlFlags{}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "List the workers that are online, like `celery status`",
		Long:  "Ping the workers and list those that are online (that answer).\n\n" + fmt.Sprintf(remoteLong, "status"),
		Example: `  celeriac status
  celeriac status --pattern 'celery@web*' --json`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ping, _ := findCmd(inspectCmds, "ping")
			return broadcast(cmd, g, f, ping, map[string]any{}, true)
		},
	}
	f.register(cmd)
	return cmd
}

// broadcast sends the command and prints the replies. inspect (and status)
// print a JSON object of replies by node and a node count; control prints
// a JSON list of {node: reply}, as Celery's commands do.
func broadcast(cmd *cobra.Command, g *globalFlags, f *controlFlags, c remoteCmd, arguments map[string]any, inspect bool) error {
	o, err := f.options()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	conn, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctl := client.NewControl(conn.Transport)
	out := cmd.OutOrStdout()
	if c.noReply {
		if err := ctl.Cast(ctx, c.name, arguments, o); err != nil {
			return err
		}
		if !f.jsonOut {
			fmt.Fprintf(out, "-> %s sent\n", c.name)
		}
		return nil
	}
	replies, err := ctl.Call(ctx, c.name, arguments, o)
	if err != nil {
		return err
	}
	if len(replies) == 0 {
		return errNoReply
	}
	sort.SliceStable(replies, func(i, j int) bool { return replies[i].Hostname < replies[j].Hostname })
	if f.jsonOut {
		var doc any
		if inspect {
			m := map[string]any{}
			for _, r := range replies {
				m[r.Hostname] = jsonable(r.Value)
			}
			doc = m
		} else {
			list := make([]any, len(replies))
			for i, r := range replies {
				list[i] = map[string]any{r.Hostname: jsonable(r.Value)}
			}
			doc = list
		}
		b, err := marshalJSON(doc, false)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, b)
		return nil
	}
	status := cmd.Name() == "status"
	for _, r := range replies {
		st, body := pretty(r.Value)
		fmt.Fprintf(out, "->  %s: %s\n", r.Hostname, st)
		if !status {
			fmt.Fprintln(out, indent(body, 4))
		}
	}
	if inspect {
		noun := "nodes"
		if len(replies) == 1 {
			noun = "node"
		}
		fmt.Fprintf(out, "\n%d %s online.\n", len(replies), noun)
	}
	return nil
}

// pretty renders a reply as celery.bin.base.CLIContext.pretty does: a
// status (OK or ERROR) and a body.
func pretty(v any) (status, body string) {
	switch v := v.(type) {
	case []any:
		if len(v) == 0 {
			return "OK", "- empty -"
		}
		lines := make([]string, len(v))
		for i, e := range v {
			if s, ok := e.(string); ok {
				lines[i] = "* " + s
			} else {
				lines[i] = "* " + protocol.Repr(e)
			}
		}
		return "OK", strings.Join(lines, "\n")
	case map[string]any:
		if okv, has := v["ok"]; has {
			_, b := pretty(okv)
			return "OK", indent(b, 4)
		}
		if errv, has := v["error"]; has {
			_, b := pretty(errv)
			return "ERROR", indent(b, 4)
		}
		b, err := marshalJSON(jsonable(v), true)
		if err != nil {
			return "OK", protocol.Repr(v)
		}
		// Celery passes this JSON through pygments, which ends it with a
		// newline: celery prints a line of blanks after it, and so do we.
		return "OK", b + "\n"
	case string:
		return "OK", v
	}
	return "OK", protocol.Repr(v)
}

// indent is celery.utils.text.indent.
func indent(s string, n int) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
}

// marshalJSON is json.dumps(v, sort_keys=True), indented by 4 when asked,
// without escaping HTML characters.
func marshalJSON(v any, indented bool) (string, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if indented {
		enc.SetIndent("", "    ")
	}
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}
