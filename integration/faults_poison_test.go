package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
)

// poison is one malformed or hostile message of the fault suite, described
// independently of the broker.
type poison struct {
	kind string
	id   string
	// headers are the Celery message headers (nil values left out, so that
	// both brokers carry them).
	headers     map[string]any
	contentType string
	encoding    string
	body        []byte
	// rawBody, for Redis only, replaces the base64 body of the envelope.
	rawBody string
	// wantReason is the reason the worker or the transport gives when it
	// dead-letters the message on Redis (RabbitMQ records "rejected").
	wantReason string
}

// pickleRCE is a protocol-0 pickle that runs os.system(cmd) when unpickled:
// what a worker that deserializes pickle would execute.
func pickleRCE(cmd string) []byte {
	return []byte("cos\nsystem\n(S'" + cmd + "'\ntR.")
}

func fltHeaders(name, id string) map[string]any {
	return map[string]any{
		"lang": "py", "task": name, "id": id, "root_id": id, "retries": int64(0),
		"argsrepr": "", "kwargsrepr": "", "origin": "flt-suite",
	}
}

func v2Body(args ...any) []byte {
	b, _ := json.Marshal([]any{args, map[string]any{}, map[string]any{"callbacks": nil, "errbacks": nil, "chain": nil, "chord": nil}})
	return b
}

// poisons returns the suite's poison messages for one round. marker is a
// file that the pickle payload would create if anything unpickled it.
// maxDepth is the worker's nesting bound.
func poisons(round int, redis bool, marker string, maxDepth int) []poison {
	id := func(kind string) string { return fmt.Sprintf("flt-poison-%s-%d", kind, round) }
	var out []poison
	add := func(p poison) {
		if p.contentType == "" {
			p.contentType = "application/json"
		}
		if p.encoding == "" {
			p.encoding = "utf-8"
		}
		out = append(out, p)
	}
	valid := v2Body("never", 0)

	add(poison{kind: "invalid-json", id: id("invalid-json"), headers: fltHeaders("flt.record", id("invalid-json")),
		body: []byte(`{"args": [1, 2,, ]`), wantReason: "invalid"})
	add(poison{kind: "truncated", id: id("truncated"), headers: fltHeaders("flt.record", id("truncated")),
		body: valid[:len(valid)/2], wantReason: "invalid"})
	add(poison{kind: "unknown-content-type", id: id("unknown-content-type"), headers: fltHeaders("flt.record", id("unknown-content-type")),
		contentType: "application/x-flt-unknown", body: valid, wantReason: "content-type"})
	add(poison{kind: "pickle", id: id("pickle"), headers: fltHeaders("flt.record", id("pickle")),
		contentType: "application/x-python-serialize", encoding: "binary", body: pickleRCE("touch " + marker), wantReason: "content-type"})
	h := fltHeaders("flt.record", id("unknown-compression"))
	h["compression"] = "application/x-flt-zstd"
	add(poison{kind: "unknown-compression", id: id("unknown-compression"), headers: h,
		body: []byte{0x28, 0xb5, 0x2f, 0xfd, 0, 1, 2, 3}, wantReason: "compression"})
	add(poison{kind: "unknown-task", id: id("unknown-task"), headers: fltHeaders("flt.nosuchtask", id("unknown-task")),
		body: v2Body("k", 0), wantReason: "not-registered"})
	add(poison{kind: "wrong-argument-types", id: id("wrong-argument-types"), headers: fltHeaders("flt.record", id("wrong-argument-types")),
		body: v2Body(map[string]any{"not": "a key"}, []any{"not", "a", "number"}), wantReason: "permanent"})
	add(poison{kind: "missing-headers", id: id("missing-headers"), headers: map[string]any{"lang": "py"},
		body: valid, wantReason: "invalid"})
	big := bytes.Repeat([]byte("x"), 10<<20)
	add(poison{kind: "10MB-body", id: id("10MB-body"), headers: fltHeaders("flt.record", id("10MB-body")),
		body: v2Body(string(big), 0), wantReason: "too-large"})
	depth := maxDepth * 4
	deep := strings.Repeat("[", depth) + strings.Repeat("]", depth)
	add(poison{kind: "too-deep", id: id("too-deep"), headers: fltHeaders("flt.record", id("too-deep")),
		body: []byte(`[[` + deep + `, 0], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]`), wantReason: "too-deep"})
	if redis {
		add(poison{kind: "bad-base64", id: id("bad-base64"), headers: fltHeaders("flt.record", id("bad-base64")),
			rawBody: "%%% not base64 %%%", wantReason: "undecodable"})
	}
	return out
}

// publishPoisonRedis LPUSHes a kombu envelope built by hand.
func publishPoisonRedis(ctx context.Context, t *testing.T, rdb *goredis.Client, queue string, p poison) {
	t.Helper()
	body := p.rawBody
	if body == "" {
		body = base64.StdEncoding.EncodeToString(p.body)
	}
	env := map[string]any{
		"body":             body,
		"content-encoding": p.encoding,
		"content-type":     p.contentType,
		"headers":          p.headers,
		"properties": map[string]any{
			"correlation_id": p.id,
			"reply_to":       "",
			"delivery_mode":  2,
			"delivery_info":  map[string]any{"exchange": queue, "routing_key": queue},
			"priority":       0,
			"body_encoding":  "base64",
			"delivery_tag":   "flt-tag-" + p.id,
		},
	}
	raw, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.LPush(ctx, queue, raw).Err(); err != nil {
		t.Fatalf("publish poison %s: %v", p.kind, err)
	}
}

// publishPoisonAMQP publishes through the default exchange, as Celery
// would, bypassing every client-side check.
func publishPoisonAMQP(ctx context.Context, t *testing.T, ch *amqp091.Channel, queue string, p poison) {
	t.Helper()
	err := ch.PublishWithContext(ctx, "", queue, false, false, amqp091.Publishing{
		ContentType: p.contentType, ContentEncoding: p.encoding, Headers: amqp091.Table(p.headers),
		CorrelationId: p.id, DeliveryMode: amqp091.Persistent, Body: p.body,
	})
	if err != nil {
		t.Fatalf("publish poison %s: %v", p.kind, err)
	}
}
