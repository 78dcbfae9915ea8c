package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
)

const (
	csrfCookie = "celeriac_csrf"
	authCookie = "celeriac_auth"
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
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		v = hex.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		// The token must match the cookie the browser will send next,
		// including on this same response's forms.
		r.AddCookie(&http.Cookie{Name: csrfCookie, Value: v})
	}
	return d.mac("csrf", v)
}

// checkCSRF reports whether a POST carries this browser's token and, when
// the browser says where the request comes from, comes from this origin.
func (d *Dashboard) checkCSRF(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	if err != nil || c.Value == "" {
		return false
	}
	if !equal(r.PostFormValue("csrf"), d.mac("csrf", c.Value)) {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return false
		}
	}
	return true
}

// authConfigured reports whether any credentials are configured; without
// them there are no actions.
func (d *Dashboard) authConfigured() bool {
	return d.o.AuthToken != "" || len(d.o.BasicAuth) > 0
}

// authenticated reports whether the request carries valid credentials: the
// token as a bearer token or as the login cookie, or basic-auth user and
// password.
func (d *Dashboard) authenticated(r *http.Request) bool {
	if tok := d.o.AuthToken; tok != "" {
		if h := r.Header.Get("Authorization"); strings.HasPrefix(h, "Bearer ") && equal(strings.TrimPrefix(h, "Bearer "), tok) {
			return true
		}
		if c, err := r.Cookie(authCookie); err == nil && equal(c.Value, d.mac("auth", tok)) {
			return true
		}
	}
	if len(d.o.BasicAuth) > 0 {
		if u, p, ok := r.BasicAuth(); ok {
			want, known := d.o.BasicAuth[u]
			// Compare even for unknown users, so that timing does not
			// tell which users exist.
			if !known {
				want = d.mac("no such user")
			}
			if equal(p, want) && known {
				return true
			}
		}
	}
	return false
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
