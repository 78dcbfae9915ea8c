package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/worker/otelenv"
)

type sendFlags struct {
	args       string
	kwargs     string
	countdown  float64
	eta        string
	expires    float64
	queue      string
	exchange   string
	routingKey string
	priority   int
	taskID     string
	serializer string
	wait       bool
	timeout    time.Duration
}

func newSendCmd(g *globalFlags) *cobra.Command {
	f := &sendFlags{}
	cmd := &cobra.Command{
		Use:   "send TASK [ARG...]",
		Short: "Publish a task, like `celery call`",
		Long: `Publish a task message that Python Celery workers and celeriac workers accept,
and print its id. Each ARG is parsed as JSON (2, "x", [1, 2], {"a": 1}, null),
falling back to a plain string; --args takes them all as one JSON list, as
celery call does.

With --wait the result is awaited (a result backend is needed) and printed
as JSON; the exit status is 1 when the task failed, was revoked or no result
came within --timeout.`,
		Example: `  celeriac send tasks.add 2 3 --wait
  celeriac send tasks.add --args '[2, 3]'
  celeriac send tasks.echo hello --kwargs '{"n": 1}' --countdown 10 -Q priority`,
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error { return runSend(cmd, g, f, a) },
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.args, "args", "a", "", "positional arguments as a JSON list (instead of ARGs)")
	fl.StringVarP(&f.kwargs, "kwargs", "k", "", "keyword arguments as a JSON object")
	fl.Float64Var(&f.countdown, "countdown", 0, "seconds to wait before running")
	fl.StringVar(&f.eta, "eta", "", "ISO 8601 time to run at")
	fl.Float64Var(&f.expires, "expires", 0, "seconds after which the task is not run")
	fl.StringVarP(&f.queue, "queue", "Q", "", "queue to send to (default \"celery\")")
	fl.StringVar(&f.exchange, "exchange", "", "named exchange to send through")
	fl.StringVar(&f.routingKey, "routing-key", "", "routing key (with --exchange)")
	fl.IntVar(&f.priority, "priority", 0, "message priority")
	fl.StringVar(&f.taskID, "task-id", "", "task id (default: a new UUID)")
	fl.StringVar(&f.serializer, "serializer", "json", "json or msgpack")
	fl.BoolVar(&f.wait, "wait", false, "wait for the result and print it")
	f.timeout = 30 * time.Second
	fl.Var(secondsValue{&f.timeout}, "timeout", "seconds --wait waits (or a duration: 1m)")
	return cmd
}

func parseArg(s string) any {
	v, err := protocol.Unmarshal(protocol.ContentTypeJSON, []byte(s), protocol.DecodeOptions{})
	if err != nil {
		return s
	}
	return v
}

func runSend(cmd *cobra.Command, g *globalFlags, f *sendFlags, a []string) error {
	name := a[0]
	var posargs []any
	for _, s := range a[1:] {
		posargs = append(posargs, parseArg(s))
	}
	if f.args != "" {
		if len(posargs) > 0 {
			return usagef("give the arguments either as ARGs or with --args, not both")
		}
		v, err := protocol.Unmarshal(protocol.ContentTypeJSON, []byte(f.args), protocol.DecodeOptions{})
		list, ok := v.([]any)
		if err != nil || !ok {
			return usagef("--args must be a JSON list, got %q", f.args)
		}
		posargs = list
	}
	var kwargs map[string]any
	if f.kwargs != "" {
		v, err := protocol.Unmarshal(protocol.ContentTypeJSON, []byte(f.kwargs), protocol.DecodeOptions{})
		m, ok := v.(map[string]any)
		if err != nil || !ok {
			return usagef("--kwargs must be a JSON object, got %q", f.kwargs)
		}
		kwargs = m
	}
	var opts []client.SendOption
	if f.countdown > 0 {
		opts = append(opts, client.Countdown(seconds(f.countdown)))
	}
	if f.eta != "" {
		t, err := protocol.ParseTime(f.eta)
		if err != nil {
			return usagef("--eta: %v", err)
		}
		opts = append(opts, client.ETA(t))
	}
	if f.expires > 0 {
		opts = append(opts, client.Expires(time.Now().Add(seconds(f.expires))))
	}
	if f.queue != "" {
		opts = append(opts, client.Queue(f.queue))
	}
	if f.exchange != "" {
		opts = append(opts, client.Exchange(f.exchange, f.routingKey, ""))
	}
	if f.priority != 0 {
		opts = append(opts, client.Priority(f.priority))
	}
	if f.taskID != "" {
		opts = append(opts, client.TaskID(f.taskID))
	}
	switch f.serializer {
	case "json":
	case "msgpack":
		opts = append(opts, client.Serializer(protocol.ContentTypeMsgpack))
	default:
		return usagef("--serializer must be json or msgpack")
	}
	ctx := cmd.Context()
	conn, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if f.wait && conn.Backend == nil {
		return usagef("--wait needs a result backend (--result-backend, CELERY_RESULT_BACKEND or result_backend in --config)")
	}
	pc := client.Config{DefaultQueue: g.file.TaskDefaultQueue}
	tp, err := otelenv.New(ctx, "celeriac-send")
	if err != nil {
		return err
	}
	if tp != nil {
		pc.TracerProvider = tp
		pc.Propagator = otelenv.Propagator()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = tp.Shutdown(sctx)
		}()
	}
	p := client.New(conn.Transport, pc)
	r, err := p.Send(ctx, name, posargs, kwargs, opts...)
	if err != nil {
		return err
	}
	id := r.ID
	fmt.Fprintln(cmd.OutOrStdout(), id)
	if !f.wait {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	m, err := client.Wait(wctx, conn.Backend, id)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return fmt.Errorf("no result for task %s within %s (is a worker consuming the queue?)", id, f.timeout)
	}
	if err != nil {
		return fmt.Errorf("waiting for %s: %w", id, err)
	}
	out, _ := json.Marshal(resultJSON(m))
	fmt.Fprintln(cmd.OutOrStdout(), string(out))
	if m.Status != protocol.StateSuccess {
		return fmt.Errorf("task %s: %s", m.Status, describe(m))
	}
	return nil
}

func resultJSON(m *protocol.ResultMeta) map[string]any {
	r := map[string]any{"task_id": m.TaskID, "status": string(m.Status)}
	if ex, ok := m.Result.(*protocol.ExceptionInfo); ok {
		r["exception"] = map[string]any{"exc_type": ex.Type, "exc_module": ex.Module, "exc_message": ex.Message}
	} else {
		r["result"] = jsonable(m.Result)
	}
	return r
}

// jsonable converts protocol values for encoding/json (big ints and typed
// values as their text).
func jsonable(v any) any {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = jsonable(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = jsonable(e)
		}
		return out
	case nil, bool, int64, float64, string:
		return v
	}
	return fmt.Sprint(v)
}

func describe(m *protocol.ResultMeta) string {
	if ex, ok := m.Result.(*protocol.ExceptionInfo); ok {
		parts := make([]string, len(ex.Message))
		for i, a := range ex.Message {
			parts[i] = protocol.Repr(a)
		}
		return ex.Type + "(" + strings.Join(parts, ", ") + ")"
	}
	return protocol.Repr(m.Result)
}
