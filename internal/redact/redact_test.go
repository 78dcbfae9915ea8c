package redact

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

func TestURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"memory://", "memory://"},
		{"django-db", "django-db"},
		{"localhost:6379", "localhost:6379"},
		{"redis://127.0.0.1:6379/1", "redis://127.0.0.1:6379/1"},
		{"redis://:s3cret@127.0.0.1:6379/1", "redis://:xxx@127.0.0.1:6379/1"},
		{"redis://user@127.0.0.1:6379/1", "redis://user@127.0.0.1:6379/1"},
		{"amqp://guest:guest@127.0.0.1:5672//", "amqp://guest:xxx@127.0.0.1:5672//"},
		{"amqp://a:p1@h1//;amqp://b:p2@h2//", "amqp://a:xxx@h1//;amqp://b:xxx@h2//"},
		{"sentinel://:pw@s1:26379; sentinel://:pw@s2:26379", "sentinel://:xxx@s1:26379; sentinel://:xxx@s2:26379"},
		{"rediss://:p%40ss@host:6380/0?ssl_cert_reqs=CERT_NONE", "rediss://:xxx@host:6380/0?ssl_cert_reqs=CERT_NONE"},
		{"db+postgresql+psycopg2://celery:s3cret@db:5432/results", "db+postgresql+psycopg2://celery:xxx@db:5432/results"},
		{"postgres://db/results?user=celery&password=s3cret", "postgres://db/results?user=celery&password=xxx"},
		{"host=db user=celery password=s3cret dbname=r", "host=db user=celery password=xxx dbname=r"},
		{"host=db password = 'a b\\' c' dbname=r", "host=db password=xxx dbname=r"},
		// Unparsable: everything between :// and @ is hidden all the same.
		{"postgresql://app:p%zzword@db.internal/celery", "postgresql://app:xxx@db.internal/celery"},
		{"postgresql://p%zzword@db.internal/celery", "postgresql://xxx@db.internal/celery"},
		{"redis://:pw@[::1", "redis://:xxx@[::1"},
		{"redis://:pa/ss@host:6379", "redis://:xxx@host:6379"},
		{"redis://:12/ss@host:6379", "redis://:xxx@host:6379"},
		{"amqp://u:p;q@h//;amqp://u:p2@h2//", "amqp://u:xxx@h//;amqp://u:xxx@h2//"},
		{"amqp://u:p@ss@host//", "amqp://u:xxx@host//"},
		{"amqp:user:pass@host", "amqp:xxx@host"},
		{"user:pass@host", "user:xxx@host"},
		{"u@h:pass@host", "xxx@host"},
	} {
		if got := URL(tc.in); got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestError(t *testing.T) {
	//lint:ignore SA1007 the URL is invalid on purpose: its error repeats it.
	_, err := url.Parse("postgresql://app:p%zzword@db.internal/celery")
	red := Error(fmt.Errorf("config: %w", err))
	if strings.Contains(red.Error(), "p%zzword") || !strings.Contains(red.Error(), "db.internal") {
		t.Errorf("Error = %v", red)
	}
	var ue *url.Error
	if !errors.As(red, &ue) {
		t.Errorf("Error(%v) is no *url.Error", red)
	}
	plain := errors.New("plain")
	if Error(plain) != plain {
		t.Error("Error changed an error without a URL")
	}
}

// FuzzURL: a password never comes out, whether the URL parses or not:
// the one url.Parse finds, and a marker put between "://" and '@'.
func FuzzURL(f *testing.F) {
	for _, s := range []string{"amqp://guest:guest@127.0.0.1:5672//", "redis://:s3cret@h:6379/1;redis://u:p@h2", "x", "redis://:pw@[::1", "a:b@c",
		"postgresql://app:p%zzword@db.internal/celery"} {
		f.Add(s, "db", "user", "pw", "host/x")
	}
	f.Fuzz(func(t *testing.T, raw, scheme, user, pass, rest string) {
		defer fuzzwatch.Watch(t, raw, scheme, user, pass, rest)()
		out := URL(raw)
		for _, part := range strings.Split(raw, ";") {
			u, err := url.Parse(strings.TrimSpace(part))
			if err != nil || u.User == nil {
				continue
			}
			if pw, ok := u.User.Password(); ok && len(pw) >= 4 && pw != Hidden {
				if leaked := url.UserPassword(u.User.Username(), pw).String() + "@"; strings.Contains(out, leaked) {
					t.Fatalf("URL(%q) = %q shows %q", raw, out, leaked)
				}
			}
		}
		// A password between "://" and '@', parsable or not. A password
		// holding ";scheme://" is two URLs to any reader, and a marker
		// elsewhere is not a password.
		const marker = "S3CRETMARK"
		if strings.Contains(scheme+user+rest, marker) || strings.Contains(pass, "://") || strings.Contains(user, "://") || strings.Contains(user, "@") || strings.Contains(scheme, "://") {
			return
		}
		raw = scheme + "://" + user + ":" + marker + pass + "@" + rest
		if out := URL(raw); strings.Contains(out, marker) {
			t.Fatalf("URL(%q) = %q shows the password", raw, out)
		}
	})
}

func ExampleURL() {
	fmt.Println(URL("amqp://guest:s3cret@rabbit.example.com:5672//;amqp://guest:s3cret@backup.example.com//"))
	fmt.Println(URL("postgresql://app:p%zzword@db.internal/celery"))
	// Output:
	// amqp://guest:xxx@rabbit.example.com:5672//;amqp://guest:xxx@backup.example.com//
	// postgresql://app:xxx@db.internal/celery
}
