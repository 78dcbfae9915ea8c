// Package smsapi is the outbound-SMS example's third-party API: a fake,
// flaky SMS provider (Server) and its HTTP client (Client).
//
// The provider behaves like the ones the Celery courses warn about: it
// admits at most Limit requests per sliding Window and answers the rest
// with 429 and a Retry-After header, fails some admitted requests with a
// transient 503, refuses malformed phone numbers with a permanent 400, and
// deduplicates on the Idempotency-Key header the way Stripe does. It
// records every request it sees, so that a test (or the fakeapi command)
// can count sends per second.
package smsapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Message is one SMS to send.
type Message struct {
	MessageID string `json:"message_id"`
	To        string `json:"to"`
	Body      string `json:"body"`
}

// Receipt is the provider's answer to an accepted message.
type Receipt struct {
	// SID is the provider's id of the sent message.
	SID string `json:"sid"`
	// Replayed is true when the provider had already sent a message with
	// the same idempotency key and returned that send instead of sending
	// again.
	Replayed bool `json:"replayed,omitempty"`
}

// Record is one request the Server saw.
type Record struct {
	Time           time.Time `json:"time"`
	MessageID      string    `json:"message_id"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	// Status is the HTTP status answered: 200 sent (or replayed), 400 bad
	// number, 429 over the rate limit, 503 transient failure.
	Status   int  `json:"status"`
	Replayed bool `json:"replayed,omitempty"`
}

// Config configures a Server. The zero value is the example's provider
// without transient failures.
type Config struct {
	// Limit requests are admitted per Window, counted over the last Window
	// (a sliding window); more get 429. Defaults 5 and 1 s.
	Limit  int
	Window time.Duration
	// FailureRate is the probability that an admitted request fails with
	// 503 (a transient error; the message was not sent).
	FailureRate float64
	// Rand returns a number in [0, 1) for FailureRate; default math/rand/v2.
	Rand func() float64
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Server is the fake SMS provider, an http.Handler: POST / with a JSON
// Message sends it; GET /records returns the records as JSON. It is safe
// for concurrent use.
type Server struct {
	cfg Config

	mu       sync.Mutex
	admitted []time.Time       // admitted requests inside the window
	sent     map[string]string // idempotency key -> sid
	records  []Record
	nextSID  int
}

// validNumber is E.164: a plus, then 8 to 15 digits not starting with 0.
var validNumber = regexp.MustCompile(`^\+[1-9][0-9]{7,14}$`)

// NewServer returns a Server.
func NewServer(cfg Config) *Server {
	if cfg.Limit <= 0 {
		cfg.Limit = 5
	}
	if cfg.Window <= 0 {
		cfg.Window = time.Second
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Server{cfg: cfg, sent: map[string]string{}}
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/records":
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.Records())
	case r.Method == http.MethodPost && r.URL.Path == "/":
		s.send(w, r)
	default:
		http.Error(w, "not found", http.StatusNotFound)
	}
}

func (s *Server) send(w http.ResponseWriter, r *http.Request) {
	var m Message
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	if err := dec.Decode(&m); err != nil {
		reply(w, http.StatusBadRequest, map[string]string{"error": "malformed request: " + err.Error()})
		return
	}
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	rec := Record{Time: now, MessageID: m.MessageID, IdempotencyKey: key}
	defer func() { s.records = append(s.records, rec) }()

	// The rate limit comes first, as with real providers: a 429 costs
	// nothing but counts nothing either.
	cut := 0
	for cut < len(s.admitted) && now.Sub(s.admitted[cut]) >= s.cfg.Window {
		cut++
	}
	s.admitted = s.admitted[cut:]
	if len(s.admitted) >= s.cfg.Limit {
		retry := s.admitted[0].Add(s.cfg.Window).Sub(now)
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int((retry+time.Second-1)/time.Second))))
		rec.Status = http.StatusTooManyRequests
		reply(w, rec.Status, map[string]string{"error": "rate limit exceeded"})
		return
	}
	s.admitted = append(s.admitted, now)

	if sid, ok := s.sent[key]; ok && key != "" {
		rec.Status, rec.Replayed = http.StatusOK, true
		reply(w, rec.Status, Receipt{SID: sid, Replayed: true})
		return
	}
	if !validNumber.MatchString(m.To) {
		rec.Status = http.StatusBadRequest
		reply(w, rec.Status, map[string]string{"error": fmt.Sprintf("invalid phone number %q", m.To)})
		return
	}
	if s.cfg.FailureRate > 0 && s.cfg.Rand() < s.cfg.FailureRate {
		rec.Status = http.StatusServiceUnavailable
		reply(w, rec.Status, map[string]string{"error": "temporarily unavailable"})
		return
	}
	s.nextSID++
	sid := fmt.Sprintf("SM%06d", s.nextSID)
	if key != "" {
		s.sent[key] = sid
	}
	rec.Status = http.StatusOK
	reply(w, rec.Status, Receipt{SID: sid})
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Records returns a copy of the requests seen so far, in arrival order.
func (s *Server) Records() []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Record(nil), s.records...)
}

// PerWindow counts times in consecutive windows of width, the first
// starting at the earliest time: the sends per second when width is a
// second. Times must be sorted.
func PerWindow(times []time.Time, width time.Duration) []int {
	if len(times) == 0 || width <= 0 {
		return nil
	}
	var counts []int
	start := times[0]
	for _, t := range times {
		i := int(t.Sub(start) / width)
		for len(counts) <= i {
			counts = append(counts, 0)
		}
		counts[i]++
	}
	return counts
}

// StatusError is a response other than 200.
type StatusError struct {
	Status int
	// RetryAfter is the Retry-After header, if any.
	RetryAfter string
	// Message is the provider's error text.
	Message string
}

// Error reads "smsapi: 429 Too Many Requests: rate limit exceeded".
func (e *StatusError) Error() string {
	return fmt.Sprintf("smsapi: %d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
}

// Transient reports whether err is worth retrying with backoff: a 5xx or
// 408 answer, or a network error or timeout on the way. 429 is not in it:
// the provider says how long to wait (StatusError.RetryAfter), so it needs
// no backoff of ours. Other 4xx answers (a bad number) are permanent.
func Transient(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Status >= 500 || se.Status == http.StatusRequestTimeout
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded)
}

// Client sends messages to a provider.
type Client struct {
	// URL is the provider's endpoint.
	URL string
	// HTTP is the client to use; nil means one with a 10 s timeout.
	HTTP *http.Client
}

// Send posts m with idempotencyKey (the Idempotency-Key header; empty
// means none). Any answer but 200 is a *StatusError.
func (c *Client) Send(ctx context.Context, m Message, idempotencyKey string) (Receipt, error) {
	body, err := json.Marshal(m)
	if err != nil {
		return Receipt{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, strings.NewReader(string(body)))
	if err != nil {
		return Receipt{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if idempotencyKey != "" {
		req.Header.Set("Idempotency-Key", idempotencyKey)
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return Receipt{}, fmt.Errorf("smsapi: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Receipt{}, fmt.Errorf("smsapi: reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(data))
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		return Receipt{}, &StatusError{Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After"), Message: msg}
	}
	var r Receipt
	if err := json.Unmarshal(data, &r); err != nil || r.SID == "" {
		// A 200 whose body we cannot read: the message was probably sent,
		// so a retry must go with the same idempotency key (it will).
		return Receipt{}, &StatusError{Status: http.StatusBadGateway, Message: "unreadable 200 answer: " + string(data)}
	}
	return r, nil
}
