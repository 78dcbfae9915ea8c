package commit

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
)

func TestOutcome(t *testing.T) {
	boom := errors.New("boom")
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name     string
		reported bool
		err      error
		ctx      context.Context
		want     error
	}{
		{"written", true, nil, context.Background(), nil},
		{"failed", true, boom, context.Background(), boom},
		// Reported before ctx ended is checked first: every time, not
		// half the time as one select would.
		{"written, ctx ended", true, nil, ended, nil},
		{"failed, ctx ended", true, boom, ended, boom},
		{"not reported, ctx ended", false, nil, ended, context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 100 {
				o := NewOutcome()
				if tt.reported {
					o.Report(tt.err)
				}
				if got := o.Wait(tt.ctx); !errors.Is(got, tt.want) || (tt.want == nil && got != nil) {
					t.Fatalf("Wait = %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func TestOutcomeWakesWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := NewOutcome()
		errs := make(chan error, 3)
		for range 3 {
			go func() { errs <- o.Wait(context.Background()) }()
		}
		synctest.Wait()
		select {
		case err := <-errs:
			t.Fatalf("Wait returned %v before Report", err)
		default:
		}
		o.Report(nil)
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatalf("Wait = %v after Report(nil)", err)
			}
		}
		if o.Err() != nil {
			t.Fatalf("Err = %v", o.Err())
		}
	})
}
