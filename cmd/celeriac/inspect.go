package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/celeriac/celeriac/worker"
)

type controlFlags struct {
	destination string
	pattern     string
	timeout     time.Duration
	jsonOut     bool
}

func (f *controlFlags) register(cmd *cobra.Command, defaultTimeout time.Duration) {
	fl := cmd.Flags()
	fl.StringVarP(&f.destination, "destination", "d", "", "comma-separated node names (default: all workers)")
	fl.StringVar(&f.pattern, "pattern", "", "glob selecting node names (celery@web*)")
	fl.DurationVarP(&f.timeout, "timeout", "t", defaultTimeout, "how long to wait for replies")
	fl.BoolVar(&f.jsonOut, "json", false, "print replies as JSON")
}

func (f *controlFlags) options() worker.ControlOptions {
	o := worker.ControlOptions{Timeout: f.timeout, Pattern: f.pattern}
	for _, d := range strings.Split(f.destination, ",") {
		if d = strings.TrimSpace(d); d != "" {
			o.Destination = append(o.Destination, d)
		}
	}
	return o
}

var inspectMethods = map[string]string{
	"ping":          "ping every worker",
	"registered":    "list registered tasks",
	"active":        "list running tasks",
	"reserved":      "list prefetched tasks waiting for a slot",
	"scheduled":     "list countdown/ETA tasks held by workers",
	"revoked":       "list revoked task ids",
	"stats":         "worker statistics",
	"active_queues": "list consumed queues",
	"query_task":    "state of the given task ids (ARG: ids)",
	"clock":         "the workers' Lamport clocks",
	"report":        "a short report per worker",
}

func newInspectCmd(g *globalFlags) *cobra.Command {
	f := &controlFlags{}
	var names []string
	for n := range inspectMethods {
		names = append(names, n)
	}
	sort.Strings(names)
	var help strings.Builder
	for _, n := range names {
		fmt.Fprintf(&help, "  %-14s %s\n", n, inspectMethods[n])
	}
	cmd := &cobra.Command{
		Use:   "inspect COMMAND [ARG...]",
		Short: "Ask workers (Python or Go) about their state, like `celery inspect`",
		Long:  "Broadcast an inspect command and print each worker's reply.\n\nCommands:\n" + help.String(),
		Example: `  celeriac inspect ping
  celeriac inspect active -d celery@web1
  celeriac inspect query_task 1f4c...`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			method := a[0]
			if _, ok := inspectMethods[method]; !ok {
				return usagef("unknown inspect command %q (one of %s)", method, strings.Join(names, ", "))
			}
			arguments := map[string]any{}
			if method == "query_task" {
				ids := make([]any, 0, len(a)-1)
				for _, id := range a[1:] {
					ids = append(ids, id)
				}
				arguments["ids"] = ids
			}
			return broadcast(cmd, g, f, method, arguments, true)
		},
	}
	f.register(cmd, time.Second)
	return cmd
}

func newControlCmd(g *globalFlags) *cobra.Command {
	f := &controlFlags{}
	var terminate bool
	cmd := &cobra.Command{
		Use:   "control COMMAND [ARG...]",
		Short: "Tell workers (Python or Go) to do something, like `celery control`",
		Long: `Broadcast a control command and print each worker's reply.

Commands:
  revoke ID...                   revoke tasks (--terminate stops running ones)
  rate_limit TASK RATE           set a task's rate limit ("10/s", "0" disables)
  time_limit TASK HARD [SOFT]    set a task's time limits in seconds
  enable_events | disable_events switch task events
  add_consumer QUEUE             start consuming a queue
  cancel_consumer QUEUE          stop consuming a queue
  pool_grow N | pool_shrink N    change concurrency
  heartbeat                      ask workers to send a heartbeat event
  shutdown                       warm shutdown (no reply)`,
		Example: `  celeriac control revoke 1f4c... --terminate
  celeriac control rate_limit tasks.add 10/s -d celery@web1`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			method, rest := a[0], a[1:]
			arguments := map[string]any{}
			need := func(n int, what string) error {
				if len(rest) < n {
					return usagef("%s needs %s", method, what)
				}
				return nil
			}
			reply := true
			switch method {
			case "revoke":
				if err := need(1, "task ids"); err != nil {
					return err
				}
				ids := make([]any, len(rest))
				for i, id := range rest {
					ids[i] = id
				}
				arguments["task_id"] = ids
				arguments["terminate"] = terminate
				arguments["signal"] = "SIGTERM"
			case "rate_limit":
				if err := need(2, "TASK RATE"); err != nil {
					return err
				}
				arguments["task_name"], arguments["rate_limit"] = rest[0], rest[1]
			case "time_limit":
				if err := need(2, "TASK HARD [SOFT]"); err != nil {
					return err
				}
				arguments["task_name"] = rest[0]
				arguments["hard"] = parseArg(rest[1])
				if len(rest) > 2 {
					arguments["soft"] = parseArg(rest[2])
				}
			case "add_consumer", "cancel_consumer":
				if err := need(1, "QUEUE"); err != nil {
					return err
				}
				arguments["queue"] = rest[0]
			case "pool_grow", "pool_shrink":
				n := int64(1)
				if len(rest) > 0 {
					if v, ok := parseArg(rest[0]).(int64); ok {
						n = v
					}
				}
				arguments["n"] = n
			case "enable_events", "disable_events":
			case "heartbeat", "shutdown":
				reply = false
			default:
				return usagef("unknown control command %q", method)
			}
			return broadcast(cmd, g, f, method, arguments, reply)
		},
	}
	f.register(cmd, time.Second)
	cmd.Flags().BoolVar(&terminate, "terminate", false, "revoke: also stop running tasks")
	return cmd
}

func broadcast(cmd *cobra.Command, g *globalFlags, f *controlFlags, method string, arguments map[string]any, wantReply bool) error {
	ctx := cmd.Context()
	conn, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	c := worker.NewControl(conn.Transport)
	if !wantReply {
		if err := c.Cast(ctx, method, arguments, f.options()); err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "-> %s sent\n", method)
		return nil
	}
	replies, err := c.Call(ctx, method, arguments, f.options())
	if err != nil {
		return err
	}
	if len(replies) == 0 {
		return errNoReply
	}
	out := cmd.OutOrStdout()
	if f.jsonOut {
		m := map[string]any{}
		for _, r := range replies {
			m[r.Hostname] = jsonable(r.Value)
		}
		b, _ := json.MarshalIndent(m, "", "  ")
		fmt.Fprintln(out, string(b))
		return nil
	}
	for _, r := range replies {
		b, _ := json.MarshalIndent(jsonable(r.Value), "    ", "  ")
		fmt.Fprintf(out, "-> %s: %s\n", r.Hostname, b)
	}
	fmt.Fprintf(out, "\n%d node(s) online.\n", len(replies))
	return nil
}
