package redis_test

import (
	"context"
	"fmt"
	"time"

	"github.com/celeriac/celeriac/backend"
	redisbackend "github.com/celeriac/celeriac/backend/redis"
)

// A task's side effect guarded by hand with the store; worker.Idempotent
// does this (plus lease renewal) around a handler. Needs a Redis server,
// so it is compiled but not run.
func ExampleBackend_Claim() {
	ctx := context.Background()
	be, err := redisbackend.New(redisbackend.Config{URL: "redis://127.0.0.1:6379/1"})
	if err != nil {
		panic(err)
	}
	defer be.Close()
	const key, owner = "payments.charge:order-42", "celery@host/task-id/run-id"
	c, err := be.Claim(ctx, key, owner, time.Minute)
	if err != nil {
		panic(err)
	}
	switch c.State {
	case backend.Done:
		fmt.Printf("already charged: %s\n", c.Result)
	case backend.Busy:
		fmt.Printf("another worker is charging; ask again in %v\n", c.Retry)
	case backend.Claimed:
		// ... charge with Idempotency-Key: order-42, then record the result:
		if err := be.Complete(ctx, key, owner, []byte(`{"charge_id": "ch_1"}`), 24*time.Hour); err != nil {
			panic(err)
		}
	}
}
