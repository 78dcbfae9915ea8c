package redis_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/celeriac/celeriac/backend"
	redisbackend "github.com/celeriac/celeriac/backend/redis"
)

// The result backend of a Celery app whose result_backend is
// "redis://127.0.0.1:6379/1": a worker stores task states in it
// (worker.Config.Backend), and Get reads one as Python's
// AsyncResult(task_id).state does. (It needs Redis, so it only compiles.)
func ExampleNew() {
	ctx := context.Background()
	results, err := redisbackend.New(redisbackend.Config{URL: "redis://127.0.0.1:6379/1"})
	if err != nil {
		log.Fatal(err)
	}
	defer results.Close()

	m, err := results.Get(ctx, "7f1c2e0a-2d1b-4c4e-9a57-0d7e4f0c8b11")
	switch {
	case errors.Is(err, backend.ErrNotFound):
		fmt.Println("PENDING") // nothing stored yet, or the result expired
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println(m.Status, m.Result)
	}
}
