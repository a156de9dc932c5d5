package dlock_test

import (
	"context"
	"errors"
	"math"
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

// TestACallerLeavesAPipelineAtItsDeadline: on a server that stalls (CLIENT
// PAUSE), a caller whose call went out in a pipeline that another caller
// sent returns at its own deadline, as a call whose reply was lost,
// instead of waiting with the pipeline; the pipeline is sent by the caller
// of the latest deadline (here none), which gets its reply once the server
// answers again.
func TestACallerLeavesAPipelineAtItsDeadline(t *testing.T) {
	srv, c, awaitPipelines := onePipelineClient(t)
	srv.Do(t, "CLIENT", "PAUSE", "60000", "WRITE")
	defer srv.Do(t, "CLIENT", "UNPAUSE")
	tryLock := func(ctx context.Context, name string) <-chan error {
		got := make(chan error, 1)
		go func() {
			l, err := c.TryLock(ctx, name)
			if err == nil {
				err = l.Release(context.Background())
			}
			got <- err
		}()
		return got
	}
	ctx := context.Background()
	// The client's one pipeline is out, stalled, until this call's deadline.
	soon, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	first := tryLock(soon, "first")
	awaitPipelines(1, 0)
	// These two queue, and go out together once it returns: sent by the
	// one without a deadline, as the other's comes later than the first's.
	later, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	patient := tryLock(ctx, "patient")
	hurried := tryLock(later, "hurried")
	awaitPipelines(1, 2)

	select {
	case err := <-hurried:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the caller whose deadline came: %v, want context.DeadlineExceeded", err)
		}
	case err := <-patient:
		t.Fatalf("the caller without a deadline returned while the server stalled: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the caller whose deadline came waited for the stalled pipeline")
	}
	// Its deadline cut its request short: the driver's network timeout
	// matches it.
	if err := <-first; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the first caller: %v, want context.DeadlineExceeded", err)
	}
	srv.Do(t, "CLIENT", "UNPAUSE")
	if err := <-patient; err != nil {
		t.Errorf("the caller without a deadline, once the server answers: %v", err)
	}
}

// TestACancelledCallerLeavesThePipelineItSends: a caller whose context
// is cancelled while it sends a pipeline of queued calls (it had the
// latest deadline of them, or none) does not wait on for a stalled server
// once everyone in the pipeline has left: over a driver that ends a
// request at its context's cancellation (as rueidis does; here one whose
// server stalls until the context ends), it returns.
func TestACancelledCallerLeavesThePipelineItSends(t *testing.T) {
	e := newEnv(t)
	stalled := make(chan struct{})
	d := &hookDriver{Driver: e.newDriver(t), beforeCtx: func(ctx context.Context, calls []*dlock.Call) {
		if c := calls[0]; c.Script.Name == "acquire" && strings.HasPrefix(c.Keys[0], "dlock:{stalled") {
			select {
			case <-ctx.Done():
			case <-stalled:
			}
		}
	}}
	c := dlock.New(d, dlock.WithPipelines(1))
	defer c.Close()
	defer close(stalled) // before Close, which waits for the clean-ups
	ctx := context.Background()
	soon, cancelSoon := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelSoon()
	first := make(chan error, 1)
	go func() {
		_, err := c.TryLock(soon, "stalled")
		first <- err
	}()
	awaitCond(t, 5*time.Second, func() bool { i, _ := dlock.Pipelines(c); return i == 1 })
	patient, cancel := context.WithCancel(ctx)
	defer cancel()
	second := make(chan error, 1)
	go func() {
		_, err := c.TryLock(patient, "stalled:2")
		second <- err
	}()
	awaitCond(t, 5*time.Second, func() bool { _, q := dlock.Pipelines(c); return q == 1 })
	// The first leaves at its deadline, and the second sends its call.
	if err := <-first; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first: %v, want context.DeadlineExceeded", err)
	}
	cancel()
	select {
	case err := <-second:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the cancelled caller: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled caller waited on for the stalled server")
	}
}

