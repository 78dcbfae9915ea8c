package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Client calls the gateway's charge API.
type Client struct {
	// BaseURL is the gateway, e.g. http://127.0.0.1:8099.
	BaseURL string
	// Timeout bounds each request.
	Timeout time.Duration
	HTTP    *http.Client
}

// TransientError is a failure worth retrying: the gateway could not be
// reached, did not answer in time, answered 5xx, 409 (the same key is in
// flight) or 429. The charge may or may not have happened; retrying with the
// same Idempotency-Key is what makes that safe.
type TransientError struct {
	Status int // 0 when there was no answer
	Err    error
}

func (e *TransientError) Error() string {
	if e.Status == 0 {
		return "gateway unreachable: " + e.Err.Error()
	}
	return fmt.Sprintf("gateway answered %d: %v", e.Status, e.Err)
}

func (e *TransientError) Unwrap() error { return e.Err }

// PermanentError is a 4xx that will not change on retry: a declined card,
// an invalid amount, a key reused with other parameters.
type PermanentError struct {
	Status int
	Type   string
	Code   string
	Msg    string
}

func (e *PermanentError) Error() string {
	code := e.Type
	if e.Code != "" {
		code += "/" + e.Code
	}
	return fmt.Sprintf("gateway refused the charge (%d %s): %s", e.Status, code, e.Msg)
}

// Charge makes (or, with a key already used, replays) a charge. The result
// is the charge and whether the gateway replayed it.
func (c *Client) Charge(ctx context.Context, key string, req ChargeRequest) (Charge, bool, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Charge{}, false, err
	}
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.BaseURL, "/")+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return Charge{}, false, err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Idempotency-Key", key)
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(hr)
	if err != nil {
		return Charge{}, false, &TransientError{Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Charge{}, false, &TransientError{Status: resp.StatusCode, Err: err}
	}
	switch s := resp.StatusCode; {
	case s == http.StatusOK:
		var ch Charge
		if err := json.Unmarshal(data, &ch); err != nil || ch.ID == "" {
			// A 200 we cannot read: the charge happened; asking again with
			// the same key replays it.
			return Charge{}, false, &TransientError{Status: s, Err: fmt.Errorf("unreadable charge %q: %v", data, err)}
		}
		return ch, resp.Header.Get("Idempotent-Replayed") == "true", nil
	case s >= 500 || s == http.StatusConflict || s == http.StatusTooManyRequests:
		return Charge{}, false, &TransientError{Status: s, Err: fmt.Errorf("%s", errorMessage(data))}
	default:
		var e apiError
		_ = json.Unmarshal(data, &e)
		return Charge{}, false, &PermanentError{Status: s, Type: e.Error.Type, Code: e.Error.Code, Msg: errorMessage(data)}
	}
}

// errorMessage returns the message of an error body, or the body itself.
func errorMessage(data []byte) string {
	var e apiError
	if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	if len(data) > 200 {
		data = data[:200]
	}
	return strings.TrimSpace(string(data))
}
