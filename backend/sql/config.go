package sql

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/celeriac/celeriac/internal/redact"
	"github.com/celeriac/celeriac/protocol"
)

// Schema says whose tables the backend writes.
type Schema int

const (
	// SQLAlchemy is Celery's own database backend (result_backend =
	// "db+postgresql://..."): celery_taskmeta and celery_tasksetmeta,
	// created when missing.
	SQLAlchemy Schema = iota
	// Django is django-celery-results (result_backend = "django-db"):
	// django_celery_results_taskresult, _groupresult and _chordcounter,
	// which only Django's migrations create.
	Django
)

// Config configures a Backend.
type Config struct {
	// URL is the database: Celery's db+postgresql://, db+postgresql+psycopg2://
	// (any +driver) or a plain postgres:// / postgresql:// URL, or a libpq
	// key=value DSN. Only PostgreSQL is supported.
	URL    string
	Schema Schema

	// TableNames and TableSchemas are Celery's database_table_names and
	// database_table_schemas ({"task": ..., "group": ...}); SQLAlchemy only.
	TableNames   map[string]string
	TableSchemas map[string]string

	// Extended is result_extended: task name, args, kwargs, worker,
	// retries and queue are written too (SQLAlchemy: the TaskExtended
	// columns, which must exist; Django: task_name, task_args,
	// task_kwargs and worker).
	Extended bool
	// Serializer is result_serializer (a content type; default JSON). The
	// SQLAlchemy backend encodes args and kwargs with it (the result is
	// always a pickle); Django encodes the result and meta with it.
	Serializer string
	// ResultExpires is result_expires, used by Cleanup (default 1 day).
	ResultExpires time.Duration

	// StatementTimeout bounds every statement (and each chord
	// transaction), on the client and as the server's statement_timeout.
	// Default 10s.
	StatementTimeout time.Duration
	// MaxConns caps the pool (default: pgx's, max(4, CPUs)).
	MaxConns int32
	// ShortLivedSessions is database_short_lived_sessions: connections are
	// closed after a minute instead of kept for an hour, for servers or
	// proxies that drop idle sessions.
	ShortLivedSessions bool

	// NotifyChannel is the PostgreSQL channel Store notifies and Wait
	// listens on (see [Backend.Wait]). Default "celeriac_result". Backends
	// whose tables differ but share a database may share it: a waiter
	// woken for another table's task only reads its own row once more.
	NotifyChannel string
	// NoNotify turns the notification off: Store writes as Python's
	// backend does. Wait still listens (other workers may notify) and
	// polls. NOTIFY makes committing transactions take a lock of the
	// whole cluster in turn, which can matter when many processes write
	// results at a high rate; celeriac's group commit already sends up to
	// 64 stores per transaction.
	NoNotify bool

	Logger *zap.Logger
}

const (
	defaultStatementTimeout = 10 * time.Second
	defaultNotifyChannel    = "celeriac_result"
	maxChannelLen           = 63 // PostgreSQL's NAMEDATALEN - 1
	defaultExpires          = 24 * time.Hour
	maxTaskIDLen            = 155 // celery_taskmeta.task_id is String(155)
)

// pgKeepAlive is the TCP keepalive of every connection (see Config.settings).
var pgKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// ParseURL turns a Celery result_backend URL for PostgreSQL into the URL
// pgx reads: "db+" and a SQLAlchemy "+driver" are removed, and a
// postgres:// URL passes through.
func ParseURL(raw string) (string, error) {
	s := strings.TrimSpace(raw)
	s = strings.TrimPrefix(s, "db+")
	i := strings.Index(s, "://")
	if i < 0 {
		if strings.Contains(s, "=") {
			return s, nil // key=value DSN
		}
		return "", fmt.Errorf("sql backend: %q is not a database URL", redact.URL(raw))
	}
	scheme, rest := s[:i], s[i:]
	dialect, _, _ := strings.Cut(scheme, "+")
	switch dialect {
	case "postgresql", "postgres":
	default:
		return "", fmt.Errorf("sql backend: unsupported database %q (only PostgreSQL: db+postgresql://)", dialect)
	}
	return "postgresql" + rest, nil
}

// settings is Config checked and defaulted.
type settings struct {
	pool        *pgxpool.Config
	stmtTimeout time.Duration
	contentType string
	expires     time.Duration
	extended    bool
	log         *zap.Logger
	taskTable   string // quoted, schema-qualified
	groupTable  string
	taskSeq     string
	groupSeq    string
	schema      string // of the task table ("" = search_path); celeriac's chord tables live there too
	groupSchema string
	taskName    string // unquoted
	groupName   string
	channel     string // NotifyChannel, unquoted
	notify      bool
}

