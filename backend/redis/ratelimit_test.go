package redis

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/transport/transporttest"

	"github.com/celeriac/celeriac/internal/fuzzwatch"
)

// rateLimitDB is the Redis database of the rate-limit tests (shared with
// the rate-limit integration tests, which use other key prefixes).
const rateLimitDB = 6

// newLimiter returns a backend on rateLimitDB whose keys carry a unique
// prefix, and a raw client; the keys are deleted when the test ends.
func newLimiter(t testing.TB) (*Backend, *goredis.Client) {
	t.Helper()
	url := transporttest.RedisURL(t, rateLimitDB)
	opt, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	raw := goredis.NewClient(opt)
	prefix := "rl_" + strings.ToLower(rand.Text()[:12]) + ":"
	b, err := New(Config{URL: url, GlobalKeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.Close()
		deleteKeys(t, raw, prefix+"*")
		raw.Close()
	})
	return b, raw
}

// t0 is an arbitrary start of the replayed timelines, in µs.
const t0 = int64(1_800_000_000_000_000)

func ms(n float64) int64 { return int64(n * 1000) }

func TestReserveTimeline(t *testing.T) {
	type step struct {
		at       int64 // µs after t0
		rate     float64
		burst    int
		wantWait time.Duration
		wantLeft float64
	}
	for _, tt := range []struct {
		name  string
		steps []step
	}{
		{"a new bucket is full", []step{
			{0, 1, 3, 0, 2},
			{0, 1, 3, 0, 1},
			{0, 1, 3, 0, 0},
			{0, 1, 3, time.Second, -1},
			{0, 1, 3, 2 * time.Second, -2},
		}},
		{"refill is computed on read", []step{
			{0, 1, 3, 0, 2},
			{0, 1, 3, 0, 1},
			{0, 1, 3, 0, 0},
			{ms(1500), 1, 3, 0, 0.5},
			{ms(1500), 1, 3, 500 * time.Millisecond, -0.5},
		}},
		{"refill stops at the burst", []step{
			{0, 2, 2, 0, 1},
			{0, 2, 2, 0, 0},
			{ms(100_000), 2, 2, 0, 1},
			{ms(100_000), 2, 2, 0, 0},
			{ms(100_000), 2, 2, 500 * time.Millisecond, -1},
		}},
		{"debt spaces callers 1/rate apart", []step{
			{0, 5, 1, 0, 0},
			{0, 5, 1, 200 * time.Millisecond, -1},
			{0, 5, 1, 400 * time.Millisecond, -2},
			{ms(100), 5, 1, 500 * time.Millisecond, -2.5},
			{ms(600), 5, 1, 200 * time.Millisecond, -1},
			{ms(2000), 5, 1, 0, 0},
		}},
		{"Celery units: 100/m", []step{
			{0, 100.0 / 60, 1, 0, 0},
			{0, 100.0 / 60, 1, 600 * time.Millisecond, -1},
			{ms(300), 100.0 / 60, 1, 900 * time.Millisecond, -1.5},
		}},
		{"1000/h", []step{
			{0, 1000.0 / 3600, 1, 0, 0},
			{0, 1000.0 / 3600, 1, 3600 * time.Millisecond, -1},
		}},
		{"different rates on one key: the caller's rate refills", []step{
			{0, 1, 1, 0, 0},
			{0, 1, 1, time.Second, -1},
			// 500 ms at 10/s refills 5 tokens: the debt is paid and the
			// bucket holds 1 token (this caller's burst) before the take.
			{ms(500), 10, 1, 0, 0},
			{ms(500), 10, 4, 100 * time.Millisecond, -1},
			// The slow caller refills 100 ms at 1/s.
			{ms(600), 1, 1, 1900 * time.Millisecond, -1.9},
		}},
		{"a clock that goes back refills nothing", []step{
			{ms(10_000), 1, 1, 0, 0},
			{ms(5_000), 1, 1, 6 * time.Second, -1},
			{ms(10_500), 1, 1, 1500 * time.Millisecond, -1.5},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, _ := newLimiter(t)
			for i, s := range tt.steps {
				res, err := b.reserve(t.Context(), "k", s.rate, s.burst, t0+s.at)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if d := res.wait - s.wantWait; d < -time.Microsecond || d > time.Microsecond {
					t.Errorf("step %d (at %v): wait %v, want %v", i, time.Duration(s.at)*time.Microsecond, res.wait, s.wantWait)
				}
				if math.Abs(res.tokens-s.wantLeft) > 1e-9 {
					t.Errorf("step %d: %v tokens left, want %v", i, res.tokens, s.wantLeft)
				}
				if want := time.UnixMicro(t0 + s.at); !res.now.Equal(want) {
					t.Errorf("step %d: script time %v, want %v", i, res.now, want)
				}
			}
		})
	}
}

