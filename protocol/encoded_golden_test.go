package protocol_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

// update rewrites testdata/encoded from the encoders' current output:
// go test ./protocol -run TestEncodedGolden -update, then review git diff.
var update = flag.Bool("update", false, "rewrite testdata/encoded golden files")

const encodedDir = "testdata/encoded"

// encodedGolden compares got with testdata/encoded/name, or rewrites the
// file under -update.
func encodedGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join(encodedDir, name)
	if *update {
		if err := os.MkdirAll(encodedDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./protocol -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s changed (go test ./protocol -update rewrites it; review the diff):\ngot:\n%s\nwant:\n%s", name, got, want)
	}
}

// encodedTask is a message using every header EncodeTask writes.
func encodedTask() protocol.TaskMessage {
	eta := time.Date(2030, 1, 2, 3, 4, 5, 123456000, time.FixedZone("", 5*3600+1800))
	return protocol.TaskMessage{
		ID:            "c0000000-0000-4000-8000-000000000001",
		Name:          "tasks.add",
		Shadow:        "tasks.alias",
		ETA:           eta,
		Expires:       eta.Add(time.Hour),
		Group:         "c0000000-0000-4000-8000-000000000002",
		GroupIndex:    ptr(1),
		Retries:       1,
		TimeLimit:     30 * time.Second,
		SoftTimeLimit: 20500 * time.Millisecond,
		RootID:        "c0000000-0000-4000-8000-000000000003",
		ParentID:      "c0000000-0000-4000-8000-000000000004",
		Origin:        "celeriac@host",
		IgnoreResult:  ptr(false),
		Headers:       map[string]any{"x-custom": "v", "ts": int64(1700000000000)},
		Args:          []any{int64(2), "три", 1.5, nil},
		Kwargs:        map[string]any{"nested": map[string]any{"a": []any{true}}},
		Embed: protocol.Embed{
			Callbacks: []protocol.Signature{{Task: "tasks.tsum", Options: map[string]any{"task_id": "c0000000-0000-4000-8000-000000000005"}}},
			Chain:     []protocol.Signature{{Task: "tasks.mul", Args: []any{int64(3)}, Options: map[string]any{"task_id": "c0000000-0000-4000-8000-000000000006"}}},
			Chord:     &protocol.Signature{Task: "tasks.body", Immutable: true},
		},
		ReplyTo:    "d0000000-0000-3000-8000-000000000001",
		Priority:   3,
		Expiration: "3600000",
	}
}

// TestEncodedGolden pins the bytes of the encoders: a Redis envelope for a
// full task message in each serializer, a re-published Python capture and
// result-meta documents. A change here changes what Python receives.
func TestEncodedGolden(t *testing.T) {
	envelope := func(t *testing.T, m *protocol.TaskMessage, opts protocol.EncodeOptions) []byte {
		t.Helper()
		msg, err := protocol.EncodeTask(m, opts)
		if err != nil {
			t.Fatal(err)
		}
		data, err := protocol.EncodeEnvelope(&protocol.Envelope{
			Message: *msg, BodyEncoding: protocol.BodyEncodingBase64,
			DeliveryTag:  "e0000000-0000-4000-8000-000000000001",
			DeliveryInfo: protocol.DeliveryInfo{RoutingKey: "celery"},
		})
		if err != nil {
			t.Fatal(err)
		}
		return append(data, '\n')
	}
	t.Run("task_json", func(t *testing.T) {
		m := encodedTask()
		encodedGolden(t, "task_json.redis.json", envelope(t, &m, protocol.EncodeOptions{}))
	})
	t.Run("task_msgpack", func(t *testing.T) {
		m := encodedTask()
		encodedGolden(t, "task_msgpack.redis.json", envelope(t, &m, protocol.EncodeOptions{ContentType: protocol.ContentTypeMsgpack}))
	})
	t.Run("task_json_zlib", func(t *testing.T) {
		m := encodedTask()
		encodedGolden(t, "task_json_zlib.redis.json", envelope(t, &m, protocol.EncodeOptions{Compression: protocol.CompressionZlib}))
	})
	t.Run("task_minimal", func(t *testing.T) {
		m := protocol.TaskMessage{ID: "c0000000-0000-4000-8000-000000000009", Name: "tasks.add", Args: []any{int64(2), int64(3)}}
		encodedGolden(t, "task_minimal.redis.json", envelope(t, &m, protocol.EncodeOptions{}))
	})
	t.Run("republished_chain", func(t *testing.T) {
		// What we write when forwarding Python's chain message unchanged.
		env := loadRedis(t, "chain.redis.json")
		m, err := protocol.DecodeTask(&env.Message, protocol.DecodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m.Origin, m.ReplyTo = "gen1@vm", "d0000000-0000-3000-8000-000000000001" // vary per capture run
		for i := range m.Embed.Chain {
			m.Embed.Chain[i].Options["reply_to"] = m.ReplyTo
		}
		encodedGolden(t, "republished_chain.redis.json", envelope(t, m, protocol.EncodeOptions{}))
	})
	results := []struct {
		name string
		ct   string
		m    protocol.ResultMeta
	}{
		{"result_success.json", protocol.ContentTypeJSON, protocol.ResultMeta{
			TaskID: "c0000000-0000-4000-8000-000000000001", Status: protocol.StateSuccess, Result: map[string]any{"sum": int64(5)},
			Children: []any{protocol.ChildTuple("c0000000-0000-4000-8000-000000000005")},
			DateDone: time.Date(2026, 11, 29, 13, 13, 56, 22287000, time.UTC), ParentID: "c0000000-0000-4000-8000-000000000004"}},
		{"result_failure_extended.json", protocol.ContentTypeJSON, protocol.ResultMeta{
			TaskID: "c0000000-0000-4000-8000-000000000001", Status: protocol.StateFailure,
			Result:    &protocol.ExceptionInfo{Type: "ValueError", Message: []any{"bad", int64(42)}, Module: "builtins"},
			Traceback: "Traceback (most recent call last):\n  File \"handler.go\", line 1\nValueError: bad\n",
			DateDone:  time.Date(2026, 11, 29, 13, 13, 56, 0, time.UTC), GroupID: "c0000000-0000-4000-8000-000000000002",
			Extended: true, Name: "tasks.add", Args: []any{int64(2)}, Kwargs: map[string]any{"y": int64(3)},
			Worker: "celeriac@host", Retries: 1, Queue: "celery"}},
		{"result_started.msgpack", protocol.ContentTypeMsgpack, protocol.ResultMeta{
			TaskID: "c0000000-0000-4000-8000-000000000001", Status: protocol.StateStarted,
			Result: map[string]any{"pid": int64(4242), "hostname": "celeriac@host"}}},
	}
	for _, r := range results {
		t.Run(r.name, func(t *testing.T) {
			data, err := protocol.EncodeResult(&r.m, r.ct)
			if err != nil {
				t.Fatal(err)
			}
			if r.ct == protocol.ContentTypeJSON {
				data = append(data, '\n')
			}
			encodedGolden(t, r.name, data)
		})
	}
}
