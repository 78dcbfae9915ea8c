package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
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
		Use:   "show QUEUE ID",
		Short: "Show one dead letter in full (headers, properties, body, reason)",
		Args:  args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, a []string) error {
			return withDLQ(cmd, g, func(s transport.DeadLetterStore) error {
				msgs, err := s.DeadLetters(cmd.Context(), a[0], 0)
				if err != nil {
					return err
				}
				for _, m := range msgs {
					if m.ID != a[1] {
						continue
					}
					doc := map[string]any{
						"id": m.ID, "queue": m.Queue, "exchange": m.Exchange, "routing_key": m.RoutingKey,
						"reason": m.Reason, "content_type": m.Message.ContentType,
						"headers": jsonable(m.Message.Headers), "properties": m.Message.Properties,
					}
					if v, err := protocol.Unmarshal(m.Message.ContentType, m.Message.Body, protocol.DecodeOptions{}); err == nil {
						doc["body"] = jsonable(v)
					} else {
						doc["body_base64"] = base64.StdEncoding.EncodeToString(m.Message.Body)
						doc["body_error"] = err.Error()
					}
					b, _ := json.MarshalIndent(doc, "", "  ")
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
loses nothing (at worst a message is in both places).`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			return withDLQ(cmd, g, func(s transport.DeadLetterStore) error {
				n, err := s.Replay(cmd.Context(), a[0], a[1:], transport.ReplayOptions{ResetRetries: reset})
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
				n, err := s.PurgeDead(cmd.Context(), a[0], a[1:])
				fmt.Fprintf(cmd.OutOrStdout(), "purged %d dead letter(s) of %s\n", n, a[0])
				return err
			})
		},
	}
	cmd.AddCommand(list, show, replay, purge)
	return cmd
}

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
	var queues string
	var force bool
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete the ready messages of queues, like `celery purge`",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if queues == "" {
				return usagef("name the queues to purge with -Q")
			}
			if !force {
				return usagef("purge deletes messages for good: add --force to confirm")
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
			total := 0
			for _, q := range strings.Split(queues, ",") {
				if q = strings.TrimSpace(q); q == "" {
					continue
				}
				n, err := admin.Purge(cmd.Context(), q)
				if err != nil {
					return fmt.Errorf("purge %s: %w", q, err)
				}
				total += n
				fmt.Fprintf(cmd.OutOrStdout(), "purged %d message(s) from %s\n", n, q)
			}
			_ = total
			return nil
		},
	}
	cmd.Flags().StringVarP(&queues, "queues", "Q", "", "comma-separated queues")
	cmd.Flags().BoolVarP(&force, "force", "f", false, "do not ask for confirmation")
	return cmd
}
