package connect

import "github.com/celeriac/celeriac/internal/redact"

// Redact hides the password of every URL in raw (';'-separated), so that
// URLs can be logged: amqp://guest:xxx@host//. Everything between "://"
// and a URL's last '@' is hidden whether or not the URL parses, and so is
// a password=value parameter.
func Redact(raw string) string {
	return redact.URL(raw)
}
