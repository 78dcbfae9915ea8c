package worker

import (
	"context"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"math"
	"math/big"
	"time"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/protocol"
)

// callOptions are the options a caller adds when applying a signature, as
// in sig.apply_async((retval,), parent_id=..., root_id=..., chain=...).
type callOptions struct {
	parentID string
	rootID   string
	// chain is set (possibly to an empty, non-nil slice) when the caller
	// passes the remaining chain.
	chain    []protocol.Signature
	hasChain bool
	priority *int
	groupID  string
	// groupIndex is set for chord header members.
	groupIndex *int
	chord      *protocol.Signature
	// queue is the queue of the task that applies the signature: where its
	// messages go when nothing routes them (see Config.Routes).
	queue string
	// span is the run's span (nil when tracing is off): what is published
	// joins its trace.
	span trace.Span
}

// signatureMessage turns a plain signature into a task message and its
// destination, following Signature.apply_async: extra args are prepended
// unless the signature is immutable, options from the signature apply, and
// the caller's parent/root ids fill in what the signature leaves unset.
func (p *Producer) signatureMessage(sig protocol.Signature, extra []any, c callOptions, now time.Time) (*protocol.TaskMessage, destination, *sendOptions, error) {
	o, err := sendOptionsFromSignature(sig.Options, now)
	if err != nil {
		return nil, destination{}, nil, fmt.Errorf("worker: signature %s options: %w", sig.Task, err)
	}
	args := sig.Args
	if !sig.Immutable && len(extra) > 0 {
		args = append(append(make([]any, 0, len(extra)+len(sig.Args)), extra...), sig.Args...)
	}
	if o.parentID == "" {
		o.parentID = c.parentID
	}
	if o.rootID == "" {
		o.rootID = c.rootID
	}
	if c.hasChain {
		o.chain = c.chain
	}
	if c.priority != nil {
		o.priority = *c.priority
	}
	if c.groupID != "" {
		o.groupID = c.groupID
		o.groupIndex = c.groupIndex
	}
	if c.chord != nil {
		o.chord = c.chord
	}
	o.fallbackQueue = c.queue
	m, dest := p.build(sig.Task, args, sig.Kwargs, o, now)
	return m, dest, o, nil
}

// sendOptionsFromSignature reads the apply_async options stored in a
// signature (task_id, queue, countdown, eta, expires, link, ...). Unknown
// options are ignored, as Celery ignores options it does not use.
func sendOptionsFromSignature(opts map[string]any, now time.Time) (*sendOptions, error) {
	o := &sendOptions{}
	var errs []error
	str := func(k string) string {
		s, _ := opts[k].(string)
		return s
	}
	o.taskID = str("task_id")
	o.queue = str("queue")
	if q, ok := opts["queue"].(map[string]any); ok { // a kombu Queue as dict
		o.queue, _ = q["name"].(string)
	}
	o.exchange = str("exchange")
	o.routingKey = str("routing_key")
	o.replyTo = str("reply_to")
	o.shadow = str("shadow")
	o.groupID = str("group_id")
	o.parentID = str("parent_id")
	o.rootID = str("root_id")
	if v, ok := opts["group_index"]; ok && v != nil {
		if i, ok := toInt(v); ok {
			o.groupIndex = &i
		}
	}
	if v, ok := opts["priority"]; ok && v != nil {
		if i, ok := toInt(v); ok {
			o.priority = i
		}
	}
	if v, ok := opts["countdown"]; ok && v != nil {
		if f, ok := toFloat(v); ok {
			o.countdown, o.hasCountdown = seconds(f), true
		}
	}
	if v, ok := opts["eta"]; ok && v != nil {
		t, err := toTime(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("eta: %w", err))
		}
		o.eta = t
	}
	if v, ok := opts["expires"]; ok && v != nil {
		if f, ok := toFloat(v); ok {
			o.expires = now.Add(seconds(f))
		} else {
			t, err := toTime(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("expires: %w", err))
			}
			o.expires = t
		}
	}
	if v, ok := opts["time_limit"]; ok && v != nil {
		if f, ok := toFloat(v); ok {
			o.timeLimit = seconds(f)
		}
	}
	if v, ok := opts["soft_time_limit"]; ok && v != nil {
		if f, ok := toFloat(v); ok {
			o.softTimeLimit = seconds(f)
		}
	}
	if v, ok := opts["ignore_result"].(bool); ok {
		o.ignoreResult = &v
	}
	if h, ok := opts["headers"].(map[string]any); ok {
		o.headers = h
	}
	// A stamped signature (Celery 5.5's stamp()) lists its stamps in
	// stamped_headers and holds each as an option; as_task_v2 makes them
	// the message's stamped_headers and stamps headers.
	if sh, ok := opts["stamped_headers"].([]any); ok {
		o.stampedHeaders = make([]string, 0, len(sh))
		o.stamps = make(map[string]any, len(sh))
		for _, h := range sh {
			if name, ok := h.(string); ok {
				o.stampedHeaders = append(o.stampedHeaders, name)
				o.stamps[name] = opts[name]
			}
		}
	}
	var err error
	if o.link, err = signatureList(opts["link"]); err != nil {
		errs = append(errs, fmt.Errorf("link: %w", err))
	}
	if o.linkError, err = signatureList(opts["link_error"]); err != nil {
		errs = append(errs, fmt.Errorf("link_error: %w", err))
	}
	if v, ok := opts["chord"]; ok && v != nil {
		s, err := protocol.DecodeSignature(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("chord: %w", err))
		} else {
			o.chord = &s
		}
	}
	return o, errors.Join(errs...)
}

