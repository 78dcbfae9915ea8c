// Package retry holds Celery's retry policy: which errors are retried, how
// long to wait (retry_backoff, retry_backoff_max, retry_jitter and
// default_retry_delay, with Celery's exact formula) and when to give up
// (max_retries). It also defines the errors a handler returns to steer
// retries explicitly.
//
// The package is a leaf: it imports only the standard library, and it is
// pure. It reads no clock and no global random source; callers pass the
// current time and a random source (math/rand/v2's IntN fits), so every
// decision can be replayed in a test.
//
// # Steering retries from a handler
//
// A handler asks for a retry by returning an error value, never by calling
// into the worker:
//
//	return nil, retry.After(30*time.Second, err)   // self.retry(exc=err, countdown=30)
//	return nil, retry.At(eta, err)                 // self.retry(exc=err, eta=eta)
//	return nil, retry.Later(err)                   // self.retry(exc=err): default_retry_delay
//	return nil, retry.AfterHeader(resp.Header.Get("Retry-After"), err) // 429/503
//	return nil, retry.After(d, err).WithMaxRetries(10)                 // self.retry(max_retries=10)
//	return nil, retry.Skip(err)                    // permanent: FAILURE now
//
// Any other error goes to the task's [Policy]: it is retried automatically
// only when [Policy.AutoRetryFor] matches it, as with Celery's
// autoretry_for.
//
// # Deciding
//
// The worker calls [Policy.Decide] with the handler's error, the message's
// retries count, the time and a random source, and gets a [Decision]: retry
// (with a countdown and ETA) or fail (with the exception to record).
//
//	p := retry.Policy{
//		AutoRetryFor: []retry.Matcher{retry.OnType[*net.OpError]()},
//		MaxRetries:   retry.Limited(5),
//		Backoff:      1, // retry_backoff=True
//	}
//	d := p.Decide(err, retries, time.Now(), rand.IntN)
//
// The backoff formula, [BackoffInterval], and the decisions are tested
// against values produced by Celery 5.2.6 itself (testdata/gen_*.py).
package retry
