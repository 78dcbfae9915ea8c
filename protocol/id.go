package protocol

import "crypto/rand"

// NewID returns a random (version 4) UUID string, the form Celery uses for
// task, group and message ids.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return UUID4(b).String()
}
