package protocol

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Header names of protocol v2 (celery/app/amqp.py as_task_v2) that
// TaskMessage models as fields. Every other header lands in
// TaskMessage.Headers.
const (
	hLang                = "lang"
	hTask                = "task"
	hID                  = "id"
	hShadow              = "shadow"
	hETA                 = "eta"
	hExpires             = "expires"
	hGroup               = "group"
	hGroupIndex          = "group_index"
	hRetries             = "retries"
	hTimeLimit           = "timelimit"
	hRootID              = "root_id"
	hParentID            = "parent_id"
	hArgsRepr            = "argsrepr"
	hKwargsRepr          = "kwargsrepr"
	hOrigin              = "origin"
	hIgnoreResult        = "ignore_result"
	hReplacedTaskNesting = "replaced_task_nesting"
	hStampedHeaders      = "stamped_headers"
	hStamps              = "stamps"
	hCompression         = "compression"
)

// isModelledHeader reports whether a v2 header has a TaskMessage field.
func isModelledHeader(k string) bool {
	switch k {
	case hLang, hTask, hID, hShadow, hETA, hExpires, hGroup, hGroupIndex, hRetries,
		hTimeLimit, hRootID, hParentID, hArgsRepr, hKwargsRepr, hOrigin, hIgnoreResult,
		hReplacedTaskNesting, hStampedHeaders, hStamps, hCompression:
		return true
	}
	return false
}

// hybridKeys returns the body keys Celery's hybrid_to_proto2 lifts into
// the headers of a v2 message whose body is a v1-style object
// (celery/worker/strategy.py).
func hybridKeys() []string {
	return []string{hLang, hTask, hID, hRootID, hParentID, hGroup, "meth", hShadow, hETA,
		hExpires, hRetries, hTimeLimit, hArgsRepr, hKwargsRepr, hOrigin}
}

// isV1Key reports whether a protocol v1 body key (as_task_v1) is modelled
// by TaskMessage; "taskset" is the pre-4.0 name of "group".
func isV1Key(k string) bool {
	switch k {
	case hTask, hID, "args", "kwargs", hGroup, "taskset", hGroupIndex, hRetries, hETA,
		hExpires, "utc", "callbacks", "errbacks", hTimeLimit, "chord", "chain", hLang,
		hRootID, hParentID, hShadow, hArgsRepr, hKwargsRepr, hOrigin, hIgnoreResult, "headers":
		return true
	}
	return false
}

// DecodeTask decodes a task message into a TaskMessage with protocol v2
// semantics. The version is detected as Celery's worker does
// (celery/worker/consumer/consumer.py, celery/worker/strategy.py):
//
//   - a "task" header means protocol 2. If the body is then an object with
//     "args" (a "hybrid" message), its v1-style fields fill in the headers
//     the message lacks, as hybrid_to_proto2 does;
//   - otherwise the body is decoded and, if it is an object with "task", it
//     is protocol 1: "taskset" becomes Group, callbacks/errbacks/chord become
//     Embed, Chain stays nil. Like Celery 5.2's worker (maybe_make_aware),
//     naive eta/expires are read as UTC whatever the v1 "utc" flag says;
//   - anything else fails with an error wrapping ErrNotTaskMessage.
//
// The body is checked against opts.MaxBodySize before and after
// decompression, decompressed per the "compression" header and
// deserialized with [Unmarshal]. A content type that is not accepted (and
// pickle, always) fails with a *ContentTypeError; every other malformed
// part fails with a *DecodeError naming it: a missing id or task, an
// unparsable eta or expires, args that are not a list, kwargs that are not
// an object, a modelled header of the wrong type, a time limit that is
// negative or above 1e9 seconds. Optional headers may be missing or null
// (see the field docs of TaskMessage); time limits are read at Python's
// microsecond resolution. Headers this package does not model are kept in
// TaskMessage.Headers (for v1, the message headers, minus any that repeat
// a modelled name: the body is authoritative there).
//
// The returned message shares no memory with m except header values.
func DecodeTask(m *Message, opts DecodeOptions) (*TaskMessage, error) {
	if m == nil {
		return nil, &DecodeError{Field: "message", Err: errors.New("nil message")}
	}
	if limit := opts.maxBodySize(); len(m.Body) > limit {
		return nil, &DecodeError{Field: "body", Err: fmt.Errorf("%w: %d bytes exceed %d", ErrTooLarge, len(m.Body), limit)}
	}
	if _, ok := m.Headers[hTask]; ok {
		return decodeV2(m, opts)
	}
	payload, err := decodeTaskBody(m, opts)
	if err != nil {
		return nil, err
	}
	body, ok := payload.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: no task header and the body is %s", ErrNotTaskMessage, valueKind(payload))
	}
	if _, ok := body[hTask]; !ok {
		return nil, fmt.Errorf("%w: no task header and the body object has no task key", ErrNotTaskMessage)
	}
	return decodeV1(m, body)
}

