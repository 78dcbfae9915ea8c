package integration

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// requireBrokers makes a missing broker or Python a failure instead of a
// skip. CI sets it: a green run must mean the interop tests ran.
func requireBrokers() bool { return os.Getenv("CELERIAC_REQUIRE_BROKERS") == "1" }

// unavailable skips or fails the test, depending on requireBrokers.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if requireBrokers() {
		t.Fatalf("%s (CELERIAC_REQUIRE_BROKERS=1)", msg)
	}
	t.Skipf("%s; set CELERIAC_AMQP_URL / CELERIAC_REDIS_URL, start the local brokers (.ci/setup) or run Docker", msg)
}

// brokerCache remembers, per broker kind, the URL found by the first test
// that asked, so that discovery (and a container start) happens once.
var brokerCache = struct {
	sync.Mutex
	urls map[string]string
	errs map[string]error
}{urls: map[string]string{}, errs: map[string]error{}}

// amqpURL returns the URL of a RabbitMQ broker for the test.
func amqpURL(t testing.TB) string {
	t.Helper()
	return findBroker(t, "amqp", "CELERIAC_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//",
		"rabbitmq:3.13-alpine", "5672/tcp", func(hostPort string) string {
			return "amqp://guest:guest@" + hostPort + "//"
		})
}

// redisURL returns the URL of a Redis server for the test, without a db
// path; callers add their own db number with redisDBURL.
func redisURL(t testing.TB) string {
	t.Helper()
	return findBroker(t, "redis", "CELERIAC_REDIS_URL", "redis://127.0.0.1:6379",
		"redis:7-alpine", "6379/tcp", func(hostPort string) string {
			return "redis://" + hostPort
		})
}

// redisDBURL returns redisURL with the db number set. Each test file uses
// its own db numbers (see the table in docs/testing.md).
func redisDBURL(t testing.TB, db int) string {
	t.Helper()
	u, err := url.Parse(redisURL(t))
	if err != nil {
		t.Fatalf("redis url: %v", err)
	}
	u.Path = fmt.Sprintf("/%d", db)
	return u.String()
}

func findBroker(t testing.TB, kind, env, local, image, port string, mk func(hostPort string) string) string {
	t.Helper()
	brokerCache.Lock()
	defer brokerCache.Unlock()
	if u, ok := brokerCache.urls[kind]; ok {
		return u
	}
	if err, ok := brokerCache.errs[kind]; ok {
		unavailable(t, "%s", err)
	}
	if u := os.Getenv(env); u != "" {
		brokerCache.urls[kind] = u
		return u
	}
	if reachable(local) {
		brokerCache.urls[kind] = local
		return local
	}
	u, err := startContainer(image, port, mk)
	if err != nil {
		brokerCache.errs[kind] = fmt.Errorf("no %s broker: %s unset, %s unreachable, testcontainers: %v", kind, env, local, err)
		unavailable(t, "%s", brokerCache.errs[kind])
	}
	brokerCache.urls[kind] = u
	return u
}

func reachable(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	c, err := net.DialTimeout("tcp", u.Host, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// containers started by startContainer; TestMain terminates them.
var started struct {
	sync.Mutex
	list []testcontainers.Container
}

func startContainer(image, port string, mk func(string) string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return "", err
	}
	defer provider.Close()
	if err := provider.Health(ctx); err != nil {
		return "", fmt.Errorf("docker not available: %w", err)
	}
	c, err := testcontainers.Run(ctx, image,
		testcontainers.WithExposedPorts(port),
		testcontainers.WithWaitStrategy(wait.ForListeningPort(port).WithStartupTimeout(2*time.Minute)),
	)
	if err != nil {
		return "", err
	}
	started.Lock()
	started.list = append(started.list, c)
	started.Unlock()
	ep, err := c.PortEndpoint(ctx, port, "")
	if err != nil {
		return "", err
	}
	return mk(strings.TrimPrefix(ep, "://")), nil
}

func stopContainers() {
	started.Lock()
	defer started.Unlock()
	for _, c := range started.list {
		_ = testcontainers.TerminateContainer(c)
	}
	started.list = nil
}
