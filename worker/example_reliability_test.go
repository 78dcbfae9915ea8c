package worker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/celeriac/celeriac/client"
	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/worker"
	"github.com/celeriac/celeriac/worker/connect"
)

// A handler steers its own retry by returning one of package retry's
// errors, the Go form of a call of Celery's Task.retry. The worker hands
// the error to the task's retry.Policy, as Decide does here: the default
// policy (max_retries=3, default_retry_delay=180) retries each of these but
// the declined card, and WithMaxRetries(10) lets the locked order retry past
// the policy's limit of 3.
func ExampleHandlerFunc_retry() {
	errTimeout := errors.New("gateway: timeout")
	errMaintenance := errors.New("gateway: down for maintenance")
	eta := time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC) // when the maintenance ends
	// The payment gateway's answer for each order.
	gateway := func(order string) (*http.Response, error) {
		status, header := http.StatusOK, http.Header{}
		switch order {
		case "timeout":
			return nil, errTimeout
		case "maintenance":
			return nil, errMaintenance
		case "reset":
			return nil, errors.New("gateway: connection reset")
		case "throttled":
			status = http.StatusTooManyRequests
			header.Set("Retry-After", "120")
		case "locked":
			status = http.StatusConflict
		case "declined":
			status = http.StatusPaymentRequired
		}
		return &http.Response{StatusCode: status, Status: http.StatusText(status), Header: header}, nil
	}

	charge := worker.HandlerFunc(func(ctx context.Context, t *worker.Task) (any, error) {
		var order string
		if err := t.Bind(&order); err != nil {
			return nil, retry.Skip(err)
		}
		resp, err := gateway(order)
		if err == nil && resp.StatusCode >= 400 {
			err = fmt.Errorf("gateway: %s", resp.Status)
		}
		switch {
		case errors.Is(err, errTimeout):
			return nil, retry.After(30*time.Second, err) // self.retry(exc=err, countdown=30)
		case errors.Is(err, errMaintenance):
			return nil, retry.At(eta, err) // self.retry(exc=err, eta=eta)
		case resp == nil: // another network error
			return nil, retry.Later(err) // default_retry_delay
		case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
			return nil, retry.AfterHeader(resp.Header.Get("Retry-After"), err) // 429/503
		case resp.StatusCode == http.StatusConflict: // the order is locked for a while
			return nil, retry.After(time.Minute, err).WithMaxRetries(10) // max_retries for this call
		case err != nil:
			return nil, retry.Skip(err) // permanent: FAILURE now, never retried
		}
		return "charged " + order, nil
	})

	ctx := context.Background()
	var p retry.Policy // worker.Retry(p) sets a task's policy
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, order := range []string{"timeout", "maintenance", "reset", "throttled", "locked", "declined"} {
		_, err := charge.HandleTask(ctx, &worker.Task{Name: "payments.charge", Args: []any{order}})
		d := p.Decide(err, 0, now, nil)
		last := p.Decide(err, 3, now, nil) // the fourth retry
		fmt.Printf("%s: retry=%v in %v (%v), fourth retry=%v\n", order, d.Retry, d.Countdown, d.Reason, last.Retry)
	}
	// Output:
	// timeout: retry=true in 30s (explicit), fourth retry=false
	// maintenance: retry=true in 1h0m0s (explicit), fourth retry=false
	// reset: retry=true in 3m0s (explicit), fourth retry=false
	// throttled: retry=true in 2m0s (explicit), fourth retry=false
	// locked: retry=true in 1m0s (explicit), fourth retry=true
	// declined: retry=false in 0s (skip), fourth retry=false
}

// runWorker runs w until the returned function stops it.
func runWorker(w *worker.Worker) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			log.Print(err)
		}
	}
}

