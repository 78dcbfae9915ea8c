package retry_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/celeriac/celeriac/retry"
)

// backoffGolden is testdata/backoff.json, written by gen_backoff.py from
// Celery's get_exponential_backoff_interval.
type backoffGolden struct {
	Celery string `json:"celery"`
	Rows   []struct {
		Factor      int   `json:"factor"`
		Retries     int   `json:"retries"`
		Maximum     int64 `json:"maximum"`
		Countdown   int64 `json:"countdown"`
		JitterBound int64 `json:"jitter_bound"`
	} `json:"rows"`
}

func readJSON(t testing.TB, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestBackoffIntervalMatchesCelery(t *testing.T) {
	var g backoffGolden
	readJSON(t, "testdata/backoff.json", &g)
	if g.Celery == "" || len(g.Rows) < 5*16*4 {
		t.Fatalf("testdata/backoff.json holds %d rows from celery %q; regenerate it with gen_backoff.py", len(g.Rows), g.Celery)
	}
	for _, r := range g.Rows {
		maximum := time.Duration(r.Maximum) * time.Second
		want := time.Duration(r.Countdown) * time.Second

		got := retry.BackoffInterval(r.Factor, r.Retries, maximum, false, nil)
		if got != want {
			t.Errorf("BackoffInterval(%d, %d, %v, false) = %v, Celery %s says %v", r.Factor, r.Retries, maximum, got, g.Celery, want)
		}

		// With jitter, Celery calls random.randrange(countdown + 1); the
		// largest draw must give back the unjittered value.
		var bounds []int
		top := func(n int) int { bounds = append(bounds, n); return n - 1 }
		got = retry.BackoffInterval(r.Factor, r.Retries, maximum, true, top)
		if len(bounds) != 1 || int64(bounds[0]) != r.JitterBound {
			t.Errorf("BackoffInterval(%d, %d, %v, true) asked randn for %v, Celery asks randrange(%d)", r.Factor, r.Retries, maximum, bounds, r.JitterBound)
		}
		if got != want {
			t.Errorf("BackoffInterval(%d, %d, %v, true) with the top draw = %v, want %v", r.Factor, r.Retries, maximum, got, want)
		}
	}
}

func TestBackoffIntervalEdges(t *testing.T) {
	const maxDur = time.Duration(math.MaxInt64)
	maxWhole := maxDur / time.Second * time.Second
	tests := []struct {
		name    string
		factor  int
		retries int
		maximum time.Duration
		want    time.Duration
	}{
		{"retries 100 does not overflow", 1, 100, 600 * time.Second, 600 * time.Second},
		{"retries MaxInt", 1, math.MaxInt, 600 * time.Second, 600 * time.Second},
		{"factor MaxInt", math.MaxInt, 0, 600 * time.Second, 600 * time.Second},
		{"factor and retries huge, cap huge", math.MaxInt, 62, maxDur, maxWhole},
		{"largest exact power below the cap", 1, 33, maxDur, (1 << 33) * time.Second},
		{"first power above the cap", 1, 34, maxDur, maxWhole},
		{"maximum truncated to whole seconds", 1, 10, 1500 * time.Millisecond, time.Second},
		{"maximum below a second caps at zero", 1, 0, 999 * time.Millisecond, 0},
		{"zero maximum", 5, 3, 0, 0},
		{"negative maximum acts as zero", 5, 3, -time.Hour, 0},
		{"zero factor", 0, 3, time.Hour, 0},
		{"negative factor acts as zero", -3, 3, time.Hour, 0},
		{"negative retries act as zero", 3, -4, time.Hour, 3 * time.Second},
		{"exactly the cap", 3, 2, 12 * time.Second, 12 * time.Second},
		{"one below the cap", 3, 2, 13 * time.Second, 12 * time.Second},
		{"one above the cap", 3, 2, 11 * time.Second, 11 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retry.BackoffInterval(tt.factor, tt.retries, tt.maximum, false, nil); got != tt.want {
				t.Errorf("BackoffInterval(%d, %d, %v, false) = %v, want %v", tt.factor, tt.retries, tt.maximum, got, tt.want)
			}
			// With jitter, the top draw equals the cap and nil randn keeps it.
			top := func(n int) int { return n - 1 }
			if got := retry.BackoffInterval(tt.factor, tt.retries, tt.maximum, true, top); got != tt.want {
				t.Errorf("BackoffInterval(%d, %d, %v, true, top) = %v, want %v", tt.factor, tt.retries, tt.maximum, got, tt.want)
			}
			if got := retry.BackoffInterval(tt.factor, tt.retries, tt.maximum, true, nil); got != tt.want {
				t.Errorf("BackoffInterval(%d, %d, %v, true, nil) = %v, want %v", tt.factor, tt.retries, tt.maximum, got, tt.want)
			}
		})
	}
}

