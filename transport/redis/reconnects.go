package redis

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"syscall"

	goredis "github.com/redis/go-redis/v9"
)

// connWatch counts reconnections for metrics. go-redis re-dials and retries
// commands on its own, so the transport never sees most losses; instead a
// connection whose read fails for any reason but a timeout (the server
// closed it, the network dropped) marks the link lost, and the next
// successful dial counts as a reconnect.
type connWatch struct {
	lost       atomic.Bool
	reconnects *atomic.Int64
}

func (w *connWatch) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if w.lost.Swap(false) {
			w.reconnects.Add(1)
		}
		return &watchedConn{Conn: c, lost: &w.lost}, nil
	}
}

func (w *connWatch) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (w *connWatch) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

type watchedConn struct {
	net.Conn
	lost *atomic.Bool
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			c.lost.Store(true)
		}
	}
	return n, err
}

// SyscallConn lets go-redis's pool check idle connections for liveness
// through the wrapper.
func (c *watchedConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.New("redis: connection has no syscall.Conn")
}
