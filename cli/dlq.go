package cli

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/celeriac/celeriac/internal/deadletter"
	"github.com/celeriac/celeriac/transport"
	amqptransport "github.com/celeriac/celeriac/transport/amqp"
	redistransport "github.com/celeriac/celeriac/transport/redis"
)

func newDLQCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, show, replay and purge dead-lettered messages",
		Long: `Dead letters are messages the worker gave up on: retries exhausted, permanent
errors, unknown tasks, undecodable or refused messages. On RabbitMQ they sit in
the dead-letter queue bound to the queue's dead-letter exchange; on Redis in
celeriac's dead-letter list for the queue.`,
	}
	var limit int
	list := &cobra.Command{
		Use:   "list QUEUE",
		Short: "List dead letters of a queue, oldest first",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			return withDLQ(cmd, g, func(s transport.DeadLetterStore) error {
				msgs, err := s.DeadLetters(cmd.Context(), a[0], limit)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				for _, m := range msgs {
					id, _ := m.Message.Headers["id"].(string)
					task, _ := m.Message.Headers["task"].(string)
					fmt.Fprintf(out, "%s  task=%s id=%s retries=%v reason=%s time=%s\n    %s\n",
						m.ID, task, id, m.Message.Headers["retries"], m.Reason.Reason,
						formatTime(m.Reason.Time), oneLine(m.Reason.Error))
				}
				fmt.Fprintf(out, "%d dead letter(s) in %s\n", len(msgs), a[0])
				return nil
			})
		},
	}
	list.Flags().IntVar(&limit, "limit", 100, "how many to list (0: all)")
	show := &cobra.Command{
		Use: "show QUEUE ID",
		Long: `Show one dead letter in full. ID is what list prints first (the task id on
RabbitMQ, the delivery tag on Redis) or the task id.`,
		Short: "Show one dead letter in full (headers, properties, body, reason)",
		Args:  args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, a []string) error {
			return withDLQ(cmd, g, func(s transport.DeadLetterStore) error {
				msgs, err := s.DeadLetters(cmd.Context(), a[0], 0)
				if err != nil {
					return err
				}
				if m, ok := deadletter.Find(msgs, a[1]); ok {
					b, _ := json.MarshalIndent(deadletter.Doc(m), "", "  ")
					fmt.Fprintln(cmd.OutOrStdout(), string(b))
					return nil
				}
				return fmt.Errorf("no dead letter %q in %s", a[1], a[0])
			})
		},
	}
	var reset bool
	replay := &cobra.Command{
		Use:   "replay QUEUE [ID...]",
		Short: "Move dead letters back to their queue (all of them when no ID is given)",
		Long: `Move dead letters back to the queue they came from. A message leaves the dead
letters only after it is safely back in its queue, so an interrupted replay
loses nothing (at worst a message is in both places). Each ID is what list
prints first or a task id; an ID that names no dead letter is an error and
nothing is replayed.

The retries header is kept unless --reset-retries: a task that had used up its
max_retries then gets one attempt and, if it fails again, is dead again.`,
		Example: `  celeriac dlq replay celery                      # all of them
  celeriac dlq replay --reset-retries celery 3f0c...  # one, with a new retry budget`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			return withDLQ(cmd, g, func(s transport.DeadLetterStore) error {
				ids, err := deadletter.ResolveIDs(cmd.Context(), s, a[0], a[1:])
				if err != nil {
					return err
				}
				n, err := s.Replay(cmd.Context(), a[0], ids, transport.ReplayOptions{ResetRetries: reset})
				fmt.Fprintf(cmd.OutOrStdout(), "replayed %d message(s) to %s\n", n, a[0])
				return err
			})
		},
	}
	replay.Flags().BoolVar(&reset, "reset-retries", false, "set the retries header back to 0 (a full retry budget again)")
	purge := &cobra.Command{
		Use:   "purge QUEUE [ID...]",
		Short: "Delete dead letters (all of the queue's when no ID is given)",
		Args:  args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			return withDLQ(cmd, g, func(s transport.DeadLetterStore) error {
				ids, err := deadletter.ResolveIDs(cmd.Context(), s, a[0], a[1:])
				if err != nil {
					return err
				}
				n, err := s.PurgeDead(cmd.Context(), a[0], ids)
				fmt.Fprintf(cmd.OutOrStdout(), "purged %d dead letter(s) of %s\n", n, a[0])
				return err
			})
		},
	}
	setup := &cobra.Command{
		Use:   "setup QUEUE...",
		Short: "Declare the dead-letter exchange and queue of task queues (RabbitMQ)",
		Long: `Declare, for each task queue, the dead-letter exchange <queue>.dlx (a durable
fanout) and the dead-letter queue <queue>.dlq bound to it, then print the two
ways to attach the exchange to the queue. Setup does not change the task
queue: RabbitMQ never lets a declaration change an existing queue's arguments.

  1. Queue arguments at declaration: x-dead-letter-exchange in celeriac's
     config file ("celeriac_queue_arguments") and in every Python app that
     declares the queue (Queue(..., queue_arguments=...)); they must match,
     or RabbitMQ refuses the declaration (406 PRECONDITION_FAILED).
  2. A policy on the existing queue (rabbitmqctl set_policy): nothing to
     redeclare, Python unchanged.

Redis needs no setup: dead letters go to celeriac's list for the queue.`,
		Example: `  celeriac -b amqp://guest:guest@localhost// dlq setup celery`,
		Args:    args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			conn, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			out := cmd.OutOrStdout()
			tr, ok := conn.Transport.(*amqptransport.Transport)
			if !ok {
				o := g.options()
				for _, q := range a {
					fmt.Fprintf(out, "%s: nothing to set up on %s; dead letters go to the list %q\n",
						q, conn.BrokerScheme, o.GlobalKeyPrefix+redistransport.DefaultDeadLetterPrefix+q)
				}
				return nil
			}
			for _, q := range a {
				qargs, err := tr.DeclareDeadLetter(cmd.Context(), q)
				if err != nil {
					return err
				}
				printSetup(out, q, tr.DeadLetterQueue(q), qargs)
			}
			return nil
		},
	}
	cmd.AddCommand(list, show, replay, purge, setup)
	return cmd
}

