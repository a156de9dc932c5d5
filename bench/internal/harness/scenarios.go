package harness

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Metric is one column of a scenario's table.
type Metric struct {
	Key   string
	Label string
	// NoRatio leaves the ratio to the floor out (counts, not rates).
	NoRatio bool
}

// Scenario is one workload, run by every library in turn.
type Scenario struct {
	ID      int
	Title   string
	Short   string // a shorter title, for the chart
	What    string // what it measures, one sentence
	Unit    string // what one operation is: "pair", "acquisition", …
	Metrics []Metric
	// Headline is the key of its throughput metric, charted as a ratio to
	// the floor ("" for none).
	Headline string

	rounds func(Config) int
	slice  func(r *runner, lib Library) (sample, error)
}

// sample is what one slice of one library measured.
type sample struct {
	values map[string]float64
	errors int64  // failed operations (reported, never hidden)
	note   string // anything odd
	// mix is the server's calls of each command over ops operations.
	mix map[string]int64
	ops float64
}

// Scenarios returns the six scenarios, in order.
func Scenarios() []*Scenario {
	return []*Scenario{
		{
			ID: 1, Title: "uncontended", Short: "uncontended", Unit: "pair",
			What: "one goroutine, TryLock+Release pairs on distinct keys, one client",
			Metrics: []Metric{
				{Key: "pairs_s", Label: "pairs/s"}, {Key: "p50_us", Label: "p50 µs"}, {Key: "p99_us", Label: "p99 µs"},
				{Key: "allocs", Label: "allocs/pair"}, {Key: "bytes", Label: "B/pair"},
				{Key: "cmds", Label: "cmds/pair"}, {Key: "reqs", Label: "reqs/pair"},
				{Key: "cpu_us", Label: "server CPU µs/pair"}, {Key: "ccpu_us", Label: "client CPU µs/pair"},
				{Key: "keys_left", Label: "keys left/name", NoRatio: true},
			},
			Headline: "pairs_s",
			rounds:   func(c Config) int { return c.Rounds },
			slice:    (*runner).uncontended,
		},
		{
			ID: 2, Title: "parallel", Short: "parallel", Unit: "pair",
			What: "64 goroutines, TryLock+Release pairs on distinct keys, one shared client",
			Metrics: []Metric{
				{Key: "pairs_s", Label: "pairs/s"}, {Key: "cmds", Label: "cmds/pair"}, {Key: "reqs", Label: "reqs/pair"},
				{Key: "reads", Label: "server reads/pair"}, {Key: "cpu_us", Label: "server CPU µs/pair"},
				{Key: "ccpu_us", Label: "client CPU µs/pair"},
			},
			Headline: "pairs_s",
			rounds:   func(c Config) int { return c.Rounds },
			slice:    (*runner).parallel,
		},
		{
			ID: 3, Title: "contended handoff, own clients", Short: "handoff, own clients", Unit: "acquisition",
			What:    "16 workers, one client each, Lock one key, release, pause 200 µs, again",
			Metrics: handoffMetrics(), Headline: "acq_s",
			rounds: func(c Config) int { return c.Rounds },
			slice:  func(r *runner, lib Library) (sample, error) { return r.handoff(lib, false) },
		},
		{
			ID: 4, Title: "contended handoff, shared client", Short: "handoff, shared", Unit: "acquisition",
			What:    "as 3, the 16 workers sharing one client",
			Metrics: handoffMetrics(), Headline: "acq_s",
			rounds: func(c Config) int { return c.Rounds },
			slice:  func(r *runner, lib Library) (sample, error) { return r.handoff(lib, true) },
		},
		{
			ID: 5, Title: "many waiters", Short: "many waiters", Unit: "handoff",
			What: "1,000 waiters over 16 clients on one key, a bounded number of handoffs",
			Metrics: []Metric{
				{Key: "acq_s", Label: "handoffs/s"}, {Key: "wake_p50_us", Label: "wake p50 µs"}, {Key: "wake_p99_us", Label: "wake p99 µs"},
				{Key: "cmds", Label: "cmds/handoff"}, {Key: "reqs", Label: "reqs/handoff"}, {Key: "reads", Label: "server reads/handoff"},
				{Key: "cpu_us", Label: "server CPU µs/handoff"}, {Key: "ccpu_us", Label: "client CPU µs/handoff"},
				{Key: "allocs", Label: "allocs/handoff"},
				{Key: "pause_us", Label: "pause µs", NoRatio: true},
				{Key: "n", Label: "handoffs measured", NoRatio: true},
			},
			Headline: "acq_s",
			rounds:   func(c Config) int { return c.RoundsMany },
			slice:    (*runner).manyWaiters,
		},
		{
			ID: 6, Title: "auto-refresh", Short: "auto-refresh", Unit: "lock refresh",
			What: "10,000 locks held and refreshed by the library (the floor and rueidislock every TTL/2, dlock every TTL/3, its default); cost per 1 s interval",
			Metrics: []Metric{
				{Key: "reads", Label: "server reads/interval"}, {Key: "rtts", Label: "client round trips/interval"},
				{Key: "reqs", Label: "reqs/interval"}, {Key: "cmds", Label: "cmds/interval"},
				{Key: "cpu_ms", Label: "server CPU ms/interval"}, {Key: "ccpu_ms", Label: "client CPU ms/interval"},
				{Key: "goroutines", Label: "goroutines/lock"}, {Key: "heap", Label: "heap+stack B/lock"},
				{Key: "lost", Label: "locks lost", NoRatio: true},
			},
			rounds: func(c Config) int { return c.RoundsRefresh },
			slice:  (*runner).autoRefresh,
		},
	}
}