// decodeTaskBody decompresses and deserializes m.Body.
func decodeTaskBody(m *Message, opts DecodeOptions) (any, error) {
	body := m.Body
	if c, ok := m.Headers[hCompression]; ok && c != nil {
		mime, ok := c.(string)
		if !ok {
			return nil, fieldTypeError(hCompression, "a string", c)
		}
		if mime != "" {
			var err error
			body, err = Decompress(mime, body, opts.maxBodySize())
			if err != nil {
				return nil, &DecodeError{Field: "body", Err: err}
			}
		}
	}
	if err := checkContentEncoding(m.ContentEncoding); err != nil {
		return nil, err
	}
	v, err := Unmarshal(m.ContentType, body, opts)
	if err != nil {
		if errors.Is(err, ErrUnsupportedContentType) {
			return nil, err
		}
		return nil, &DecodeError{Field: "body", Err: err}
	}
	return v, nil
}

// checkContentEncoding accepts the charsets under which kombu hands the
// body bytes to the deserializer unchanged (or as UTF-8 text, which is the
// same bytes).
func checkContentEncoding(enc string) error {
	switch strings.ToLower(enc) {
	case "", "utf-8", "utf8", "binary", "ascii-8bit", "ascii", "us-ascii":
		return nil
	}
	return &DecodeError{Field: "content-encoding", Err: fmt.Errorf("unsupported charset %q", enc)}
}

func decodeV2(m *Message, opts DecodeOptions) (*TaskMessage, error) {
	payload, err := decodeTaskBody(m, opts)
	if err != nil {
		return nil, err
	}
	t := &TaskMessage{Protocol: 2}
	headers := m.Headers
	switch body := payload.(type) {
	case []any:
		if len(body) != 2 && len(body) != 3 {
			return nil, &DecodeError{Field: "body", Err: fmt.Errorf("want [args, kwargs, embed], got a list of %d elements", len(body))}
		}
		if t.Args, err = decodeArgs(body[0]); err != nil {
			return nil, err
		}
		if t.Kwargs, err = decodeKwargs(body[1]); err != nil {
			return nil, err
		}
		if len(body) == 3 {
			if t.Embed, err = decodeEmbed(body[2]); err != nil {
				return nil, err
			}
		}
	case map[string]any:
		if _, ok := body["args"]; !ok {
			return nil, &DecodeError{Field: "body", Err: errors.New("want [args, kwargs, embed] or a hybrid object with args, got an object without args")}
		}
		headers = hybridHeaders(body, m.Headers)
		if t.Args, t.Kwargs, t.Embed, err = decodeV1Body(body); err != nil {
			return nil, err
		}
	default:
		return nil, &DecodeError{Field: "body", Err: fmt.Errorf("want [args, kwargs, embed], got %s", valueKind(payload))}
	}
	if err := t.setHeaders(headers); err != nil {
		return nil, err
	}
	for k, v := range headers {
		if !isModelledHeader(k) {
			if t.Headers == nil {
				t.Headers = make(map[string]any)
			}
			t.Headers[k] = v
		}
	}
	t.setMessage(m)
	return t, nil
}

// hybridHeaders merges the v1-style fields of a hybrid body under the
// message headers, which win (hybrid_to_proto2).
func hybridHeaders(body, msgHeaders map[string]any) map[string]any {
	keys := hybridKeys()
	h := make(map[string]any, len(keys)+len(msgHeaders))
	for _, k := range keys {
		if v, ok := body[k]; ok {
			h[k] = v
		}
	}
	for k, v := range msgHeaders {
		h[k] = v
	}
	return h
}

