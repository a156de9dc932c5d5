package dlock

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/dlockio/dlock/internal/nilretry"
)

// RetryStrategy decides whether Lock tries again after a failed attempt,
// and how long it waits first. The wait is the strategy's after an attempt
// that Redis did not answer (or answered with an error), and when the
// driver cannot subscribe (then it is the polling interval). While the
// lock is held and the client gets Redis's notices, a waiter sleeps
// instead until it is woken, the holder's TTL runs out or half a second
// passes, whatever the strategy's wait: the strategy bounds how many
// attempts are made, not how long they take (WithMaxWait and the context
// bound that). The waits of the strategies below are meant in that sense.
// A wait shorter than a millisecond counts as one: a Redis that is down,
// or that refuses every request, answers at once. Strategies are
// stateless: one value may serve any number of calls and goroutines at
// once. NextBackoff runs on the waiting caller's goroutine: should it
// panic, the wait is abandoned first (what its attempts left in Redis, a
// waiting writer's place in line among them, is cleaned up), and the
// panic goes on to the caller, as a WithOnRetry function's or the
// logger's does.
type RetryStrategy interface {
	// NextBackoff returns the wait before the next attempt, given the number
	// of attempts that failed so far (1 after the first failure), and false
	// to stop trying.
	NextBackoff(failed int) (time.Duration, bool)
}

// RetryFunc adapts a plain function to a RetryStrategy.
type RetryFunc func(failed int) (time.Duration, bool)

// NextBackoff calls f.
func (f RetryFunc) NextBackoff(failed int) (time.Duration, bool) { return f(failed) }

// NoRetry gives up after the first attempt.
func NoRetry() RetryStrategy {
	return RetryFunc(func(int) (time.Duration, bool) { return 0, false })
}

// minBackoff is the least wait after a failed attempt, whatever the
// strategy says: a Redis that is down, or that refuses every request (OOM,
// READONLY), answers at once, and a strategy of no wait would make each
// waiting caller retry hundreds of thousands of times a second, for as
// long as its wait lasts. A waiter that a lock's holder refused and that
// gets the release's notices is not held to it: it registers at once.
const minBackoff = time.Millisecond

// ConstantBackoff waits d between attempts (see RetryStrategy); a d under
// a millisecond waits a millisecond.
func ConstantBackoff(d time.Duration) RetryStrategy {
	d = max(d, 0)
	return RetryFunc(func(int) (time.Duration, bool) { return d, true })
}

// LinearBackoff waits step after the first failure, 2×step after the second,
// and so on, never more than limit (no cap when limit is zero or
// negative).
func LinearBackoff(step, limit time.Duration) RetryStrategy {
	step = max(step, 0)
	return RetryFunc(func(failed int) (time.Duration, bool) {
		d := time.Duration(math.MaxInt64) // failed×step, saturated
		if step == 0 || int64(max(failed, 0)) <= math.MaxInt64/int64(step) {
			d = time.Duration(max(failed, 0)) * step
		}
		return capped(d, limit), true
	})
}

// ExponentialBackoff waits min after the first failure and doubles the wait
// after each further one, never more than limit (no cap when limit is zero
// or negative; a positive limit under a millisecond still waits one). A
// min under a millisecond starts at a millisecond, from which the waits
// double. Wrap it in Jitter to keep many waiters from retrying in step.
func ExponentialBackoff(min, limit time.Duration) RetryStrategy {
	min = max(min, minBackoff)
	ceiling := limit
	if ceiling <= 0 || ceiling > math.MaxInt64/2 {
		ceiling = math.MaxInt64 / 2 // d doubles below it without overflow
	}
	return RetryFunc(func(failed int) (time.Duration, bool) {
		d := min
		for i := 1; i < failed && d < ceiling && d > 0; i++ {
			d *= 2
		}
		return capped(d, limit), true
	})
}

// Intervals waits ds[0] after the first failure, ds[1] after the second, and
// so on; after the last it gives up.
func Intervals(ds ...time.Duration) RetryStrategy {
	ds = append([]time.Duration(nil), ds...)
	return RetryFunc(func(failed int) (time.Duration, bool) {
		if failed < 1 || failed > len(ds) {
			return 0, false
		}
		return max(ds[failed-1], 0), true
	})
}

// LimitRetry stops s after max attempts in all (the first included). A nil
// s (or a nil RetryFunc) makes WithRetry fail with ErrInvalidOption. It
// bounds attempts, not time: while the lock is held and the client gets
// Redis's notices, a waiter sleeps until it is woken or half a second
// passes, whatever s's delay, so bound a wait by time with WithMaxWait or
// the context.
func LimitRetry(s RetryStrategy, max int) RetryStrategy {
	if isNilRetry(s) {
		return nilRetry("LimitRetry")
	}
	if n, ok := s.(nilRetry); ok {
		return n
	}
	return RetryFunc(func(failed int) (time.Duration, bool) {
		if failed >= max {
			return 0, false
		}
		return s.NextBackoff(failed)
	})
}

// Jitter randomises the waits of s: each becomes a uniformly random duration
// in [(1-fraction)×d, d]. A fraction of 1 gives "full jitter"; fractions
// outside [0, 1] are clamped, and NaN jitters nothing. A nil s (or a nil
// RetryFunc) makes WithRetry fail with ErrInvalidOption.
func Jitter(s RetryStrategy, fraction float64) RetryStrategy {
	if isNilRetry(s) {
		return nilRetry("Jitter")
	}
	if n, ok := s.(nilRetry); ok {
		return n
	}
	fraction = min(max(fraction, 0), 1)
	if math.IsNaN(fraction) {
		fraction = 0
	}
	return RetryFunc(func(failed int) (time.Duration, bool) {
		d, ok := s.NextBackoff(failed)
		if !ok || d <= 0 || fraction == 0 {
			return d, ok
		}
		// The span is fraction×d, but d itself when that rounds to d's
		// float or above: near the longest duration, that float is 2^63,
		// which no conversion to a Duration gives back.
		span := d
		if f := float64(d) * fraction; f < float64(d) {
			span = time.Duration(f)
		}
		if span <= 0 {
			return d, ok
		}
		// span+1 fits in a uint64 even when span is the longest duration.
		return d - time.Duration(rand.Uint64N(uint64(span)+1)), ok
	})
}

// capped bounds d to [0, limit], or to [0, ∞) when limit is not positive.
func capped(d, limit time.Duration) time.Duration {
	if limit > 0 && d > limit {
		return limit
	}
	return max(d, 0)
}

// nilRetry is what a strategy built from a nil one is: WithRetry refuses
// it, naming the function it came from.
type nilRetry = nilretry.Strategy

// isNilRetry reports whether s is nil or a nil RetryFunc.
func isNilRetry(s RetryStrategy) bool {
	f, ok := s.(RetryFunc)
	return s == nil || ok && f == nil
}
