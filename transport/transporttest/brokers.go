package transporttest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"testing"
	"time"
)

// Environment variables that point tests at brokers.
const (
	// EnvAMQPURL overrides the RabbitMQ URL (default amqp://guest:guest@127.0.0.1:5672//).
	EnvAMQPURL = "CELERIAC_AMQP_URL"
	// EnvRedisURL overrides the Redis URL (default redis://127.0.0.1:6379); tests
	// replace its db number with their own.
	EnvRedisURL = "CELERIAC_REDIS_URL"
	// EnvRequireBrokers, when "1", turns a missing broker into a test failure
	// instead of a skip. CI sets it so that green means the broker tests ran.
	EnvRequireBrokers = "CELERIAC_REQUIRE_BROKERS"
	// EnvPostgresURL overrides the PostgreSQL URL of the database result
	// backends' tests (default postgres://celeriac:celeriac@127.0.0.1:5432/celeriac,
	// the role and database .ci/setup creates).
	EnvPostgresURL = "CELERIAC_POSTGRES_URL"
)

// PostgresURL returns the PostgreSQL URL for database backend tests, found
// like AMQPURL. Tests isolate themselves in their own schemas.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return brokerURL(t, EnvPostgresURL, "postgres://celeriac:celeriac@127.0.0.1:5432/celeriac")
}

// AMQPURL returns the RabbitMQ URL for broker tests: $CELERIAC_AMQP_URL, else
// the local default when it accepts connections. Otherwise the test is skipped
// (or fails under CELERIAC_REQUIRE_BROKERS=1). The integration module adds a
// testcontainers fallback; this package stays free of Docker dependencies.
func AMQPURL(t testing.TB) string {
	t.Helper()
	return brokerURL(t, EnvAMQPURL, "amqp://guest:guest@127.0.0.1:5672//")
}

// RedisURL returns the Redis URL for broker tests with the given db number,
// found like AMQPURL. Each test package uses its own db numbers.
func RedisURL(t testing.TB, db int) string {
	t.Helper()
	raw := brokerURL(t, EnvRedisURL, "redis://127.0.0.1:6379")
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("transporttest: bad %s: %v", EnvRedisURL, err)
	}
	u.Path = fmt.Sprintf("/%d", db)
	return u.String()
}

func brokerURL(t testing.TB, env, local string) string {
	t.Helper()
	if u := os.Getenv(env); u != "" {
		return u
	}
	u, err := url.Parse(local)
	if err == nil {
		if c, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
			c.Close()
			return local
		}
	}
	msg := fmt.Sprintf("transporttest: no broker at %s and %s is unset", local, env)
	if os.Getenv(EnvRequireBrokers) == "1" {
		t.Fatalf("%s (%s=1)", msg, EnvRequireBrokers)
	}
	t.Skipf("%s; start it with .ci/setup", msg)
	return ""
}
