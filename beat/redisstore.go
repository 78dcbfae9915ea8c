package beat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/celeriac/celeriac/transport"
)

// RedisStore is the highly available store: any number of replicas share
// one Redis; one holds the lease and sends, the others stand by. The keys
// are RedBeat's where they mean the same thing:
//
//	<prefix>:lock       the lease: "<fencing number>:<host>:<pid>", with a TTL
//	<prefix>:fence      the fencing counter (celeriac's)
//	<prefix><name>      a hash per entry: definition and meta (last_run_at,
//	                    total_run_count) as RedBeat encodes them
//	<prefix>:schedule   a sorted set of the entry keys by next due time
//
// with prefix "redbeat:" by default (redbeat_key_prefix). The lease is
// taken with SET NX PX, in a script that also draws the fencing number,
// and renewed only by its holder. Every run is recorded by a script that
// first checks the lease is still this replica's and the entry's meta is
// what it read, so a replica that lost the lease (paused, partitioned)
// records nothing. Where the broker is this Redis and the run goes to a
// queue (not through an exchange), the same script pushes the message:
// a run is then sent exactly when it is recorded, and a new leader
// neither repeats nor skips it. Otherwise the run is recorded, then
// published: a replica killed between the two loses that run (it is
// never sent twice).
type RedisStore struct {
	rdb     goredis.Cmdable
	prefix  string
	ttl     time.Duration
	id      string
	prepare func(*transport.Publishing) (string, []byte, bool, error)

	mu    sync.Mutex
	token string            // the lease's value while this replica holds it
	metas map[string]string // each entry's meta as last read or written
}

// RedisStoreConfig configures a RedisStore.
type RedisStoreConfig struct {
	// KeyPrefix is redbeat_key_prefix; default "redbeat:".
	KeyPrefix string
	// LeaseTTL is how long the lease outlives its holder: the longest a
	// dead leader delays its successor. Default 5 s; it is renewed every
	// third of it.
	LeaseTTL time.Duration
	// PrepareLPush, when the broker is this Redis, lays a publishing out
	// as one LPUSH (the Redis transport's PrepareLPush), so that the
	// run's record and its message are written by one script.
	PrepareLPush func(*transport.Publishing) (key string, data []byte, ok bool, err error)
	// ReplicaID names this replica in the lease; default host:pid.
	ReplicaID string
}

// NewRedisStore returns a store on rdb.
func NewRedisStore(rdb goredis.Cmdable, cfg RedisStoreConfig) *RedisStore {
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = "redbeat:"
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 5 * time.Second
	}
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = replicaID()
	}
	return &RedisStore{rdb: rdb, prefix: cfg.KeyPrefix, ttl: cfg.LeaseTTL, id: cfg.ReplicaID,
		prepare: cfg.PrepareLPush, metas: map[string]string{}}
}

func (r *RedisStore) lockKey() string     { return r.prefix + ":lock" }
func (r *RedisStore) fenceKey() string    { return r.prefix + ":fence" }
func (r *RedisStore) scheduleKey() string { return r.prefix + ":schedule" }
func (r *RedisStore) entryKey(name string) string {
	return r.prefix + name
}

var (
	acquireScript = goredis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local tok = redis.call('INCR', KEYS[2]) .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], tok, 'NX', 'PX', ARGV[2])
return tok`)
	renewScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0`)
	releaseScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)
	// commitScript: KEYS lock, entry hash, schedule zset[, queue list];
	// ARGV token, expected meta, new meta, score, member[, envelope].
	commitScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 'lost' end
local cur = redis.call('HGET', KEYS[2], 'meta')
if (cur or '') ~= ARGV[2] then return 'stale' end
redis.call('HSET', KEYS[2], 'meta', ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[5])
if KEYS[4] then redis.call('LPUSH', KEYS[4], ARGV[6]) end
return 'ok'`)
	// initScript: KEYS lock, entry hash; ARGV token, meta, definition.
	initScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
redis.call('HSETNX', KEYS[2], 'meta', ARGV[2])
redis.call('HSET', KEYS[2], 'definition', ARGV[3])
return redis.call('HGET', KEYS[2], 'meta')`)
)

// LeaseRenew is a third of the lease's TTL.
func (r *RedisStore) LeaseRenew() time.Duration { return r.ttl / 3 }

// Lead renews the lease this replica holds, or takes it when it is free.
func (r *RedisStore) Lead(ctx context.Context) (bool, error) {
	r.mu.Lock()
	tok := r.token
	r.mu.Unlock()
	ms := r.ttl.Milliseconds()
	if tok != "" {
		n, err := renewScript.Run(ctx, r.rdb, []string{r.lockKey()}, tok, ms).Int64()
		if err == nil && n == 1 {
			return true, nil
		}
		r.mu.Lock()
		r.token = ""
		r.mu.Unlock()
		if err != nil {
			return false, err
		}
	}
	res, err := acquireScript.Run(ctx, r.rdb, []string{r.lockKey(), r.fenceKey()}, r.id, ms).Text()
	if errors.Is(err, goredis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	r.mu.Lock()
	r.token = res
	r.mu.Unlock()
	return true, nil
}

// Token is the lease's value while this replica holds it ("" otherwise):
// the fencing number and the replica.
func (r *RedisStore) Token() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.token
}

