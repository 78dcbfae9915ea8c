package connect_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/celeriac/celeriac/backend"
	membackend "github.com/celeriac/celeriac/backend/memory"
	redisbackend "github.com/celeriac/celeriac/backend/redis"
	"github.com/celeriac/celeriac/transport/transporttest"
	"github.com/celeriac/celeriac/worker/connect"
)

// rateLimitDB is the Redis db of the rate-limit tests; the buckets these
// tests touch have unique names and vanish by TTL within seconds.
const rateLimitDB = 6

func TestOpenRateLimiter(t *testing.T) {
	redisURL := transporttest.RedisURL(t, rateLimitDB)
	for _, tt := range []struct {
		name    string
		o       connect.Options
		want    string // "redis-backend", "redis-own", "memory", "none"
		wantErr string
	}{
		{"redis result backend", connect.Options{ResultBackend: redisURL}, "redis-backend", ""},
		{"own redis url", connect.Options{ResultBackend: "memory://", RateLimitURL: redisURL}, "redis-own", ""},
		{"own url overrides the backend", connect.Options{ResultBackend: redisURL, RateLimitURL: redisURL}, "redis-own", ""},
		{"memory result backend", connect.Options{ResultBackend: "memory://"}, "memory", ""},
		{"memory url", connect.Options{RateLimitURL: "memory://"}, "memory", ""},
		{"no backend", connect.Options{}, "none", ""},
		{"bad scheme", connect.Options{RateLimitURL: "amqp://guest:secret@localhost//"}, "", "unsupported rate limit URL scheme"},
		{"not a url", connect.Options{RateLimitURL: "localhost"}, "", "not a URL"},
		{"unreachable", connect.Options{RateLimitURL: "redis://127.0.0.1:1/0?dial_timeout=100ms"}, "", "rate limit URL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if tt.o.BrokerURL == "" {
				tt.o.BrokerURL = "memory://"
			}
			c, err := connect.Open(ctx, tt.o)
			if tt.wantErr != "" {
				if err == nil {
					c.Close()
					t.Fatal("Open succeeded")
				}
				if !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "secret") {
					t.Fatalf("err = %v, want %q without the password", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := c.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			var got string
			switch l := c.RateLimiter.(type) {
			case nil:
				got = "none"
			case *membackend.RateLimiter:
				got = "memory"
			case *redisbackend.Backend:
				got = "redis-own"
				if backend.Backend(l) == c.Backend {
					got = "redis-backend"
				}
			default:
				t.Fatalf("RateLimiter is a %T", l)
			}
			if got != tt.want {
				t.Fatalf("rate limiter %s, want %s", got, tt.want)
			}
			if c.RateLimiter != nil {
				name := "connect-test-" + strings.ReplaceAll(t.Name(), "/", "-")
				if _, err := c.RateLimiter.Reserve(ctx, name, 1, time.Second, 1); err != nil {
					t.Errorf("Reserve: %v", err)
				}
			}
		})
	}
}

func TestFromEnvRateLimitURL(t *testing.T) {
	t.Setenv("CELERIAC_RATE_LIMIT_URL", "redis://example:6379/6")
	if got := connect.FromEnv(connect.Options{}).RateLimitURL; got != "redis://example:6379/6" {
		t.Errorf("RateLimitURL = %q", got)
	}
	if got := connect.FromEnv(connect.Options{RateLimitURL: "memory://"}).RateLimitURL; got != "memory://" {
		t.Errorf("an explicit RateLimitURL was replaced: %q", got)
	}
}
