package beat

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/celeriac/celeriac/internal/publish"
	"github.com/celeriac/celeriac/protocol"
	"github.com/celeriac/celeriac/transport"
)

// DefaultMaxLoopInterval is Celery's beat_max_loop_interval default for
// its own schedulers: 300 seconds.
const DefaultMaxLoopInterval = 300 * time.Second

// Config configures a Scheduler.
type Config struct {
	Entries []*Entry
	// Publisher sends the task messages (any transport.Transport).
	Publisher transport.Publisher
	// Store keeps the entries' state and says which replica sends. Nil:
	// an in-memory store, for a single beat (Celery's default scheduler
	// without its schedule file).
	Store Store
	// MaxLoopInterval is beat_max_loop_interval: the longest the scheduler
	// sleeps between looking at the schedule. Default 300 s.
	MaxLoopInterval time.Duration
	// DefaultQueue is task_default_queue (default "celery"); Routes a
	// static task_routes.
	DefaultQueue string
	Routes       map[string]string
	Logger       *zap.Logger
	// Now is the clock; default time.Now. Tests set it.
	Now func() time.Time
	// OnSend, if set, is told of each run sent (tests, metrics).
	OnSend func(e *Entry, id string, at time.Time)
}

// Store keeps what a scheduler must share with its replicas: which of
// them leads, and each entry's last run.
type Store interface {
	// Lead takes or keeps the lease; it returns true while this replica
	// is the one that sends. It is called at least every LeaseRenew.
	Lead(ctx context.Context) (bool, error)
	// LeaseRenew is how often Lead must be called to keep the lease.
	LeaseRenew() time.Duration
	// Load returns the entries' states, recording now as the last run of
	// those that have none (so that every replica counts from the same
	// instant, as Celery counts from when the entry was created).
	Load(ctx context.Context, entries []*Entry, now time.Time) (map[string]State, error)
	// Commit records the run of e that moves its state to next, and
	// publishes it: p through send. A store that can do both in one step
	// does, so a run is sent exactly when it is recorded. ErrLostLease: the
	// replica no longer leads, or another changed the state; nothing was
	// recorded or sent.
	Commit(ctx context.Context, e *Entry, next State, p *transport.Publishing, send func(context.Context) error) error
	// Release gives the lease up (on shutdown), so a standby takes over
	// without waiting for it to expire.
	Release(ctx context.Context) error
}

// Reloader is a Store whose entries live with it and change (the rows of
// django-celery-beat's tables): the scheduler asks Changed every
// LeaseRenew while it leads, and reads the entries again when it says so.
type Reloader interface {
	Store
	Changed(ctx context.Context) (bool, error)
	Entries(ctx context.Context, now time.Time) ([]*Entry, map[string]State, error)
}

// ErrLostLease is a Commit refused because this replica no longer holds
// the lease, or its view of an entry's state is stale.
var ErrLostLease = errors.New("beat: lease lost")

// Scheduler sends the due runs of its entries.
type Scheduler struct {
	cfg     Config
	entries []*Entry
	store   Store
	log     *zap.Logger
	prod    *publish.Producer
	// replyTo is what Python beat sets as reply_to: the sending thread's
	// oid, one per process.
	replyTo string
}