func TestBackoffIntervalJitterBounds(t *testing.T) {
	const maximum = 600 * time.Second
	for _, factor := range []int{1, 2, 3, 5, 10} {
		for retries := 0; retries <= 12; retries++ {
			capped := retry.BackoffInterval(factor, retries, maximum, false, nil)
			draws := []struct {
				name string
				fn   func(n int) int
				want time.Duration
			}{
				{"bottom", func(int) int { return 0 }, 0},
				{"top", func(n int) int { return n - 1 }, capped},
				{"middle", func(n int) int { return n / 2 }, (capped/time.Second + 1) / 2 * time.Second},
				{"below range is clamped", func(int) int { return -7 }, 0},
				{"above range is clamped", func(n int) int { return n + 100 }, capped},
			}
			for _, d := range draws {
				got := retry.BackoffInterval(factor, retries, maximum, true, d.fn)
				if got != d.want {
					t.Errorf("factor %d retries %d, %s draw: got %v, want %v", factor, retries, d.name, got, d.want)
				}
				if got < 0 || got > capped || got%time.Second != 0 {
					t.Errorf("factor %d retries %d, %s draw: %v outside whole seconds in [0, %v]", factor, retries, d.name, got, capped)
				}
			}
		}
	}
}

// TestBackoffIntervalJitterDistribution draws from a seeded generator, so
// the outcome is fixed; the bounds are many standard deviations wide, so a
// change of seed would not make it flaky either.
func TestBackoffIntervalJitterDistribution(t *testing.T) {
	const (
		draws   = 200_000
		capSecs = 600
	)
	rng := rand.New(rand.NewPCG(6, 1))
	counts := make([]int, capSecs+1)
	var sum float64
	for range draws {
		got := retry.BackoffInterval(1, 20, capSecs*time.Second, true, rng.IntN)
		if got < 0 || got > capSecs*time.Second || got%time.Second != 0 {
			t.Fatalf("draw %v outside whole seconds in [0, %ds]", got, capSecs)
		}
		s := int(got / time.Second)
		counts[s]++
		sum += float64(s)
	}
	// Uniform over 0..600: mean 300, sd ≈ 173.5, so the mean of 200k draws
	// has sd ≈ 0.39 s; ±3 s is ~8 sd.
	if mean := sum / draws; math.Abs(mean-capSecs/2) > 3 {
		t.Errorf("mean of %d draws = %.2f s, want about %d s", draws, mean, capSecs/2)
	}
	// Each of the 601 values is expected ~333 times (sd ≈ 18); both ends
	// must be reachable and no value may be starved or favoured.
	for s, c := range counts {
		if c < 200 || c > 470 {
			t.Errorf("value %ds drawn %d times, want about %d", s, c, draws/(capSecs+1))
		}
	}
}

func BenchmarkBackoffInterval(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		retry.BackoffInterval(1, i%20, 600*time.Second, true, rng.IntN)
	}
}
