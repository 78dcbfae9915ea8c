package beat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/celeriac/celeriac/transport"
)

// DjangoStore reads the schedule from django-celery-beat's tables in
// PostgreSQL, as its DatabaseScheduler does: the enabled PeriodicTasks with
// their IntervalSchedule, CrontabSchedule (in its own time zone),
// SolarSchedule or ClockedSchedule, reloaded when PeriodicTasks'
// last_update moves (every save in Django's admin or ORM moves it), and
// writes each run's last_run_at and total_run_count back to the task's
// row (DatabaseScheduler does it at its next sync; DjangoStore at once).
// One replica sends: the one holding a PostgreSQL advisory lock on a
// connection of its own; the others take over when that connection ends.
// A run is recorded (an UPDATE that checks the row's last_run_at is what
// this replica read, so two leaders cannot both record it), then
// published.
type DjangoStore struct {
	pool *pgxpool.Pool
	cfg  DjangoStoreConfig

	mu       sync.Mutex
	lockConn *pgxpool.Conn
	changed  time.Time      // PeriodicTasks.last_update as last read
	ids      map[string]int // task id by name
	last     map[string]*time.Time
	oneOff   map[string]bool
	start    map[string]time.Time
}

// DjangoStoreConfig configures a DjangoStore.
type DjangoStoreConfig struct {
	// Settings: Celery's zone and deadline (for intervals and solar; a
	// crontab row has its own time zone).
	Settings Settings
	// LockKey is the advisory lock's key. Default: a hash of
	// "celeriac-beat:" and the connection's current schema, so that
	// replicas on one set of tables share it and Django projects in other
	// schemas of the database do not.
	LockKey int64
}

// NewDjangoStore returns a store on the database of pool (its
// search_path must reach django-celery-beat's tables).
func NewDjangoStore(pool *pgxpool.Pool, cfg DjangoStoreConfig) *DjangoStore {
	return &DjangoStore{pool: pool, cfg: cfg}
}

// LeaseRenew is a second: how often the lock's connection is checked and
// the change marker read.
func (d *DjangoStore) LeaseRenew() time.Duration { return time.Second }

// Lead keeps or takes the advisory lock.
func (d *DjangoStore) Lead(ctx context.Context) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lockConn != nil {
		if err := d.lockConn.Ping(ctx); err == nil {
			return true, nil
		}
		d.lockConn.Conn().Close(context.Background())
		d.lockConn.Release()
		d.lockConn = nil
	}
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	if d.cfg.LockKey == 0 {
		var k int32
		if err := c.QueryRow(ctx, "SELECT hashtext('celeriac-beat:' || current_schema())").Scan(&k); err != nil {
			c.Release()
			return false, err
		}
		d.cfg.LockKey = int64(k)
	}
	var ok bool
	if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", d.cfg.LockKey).Scan(&ok); err != nil || !ok {
		c.Release()
		return false, err
	}
	d.lockConn = c
	return true, nil
}

// Release unlocks and closes the lock's connection.
func (d *DjangoStore) Release(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lockConn == nil {
		return nil
	}
	_, err := d.lockConn.Exec(ctx, "SELECT pg_advisory_unlock($1)", d.cfg.LockKey)
	d.lockConn.Release()
	d.lockConn = nil
	return err
}

