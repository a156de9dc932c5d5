package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// AutoRefresh called again with a max hold shorter than what the watchdog
// has already given the lock: the watchdog's earlier full refreshes put
// the deadline past the new max hold, and its next refresh asks for what
// is left of the max hold, so that the lock runs out at it (a deadline
// past the max hold is left to run out only when a Refresh by hand set it).
func TestAShorterMaxHoldByAutoRefreshEndsTheLockAtIt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const ttl, every = time.Second, 300 * time.Millisecond
	l, err := e.c.TryLock(ctx, "shorter-cap", dlock.WithTTL(ttl), dlock.WithRefreshInterval(every))
	if err != nil {
		t.Fatal(err)
	}
	obtained := time.Now() // the max hold counts from before this
	defer l.Release(ctx)
	// After the watchdog's first refresh, at 300ms: it set the deadline to
	// about 1.29s, past the new max hold.
	first := l.Deadline()
	awaitCond(t, 5*time.Second, func() bool { return l.Deadline().After(first) })
	if err := l.AutoRefresh(dlock.WithRefreshInterval(every), dlock.WithMaxHold(ttl)); err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 5*time.Second)
	if !errors.Is(l.Err(), dlock.ErrMaxHold) {
		t.Errorf("Err = %v, want ErrMaxHold", l.Err())
	}
	if over := l.Deadline().Sub(obtained.Add(ttl)); over > 0 {
		t.Errorf("the lock ran out %v after its max hold", over)
	}
}

// ctxDeadlineDriver answers nothing to the watchdog's refreshes once armed: each
// waits for its context, as a stalled server does on a client that honours
// the context (ContextTimeoutEnabled). It records how long that context
// lets the refresh wait past the lock's deadline.
type ctxDeadlineDriver struct {
	*tapDriver
	mu    sync.Mutex
	lock  *dlock.Lock
	past  time.Duration
	saw   chan struct{}
	armed bool
}

func (d *ctxDeadlineDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	d.mu.Lock()
	armed, l := d.armed, d.lock
	if armed && calls[0].Script.Name == "refresh" {
		d.armed = false
		if dl, ok := ctx.Deadline(); ok {
			d.past = dl.Sub(l.Deadline())
		}
		d.mu.Unlock()
		close(d.saw)
		for _, c := range calls {
			c.Err = context.DeadlineExceeded
		}
		return
	}
	d.mu.Unlock()
	d.tapDriver.Eval(ctx, calls...)
}