// printSetup tells how to attach the dead-letter exchange that setup
// declared for q.
func printSetup(out io.Writer, q, dlq string, qargs map[string]any) {
	x, _ := qargs[amqptransport.ArgDeadLetterExchange].(string)
	argsJSON, _ := json.Marshal(qargs)
	cfgJSON, _ := json.Marshal(map[string]any{"celeriac_queue_arguments": map[string]any{q: qargs}})
	polJSON, _ := json.Marshal(map[string]string{"dead-letter-exchange": x})
	fmt.Fprintf(out, "declared exchange %s (fanout) and queue %s bound to it; attach it to %s with either:\n", x, dlq, q)
	fmt.Fprintf(out, "  queue arguments at declaration, the same wherever %s is declared:\n", q)
	fmt.Fprintf(out, "    celeriac --config file: %s\n", cfgJSON)
	fmt.Fprintf(out, "    Python: Queue(%s, Exchange(%[1]s), routing_key=%[1]s, queue_arguments=%s)\n", strconv.Quote(q), argsJSON)
	fmt.Fprintf(out, "  or a policy on the existing queue:\n")
	fmt.Fprintf(out, "    rabbitmqctl set_policy %s %s %s --apply-to queues\n",
		shellQuote(q+"-dlx"), shellQuote("^"+regexp.QuoteMeta(q)+"$"), shellQuote(string(polJSON)))
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func withDLQ(cmd *cobra.Command, g *globalFlags, f func(transport.DeadLetterStore) error) error {
	conn, err := g.open(cmd.Context())
	if err != nil {
		return err
	}
	defer conn.Close()
	s, ok := conn.Transport.(transport.DeadLetterStore)
	if !ok {
		return fmt.Errorf("the %s transport keeps no dead letters", conn.BrokerScheme)
	}
	return f(s)
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " | ")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

func newPurgeCmd(g *globalFlags) *cobra.Command {
	var queues, exclude string
	var force bool
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete the ready messages of queues, like `celery purge`",
		Long: `Delete the ready messages of queues, like ` + "`celery purge`" + `: those of -Q, else
the configured ones (task_queues, else task_default_queue, else "celery"),
minus -X. It asks for confirmation on a terminal; elsewhere it needs
-f/--force. There is no undo.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			names := splitList(queues)
			if len(names) == 0 {
				names = g.file.TaskQueues
			}
			if len(names) == 0 {
				names = []string{cmp.Or(g.file.TaskDefaultQueue, "celery")}
			}
			for _, x := range splitList(exclude) {
				names = slices.DeleteFunc(names, func(q string) bool { return q == x })
			}
			if len(names) == 0 {
				return usagef("-X/--exclude-queues leaves no queue to purge")
			}
			if !force {
				if !stdinIsTerminal() {
					return usagef("purge deletes messages for good: add -f/--force to confirm (queues: %s)", strings.Join(names, ", "))
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "WARNING: This will remove all tasks from %s: %s.\n"+
					"         There is no undo for this operation!\n\n(to skip this prompt use the -f option)\n"+
					"Are you sure you want to delete all tasks? [y/N]: ", plural(len(names), "queue"), strings.Join(names, ", "))
				answer, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
					return errors.New("aborted")
				}
			}
			conn, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			admin, ok := conn.Transport.(transport.Admin)
			if !ok {
				return fmt.Errorf("the %s transport cannot purge", conn.BrokerScheme)
			}
			for _, q := range names {
				n, err := admin.Purge(cmd.Context(), q)
				if err != nil {
					return fmt.Errorf("purge %s: %w", q, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "purged %d message(s) from %s\n", n, q)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&queues, "queues", "Q", "", "comma-separated queues (default: the configured ones)")
	cmd.Flags().StringVarP(&exclude, "exclude-queues", "X", "", "comma-separated queues not to purge")
	cmd.Flags().BoolVarP(&force, "force", "f", false, "do not ask for confirmation")
	return cmd
}

// stdinIsTerminal reports whether standard input is a terminal, where
// purge may ask for confirmation.
var stdinIsTerminal = func() bool {
	_, err := unix.IoctlGetTermios(int(os.Stdin.Fd()), unix.TCGETS)
	return err == nil
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
