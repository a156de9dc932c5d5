package harness

import "time"

// Config sizes a run. Full, Quick and Tiny are the presets.
type Config struct {
	// Rounds is how many times every library runs a slice of each of
	// scenarios 1–4, in rotating order; reports give the median.
	Rounds int
	// RoundsMany and RoundsRefresh are the rounds of scenarios 5 and 6,
	// whose slices are longer.
	RoundsMany, RoundsRefresh int

	// TTL of the locks of scenarios 1–5: long enough never to expire.
	TTL time.Duration
	// PoolSize of every go-redis client.
	PoolSize int

	// Scenario 1: one goroutine; a slice lasts Slice or MaxOps pairs.
	UncontendedSlice  time.Duration
	UncontendedMaxOps int
	// Scenario 2: ParallelGoroutines goroutines for ParallelSlice.
	ParallelSlice      time.Duration
	ParallelGoroutines int
	// Scenarios 3 and 4: HandoffWorkers workers, each pausing HandoffPause
	// after it releases, measured for HandoffSlice after HandoffWarmup.
	HandoffSlice, HandoffWarmup, HandoffPause time.Duration
	HandoffWorkers                            int
	// Scenario 5: ManyWaiters waiters over ManyClients clients; measured
	// over ManyHandoffs handoffs (after ManyWarmup time and 10 handoffs),
	// or ManyMaxTime, whichever comes first.
	ManyWaiters, ManyClients, ManyHandoffs int
	ManyWarmup, ManyMaxTime                time.Duration
	// Scenario 6: RefreshLocks auto-refreshed locks with RefreshTTL,
	// measured over RefreshIntervals intervals of RefreshTTL/2 (the floor's
	// and rueidislock's refresh period; dlock's is RefreshTTL/3).
	RefreshLocks, RefreshIntervals int
	RefreshTTL                     time.Duration
}

// Full is the preset of a complete run: a few minutes.
func Full() Config {
	return Config{
		Rounds: 7, RoundsMany: 3, RoundsRefresh: 3,
		TTL: 30 * time.Second, PoolSize: 64,
		UncontendedSlice: 400 * time.Millisecond, UncontendedMaxOps: 200_000,
		ParallelSlice: 600 * time.Millisecond, ParallelGoroutines: 64,
		HandoffSlice: 800 * time.Millisecond, HandoffWarmup: 100 * time.Millisecond, HandoffPause: 200 * time.Microsecond,
		HandoffWorkers: 16,
		ManyWaiters:    1000, ManyClients: 16, ManyHandoffs: 300,
		ManyWarmup: 300 * time.Millisecond, ManyMaxTime: 3 * time.Second,
		RefreshLocks: 10_000, RefreshIntervals: 3, RefreshTTL: 2 * time.Second,
	}
}

// Quick is the preset of a smoke run of under a minute: the same
// scenarios, fewer rounds, shorter slices.
func Quick() Config {
	c := Full()
	c.Rounds, c.RoundsMany, c.RoundsRefresh = 2, 1, 1
	c.UncontendedSlice, c.ParallelSlice = 200*time.Millisecond, 200*time.Millisecond
	c.HandoffSlice = 400 * time.Millisecond
	c.ManyHandoffs, c.ManyMaxTime = 100, 1500*time.Millisecond
	c.RefreshIntervals = 2
	return c
}

// Tiny is the preset of the package's test: every scenario once with a few
// hundred operations.
func Tiny() Config {
	return Config{
		Rounds: 1, RoundsMany: 1, RoundsRefresh: 1,
		TTL: 30 * time.Second, PoolSize: 16,
		UncontendedSlice: 100 * time.Millisecond, UncontendedMaxOps: 200,
		ParallelSlice: 100 * time.Millisecond, ParallelGoroutines: 8,
		HandoffSlice: 150 * time.Millisecond, HandoffWarmup: 20 * time.Millisecond, HandoffPause: 200 * time.Microsecond,
		HandoffWorkers: 4,
		ManyWaiters:    40, ManyClients: 4, ManyHandoffs: 20,
		ManyWarmup: 50 * time.Millisecond, ManyMaxTime: time.Second,
		RefreshLocks: 200, RefreshIntervals: 1, RefreshTTL: 400 * time.Millisecond,
	}
}
