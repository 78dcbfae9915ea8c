// Package deadletter is the dead-letter logic shared by `celeriac dlq` and
// `celeriac dashboard`: naming dead letters by store ID or task id, and
// decoding one for display. Both commands go through it so that a replay or
// purge selects the same messages whichever tool asked.
package deadletter

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// ResolveIDs maps the IDs a person gave to the store's IDs. A dead letter is
// named by its store ID (the task id on RabbitMQ, the delivery tag on
// Redis) or by its task id, so the same words work on both brokers. Every ID
// must name a dead letter: an empty result would mean "all" to Replay and
// PurgeDead. No IDs given returns nil (all).
func ResolveIDs(ctx context.Context, s transport.DeadLetterStore, queue string, given []string) ([]string, error) {
	if len(given) == 0 {
		return nil, nil
	}
	msgs, err := s.DeadLetters(ctx, queue, 0)
	if err != nil {
		return nil, err
	}
	var ids, missing []string
	for _, want := range given {
		found := false
		for _, m := range msgs {
			if want == "" || m.ID == "" || (m.ID != want && TaskID(m) != want) {
				continue
			}
			found = true
			if !slices.Contains(ids, m.ID) {
				ids = append(ids, m.ID)
			}
		}
		if !found {
			missing = append(missing, strconv.Quote(want))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("no dead letter %s in %s; nothing done", strings.Join(missing, ", "), queue)
	}
	return ids, nil
}

// TaskID is the task id of a dead letter: the one recorded with it, else the
// message's id header.
func TaskID(m transport.DeadMessage) string {
	if m.Reason.TaskID != "" {
		return m.Reason.TaskID
	}
	id, _ := m.Message.Headers["id"].(string)
	return id
}

// TaskName is the task name of a dead letter, from its reason or its task
// header.
func TaskName(m transport.DeadMessage) string {
	if m.Reason.TaskName != "" {
		return m.Reason.TaskName
	}
	name, _ := m.Message.Headers["task"].(string)
	return name
}

// Find returns the dead letter named id (store ID or task id) among msgs.
func Find(msgs []transport.DeadMessage, id string) (transport.DeadMessage, bool) {
	if id == "" {
		return transport.DeadMessage{}, false
	}
	for _, m := range msgs {
		if m.ID == id || TaskID(m) == id {
			return m, true
		}
	}
	return transport.DeadMessage{}, false
}

// Doc is one dead letter decoded for display, as `celeriac dlq show` prints
// it: the body decoded when its content type allows, else base64 and the
// decoding error.
func Doc(m transport.DeadMessage) map[string]any {
	// Celery's and AMQP's names, not Go's field names: this is what
	// operators compare with the message a producer sent.
	reason := map[string]any{"reason": m.Reason.Reason}
	for k, v := range map[string]string{"error": m.Reason.Error, "task_id": m.Reason.TaskID, "task_name": m.Reason.TaskName} {
		if v != "" {
			reason[k] = v
		}
	}
	if !m.Reason.Time.IsZero() {
		reason["time"] = m.Reason.Time.UTC().Format(time.RFC3339Nano)
	}
	p := m.Message.Properties
	props := map[string]any{}
	for k, v := range p.Extra {
		props[k] = JSONable(v)
	}
	for k, v := range map[string]string{"correlation_id": p.CorrelationID, "reply_to": p.ReplyTo, "expiration": p.Expiration} {
		if v != "" {
			props[k] = v
		}
	}
	if p.DeliveryMode != 0 {
		props["delivery_mode"] = int64(p.DeliveryMode)
	}
	if p.Priority != 0 {
		props["priority"] = int64(p.Priority)
	}
	doc := map[string]any{
		"id": m.ID, "queue": m.Queue, "exchange": m.Exchange, "routing_key": m.RoutingKey,
		"reason": reason, "content_type": m.Message.ContentType,
		"headers": JSONable(m.Message.Headers), "properties": props,
	}
	if v, err := protocol.Unmarshal(m.Message.ContentType, m.Message.Body, protocol.DecodeOptions{}); err == nil {
		doc["body"] = JSONable(v)
	} else {
		doc["body_base64"] = base64.StdEncoding.EncodeToString(m.Message.Body)
		doc["body_error"] = err.Error()
	}
	return doc
}

// JSONable turns decoded message values into what encoding/json can print:
// values of types JSON has no name for become their fmt.Sprint text.
func JSONable(v any) any {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = JSONable(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = JSONable(e)
		}
		return out
	case nil, bool, int64, float64, string:
		return v
	}
	return fmt.Sprint(v)
}
