package amqp

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/celeriac/celeriac/transport"
	"github.com/celeriac/celeriac/transport/transporttest"
)

// TestPing: Ping answers while the broker is reachable, fails while it is
// not (refused through a proxy), answers again after the reconnection, and
// reports ErrClosed after Close.
func TestPing(t *testing.T) {
	broker := transporttest.AMQPURL(t)
	p := newProxy(t, broker, nil)
	h := newHarness(t, Config{URL: p.url(broker, "amqp")})
	ctx := testCtx(t)
	if err := h.tr.Ping(ctx); err != nil {
		t.Fatalf("Ping with the broker up: %v", err)
	}
	// poll waits for Ping to reach the wanted state: losses and
	// reconnections are noticed asynchronously.
	poll := func(want bool) error {
		t.Helper()
		deadline := time.Now().Add(waitBound)
		for {
			err := h.tr.Ping(ctx)
			if (err == nil) == want {
				return err
			}
			if time.Now().After(deadline) {
				t.Fatalf("Ping = %v; want ok=%v", err, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	p.refuse(true)
	p.drop()
	err := poll(false)
	t.Logf("Ping while down: %v", err)
	if !strings.Contains(err.Error(), "reconnecting") {
		t.Errorf("Ping error %q does not say the transport is reconnecting", err)
	}
	if strings.Contains(err.Error(), "guest:guest") {
		t.Errorf("Ping error %q shows the password", err)
	}

	p.refuse(false)
	poll(true)

	if err := h.tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.tr.Ping(ctx); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Ping after Close = %v, want ErrClosed", err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.tr.Ping(cancelled); err == nil {
		t.Fatal("Ping with a cancelled ctx succeeded")
	}
}
