package publish

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

// Options are apply_async's keyword arguments for one task call.
type Options struct {
	TaskID        string
	Countdown     time.Duration
	HasCountdown  bool
	ETA           time.Time
	Expires       time.Time
	Queue         string
	Exchange      string
	ExchangeType  string
	RoutingKey    string
	Priority      int
	Link          []protocol.Signature
	LinkError     []protocol.Signature
	Chain         []protocol.Signature
	Chord         *protocol.Signature
	Headers       map[string]any
	TimeLimit     time.Duration
	SoftTimeLimit time.Duration
	ReplyTo       string
	Serializer    string
	Compression   string
	IgnoreResult  *bool
	Shadow        string
	GroupID       string
	GroupIndex    *int
	ParentID      string
	RootID        string
	Retries       int
	// StampedHeaders and Stamps come from a stamped signature's options
	// (Celery 5.5's stamping: stamped_headers, then each stamp as an
	// option of its own).
	StampedHeaders []string
	Stamps         map[string]any
	// FallbackQueue is used when neither an option nor a route names a
	// queue and the producer has no configured default (canvas messages
	// sent by the worker: the parent's queue).
	FallbackQueue string
}

// ToSignature stores o in a signature's options map, the way Python's
// Signature.set(**options) does, so that whoever applies the signature
// (a Python worker, celeriac) publishes it with these options. Relative
// times (countdown) stay relative: they count from when the signature is
// applied.
func (o *Options) ToSignature(opts map[string]any) {
	set := func(k, v string) {
		if v != "" {
			opts[k] = v
		}
	}
	set("task_id", o.TaskID)
	set("queue", o.Queue)
	set("exchange", o.Exchange)
	set("routing_key", o.RoutingKey)
	set("reply_to", o.ReplyTo)
	set("shadow", o.Shadow)
	set("group_id", o.GroupID)
	set("parent_id", o.ParentID)
	set("root_id", o.RootID)
	set("serializer", o.Serializer)
	set("compression", o.Compression)
	if o.GroupIndex != nil {
		opts["group_index"] = int64(*o.GroupIndex)
	}
	if o.Priority != 0 {
		opts["priority"] = int64(o.Priority)
	}
	if o.HasCountdown {
		opts["countdown"] = o.Countdown.Seconds()
	}
	if !o.ETA.IsZero() {
		opts["eta"] = o.ETA.UTC().Format("2006-01-02T15:04:05.999999-07:00")
	}
	if !o.Expires.IsZero() {
		opts["expires"] = o.Expires.UTC().Format("2006-01-02T15:04:05.999999-07:00")
	}
	if o.TimeLimit > 0 {
		opts["time_limit"] = o.TimeLimit.Seconds()
	}
	if o.SoftTimeLimit > 0 {
		opts["soft_time_limit"] = o.SoftTimeLimit.Seconds()
	}
	if o.IgnoreResult != nil {
		opts["ignore_result"] = *o.IgnoreResult
	}
	if len(o.Headers) > 0 {
		opts["headers"] = o.Headers
	}
	if len(o.Link) > 0 {
		opts["link"] = signatureValues(o.Link)
	}
	if len(o.LinkError) > 0 {
		opts["link_error"] = signatureValues(o.LinkError)
	}
}

func signatureValues(s []protocol.Signature) []any {
	out := make([]any, len(s))
	for i := range s {
		out[i] = s[i].Value()
	}
	return out
}