func decodeV1(m *Message, body map[string]any) (*TaskMessage, error) {
	t := &TaskMessage{Protocol: 1}
	var err error
	if t.Args, t.Kwargs, t.Embed, err = decodeV1Body(body); err != nil {
		return nil, err
	}
	h := make(map[string]any, len(body))
	for k, v := range body {
		if isV1Key(k) && k != "taskset" {
			h[k] = v
		}
	}
	if ts, ok := body["taskset"]; ok {
		h[hGroup] = ts // proto1_to_proto2: body['group'] = body['taskset']
	}
	if u, ok := body["utc"]; ok && u != nil {
		if _, ok := u.(bool); !ok {
			return nil, fieldTypeError("utc", "a bool", u)
		}
	}
	if err := t.setHeaders(h); err != nil {
		return nil, err
	}
	// Celery's worker (celery/worker/strategy.py, 5.2 and 5.5 alike) turns
	// a v1 body that has "args" into v2 with hybrid_to_proto2, which takes
	// argsrepr/kwargsrepr from the body: None for what as_task_v1 writes
	// (captured: golden/celery55/result_reqinfo_proto1.json). Only a body
	// without "args" goes through proto1_to_proto2, whose saferepr of the
	// default () and of kwargs replaces whatever the body said.
	if _, ok := body["args"]; !ok {
		t.ArgsRepr = SafeRepr(pyTuple(t.Args), 0)
		t.KwargsRepr = SafeRepr(t.Kwargs, 0)
	}
	// The compression header is the message's, not the body's (the body
	// was decompressed with it); decodeTaskBody has checked its type.
	t.Compression, _ = m.Headers[hCompression].(string)
	// Celery nests v1 message headers under request.headers; they are
	// custom headers, except that a modelled name would be ambiguous (the
	// body is authoritative in v1), so those are left out.
	for k, v := range m.Headers {
		if isModelledHeader(k) {
			continue
		}
		if t.Headers == nil {
			t.Headers = make(map[string]any, len(m.Headers))
		}
		t.Headers[k] = v
	}
	t.setMessage(m)
	return t, nil
}

// decodeV1Body reads args, kwargs, callbacks, errbacks and chord from a v1
// (or hybrid) body. Missing args and kwargs default to empty, as
// body.get('args', ()) does.
func decodeV1Body(body map[string]any) (args []any, kwargs map[string]any, embed Embed, err error) {
	args, kwargs = []any{}, map[string]any{}
	if v, ok := body["args"]; ok {
		if args, err = decodeArgs(v); err != nil {
			return
		}
	}
	if v, ok := body["kwargs"]; ok {
		if kwargs, err = decodeKwargs(v); err != nil {
			return
		}
	}
	if embed.Callbacks, err = decodeSignatureList(body["callbacks"], "callbacks"); err != nil {
		return
	}
	if embed.Errbacks, err = decodeSignatureList(body["errbacks"], "errbacks"); err != nil {
		return
	}
	embed.Chord, err = decodeOptionalSignature(body["chord"], "chord")
	return
}

func decodeArgs(v any) ([]any, error) {
	args, ok := v.([]any)
	if !ok {
		return nil, fieldTypeError("args", "a list", v)
	}
	return args, nil
}

func decodeKwargs(v any) (map[string]any, error) {
	kwargs, ok := v.(map[string]any)
	if !ok {
		// Celery: InvalidTaskError("Task keyword arguments must be a mapping").
		return nil, fieldTypeError("kwargs", "an object", v)
	}
	return kwargs, nil
}

func decodeEmbed(v any) (Embed, error) {
	var e Embed
	if v == nil {
		return e, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return e, fieldTypeError("embed", "an object or null", v)
	}
	var err error
	if e.Callbacks, err = decodeSignatureList(m["callbacks"], "embed.callbacks"); err != nil {
		return e, err
	}
	if e.Errbacks, err = decodeSignatureList(m["errbacks"], "embed.errbacks"); err != nil {
		return e, err
	}
	if e.Chain, err = decodeSignatureList(m["chain"], "embed.chain"); err != nil {
		return e, err
	}
	e.Chord, err = decodeOptionalSignature(m["chord"], "embed.chord")
	return e, err
}

