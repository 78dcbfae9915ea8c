package beat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/celeriac/celeriac/protocol"
)

// Entry is one periodic task: Celery's ScheduleEntry.
type Entry struct {
	// Name is the entry's key in beat_schedule.
	Name string
	// Task is the task name sent.
	Task     string
	Schedule Schedule
	Args     []any
	Kwargs   map[string]any
	// ArgsRepr and KwargsRepr are the argsrepr and kwargsrepr headers;
	// empty: computed from Args (a list, as Python beat has it from JSON)
	// and Kwargs (keys sorted). ParseSchedule sets them with the keys in
	// the document's order, as Python's dicts keep them.
	ArgsRepr, KwargsRepr string
	// Options are apply_async's keyword arguments, under Celery's names:
	// queue, exchange, routing_key, priority, expires (seconds from the
	// send, or an ISO 8601 time), headers, and the others apply_async
	// takes (countdown, eta, time_limit, soft_time_limit, ...).
	Options map[string]any
}

// State is what a scheduler remembers of an entry between runs, and what
// a new leader takes over: when it last ran and how often.
type State struct {
	LastRunAt     time.Time
	TotalRunCount int
}

// Settings are the Celery settings the schedules depend on.
type Settings struct {
	// Zone: timezone and enable_utc, and whose arithmetic (Dialect).
	Zone Zone
	// CronStartingDeadline is beat_cron_starting_deadline; zero: none.
	CronStartingDeadline time.Duration
}

