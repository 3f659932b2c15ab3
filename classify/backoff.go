package classify

import (
	"math/rand/v2"
	"time"
)

// Backoff is the delay before the next try of a transient failure (the
// consume loop's events, the rebuild's loads) that has failed attempts
// times before this one: min(max, base·2^attempts) with equal
// jitter, i.e. a uniformly random delay in [d/2, d]. Equal jitter spreads a
// burst of retries over half the step yet never retries sooner than half of
// the exponential schedule, which full jitter would (down to zero).
// retryAfter, from a 429, is a floor.
func Backoff(attempts int, base, max, retryAfter time.Duration) time.Duration {
	d := max
	if attempts < 32 {
		if step := base << attempts; step > 0 && step < max {
			d = step
		}
	}
	half := d / 2
	d = half + rand.N(d-half+1)
	retryAfter = min(retryAfter, RetryAfterMax)
	if retryAfter > d {
		d = retryAfter
	}
	return d
}