func decodeSignatureList(v any, field string) ([]Signature, error) {
	if v == nil {
		return nil, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fieldTypeError(field, "a list of signatures or null", v)
	}
	sigs := make([]Signature, len(list))
	for i, item := range list {
		s, err := decodeSignature(item, fmt.Sprintf("%s[%d]", field, i))
		if err != nil {
			return nil, err
		}
		sigs[i] = s
	}
	return sigs, nil
}

func decodeOptionalSignature(v any, field string) (*Signature, error) {
	if v == nil {
		return nil, nil
	}
	s, err := decodeSignature(v, field)
	if err != nil {
		return nil, err
	}
	return &s, nil
}

// setHeaders fills the modelled fields from a v2 header map (or the
// equivalent map built from a v1 or hybrid body).
func (t *TaskMessage) setHeaders(h map[string]any) error {
	var err error
	if t.ID, err = requiredString(h, hID); err != nil {
		return err
	}
	if t.Name, err = requiredString(h, hTask); err != nil {
		return err
	}
	strs := []struct {
		key string
		dst *string
	}{
		{hLang, &t.Lang}, {hShadow, &t.Shadow}, {hGroup, &t.Group}, {hRootID, &t.RootID},
		{hParentID, &t.ParentID}, {hArgsRepr, &t.ArgsRepr}, {hKwargsRepr, &t.KwargsRepr},
		{hOrigin, &t.Origin},
	}
	for _, s := range strs {
		if *s.dst, err = optionalString(h, s.key); err != nil {
			return err
		}
	}
	if t.ETA, err = optionalTime(h, hETA); err != nil {
		return err
	}
	if t.Expires, err = optionalTime(h, hExpires); err != nil {
		return err
	}
	if v := h[hGroupIndex]; v != nil {
		n, err := intValue(hGroupIndex, v)
		if err != nil {
			return err
		}
		t.GroupIndex = &n
	}
	if v := h[hRetries]; v != nil {
		if t.Retries, err = intValue(hRetries, v); err != nil {
			return err
		}
	}
	if v := h[hReplacedTaskNesting]; v != nil {
		if t.ReplacedTaskNesting, err = intValue(hReplacedTaskNesting, v); err != nil {
			return err
		}
	}
	if t.TimeLimit, t.SoftTimeLimit, err = decodeTimeLimit(h[hTimeLimit]); err != nil {
		return err
	}
	if v := h[hIgnoreResult]; v != nil {
		b, ok := v.(bool)
		if !ok {
			return fieldTypeError(hIgnoreResult, "a bool or null", v)
		}
		t.IgnoreResult = &b
	}
	if v := h[hStampedHeaders]; v != nil {
		list, ok := v.([]any)
		if !ok {
			return fieldTypeError(hStampedHeaders, "a list of strings or null", v)
		}
		t.StampedHeaders = make([]string, len(list))
		for i, item := range list {
			s, ok := item.(string)
			if !ok {
				return fieldTypeError(fmt.Sprintf("%s[%d]", hStampedHeaders, i), "a string", item)
			}
			t.StampedHeaders[i] = s
		}
	}
	if v := h[hStamps]; v != nil {
		m, ok := v.(map[string]any)
		if !ok {
			return fieldTypeError(hStamps, "an object or null", v)
		}
		t.Stamps = m
	}
	if v := h[hCompression]; v != nil {
		s, ok := v.(string)
		if !ok {
			return fieldTypeError(hCompression, "a string", v)
		}
		t.Compression = s
	}
	return nil
}

// setMessage copies what TaskMessage keeps of the message envelope.
func (t *TaskMessage) setMessage(m *Message) {
	t.CorrelationID = m.Properties.CorrelationID
	t.ReplyTo = m.Properties.ReplyTo
	t.Priority = m.Properties.Priority
	t.DeliveryMode = m.Properties.DeliveryMode
	t.Expiration = m.Properties.Expiration
	t.ContentType = m.ContentType
	t.ContentEncoding = m.ContentEncoding
}