// ParseSchedule reads Celery's beat_schedule from JSON: an object of
// entries by name, each with task, schedule, args, kwargs, options and
// relative. A schedule is a number of seconds, {"timedelta": {"days",
// "seconds", "microseconds", "milliseconds", "minutes", "hours",
// "weeks"}}, {"crontab": {"minute", "hour", "day_of_week",
// "day_of_month", "month_of_year"}} (strings in Celery's syntax, numbers or
// lists of numbers), {"solar": {"event", "lat", "lon"}}, or RedBeat's
// {"__type__": "interval"|"crontab", ...}. Entries come back sorted by
// name. Unknown fields of an entry are an error, not ignored.
func ParseSchedule(data []byte, s Settings) ([]*Entry, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("beat_schedule: want an object of entries: %w", err)
	}
	var out []*Entry
	var errs []error
	for name, r := range raw {
		e, err := parseEntry(name, r, s)
		if err != nil {
			errs = append(errs, fmt.Errorf("beat_schedule[%q]: %w", name, err))
			continue
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, errors.Join(errs...)
}

func parseEntry(name string, data []byte, s Settings) (*Entry, error) {
	var r struct {
		Task     string          `json:"task"`
		Schedule json.RawMessage `json:"schedule"`
		Args     json.RawMessage `json:"args"`
		Kwargs   json.RawMessage `json:"kwargs"`
		Options  map[string]any  `json:"options"`
		Relative bool            `json:"relative"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(&r); err != nil {
		return nil, err
	}
	if r.Task == "" {
		return nil, errors.New("no task")
	}
	if len(r.Schedule) == 0 {
		return nil, errors.New("no schedule")
	}
	sch, err := ParseScheduleValue(r.Schedule, r.Relative, s)
	if err != nil {
		return nil, fmt.Errorf("schedule: %w", err)
	}
	e := &Entry{Name: name, Task: r.Task, Schedule: sch, Args: []any{}, Kwargs: map[string]any{},
		Options: numbers(r.Options).(map[string]any)}
	if len(r.Args) > 0 && string(r.Args) != "null" {
		v, err := orderedJSON(r.Args)
		list, ok := v.([]any)
		if err != nil || !ok {
			return nil, errors.New("args: want a list")
		}
		e.Args = plain(list).([]any)
		e.ArgsRepr = protocol.SafeRepr(list, protocol.ReprMaxSize)
	}
	if len(r.Kwargs) > 0 && string(r.Kwargs) != "null" {
		v, err := orderedJSON(r.Kwargs)
		d, ok := v.(protocol.OrderedDict)
		if err != nil || !ok {
			return nil, errors.New("kwargs: want an object")
		}
		e.Kwargs = plain(d).(map[string]any)
		e.KwargsRepr = protocol.SafeRepr(d, protocol.ReprMaxSize)
	}
	return e, nil
}

// orderedJSON decodes a JSON value keeping the order of object keys
// (protocol.OrderedDict) and numbers as int64 or float64.
func orderedJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var value func() (any, error)
	value = func() (any, error) {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '[':
				list := []any{}
				for dec.More() {
					v, err := value()
					if err != nil {
						return nil, err
					}
					list = append(list, v)
				}
				_, err := dec.Token()
				return list, err
			case '{':
				d := protocol.OrderedDict{Values: map[string]any{}}
				for dec.More() {
					kt, err := dec.Token()
					if err != nil {
						return nil, err
					}
					k, _ := kt.(string)
					v, err := value()
					if err != nil {
						return nil, err
					}
					if _, dup := d.Values[k]; !dup {
						d.Keys = append(d.Keys, k)
					}
					d.Values[k] = v
				}
				_, err := dec.Token()
				return d, err
			}
			return nil, fmt.Errorf("unexpected %v", t)
		case json.Number:
			return numbers(t), nil
		}
		return tok, nil
	}
	return value()
}

// plain turns OrderedDicts back into maps, for the message body.
func plain(v any) any {
	switch v := v.(type) {
	case protocol.OrderedDict:
		m := make(map[string]any, len(v.Keys))
		for k, x := range v.Values {
			m[k] = plain(x)
		}
		return m
	case []any:
		for i := range v {
			v[i] = plain(v[i])
		}
		return v
	}
	return v
}

// numbers turns json.Number into int64 (integers) or float64, as Python's
// json gives int and float.
func numbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	case []any:
		if v == nil {
			return []any{}
		}
		for i := range v {
			v[i] = numbers(v[i])
		}
		return v
	case map[string]any:
		if v == nil {
			return map[string]any{}
		}
		for k := range v {
			v[k] = numbers(v[k])
		}
		return v
	}
	return v
}

// ParseScheduleValue reads one entry's schedule (see ParseSchedule).
func ParseScheduleValue(data []byte, relative bool, s Settings) (Schedule, error) {
	var secs float64
	if err := json.Unmarshal(data, &secs); err == nil {
		return interval(secs, relative, s)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, errors.New("want seconds or an object (timedelta, crontab, solar)")
	}
	if t, ok := obj["__type__"]; ok { // RedBeat's encoding
		var typ string
		_ = json.Unmarshal(t, &typ)
		delete(obj, "__type__")
		rest, _ := json.Marshal(obj)
		switch typ {
		case "interval":
			var iv struct {
				Every    float64 `json:"every"`
				Relative bool    `json:"relative"`
			}
			if err := json.Unmarshal(rest, &iv); err != nil {
				return nil, err
			}
			return interval(iv.Every, iv.Relative || relative, s)
		case "crontab":
			return parseCrontabJSON(rest, s)
		}
		return nil, fmt.Errorf("unknown __type__ %q", typ)
	}
	if len(obj) != 1 {
		return nil, errors.New("want exactly one of timedelta, crontab, solar")
	}
	for k, v := range obj {
		switch k {
		case "timedelta":
			var td map[string]float64
			if err := json.Unmarshal(v, &td); err != nil {
				return nil, fmt.Errorf("timedelta: %w", err)
			}
			unit := map[string]float64{"weeks": 604800, "days": 86400, "hours": 3600, "minutes": 60,
				"seconds": 1, "milliseconds": 1e-3, "microseconds": 1e-6}
			total := 0.0
			for name, n := range td {
				u, ok := unit[name]
				if !ok {
					return nil, fmt.Errorf("timedelta: unknown field %q", name)
				}
				total += n * u
			}
			return interval(total, relative, s)
		case "crontab":
			return parseCrontabJSON(v, s)
		case "solar":
			var sol struct {
				Event string   `json:"event"`
				Lat   *float64 `json:"lat"`
				Lon   *float64 `json:"lon"`
			}
			if err := json.Unmarshal(v, &sol); err != nil || sol.Lat == nil || sol.Lon == nil {
				return nil, errors.New(`solar: want {"event", "lat", "lon"}`)
			}
			return NewSolar(sol.Event, *sol.Lat, *sol.Lon, s.Zone)
		}
		return nil, fmt.Errorf("unknown schedule kind %q", k)
	}
	panic("unreachable")
}

func interval(secs float64, relative bool, s Settings) (Schedule, error) {
	if math.IsNaN(secs) || math.IsInf(secs, 0) || math.Abs(secs) > 1e12 {
		return nil, fmt.Errorf("interval %v seconds out of range", secs)
	}
	// timedelta has microsecond resolution.
	every := time.Duration(math.Round(secs*1e6)) * time.Microsecond
	return &Interval{Every: every, Relative: relative, Zone: s.Zone}, nil
}

func parseCrontabJSON(data []byte, s Settings) (Schedule, error) {
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("crontab: %w", err)
	}
	var spec CronSpec
	fields := map[string]*string{"minute": &spec.Minute, "hour": &spec.Hour, "day_of_week": &spec.DayOfWeek,
		"day_of_month": &spec.DayOfMonth, "month_of_year": &spec.MonthOfYear}
	for k, v := range raw {
		f, ok := fields[k]
		if !ok {
			return nil, fmt.Errorf("crontab: unknown field %q", k)
		}
		str, err := cronValue(v)
		if err != nil {
			return nil, fmt.Errorf("crontab %s: %w", k, err)
		}
		*f = str
	}
	c, err := NewCrontab(spec, s.Zone)
	if err != nil {
		return nil, err
	}
	c.StartingDeadline = s.CronStartingDeadline
	return c, nil
}

// cronValue is a crontab field given as Celery takes it: a string, an
// integer or a list of integers (as a set).
func cronValue(v any) (string, error) {
	switch v := v.(type) {
	case string:
		if v == "" {
			return "", errors.New("empty")
		}
		return v, nil
	case float64:
		if v != math.Trunc(v) {
			return "", errors.New("not an integer")
		}
		return strconv.FormatInt(int64(v), 10), nil
	case []any:
		if len(v) == 0 {
			return "", errors.New("empty list")
		}
		parts := make([]string, len(v))
		for i, e := range v {
			f, ok := e.(float64)
			if !ok || f != math.Trunc(f) || f < 0 {
				return "", errors.New("want a list of integers")
			}
			parts[i] = strconv.FormatInt(int64(f), 10)
		}
		return strings.Join(parts, ","), nil
	case nil:
		return "*", nil
	}
	return "", fmt.Errorf("unexpected %T", v)
}
