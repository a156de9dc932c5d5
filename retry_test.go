package dlock_test

import (
	"maps"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// waits lists the backoffs a strategy gives for failures 1..n, stopping
// where it stops.
func waits(s dlock.RetryStrategy, n int) []time.Duration {
	var out []time.Duration
	for i := 1; i <= n; i++ {
		d, ok := s.NextBackoff(i)
		if !ok {
			break
		}
		out = append(out, d)
	}
	return out
}

func TestRetryStrategies(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name string
		s    dlock.RetryStrategy
		want []time.Duration
	}{
		{"no retry", dlock.NoRetry(), nil},
		{"constant", dlock.ConstantBackoff(5 * ms), []time.Duration{5 * ms, 5 * ms, 5 * ms, 5 * ms}},
		{"constant zero", dlock.ConstantBackoff(0), []time.Duration{0, 0, 0, 0}},
		{"linear", dlock.LinearBackoff(10*ms, 25*ms), []time.Duration{10 * ms, 20 * ms, 25 * ms, 25 * ms}},
		{"linear uncapped", dlock.LinearBackoff(10*ms, 0), []time.Duration{10 * ms, 20 * ms, 30 * ms, 40 * ms}},
		{"exponential", dlock.ExponentialBackoff(2*ms, 10*ms), []time.Duration{2 * ms, 4 * ms, 8 * ms, 10 * ms}},
		{"exponential uncapped", dlock.ExponentialBackoff(ms, 0), []time.Duration{ms, 2 * ms, 4 * ms, 8 * ms}},
		{"exponential from zero", dlock.ExponentialBackoff(0, 5*ms), []time.Duration{ms, 2 * ms, 4 * ms, 5 * ms}},
		{"linear, negative limit", dlock.LinearBackoff(10*ms, -ms), []time.Duration{10 * ms, 20 * ms, 30 * ms, 40 * ms}},
		{"exponential, negative limit", dlock.ExponentialBackoff(ms, -ms), []time.Duration{ms, 2 * ms, 4 * ms, 8 * ms}},
		{"intervals", dlock.Intervals(3*ms, ms, 7*ms), []time.Duration{3 * ms, ms, 7 * ms}},
		{"limit", dlock.LimitRetry(dlock.ConstantBackoff(ms), 3), []time.Duration{ms, ms}},
		{"limit of one", dlock.LimitRetry(dlock.ConstantBackoff(ms), 1), nil},
		{"func", dlock.RetryFunc(func(n int) (time.Duration, bool) { return time.Duration(n) * ms, n < 3 }), []time.Duration{ms, 2 * ms}},
	}
	for _, tc := range cases {
		if got := waits(tc.s, 4); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestExponentialBackoffDoesNotOverflow(t *testing.T) {
	s := dlock.ExponentialBackoff(time.Hour, 0)
	if d, ok := s.NextBackoff(1000); !ok || d < time.Hour {
		t.Errorf("NextBackoff(1000) = %v, %v", d, ok)
	}
	// The largest cap, a common way to say none, never wraps to no wait.
	s = dlock.ExponentialBackoff(time.Millisecond, math.MaxInt64)
	last := time.Duration(0)
	for failed := 1; failed <= 100; failed++ {
		d, ok := s.NextBackoff(failed)
		if !ok || d < last {
			t.Fatalf("NextBackoff(%d) = %v, %v after %v", failed, d, ok, last)
		}
		last = d
	}
}

func TestLinearBackoffDoesNotOverflow(t *testing.T) {
	for _, failed := range []int{2_562_048, math.MaxInt} {
		if d, ok := dlock.LinearBackoff(time.Hour, 0).NextBackoff(failed); !ok || d < time.Hour {
			t.Errorf("uncapped: NextBackoff(%d) = %v, %v", failed, d, ok)
		}
		if d, ok := dlock.LinearBackoff(time.Hour, 2*time.Hour).NextBackoff(failed); !ok || d != 2*time.Hour {
			t.Errorf("capped at 2h: NextBackoff(%d) = %v, %v", failed, d, ok)
		}
	}
}

func TestJitterStaysInRange(t *testing.T) {
	s := dlock.Jitter(dlock.Intervals(100*time.Millisecond, 10*time.Millisecond), 0.5)
	seen := map[time.Duration]bool{}
	for range 1000 {
		d, ok := s.NextBackoff(1)
		if !ok || d < 50*time.Millisecond || d > 100*time.Millisecond {
			t.Fatalf("jittered wait %v outside [50ms, 100ms]", d)
		}
		seen[d] = true
	}
	if len(seen) < 100 {
		t.Errorf("only %d distinct waits in 1000: not random", len(seen))
	}
	if _, ok := s.NextBackoff(3); ok {
		t.Error("Jitter must stop where the strategy stops")
	}
	if d, _ := dlock.Jitter(dlock.ConstantBackoff(time.Second), 7).NextBackoff(1); d < 0 || d > time.Second {
		t.Errorf("fraction above 1 not clamped: %v", d)
	}
}

// Jitter spreads waits up to the longest duration too: a fraction of it
// that rounds up to 2^63 as a float is no valid duration (on amd64 it
// became negative and the wait went unjittered, on arm64 it saturated and
// the random draw panicked).
func TestJitterOfTheLongestWait(t *testing.T) {
	s := dlock.Jitter(dlock.ConstantBackoff(math.MaxInt64), 1)
	seen := map[time.Duration]bool{}
	for range 20 {
		d, ok := s.NextBackoff(1)
		if !ok || d < 0 {
			t.Fatalf("jittered wait %v, %v", d, ok)
		}
		seen[d] = true
	}
	if len(seen) < 2 {
		t.Errorf("every wait was %v: not jittered", slices.Collect(maps.Keys(seen)))
	}
	if d, _ := dlock.Jitter(dlock.ConstantBackoff(time.Second), math.NaN()).NextBackoff(1); d != time.Second {
		t.Errorf("a NaN fraction gave %v, want the wait unjittered", d)
	}
}

// TestStrategiesAreSharedSafely runs one strategy value from many goroutines
// under the race detector: strategies keep no state.
func TestStrategiesAreSharedSafely(t *testing.T) {
	s := dlock.LimitRetry(dlock.Jitter(dlock.ExponentialBackoff(time.Millisecond, time.Second), 1), 10)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got := len(waits(s, 20)); got != 9 {
				t.Errorf("%d waits, want 9", got)
			}
		}()
	}
	wg.Wait()
}

// A retry strategy that panics leaves nothing behind either, as a
// WithOnRetry function that panics: the acquisition is abandoned (a
// waiting writer's pending acquire goes, which kept every reader out for
// the writer's TTL), AcquireDone sees it end, and the panic goes on.
func TestAPanickingRetryStrategyLeavesNothingBehind(t *testing.T) {
	e := newEnv(t)
	c, starts, dones := countingClient(t, e)
	boom := dlock.RetryFunc(func(int) (time.Duration, bool) { panic("boom") })
	writerPanicsInItsWait(t, e, c, "panicky", "the strategy's", dlock.WithRetry(boom))
	checkOnce(t, starts, dones)
}