// New returns a Scheduler.
func New(cfg Config) *Scheduler {
	if cfg.MaxLoopInterval <= 0 {
		cfg.MaxLoopInterval = DefaultMaxLoopInterval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	st := cfg.Store
	if st == nil {
		st = NewMemoryStore()
	}
	return &Scheduler{cfg: cfg, entries: cfg.Entries, store: st, log: cfg.Logger,
		prod:    publish.New(cfg.Publisher, publish.Config{DefaultQueue: cfg.DefaultQueue, Routes: cfg.Routes}),
		replyTo: protocol.NewID()}
}

// Run sends due runs until ctx ends; it then releases the lease.
func (s *Scheduler) Run(ctx context.Context) error {
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.store.Release(rctx); err != nil {
			s.log.Warn("beat: releasing the lease", zap.Error(err))
		}
	}()
	var states map[string]State
	leading := false
	rl, reloads := s.store.(Reloader)
	for {
		lead, err := s.store.Lead(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			s.log.Warn("beat: lease", zap.Error(err))
		}
		if lead && leading && reloads {
			if changed, err := rl.Changed(ctx); err != nil {
				s.log.Warn("beat: reading the schedule's change marker", zap.Error(err))
			} else if changed {
				s.log.Info("beat: the schedule changed: reading it again")
				leading = false // read entries and states below
			}
		}
		if lead && !leading {
			if reloads {
				var entries []*Entry
				entries, states, err = rl.Entries(ctx, s.cfg.Now())
				if entries != nil {
					s.entries = entries
				}
				if err != nil && states != nil {
					s.log.Error("beat: entries left out", zap.Error(err))
					err = nil
				}
			} else {
				states, err = s.store.Load(ctx, s.entries, s.cfg.Now())
			}
			if err != nil {
				s.log.Warn("beat: loading the schedule state", zap.Error(err))
				lead = false
			} else {
				s.log.Info("beat: leading: sending the schedule's runs", zap.Int("entries", len(s.entries)))
			}
		} else if !lead && leading {
			s.log.Warn("beat: lost the lease: standing by")
		}
		leading = lead
		wait := s.store.LeaseRenew()
		if leading {
			next, err := s.tick(ctx, states)
			if errors.Is(err, ErrLostLease) {
				s.log.Warn("beat: lost the lease while sending: standing by")
				leading = false
			} else if next < wait {
				wait = next
			}
		}
		t := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// tick sends every entry due now and returns how long until one may be
// due (at most the max loop interval).
func (s *Scheduler) tick(ctx context.Context, states map[string]State) (time.Duration, error) {
	next := s.cfg.MaxLoopInterval
	gate, gated := s.store.(interface {
		Due(name string, now time.Time) bool
	})
	for _, e := range s.entries {
		now := s.cfg.Now().Truncate(time.Microsecond) // Python's datetimes
		if gated && !gate.Due(e.Name, now) {
			continue
		}
		st := states[e.Name]
		due, in, err := e.Schedule.IsDue(st.LastRunAt, now)
		if err != nil {
			s.log.Error("beat: schedule", zap.String("entry", e.Name), zap.Error(err))
			continue
		}
		if due {
			nst := State{LastRunAt: now, TotalRunCount: st.TotalRunCount + 1}
			if err := s.send(ctx, e, nst); err != nil {
				if errors.Is(err, ErrLostLease) {
					return 0, err
				}
				// Celery advances the entry before sending, and logs a
				// failed send: the run is not retried.
				s.log.Error("beat: sending", zap.String("entry", e.Name), zap.String("task", e.Task), zap.Error(err))
			}
			states[e.Name] = nst
		}
		next = min(next, in)
	}
	return next, nil
}

// SendNow sends one run of e now, as when it is due (Python beat's
// apply_entry), recording it in the store, and returns the task id. It
// does not take the lease: callers that share a store with running
// replicas get ErrLostLease unless this replica leads.
func (s *Scheduler) SendNow(ctx context.Context, e *Entry, st State) (string, error) {
	var id string
	st = State{LastRunAt: s.cfg.Now(), TotalRunCount: st.TotalRunCount + 1}
	err := s.sendID(ctx, e, st, &id)
	return id, err
}

// send builds the run's message as Python beat's send_task does and
// commits it.
func (s *Scheduler) send(ctx context.Context, e *Entry, st State) error {
	return s.sendID(ctx, e, st, nil)
}

func (s *Scheduler) sendID(ctx context.Context, e *Entry, st State, id *string) error {
	o, err := publish.FromSignature(e.Options, st.LastRunAt)
	if err != nil {
		return fmt.Errorf("options: %w", err)
	}
	if o.ReplyTo == "" {
		o.ReplyTo = s.replyTo
	}
	if o.IgnoreResult == nil {
		f := false // send_task's default, always in the message
		o.IgnoreResult = &f
	}
	m, dest := s.prod.Build(e.Task, e.Args, e.Kwargs, o, st.LastRunAt)
	if id != nil {
		*id = m.ID
	}
	m.ArgsRepr, m.KwargsRepr = e.ArgsRepr, e.KwargsRepr
	switch {
	case m.ArgsRepr != "":
	case len(e.Args) == 0: // ScheduleEntry's default args, ()
		m.ArgsRepr = "()"
	default: // Python beat's args are a list (from JSON), not a tuple
		m.ArgsRepr = protocol.SafeRepr(m.Args, protocol.ReprMaxSize)
	}
	msg, err := protocol.EncodeTask(m, protocol.EncodeOptions{ContentType: o.Serializer, Compression: o.Compression})
	if err != nil {
		return err
	}
	if name, ok := e.Options["periodic_task_name"].(string); ok {
		// django-celery-beat's ModelEntry passes it as an option, which
		// send_task_message makes a message property.
		if msg.Properties.Extra == nil {
			msg.Properties.Extra = map[string]any{}
		}
		msg.Properties.Extra["periodic_task_name"] = name
	}
	p := &transport.Publishing{Exchange: dest.Exchange, ExchangeType: dest.ExchangeType, RoutingKey: dest.RoutingKey, Message: *msg}
	s.log.Info("beat: Sending due task", zap.String("entry", e.Name), zap.String("task", e.Task), zap.String("id", m.ID))
	err = s.store.Commit(ctx, e, st, p, func(ctx context.Context) error { return s.cfg.Publisher.Publish(ctx, p) })
	if err == nil && s.cfg.OnSend != nil {
		s.cfg.OnSend(e, m.ID, st.LastRunAt)
	}
	return err
}

// MemoryStore keeps the state in the process: one beat, no failover.
type MemoryStore struct {
	mu     sync.Mutex
	states map[string]State
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{states: map[string]State{}} }

// Lead always leads.
func (m *MemoryStore) Lead(context.Context) (bool, error) { return true, nil }

// LeaseRenew is a minute: there is no lease to keep.
func (m *MemoryStore) LeaseRenew() time.Duration { return time.Minute }

// Load returns the states, starting missing ones at now.
func (m *MemoryStore) Load(_ context.Context, entries []*Entry, now time.Time) (map[string]State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]State{}
	for _, e := range entries {
		st, ok := m.states[e.Name]
		if !ok {
			st = State{LastRunAt: now}
			m.states[e.Name] = st
		}
		out[e.Name] = st
	}
	return out, nil
}

// Commit records the run, then sends it.
func (m *MemoryStore) Commit(ctx context.Context, e *Entry, next State, _ *transport.Publishing, send func(context.Context) error) error {
	m.mu.Lock()
	m.states[e.Name] = next
	m.mu.Unlock()
	return send(ctx)
}

// Release does nothing.
func (m *MemoryStore) Release(context.Context) error { return nil }

// replicaID names this process in the lease: host and pid.
func replicaID() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid())
}
