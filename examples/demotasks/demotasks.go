// Package demotasks holds the example task handlers that celeriac's demo,
// its Python interop example and `celeriac worker` register: small tasks
// that do real work (sums, word counts, hashing, prime sieves), one that
// fails, one that is flaky and retried, one that sleeps.
//
// Python code calls them by name, exactly as it would call Celery tasks:
//
//	app.send_task("tasks.add", args=[2, 3]).get()  # 5
package demotasks

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/celeriac/celeriac/retry"
	"github.com/celeriac/celeriac/worker"
)

// Task is one demo task: its Celery name, handler and options.
type Task struct {
	Name    string
	Handler worker.HandlerFunc
	Options []worker.TaskOption
}

// Tasks returns the demo tasks.
func Tasks() []Task {
	return []Task{
		{Name: "tasks.add", Handler: Add},
		{Name: "tasks.mul", Handler: Mul},
		{Name: "tasks.tsum", Handler: Sum},
		{Name: "tasks.echo", Handler: Echo},
		{Name: "tasks.wordcount", Handler: WordCount},
		{Name: "tasks.sha256", Handler: SHA256},
		{Name: "tasks.primes", Handler: Primes},
		{Name: "tasks.fail", Handler: Fail},
		{Name: "tasks.sleep", Handler: Sleep},
		{Name: "tasks.noop", Handler: Noop},
		{Name: "tasks.flaky", Handler: NewFlaky().Handle, Options: []worker.TaskOption{
			worker.AcksLate(true),
			worker.Retry(retry.Policy{
				AutoRetryFor: []retry.Matcher{retry.On(ErrTransient)},
				MaxRetries:   retry.Limited(5),
				Backoff:      1,
				BackoffMax:   8 * time.Second,
				Jitter:       retry.JitterOff,
			}),
		}},
	}
}

// Register adds the demo tasks to mux under their Celery names.
func Register(mux *worker.Mux) {
	for _, t := range Tasks() {
		mux.Handle(t.Name, t.Handler, t.Options...)
	}
}

// Add returns x + y (tasks.add).
func Add(ctx context.Context, t *worker.Task) (any, error) {
	var x, y float64
	if err := t.Bind(&x, &y); err != nil {
		return nil, err
	}
	return number(x + y), nil
}

// Mul returns x * y (tasks.mul).
func Mul(ctx context.Context, t *worker.Task) (any, error) {
	var x, y float64
	if err := t.Bind(&x, &y); err != nil {
		return nil, err
	}
	return number(x * y), nil
}

// Sum returns the sum of a list of numbers (tasks.tsum, a chord body).
func Sum(ctx context.Context, t *worker.Task) (any, error) {
	var xs []float64
	if err := t.Bind(&xs); err != nil {
		return nil, err
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return number(s), nil
}

// number keeps integral results integers, so that Python sees 5, not 5.0.
func number(f float64) any {
	if f == float64(int64(f)) && f < 1<<53 && f > -(1<<53) {
		return int64(f)
	}
	return f
}

// Echo returns its arguments: {"args": [...], "kwargs": {...}} (tasks.echo).
func Echo(ctx context.Context, t *worker.Task) (any, error) {
	return map[string]any{"args": t.Args, "kwargs": t.Kwargs}, nil
}

// WordCount counts the words of a text and returns the most frequent ones
// (tasks.wordcount).
func WordCount(ctx context.Context, t *worker.Task) (any, error) {
	var text string
	if err := t.Bind(&text); err != nil {
		return nil, err
	}
	counts := map[string]int64{}
	for _, w := range strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && r != '\''
	}) {
		counts[w]++
	}
	type wc struct {
		w string
		n int64
	}
	all := make([]wc, 0, len(counts))
	for w, n := range counts {
		all = append(all, wc{w, n})
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].n != all[j].n {
			return all[i].n > all[j].n
		}
		return all[i].w < all[j].w
	})
	top := map[string]any{}
	for i := 0; i < len(all) && i < 5; i++ {
		top[all[i].w] = all[i].n
	}
	return map[string]any{"words": int64(len(counts)), "top": top}, nil
}

// SHA256 returns the hex SHA-256 of a string (tasks.sha256).
func SHA256(ctx context.Context, t *worker.Task) (any, error) {
	var s string
	if err := t.Bind(&s); err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:]), nil
}

// Primes counts the primes below n with a sieve (tasks.primes), checking
// ctx so that time limits and revokes can stop it.
func Primes(ctx context.Context, t *worker.Task) (any, error) {
	var n int
	if err := t.Bind(&n); err != nil {
		return nil, err
	}
	if n < 0 || n > 50_000_000 {
		return nil, worker.NewException("ValueError", fmt.Sprintf("n must be in [0, 50000000], got %d", n))
	}
	composite := make([]bool, n)
	count := int64(0)
	for i := 2; i < n; i++ {
		if i%1_000_000 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if composite[i] {
			continue
		}
		count++
		for j := i * i; j < n; j += i {
			composite[j] = true
		}
	}
	return count, nil
}

// Fail always fails with ValueError(message) (tasks.fail).
func Fail(ctx context.Context, t *worker.Task) (any, error) {
	msg := "tasks.fail was called"
	if len(t.Args) > 0 {
		if err := t.Bind(&msg); err != nil {
			return nil, err
		}
	}
	return nil, worker.NewException("ValueError", msg)
}

// Noop accepts any arguments and returns None (tasks.noop): what
// celeriac bench drains to measure the worker, not the work.
func Noop(ctx context.Context, t *worker.Task) (any, error) { return nil, nil }

// Sleep sleeps for the given seconds, or until ctx ends (tasks.sleep).
func Sleep(ctx context.Context, t *worker.Task) (any, error) {
	var secs float64
	if err := t.Bind(&secs); err != nil {
		return nil, err
	}
	select {
	case <-time.After(time.Duration(secs * float64(time.Second))):
		return secs, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ErrTransient is the flaky task's retryable failure.
var ErrTransient = errors.New("demotasks: transient failure")

// Flaky fails its first N attempts with a transient error, then succeeds:
// tasks.flaky(n) shows retries with backoff. Its retry policy retries
// ErrTransient with exponential backoff (1 s, 2 s, 4 s ...).
type Flaky struct{}

// NewFlaky returns a Flaky.
func NewFlaky() *Flaky { return &Flaky{} }

// Handle is the handler.
func (f *Flaky) Handle(ctx context.Context, t *worker.Task) (any, error) {
	var failures int
	if err := t.Bind(&failures); err != nil {
		return nil, err
	}
	// The retries header counts attempts across workers and restarts.
	if t.Retries < failures {
		return nil, worker.AsException(fmt.Errorf("%w (attempt %d of %d failing)", ErrTransient, t.Retries+1, failures), "ConnectionError")
	}
	return fmt.Sprintf("succeeded after %d retries", t.Retries), nil
}
