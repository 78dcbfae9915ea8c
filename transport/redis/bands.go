package redis

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/transport"
)

// BandLen is the number of ready messages in one priority band of a queue.
type BandLen struct {
	// Priority is the band's step (kombu's priority_steps: 0, 3, 6, 9 by
	// default); messages of priorities from it up to the next step land
	// there. Lower steps are consumed first, as kombu does.
	Priority int
	Len      int
}

// BandLens returns the ready messages of each priority band of a queue, in
// consume order (what Len adds up), for monitors such as celeriac
// dashboard.
func (t *Transport) BandLens(ctx context.Context, queue string) ([]BandLen, error) {
	if t.isClosed() {
		return nil, transport.ErrClosed
	}
	var out []BandLen
	var cmds []*goredis.IntCmd
	seen := map[string]bool{}
	_, err := t.rdb.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for _, s := range t.keys.steps {
			key := t.keys.prefix + t.keys.queueBand(queue, s)
			if seen[key] {
				continue
			}
			seen[key] = true
			out = append(out, BandLen{Priority: s})
			cmds = append(cmds, p.LLen(ctx, key))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redis: band lengths of %q: %w", queue, err)
	}
	for i, c := range cmds {
		out[i].Len = int(c.Val())
	}
	return out, nil
}