func (c Config) settings() (*settings, error) {
	if strings.TrimSpace(c.URL) == "" {
		return nil, errors.New("sql backend: no database URL")
	}
	dsn, err := ParseURL(c.URL)
	if err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's error may quote the URL, password included; url's
		// reason (an invalid escape) does not.
		var ue *url.Error
		if errors.As(err, &ue) {
			return nil, fmt.Errorf("sql backend: bad database URL %s: %v", redact.URL(dsn), ue.Err)
		}
		return nil, fmt.Errorf("sql backend: bad database URL %s", redact.URL(dsn))
	}
	s := &settings{
		pool: pc, stmtTimeout: c.StatementTimeout, contentType: c.Serializer,
		expires: c.ResultExpires, extended: c.Extended, log: c.Logger,
	}
	if s.stmtTimeout <= 0 {
		s.stmtTimeout = defaultStatementTimeout
	}
	if s.expires <= 0 {
		s.expires = defaultExpires
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	s.channel, s.notify = c.NotifyChannel, !c.NoNotify
	if s.channel == "" {
		s.channel = defaultNotifyChannel
	}
	if len(s.channel) > maxChannelLen || strings.ContainsRune(s.channel, 0) {
		return nil, fmt.Errorf("sql backend: notify channel %q: at most %d bytes, no NUL", s.channel, maxChannelLen)
	}
	switch strings.ToLower(strings.TrimSpace(s.contentType)) {
	case "", "json", protocol.ContentTypeJSON:
		s.contentType = protocol.ContentTypeJSON
	case "msgpack", protocol.ContentTypeMsgpack:
		s.contentType = protocol.ContentTypeMsgpack
	default:
		return nil, fmt.Errorf("sql backend: result serializer %q is not supported (json or msgpack)", c.Serializer)
	}
	rp := pc.ConnConfig.RuntimeParams
	rp["statement_timeout"] = fmt.Sprint(s.stmtTimeout.Milliseconds())
	if rp["application_name"] == "" {
		rp["application_name"] = "celeriac"
	}
	// Dates are written and read in UTC whatever the server's TimeZone.
	rp["timezone"] = "UTC"
	if c.MaxConns > 0 {
		pc.MaxConns = c.MaxConns
	}
	if c.ShortLivedSessions {
		pc.MaxConnLifetime = time.Minute
		pc.MaxConnIdleTime = 10 * time.Second
	}
	if pc.ConnConfig.ConnectTimeout == 0 || pc.ConnConfig.ConnectTimeout > s.stmtTimeout {
		pc.ConnConfig.ConnectTimeout = s.stmtTimeout
	}
	// Every statement is bounded by StatementTimeout on the client side, so
	// a connection that goes dead under a statement is dropped within it.
	// An idle one (in the pool, or Wait's LISTEN connection, which reads
	// nothing while no result is stored) is found by TCP keepalive: probes
	// after 15 s of silence, dead after 3 unanswered 5 s apart, where
	// pgx's default waits 5 minutes.
	pc.ConnConfig.DialFunc = (&net.Dialer{KeepAliveConfig: pgKeepAlive}).DialContext
	switch c.Schema {
	case SQLAlchemy:
		s.taskName, s.groupName = "celery_taskmeta", "celery_tasksetmeta"
		if n := c.TableNames["task"]; n != "" {
			s.taskName = n
		}
		if n := c.TableNames["group"]; n != "" {
			s.groupName = n
		}
		s.schema, s.groupSchema = c.TableSchemas["task"], c.TableSchemas["group"]
		s.taskTable = qualify(s.schema, s.taskName)
		s.groupTable = qualify(s.groupSchema, s.groupName)
		s.taskSeq = qualify(s.schema, "task_id_sequence")
		s.groupSeq = qualify(s.groupSchema, "taskset_id_sequence")
	case Django:
		if len(c.TableNames) > 0 || len(c.TableSchemas) > 0 {
			return nil, errors.New("sql backend: table names and schemas are Celery's database backend settings; django-celery-results' tables are Django's")
		}
		s.taskName, s.groupName = "django_celery_results_taskresult", "django_celery_results_groupresult"
		s.taskTable, s.groupTable = qualify("", s.taskName), qualify("", s.groupName)
	default:
		return nil, fmt.Errorf("sql backend: unknown schema %d", c.Schema)
	}
	return s, nil
}

// qualify quotes an identifier, schema-qualified when schema is set.
func qualify(schema, name string) string {
	q := quoteIdent(name)
	if schema != "" {
		q = quoteIdent(schema) + "." + q
	}
	return q
}

func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}
