package redis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/backendtest"
	"github.com/celeriac/celeriac/transport/transporttest"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// idemDB is the database of the idempotency tests (see docs/testing.md);
// every key carries a unique global prefix and is deleted afterwards.
const idemDB = 7

// newIdemTest returns a backend on idemDB with a unique global key prefix,
// and a raw client on the same database.
func newIdemTest(t testing.TB) (*Backend, *goredis.Client) {
	t.Helper()
	url := transporttest.RedisURL(t, idemDB)
	opt, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	raw := goredis.NewClient(opt)
	prefix := testPrefix(t)
	b, err := New(Config{URL: url, GlobalKeyPrefix: prefix})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		_ = b.Close()
		deleteKeys(t, raw, prefix+"*")
		raw.Close()
	})
	return b, raw
}

func TestIdempotencyConformance(t *testing.T) {
	backendtest.RunIdempotency(t, func(t *testing.T) backend.IdempotencyStore {
		b, _ := newIdemTest(t)
		return b
	})
}

func TestIdempotencyKeyLayout(t *testing.T) {
	for _, tt := range []struct {
		global, want string
	}{
		{"", "celeriac.idem.order-42"},
		{"app", "app_celeriac.idem.order-42"},
		{"app:", "app:celeriac.idem.order-42"},
		{"app-", "app-celeriac.idem.order-42"},
	} {
		b, err := New(Config{URL: "redis://127.0.0.1:1/0", GlobalKeyPrefix: tt.global})
		if err != nil {
			t.Fatal(err)
		}
		if got := b.IdempotencyKey("order-42"); got != tt.want {
			t.Errorf("GlobalKeyPrefix %q: IdempotencyKey = %q, want %q", tt.global, got, tt.want)
		}
		b.Close()
	}
}

