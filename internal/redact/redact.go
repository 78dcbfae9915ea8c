// Package redact hides credentials in connection URLs and DSNs, so that
// they can be logged and put in errors.
package redact

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
)

// Hidden replaces a password.
const Hidden = "xxx"

// URL hides every password in raw: one URL, several separated by ';'
// (failover and sentinel lists), or a key=value DSN. In each URL
// everything between "://" and its last '@' is the user information and
// is hidden, whether or not the URL parses (a password with a bad escape
// or an unescaped '/' or '@' makes it unparsable, and is still a
// password): "user:pass@" becomes "user:xxx@", and user information
// without a ':' stays only when the URL parses (a bare user name), else
// it becomes "xxx@". A password=value parameter, in a query or a DSN, has
// its value hidden too. Text without credentials is returned as written.
func URL(raw string) string {
	var b strings.Builder
	for _, seg := range segments(raw) {
		b.WriteString(segment(seg))
	}
	return passwordParam.ReplaceAllString(b.String(), "${1}password="+Hidden)
}

// Error is err with the URL of a *url.Error (which repeats the whole URL,
// password included, in its text) redacted; other errors are returned as
// they are. It keeps the *url.Error, for errors.As.
func Error(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return &url.Error{Op: ue.Op, URL: URL(ue.URL), Err: ue.Err}
	}
	return err
}

// passwordParam is a password parameter in a query (?password=, &password=)
// or a libpq key=value DSN (password=secret, password = 'a b').
var passwordParam = regexp.MustCompile(`(?i)(^|[?&;\s])password(\s*)=\s*('(?:[^'\\]|\\.)*'?|[^&\s#;]*)`)

// schemeSep starts a URL in a ';'-separated list: ";scheme://".
var schemeSep = regexp.MustCompile(`;\s*[A-Za-z][A-Za-z0-9+.\-]*://`)

// segments cuts raw into its URLs, each with the ';' that ends it: a ';'
// separates two URLs only where the next one starts (";scheme://"), so a
// ';' inside a password does not cut the password off its '@'.
func segments(raw string) []string {
	var out []string
	for {
		loc := schemeSep.FindStringIndex(raw)
		if loc == nil {
			return append(out, raw)
		}
		out = append(out, raw[:loc[0]+1])
		raw = raw[loc[0]+1:]
	}
}

func segment(seg string) string {
	i := strings.Index(seg, "://")
	start := i + len("://")
	if i < 0 {
		// "user:pass@host", "amqp:user:pass@host": keep a scheme-like
		// prefix, hide the rest up to the last '@'.
		j := strings.LastIndexByte(seg, '@')
		if j < 0 {
			return seg
		}
		start = 0
		if k := strings.IndexByte(seg, ':'); k > 0 && isScheme(seg[:k]) {
			start = k + 1
		}
		return seg[:start] + Hidden + seg[j:]
	}
	j := strings.LastIndexByte(seg[start:], '@')
	if j < 0 {
		return seg
	}
	userinfo := seg[start : start+j]
	hidden := Hidden
	if k := strings.IndexByte(userinfo, ':'); k >= 0 {
		hidden = userinfo[:k] + ":" + Hidden
	} else if _, err := url.Parse(strings.TrimSpace(strings.TrimSuffix(seg, ";"))); err == nil {
		hidden = userinfo // a user name alone
	}
	return seg[:start] + hidden + seg[start+j:]
}

func isScheme(s string) bool {
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case i > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}
