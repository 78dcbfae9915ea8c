package worker

import (
	"crypto/rand"

	"github.com/celeriac/celeriac/protocol"
)

// NewID returns a random (version 4) UUID string, the form Celery uses for
// task ids.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return protocol.UUID4(b).String()
}
