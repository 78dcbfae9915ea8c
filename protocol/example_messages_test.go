package protocol_test

import (
	"fmt"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

// A Redis list item as Celery 5.2 publishes add.delay(2, 3).
const delayItem = `{"body": "W1syLCAzXSwge30sIHsiY2FsbGJhY2tzIjogbnVsbCwgImVycmJhY2tzIjogbnVsbCwgImNoYWluIjogbnVsbCwgImNob3JkIjogbnVsbH1d", "content-encoding": "utf-8", "content-type": "application/json", "headers": {"lang": "py", "task": "tasks.add", "id": "11111111-1111-1111-1111-111111111111", "shadow": null, "eta": "2030-01-02T03:04:15.123456+05:30", "expires": null, "group": null, "group_index": null, "retries": 0, "timelimit": [30, null], "root_id": "11111111-1111-1111-1111-111111111111", "parent_id": null, "argsrepr": "(2, 3)", "kwargsrepr": "{}", "origin": "gen8098@vm", "ignore_result": false}, "properties": {"correlation_id": "11111111-1111-1111-1111-111111111111", "reply_to": "2731d639-4e7d-349f-9ccc-abfd40bea425", "delivery_mode": 2, "delivery_info": {"exchange": "", "routing_key": "celery"}, "priority": 0, "body_encoding": "base64", "delivery_tag": "ca8250cf-342b-454d-a6b2-ca33b50e405a"}}`

func ExampleDecodeTask() {
	env, err := protocol.DecodeEnvelope([]byte(delayItem), protocol.DecodeOptions{})
	if err != nil {
		panic(err)
	}
	t, err := protocol.DecodeTask(&env.Message, protocol.DecodeOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println(t.Name, t.ID, t.Args, t.Kwargs)
	fmt.Println("eta:", t.ETA.UTC(), "hard limit:", t.TimeLimit)
	fmt.Println("queue:", env.DeliveryInfo.RoutingKey, "reply_to:", t.ReplyTo)
	// Output:
	// tasks.add 11111111-1111-1111-1111-111111111111 [2 3] map[]
	// eta: 2030-01-01 21:34:15.123456 +0000 UTC hard limit: 30s
	// queue: celery reply_to: 2731d639-4e7d-349f-9ccc-abfd40bea425
}

func ExampleEncodeTask() {
	msg, err := protocol.EncodeTask(&protocol.TaskMessage{
		ID:     "22222222-2222-2222-2222-222222222222",
		Name:   "tasks.add",
		Args:   []any{int64(2), int64(3)},
		ETA:    time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC),
		Origin: "w1@host",
	}, protocol.EncodeOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println(msg.ContentType, msg.Properties.CorrelationID, msg.Properties.DeliveryMode)
	for _, k := range []string{"lang", "task", "eta", "root_id", "argsrepr", "timelimit", "ignore_result"} {
		fmt.Printf("%s=%v\n", k, msg.Headers[k])
	}
	fmt.Println(string(msg.Body))
	// Output:
	// application/json 22222222-2222-2222-2222-222222222222 2
	// lang=go
	// task=tasks.add
	// eta=2030-01-02T03:04:05+00:00
	// root_id=22222222-2222-2222-2222-222222222222
	// argsrepr=(2, 3)
	// timelimit=[<nil> <nil>]
	// ignore_result=<nil>
	// [[2, 3], {}, {"callbacks": null, "chain": null, "chord": null, "errbacks": null}]
}

func ExampleEncodeResult() {
	data, err := protocol.EncodeResult(&protocol.ResultMeta{
		TaskID:   "22222222-2222-2222-2222-222222222222",
		Status:   protocol.StateFailure,
		Result:   &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad thing"}, Module: "builtins"},
		DateDone: time.Date(2026, 11, 29, 13, 13, 56, 22287000, time.UTC),
	}, protocol.ContentTypeJSON)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(data))
	// Output:
	// {"status": "FAILURE", "result": {"exc_type": "ValueError", "exc_message": ["bad thing"], "exc_module": "builtins"}, "traceback": null, "children": [], "date_done": "2026-11-29T13:13:56.022287", "task_id": "22222222-2222-2222-2222-222222222222"}
}

func ExampleSignature_Link() {
	s, err := protocol.DecodeSignature(map[string]any{
		"task": "tasks.add", "args": []any{int64(1)},
		"options": map[string]any{"task_id": "33333333-3333-3333-3333-333333333333", "link": map[string]any{"task": "tasks.tsum"}},
	})
	if err != nil {
		panic(err)
	}
	links, err := s.Link()
	if err != nil {
		panic(err)
	}
	fmt.Println(s.Task, s.TaskID(), len(links), links[0].Task)
	// Output:
	// tasks.add 33333333-3333-3333-3333-333333333333 1 tasks.tsum
}
