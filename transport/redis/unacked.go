package redis

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/celeriac/celeriac/transport"
)

// UnackedCount is what UnackedByRoutingKey found in kombu's unacked hash.
type UnackedCount struct {
	// ByRoutingKey counts the entries read by the routing key they were
	// published with: a queue's name under Celery's default routing.
	// Entries whose value is not kombu's [message, exchange, routing key]
	// count under "".
	ByRoutingKey map[string]int
	// Read is the number of entries read, Total the hash's length when
	// the scan began.
	Read, Total int
	// Capped reports that the scan stopped at one of its bounds before
	// the end of the hash: the counts are then lower bounds.
	Capped bool
}

// Bounds of UnackedByRoutingKey: anything in the hash may have been
// written by anyone, so the scan reads a bounded number of entries and
// bytes, in a bounded number of round trips, and keeps a bounded number of
// short keys, whatever the hash holds.
const (
	unackedScanCount   = 200
	unackedMaxBytes    = 16 << 20
	unackedMaxKeys     = 1000
	unackedMaxKeyBytes = 256
)

// UnackedByRoutingKey counts the messages delivered and not yet
// acknowledged (kombu's unacked hash, which Python and Go workers share),
// by routing key, reading at most limit entries (HSCAN), for monitors such
// as celeriac dashboard. It never loads the whole hash.
func (t *Transport) UnackedByRoutingKey(ctx context.Context, limit int) (UnackedCount, error) {
	if t.isClosed() {
		return UnackedCount{}, transport.ErrClosed
	}
	total, err := t.rdb.HLen(ctx, t.keys.unacked).Result()
	if err != nil {
		return UnackedCount{}, fmt.Errorf("redis: unacked: %w", err)
	}
	scan := func(ctx context.Context, cursor uint64) ([]string, uint64, error) {
		return t.rdb.HScan(ctx, t.keys.unacked, cursor, "", unackedScanCount).Result()
	}
	c, err := countUnacked(ctx, scan, limit, unackedMaxBytes)
	if err != nil {
		return c, fmt.Errorf("redis: unacked: %w", err)
	}
	c.Total = int(total)
	if c.Read < c.Total && !c.Capped {
		// Entries acked during the scan leave it short of HLEN: that is
		// the end of the hash, not a bound.
		c.Total = c.Read
	}
	return c, nil
}

// countUnacked runs the scan: scan returns field/value pairs and the next
// cursor (0 at the end), as HSCAN does.
func countUnacked(ctx context.Context, scan func(context.Context, uint64) ([]string, uint64, error), limit, maxBytes int) (UnackedCount, error) {
	c := UnackedCount{ByRoutingKey: map[string]int{}}
	// HSCAN may answer empty pages; the rounds are bounded all the same.
	rounds := limit/unackedScanCount*2 + 10
	var cursor uint64
	bytes := 0
	for range rounds {
		kv, next, err := scan(ctx, cursor)
		if err != nil {
			return c, err
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if c.Read >= limit || bytes >= maxBytes {
				c.Capped = true
				return c, nil
			}
			c.Read++
			bytes += len(kv[i+1])
			rk := unackedRoutingKey(kv[i+1])
			if _, ok := c.ByRoutingKey[rk]; !ok && len(c.ByRoutingKey) >= unackedMaxKeys {
				rk = ""
			}
			c.ByRoutingKey[rk]++
		}
		if next == 0 {
			return c, nil
		}
		cursor = next
	}
	c.Capped = true
	return c, nil
}

// unackedRoutingKey is the routing key of an unacked hash value, "" when
// the value is not kombu's [message, exchange, routing key] or the key is
// longer than any queue name the dashboard shows.
func unackedRoutingKey(v string) string {
	parts, err := splitUnacked([]byte(v))
	if err != nil {
		return ""
	}
	var rk string
	if json.Unmarshal(parts[2], &rk) != nil || len(rk) > unackedMaxKeyBytes {
		return ""
	}
	return rk
}
