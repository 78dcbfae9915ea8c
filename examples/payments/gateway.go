package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// GatewayConfig shapes the fake gateway's misbehaviour.
type GatewayConfig struct {
	// Latency is how long a charge takes to answer. The charge is recorded
	// when the request arrives, so a worker that dies during Latency has
	// charged without knowing it: the case the Idempotency-Key is for.
	Latency time.Duration
	// FailRate is the fraction of requests answered 503 without charging.
	FailRate float64
	// SlowRate is the fraction of charges answered only after SlowDelay
	// (longer than a client's timeout): charged, but the client times out.
	SlowRate  float64
	SlowDelay time.Duration
	// Seed makes the random failures repeatable; 0 picks one.
	Seed uint64
}

// ChargeRequest is the body of POST /v1/charges.
type ChargeRequest struct {
	OrderID  string `json:"order_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// Charge is a charge the gateway made.
type Charge struct {
	ID       string `json:"id"`
	OrderID  string `json:"order_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	// Key is the Idempotency-Key the charge was made with.
	Key string `json:"idempotency_key"`
	// Created is when it was made, in Unix milliseconds.
	Created int64 `json:"created"`
}

// apiError is the gateway's error body, in Stripe's shape.
type apiError struct {
	Error struct {
		Type    string `json:"type"`
		Code    string `json:"code,omitempty"`
		Message string `json:"message"`
	} `json:"error"`
}

// GatewayStats are the gateway's counters (GET /v1/stats).
type GatewayStats struct {
	// Requests counts POST /v1/charges requests; PerKey the same by
	// Idempotency-Key.
	Requests int            `json:"requests"`
	PerKey   map[string]int `json:"per_key"`
	// Charges counts charges made: at most one per key.
	Charges int `json:"charges"`
	// Replays counts requests answered with a key's stored response;
	// Conflicts those refused because the key's first request was still
	// running; Failures the injected 503s; Inflight the requests running
	// now.
	Replays   int `json:"replays"`
	Conflicts int `json:"conflicts"`
	Failures  int `json:"failures"`
	Inflight  int `json:"inflight"`
	// Outage is true while every request is answered 503.
	Outage bool `json:"outage"`
}

// Gateway is a fake payment API that behaves like Stripe's on the points
// that matter here: POST /v1/charges with an Idempotency-Key makes one
// charge per key; a repeated request with the same key and parameters gets
// the first response again (header Idempotent-Replayed: true), with other
// parameters a 400 idempotency_error, and while the first request with the
// key is still running a 409. Invalid amounts are 400 and orders whose id
// starts with "declined" are 402 card_declined (permanent); injected
// failures are 503 (transient).
//
// GET /v1/charges lists the charges, GET /v1/stats counts requests, and
// POST /v1/outage?on=true|false starts or ends an outage (every charge 503),
// for trying dead letters.
type Gateway struct {
	cfg GatewayConfig

	mu      sync.Mutex
	rnd     *rand.Rand
	keys    map[string]*keyRecord
	charges []Charge
	stats   GatewayStats
	seq     int
}

// keyRecord is what the gateway remembers per Idempotency-Key.
type keyRecord struct {
	req     ChargeRequest
	running bool
	status  int
	body    []byte
}

// NewGateway returns an empty gateway.
func NewGateway(cfg GatewayConfig) *Gateway {
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &Gateway{
		cfg:   cfg,
		rnd:   rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		keys:  map[string]*keyRecord{},
		stats: GatewayStats{PerKey: map[string]int{}},
	}
}

// ServeHTTP implements http.Handler.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/v1/charges" && r.Method == http.MethodPost:
		g.charge(w, r)
	case r.URL.Path == "/v1/charges" && r.Method == http.MethodGet:
		g.mu.Lock()
		list := append([]Charge{}, g.charges...)
		g.mu.Unlock()
		writeJSON(w, http.StatusOK, list)
	case r.URL.Path == "/v1/stats" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, g.Stats())
	case r.URL.Path == "/v1/outage" && r.Method == http.MethodPost:
		on := r.URL.Query().Get("on") == "true"
		g.mu.Lock()
		g.stats.Outage = on
		g.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]bool{"outage": on})
	default:
		writeError(w, http.StatusNotFound, "invalid_request_error", "", "no such endpoint: "+r.Method+" "+r.URL.Path)
	}
}

