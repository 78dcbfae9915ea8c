package cli

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/celeriac/celeriac/examples/demotasks"
	"github.com/celeriac/celeriac/worker"
)

func TestRateLimitTasks(t *testing.T) {
	type limits struct{ Local, Global, Bucket string }
	for _, tt := range []struct {
		name          string
		local, global []string
		burst         int
		want          map[string]limits // tasks with limits; the rest have none
		wantErr       string
	}{
		{name: "none", want: map[string]limits{}},
		{name: "per worker", local: []string{"tasks.sleep=10/s", "tasks.add = 100/m"},
			want: map[string]limits{"tasks.sleep": {Local: "10/s"}, "tasks.add": {Local: "100/m"}}},
		{name: "global with bucket", global: []string{"tasks.sleep=5/s@api", "tasks.echo=5/s@api", "tasks.add=1/h"}, burst: 1,
			want: map[string]limits{"tasks.sleep": {Global: "5/s", Bucket: "api"}, "tasks.echo": {Global: "5/s", Bucket: "api"}, "tasks.add": {Global: "1/h"}}},
		{name: "both", local: []string{"tasks.sleep=10/s"}, global: []string{"tasks.sleep=5/s"}, burst: 2,
			want: map[string]limits{"tasks.sleep": {Local: "10/s", Global: "5/s"}}},
		{name: "unknown task", local: []string{"tasks.nope=1/s"}, wantErr: `no task "tasks.nope"`},
		{name: "no rate", global: []string{"tasks.sleep"}, burst: 1, wantErr: "want NAME=RATE"},
		{name: "bad unit", local: []string{"tasks.sleep=1/d"}, wantErr: "invalid rate limit unit"},
		{name: "zero", global: []string{"tasks.sleep=0"}, burst: 1, wantErr: "must be positive"},
		{name: "bucket on a local limit", local: []string{"tasks.sleep=1/s@x"}, wantErr: "has no bucket"},
		{name: "zero burst", global: []string{"tasks.sleep=1/s"}, burst: 0, wantErr: "--global-rate-burst"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mux := worker.NewMux()
			demotasks.Register(mux)
			err := rateLimitTasks(mux, tt.local, tt.global, tt.burst)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			have := map[string]limits{}
			for _, name := range mux.Names() {
				o, _ := mux.Options(name)
				if o.RateLimit != "" || o.GlobalRateLimit != "" {
					have[name] = limits{o.RateLimit, o.GlobalRateLimit, o.GlobalRateKey}
					if o.GlobalRateLimit != "" && o.GlobalRateBurst != tt.burst {
						t.Errorf("%s: burst %d, want %d", name, o.GlobalRateBurst, tt.burst)
					}
				}
			}
			if d := cmp.Diff(tt.want, have); d != "" {
				t.Errorf("limits (-want +got):\n%s", d)
			}
		})
	}
}

func TestIntegralArguments(t *testing.T) {
	args := map[string]map[string]any{
		"high": {"x-max-priority": float64(10), "x-message-ttl": 1.5e3, "x-queue-type": "classic"},
		"*":    {"x-expires": 0.5, "huge": 1e300},
	}
	integralArguments(args)
	want := map[string]map[string]any{
		"high": {"x-max-priority": int64(10), "x-message-ttl": int64(1500), "x-queue-type": "classic"},
		"*":    {"x-expires": 0.5, "huge": 1e300},
	}
	if d := cmp.Diff(want, args); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}
