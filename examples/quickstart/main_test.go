package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport/transporttest"
	celeryconnect "github.com/celeriac/celeriac/worker/connect"
)

// TestDemo keeps the README's demo command working: the whole demo on the
// embedded broker, and against Redis and RabbitMQ, each task reaching the
// state and result it shows.
func TestDemo(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		t.Setenv("CELERY_BROKER_URL", "")
		t.Setenv("CELERY_RESULT_BACKEND", "")
		checkDemo(t)
	})
	for _, name := range []string{"redis", "rabbitmq"} {
		t.Run(name, func(t *testing.T) {
			results := transporttest.RedisURL(t, demoRedisDB)
			broker := results
			if name == "rabbitmq" {
				broker = transporttest.AMQPURL(t)
			}
			queue := fmt.Sprintf("quickstart_test_%d", time.Now().UnixNano())
			t.Setenv("CELERY_BROKER_URL", broker)
			t.Setenv("CELERY_RESULT_BACKEND", results)
			t.Setenv("CELERY_QUEUE", queue)
			t.Cleanup(func() { deleteQueue(t, broker, queue) })
			checkDemo(t)
		})
	}
}

// demoRedisDB is shared with the cmd/celeriac tests; queue names are unique.
const demoRedisDB = 1

func checkDemo(t *testing.T) {
	rows, err := demo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		status protocol.State
		show   string
	}{
		{protocol.StateSuccess, "5"},
		{protocol.StateSuccess, "{'top': {'age': 2, 'it': 8, 'of': 8, 'the': 8, 'was': 8}, 'words': 16}"},
		{protocol.StateSuccess, "148933"},
		{protocol.StateSuccess, "'14b4bd196927880da257f3a9149add1354a1404d794b5f4fa76f9009718d57e8'"},
		{protocol.StateFailure, "ValueError('bad input')"},
		{protocol.StateSuccess, "'succeeded after 2 retries'"},
		{protocol.StateSuccess, "42"},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(rows), len(want))
	}
	for i, w := range want {
		if rows[i].meta.Status != w.status || show(rows[i].meta) != w.show {
			t.Errorf("%s: %s %s, want %s %s", rows[i].label, rows[i].meta.Status, show(rows[i].meta), w.status, w.show)
		}
	}
}

func deleteQueue(t *testing.T, broker, queue string) {
	switch celeryconnect.Scheme(broker) {
	case "amqp":
		conn, err := amqp091.Dial(broker)
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(queue, false, false)
	case "redis":
		opt, err := goredis.ParseURL(broker)
		if err != nil {
			return
		}
		rdb := goredis.NewClient(opt)
		defer rdb.Close()
		rdb.Del(context.Background(), queue, "_kombu.binding."+queue)
	}
}