// TestIdempotencyStoredValues pins what is in Redis: the owner while held,
// with the lease as PX expiry, then the result with keep as expiry.
func TestIdempotencyStoredValues(t *testing.T) {
	b, raw := newIdemTest(t)
	ctx := t.Context()
	key := b.IdempotencyKey("order-1")
	if c, err := b.Claim(ctx, "order-1", "w1/t1/x", 90*time.Second); err != nil || c.State != backend.Claimed {
		t.Fatalf("claim: %+v %v", c, err)
	}
	if v := raw.Get(ctx, key).Val(); v != "bw1/t1/x" {
		t.Fatalf("held value %q", v)
	}
	if ttl := raw.PTTL(ctx, key).Val(); ttl <= 80*time.Second || ttl > 90*time.Second {
		t.Fatalf("lease TTL %v, want about 90s", ttl)
	}
	if err := b.Extend(ctx, "order-1", "w1/t1/x", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	if ttl := raw.PTTL(ctx, key).Val(); ttl <= 170*time.Second {
		t.Fatalf("renewed TTL %v, want about 180s", ttl)
	}
	if err := b.Complete(ctx, "order-1", "w1/t1/x", []byte(`{"id":"ch_1"}`), 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if v := raw.Get(ctx, key).Val(); v != `d{"id":"ch_1"}` {
		t.Fatalf("done value %q", v)
	}
	if ttl := raw.PTTL(ctx, key).Val(); ttl <= 23*time.Hour {
		t.Fatalf("keep TTL %v, want about 24h", ttl)
	}
	if err := b.Release(ctx, "order-1", "w1/t1/x"); err != nil {
		t.Fatal(err)
	}
	if n := raw.Exists(ctx, key).Val(); n != 1 {
		t.Fatal("release deleted a done key")
	}
}

// TestIdempotencyForeignValue: a key holding something this store did not
// write is reported, never taken as claimed or done.
func TestIdempotencyForeignValue(t *testing.T) {
	b, raw := newIdemTest(t)
	ctx := t.Context()
	for _, v := range []string{"", "x", "{\"json\": 1}"} {
		raw.Set(ctx, b.IdempotencyKey("foreign"), v, time.Minute)
		c, err := b.Claim(ctx, "foreign", "a", time.Minute)
		if err == nil || !strings.Contains(err.Error(), "did not write") {
			t.Errorf("value %q: Claim = %+v, %v; want an error", v, c, err)
		}
		if err := b.Extend(ctx, "foreign", "a", time.Minute); err == nil {
			t.Errorf("value %q: Extend succeeded", v)
		}
		if got := raw.Get(ctx, b.IdempotencyKey("foreign")).Val(); got != v {
			t.Errorf("value %q was changed to %q", v, got)
		}
	}
}

func TestIdempotencyBadArguments(t *testing.T) {
	// No server: bad arguments must fail before any round trip.
	b, err := New(Config{URL: "redis://127.0.0.1:1/0"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		call func() error
	}{
		{"claim empty key", func() error { _, err := b.Claim(ctx, "", "o", time.Second); return err }},
		{"claim empty owner", func() error { _, err := b.Claim(ctx, "k", "", time.Second); return err }},
		{"claim zero lease", func() error { _, err := b.Claim(ctx, "k", "o", 0); return err }},
		{"claim negative lease", func() error { _, err := b.Claim(ctx, "k", "o", -time.Second); return err }},
		{"claim sub-millisecond lease", func() error { _, err := b.Claim(ctx, "k", "o", time.Microsecond); return err }},
		{"extend empty owner", func() error { return b.Extend(ctx, "k", "", time.Second) }},
		{"extend zero lease", func() error { return b.Extend(ctx, "k", "o", 0) }},
		{"complete empty key", func() error { return b.Complete(ctx, "", "o", nil, time.Hour) }},
		{"complete zero keep", func() error { return b.Complete(ctx, "k", "o", nil, 0) }},
		{"release empty owner", func() error { return b.Release(ctx, "k", "") }},
	} {
		err := tt.call()
		if err == nil || !strings.Contains(err.Error(), "idempotency") {
			t.Errorf("%s: %v, want an idempotency error", tt.name, err)
		}
	}
}

func TestIdempotencyClosed(t *testing.T) {
	b, _ := newIdemTest(t)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := b.Claim(ctx, "k", "o", time.Second); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Claim after Close: %v", err)
	}
	if err := b.Complete(ctx, "k", "o", nil, time.Second); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Complete after Close: %v", err)
	}
}

func TestParseClaim(t *testing.T) {
	tests := []struct {
		name    string
		reply   []any
		want    backend.Claim
		wantErr bool
	}{
		{"claimed", []any{int64(0)}, backend.Claim{State: backend.Claimed}, false},
		{"done", []any{int64(1), `{"a":1}`}, backend.Claim{State: backend.Done, Result: []byte(`{"a":1}`)}, false},
		{"done empty", []any{int64(1), ""}, backend.Claim{State: backend.Done, Result: []byte{}}, false},
		{"busy", []any{int64(2), int64(1500)}, backend.Claim{State: backend.Busy, Retry: 1500 * time.Millisecond}, false},
		{"busy without expiry", []any{int64(2), int64(-1)}, backend.Claim{State: backend.Busy}, false},
		{"empty", nil, backend.Claim{}, true},
		{"state not int", []any{"0"}, backend.Claim{}, true},
		{"unknown state", []any{int64(3)}, backend.Claim{}, true},
		{"claimed with extra", []any{int64(0), "x"}, backend.Claim{}, true},
		{"done without result", []any{int64(1)}, backend.Claim{}, true},
		{"done result not string", []any{int64(1), int64(5)}, backend.Claim{}, true},
		{"busy ttl not int", []any{int64(2), "5"}, backend.Claim{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseClaim(tt.reply)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseClaim(%v) error %v, want error: %v", tt.reply, err, tt.wantErr)
			}
			if got.State != tt.want.State || !bytes.Equal(got.Result, tt.want.Result) || got.Retry != tt.want.Retry ||
				(got.Result == nil) != (tt.want.Result == nil) {
				t.Fatalf("parseClaim(%v) = %+v, want %+v", tt.reply, got, tt.want)
			}
		})
	}
}