// TestACallerThatSendsAPipelineUntilItsDeadlineSeesItsDeadline: the
// pipeline a caller sends for queued calls is given up when all of them
// have left, here at the caller's own deadline: its failure still matches
// context.DeadlineExceeded, not the cancellation that gave the pipeline up.
func TestACallerThatSendsAPipelineUntilItsDeadlineSeesItsDeadline(t *testing.T) {
	e := newEnv(t)
	entered := make(chan struct{}, 1)
	d := &hookDriver{Driver: e.newDriver(t), beforeCtx: func(ctx context.Context, calls []*dlock.Call) {
		if calls[0].Script.Name == "acquire" {
			if strings.Contains(calls[0].Keys[0], "first") {
				entered <- struct{}{}
			}
			<-ctx.Done() // a server that stalls, with a driver that ends the request at the context's end
		}
	}}
	c := dlock.New(d, dlock.WithPipelines(1))
	defer c.Close()
	ctx := context.Background()
	for i := range 5 {
		first, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = c.TryLock(first, "first")
		}()
		<-entered
		second, cancel2 := context.WithTimeout(ctx, 200*time.Millisecond)
		res := make(chan error, 1)
		go func() {
			_, err := c.TryLock(second, "second")
			res <- err
		}()
		// Queued behind the first (or gone at its deadline already), then
		// sent by itself once the first leaves.
		awaitCond(t, 5*time.Second, func() bool { _, q := dlock.Pipelines(c); return q == 1 || second.Err() != nil })
		cancel()
		if err := <-res; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("round %d: %v, want context.DeadlineExceeded", i, err)
		}
		<-done
		cancel2()
	}
}

// TestARefreshStaysInItsPipeline: a Refresh whose context ends while its
// call is in a pipeline that another caller sent waits for the pipeline
// (here, for the stalled server to answer) instead of leaving: its Lock's
// next refresh must not go out while it may still run, or it could run
// after that one and cut short the TTL the Lock counts on.
func TestARefreshStaysInItsPipeline(t *testing.T) {
	srv, c, awaitPipelines := onePipelineClient(t)
	ctx := context.Background()
	l, err := c.TryLock(ctx, "refreshed", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	srv.Do(t, "CLIENT", "PAUSE", "60000", "WRITE")
	defer srv.Do(t, "CLIENT", "UNPAUSE")
	soon, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	first := make(chan error, 1)
	go func() { _, err := c.TryLock(soon, "first"); first <- err }()
	awaitPipelines(1, 0)
	// Queued behind it: a TryLock without a deadline, which sends the
	// batch, and the Refresh, whose deadline comes while the batch stalls.
	patient := make(chan error, 1)
	go func() { _, err := c.TryLock(ctx, "patient"); patient <- err }()
	awaitPipelines(1, 1)
	later, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	refreshed := make(chan error, 1)
	go func() { refreshed <- l.Refresh(later, 2*time.Minute) }()
	awaitPipelines(1, 2)
	<-first
	<-later.Done()
	srv.Do(t, "CLIENT", "UNPAUSE")
	if err := <-refreshed; err != nil {
		t.Errorf("the Refresh whose deadline came in its pipeline: %v, want the reply of its pipeline", err)
	}
	if err := <-patient; err != nil {
		t.Errorf("the caller that sent the pipeline: %v", err)
	}
	if left := time.Until(l.Deadline()); left <= time.Minute {
		t.Errorf("Deadline in %v, want the refresh's 2m", left)
	}
}

// onePipelineClient starts a server and returns it, with a client of one
// pipeline (WithPipelines(1)) over go-redis with no read timeout but its
// callers' deadlines, and a function that waits until the client has
// inflight pipelines out and queued calls waiting for one.
func onePipelineClient(t *testing.T) (*redistest.Server, *dlock.Client, func(inflight, queued int)) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true, ReadTimeout: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb), dlock.WithPipelines(1))
	t.Cleanup(func() { _ = c.Close() })
	return srv, c, func(inflight, queued int) {
		t.Helper()
		awaitCond(t, 5*time.Second, func() bool { i, q := dlock.Pipelines(c); return i == inflight && q == queued })
	}
}