func handoffMetrics() []Metric {
	return []Metric{
		{Key: "acq_s", Label: "acq/s"}, {Key: "wake_p50_us", Label: "wake p50 µs"}, {Key: "wake_p99_us", Label: "wake p99 µs"},
		{Key: "cmds", Label: "cmds/acq"}, {Key: "reqs", Label: "reqs/acq"}, {Key: "cpu_us", Label: "server CPU µs/acq"},
		{Key: "ccpu_us", Label: "client CPU µs/acq"},
		{Key: "allocs", Label: "allocs/acq"}, {Key: "pause_us", Label: "pause µs", NoRatio: true},
		{Key: "worker_min", Label: "acq/worker min", NoRatio: true}, {Key: "worker_max", Label: "acq/worker max", NoRatio: true},
	}
}

// runner runs slices against one server.
type runner struct {
	cfg  Config
	srv  *Server
	keys []string // distinct keys of scenario 1
	pkey [][]string
	lat  []time.Duration
}

func newRunner(cfg Config, srv *Server) *runner {
	r := &runner{cfg: cfg, srv: srv, lat: make([]time.Duration, 0, cfg.UncontendedMaxOps)}
	r.keys = make([]string, 8192)
	for i := range r.keys {
		r.keys[i] = "u:" + strconv.Itoa(i)
	}
	r.pkey = make([][]string, cfg.ParallelGoroutines)
	for g := range r.pkey {
		r.pkey[g] = make([]string, 256)
		for i := range r.pkey[g] {
			r.pkey[g][i] = "p:" + strconv.Itoa(g) + ":" + strconv.Itoa(i)
		}
	}
	return r
}

func (r *runner) clientConfig(c *Counters, ttl time.Duration) ClientConfig {
	return ClientConfig{Addr: r.srv.Addr, TTL: ttl, PoolSize: r.cfg.PoolSize, Counters: c}
}

// clients makes n clients of lib.
func (r *runner) clients(lib Library, n int, c *Counters, ttl time.Duration) ([]Locker, func(), error) {
	ls := make([]Locker, 0, n)
	closeAll := func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}
	for range n {
		l, err := lib.New(r.clientConfig(c, ttl))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		ls = append(ls, l)
	}
	return ls, closeAll, nil
}

// begin clears the server's counters and the client's, before a measured
// window.
func (r *runner) begin(ctx context.Context, c *Counters) error {
	if err := r.srv.ResetStats(ctx); err != nil {
		return err
	}
	c.Reset()
	return nil
}

