package worker_test

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	membackend "github.com/celeriac/celeriac/backend/memory"
	"github.com/celeriac/celeriac/transport/memory"
	"github.com/celeriac/celeriac/worker"
)

// TestGlobalRateLimitWithoutLimiterWarns: a global limit the worker cannot
// enforce is named in the log when the worker is created.
func TestGlobalRateLimitWithoutLimiterWarns(t *testing.T) {
	for _, tt := range []struct {
		name    string
		limiter bool
		want    int
	}{
		{"no limiter", false, 1},
		{"limiter", true, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zap.WarnLevel)
			tr := memory.New(memory.Config{})
			defer tr.Close()
			mux := worker.NewMux()
			mux.HandleFunc("sms.send", add, worker.GlobalRateLimit("5/s", "sms-api", 1))
			mux.HandleFunc("tasks.add", add)
			cfg := worker.Config{Logger: zap.New(core)}
			if tt.limiter {
				cfg.GlobalRateLimiter = membackend.NewRateLimiter()
			}
			if _, err := worker.New(tr, mux, cfg); err != nil {
				t.Fatal(err)
			}
			got := logs.FilterMessageSnippet("global rate limit").FilterField(zap.String("task_name", "sms.send"))
			if got.Len() != tt.want || logs.Len() != tt.want {
				t.Errorf("%d warnings about sms.send (%d in all), want %d: %v", got.Len(), logs.Len(), tt.want, logs.All())
			}
		})
	}
}