// A global rate limit: every worker sending through the "sms-api" bucket
// shares 5 starts a second, whichever tasks they run. conn.RateLimiter
// keeps the buckets: the Redis result backend for a fleet (or the Redis of
// connect.Options.RateLimitURL); memory:// limits this process only. Three
// SMS therefore start 200 ms apart.
func ExampleGlobalRateLimit() {
	ctx := context.Background()
	conn, err := connect.Open(ctx, connect.Options{BrokerURL: "memory://", ResultBackend: "memory://"})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	var mu sync.Mutex
	var starts []time.Time
	send := worker.HandlerFunc(func(ctx context.Context, t *worker.Task) (any, error) {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		return "sent", nil
	})
	mux := worker.NewMux()
	mux.Handle("sms.send", send, worker.GlobalRateLimit("5/s", "sms-api", 1)) // rate, bucket ("" = task name), burst
	w, err := worker.New(conn.Transport, mux, worker.Config{Backend: conn.Backend, GlobalRateLimiter: conn.RateLimiter})
	if err != nil {
		log.Fatal(err)
	}
	defer runWorker(w)()

	c := client.New(conn.Transport, client.Config{Backend: conn.Backend})
	begin := time.Now()
	var results []*client.AsyncResult
	for _, to := range []string{"+33600000001", "+33600000002", "+33600000003"} {
		r, err := c.Send(ctx, "sms.send", []any{to, "your code is 1234"}, nil)
		if err != nil {
			log.Fatal(err)
		}
		results = append(results, r)
	}
	for _, r := range results {
		v, err := r.Get(ctx)
		fmt.Println(v, err)
	}
	mu.Lock()
	defer mu.Unlock()
	// The third start waited for two refills of the bucket: 2 × 200 ms.
	fmt.Println("last start 400 ms or more after the first send:", starts[len(starts)-1].Sub(begin) >= 400*time.Millisecond)
	// Output:
	// sent <nil>
	// sent <nil>
	// sent <nil>
	// last start 400 ms or more after the first send: true
}

// An idempotent charge: two messages for the same order (a redelivery, a
// retry, or Python calling charge.delay twice) charge it once, and both
// return the first charge. The handler passes the key on to the payment
// API, which dedupes on it too, in case a worker dies between charging and
// recording the result. conn.Idempotency keeps the claims: the Redis
// result backend for a fleet (examples/payments runs this on one), an
// in-process store with memory://.
func ExampleIdempotent() {
	ctx := context.Background()
	conn, err := connect.Open(ctx, connect.Options{BrokerURL: "memory://", ResultBackend: "memory://"})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	// The payment API: one charge per Idempotency-Key.
	var mu sync.Mutex
	charges := map[string]string{}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		if _, ok := charges[key]; !ok {
			charges[key] = fmt.Sprintf("ch_%d", len(charges)+1)
		}
		fmt.Fprint(w, charges[key])
	}))
	defer api.Close()

	policy := retry.Policy{AutoRetryFor: []retry.Matcher{retry.OnAny()}, MaxRetries: retry.Limited(5), Backoff: 1}
	mux := worker.NewMux()
	mux.Handle("payments.charge", worker.Idempotent(worker.IdempotencyOptions{
		Store: conn.Idempotency, // with a Redis result backend, shared by every worker
		Key: func(t *worker.Task) (string, error) { // default: the task id
			var order string
			var amount int64
			if err := t.Bind(&order, &amount); err != nil {
				return "", err
			}
			return "order-" + order, nil
		},
	})(worker.HandlerFunc(func(ctx context.Context, t *worker.Task) (any, error) {
		var order string
		var amount int64
		if err := t.Bind(&order, &amount); err != nil {
			return nil, retry.Skip(err)
		}
		body := fmt.Sprintf(`{"order": %q, "amount": %d}`, order, amount)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/charges", strings.NewReader(body))
		if err != nil {
			return nil, retry.Skip(err)
		}
		// The same key goes to the payment API, which dedupes on it:
		req.Header.Set("Idempotency-Key", worker.IdempotencyKey(ctx))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err // retried by the policy
		}
		defer resp.Body.Close()
		id, err := io.ReadAll(resp.Body)
		return string(id), err
	})), worker.AcksLate(true), worker.Retry(policy))
	w, err := worker.New(conn.Transport, mux, worker.Config{Backend: conn.Backend})
	if err != nil {
		log.Fatal(err)
	}
	defer runWorker(w)()

	c := client.New(conn.Transport, client.Config{Backend: conn.Backend})
	for range 2 {
		r, err := c.Send(ctx, "payments.charge", []any{"17", 4990}, nil)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(r.Get(ctx))
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("charges made:", len(charges))
	// Output:
	// ch_1 <nil>
	// ch_1 <nil>
	// charges made: 1
}
