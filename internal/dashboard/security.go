package dashboard

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

const (
	csrfCookie = "celeriac_csrf"
	authCookie = "celeriac_session"

	// sessionTTL is how long a login lasts; maxSessions bounds the table
	// (the oldest login goes first).
	sessionTTL  = 12 * time.Hour
	maxSessions = 1000

	// A client (remote IP) with loginFailures failed logins (bearer,
	// basic or form) within loginWindow is answered 429 for any further
	// credentials until the window has passed; maxClients bounds the
	// table.
	loginFailures = 10
	loginWindow   = time.Minute
	maxClients    = 10000

	// handlerTimeout bounds every handler but the event stream (which
	// has sseMaxLife); the server's own timeouts are in Server.
	handlerTimeout = 30 * time.Second
)

// mac is HMAC-SHA256 of parts under the process's secret, in hex.
func (d *Dashboard) mac(parts ...string) string {
	h := hmac.New(sha256.New, d.secret)
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// csrfToken returns the token forms carry for this browser, setting the
// browser's CSRF cookie first when it has none. The token is an HMAC of
// the cookie: a page of another site can neither read it nor compute it
// (the double-submit pattern, with the token bound to the cookie).
func (d *Dashboard) csrfToken(w http.ResponseWriter, r *http.Request) string {
	c, err := r.Cookie(csrfCookie)
	v := ""
	if err == nil && len(c.Value) == 32 {
		v = c.Value
	} else {
		v = randomHex(16)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		// The token must match the cookie the browser will send next,
		// including on this same response's forms.
		r.AddCookie(&http.Cookie{Name: csrfCookie, Value: v})
	}
	return d.mac("csrf", v)
}

// checkCSRF reports whether a POST carries this browser's token and, when
// the browser says where the request comes from, comes from this origin.
// "Origin: null" (a sandboxed frame, a data: URL, a redirect across
// origins) is another origin.
func (d *Dashboard) checkCSRF(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	if err != nil || c.Value == "" {
		return false
	}
	if !equal(r.PostFormValue("csrf"), d.mac("csrf", c.Value)) {
		return false
	}
	return sameOrigin(r)
}

// sameOrigin reports whether a request that says where it comes from comes
// from this origin; one that does not say is taken as same-origin.
func sameOrigin(r *http.Request) bool {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host == "" || u.Host != r.Host {
			return false
		}
	}
	return true
}

// authConfigured reports whether any credentials are configured. With
// them, every page needs them; without them there are no actions and no
// dead letters.
func (d *Dashboard) authConfigured() bool {
	return d.o.AuthToken != "" || len(d.o.BasicAuth) > 0
}

type authKey struct{}

// authenticated reports whether the guard found valid credentials on the
// request.
func (d *Dashboard) authenticated(r *http.Request) bool {
	ok, _ := r.Context().Value(authKey{}).(bool)
	return ok
}

// checkCredentials reads the request's credentials: the token as a bearer
// token, basic-auth user and password, or a login session's cookie. bad
// names the kind of credentials presented and refused ("bearer",
// "basic"), for the failed-login count; an unknown or expired session is
// not a failed login, only no login.
func (d *Dashboard) checkCredentials(r *http.Request) (ok bool, bad, user string) {
	if h := r.Header.Get("Authorization"); h != "" {
		if tok, isBearer := strings.CutPrefix(h, "Bearer "); isBearer {
			if d.o.AuthToken != "" && equal(tok, d.o.AuthToken) {
				return true, "", ""
			}
			return false, "bearer", ""
		}
		if u, p, isBasic := r.BasicAuth(); isBasic {
			want, known := d.o.BasicAuth[u]
			// Compare even for unknown users, so that timing does not
			// tell which users exist.
			if !known {
				want = d.mac("no such user")
			}
			if equal(p, want) && known {
				return true, "", ""
			}
			return false, "basic", u
		}
		return false, "authorization header", ""
	}
	if c, err := r.Cookie(authCookie); err == nil && d.sessions.valid(d.mac("session", c.Value), time.Now()) {
		return true, "", ""
	}
	return false, "", ""
}

// sessionTable holds the logins made with the form: a random id per login
// (the cookie), expiring after sessionTTL and deleted at logout. Keys are
// HMACs of the ids, so that the table never holds a usable cookie.
type sessionTable struct {
	mu sync.Mutex
	m  map[string]time.Time // key → expiry
}

func (s *sessionTable) add(key string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]time.Time{}
	}
	for k, exp := range s.m {
		if !now.Before(exp) {
			delete(s.m, k)
		}
	}
	if len(s.m) >= maxSessions {
		oldest, first := "", time.Time{}
		for k, exp := range s.m {
			if oldest == "" || exp.Before(first) {
				oldest, first = k, exp
			}
		}
		delete(s.m, oldest)
	}
	s.m[key] = now.Add(sessionTTL)
}

func (s *sessionTable) valid(key string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.m[key]
	if ok && !now.Before(exp) {
		delete(s.m, key)
		return false
	}
	return ok
}

func (s *sessionTable) remove(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
}

// loginLimiter counts failed logins per client.
type loginLimiter struct {
	mu sync.Mutex
	m  map[string]*failures
}

type failures struct {
	n     int
	since time.Time
}

// blocked reports whether client has used up its failed logins, and when
// it may try again.
func (l *loginLimiter) blocked(client string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.m[client]
	if f == nil || now.Sub(f.since) >= loginWindow {
		return false, 0
	}
	return f.n >= loginFailures, loginWindow - now.Sub(f.since)
}