// Stats returns a copy of the counters.
func (g *Gateway) Stats() GatewayStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.stats
	s.PerKey = make(map[string]int, len(g.stats.PerKey))
	for k, v := range g.stats.PerKey {
		s.PerKey[k] = v
	}
	return s
}

// Charges returns the charges made, oldest first.
func (g *Gateway) Charges() []Charge {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Charge{}, g.charges...)
}

func (g *Gateway) charge(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var req ChargeRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	bodyErr := dec.Decode(&req)

	g.mu.Lock()
	g.stats.Requests++
	g.stats.PerKey[key]++
	g.stats.Inflight++
	defer func() {
		g.mu.Lock()
		g.stats.Inflight--
		g.mu.Unlock()
	}()
	switch {
	case key == "":
		g.mu.Unlock()
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "an Idempotency-Key header is required")
		return
	case bodyErr != nil:
		g.mu.Unlock()
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "bad JSON body: "+bodyErr.Error())
		return
	case g.stats.Outage:
		g.stats.Failures++
		g.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, "api_error", "", "the payment network is down")
		return
	}
	if rec, ok := g.keys[key]; ok {
		switch {
		case rec.req != req:
			g.mu.Unlock()
			writeError(w, http.StatusBadRequest, "idempotency_error", "",
				"keys for idempotent requests can only be used with the same parameters they were first used with")
		case rec.running:
			g.stats.Conflicts++
			g.mu.Unlock()
			writeError(w, http.StatusConflict, "idempotency_error", "",
				"there is currently another in-progress request using this Idempotency-Key")
		default:
			g.stats.Replays++
			g.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(rec.status)
			_, _ = w.Write(rec.body)
		}
		return
	}
	if g.rnd.Float64() < g.cfg.FailRate {
		// Failed before it started: Stripe saves no result, a retry runs.
		g.stats.Failures++
		g.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, "api_error", "", "temporary failure, try again")
		return
	}
	if msg := validate(req); msg != "" {
		// Refused by validation, before anything ran: nothing is saved.
		g.mu.Unlock()
		writeError(w, http.StatusBadRequest, "invalid_request_error", "parameter_invalid", msg)
		return
	}
	rec := &keyRecord{req: req, running: true}
	g.keys[key] = rec
	var status int
	var body []byte
	if strings.HasPrefix(req.OrderID, "declined") {
		status, body = http.StatusPaymentRequired, errorBody("card_error", "card_declined", "your card was declined")
	} else {
		g.seq++
		c := Charge{
			ID: fmt.Sprintf("ch_%06d", g.seq), OrderID: req.OrderID, Amount: req.Amount,
			Currency: req.Currency, Key: key, Created: time.Now().UnixMilli(),
		}
		g.charges = append(g.charges, c)
		g.stats.Charges++
		status = http.StatusOK
		body, _ = json.Marshal(c)
	}
	delay := g.cfg.Latency
	if g.rnd.Float64() < g.cfg.SlowRate {
		delay += g.cfg.SlowDelay
	}
	g.mu.Unlock()

	if delay > 0 {
		// The charge is made; the answer is what takes time.
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
		}
	}
	g.mu.Lock()
	rec.running, rec.status, rec.body = false, status, body
	g.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func validate(r ChargeRequest) string {
	switch {
	case r.OrderID == "":
		return "order_id is required"
	case r.Amount <= 0 || r.Amount > 99_999_999:
		return fmt.Sprintf("amount %d is out of range (1..99999999 cents)", r.Amount)
	case len(r.Currency) != 3:
		return fmt.Sprintf("currency %q is not an ISO code", r.Currency)
	}
	return ""
}

func errorBody(typ, code, msg string) []byte {
	var e apiError
	e.Error.Type, e.Error.Code, e.Error.Message = typ, code, msg
	b, _ := json.Marshal(e)
	return b
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(errorBody(typ, code, msg))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
