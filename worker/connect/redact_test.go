package connect

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
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
		{"redis://:pw@[::1", "<unparsable url>"},
		{"db+postgresql+psycopg2://celery:s3cret@db:5432/results", "db+postgresql+psycopg2://celery:xxx@db:5432/results"},
		{"postgres://db/results?user=celery&password=s3cret", "postgres://db/results?password=xxx&user=celery"},
		{"django-db", "django-db"},
	} {
		if got := Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzRedact: no input panics, and a password that url.Parse finds never
// comes out.
func FuzzRedact(f *testing.F) {
	for _, s := range []string{"amqp://guest:guest@127.0.0.1:5672//", "redis://:s3cret@h:6379/1;redis://u:p@h2", "x", "redis://:pw@[::1", "a:b@c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		out := Redact(raw)
		for _, part := range strings.Split(raw, ";") {
			u, err := url.Parse(strings.TrimSpace(part))
			if err != nil || u.User == nil {
				continue
			}
			if pw, ok := u.User.Password(); ok && len(pw) >= 4 && pw != "xxx" {
				if leaked := url.UserPassword(u.User.Username(), pw).String() + "@"; strings.Contains(out, leaked) {
					t.Fatalf("Redact(%q) = %q shows %q", raw, out, leaked)
				}
			}
		}
	})
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
