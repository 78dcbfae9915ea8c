package connect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestRedact(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"memory://", "memory://"},
		{"redis://127.0.0.1:6379/1", "redis://127.0.0.1:6379/1"},
		{"redis://:s3cret@127.0.0.1:6379/1", "redis://:xxx@127.0.0.1:6379/1"},
		{"redis://default:s3cret@127.0.0.1:6379/1", "redis://default:xxx@127.0.0.1:6379/1"},
		{"redis://user@127.0.0.1:6379/1", "redis://user@127.0.0.1:6379/1"},
		{"amqp://guest:guest@127.0.0.1:5672//", "amqp://guest:xxx@127.0.0.1:5672//"},
		{"amqp://a:p1@h1//;amqp://b:p2@h2//", "amqp://a:xxx@h1//;amqp://b:xxx@h2//"},
		{"sentinel://:pw@s1:26379;sentinel://:pw@s2:26379", "sentinel://:xxx@s1:26379;sentinel://:xxx@s2:26379"},
		{"rediss://:p%40ss@host:6380/0?ssl_cert_reqs=CERT_NONE", "rediss://:xxx@host:6380/0?ssl_cert_reqs=CERT_NONE"},
		{"redis://:pw@[::1", "redis://:xxx@[::1"},
		{"postgresql://app:p%zzword@db.internal/celery", "postgresql://app:xxx@db.internal/celery"},
		{"db+postgresql+psycopg2://celery:s3cret@db:5432/results", "db+postgresql+psycopg2://celery:xxx@db:5432/results"},
		{"postgres://db/results?user=celery&password=s3cret", "postgres://db/results?user=celery&password=xxx"},
		{"django-db", "django-db"},
	} {
		if got := Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func ExampleRedact() {
	fmt.Println(Redact("amqp://guest:s3cret@rabbit.example.com:5672//;amqp://guest:s3cret@backup.example.com//"))
	// Output: amqp://guest:xxx@rabbit.example.com:5672//;amqp://guest:xxx@backup.example.com//
}

// TestOpenNotAURL: a broker or result backend setting without a scheme is
// an error naming it, not a silent in-process broker.
func TestOpenNotAURL(t *testing.T) {
	for _, o := range []Options{
		{BrokerURL: "x"},
		{BrokerURL: "localhost:6379"},
		{BrokerURL: "memory://", ResultBackend: "x"},
		{BrokerURL: "kafka://h:9092"},
		{BrokerURL: "amqp://guest:guest@127.0.0.1:1//", DelayedDelivery: "sometimes"},
		{BrokerURL: "amqp://guest:guest@127.0.0.1:1//", DelayedQueueType: "stream"},
	} {
		c, err := Open(context.Background(), o)
		if err == nil {
			c.Close()
			t.Errorf("Open(%+v) succeeded", o)
			continue
		}
		t.Logf("Open(%q, %q): %v", o.BrokerURL, o.ResultBackend, err)
		if o.DelayedDelivery+o.DelayedQueueType != "" && !strings.Contains(err.Error(), "Delayed") {
			t.Errorf("Open(%+v): %v, want the delayed-delivery setting named", o, err)
		}
	}
	// No broker is an error, never a silent in-process broker: a worker
	// with a typo in its environment would consume nothing and look healthy.
	for _, u := range []string{"", "  "} {
		if c, err := Open(context.Background(), Options{BrokerURL: u}); !errors.Is(err, ErrNoBroker) {
			if c != nil {
				c.Close()
			}
			t.Fatalf("Open with broker %q = %v; want ErrNoBroker", u, err)
		}
	}
	c, err := Open(context.Background(), Options{BrokerURL: "memory://"})
	if err != nil || c.BrokerScheme != "memory" {
		t.Fatalf("Open(memory://) = %v, %v; want the in-process broker", c, err)
	}
	c.Close()
}

// TestOpenErrorsHidePasswords: a URL that does not parse is still
// redacted in Open's error, where the settings name it and where an
// error from a parser repeats it.
func TestOpenErrorsHidePasswords(t *testing.T) {
	const secret = "p%zzword"
	for _, o := range []Options{
		{BrokerURL: "redis://:" + secret + "@127.0.0.1:1/0"},
		{BrokerURL: "amqp://app:" + secret + "@127.0.0.1:1//"},
		{BrokerURL: "sentinel://:" + secret + "@127.0.0.1:1"},
		{BrokerURL: "memory://", ResultBackend: "redis://:" + secret + "@127.0.0.1:1/0"},
		{BrokerURL: "memory://", ResultBackend: "db+postgresql://app:" + secret + "@db.internal/celery"},
		{BrokerURL: "memory://", ResultBackend: "django-db", DatabaseURL: "postgresql://app:" + secret + "@db.internal/celery"},
		{BrokerURL: "memory://", ResultBackend: "db+postgresql://app:" + secret + "@db.internal/celery?password=" + secret},
		{BrokerURL: "memory://", RateLimitURL: "redis://:" + secret + "@127.0.0.1:1/0"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := Open(ctx, o)
		cancel()
		if err == nil {
			c.Close()
			t.Errorf("Open(%+v) succeeded", o)
			continue
		}
		if strings.Contains(err.Error(), "zzword") {
			t.Errorf("Open's error shows the password: %v", err)
		}
	}
}
