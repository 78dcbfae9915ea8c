package deadletter

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// TestDocNames: a dead letter is shown with Celery's and AMQP's names
// (correlation_id, reply_to, reason.error), never Go's field names.
func TestDocNames(t *testing.T) {
	m := transport.DeadMessage{ID: "7", Queue: "q", RoutingKey: "q",
		Message: protocol.Message{ContentType: "application/json", Body: []byte(`[[1], {}, {}]`),
			Headers: map[string]any{"id": "t1", "task": "tasks.add"},
			Properties: protocol.Properties{CorrelationID: "t1", ReplyTo: "r", DeliveryMode: 2, Priority: 3,
				Extra: map[string]any{"origin": "gen1@host"}}},
		Reason: transport.DeadLetterReason{Reason: "max-retries", Error: "ValueError('x')", TaskID: "t1",
			Time: time.Date(2026, 12, 4, 1, 2, 3, 0, time.UTC)}}
	b, err := json.Marshal(Doc(m))
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	for _, want := range []string{`"correlation_id":"t1"`, `"reply_to":"r"`, `"delivery_mode":2`, `"priority":3`, `"origin":"gen1@host"`,
		`"reason":{"error":"ValueError('x')","reason":"max-retries","task_id":"t1","time":"2026-12-04T01:02:03Z"}`, `"body":[[1],{},{}]`} {
		if !strings.Contains(got, want) {
			t.Errorf("doc lacks %s:\n%s", want, got)
		}
	}
	for _, goName := range []string{"CorrelationID", "ReplyTo", "DeliveryMode", `"Reason"`, `"Error"`, "Extra"} {
		if strings.Contains(got, goName) {
			t.Errorf("doc shows Go's name %s:\n%s", goName, got)
		}
	}
}