func (l *loginLimiter) fail(client string, now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]*failures{}
	}
	f := l.m[client]
	if f == nil || now.Sub(f.since) >= loginWindow {
		if f == nil && len(l.m) >= maxClients {
			for k, g := range l.m {
				if now.Sub(g.since) >= loginWindow {
					delete(l.m, k)
				}
			}
			if len(l.m) >= maxClients {
				// Still full of recent failures: an attack from many
				// addresses. Forget one; each address stays limited
				// while it is remembered.
				for k := range l.m {
					delete(l.m, k)
					break
				}
			}
		}
		f = &failures{since: now}
		l.m[client] = f
	}
	f.n++
	return f.n
}

// clientOf is the request's remote IP, the key of the failed-login count.
func clientOf(r *http.Request) string {
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return h
	}
	return r.RemoteAddr
}

// loginFailed logs a failed login and counts it against the client.
func (d *Dashboard) loginFailed(r *http.Request, kind, user string) {
	client := clientOf(r)
	n := d.limiter.fail(client, time.Now())
	d.log.Warn("dashboard: failed login", zap.String("method", kind), zap.String("user", clip(user, 64)),
		zap.String("remote", client), zap.String("path", clip(r.URL.Path, 256)), zap.Int("failures_in_window", n))
}

// tooMany answers 429 when the client has failed too often, and reports
// whether it did.
func (d *Dashboard) tooMany(w http.ResponseWriter, r *http.Request) bool {
	blocked, wait := d.limiter.blocked(clientOf(r), time.Now())
	if !blocked {
		return false
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
	http.Error(w, "too many failed logins: try again later", http.StatusTooManyRequests)
	return true
}

// hostAllowed reports whether the request's Host names this dashboard: a
// loopback name or address, an AllowedHosts entry, or (AllowIPHosts) any
// IP address. Anything else may be a DNS-rebinding page reading the
// dashboard through the operator's browser: a name the attacker controls,
// resolved to the dashboard's address.
func (d *Dashboard) hostAllowed(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "" || strings.ContainsAny(host, "[]") {
		return false
	}
	if host == "localhost" {
		return true
	}
	if ip := net.ParseIP(host); ip != nil && (ip.IsLoopback() || d.o.AllowIPHosts) {
		return true
	}
	for _, a := range d.o.AllowedHosts {
		if strings.EqualFold(strings.TrimSuffix(a, "."), host) {
			return true
		}
	}
	return false
}

// route is one of the dashboard's routes and what the guard asks of it.
type route struct {
	pattern string
	h       http.HandlerFunc
	// public routes answer without credentials even when credentials
	// are configured: the login page and form, logout, static files.
	public bool
	// broker routes read the broker's dead letters (on RabbitMQ each
	// read redelivers): they need configured credentials.
	broker bool
	// stream routes have their own deadlines (the event stream).
	stream bool
}

// guard is the one wrapper every route passes through: Host, security
// headers, body size, credentials (counted and rate-limited when wrong),
// a deadline, then the route's own requirements.
func (d *Dashboard) guard(rt route) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !rt.stream {
			ctx, cancel := context.WithTimeout(r.Context(), handlerTimeout)
			defer cancel()
			r = r.WithContext(ctx)
		}
		ok, bad, user := false, "", ""
		if d.authConfigured() {
			if r.Header.Get("Authorization") != "" && d.tooMany(w, r) {
				return
			}
			ok, bad, user = d.checkCredentials(r)
			if bad != "" {
				d.loginFailed(r, bad, user)
			}
		}
		r = r.WithContext(context.WithValue(r.Context(), authKey{}, ok))
		switch {
		case rt.public:
		case d.authConfigured() && !ok:
			d.needLogin(w, r)
			return
		case rt.broker && !d.authConfigured():
			d.deny(w, r, http.StatusForbidden, "dead letters need credentials (reading them changes RabbitMQ's redelivered flag): start the dashboard with --auth-token or --basic-auth-file")
			return
		}
		rt.h(w, r)
	}
}

// needLogin answers a request without valid credentials: a page is sent
// to the login form (and back), anything else gets 401.
func (d *Dashboard) needLogin(w http.ResponseWriter, r *http.Request) {
	if len(d.o.BasicAuth) > 0 {
		w.Header().Set("WWW-Authenticate", `Basic realm="celeriac dashboard", charset="UTF-8"`)
	}
	machine := r.URL.Path == "/events" || r.URL.Path == "/metrics" || strings.HasPrefix(r.URL.Path, "/api/")
	if d.o.AuthToken != "" && r.Method == http.MethodGet && r.Header.Get("X-Fragment") == "" && !machine &&
		r.Header.Get("Authorization") == "" {
		http.Redirect(w, r, "/login?back="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/api/") {
		apiError(w, http.StatusUnauthorized, "credentials needed: a Bearer token or basic auth")
		return
	}
	if r.Method == http.MethodPost {
		d.deny(w, r, http.StatusUnauthorized, "log in first: this action needs credentials")
		return
	}
	http.Error(w, "log in first: the dashboard needs credentials", http.StatusUnauthorized)
}

// safeBack returns s when it is a path on this site, else def: a redirect
// never leaves the dashboard. Browsers drop tabs and newlines from URLs
// and read a backslash as a slash, so "/\t/evil.example" would be
// "//evil.example": any control character or backslash is refused, and
// what is left must parse with neither scheme nor host.
func safeBack(s, def string) string {
	if s == "" || !strings.HasPrefix(s, "/") || strings.HasPrefix(s, "//") || len(s) > 2048 {
		return def
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f || c == '\\' || (c >= 0x80 && c < 0xa0) {
			return def
		}
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "" || u.Host != "" || u.Opaque != "" || !strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") {
		return def
	}
	return s
}

// securityHeaders are set on every response: no framing, no sniffing, and
// a content policy that allows only this origin's script and style (no
// inline script, so that an escaping mistake could still not run one).
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}
