package connect_test

import (
	"testing"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/transport/transporttest"
	"github.com/celeriac/celeriac/worker/connect"
)

// The idempotency tests' Redis database (see docs/testing.md).
const idemDB = 7

func TestOpenIdempotencyStore(t *testing.T) {
	tests := []struct {
		name    string
		backend func(t *testing.T) string
		// same: the store is the result backend itself.
		want, same bool
	}{
		{"redis backend", func(t *testing.T) string { return transporttest.RedisURL(t, idemDB) }, true, true},
		{"memory backend", func(*testing.T) string { return "memory://" }, true, false},
		{"rpc backend", func(*testing.T) string { return "rpc://" }, false, false},
		{"no backend", func(*testing.T) string { return "" }, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := connect.Open(t.Context(), connect.Options{BrokerURL: "memory://", ResultBackend: tt.backend(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if (c.Idempotency != nil) != tt.want {
				t.Fatalf("Idempotency = %T, want a store: %v", c.Idempotency, tt.want)
			}
			if tt.same && c.Idempotency != c.Backend.(backend.IdempotencyStore) {
				t.Fatal("Idempotency is not the Redis result backend")
			}
		})
	}
}