// decodeTimeLimit reads the timelimit header: [hard, soft], each null or a
// non-negative number of seconds. A missing or null header means no limits.
func decodeTimeLimit(v any) (hard, soft time.Duration, err error) {
	if v == nil {
		return 0, 0, nil
	}
	list, ok := v.([]any)
	if !ok || len(list) != 2 {
		return 0, 0, fieldTypeError(hTimeLimit, "[hard, soft]", v)
	}
	if hard, err = seconds(hTimeLimit+"[0]", list[0]); err != nil {
		return 0, 0, err
	}
	soft, err = seconds(hTimeLimit+"[1]", list[1])
	return hard, soft, err
}

// maxTimeLimit bounds time limits to about 31 years: anything longer is
// not a limit, and the bound keeps microsecond counts exact in a float64.
const maxTimeLimit = 1e9 * time.Second

// seconds reads a time limit in seconds, rounded to the microsecond
// (Python's time resolution).
func seconds(field string, v any) (time.Duration, error) {
	if v == nil {
		return 0, nil
	}
	f, ok := numberValue(v)
	if !ok {
		return 0, fieldTypeError(field, "a number of seconds or null", v)
	}
	if f != f || f < 0 || f > maxTimeLimit.Seconds() {
		return 0, &DecodeError{Field: field, Err: fmt.Errorf("%v seconds is out of range", v)}
	}
	return time.Duration(math.Round(f*1e6)) * time.Microsecond, nil
}

// durationValue is the wire form of a time limit: whole seconds as an
// integer (as Python users usually write them), otherwise a float with
// microsecond resolution.
func durationValue(d time.Duration) any {
	if d == 0 {
		return nil
	}
	if d%time.Second == 0 {
		return int64(d / time.Second)
	}
	return float64(d/time.Microsecond) / 1e6
}