// Changed reports whether PeriodicTasks' last_update moved since the
// entries were last read.
func (d *DjangoStore) Changed(ctx context.Context) (bool, error) {
	var ts *time.Time
	err := d.pool.QueryRow(ctx, "SELECT last_update FROM django_celery_beat_periodictasks WHERE ident = 1").Scan(&ts)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil || ts == nil {
		return false, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return ts.After(d.changed), nil
}

const djangoTasks = `
SELECT t.id, t.name, t.task, t.args, t.kwargs, t.queue, t.exchange, t.routing_key, t.headers,
       t.priority, t.expires, t.expire_seconds, t.one_off, t.start_time, t.last_run_at, t.total_run_count,
       i.every, i.period,
       c.minute, c.hour, c.day_of_week, c.day_of_month, c.month_of_year, c.timezone,
       s.event, s.latitude::float8, s.longitude::float8,
       k.clocked_time
FROM django_celery_beat_periodictask t
LEFT JOIN django_celery_beat_intervalschedule i ON i.id = t.interval_id
LEFT JOIN django_celery_beat_crontabschedule c ON c.id = t.crontab_id
LEFT JOIN django_celery_beat_solarschedule s ON s.id = t.solar_id
LEFT JOIN django_celery_beat_clockedschedule k ON k.id = t.clocked_id
WHERE t.enabled
ORDER BY t.name`

// Entries reads the enabled periodic tasks and their states; a task
// without last_run_at gets now, written back (as ModelEntry does).
func (d *DjangoStore) Entries(ctx context.Context, now time.Time) ([]*Entry, map[string]State, error) {
	var marker *time.Time
	_ = d.pool.QueryRow(ctx, "SELECT last_update FROM django_celery_beat_periodictasks WHERE ident = 1").Scan(&marker)
	rows, err := d.pool.Query(ctx, djangoTasks)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var entries []*Entry
	states := map[string]State{}
	ids := map[string]int{}
	last := map[string]*time.Time{}
	oneOff := map[string]bool{}
	start := map[string]time.Time{}
	var errs []error
	for rows.Next() {
		var (
			id, count                             int
			name, task, args, kwargs              string
			queue, exchange, rk, headers          *string
			prio, expireSecs                      *int
			expires, startTime, lastRun, clockedT *time.Time
			isOneOff                              bool
			every                                 *int
			period                                *string
			mi, h, dow, dom, moy, tz              *string
			event                                 *string
			lat, lon                              *float64
		)
		if err := rows.Scan(&id, &name, &task, &args, &kwargs, &queue, &exchange, &rk, &headers,
			&prio, &expires, &expireSecs, &isOneOff, &startTime, &lastRun, &count,
			&every, &period, &mi, &h, &dow, &dom, &moy, &tz, &event, &lat, &lon, &clockedT); err != nil {
			return nil, nil, err
		}
		e, err := d.entry(name, task, args, kwargs, every, period, mi, h, dow, dom, moy, tz, event, lat, lon, clockedT)
		if err != nil {
			errs = append(errs, fmt.Errorf("periodic task %q: %w", name, err))
			continue
		}
		opts := map[string]any{}
		for k, v := range map[string]*string{"queue": queue, "exchange": exchange, "routing_key": rk} {
			if v != nil && *v != "" {
				opts[k] = *v
			}
		}
		if prio != nil {
			opts["priority"] = int64(*prio)
		}
		switch { // expires_: expires or expire_seconds
		case expires != nil:
			opts["expires"] = expires.UTC().Format(time.RFC3339Nano)
		case expireSecs != nil && *expireSecs > 0:
			opts["expires"] = float64(*expireSecs)
		}
		if headers != nil && *headers != "" {
			var hm map[string]any
			if err := json.Unmarshal([]byte(*headers), &hm); err == nil && len(hm) > 0 {
				opts["headers"] = hm
			}
		}
		opts["periodic_task_name"] = name // as ModelEntry sets it
		e.Options = opts
		st := State{TotalRunCount: count}
		if lastRun != nil {
			st.LastRunAt = *lastRun
		} else {
			st.LastRunAt = now
			if _, err := d.pool.Exec(ctx, "UPDATE django_celery_beat_periodictask SET last_run_at = $1 WHERE id = $2 AND last_run_at IS NULL", now, id); err != nil {
				return nil, nil, err
			}
		}
		l := st.LastRunAt
		entries, states[name], ids[name], last[name], oneOff[name] = append(entries, e), st, id, &l, isOneOff
		if startTime != nil {
			start[name] = *startTime
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	d.mu.Lock()
	d.ids, d.last, d.oneOff, d.start = ids, last, oneOff, start
	if marker != nil {
		d.changed = *marker
	}
	d.mu.Unlock()
	return entries, states, errors.Join(errs...)
}

func (d *DjangoStore) entry(name, task, args, kwargs string, every *int, period *string,
	mi, h, dow, dom, moy, tz *string, event *string, lat, lon *float64, clockedT *time.Time) (*Entry, error) {
	doc := map[string]json.RawMessage{"task": mustJSON(task)}
	if args != "" {
		doc["args"] = json.RawMessage(args)
	}
	if kwargs != "" {
		doc["kwargs"] = json.RawMessage(kwargs)
	}
	s := d.cfg.Settings
	var sched Schedule
	switch {
	case every != nil && period != nil:
		unit := map[string]time.Duration{"days": 24 * time.Hour, "hours": time.Hour, "minutes": time.Minute,
			"seconds": time.Second, "microseconds": time.Microsecond}[*period]
		if unit == 0 {
			return nil, fmt.Errorf("interval period %q", *period)
		}
		sched = &Interval{Every: time.Duration(*every) * unit, Zone: s.Zone}
	case mi != nil:
		z := s.Zone
		if tz != nil && *tz != "" {
			loc, err := time.LoadLocation(*tz)
			if err != nil {
				return nil, fmt.Errorf("crontab timezone: %w", err)
			}
			z.Location = loc
		}
		c, err := NewCrontab(CronSpec{Minute: *mi, Hour: *h, DayOfWeek: *dow, DayOfMonth: *dom, MonthOfYear: *moy}, z)
		if err != nil {
			return nil, err
		}
		c.StartingDeadline = s.CronStartingDeadline
		sched = c
	case event != nil && lat != nil && lon != nil:
		sol, err := NewSolar(*event, *lat, *lon, s.Zone)
		if err != nil {
			return nil, err
		}
		sched = sol
	case clockedT != nil:
		sched = &Clocked{At: *clockedT}
	default:
		return nil, errors.New("no schedule")
	}
	doc["schedule"] = json.RawMessage("1")
	b, _ := json.Marshal(doc)
	es, err := ParseSchedule([]byte(`{`+string(mustJSON(name))+`:`+string(b)+`}`), s)
	if err != nil {
		return nil, err
	}
	es[0].Schedule = sched
	return es[0], nil
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// Load re-reads the tables (the scheduler calls it on taking the lead).
func (d *DjangoStore) Load(ctx context.Context, entries []*Entry, now time.Time) (map[string]State, error) {
	_, states, err := d.Entries(ctx, now)
	return states, err
}

// Due reports whether the task may run at now: its start_time passed.
func (d *DjangoStore) Due(name string, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, ok := d.start[name]
	return !ok || !now.Before(st)
}

// Commit records the run in the task's row, then publishes it. A one-off
// task is disabled after its run, as ModelEntry.is_due does.
func (d *DjangoStore) Commit(ctx context.Context, e *Entry, next State, _ *transport.Publishing, send func(context.Context) error) error {
	d.mu.Lock()
	id, ok := d.ids[e.Name]
	prev := d.last[e.Name]
	oneOff := d.oneOff[e.Name]
	held := d.lockConn != nil
	d.mu.Unlock()
	if !ok || !held {
		return ErrLostLease
	}
	q := "UPDATE django_celery_beat_periodictask SET last_run_at = $1, total_run_count = total_run_count + 1"
	if oneOff {
		q += ", enabled = false"
	}
	q += " WHERE id = $2 AND enabled AND last_run_at IS NOT DISTINCT FROM $3"
	tag, err := d.pool.Exec(ctx, q, next.LastRunAt, id, prev)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrLostLease, err)
	}
	if tag.RowsAffected() != 1 {
		return ErrLostLease // edited or run by another: read again
	}
	d.mu.Lock()
	t := next.LastRunAt
	d.last[e.Name] = &t
	d.mu.Unlock()
	return send(ctx)
}

// Clocked is django-celery-beat's clocked schedule: due once, at At.
type Clocked struct{ At time.Time }

// Remaining is At - now.
func (c *Clocked) Remaining(_, now time.Time) (time.Duration, error) { return c.At.Sub(now), nil }

// IsDue is clocked.is_due: due once At passed, then not again.
func (c *Clocked) IsDue(_, now time.Time) (bool, time.Duration, error) {
	rem := c.At.Sub(now)
	if rem <= 0 {
		return true, 5 * time.Minute, nil // NEVER_CHECK_TIMEOUT; the row is disabled
	}
	return false, rem, nil
}

func (c *Clocked) String() string { return "<clocked: " + strings.TrimSpace(c.At.String()) + ">" }
