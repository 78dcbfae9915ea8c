package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// RabbitAPI reads a queue's figures that AMQP does not give (unacked
// messages, rates) from RabbitMQ's management HTTP API, as Flower's
// --broker_api does.
type RabbitAPI struct {
	base        *url.URL // ends in /api/
	user, pass  string
	vhost       string
	client      *http.Client
	maxBodySize int64
}

// maxRabbitAnswer bounds what is read of one answer: a queue's object
// lists its consumers, so it grows with them, but not beyond this.
const maxRabbitAnswer = 1 << 20

// NewRabbitAPI returns a client of the management API at apiURL
// ("http://host:15672/api/", or without the /api/) for the queues of
// vhost. Credentials in apiURL win over user and pass (the broker's).
func NewRabbitAPI(apiURL, vhost, user, pass string) (*RabbitAPI, error) {
	u, err := url.Parse(apiURL)
	if err != nil {
		return nil, fmt.Errorf("dashboard: broker API URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, errors.New("dashboard: broker API URL: want http(s)://host:15672/api/")
	}
	if u.User != nil {
		user = u.User.Username()
		pass, _ = u.User.Password()
		u.User = nil
	}
	u.RawQuery, u.Fragment = "", ""
	u.Path = strings.TrimSuffix(u.Path, "/")
	if !strings.HasSuffix(u.Path, "/api") {
		u.Path += "/api"
	}
	u.Path += "/"
	u.RawPath = ""
	if vhost == "" {
		vhost = "/"
	}
	return &RabbitAPI{base: u, user: user, pass: pass, vhost: vhost, maxBodySize: maxRabbitAnswer, client: &http.Client{
		Timeout: 5 * time.Second,
		// A redirect would carry the credentials elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, nil
}

// String is the API's address without credentials, for logs.
func (a *RabbitAPI) String() string { return a.base.String() }

// RabbitQueue is what the management API says of a queue.
type RabbitQueue struct {
	Ready, Unacked, Consumers int
	// PublishRate and AckRate are messages per second (RabbitMQ's own
	// recent average); HasRates is false when RabbitMQ gives none (no
	// traffic yet, or statistics disabled).
	PublishRate, AckRate float64
	HasRates             bool
}

// Queue asks for one queue's figures.
func (a *RabbitAPI) Queue(ctx context.Context, name string) (RabbitQueue, error) {
	u := a.base.String() + "queues/" + url.PathEscape(a.vhost) + "/" + url.PathEscape(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return RabbitQueue{}, err
	}
	req.SetBasicAuth(a.user, a.pass)
	req.Header.Set("Accept", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is in the message already, once
		}
		return RabbitQueue{}, fmt.Errorf("management API %s: %w", a.base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, a.maxBodySize+1))
	if err != nil {
		return RabbitQueue{}, fmt.Errorf("management API %s: %w", a.base, err)
	}
	if resp.StatusCode != http.StatusOK {
		return RabbitQueue{}, fmt.Errorf("management API %s: %s", a.base, resp.Status)
	}
	if int64(len(body)) > a.maxBodySize {
		return RabbitQueue{}, fmt.Errorf("management API %s: answer larger than %d bytes", a.base, a.maxBodySize)
	}
	return parseRabbitQueue(body)
}

// parseRabbitQueue reads the fields the dashboard shows from a queue's
// object; others are ignored. Counts must be whole and non-negative, rates
// finite and non-negative: anything else is an error, not a figure shown.
func parseRabbitQueue(body []byte) (RabbitQueue, error) {
	var v struct {
		Ready        *float64 `json:"messages_ready"`
		Unacked      *float64 `json:"messages_unacknowledged"`
		Consumers    *float64 `json:"consumers"`
		MessageStats *struct {
			Publish *struct {
				Rate *float64 `json:"rate"`
			} `json:"publish_details"`
			Ack *struct {
				Rate *float64 `json:"rate"`
			} `json:"ack_details"`
		} `json:"message_stats"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return RabbitQueue{}, fmt.Errorf("management API: not a queue object: %w", err)
	}
	var q RabbitQueue
	for _, f := range []struct {
		name string
		in   *float64
		out  *int
	}{{"messages_ready", v.Ready, &q.Ready}, {"messages_unacknowledged", v.Unacked, &q.Unacked}, {"consumers", v.Consumers, &q.Consumers}} {
		if f.in == nil {
			// RabbitMQ leaves the message counts out of a queue it has
			// not collected statistics for yet.
			*f.out = -1
			continue
		}
		if *f.in < 0 || *f.in > math.MaxInt32 || *f.in != math.Trunc(*f.in) {
			return RabbitQueue{}, fmt.Errorf("management API: %s is %v", f.name, *f.in)
		}
		*f.out = int(*f.in)
	}
	if s := v.MessageStats; s != nil {
		rate := func(r *float64) (float64, bool) {
			if r == nil || *r < 0 || math.IsInf(*r, 0) || *r > 1e12 {
				return 0, false
			}
			return *r, true
		}
		var okP, okA bool
		if s.Publish != nil {
			q.PublishRate, okP = rate(s.Publish.Rate)
		}
		if s.Ack != nil {
			q.AckRate, okA = rate(s.Ack.Rate)
		}
		q.HasRates = okP || okA
	}
	return q, nil
}
