package cli

import (
	"fmt"
	"io"
	"math"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// newEventsCmd is `celery events --dump`: every event of every worker, as
// Celery's evdump prints them. Celery's curses monitor and snapshot camera
// have no celeriac counterpart; the dashboard is the monitor.
func newEventsCmd(g *globalFlags) *cobra.Command {
	var dump bool
	var camera, freq, maxRate string
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Print the events of Python and Go workers, like `celery events --dump`",
		Long: `Print the events workers send (worker-online, worker-heartbeat, task-received,
task-succeeded, ...) in the format of Celery's ` + "`celery events --dump`" + `, until
interrupted. Task events need workers with -E (or control enable_events).

Celery's curses monitor (events without --dump) is the dashboard command
here: without --dump, events prints the dump and says so. --camera is
refused (dashboard --persist keeps history).`,
		Example: `  celeriac events --dump
  celeriac -b amqp://guest:guest@localhost// events -d`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if camera != "" {
				return usagef("--camera: celeriac has no snapshot cameras; dashboard --persist keeps the history")
			}
			if !dump {
				g.log.Warn("celeriac has no curses monitor (see the dashboard command): printing the events as --dump does")
			}
			conn, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			sub, err := conn.Transport.Subscribe(ctx, transport.Broadcast{
				Exchange: "celeryev", ExchangeType: transport.Topic, BindingKey: "#",
				Queue: "celeryev.celeriac-evdump-" + protocol.NewID(),
				// As Celery's receivers: the queue goes when the dump does.
				QueueArguments: map[string]any{"x-expires": int64(60000), "x-message-ttl": int64(60000)},
			})
			if err != nil {
				return fmt.Errorf("subscribe to events: %w", err)
			}
			defer sub.Close()
			out := cmd.OutOrStdout()
			fmt.Fprintln(out, "-> evdump: starting capture...")
			d := &evdump{w: out, names: map[string]string{}}
			for {
				select {
				case dl, ok := <-sub.Deliveries():
					if !ok {
						if ctx.Err() != nil {
							return nil
						}
						return fmt.Errorf("the event subscription ended")
					}
					d.message(dl.Message)
				case <-ctx.Done():
					return nil
				}
			}
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&dump, "dump", "d", false, "print every event (Celery's --dump)")
	fl.StringVarP(&camera, "camera", "c", "", "Celery's snapshot camera: refused (dashboard --persist)")
	fl.StringVarP(&freq, "frequency", "F", "", "Celery's camera frequency: accepted")
	fl.StringVarP(&maxRate, "maxrate", "r", "", "Celery's camera rate limit: accepted")
	for _, n := range []string{"frequency", "maxrate"} {
		_ = fl.MarkHidden(n)
	}
	return cmd
}

// evdump prints events as celery/events/dumper.py does.
type evdump struct {
	w     io.Writer
	names map[string]string // task id: "name(id) args=... kwargs=...", from task-received
}

// maxTaskNames bounds the names kept for later task events.
const maxTaskNames = 10000

func (d *evdump) message(m protocol.Message) {
	v, err := protocol.Unmarshal(m.ContentType, m.Body, protocol.DecodeOptions{})
	if err != nil {
		fmt.Fprintf(d.w, "?? undecodable event: %v\n", err)
		return
	}
	switch v := v.(type) {
	case map[string]any:
		d.event(v)
	case []any: // task.multi: a list of events
		for _, e := range v {
			if ev, ok := e.(map[string]any); ok {
				d.event(ev)
			}
		}
	}
}

func (d *evdump) event(ev map[string]any) {
	typ, _ := ev["type"].(string)
	host, _ := ev["hostname"].(string)
	ts := evTime(ev["timestamp"])
	rest := map[string]any{}
	for k, v := range ev {
		switch k {
		case "type", "hostname", "timestamp":
		default:
			rest[k] = v
		}
	}
	human := strings.ReplaceAll(strings.ToLower(typ), "-", " ")
	if strings.HasPrefix(typ, "task-") {
		id, _ := rest["uuid"].(string)
		delete(rest, "uuid")
		var task string
		if typ == "task-received" || typ == "task-sent" {
			task = fmt.Sprintf("%s(%s) args=%s kwargs=%s", pyStr(rest["name"]), id, pyStr(rest["args"]), pyStr(rest["kwargs"]))
			delete(rest, "name")
			delete(rest, "args")
			delete(rest, "kwargs")
			if len(d.names) >= maxTaskNames {
				clear(d.names)
			}
			d.names[id] = task
		} else {
			task = d.names[id]
		}
		fields, sep := evFields(rest)
		fmt.Fprintf(d.w, "%s [%s] %s%s %s %s\n", host, ts, human, sep, task, fields)
		return
	}
	fields, sep := evFields(rest)
	fmt.Fprintf(d.w, "%s [%s] %s%s %s\n", host, ts, human, sep, fields)
}

func evFields(ev map[string]any) (string, string) {
	keys := make([]string, 0, len(ev))
	for k := range ev {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + pyStr(ev[k])
	}
	if len(parts) == 0 {
		return "", ""
	}
	return strings.Join(parts, ", "), ":"
}

// pyStr is Python's str() of a decoded value: strings as they are, the
// rest as their repr.
func pyStr(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return protocol.Repr(v)
}

// evTime is Celery's datetime.utcfromtimestamp(ts), printed as str().
func evTime(v any) string {
	var f float64
	switch v := v.(type) {
	case float64:
		f = v
	case int64:
		f = float64(v)
	default:
		return "?"
	}
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 1e11 {
		return "?"
	}
	sec, frac := math.Modf(f)
	t := time.Unix(int64(sec), int64(frac*1e9)).UTC()
	return t.Format("2006-01-02 15:04:05.000000")
}
