package publish

import "sync/atomic"

// Clock is the Lamport clock that kombu's event and pidbox messages carry
// in their clock header.
type Clock struct{ v atomic.Int64 }

// Tick advances the clock for a message sent.
func (c *Clock) Tick() int64 { return c.v.Add(1) }

// Adjust moves the clock past a received value: max(local, other) + 1.
func (c *Clock) Adjust(other int64) int64 {
	for {
		cur := c.v.Load()
		next := max(cur, other) + 1
		if c.v.CompareAndSwap(cur, next) {
			return next
		}
	}
}

// Value reads the clock.
func (c *Clock) Value() int64 { return c.v.Load() }
