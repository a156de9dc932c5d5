package dlock_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/dlockio/dlock"
)

// TestConcurrentCallsShareRoundTrips runs 64 goroutines taking and
// releasing locks on distinct names through one client: every operation
// must succeed, and the client must have coalesced them into fewer round
// trips than operations.
func TestConcurrentCallsShareRoundTrips(t *testing.T) {
	for _, pipelines := range []int{1, dlock.DefaultPipelines} {
		t.Run("pipelines="+strconv.Itoa(pipelines), func(t *testing.T) { testSharedRoundTrips(t, pipelines) })
	}
}

func testSharedRoundTrips(t *testing.T, pipelines int) {
	e := newEnv(t)
	drv := e.newDriver(t)
	c := dlock.New(drv, dlock.WithPipelines(pipelines))
	ctx := context.Background()
	const workers, rounds = 64, 40
	before := drv.trips.Load()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				l, err := c.TryLock(ctx, "par:"+strconv.Itoa(w)+":"+strconv.Itoa(r))
				if err != nil {
					t.Error(err)
					return
				}
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	ops := int64(2 * workers * rounds)
	trips := drv.trips.Load() - before
	t.Logf("%d operations in %d round trips", ops, trips)
	if trips >= ops {
		t.Errorf("%d round trips for %d operations: nothing was pipelined", trips, ops)
	}
	// Each name keeps its fence counter, and for a minute the marker of its
	// last release; no lock is left.
	if n := e.srv.Do(t, "DBSIZE"); n != strconv.Itoa(2*workers*rounds) {
		t.Errorf("%s keys left, want %d fence counters and release markers", n, 2*workers*rounds)
	}
}