// FuzzIdempotencyRoundTrip: any key, owner and result bytes go through the
// scripts unchanged: the holder is Busy to others, and the completed result
// comes back byte for byte.
func FuzzIdempotencyRoundTrip(f *testing.F) {
	f.Add("order-42", "celery@host/4f1c/abc", []byte(`{"charge_id": "ch_1", "amount": 4200}`))
	f.Add("payments.charge:order-1", "w", []byte(`null`))
	f.Add("", "", []byte{})
	f.Add("k*?[]\n\x00", "d", []byte("bd\x00\xff"))
	f.Add("\xff\xfe", "b", []byte(strings.Repeat("é", 300)))
	b, raw := newIdemTest(f)
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, key, owner string, result []byte) {
		defer fuzzwatch.Watch(t, key, owner, result)()
		ctx := context.Background()
		// A key unique per input, so earlier inputs do not interfere.
		key = fmt.Sprintf("%d:%s", n.Add(1), key)
		if owner == "" {
			if _, err := b.Claim(ctx, key, owner, time.Minute); err == nil {
				t.Fatal("empty owner accepted")
			}
			return
		}
		defer raw.Del(ctx, b.IdempotencyKey(key))
		c, err := b.Claim(ctx, key, owner, time.Minute)
		if err != nil || c.State != backend.Claimed {
			t.Fatalf("claim: %+v %v", c, err)
		}
		if c, err := b.Claim(ctx, key, owner+"'", time.Minute); err != nil || c.State != backend.Busy {
			t.Fatalf("claim by another owner: %+v %v", c, err)
		}
		if err := b.Complete(ctx, key, owner, result, time.Minute); err != nil {
			t.Fatalf("complete: %v", err)
		}
		c, err = b.Claim(ctx, key, owner+"'", time.Minute)
		if err != nil || c.State != backend.Done || !bytes.Equal(c.Result, result) {
			t.Fatalf("claim after complete: %+v %v, want Done with %q", c, err, result)
		}
	})
}

// BenchmarkIdempotency measures the two paths worker.Idempotent takes per
// task: "first" is a new key (Claim, then Complete), "duplicate" a
// redelivery of a done key (one Claim that returns the stored result).
// The rate run reports as stores/s is tasks per second here.
//
//	go test -run '^$' -bench Idempotency -benchtime 20000x ./backend/redis
func BenchmarkIdempotency(b *testing.B) {
	result := []byte(`{"charge_id": "ch_3Mtw", "order_id": "order-42", "amount": 4200, "currency": "eur"}`)
	for _, bc := range []struct {
		name    string
		dup     bool
		writers int
	}{
		{"first/serial", false, 1},
		{"first/concurrent64", false, benchWriters},
		{"duplicate/serial", true, 1},
		{"duplicate/concurrent64", true, benchWriters},
	} {
		b.Run(bc.name, func(b *testing.B) {
			be, _ := newIdemTest(b)
			ctx := context.Background()
			if bc.dup {
				if err := be.Complete(ctx, "dup", "o", result, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			var n atomic.Int64
			op := func() error {
				if bc.dup {
					c, err := be.Claim(ctx, "dup", "other", time.Minute)
					if err == nil && c.State != backend.Done {
						err = fmt.Errorf("state %v", c.State)
					}
					return err
				}
				key, owner := fmt.Sprintf("k%d", n.Add(1)), "celery@bench/abc"
				c, err := be.Claim(ctx, key, owner, time.Minute)
				if err != nil {
					return err
				}
				if c.State != backend.Claimed {
					return fmt.Errorf("state %v", c.State)
				}
				return be.Complete(ctx, key, owner, result, time.Hour)
			}
			run(b, bc.writers, op)
		})
	}
}
