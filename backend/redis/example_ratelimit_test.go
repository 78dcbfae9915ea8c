package redis_test

import (
	"context"
	"time"

	redisbackend "github.com/celeriac/celeriac/backend/redis"
)

// A global limit used by hand: every process calling an API through the
// same bucket waits its turn, 5 calls a second in all. The worker does this
// for tasks registered with worker.GlobalRateLimit, holding the task without
// a slot while it waits. Needs a Redis server, so it is compiled but not
// run.
func ExampleBackend_Reserve() {
	ctx := context.Background()
	be, err := redisbackend.New(redisbackend.Config{URL: "redis://127.0.0.1:6379/1"})
	if err != nil {
		panic(err)
	}
	defer be.Close()
	for range 10 {
		wait, err := be.Reserve(ctx, "sms-api", 5, time.Second, 1)
		if err != nil {
			panic(err) // or go on without the limit, as the worker does
		}
		time.Sleep(wait) // 0 the first time, then about 200 ms each
		// ... call the API
	}
}