// signatureList accepts a signature dict or a list of them (Celery allows
// both for link and link_error).
func signatureList(v any) ([]protocol.Signature, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case map[string]any:
		s, err := protocol.DecodeSignature(v)
		if err != nil {
			return nil, err
		}
		return []protocol.Signature{s}, nil
	case []any:
		out := make([]protocol.Signature, 0, len(v))
		for _, e := range v {
			s, err := protocol.DecodeSignature(e)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected %T", v)
}

func seconds(f float64) time.Duration {
	if math.IsNaN(f) || f <= 0 {
		return 0
	}
	if f > float64(math.MaxInt64/int64(time.Second)) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(f * float64(time.Second))
}

func toInt(v any) (int, bool) {
	switch v := v.(type) {
	case int64:
		return int(v), true
	case int:
		return v, true
	case float64:
		return int(v), true
	case *big.Int:
		if v.IsInt64() {
			return int(v.Int64()), true
		}
	}
	return 0, false
}

func toFloat(v any) (float64, bool) {
	switch v := v.(type) {
	case int64:
		return float64(v), true
	case int:
		return float64(v), true
	case float64:
		return v, true
	case *big.Int:
		f, _ := new(big.Float).SetInt(v).Float64()
		return f, true
	}
	return 0, false
}

func toTime(v any) (time.Time, error) {
	switch v := v.(type) {
	case time.Time:
		return v, nil
	case string:
		return protocol.ParseTime(v)
	}
	return time.Time{}, fmt.Errorf("unexpected %T", v)
}

// applySignature publishes a signature as Celery's worker would: plain
// signatures become one message; group, chain and chord signatures are
// expanded. It returns the ids of what it published (for the parent's
// children).
func (w *Worker) applySignature(sig protocol.Signature, extra []any, c callOptions) ([]string, error) {
	now := time.Now()
	switch sig.SubtaskType {
	case "", "signature":
		m, dest, o, err := w.producer.signatureMessage(sig, extra, c, now)
		if err != nil {
			return nil, err
		}
		if err := w.persist(func(ctx context.Context) error {
			return w.producer.publish(withSpan(ctx, c.span), m, dest, o.serializer, o.compression)
		}); err != nil {
			return nil, err
		}
		return []string{m.ID}, nil
	case "group":
		return w.applyGroup(sig, extra, c)
	case "chain":
		tasks, err := signatureList(sig.Kwargs["tasks"])
		if err != nil || len(tasks) == 0 {
			return nil, fmt.Errorf("worker: chain signature without tasks: %v", err)
		}
		// The first step runs now; the rest ride along reversed, as Celery
		// lays out embed.chain.
		rest := make([]protocol.Signature, 0, len(tasks)-1)
		for i := len(tasks) - 1; i >= 1; i-- {
			rest = append(rest, tasks[i])
		}
		if c.hasChain {
			rest = append(append([]protocol.Signature(nil), c.chain...), rest...)
		}
		c.chain, c.hasChain = rest, true
		return w.applySignature(tasks[0], extra, c)
	case "chord":
		return w.applyChord(sig, extra, c)
	}
	return nil, fmt.Errorf("worker: cannot apply a %q signature", sig.SubtaskType)
}

func (w *Worker) applyGroup(sig protocol.Signature, extra []any, c callOptions) ([]string, error) {
	tasks, err := signatureList(sig.Kwargs["tasks"])
	if err != nil {
		return nil, fmt.Errorf("worker: group signature: %w", err)
	}
	gid, _ := sig.Options["task_id"].(string)
	if gid == "" {
		gid = NewID()
	}
	var ids []string
	for _, t := range tasks {
		cc := c
		cc.groupID = gid
		cc.groupIndex = nil
		got, err := w.applySignature(t, extra, cc)
		ids = append(ids, got...)
		if err != nil {
			return ids, err
		}
	}
	return ids, nil
}

func (w *Worker) applyChord(sig protocol.Signature, extra []any, c callOptions) ([]string, error) {
	header, err := protocol.DecodeSignature(sig.Kwargs["header"])
	if err != nil {
		return nil, fmt.Errorf("worker: chord header: %w", err)
	}
	body, err := protocol.DecodeSignature(sig.Kwargs["body"])
	if err != nil {
		return nil, fmt.Errorf("worker: chord body: %w", err)
	}
	tasks, err := signatureList(header.Kwargs["tasks"])
	if err != nil {
		return nil, fmt.Errorf("worker: chord header tasks: %w", err)
	}
	if body.Options == nil {
		body.Options = map[string]any{}
	}
	if id, _ := body.Options["task_id"].(string); id == "" {
		body.Options["task_id"] = NewID()
	}
	gid, _ := header.Options["task_id"].(string)
	if gid == "" {
		gid = NewID()
	}
	chords, ok := w.cfg.Backend.(backend.Chords)
	if !ok {
		return nil, errors.New("worker: chords need a result backend that counts chord parts (the Redis backend)")
	}
	if err := w.persist(func(ctx context.Context) error {
		return chords.SetChordSize(ctx, gid, len(tasks))
	}); err != nil {
		return nil, fmt.Errorf("worker: chord size: %w", err)
	}
	var ids []string
	for i, t := range tasks {
		idx := i
		cc := c
		cc.groupID, cc.groupIndex, cc.chord = gid, &idx, &body
		got, err := w.applySignature(t, extra, cc)
		ids = append(ids, got...)
		if err != nil {
			return ids, err
		}
	}
	return ids, nil
}
