package protocol_test

import (
	"testing"

	"github.com/celeriac/celeriac/protocol"
)

// The benchmarks use the "delay" capture: add.delay(2, 3) as Celery 5.2
// publishes it, the typical v2 JSON message.

func BenchmarkDecodeTask(b *testing.B) {
	env := loadRedis(b, "delay.redis.json")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := protocol.DecodeTask(&env.Message, protocol.DecodeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeTask(b *testing.B) {
	env := loadRedis(b, "delay.redis.json")
	m, err := protocol.DecodeTask(&env.Message, protocol.DecodeOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := protocol.EncodeTask(m, protocol.EncodeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeEnvelope(b *testing.B) {
	data := readGolden(b, "delay.redis.json")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := protocol.DecodeEnvelope(data, protocol.DecodeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeEnvelope(b *testing.B) {
	env := loadRedis(b, "delay.redis.json")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := protocol.EncodeEnvelope(env); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeResult(b *testing.B) {
	m, err := protocol.DecodeResult(readGolden(b, "result_success.json"), protocol.ContentTypeJSON, protocol.DecodeOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := protocol.EncodeResult(m, protocol.ContentTypeJSON); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeResult(b *testing.B) {
	data := readGolden(b, "result_success.json")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := protocol.DecodeResult(data, protocol.ContentTypeJSON, protocol.DecodeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
