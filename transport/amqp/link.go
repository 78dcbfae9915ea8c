package amqp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/transport"
)

// link keeps one AMQP connection alive. It dials the broker URLs in the
// order of the failover strategy; after a loss it reconnects in rounds
// (every URL once, the lost one last under round-robin) with Celery's pause
// between failed rounds. Users take the current connection with current or
// next, which wait during an outage.
type link struct {
	s    *settings
	role string // "consumer" or "publisher", appended to the connection name
	log  *zap.Logger

	cancel context.CancelFunc // ends the supervisor
	done   <-chan struct{}    // closed when the link is closing
	wg     sync.WaitGroup     // the supervisor

	mu    sync.Mutex
	cur   *session      // nil during an outage
	down  error         // why cur is nil during an outage
	ready chan struct{} // closed when cur is set; replaced on loss
	seq   uint64        // session ids

	// dialHook, when set (tests), sees every raw connection before AMQP
	// runs over it.
	dialHook func(*tagFixConn)
}

// session is one AMQP connection of a link.
type session struct {
	conn *amqp091.Connection
	id   uint64
	url  brokerURL
	raw  *tagFixConn
	// lost is closed once the connection is gone; err then says why.
	lost chan struct{}
	err  error

	mu       sync.Mutex
	declared map[string]bool // topology ensured on this connection
}

// isLost reports whether the connection is known to be gone.
func (s *session) isLost() bool {
	select {
	case <-s.lost:
		return true
	default:
		return s.conn.IsClosed()
	}
}

func (s *session) wasDeclared(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.declared[key]
}

func (s *session) setDeclared(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.declared == nil {
		s.declared = make(map[string]bool)
	}
	s.declared[key] = true
}

// dialLink connects to the first URL that answers, trying each once in
// order, and starts the supervisor. hook may be nil.
func dialLink(ctx context.Context, s *settings, role string, hook func(*tagFixConn)) (*link, error) {
	l := &link{
		s:        s,
		role:     role,
		log:      s.log.With(zap.String("connection", s.ConnectionName+" "+role)),
		ready:    make(chan struct{}),
		dialHook: hook,
	}
	var errs []error
	for _, i := range s.order(-1) {
		sess, err := l.dial(ctx, i)
		if err == nil {
			l.cur = sess
			close(l.ready)
			life, cancel := context.WithCancel(context.Background())
			l.cancel = cancel
			l.done = life.Done()
			l.wg.Go(func() { l.supervise(life, sess) })
			l.log.Info("amqp connected", zap.String("url", sess.url.redacted))
			return l, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", s.urls[i].redacted, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("amqp: connect %s: %w", role, errors.Join(errs...))
}

// dial opens one connection to URL i. Cancelling ctx aborts the attempt.
func (l *link) dial(ctx context.Context, i int) (*session, error) {
	u := l.s.urls[i]
	var raw atomic.Pointer[tagFixConn]
	cfg := amqp091.Config{
		Heartbeat: l.s.Heartbeat,
		Properties: amqp091.Table{
			"connection_name": l.s.ConnectionName + " " + l.role,
			"product":         "celeriac",
			"platform":        "Go",
			"information":     "https://github.com/celeriac/celeriac",
		},
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: l.s.DialTimeout}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bounds the TLS and AMQP handshakes; amqp091 clears it once
			// the connection is open and then runs heartbeat deadlines.
			if err := c.SetDeadline(time.Now().Add(l.s.DialTimeout)); err != nil {
				c.Close()
				return nil, err
			}
			if u.tls {
				tc := tls.Client(c, l.tlsConfig(u))
				if err := tc.HandshakeContext(ctx); err != nil {
					c.Close()
					return nil, fmt.Errorf("tls handshake: %w", err)
				}
				c = tc
			}
			fc := newTagFixConn(c)
			raw.Store(fc)
			if l.dialHook != nil {
				l.dialHook(fc)
			}
			return fc, nil
		},
	}
	// A cancelled ctx expires the deadline, which ends a handshake that is
	// waiting on the network.
	stop := context.AfterFunc(ctx, func() {
		if c := raw.Load(); c != nil {
			_ = c.SetDeadline(time.Unix(1, 0))
		}
	})
	conn, err := amqp091.DialConfig(u.dial, cfg)
	stop()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	l.mu.Lock()
	l.seq++
	id := l.seq
	l.mu.Unlock()
	return &session{conn: conn, id: id, url: u, raw: raw.Load(), lost: make(chan struct{})}, nil
}