// Load reads every entry's meta, recording now for those without one.
func (r *RedisStore) Load(ctx context.Context, entries []*Entry, now time.Time) (map[string]State, error) {
	tok := r.Token()
	out := map[string]State{}
	metas := map[string]string{}
	for _, e := range entries {
		def, _ := json.Marshal(definition(e))
		meta, err := initScript.Run(ctx, r.rdb, []string{r.lockKey(), r.entryKey(e.Name)}, tok,
			encodeMeta(State{LastRunAt: now}), string(def)).Text()
		if errors.Is(err, goredis.Nil) {
			return nil, ErrLostLease
		}
		if err != nil {
			return nil, err
		}
		st, err := decodeMeta(meta)
		if err != nil {
			return nil, fmt.Errorf("entry %q: meta %q: %w", e.Name, meta, err)
		}
		out[e.Name], metas[e.Name] = st, meta
	}
	r.mu.Lock()
	r.metas = metas
	r.mu.Unlock()
	return out, nil
}

// Commit records the run and publishes it, in one script where it can.
func (r *RedisStore) Commit(ctx context.Context, e *Entry, next State, p *transport.Publishing, send func(context.Context) error) error {
	r.mu.Lock()
	tok, prev := r.token, r.metas[e.Name]
	r.mu.Unlock()
	if tok == "" {
		return ErrLostLease
	}
	meta := encodeMeta(next)
	score := float64(next.LastRunAt.Unix())
	if rem, err := e.Schedule.Remaining(next.LastRunAt, next.LastRunAt); err == nil {
		score = float64(next.LastRunAt.Add(rem).Unix())
	}
	keys := []string{r.lockKey(), r.entryKey(e.Name), r.scheduleKey()}
	args := []any{tok, prev, meta, score, r.entryKey(e.Name)}
	atomic := false
	if r.prepare != nil {
		key, data, ok, err := r.prepare(p)
		if err != nil {
			return err
		}
		if ok {
			keys = append(keys, key)
			args = append(args, data)
			atomic = true
		}
	}
	res, err := commitScript.Run(ctx, r.rdb, keys, args...).Text()
	if err != nil {
		// Unknown whether the script ran: read the meta again before
		// the next run rather than guess.
		return fmt.Errorf("%w: %v", ErrLostLease, err)
	}
	if res != "ok" {
		return ErrLostLease
	}
	r.mu.Lock()
	r.metas[e.Name] = meta
	r.mu.Unlock()
	if atomic {
		return nil
	}
	return send(ctx)
}

// Release deletes the lease if this replica holds it.
func (r *RedisStore) Release(ctx context.Context) error {
	r.mu.Lock()
	tok := r.token
	r.token = ""
	r.mu.Unlock()
	if tok == "" {
		return nil
	}
	return releaseScript.Run(ctx, r.rdb, []string{r.lockKey()}, tok).Err()
}

// RedBeat's JSON for a datetime: its fields and the zone.
type redbeatTime struct {
	Type        string `json:"__type__"`
	Year        int    `json:"year"`
	Month       int    `json:"month"`
	Day         int    `json:"day"`
	Hour        int    `json:"hour"`
	Minute      int    `json:"minute"`
	Second      int    `json:"second"`
	Microsecond int    `json:"microsecond"`
	Timezone    any    `json:"timezone"`
}

type redbeatMeta struct {
	LastRunAt     redbeatTime `json:"last_run_at"`
	TotalRunCount int         `json:"total_run_count"`
}

func encodeMeta(st State) string {
	t := st.LastRunAt.UTC()
	b, _ := json.Marshal(redbeatMeta{LastRunAt: redbeatTime{Type: "datetime", Year: t.Year(), Month: int(t.Month()),
		Day: t.Day(), Hour: t.Hour(), Minute: t.Minute(), Second: t.Second(), Microsecond: t.Nanosecond() / 1000,
		Timezone: "UTC"}, TotalRunCount: st.TotalRunCount})
	return string(b)
}

func decodeMeta(s string) (State, error) {
	var m redbeatMeta
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return State{}, err
	}
	loc := time.UTC
	switch z := m.LastRunAt.Timezone.(type) {
	case string:
		l, err := time.LoadLocation(z)
		if err != nil {
			return State{}, err
		}
		loc = l
	case float64: // seconds east of UTC
		loc = time.FixedZone("", int(z))
	}
	t := m.LastRunAt
	return State{LastRunAt: time.Date(t.Year, time.Month(t.Month), t.Day, t.Hour, t.Minute, t.Second, t.Microsecond*1000, loc),
		TotalRunCount: m.TotalRunCount}, nil
}

// definition is the entry as RedBeat stores it, for tools that read it.
func definition(e *Entry) map[string]any {
	d := map[string]any{"name": e.Name, "task": e.Task, "args": e.Args, "kwargs": e.Kwargs,
		"options": e.Options, "enabled": true}
	switch s := e.Schedule.(type) {
	case *Interval:
		d["schedule"] = map[string]any{"__type__": "interval", "every": s.Every.Seconds(), "relative": s.Relative}
	case *Crontab:
		d["schedule"] = map[string]any{"__type__": "crontab", "minute": s.Spec.Minute, "hour": s.Spec.Hour,
			"day_of_week": s.Spec.DayOfWeek, "day_of_month": s.Spec.DayOfMonth, "month_of_year": s.Spec.MonthOfYear}
	case *Solar:
		d["schedule"] = map[string]any{"__type__": "solar", "event": s.Event, "lat": s.Lat, "lon": s.Lon}
	}
	return d
}