// TestReserveKeyAndTTL: the bucket lives at the documented key, and its TTL
// is the time it takes to be full again (plus a second), after which it is
// the same as no bucket.
func TestReserveKeyAndTTL(t *testing.T) {
	b, raw := newLimiter(t)
	ctx := t.Context()
	key := b.RateLimitKey("sms-api")
	if !strings.HasPrefix(key, "rl_") || !strings.HasSuffix(key, ":celeriac.ratelimit.sms-api") {
		t.Fatalf("RateLimitKey = %q", key)
	}
	for range 3 {
		if _, err := b.Reserve(ctx, "sms-api", 5, time.Second, 1); err != nil {
			t.Fatal(err)
		}
	}
	// 3 taken from a bucket of 1: 2 tokens of debt, 3 to be full: 600 ms.
	ttl, err := raw.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 1000*time.Millisecond || ttl > 1600*time.Millisecond {
		t.Errorf("PTTL %v, want about 1.6 s", ttl)
	}
	h, err := raw.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 2 || h["t"] == "" || h["at"] == "" {
		t.Errorf("bucket hash %v, want fields t and at", h)
	}
	// Different names are different buckets.
	if w, err := b.Reserve(ctx, "other", 5, time.Second, 1); err != nil || w != 0 {
		t.Errorf("first reservation of another bucket: %v, %v", w, err)
	}
}

