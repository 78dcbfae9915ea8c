package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

const modulePath = "github.com/celeriac/celeriac"

// version is celeriac's version and the module version the program was
// built from (go install ...@v0.4.0 records it), with Go's.
func version() string {
	v := worker.Version
	if bi, ok := debug.ReadBuildInfo(); ok {
		mod := ""
		if bi.Main.Path == modulePath {
			mod = bi.Main.Version
		}
		for _, d := range bi.Deps {
			if d.Path == modulePath {
				mod = d.Version
			}
		}
		if mod != "" && mod != "(devel)" {
			v += " (module " + mod + ")"
		}
	}
	return v + " " + runtime.Version()
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version (as --version does)",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), cmd.Root().Name(), version())
			return nil
		},
	}
}

// newResultCmd is `celery result <task_id>`: wait for the task's result
// and print it; --traceback prints the traceback of a failure instead.
func newResultCmd(g *globalFlags) *cobra.Command {
	var task string
	var traceback bool
	var timeout float64
	cmd := &cobra.Command{
		Use:   "result <task_id>",
		Short: "Wait for a task's result and print it, like `celery result`",
		Long: `Wait for a task's result and print its value as JSON (exit status 1 and
the exception for a failed task). --traceback prints the traceback a failed
task stored instead. -t/--task is accepted for Celery compatibility: the
result backend needs no task name.`,
		Example: `  celeriac result 1f4c2b0e-...
  celeriac result --traceback 1f4c2b0e-...`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			if timeout < 0 {
				return usagef("--timeout must not be negative")
			}
			conn, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			if conn.Backend == nil {
				return usagef("no result backend: give --result-backend, set CELERY_RESULT_BACKEND or result_backend in --config")
			}
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, seconds(timeout))
				defer cancel()
			}
			m, err := client.Wait(ctx, conn.Backend, a[0])
			if errors.Is(err, context.DeadlineExceeded) && cmd.Context().Err() == nil {
				return fmt.Errorf("no result for task %s within %gs", a[0], timeout)
			}
			if err != nil {
				return fmt.Errorf("waiting for %s: %w", a[0], err)
			}
			out := cmd.OutOrStdout()
			if traceback {
				if m.Traceback != "" {
					fmt.Fprintln(out, strings.TrimRight(m.Traceback, "\n"))
				} else {
					fmt.Fprintln(out, "None")
				}
				return nil
			}
			if m.Status != protocol.StateSuccess {
				return fmt.Errorf("task %s: %s", m.Status, describe(m))
			}
			b, _ := json.Marshal(jsonable(m.Result))
			fmt.Fprintln(out, string(b))
			return nil
		},
	}
	cmd.Flags().StringVarP(&task, "task", "t", "", "the task's name: accepted for Celery compatibility")
	cmd.Flags().BoolVar(&traceback, "traceback", false, "print the traceback of a failed task")
	cmd.Flags().Float64Var(&timeout, "timeout", 0, "seconds to wait for the result (default: until it is ready, as Celery)")
	return cmd
}

// newReportCmd is `celery report`: what a bug report needs.
func newReportCmd(g *globalFlags, mux *worker.Mux) *cobra.Command {
	return &cobra.Command{
		Use:   "report",
		Short: "Print versions, platform, settings and registered tasks for a bug report, like `celery report`",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := g.options()
			out := cmd.OutOrStdout()
			host, _ := os.Hostname()
			fmt.Fprintf(out, "software -> %s %s\n", cmd.Root().Name(), version())
			fmt.Fprintf(out, "platform -> system:%s arch:%s cpus:%d hostname:%s\n", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), host)
			fmt.Fprintf(out, "broker_url: %s\n", reportURL(o.BrokerURL))
			fmt.Fprintf(out, "result_backend: %s\n", reportURL(o.ResultBackend))
			if g.configFile != "" {
				fmt.Fprintf(out, "config file: %s\n", g.configFile)
			}
			fmt.Fprintf(out, "tasks: %s\n", strings.Join(mux.Names(), ", "))
			fmt.Fprintf(out, "report time: %s\n", time.Now().UTC().Format(time.RFC3339))
			return nil
		},
	}
}

func reportURL(u string) string {
	if u == "" {
		return "(none)"
	}
	return connect.Redact(u)
}

// nodeFormat is Celery's node_format for --logfile: %p the node name, %h
// the host, %n the node's name part, %d the host's domain, %i and %I the
// process index ("0" and "" in the main process), %% a percent sign.
func nodeFormat(s, node string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	host, _ := os.Hostname()
	name := "celery"
	if node != "" {
		node = celeryHostname(node)
		n, h, _ := strings.Cut(node, "@")
		name = n
		if !strings.Contains(h, "%") && h != "" {
			host = h
		}
	} else {
		node = "celery@" + host
	}
	_, domain, _ := strings.Cut(host, ".")
	r := strings.NewReplacer("%%", "%", "%p", node, "%h", host, "%n", name, "%d", domain, "%i", "0", "%I", "")
	return r.Replace(s)
}