func (r *runner) uncontended(lib Library) (sample, error) {
	ctx := context.Background()
	cnt := &Counters{}
	ls, closeAll, err := r.clients(lib, 1, cnt, r.cfg.TTL)
	if err != nil {
		return sample{}, err
	}
	defer closeAll()
	lk := ls[0]
	var errs errTally
	for i := range 50 { // warm-up: connection, scripts
		if h, err := lk.TryLock(ctx, r.keys[len(r.keys)-1-i]); err == nil {
			_ = h.Release(ctx)
		}
	}
	if err := r.begin(ctx, cnt); err != nil {
		return sample{}, err
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	lat := r.lat[:0]
	cpu0 := processCPU()
	start := time.Now()
	end := start.Add(r.cfg.UncontendedSlice)
	for i := 0; i < r.cfg.UncontendedMaxOps; i++ {
		t0 := time.Now()
		if t0.After(end) {
			break
		}
		h, err := lk.TryLock(ctx, r.keys[i%len(r.keys)])
		if err != nil {
			errs.add("TryLock", err)
			continue
		}
		err = h.Release(ctx)
		lat = append(lat, time.Since(t0))
		if err != nil {
			errs.add("Release", err)
		}
	}
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	runtime.ReadMemStats(&m1)
	st, err := r.srv.Stats(ctx)
	if err != nil {
		return sample{}, err
	}
	left, err := r.srv.Keys(ctx)
	if err != nil {
		return sample{}, err
	}
	n := float64(len(lat))
	if n == 0 {
		return sample{errors: errs.count(), note: errs.note()}, errors.New("no pair completed")
	}
	names := min(len(lat)+50, len(r.keys)) // the warm-up used 50 more
	slices.Sort(lat)
	return sample{errors: errs.count(), note: errs.note(), mix: st.ByCommand, ops: n, values: map[string]float64{
		"cpu_us":    us(st.CPU) / n,
		"ccpu_us":   us(cpu) / n,
		"keys_left": float64(left) / float64(names),
		"pairs_s":   n / elapsed.Seconds(),
		"p50_us":    us(percentile(lat, 0.50)),
		"p99_us":    us(percentile(lat, 0.99)),
		"allocs":    float64(m1.Mallocs-m0.Mallocs) / n,
		"bytes":     float64(m1.TotalAlloc-m0.TotalAlloc) / n,
		"cmds":      float64(st.Commands) / n,
		"reqs":      float64(cnt.Commands.Load()) / n,
	}}, nil
}

func (r *runner) parallel(lib Library) (sample, error) {
	ctx := context.Background()
	cnt := &Counters{}
	ls, closeAll, err := r.clients(lib, 1, cnt, r.cfg.TTL)
	if err != nil {
		return sample{}, err
	}
	defer closeAll()
	lk := ls[0]
	g := r.cfg.ParallelGoroutines
	var wg sync.WaitGroup
	run := func(fn func(g int)) {
		for i := range g {
			wg.Add(1)
			go func() { defer wg.Done(); fn(i) }()
		}
		wg.Wait()
	}
	run(func(i int) { // warm-up: fills the pool
		for j := range 3 {
			if h, err := lk.TryLock(ctx, r.pkey[i][len(r.pkey[i])-1-j]); err == nil {
				_ = h.Release(ctx)
			}
		}
	})
	if err := r.begin(ctx, cnt); err != nil {
		return sample{}, err
	}
	var pairs atomic.Int64
	var errs errTally
	cpu0 := processCPU()
	start := time.Now()
	end := start.Add(r.cfg.ParallelSlice)
	run(func(i int) {
		keys := r.pkey[i]
		var n int64
		for j := 0; time.Now().Before(end); j++ {
			h, err := lk.TryLock(ctx, keys[j%len(keys)])
			if err != nil {
				errs.add("TryLock", err)
				continue
			}
			if err := h.Release(ctx); err != nil {
				errs.add("Release", err)
			}
			n++
		}
		pairs.Add(n)
	})
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	st, err := r.srv.Stats(ctx)
	if err != nil {
		return sample{}, err
	}
	n := float64(pairs.Load())
	if n == 0 {
		return sample{errors: errs.count(), note: errs.note()}, errors.New("no pair completed")
	}
	return sample{errors: errs.count(), note: errs.note(), mix: st.ByCommand, ops: n, values: map[string]float64{
		"cpu_us":  us(st.CPU) / n,
		"ccpu_us": us(cpu) / n,
		"pairs_s": n / elapsed.Seconds(),
		"cmds":    float64(st.Commands) / n,
		"reqs":    float64(cnt.Commands.Load()) / n,
		"reads":   float64(st.Reads) / n,
	}}, nil
}

// contention runs workers that take turns on one key: Lock, release, pause,
// again. It records the wake-up latency from a release call to the next
// acquisition by another worker, and checks that no two hold the lock at
// once.
type contention struct {
	base       time.Time
	holders    atomic.Int32
	violations atomic.Int64
	giveUps    errTally // Lock returned an error before the end
	relErrs    errTally
	lastRel    atomic.Int64 // when the last release was called, since base
	lastOwner  atomic.Int64
	total      atomic.Int64
	stopAt     atomic.Int64 // total at which stop is closed
	stop       chan struct{}
	recording  atomic.Bool
	pauseSum   atomic.Int64 // time the pauses really took, and their number
	pauses     atomic.Int64
	perWorker  []atomic.Int64
	lats       [][]time.Duration
}

func newContention(workers int) *contention {
	c := &contention{base: time.Now(), stop: make(chan struct{}),
		perWorker: make([]atomic.Int64, workers), lats: make([][]time.Duration, workers)}
	c.lastOwner.Store(-1)
	c.stopAt.Store(math.MaxInt64)
	return c
}

func (c *contention) worker(ctx context.Context, id int, lk Locker, key string, pause time.Duration) {
	for ctx.Err() == nil {
		h, err := lk.Lock(ctx, key)
		if err != nil {
			if ctx.Err() == nil {
				c.giveUps.add("Lock gave up", err)
				time.Sleep(time.Millisecond) // never spin on a failing library
			}
			continue
		}
		now := int64(time.Since(c.base))
		if c.holders.Add(1) != 1 {
			c.violations.Add(1)
		}
		if c.recording.Load() && c.lastOwner.Load() != int64(id) && c.lastRel.Load() != 0 {
			c.lats[id] = append(c.lats[id], time.Duration(now-c.lastRel.Load()))
		}
		c.perWorker[id].Add(1)
		if c.total.Add(1) == c.stopAt.Load() {
			close(c.stop)
		}
		c.holders.Add(-1)
		c.lastOwner.Store(int64(id))
		c.lastRel.Store(int64(time.Since(c.base)))
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if err := h.Release(rctx); err != nil {
			c.relErrs.add("Release", err)
		}
		cancel()
		t := time.Now()
		time.Sleep(pause)
		c.pauseSum.Add(int64(time.Since(t)))
		c.pauses.Add(1)
	}
}

// meanPause is how long the pauses after a release really took: the Go
// runtime sleeps at least about a millisecond when it has nothing else to
// run.
func (c *contention) meanPause() time.Duration {
	if n := c.pauses.Load(); n > 0 {
		return time.Duration(c.pauseSum.Load() / n)
	}
	return 0
}

func (c *contention) counts() []int64 {
	out := make([]int64, len(c.perWorker))
	for i := range c.perWorker {
		out[i] = c.perWorker[i].Load()
	}
	return out
}

func (c *contention) latencies() []time.Duration {
	var all []time.Duration
	for _, l := range c.lats {
		all = append(all, l...)
	}
	slices.Sort(all)
	return all
}

func (c *contention) errorCount() int64 {
	return c.giveUps.count() + c.relErrs.count() + c.violations.Load()
}

func (c *contention) note() string {
	var s string
	if v := c.violations.Load(); v > 0 {
		s += fmt.Sprintf("%d exclusion violations! ", v)
	}
	return s + c.giveUps.note() + c.relErrs.note()
}

func (r *runner) handoff(lib Library, shared bool) (sample, error) {
	w := r.cfg.HandoffWorkers
	nc := w
	if shared {
		nc = 1
	}
	cnt := &Counters{}
	ls, closeAll, err := r.clients(lib, nc, cnt, r.cfg.TTL)
	if err != nil {
		return sample{}, err
	}
	defer closeAll()
	c := newContention(w)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range w {
		wg.Add(1)
		go func() { defer wg.Done(); c.worker(ctx, i, ls[i%nc], "h", r.cfg.HandoffPause) }()
	}
	time.Sleep(r.cfg.HandoffWarmup)
	if err := r.begin(ctx, cnt); err != nil {
		cancel()
		wg.Wait()
		return sample{}, err
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	a0 := c.counts()
	c.recording.Store(true)
	cpu0 := processCPU()
	start := time.Now()
	time.Sleep(r.cfg.HandoffSlice)
	c.recording.Store(false)
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	a1 := c.counts()
	runtime.ReadMemStats(&m1)
	st, err := r.srv.Stats(ctx)
	reqs := cnt.Commands.Load()
	cancel()
	wg.Wait()
	if err != nil {
		return sample{}, err
	}
	var n, lo, hi int64 = 0, math.MaxInt64, 0
	for i := range a1 {
		d := a1[i] - a0[i]
		n += d
		lo, hi = min(lo, d), max(hi, d)
	}
	s := sample{errors: c.errorCount(), note: c.note()}
	if n == 0 {
		return s, errors.New("no acquisition in the slice")
	}
	lat := c.latencies()
	s.mix, s.ops = st.ByCommand, float64(n)
	s.values = map[string]float64{
		"acq_s":       float64(n) / elapsed.Seconds(),
		"wake_p50_us": us(percentile(lat, 0.50)),
		"wake_p99_us": us(percentile(lat, 0.99)),
		"cmds":        float64(st.Commands) / float64(n),
		"reqs":        float64(reqs) / float64(n),
		"cpu_us":      us(st.CPU) / float64(n),
		"ccpu_us":     us(cpu) / float64(n),
		"allocs":      float64(m1.Mallocs-m0.Mallocs) / float64(n),
		"pause_us":    us(c.meanPause()),
		"worker_min":  float64(lo),
		"worker_max":  float64(hi),
	}
	return s, nil
}

func (r *runner) manyWaiters(lib Library) (sample, error) {
	w, nc := r.cfg.ManyWaiters, r.cfg.ManyClients
	cnt := &Counters{}
	ls, closeAll, err := r.clients(lib, nc, cnt, r.cfg.TTL)
	if err != nil {
		return sample{}, err
	}
	defer closeAll()
	c := newContention(w)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range w {
		wg.Add(1)
		go func() { defer wg.Done(); c.worker(ctx, i, ls[i%nc], "m", r.cfg.HandoffPause) }()
	}
	finish := func() {
		cancel()
		wg.Wait()
	}
	// Warm-up: every waiter started and waiting, and a few handoffs done.
	limit := time.Now().Add(r.cfg.ManyMaxTime)
	time.Sleep(r.cfg.ManyWarmup)
	for c.total.Load() < 10 && time.Now().Before(limit) {
		time.Sleep(time.Millisecond)
	}
	if err := r.begin(ctx, cnt); err != nil {
		finish()
		return sample{}, err
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	n0 := c.total.Load()
	c.stopAt.Store(n0 + int64(r.cfg.ManyHandoffs))
	c.recording.Store(true)
	cpu0 := processCPU()
	start := time.Now()
	timer := time.NewTimer(r.cfg.ManyMaxTime)
	select {
	case <-c.stop:
	case <-timer.C: // the time bound: fewer handoffs measured
	}
	timer.Stop()
	c.recording.Store(false)
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	n := c.total.Load() - n0
	runtime.ReadMemStats(&m1)
	st, err := r.srv.Stats(ctx)
	reqs := cnt.Commands.Load()
	finish()
	if err != nil {
		return sample{}, err
	}
	s := sample{errors: c.errorCount(), note: c.note()}
	if n <= 0 {
		return s, errors.New("no handoff in the slice")
	}
	lat := c.latencies()
	s.mix, s.ops = st.ByCommand, float64(n)
	s.values = map[string]float64{
		"acq_s":       float64(n) / elapsed.Seconds(),
		"wake_p50_us": us(percentile(lat, 0.50)),
		"wake_p99_us": us(percentile(lat, 0.99)),
		"cmds":        float64(st.Commands) / float64(n),
		"reqs":        float64(reqs) / float64(n),
		"reads":       float64(st.Reads) / float64(n),
		"cpu_us":      us(st.CPU) / float64(n),
		"ccpu_us":     us(cpu) / float64(n),
		"allocs":      float64(m1.Mallocs-m0.Mallocs) / float64(n),
		"pause_us":    us(c.meanPause()),
		"n":           float64(n),
	}
	return s, nil
}

func (r *runner) autoRefresh(lib Library) (sample, error) {
	ctx := context.Background()
	cnt := &Counters{}
	ttl := r.cfg.RefreshTTL
	interval := ttl / 2
	ls, closeAll, err := r.clients(lib, 1, cnt, ttl)
	if err != nil {
		return sample{}, err
	}
	defer closeAll()
	lk := ls[0]
	probe, err := lk.TryLockAutoRefresh(ctx, "a:probe")
	if err != nil {
		return sample{}, err
	}
	_ = probe.Release(ctx)

	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	g0 := runtime.NumGoroutine()
	n := r.cfg.RefreshLocks
	held := make([]Held, n)
	var errs errTally
	parallelFor(16, n, func(i int) {
		h, err := lk.TryLockAutoRefresh(ctx, "a:"+strconv.Itoa(i))
		if err != nil {
			errs.add("TryLockAutoRefresh", err)
			return
		}
		held[i] = h
	})
	// Let the refreshes settle into their rhythm, then measure.
	time.Sleep(interval + interval/4)
	runtime.GC()
	runtime.ReadMemStats(&m1)
	g1 := runtime.NumGoroutine()
	if err := r.begin(ctx, cnt); err != nil {
		return sample{}, err
	}
	cpu0 := processCPU()
	start := time.Now()
	time.Sleep(time.Duration(r.cfg.RefreshIntervals) * interval)
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	st, err := r.srv.Stats(ctx)
	if err != nil {
		return sample{}, err
	}
	reqs, rtts := cnt.Commands.Load(), cnt.RoundTrips.Load()
	var lost errTally
	parallelFor(16, n, func(i int) {
		if held[i] != nil {
			if err := held[i].Release(ctx); err != nil {
				lost.add("Release (lock lost)", err)
			}
		}
	})
	intervals := elapsed.Seconds() / interval.Seconds()
	ok := n - int(errs.count())
	s := sample{errors: errs.count() + lost.count(), note: errs.note() + lost.note()}
	if ok == 0 {
		return s, errors.New("no lock obtained")
	}
	s.mix, s.ops = st.ByCommand, intervals*float64(ok)
	s.values = map[string]float64{
		"cpu_ms":        float64(st.CPU) / float64(time.Millisecond) / intervals,
		"ccpu_ms":       float64(cpu) / float64(time.Millisecond) / intervals,
		"reads":         float64(st.Reads) / intervals,
		"rtts":          float64(rtts) / intervals,
		"reqs":          float64(reqs) / intervals,
		"cmds":          float64(st.Commands) / intervals,
		"goroutines":    float64(g1-g0) / float64(ok),
		"heap":          float64(int64(m1.HeapAlloc+m1.StackInuse)-int64(m0.HeapAlloc+m0.StackInuse)) / float64(ok),
		"lost":          float64(lost.count()),
		"reqs_per_lock": float64(reqs) / intervals / float64(ok),
		"cmds_per_lock": float64(st.Commands) / intervals / float64(ok),
	}
	return s, nil
}

// parallelFor calls fn(0..n-1) from g goroutines.
func parallelFor(g, n int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// percentile returns the p-quantile of sorted ds (nearest rank).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(ds)))) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