func (l *link) tlsConfig(u brokerURL) *tls.Config {
	var c *tls.Config
	if l.s.TLS != nil {
		c = l.s.TLS.Clone()
	} else {
		c = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if c.ServerName == "" {
		c.ServerName = u.host
	}
	return c
}

// supervise watches the current connection and replaces it when it is lost,
// until the link closes.
func (l *link) supervise(ctx context.Context, sess *session) {
	for {
		notify := sess.conn.NotifyClose(make(chan *amqp091.Error, 1))
		var reason error
		select {
		case e, ok := <-notify:
			if ok && e != nil {
				reason = e
			} else {
				reason = amqp091.ErrClosed
			}
		case <-ctx.Done():
			l.mu.Lock()
			l.cur = nil
			l.mu.Unlock()
			_ = sess.conn.CloseDeadline(time.Now().Add(5 * time.Second))
			sess.err = transport.ErrClosed
			close(sess.lost)
			return
		}
		l.mu.Lock()
		l.cur = nil
		l.down = reason
		l.ready = make(chan struct{})
		l.mu.Unlock()
		sess.err = reason
		close(sess.lost)
		l.log.Warn("amqp connection lost; reconnecting", zap.String("url", sess.url.redacted), zap.Error(reason))

		next := l.reconnect(ctx, sess)
		if next == nil {
			return
		}
		l.mu.Lock()
		l.cur = next
		l.down = nil
		close(l.ready)
		l.mu.Unlock()
		l.s.reconnects.Add(1)
		if next.url != sess.url {
			l.s.failovers.Add(1)
			l.log.Warn("amqp failed over to another broker node", zap.String("from", sess.url.redacted),
				zap.String("url", next.url.redacted), zap.Uint64("session", next.id))
		} else {
			l.log.Info("amqp reconnected", zap.String("url", next.url.redacted), zap.Uint64("session", next.id))
		}
		sess = next
	}
}

// reconnect dials until a URL answers or ctx ends: each round tries every
// URL once, in the failover strategy's order, then pauses.
func (l *link) reconnect(ctx context.Context, prev *session) *session {
	lost := -1
	for i, u := range l.s.urls {
		if u == prev.url {
			lost = i
			break
		}
	}
	for round := 0; ; round++ {
		var errs []error
		for _, i := range l.s.order(lost) {
			attempt, cancel := context.WithTimeout(ctx, l.s.DialTimeout)
			sess, err := l.dial(attempt, i)
			cancel()
			if err == nil {
				return sess
			}
			if ctx.Err() != nil {
				return nil
			}
			errs = append(errs, fmt.Errorf("%s: %w", l.s.urls[i].redacted, err))
		}
		d := l.s.pause(round)
		// Each round is logged; the delay caps the rate at one line per
		// ReconnectMax once the broker stays away.
		l.log.Warn("amqp reconnect failed", zap.Int("round", round), zap.Duration("retry_in", d),
			zap.Error(errors.Join(errs...)))
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		}
	}
}

// current returns the live connection, waiting during an outage. It returns
// transport.ErrClosed once the link is closed, or ctx's error.
func (l *link) current(ctx context.Context) (*session, error) {
	return l.next(ctx, nil)
}

// next returns a live connection other than prev (which the caller found
// broken), waiting for prev to be declared lost and replaced.
func (l *link) next(ctx context.Context, prev *session) (*session, error) {
	if prev != nil {
		select {
		case <-prev.lost:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.done:
			return nil, transport.ErrClosed
		}
	}
	for {
		l.mu.Lock()
		cur, ready := l.cur, l.ready
		l.mu.Unlock()
		select {
		case <-l.done:
			return nil, transport.ErrClosed
		default:
		}
		if cur != nil && cur != prev && !cur.isLost() {
			return cur, nil
		}
		if cur != nil {
			// Broken but not yet replaced: wait for the supervisor.
			select {
			case <-cur.lost:
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-l.done:
				return nil, transport.ErrClosed
			}
			continue
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.done:
			return nil, transport.ErrClosed
		}
	}
}

// node returns the redacted URL of the live connection, or "" during an
// outage.
func (l *link) node() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur == nil {
		return ""
	}
	return l.cur.url.redacted
}

// up reports, without waiting, whether the link has a live connection.
func (l *link) up() error {
	l.mu.Lock()
	cur, down := l.cur, l.down
	l.mu.Unlock()
	select {
	case <-l.done:
		return transport.ErrClosed
	default:
	}
	if cur == nil || cur.isLost() {
		if down == nil {
			down = errors.New("connection lost")
		}
		return fmt.Errorf("amqp: %s connection down, reconnecting: %w", l.role, down)
	}
	return nil
}

// close closes the connection and stops reconnecting.
func (l *link) close() {
	l.cancel()
	l.wg.Wait()
}