// TestReserveRealClock: without a replayed clock the script reads TIME.
func TestReserveRealClock(t *testing.T) {
	b, raw := newLimiter(t)
	ctx := t.Context()
	tm, err := raw.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.reserve(ctx, "clock", 1, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.now.Before(tm) || res.now.Sub(tm) > time.Minute {
		t.Errorf("script time %v, Redis TIME before it %v", res.now, tm)
	}
	res2, err := b.reserve(ctx, "clock", 1, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The second token of a 1/s bucket comes one second after the first.
	if got := res2.now.Add(res2.wait).Sub(res.now); got < time.Second-time.Microsecond || got > time.Second+time.Microsecond {
		t.Errorf("second token %v after the first, want 1 s", got)
	}
}

func TestReserveBadState(t *testing.T) {
	for _, tt := range []struct {
		name   string
		set    func(ctx context.Context, raw *goredis.Client, key string) error
		errors bool
	}{
		{"not numbers", func(ctx context.Context, raw *goredis.Client, key string) error {
			return raw.HSet(ctx, key, "t", "abc", "at", "x").Err()
		}, false},
		{"nan", func(ctx context.Context, raw *goredis.Client, key string) error {
			return raw.HSet(ctx, key, "t", "nan", "at", "inf").Err()
		}, false},
		{"one field", func(ctx context.Context, raw *goredis.Client, key string) error {
			return raw.HSet(ctx, key, "at", "12").Err()
		}, false},
		{"not a hash", func(ctx context.Context, raw *goredis.Client, key string) error {
			return raw.Set(ctx, key, "5", time.Minute).Err()
		}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, raw := newLimiter(t)
			ctx := t.Context()
			if err := tt.set(ctx, raw, b.RateLimitKey("k")); err != nil {
				t.Fatal(err)
			}
			res, err := b.reserve(ctx, "k", 1, 2, t0)
			if tt.errors {
				if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
					t.Fatalf("err = %v, want WRONGTYPE", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// Started again full: 2 - 1.
			if res.wait != 0 || res.tokens != 1 {
				t.Errorf("wait %v tokens %v, want a full bucket", res.wait, res.tokens)
			}
		})
	}
}

func TestReserveInvalid(t *testing.T) {
	b, _ := newLimiter(t)
	ctx := t.Context()
	for _, tt := range []struct {
		name   string
		key    string
		n      float64
		period time.Duration
	}{
		{"zero", "k", 0, time.Second},
		{"negative", "k", -1, time.Second},
		{"nan", "k", math.NaN(), time.Second},
		{"inf", "k", math.Inf(1), time.Second},
		{"zero period", "k", 1, 0},
		{"negative period", "k", 1, -time.Second},
		{"tiny period", "k", math.MaxFloat64, time.Nanosecond},
		{"empty key", "", 1, time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := b.Reserve(ctx, tt.key, tt.n, tt.period, 1); !errors.Is(err, ErrInvalidRate) {
				t.Errorf("err = %v, want ErrInvalidRate", err)
			}
		})
	}
	// A burst below 1 acts as 1.
	if w, err := b.Reserve(ctx, "b0", 1, time.Hour, 0); err != nil || w != 0 {
		t.Fatalf("first: %v %v", w, err)
	}
	if w, err := b.Reserve(ctx, "b0", 1, time.Hour, -5); err != nil || w < 59*time.Minute {
		t.Errorf("second with burst 1: wait %v (%v), want an hour", w, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.Reserve(cctx, "k", 1, time.Second, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: %v", err)
	}
	b.Close()
	if _, err := b.Reserve(ctx, "k", 1, time.Second, 1); !errors.Is(err, backend.ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

// TestReserveConcurrent: many workers reserving at once from one bucket get
// start times that never exceed the rate by more than the burst, in any
// interval: for starts s_i <= s_j, j-i+1 <= burst + rate*(s_j-s_i). The
// times are Redis's own (script time + wait), so the test does not depend
// on the machine's speed.
func TestReserveConcurrent(t *testing.T) {
	const (
		goroutines = 16
		each       = 50
		rate       = 100.0 // per second
		burst      = 5
	)
	b, _ := newLimiter(t)
	ctx := t.Context()
	var (
		mu     sync.Mutex
		starts []time.Time
		nows   []time.Time
		wg     sync.WaitGroup
	)
	for range goroutines {
		wg.Go(func() {
			for range each {
				res, err := b.reserve(ctx, "shared", rate, burst, 0)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				starts = append(starts, res.now.Add(res.wait))
				nows = append(nows, res.now)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(starts) != goroutines*each {
		t.Fatalf("%d reservations, want %d", len(starts), goroutines*each)
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	worst := 0.0
	for i := range starts {
		for j := i + 1; j < len(starts); j++ {
			allowed := burst + rate*starts[j].Sub(starts[i]).Seconds()
			if over := float64(j-i+1) - allowed; over > worst {
				worst = over
			}
		}
	}
	// Waits are rounded up to the microsecond, never down.
	if worst > 1e-6*rate {
		t.Errorf("some interval holds %.6f starts more than burst + rate*length", worst)
	}
	// The limiter does not throttle more than it must: all reservations
	// arrive while the debt lasts (800 at 100/s is 8 s of it), so the last
	// start is exactly (count - burst)/rate after the first.
	slices.SortFunc(nows, func(a, b time.Time) int { return a.Compare(b) })
	span := starts[len(starts)-1].Sub(starts[0])
	want := time.Duration(float64(len(starts)-burst) / rate * float64(time.Second))
	arrivals := nows[len(nows)-1].Sub(nows[0])
	if arrivals < want && (span < want-time.Millisecond || span > want+time.Millisecond) {
		t.Errorf("starts span %v, want %v", span, want)
	}
	t.Logf("%d reservations arrived within %v; starts span %v", len(starts), arrivals, span)
}

// BenchmarkReserve measures one reservation (one EVALSHA round trip):
//
//	go test -run '^$' -bench Reserve ./backend/redis
//
// "onekey" has 64 goroutines on one bucket (one global limit, the hot
// case); "keys" spreads them over 64 buckets.
func BenchmarkReserve(b *testing.B) {
	for _, bc := range []struct {
		name     string
		parallel bool
		keys     int
	}{
		{"serial", false, 1},
		{"concurrent64-onekey", true, 1},
		{"concurrent64-keys", true, 64},
	} {
		b.Run(bc.name, func(b *testing.B) {
			be, _ := newLimiter(b)
			ctx := context.Background()
			names := make([]string, bc.keys)
			for i := range names {
				names[i] = fmt.Sprintf("bench-%d", i)
			}
			var n atomic.Int64
			reserve := func() {
				// A high rate keeps the waits small; the cost is the same.
				if _, err := be.Reserve(ctx, names[int(n.Add(1))%len(names)], 1e6, time.Second, 100); err != nil {
					b.Error(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			if bc.parallel {
				b.SetParallelism(max(1, benchWriters/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						reserve()
					}
				})
			} else {
				for range b.N {
					reserve()
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reservations/s")
		})
	}
}

// FuzzReserveStoredState feeds the script whatever a bucket may hold (it
// decodes the stored state) and any rate: it must answer with a sane
// reservation or an error, never a negative wait, more tokens than the
// burst, or a bucket without a TTL.
func FuzzReserveStoredState(f *testing.F) {
	f.Add("0", "1800000000000000", 5.0, 1, int64(0))
	f.Add("-3.5", "1800000000000000", 5.0, 1, int64(200_000))
	f.Add("0.99999999999999989", "1799999999000000", 1.0/3600, 3, int64(1))
	f.Add("1e300", "1800000000000000", 1.0, 2, int64(0))
	f.Add("-1e300", "1800000000000000", 1e-9, 1, int64(0))
	f.Add("nan", "inf", 1.0, 1, int64(0))
	f.Add("", "", 1.0, 1, int64(0))
	f.Add("2", "9e18", 100.0, 10, int64(-5_000_000))
	f.Add("0x10", " 12 ", 1e9, 1<<40, int64(1))
	b, raw := newLimiter(f)
	f.Fuzz(func(t *testing.T, tokens, at string, rate float64, burst int, offset int64) {
		defer fuzzwatch.Watch(t, tokens, at, rate, burst, offset)()
		if !(rate > 0) || math.IsInf(rate, 0) {
			t.Skip("Reserve refuses these rates")
		}
		ctx := context.Background()
		key := b.RateLimitKey("fuzz")
		raw.Del(ctx, key)
		fields := []any{}
		if tokens != "" {
			fields = append(fields, "t", tokens)
		}
		if at != "" {
			fields = append(fields, "at", at)
		}
		if len(fields) > 0 {
			if err := raw.HSet(ctx, key, fields...).Err(); err != nil {
				t.Fatal(err)
			}
		}
		burst = max(burst, 1)
		now := t0 + offset%(365*24*3600*1_000_000)
		res, err := b.reserve(ctx, "fuzz", rate, burst, now)
		if err != nil {
			t.Fatalf("reserve: %v", err)
		}
		if res.wait < 0 || res.tokens > float64(burst)-1+1e-9*float64(burst) || math.IsNaN(res.tokens) {
			t.Errorf("wait %v, %v tokens left of burst %d", res.wait, res.tokens, burst)
		}
		if ttl, err := raw.PTTL(ctx, key).Result(); err != nil || ttl <= 0 {
			t.Errorf("bucket TTL %v (%v)", ttl, err)
		}
	})
}
