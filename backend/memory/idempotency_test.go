package memory_test

import (
	"testing"

	"github.com/celeriac/celeriac/backend"
	"github.com/celeriac/celeriac/backend/backendtest"
	"github.com/celeriac/celeriac/backend/memory"
)

func TestIdempotencyConformance(t *testing.T) {
	backendtest.RunIdempotency(t, func(t *testing.T) backend.IdempotencyStore { return memory.NewIdempotency() })
}