// EncodeTask encodes t as a protocol v2 message laid out as Celery 5.2's
// as_task_v2 does, so that Celery 5.2 to 5.6 workers accept it:
//
//   - headers: every key Python sends is present, null when unset: lang
//     (t.Lang, default "go"), task, id, shadow, eta and expires (via
//     [FormatTime]), group, group_index, retries, timelimit ([hard, soft]
//     with null for zero), root_id (default: the id), parent_id, argsrepr
//     and kwargsrepr (computed with [Repr] when empty), origin and
//     ignore_result (null when nil: the worker's task default applies).
//     The computed reprs are Celery's (see [ReprArgs], [ReprKwargs]).
//     replaced_task_nesting, stamped_headers and stamps are written only
//     when set; t.Headers are merged at top level and may not repeat a
//     modelled header;
//   - body: [args, kwargs, {"callbacks", "errbacks", "chain", "chord"}]
//     serialized with opts.ContentType (JSON by default) and, when
//     opts.Compression is set, compressed with the "compression" header
//     naming the MIME type;
//   - properties: correlation_id = id, reply_to, delivery_mode (default 2),
//     priority and expiration as given. EncodeTask does not read the clock:
//     callers that set Expires and publish to RabbitMQ compute Expiration
//     (milliseconds from now) themselves.
//
// t.Protocol, t.CorrelationID, t.ContentType, t.ContentEncoding and
// t.Compression are ignored: opts and the id decide them.
func EncodeTask(t *TaskMessage, opts EncodeOptions) (*Message, error) {
	if t == nil {
		return nil, errors.New("protocol: encode task: nil message")
	}
	if t.ID == "" {
		return nil, errors.New("protocol: encode task: empty id")
	}
	if t.Name == "" {
		return nil, errors.New("protocol: encode task: empty task name")
	}
	for k := range t.Headers {
		if isModelledHeader(k) {
			return nil, fmt.Errorf("protocol: encode task: header %q is set through a TaskMessage field, not Headers", k)
		}
	}
	if t.TimeLimit < 0 || t.SoftTimeLimit < 0 || t.TimeLimit > maxTimeLimit || t.SoftTimeLimit > maxTimeLimit {
		return nil, errors.New("protocol: encode task: time limit out of range (0 to 1e9 s)")
	}
	args, kwargs := t.Args, t.Kwargs
	if args == nil {
		args = []any{}
	}
	if kwargs == nil {
		kwargs = map[string]any{}
	}

	h := make(map[string]any, 20+len(t.Headers))
	for k, v := range t.Headers {
		h[k] = v
	}
	h[hLang] = orDefault(t.Lang, "go")
	h[hTask] = t.Name
	h[hID] = t.ID
	h[hShadow] = nullIfEmpty(t.Shadow)
	h[hETA] = timeValue(t.ETA)
	h[hExpires] = timeValue(t.Expires)
	h[hGroup] = nullIfEmpty(t.Group)
	if t.GroupIndex != nil {
		h[hGroupIndex] = int64(*t.GroupIndex)
	} else {
		h[hGroupIndex] = nil
	}
	h[hRetries] = int64(t.Retries)
	h[hTimeLimit] = []any{durationValue(t.TimeLimit), durationValue(t.SoftTimeLimit)}
	h[hRootID] = orDefault(t.RootID, t.ID)
	h[hParentID] = nullIfEmpty(t.ParentID)
	h[hArgsRepr] = t.ArgsRepr
	if t.ArgsRepr == "" {
		h[hArgsRepr] = ReprArgs(args)
	}
	h[hKwargsRepr] = t.KwargsRepr
	if t.KwargsRepr == "" {
		h[hKwargsRepr] = ReprKwargs(kwargs)
	}
	h[hOrigin] = nullIfEmpty(t.Origin)
	if t.IgnoreResult != nil {
		h[hIgnoreResult] = *t.IgnoreResult
	} else {
		h[hIgnoreResult] = nil
	}
	if t.ReplacedTaskNesting != 0 {
		h[hReplacedTaskNesting] = int64(t.ReplacedTaskNesting)
	}
	if t.StampedHeaders != nil {
		sh := make([]any, len(t.StampedHeaders))
		for i, s := range t.StampedHeaders {
			sh[i] = s
		}
		h[hStampedHeaders] = sh
	}
	if t.Stamps != nil {
		h[hStamps] = t.Stamps
	}

	embed := map[string]any{
		"callbacks": signatureList(t.Embed.Callbacks),
		"errbacks":  signatureList(t.Embed.Errbacks),
		"chain":     signatureList(t.Embed.Chain),
		"chord":     nil,
	}
	if t.Embed.Chord != nil {
		embed["chord"] = t.Embed.Chord.Value()
	}

	ct := ContentTypeJSON
	if opts.ContentType != "" {
		if ct = contentTypeByName(opts.ContentType); ct == "" {
			return nil, fmt.Errorf("protocol: encode task %s: %w", t.ID, &ContentTypeError{ContentType: opts.ContentType})
		}
	}
	body, err := Marshal(ct, []any{args, kwargs, embed})
	if err != nil {
		return nil, fmt.Errorf("protocol: encode task %s: %w", t.ID, err)
	}
	if opts.Compression != "" {
		if body, err = Compress(opts.Compression, body); err != nil {
			return nil, fmt.Errorf("protocol: encode task %s: %w", t.ID, err)
		}
		h[hCompression] = opts.Compression
	}
	deliveryMode := t.DeliveryMode
	if deliveryMode == 0 {
		deliveryMode = 2
	}
	return &Message{
		ContentType:     ct,
		ContentEncoding: contentEncodingFor(ct),
		Headers:         h,
		Properties: Properties{
			CorrelationID: t.ID,
			ReplyTo:       t.ReplyTo,
			DeliveryMode:  deliveryMode,
			Priority:      t.Priority,
			Expiration:    t.Expiration,
		},
		Body: body,
	}, nil
}

// contentEncodingFor is kombu's registry: text serializers are utf-8, the
// others binary.
func contentEncodingFor(contentType string) string {
	switch contentType {
	case ContentTypeJSON, ContentTypeYAML, ContentTypeText:
		return "utf-8"
	}
	return "binary"
}

func signatureList(sigs []Signature) any {
	if sigs == nil {
		return nil
	}
	list := make([]any, len(sigs))
	for i, s := range sigs {
		list[i] = s.Value()
	}
	return list
}

func timeValue(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return FormatTime(t)
}
