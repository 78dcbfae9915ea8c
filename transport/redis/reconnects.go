package redis

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// connWatch counts reconnections for metrics. go-redis re-dials and retries
// commands on its own, so the transport never sees most losses; instead a
// connection whose read fails for any reason but a timeout (the server
// closed it, the network dropped) marks the link lost, and the next
// successful dial counts as a reconnect.
//
// It also tells which server the connections go to. Behind Sentinel every
// new connection asks the Sentinels for the master first, so a dial that
// reaches another address than the last one is a failover: it is counted
// and logged, because writes the old master acknowledged and had not
// replicated are gone.
type connWatch struct {
	lost       atomic.Bool
	reconnects atomic.Int64
	failovers  atomic.Int64
	log        *zap.Logger

	mu   sync.Mutex
	node string // the address of the last connection made
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
		w.sawNode(c.RemoteAddr().String())
		return &watchedConn{Conn: c, lost: &w.lost}, nil
	}
}

func (w *connWatch) sawNode(addr string) {
	w.mu.Lock()
	prev := w.node
	w.node = addr
	w.mu.Unlock()
	if prev != "" && prev != addr {
		w.failovers.Add(1)
		if w.log != nil {
			w.log.Warn("redis: the master changed (Sentinel failover); writes the old master had not replicated are lost: "+
				"messages published to it, and acks (those messages run again)",
				zap.String("from", prev), zap.String("to", addr))
		}
	}
}

// current returns the address of the last connection made.
func (w *connWatch) current() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.node
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

// waitReplicated runs WAIT on cn after n writes of kind (acks, publishes)
// and logs and counts them when fewer replicas than Config.WaitReplicas
// acknowledged them within Config.WaitTimeout.
func (t *Transport) waitReplicated(ctx context.Context, cn *goredis.Conn, kind string, n int) {
	got, err := cn.Wait(ctx, t.cfg.WaitReplicas, t.cfg.WaitTimeout).Result()
	if err == nil && got >= int64(t.cfg.WaitReplicas) {
		return
	}
	total := t.unreplicated.Add(int64(n))
	now := time.Now().UnixNano()
	last := t.lastUnreplicatedLog.Load()
	if now-last < int64(5*time.Second) || !t.lastUnreplicatedLog.CompareAndSwap(last, now) {
		return
	}
	t.log.Warn("redis: writes not replicated in time; a failover now would lose them",
		zap.String("writes", kind), zap.Int("count", n), zap.Int64("replicas", got),
		zap.Int("want_replicas", t.cfg.WaitReplicas), zap.Duration("wait_timeout", t.cfg.WaitTimeout),
		zap.Int64("unreplicated_total", total), zap.Error(err))
}

// Unreplicated reports how many acks and publishes were not acknowledged
// by Config.WaitReplicas replicas in time (always 0 without WaitReplicas),
// for metrics.
func (t *Transport) Unreplicated() int64 { return t.unreplicated.Load() }

// Node returns the address of the Redis server the transport last
// connected to: behind Sentinel, the master in use.
func (t *Transport) Node() string { return t.watch.current() }

// Failovers reports how many times a new connection reached another server
// than the one before: behind Sentinel, how many failovers the transport
// followed.
func (t *Transport) Failovers() int64 { return t.watch.failovers.Load() }