// FromSignature reads the apply_async options stored in a signature
// (task_id, queue, countdown, eta, expires, link, ...). Unknown options are
// ignored, as Celery ignores options it does not use.
func FromSignature(opts map[string]any, now time.Time) (*Options, error) {
	o := &Options{}
	var errs []error
	str := func(k string) string {
		s, _ := opts[k].(string)
		return s
	}
	o.TaskID = str("task_id")
	o.Queue = str("queue")
	if q, ok := opts["queue"].(map[string]any); ok { // a kombu Queue as dict
		o.Queue, _ = q["name"].(string)
	}
	o.Exchange = str("exchange")
	o.RoutingKey = str("routing_key")
	o.ReplyTo = str("reply_to")
	o.Shadow = str("shadow")
	o.GroupID = str("group_id")
	o.ParentID = str("parent_id")
	o.RootID = str("root_id")
	if v, ok := opts["group_index"]; ok && v != nil {
		if i, ok := ToInt(v); ok {
			o.GroupIndex = &i
		}
	}
	if v, ok := opts["priority"]; ok && v != nil {
		if i, ok := ToInt(v); ok {
			o.Priority = i
		}
	}
	if v, ok := opts["countdown"]; ok && v != nil {
		if f, ok := ToFloat(v); ok {
			o.Countdown, o.HasCountdown = Seconds(f), true
		}
	}
	if v, ok := opts["eta"]; ok && v != nil {
		t, err := toTime(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("eta: %w", err))
		}
		o.ETA = t
	}
	if v, ok := opts["expires"]; ok && v != nil {
		if f, ok := ToFloat(v); ok {
			o.Expires = now.Add(Seconds(f))
		} else {
			t, err := toTime(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("expires: %w", err))
			}
			o.Expires = t
		}
	}
	if v, ok := opts["time_limit"]; ok && v != nil {
		if f, ok := ToFloat(v); ok {
			o.TimeLimit = Seconds(f)
		}
	}
	if v, ok := opts["soft_time_limit"]; ok && v != nil {
		if f, ok := ToFloat(v); ok {
			o.SoftTimeLimit = Seconds(f)
		}
	}
	if v, ok := opts["ignore_result"].(bool); ok {
		o.IgnoreResult = &v
	}
	if h, ok := opts["headers"].(map[string]any); ok {
		o.Headers = h
	}
	// A stamped signature (Celery 5.5's stamp()) lists its stamps in
	// stamped_headers and holds each as an option; as_task_v2 makes them
	// the message's stamped_headers and stamps headers.
	if sh, ok := opts["stamped_headers"].([]any); ok {
		o.StampedHeaders = make([]string, 0, len(sh))
		o.Stamps = make(map[string]any, len(sh))
		for _, h := range sh {
			if name, ok := h.(string); ok {
				o.StampedHeaders = append(o.StampedHeaders, name)
				o.Stamps[name] = opts[name]
			}
		}
	}
	var err error
	if o.Link, err = SignatureList(opts["link"]); err != nil {
		errs = append(errs, fmt.Errorf("link: %w", err))
	}
	if o.LinkError, err = SignatureList(opts["link_error"]); err != nil {
		errs = append(errs, fmt.Errorf("link_error: %w", err))
	}
	// A chord body carries the rest of its chain as an option.
	if o.Chain, err = SignatureList(opts["chain"]); err != nil {
		errs = append(errs, fmt.Errorf("chain: %w", err))
	}
	if v, ok := opts["chord"]; ok && v != nil {
		s, err := protocol.DecodeSignature(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("chord: %w", err))
		} else {
			o.Chord = &s
		}
	}
	return o, errors.Join(errs...)
}

// SignatureList accepts a signature dict or a list of them (Celery allows
// both for link and link_error).
func SignatureList(v any) ([]protocol.Signature, error) {
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
	case []protocol.Signature:
		return v, nil
	}
	return nil, fmt.Errorf("unexpected %T", v)
}

// Seconds converts Celery's float seconds to a Duration, saturating and
// treating NaN and negatives as zero.
func Seconds(f float64) time.Duration {
	if math.IsNaN(f) || f <= 0 {
		return 0
	}
	if f > float64(math.MaxInt64/int64(time.Second)) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(f * float64(time.Second))
}

// ToInt reads an integer from a decoded message value.
func ToInt(v any) (int, bool) {
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

// ToFloat reads a number from a decoded message value.
func ToFloat(v any) (float64, bool) {
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