// The most pipelines a client may be given leaves room for the releases'
// own: a release is sent at once, not queued behind none.
func TestAnyNumberOfPipelinesSendsReleases(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := e.newClient(t, dlock.WithPipelines(math.MaxInt))
	l, err := c.TryLock(ctx, "many-pipelines", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if e.locked(t, "dlock:{many-pipelines}") {
		t.Error("the lock is still held")
	}
}

// TestGiveBacksPassStalledPipelines: with every pipeline slot taken by a
// request the server does not answer (here an acquire the driver holds
// back) and another request queued behind it, Releases, one after the
// other, still go out at once, on slots of their own, which the queued
// request does not take over: they must not wait behind the stalled
// requests until their own bound runs out, leaving the names taken. (The
// clean-up after an acquire given up runs the release script: the same
// slots.)
func TestGiveBacksPassStalledPipelines(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	stall := make(chan struct{})
	var holding atomic.Bool
	d := &hookDriver{Driver: e.newDriver(t), before: func(calls []*dlock.Call) {
		if c := calls[0]; holding.Load() && c.Script.Name == "acquire" && c.Keys[0] == "dlock:{stalled}" {
			<-stall
		}
	}}
	c := dlock.New(d, dlock.WithPipelines(1))
	defer c.Close()
	var held []*dlock.Lock
	for _, name := range []string{"held1", "held2"} {
		l, err := c.TryLock(ctx, name, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	holding.Store(true)
	done := make(chan error, 2)
	go func() { _, err := c.TryLock(ctx, "stalled"); done <- err }()
	awaitCond(t, 5*time.Second, func() bool { n, _ := dlock.Pipelines(c); return n == 1 })
	go func() { _, err := c.TryLock(ctx, "stalled"); done <- err }()
	awaitCond(t, 5*time.Second, func() bool { _, n := dlock.Pipelines(c); return n == 1 })
	for _, l := range held {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := l.Release(rctx); err != nil {
			t.Errorf("Release of %s behind stalled pipelines: %v", l.Name(), err)
		}
		cancel()
		if e.locked(t, "dlock:{"+l.Name()+"}") {
			t.Errorf("%s, released behind stalled pipelines, is still held", l.Name())
		}
	}
	close(stall)
	for range 2 {
		if err := <-done; err != nil && !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatal(err)
		}
	}
}

// partsDriver is a Partitioned Replicator over one server that tells the
// text of a key's name up to its first ':' for the address of the key's
// server, so that a test has as many lanes as it likes. Once hold is set,
// it holds up the calls on names that start with "held" until release is
// closed, and says so on entered.
type partsDriver struct {
	dlock.Driver
	hold     atomic.Bool
	entered  chan struct{}
	release  chan struct{}
	released sync.Once
}

func newPartsDriver(d dlock.Driver) *partsDriver {
	return &partsDriver{Driver: d, entered: make(chan struct{}, 16), release: make(chan struct{})}
}

func (d *partsDriver) Partitioned() bool { return true }

func (d *partsDriver) Server(_ context.Context, key string) string {
	name := strings.TrimPrefix(key, "dlock:{")
	server, _, _ := strings.Cut(name, ":")
	return server
}

func (d *partsDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if d.hold.Load() && strings.HasPrefix(calls[0].Keys[0], "dlock:{held") {
		d.entered <- struct{}{}
		<-d.release
	}
	d.Driver.Eval(ctx, calls...)
}

func (d *partsDriver) EvalWait(ctx context.Context, replicas int, _ time.Duration, calls ...*dlock.Call) (int, error) {
	d.Eval(ctx, calls...)
	return replicas, nil
}

// let lets the calls held up through, once however often it is called.
func (d *partsDriver) let() { d.released.Do(func() { close(d.release) }) }

// TestIdleLanesAreDropped: a client over a Partitioned driver keeps a
// lane (a batcher) for each server its calls went to, and one for each
// server and WithReplicas setting of its lone calls confirmed on
// replicas. They were kept for good, one more after each failover or
// change of nodes. Now those that nobody used since the last time the
// lanes were pruned are dropped: a new lane prunes them, once their idle
// time (laneIdle) has passed since the last time.
func TestIdleLanesAreDropped(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := dlock.New(newPartsDriver(e.newDriver(t)))
	t.Cleanup(func() { _ = c.Close() })
	dlock.SetLaneIdle(c, time.Hour)
	use := func(server string, opts ...dlock.Option) {
		t.Helper()
		l, err := c.TryLock(ctx, server+":name", opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, server := range []string{"a", "b", "c", "d"} {
		use(server)
		use(server, dlock.WithReplicas(1, time.Second))
	}
	if n := dlock.Lanes(c); n != 8 {
		t.Fatalf("%d lanes after calls to 4 servers, with and without WithReplicas; want 8", n)
	}
	// Used since the last time (none yet): kept.
	dlock.PruneLanes(c)
	if n := dlock.Lanes(c); n != 8 {
		t.Fatalf("%d lanes after a first pruning; want the 8 used since", n)
	}
	use("a")
	dlock.PruneLanes(c)
	if n := dlock.Lanes(c); n != 1 {
		t.Fatalf("%d lanes after a second pruning; want the one used since the first", n)
	}
	// A new lane prunes the others once their idle time has passed.
	dlock.PruneLanes(c) // none used since: a goes too
	use("b")
	use("c") // within the hour: a new lane prunes none
	if n := dlock.Lanes(c); n != 2 {
		t.Fatalf("%d lanes; want b and c", n)
	}
	dlock.SetLaneIdle(c, 0)
	use("d") // a pass that marks b and c as idle
	use("e") // one that drops them, d used since
	if n := dlock.Lanes(c); n != 2 {
		t.Fatalf("%d lanes after two new ones with no idle time; want d and e", n)
	}
}

// TestACallRacingALanePruneStillWorks: a lane that a call is under way in
// is not dropped, however often the lanes are pruned meanwhile: the next
// call to its server queues behind it in the same lane (one pipeline,
// WithPipelines(1)), instead of going out at once through a new one. And
// calls on many servers, with the lanes pruned all along, all go through.
func TestACallRacingALanePruneStillWorks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := newPartsDriver(e.newDriver(t))
	c := dlock.New(d, dlock.WithPipelines(1))
	t.Cleanup(func() { _ = c.Close() })
	defer d.let()
	d.hold.Store(true)
	got := make(chan error, 2)
	tryLock := func(name string) {
		l, err := c.TryLock(ctx, name)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}
	go tryLock("held:1")
	<-d.entered
	for range 3 {
		dlock.PruneLanes(c)
	}
	go tryLock("held:2")
	awaitCond(t, 5*time.Second, func() bool {
		inflight, queued, ok := dlock.LanePipelines(c, "held")
		return ok && inflight == 1 && queued == 1
	})
	d.hold.Store(false)
	d.let()
	for range 2 {
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	}

	const workers, rounds, servers = 8, 50, 12
	stop := make(chan struct{})
	pruned := make(chan struct{})
	dlock.SetLaneIdle(c, 0) // every new lane prunes too
	go func() {
		defer close(pruned)
		for {
			select {
			case <-stop:
				return
			default:
				dlock.PruneLanes(c)
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				name := "s" + strconv.Itoa((w+r)%servers) + ":" + strconv.Itoa(w)
				opts := []dlock.Option{}
				if r%2 == 1 {
					opts = append(opts, dlock.WithReplicas(1, time.Second))
				}
				l, err := c.TryLock(ctx, name, opts...)
				if err == nil {
					err = l.Release(ctx)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-pruned
}