// The watchdog bounds a refresh's wait by the lease's deadline as it was
// before unsure moved it: a lock attached with a shorter TTL than it has
// on the server has its deadline brought to the refresh's TTL, but the
// refresh may wait (holding up the watchdog's goroutine, and every other
// lease's refresh) until the old, later one.
func TestAWatchdogRefreshWaitsNoLongerThanTheDeadlineItSets(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "attached-long", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	d := &ctxDeadlineDriver{tapDriver: e.newDriver(t), saw: make(chan struct{})}
	c := dlock.New(d)
	defer c.Close()
	l, err := c.Attach(ctx, "attached-long", held.Token(), dlock.WithTTL(time.Second), dlock.WithRefreshInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	d.lock, d.armed = l, true
	d.mu.Unlock()
	select {
	case <-d.saw:
	case <-time.After(3 * time.Second):
		t.Fatal("no refresh")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.past > 10*time.Millisecond {
		t.Errorf("the refresh may wait %v past the lease's deadline", d.past)
	}
}

// An attached lock with a max hold, whose server TTL (its first holder's)
// runs past it: the watchdog's first refresh falls within a TTL of the max
// hold, and nextRefresh lets the lock go to run out at the server's TTL,
// far past the max hold.
func TestAnAttachedLockRunsOutAtItsMaxHold(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "attached-cap", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	c := e.newClient(t)
	before := time.Now()
	l, err := c.Attach(ctx, "attached-cap", held.Token(), dlock.WithTTL(time.Second),
		dlock.WithRefreshInterval(100*time.Millisecond), dlock.WithMaxHold(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	awaitCond(t, 3*time.Second, func() bool { return dlock.LeaseDropped(l) })
	if over := l.Deadline().Sub(before.Add(time.Second)); over > 500*time.Millisecond {
		t.Errorf("max hold 1s from the attach, but the lock runs out %v after it", over)
	}
}

// farDriver holds every reply back for delay once set, as a server a
// round trip of delay away does: the call has run by then. A call whose
// context ends first fails with its error, its reply lost.
type farDriver struct {
	*tapDriver
	delay     atomic.Int64 // a time.Duration
	refreshed atomic.Int64 // refreshes answered after their delay
}

func (d *farDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	d.tapDriver.Eval(ctx, calls...)
	delay := time.Duration(d.delay.Load())
	if delay <= 0 {
		return
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		for _, c := range calls {
			if c.Script.Name == "refresh" && c.Err == nil {
				d.refreshed.Add(1)
			}
		}
	case <-ctx.Done():
		for _, c := range calls {
			c.Val, c.Err = nil, ctx.Err()
		}
	}
}

// A client holding more locks than one pipeline takes (1,000), on a server
// whose replies take a quarter of the TTL: each refresh comes back well
// within its lock's deadline (sent a third of the TTL after the last), so
// every lock stays held. The watchdog used to send the pipelines of one
// pass one after the other, each waiting for the one before: the third
// came back after its locks' deadlines, the next passes later still, and
// all 2,500 locks were lost though the server was up and answering.
func TestTheWatchdogsPipelinesDoNotWaitForEachOther(t *testing.T) {
	e := newEnv(t)
	d := &farDriver{tapDriver: e.newDriver(t)}
	c := dlock.New(d)
	defer c.Close()
	ctx := context.Background()
	const n = 2500
	locks := make([]*dlock.Lock, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range 25 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 25 {
				l, err := c.TryLock(ctx, fmt.Sprintf("many:%d", i), dlock.WithTTL(2*time.Second), dlock.WithAutoRefresh())
				if err != nil {
					errs <- err
					return
				}
				locks[i] = l
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Two TTLs of late replies (each lock refreshed six times, a third of
	// its TTL apart), or a lock lost meanwhile.
	d.delay.Store(int64(500 * time.Millisecond))
	awaitCond(t, 30*time.Second, func() bool {
		if d.refreshed.Load() >= 6*n {
			return true
		}
		for _, l := range locks {
			if l.Err() != nil {
				return true
			}
		}
		return false
	})
	d.delay.Store(0)
	lost := 0
	for _, l := range locks {
		select {
		case <-l.Done():
			if lost++; lost == 1 {
				t.Errorf("lost with replies 500ms late: %v", l.Err())
			}
		default:
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d locks lost", lost, n)
	}
}

// lockMany takes n locks of c, named prefix:0 to prefix:n-1, with opts,
// from 25 goroutines.
func lockMany(t *testing.T, c *dlock.Client, prefix string, n int, opts ...dlock.Option) []*dlock.Lock {
	t.Helper()
	locks := make([]*dlock.Lock, n)
	errs := make([]error, 25)
	var wg sync.WaitGroup
	for w := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n && errs[w] == nil; i += len(errs) {
				locks[i], errs[w] = c.TryLock(context.Background(), fmt.Sprintf("%s:%d", prefix, i), opts...)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return locks
}

// evalshaCalls returns how many EVALSHA commands srv has run.
func evalshaCalls(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	stats := srv.Do(t, "INFO", "commandstats")
	_, rest, ok := strings.Cut(stats, "cmdstat_evalsha:calls=")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// pipelineDriver counts the requests of refreshes under way, a pipeline
// once, and the refreshes that succeeded; sending, when set before the
// client is used, is called with each pipeline of refreshes as it goes.
type pipelineDriver struct {
	*goredis.Driver
	pipelines atomic.Int64
	refreshed atomic.Int64
	sending   func(calls []*dlock.Call)
}

func (d *pipelineDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if calls[0].Script.Name != "refresh" {
		d.Driver.Eval(ctx, calls...)
		return
	}
	if d.sending != nil {
		d.sending(calls)
	}
	d.pipelines.Add(1)
	defer d.pipelines.Add(-1)
	d.Driver.Eval(ctx, calls...)
	for _, c := range calls {
		if c.Err == nil {
			d.refreshed.Add(1)
		}
	}
}

// A client over a go-redis pool of three connections, holding more locks
// than two of the watchdog's pipelines take (1,000 each), on a server
// whose replies are slow (here held until the test lets them go): the
// watchdog sent every pipeline of its pass at once, which took all three
// connections for as long as the replies took, and a Release made then
// waited for the pass, its request not even sent. The watchdog now keeps
// two connections of the pool (a quarter, and two at least) for other
// calls: the Release reaches the server while the refreshes' replies are
// still held.
func TestTheWatchdogLeavesConnectionsOfASmallPoolToOtherCalls(t *testing.T) {
	srv := redistest.Start(t)
	px := redistest.StartDelayProxy(t, srv.Addr())
	// No read timeout: a request waits for its reply however long the
	// proxy holds it, and for a connection as long.
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), PoolSize: 3, ReadTimeout: -1, PoolTimeout: time.Minute, MaxRetries: -1})
	defer rdb.Close()
	d := &pipelineDriver{Driver: goredis.New(rdb)}
	c := dlock.New(d)
	defer c.Close()
	ctx := context.Background()
	probe, err := c.TryLock(ctx, "probe", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// Every lock falls due while the watchdog is paused, so that one pass
	// refreshes them all: three pipelines.
	resume := sync.OnceFunc(dlock.PauseWatchdog(c))
	defer resume()
	const n = 2001
	locks := lockMany(t, c, "many", n, dlock.WithTTL(time.Minute), dlock.WithRefreshInterval(time.Second), dlock.WithAutoRefresh())
	awaitCond(t, 10*time.Second, func() bool {
		next, _ := dlock.NextRefresh(c, locks[n-1])
		return time.Now().After(next)
	})
	// The server knows the scripts (EVALSHA runs them at the first
	// round trip), and the three connections are open, idle.
	if err := locks[0].Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if l, err := c.TryLock(ctx, "warm"); err != nil {
		t.Fatal(err)
	} else if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var warm sync.WaitGroup
	for range 3 {
		warm.Add(1)
		go func() {
			defer warm.Done()
			rdb.Do(ctx, "BLPOP", "nothing", "0.05")
		}()
	}
	warm.Wait()
	ran := evalshaCalls(t, srv)
	px.SetDelay(time.Hour)
	defer px.SetDelay(0)
	resume()
	// The pass is under way: a pipeline ran on the server, and each
	// request of refreshes sent has its connection.
	awaitCond(t, 10*time.Second, func() bool {
		st := rdb.PoolStats()
		p := d.pipelines.Load()
		return evalshaCalls(t, srv) >= ran+1000 && p > 0 && int64(st.TotalConns-st.IdleConns) == p
	})
	released := make(chan error, 1)
	go func() { released <- probe.Release(ctx) }()
	defer func() {
		px.SetDelay(0)
		if err := <-released; err != nil {
			t.Errorf("Release: %v", err)
		}
	}()
	awaitCond(t, 10*time.Second, func() bool {
		tok := srv.Do(t, "HGET", c.RedisKey("probe"), "token")
		return tok == "" || tok == "(nil)"
	})
	if p := d.pipelines.Load(); p == 0 {
		t.Error("the refreshes' replies came before the Release ran")
	}
}

// The watchdog's share of a go-redis pool holds its pipelines back only
// while it has that many out (all but a quarter of the pool, and two
// connections), and never past the time they must go to be answered
// before their locks' deadlines: with replies a quarter of the TTL late,
// a client whose pool leaves it one pipeline at a time (3 connections)
// keeps every lock, though the three pipelines of its passes, one after
// the other, would take longer than the locks have; one whose pool is
// large (100) holds nothing back.
func TestTheWatchdogsShareOfThePoolLosesNoLock(t *testing.T) {
	for _, tc := range []struct {
		pool int
		held bool
	}{{3, true}, {100, false}} {
		t.Run(fmt.Sprintf("pool %d", tc.pool), func(t *testing.T) {
			// Mostly waits for the delayed replies: apart from the
			// other's, as they take their time.
			t.Parallel()
			// Every lock falls due while the watchdog is paused, so that
			// its passes refresh them all: three pipelines each, which
			// the pool (3) takes at once. Refreshed every 4s, each lock
			// has at least 6s left then (8s, less the time taken to lock
			// them all), its pipeline's reply 3s away.
			const n = 2001
			const ttl = 12 * time.Second
			s := dueBehindADelay(t, tc.pool, n, ttl, dlock.WithAutoRefresh())
			c := s.c
			// Each lock refreshed twice with late replies, or one lost.
			lost, first := s.refreshLate(t, ttl/4, 2, 40*time.Second)
			if first != nil {
				t.Errorf("lost with replies %v late: %v", ttl/4, first)
			}
			if lost > 0 {
				t.Errorf("%d of %d locks lost", lost, n)
			}
			if held := dlock.HeldBack(c); held > 0 != tc.held {
				t.Errorf("%d pipelines held back with a pool of %d", held, tc.pool)
			}
		})
	}
}

// The watchdog puts the locks of a pipeline of refreshes back in its
// schedule together, once it has read every reply of the pipeline. Each
// one put back as its reply was read woke the watchdog when it was due
// first, and the next pass took those put back so far: with replies later
// than the refresh interval (each lock due again at once), the locks of
// one pipeline went out again in several, more at each round (20,000
// locks, replies 1.2s late on a 3s TTL: from 25 pipelines out at once to
// 100 in 15s), until they took every connection of the client's pool and
// locks were lost.
func TestTheLocksOfAPipelineGoBackTogether(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var c atomic.Pointer[dlock.Client]
	var a atomic.Pointer[dlock.Lock]
	back := make(chan bool, 1)
	c.Store(e.newClient(t, dlock.WithHooks(dlock.Hooks{
		Refresh: func(_ context.Context, h dlock.HookInfo, err error) {
			if h.Names[0] != "together:b" || err != nil {
				return
			}
			// No pass starts meanwhile.
			resume := dlock.PauseWatchdog(c.Load())
			_, ok := dlock.NextRefresh(c.Load(), a.Load())
			resume()
			select {
			case back <- ok:
			default:
			}
		},
	})))
	// Refreshed in one pass, a's reply read first: both fall due while
	// the watchdog is paused, however long the second acquire takes.
	resume := sync.OnceFunc(dlock.PauseWatchdog(c.Load()))
	defer resume()
	var b *dlock.Lock
	for _, name := range []string{"together:a", "together:b"} {
		l, err := c.Load().TryLock(ctx, name, dlock.WithTTL(3*time.Second), dlock.WithAutoRefresh())
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		if a.Load() == nil {
			a.Store(l)
		}
		b = l
	}
	awaitCond(t, 10*time.Second, func() bool {
		next, _ := dlock.NextRefresh(c.Load(), b)
		return time.Now().After(next)
	})
	resume()
	select {
	case ok := <-back:
		if ok {
			t.Error("a lock was put back in the watchdog's schedule before the reply of the next lock of its pipeline was read")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no refresh")
	}
}

// A pipeline of refreshes counts against the watchdog's share of the pool
// while its request has a connection, not while the Refresh hooks of its
// locks run once the replies are read: a hook that takes its time held the
// next pipeline back, with the pool's connections idle, until the time the
// next had to go regardless (a third of the way to its locks' deadlines),
// and counted as a round trip of the server.
func TestAPipelineHeldBackGoesWhenTheOneBeforeHasItsReplies(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 3, MaxRetries: -1})
	defer rdb.Close()
	d := &pipelineDriver{Driver: goredis.New(rdb)}
	hooked := make(chan struct{})
	var once sync.Once
	c := dlock.New(d, dlock.WithHooks(dlock.Hooks{
		Refresh: func(context.Context, dlock.HookInfo, error) {
			// The first hook of a pass waits until the test ends.
			once.Do(func() { <-hooked })
		},
	}))
	defer c.Close()
	defer close(hooked)
	resume := sync.OnceFunc(dlock.PauseWatchdog(c))
	defer resume()
	// Three pipelines, one at a time (a pool of 3); a third of the way to
	// the locks' deadlines is some 19s away.
	const n = 2001
	locks := lockMany(t, c, "hooked", n, dlock.WithTTL(time.Minute), dlock.WithRefreshInterval(time.Second), dlock.WithAutoRefresh())
	awaitCond(t, 10*time.Second, func() bool {
		next, _ := dlock.NextRefresh(c, locks[n-1])
		return time.Now().After(next)
	})
	refreshed := d.refreshed.Load()
	resume()
	awaitCond(t, 5*time.Second, func() bool { return d.refreshed.Load() >= refreshed+n })
}

// A client whose pool leaves the watchdog one pipeline at a time (3
// connections), its locks refreshed every second on a 6s TTL (some 5s
// left at a refresh), on a server whose replies become 3.5s late at once:
// sent at once, its three pipelines' replies all came in time. Held back
// a third of the way to their deadlines (no round trip that slow seen
// yet), the second and third pipelines' replies came after their locks'
// deadlines, and the locks were lost; a pipeline is held back a tenth of
// the time its locks have left at most.
func TestAHeldBackPipelineIsAnsweredAsItWouldBeUnheld(t *testing.T) {
	const n = 2001
	s := dueBehindADelay(t, 3, n, 6*time.Second, dlock.WithRefreshInterval(time.Second), dlock.WithAutoRefresh())
	lost, _ := s.refreshLate(t, 3500*time.Millisecond, 1, 20*time.Second)
	if lost > 0 {
		t.Errorf("%d of %d locks lost", lost, n)
	}
}

// dueLocks is a client over a go-redis pool, behind a DelayProxy, whose n
// locks have all fallen due while its watchdog is paused.
type dueLocks struct {
	px     *redistest.DelayProxy
	d      *pipelineDriver
	c      *dlock.Client
	locks  []*dlock.Lock
	resume func()
}

// dueBehindADelay returns a client over a go-redis pool of pool
// connections (a read timeout past any delay: the refreshes' contexts
// bound their waits), on a server behind a DelayProxy, holding n locks
// taken with a TTL of ttl and opts, all due for a refresh while its
// watchdog is paused.
func dueBehindADelay(t *testing.T, pool, n int, ttl time.Duration, opts ...dlock.Option) *dueLocks {
	srv := redistest.Start(t)
	px := redistest.StartDelayProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), PoolSize: pool, ContextTimeoutEnabled: true, ReadTimeout: time.Minute, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	d := &pipelineDriver{Driver: goredis.New(rdb)}
	c := dlock.New(d)
	t.Cleanup(func() { _ = c.Close() })
	resume := sync.OnceFunc(dlock.PauseWatchdog(c))
	t.Cleanup(resume)
	locks := lockMany(t, c, "many", n, append(opts, dlock.WithTTL(ttl))...)
	if err := locks[0].Refresh(context.Background(), ttl); err != nil { // the server knows the script
		t.Fatal(err)
	}
	awaitCond(t, 10*time.Second, func() bool {
		next, _ := dlock.NextRefresh(c, locks[n-1])
		return time.Now().After(next)
	})
	return &dueLocks{px: px, d: d, c: c, locks: locks, resume: resume}
}

// refreshLate has the replies come delay late and resumes the watchdog,
// until every lock was refreshed times more, or one was lost, within
// timeout: it returns how many were lost, and the first one's error.
func (s *dueLocks) refreshLate(t *testing.T, delay time.Duration, times int, timeout time.Duration) (lost int, first error) {
	s.px.SetDelay(delay)
	t.Cleanup(func() { s.px.SetDelay(0) })
	refreshed := s.d.refreshed.Load()
	s.resume()
	awaitCond(t, timeout, func() bool {
		if s.d.refreshed.Load() >= refreshed+int64(times*len(s.locks)) {
			return true
		}
		for _, l := range s.locks {
			if l.Err() != nil {
				return true
			}
		}
		return false
	})
	for _, l := range s.locks {
		if err := l.Err(); err != nil {
			if lost++; lost == 1 {
				first = err
			}
		}
	}
	return lost, first
}

// A client over a go-redis pool that leaves the watchdog one pipeline at a
// time (3 connections), with three thousand locks, all due in one pass:
// taken first, refreshed first (their refreshes were due first), those
// with the longest TTL; last, those with the shortest. The pass cut its
// leases into pipelines of 1,000 in the order they were due, and its
// pipelines took the share in whatever order their goroutines ran: the
// locks nearest their deadlines went last, held back behind those with
// the most time left. A pass now sends its pipelines in the order of
// their locks' deadlines.
func TestAPassSendsItsPipelinesInTheOrderOfTheirDeadlines(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 3, MaxRetries: -1})
	defer rdb.Close()
	tiers := []struct {
		name string
		ttl  time.Duration
	}{{"late", time.Minute}, {"mid", 40 * time.Second}, {"soon", 20 * time.Second}}
	var mu sync.Mutex
	var order []string // the tier of each pipeline sent, in order
	d := &pipelineDriver{Driver: goredis.New(rdb)}
	d.sending = func(calls []*dlock.Call) {
		tier := "mixed"
		for _, tr := range tiers {
			if strings.Contains(calls[0].Keys[0], tr.name+":") && strings.Contains(calls[len(calls)-1].Keys[0], tr.name+":") {
				tier = tr.name
			}
		}
		mu.Lock()
		defer mu.Unlock()
		order = append(order, tier)
	}
	c := dlock.New(d)
	defer c.Close()
	resume := sync.OnceFunc(dlock.PauseWatchdog(c))
	defer resume()
	var all []*dlock.Lock
	for _, tr := range tiers {
		all = append(all, lockMany(t, c, tr.name, 1000, dlock.WithTTL(tr.ttl), dlock.WithRefreshInterval(time.Second), dlock.WithAutoRefresh())...)
	}
	// Every lock due, so that the pass takes them all: lockMany takes them
	// on 25 goroutines, the last in no particular order.
	var due time.Time
	for _, l := range all {
		next, _ := dlock.NextRefresh(c, l)
		if next.After(due) {
			due = next
		}
	}
	awaitCond(t, 10*time.Second, func() bool { return time.Now().After(due) })
	resume()
	awaitCond(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) >= len(tiers)
	})
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"soon", "mid", "late"}; !slices.Equal(order[:len(tiers)], want) {
		t.Errorf("pipelines sent in the order %v, want %v (nearest deadline first)", order[:len(tiers)], want)
	}
}

// A client whose pool leaves the watchdog one pipeline at a time (3
// connections), its locks refreshed every second on a 10s TTL (some 9s
// left at a refresh), whose refreshes have come back at once so far, on a
// server whose replies become 8.4s late at once: sent at once, its three
// pipelines' replies all come in time. Held back a tenth of the time
// their locks had left (no round trip that slow seen yet), while the one
// pipeline out took far longer than any round trip seen, the second and
// third pipelines' replies came after their locks' deadlines, and the
// locks were lost. A pipeline held back now goes once the oldest out has
// been out for two of the longest recent round trips: the server has
// slowed down.
func TestAHeldBackPipelineGoesWhenTheServerSlowsDown(t *testing.T) {
	// Mostly waits for the delayed replies.
	t.Parallel()
	const n = 2001
	s := dueBehindADelay(t, 3, n, 10*time.Second, dlock.WithRefreshInterval(time.Second), dlock.WithAutoRefresh())
	// A pass with quick replies: the watchdog has seen its round trips.
	refreshed := s.d.refreshed.Load()
	s.resume()
	awaitCond(t, 10*time.Second, func() bool { return s.d.refreshed.Load() >= refreshed+n })
	s.resume = sync.OnceFunc(dlock.PauseWatchdog(s.c))
	t.Cleanup(s.resume)
	// Every lock back in the watchdog's schedule, and due again.
	var last time.Time
	awaitCond(t, 10*time.Second, func() bool {
		for _, l := range s.locks {
			next, ok := dlock.NextRefresh(s.c, l)
			if !ok {
				return false
			}
			if next.After(last) {
				last = next
			}
		}
		return true
	})
	awaitCond(t, 10*time.Second, func() bool { return time.Now().After(last) })
	held := dlock.HeldBack(s.c)
	lost, first := s.refreshLate(t, 8400*time.Millisecond, 1, 20*time.Second)
	if first != nil {
		t.Errorf("lost with replies 8.4s late: %v", first)
	}
	if lost > 0 {
		t.Errorf("%d of %d locks lost", lost, n)
	}
	if dlock.HeldBack(s.c) == held {
		t.Error("no pipeline held back: the pass never filled the watchdog's share")
	}
}

// TestAutoRefreshingManyNamesKeepsNoState: a client whose locks on one
// name after another are refreshed automatically until released, or until
// a refresh finds them gone, keeps nothing in memory for them: its
// watchdog lets each lease go.
func TestAutoRefreshingManyNamesKeepsNoState(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	t.Run("released", func(t *testing.T) {
		keepsNoStateByName(t, "released", func(name string) error {
			l, err := e.c.TryLock(ctx, name, dlock.WithTTL(time.Minute), dlock.WithAutoRefresh())
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}, e.c)
	})
	t.Run("lost", func(t *testing.T) {
		keepsNoStateByName(t, "lost", func(name string) error {
			l, err := e.c.TryLock(ctx, name, dlock.WithTTL(time.Minute), dlock.WithRefreshInterval(time.Millisecond))
			if err != nil {
				return err
			}
			if err := rdb.Del(ctx, e.c.RedisKey(name)).Err(); err != nil {
				return err
			}
			select {
			case <-l.Done():
			case <-time.After(time.Minute):
				return errors.New("a lock whose key was deleted was not found lost")
			}
			if !errors.Is(l.Err(), dlock.ErrLost) {
				return fmt.Errorf("a lock whose key was deleted ended with %v", l.Err())
			}
			return nil
		}, e.c)
	})
}
