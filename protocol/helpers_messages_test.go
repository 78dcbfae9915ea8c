package protocol_test

import (
	"encoding/base64"
	"encoding/json"
	"math/big"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/protocol"
)

// goldenDir holds the captures made by testdata/capture/capture.py.
const goldenDir = "testdata/golden"

func readGolden(tb testing.TB, name string) []byte {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(goldenDir, name))
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// captureManifest is testdata/golden/captures.json: what capture.py
// recorded next to the files, including the values that change between
// runs (origin, reply_to).
type captureManifest struct {
	FixedNow  string                     `json:"fixed_now"`
	Scenarios map[string]captureScenario `json:"scenarios"`
	Results   map[string]string          `json:"results"`
}

type captureScenario struct {
	Description   string                       `json:"description"`
	Queue         string                       `json:"queue"`
	Files         map[string][]string          `json:"files"`
	Origin        string                       `json:"origin"`
	ReplyTo       map[string]string            `json:"reply_to"`
	RedisKeys     []string                     `json:"redis_keys"`
	TaskID        string                       `json:"task_id"`
	ParentID      string                       `json:"parent_id"`
	AMQPTaskID    string                       `json:"amqp_task_id"`
	ChordSizeKeys map[string]map[string]string `json:"chord_size_keys"`
}

// loadManifestOf reads the captures.json of one Celery version's set.
func loadManifestOf(tb testing.TB, set goldenSet) captureManifest {
	tb.Helper()
	var m captureManifest
	if err := json.Unmarshal(readGolden(tb, set.file("captures.json")), &m); err != nil {
		tb.Fatalf("%s captures.json: %v", set.name, err)
	}
	return m
}

// mustReadGolden is readGolden for expectations built outside a test.
func mustReadGolden(name string) []byte {
	data, err := os.ReadFile(filepath.Join(goldenDir, name))
	if err != nil {
		panic(err)
	}
	return data
}

// amqpCapture is one <scenario>.amqp.json: the parts py-amqp's basic_get
// returned.
type amqpCapture struct {
	Message      *protocol.Message
	DeliveryInfo protocol.DeliveryInfo
}

// loadAMQP rebuilds the protocol.Message an AMQP transport would hand
// over. The file is read with protocol.Unmarshal so that header values
// have the package's value types (int64, not float64).
func loadAMQP(tb testing.TB, name string) amqpCapture {
	tb.Helper()
	v, err := protocol.Unmarshal(protocol.ContentTypeJSON, readGolden(tb, name), protocol.DecodeOptions{})
	if err != nil {
		tb.Fatalf("%s: %v", name, err)
	}
	doc := v.(map[string]any)
	props := doc["properties"].(map[string]any)
	di := doc["delivery_info"].(map[string]any)
	body, err := base64.StdEncoding.DecodeString(doc["body"].(string))
	if err != nil {
		tb.Fatalf("%s body: %v", name, err)
	}
	str := func(m map[string]any, k string) string { s, _ := m[k].(string); return s }
	num := func(m map[string]any, k string) int64 { n, _ := m[k].(int64); return n }
	m := &protocol.Message{
		ContentType:     str(props, "content_type"),
		ContentEncoding: str(props, "content_encoding"),
		Headers:         doc["headers"].(map[string]any),
		Properties: protocol.Properties{
			CorrelationID: str(props, "correlation_id"),
			ReplyTo:       str(props, "reply_to"),
			DeliveryMode:  uint8(num(props, "delivery_mode")),
			Priority:      int(num(props, "priority")),
			Expiration:    str(props, "expiration"),
		},
		Body: body,
	}
	return amqpCapture{
		Message: m,
		DeliveryInfo: protocol.DeliveryInfo{
			Exchange:    str(di, "exchange"),
			RoutingKey:  str(di, "routing_key"),
			Redelivered: di["redelivered"] == true,
		},
	}
}

// loadRedis decodes a <scenario>.redis.json envelope.
func loadRedis(tb testing.TB, name string) *protocol.Envelope {
	tb.Helper()
	env, err := protocol.DecodeEnvelope(readGolden(tb, name), protocol.DecodeOptions{})
	if err != nil {
		tb.Fatalf("DecodeEnvelope(%s): %v", name, err)
	}
	return env
}

// rawDoc parses a golden JSON document generically, to read values that
// differ between capture runs (dates, pids) as the expectation.
func rawDoc(tb testing.TB, data []byte) map[string]any {
	tb.Helper()
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		tb.Fatal(err)
	}
	return m
}

func ptr[T any](v T) *T { return &v }

// goldenFiles lists the golden files whose names end in suffix.
func goldenFiles(tb testing.TB, suffix string) []string {
	tb.Helper()
	entries, err := os.ReadDir(goldenDir)
	if err != nil {
		tb.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if n := e.Name(); len(n) > len(suffix) && n[len(n)-len(suffix):] == suffix {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		tb.Fatalf("no %s files in %s", suffix, goldenDir)
	}
	return names
}

// valueDiff is cmp.Diff for decoded values: *big.Int compares by value
// (it has unexported fields), times by instant (cmp uses Time.Equal).
func valueDiff(want, got any, opts ...cmp.Option) string {
	opts = append(opts, cmp.Comparer(func(a, b *big.Int) bool {
		if a == nil || b == nil {
			return a == b
		}
		return a.Cmp(b) == 0
	}))
	return cmp.Diff(want, got, opts...)
}
