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

// newClusterClient returns a dlock client over a go-redis cluster client of
// its own, as another process would have; both are closed with the test.
func newClusterClient(t testing.TB, c *redistest.Cluster) *dlock.Client {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	dc := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = dc.Close() })
	return dc
}

// namesOn returns n lock names of dc, each in a slot of its own, whose keys
// primary serves.
func namesOn(t *testing.T, c *redistest.Cluster, dc *dlock.Client, primary *redistest.Server, n int) []string {
	t.Helper()
	var names []string
	slots := map[string]bool{}
	for i := 0; len(names) < n; i++ {
		if i == 1000 {
			t.Fatalf("only %d of 1000 names sit on %s", len(names), primary.Addr())
		}
		name := "n" + strconv.Itoa(i)
		key := dc.RedisKey(name)
		slot := primary.Do(t, "CLUSTER", "KEYSLOT", key)
		if !slots[slot] && c.PrimaryOf(t, key) == primary {
			slots[slot] = true
			names = append(names, name)
		}
	}
	return names
}

// holders is an in-process record of who holds which lock. A holder that
// comes in while another's lock has not reached its deadline is an
// overlap; each name's fences must grow from one holder to the next.
type holders struct {
	mu        sync.Mutex
	in        map[string]*dlock.Lock
	last      map[string]uint64
	overlaps  int
	backwards int
}

func newHolders() *holders {
	return &holders{in: map[string]*dlock.Lock{}, last: map[string]uint64{}}
}

func (h *holders) enter(name string, l *dlock.Lock) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cur := h.in[name]; cur != nil && time.Now().Before(cur.Deadline()) {
		h.overlaps++
	}
	if l.Fence() <= h.last[name] {
		h.backwards++
	}
	h.in[name], h.last[name] = l, l.Fence()
}

func (h *holders) leave(name string, l *dlock.Lock) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.in[name] == l {
		delete(h.in, name)
	}
}

// The phases of TestClusterPrimaryKilledDuringContention.
const (
	beforeKill  = iota // the primary serves the names, its replica confirms
	primaryDown        // the primary was killed and is not replaced yet
	failedOver         // its replica took over and has no replica of its own
	restarted          // the killed node was restarted and rejoins as the replica
	phases
)

var phaseNames = [phases]string{"before the kill", "primary down", "failed over, no replica", "killed node restarted"}

// TestClusterPrimaryKilledDuringContention: four workers, each with a
// client of its own, take exclusive locks on three names served by one
// primary, confirmed on its replica (WithReplicas(1, 200ms)); the primary
// is killed. No two workers may hold a name at once and fences must keep
// growing. Once the replica has taken over it has no replica itself, so
// every acquisition that finds its name free is refused as not replicated
// (and one that finds it held, as held) until the killed node is restarted
// and rejoins as its replica; then the workers get the locks again.
func TestClusterPrimaryKilledDuringContention(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const workers = 4
	clients := make([]*dlock.Client, workers)
	for i := range clients {
		clients[i] = newClusterClient(t, cluster)
	}
	victim := cluster.PrimaryOf(t, clients[0].RedisKey("n0"))
	names := namesOn(t, cluster, clients[0], victim, 3)

	var phase atomic.Int32
	var acquired, held, notReplicated, failed [phases]atomic.Int64
	var reached [workers]atomic.Bool // answered by the new primary
	var firstReached atomic.Int64    // when the first worker was, in Unix ns
	rec := newHolders()
	run, stopRun := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop := sync.OnceFunc(func() { stopRun(); wg.Wait() })
	defer stop()
	onRetry := func(w int) dlock.Option {
		return dlock.WithOnRetry(func(_ int, err error) {
			p := phase.Load()
			if p == failedOver && (errors.Is(err, dlock.ErrNotReplicated) || errors.Is(err, dlock.ErrNotObtained)) {
				// Only the new primary answers now: a free name is taken
				// and refused as not replicated, a held one refused as
				// held (three names, four workers: one may find them
				// held every time).
				reached[w].Store(true)
				firstReached.CompareAndSwap(0, time.Now().UnixNano())
			}
			switch {
			case errors.Is(err, dlock.ErrNotReplicated):
				notReplicated[p].Add(1)
			case errors.Is(err, dlock.ErrNotObtained):
				held[p].Add(1)
			default:
				failed[p].Add(1)
			}
		})
	}
	for w, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; run.Err() == nil; j++ {
				name := names[(w+j)%len(names)]
				actx, cancel := context.WithTimeout(run, 2*time.Second)
				l, err := c.Lock(actx, name, dlock.WithTTL(2*time.Second), dlock.WithReplicas(1, 200*time.Millisecond), onRetry(w))
				cancel()
				if err != nil {
					continue
				}
				acquired[phase.Load()].Add(1)
				rec.enter(name, l)
				time.Sleep(time.Millisecond)
				rec.leave(name, l)
				rctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_ = l.Release(rctx) // fails while the primary is down: the lock runs out
				cancel()
			}
		}()
	}
	await := func(what string, limit time.Duration, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(limit); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, limit)
			}
		}
	}

	await("20 acquisitions before the kill", 10*time.Second, func() bool { return acquired[beforeKill].Load() >= 20 })
	killed := time.Now()
	victim.Kill(t)
	phase.Store(primaryDown)
	next := cluster.AwaitFailover(t, clients[0].RedisKey(names[0]), victim, 20*time.Second)
	phase.Store(failedOver)
	failoverAt := time.Now()
	// go-redis finds the new primary when it next reads the cluster's
	// slots: it does so when its view is over 10s old, not on a refused
	// connection.
	await("every worker answered by the new primary", 20*time.Second, func() bool {
		for i := range reached {
			if !reached[i].Load() {
				return false
			}
		}
		return true
	})
	allReached := time.Now()
	phase.Store(restarted)
	victim.Restart(t)
	cluster.AwaitReplica(t, victim, next, 20*time.Second)
	rejoined := time.Now()
	await("20 acquisitions after the restart", 10*time.Second, func() bool { return acquired[restarted].Load() >= 20 })
	stop()

	t.Logf("kill to failover %v; failover to the first worker answered by the new primary %v, to every worker %v; restart to rejoined as replica %v",
		failoverAt.Sub(killed).Round(time.Millisecond), time.Unix(0, firstReached.Load()).Sub(failoverAt).Round(time.Millisecond),
		allReached.Sub(failoverAt).Round(time.Millisecond), rejoined.Sub(allReached).Round(time.Millisecond))
	for p := range phases {
		t.Logf("%-24s acquisitions %4d; failed attempts: held %4d, not replicated %4d, Redis errors %4d",
			phaseNames[p]+":", acquired[p].Load(), held[p].Load(), notReplicated[p].Load(), failed[p].Load())
	}
	t.Logf("overlaps %d, fences that did not grow %d", rec.overlaps, rec.backwards)
	if rec.overlaps != 0 {
		t.Errorf("%d times a worker took a lock that another still held", rec.overlaps)
	}
	if rec.backwards != 0 {
		t.Errorf("%d fences did not grow", rec.backwards)
	}
	if n := acquired[failedOver].Load(); n != 0 {
		t.Errorf("%d acquisitions confirmed by a replica while the shard had none", n)
	}
}

// TestClusterFailoverWithAndWithoutReplicas is TestFailoverWithAndWithoutReplicas
// on a cluster: the replica of one primary loses its stream, locks are
// taken on that primary, the primary dies and the cluster promotes the
// replica. Locks taken without WithReplicas are gone on the new primary;
// locks taken with it were refused at the time, so none is held twice.
func TestClusterFailoverWithAndWithoutReplicas(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := newClusterClient(t, cluster)
	// Every name has the hash tag {v}: all are served by one primary.
	victim := cluster.PrimaryOf(t, first.RedisKey("{v}"))
	replicas := cluster.ReplicasOf(t, victim)
	if len(replicas) != 1 {
		t.Fatalf("%s has %d replicas, want 1", victim.Addr(), len(replicas))
	}

	// The replica stops, and its link is cut: what the primary writes from
	// here on never reaches it. It resumes before the cluster would count
	// it as failed (node timeout 2s).
	replicas[0].Pause(t)
	victim.Do(t, "CLIENT", "KILL", "TYPE", "replica")
	plain, confirmed := lockWithAndWithoutReplicas(ctx, t, first, "{v}:")
	victim.Kill(t)
	replicas[0].Resume(t)
	cluster.AwaitFailover(t, first.RedisKey("{v}"), victim, 20*time.Second)

	second := newClusterClient(t, cluster) // a client that starts after the failover
	checkLostInFailover(ctx, t, second, plain, confirmed)
}

// TestClusterRWMutexAndSemaphoreUnderContention runs the read/write lock and
// the semaphore on a cluster, six workers with a client each, names on
// every primary: a writer is always alone, fences grow from writer to
// writer, and no more holders than permits are ever in.
func TestClusterRWMutexAndSemaphoreUnderContention(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const workers, rounds, permits = 6, 24, 2
	clients := make([]*dlock.Client, workers)
	for i := range clients {
		clients[i] = newClusterClient(t, cluster)
	}
	// One name per primary.
	var names []string
	served := map[*redistest.Server]bool{}
	for i := 0; len(names) < 3; i++ {
		name := "doc" + strconv.Itoa(i)
		if p := cluster.PrimaryOf(t, clients[0].RedisKey(name)); !served[p] {
			served[p] = true
			names = append(names, name)
		}
	}
	retry := dlock.WithRetry(dlock.Jitter(dlock.ExponentialBackoff(time.Millisecond, 8*time.Millisecond), 0.5))

	t.Run("rwmutex", func(t *testing.T) {
		type state struct {
			readers, writers, mostReaders int
			fence                         uint64
		}
		var mu sync.Mutex
		states := map[string]*state{}
		for _, name := range names {
			states[name] = &state{}
		}
		var bad, writes, reads atomic.Int64
		var wg sync.WaitGroup
		for w, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range rounds {
					name := names[(w+j)%len(names)]
					m := c.RWMutex(name)
					write := (w+j)%4 == 0
					acquire := m.RLock
					if write {
						acquire = m.Lock
					}
					l, err := acquire(ctx, dlock.WithTTL(5*time.Second), retry)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					s := states[name]
					if write {
						s.writers++
						if s.writers != 1 || s.readers != 0 || l.Fence() <= s.fence {
							bad.Add(1)
						}
						s.fence = l.Fence()
					} else {
						s.readers++
						s.mostReaders = max(s.mostReaders, s.readers)
						if s.writers != 0 {
							bad.Add(1)
						}
					}
					mu.Unlock()
					time.Sleep(200 * time.Microsecond)
					mu.Lock()
					if write {
						s.writers--
						writes.Add(1)
					} else {
						s.readers--
						reads.Add(1)
					}
					mu.Unlock()
					if err := l.Release(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		most := 0
		for _, s := range states {
			most = max(most, s.mostReaders)
		}
		t.Logf("%d writes, %d reads on %d names on 3 primaries; at most %d readers at once; %d violations",
			writes.Load(), reads.Load(), len(names), most, bad.Load())
		if bad.Load() != 0 {
			t.Errorf("%d times a writer was not alone or its fence did not grow", bad.Load())
		}
		if got := writes.Load() + reads.Load(); got != workers*rounds {
			t.Errorf("%d holds, want %d", got, workers*rounds)
		}
	})

	t.Run("semaphore", func(t *testing.T) {
		var mu sync.Mutex
		inside, most := map[string]int{}, map[string]int{}
		var total atomic.Int64
		var wg sync.WaitGroup
		for w, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range rounds {
					name := names[(w+j)%len(names)]
					l, err := c.Semaphore("{"+name+"}:pool", permits).Acquire(ctx, dlock.WithTTL(5*time.Second), retry)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					inside[name]++
					most[name] = max(most[name], inside[name])
					mu.Unlock()
					time.Sleep(200 * time.Microsecond)
					mu.Lock()
					inside[name]--
					mu.Unlock()
					total.Add(1)
					if err := l.Release(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		t.Logf("%d permits taken on %d semaphores of %d permits on 3 primaries; most holders at once per name %v",
			total.Load(), len(names), permits, fmt.Sprint(most))
		for name, m := range most {
			if m > permits {
				t.Errorf("%s: %d holders at once, permits %d", name, m, permits)
			}
		}
		if total.Load() != workers*rounds {
			t.Errorf("%d permits taken, want %d", total.Load(), workers*rounds)
		}
	})
}

// flakyShards is a goredis driver whose first shard channel subscriptions
// fail, as a Subscribe that timed out on a slow primary would, and that
// counts the subscriptions asked for, by channel.
type flakyShards struct {
	*goredis.Driver
	mu    sync.Mutex
	fails int
	asked map[string]int
	// subscribes makes a failing Subscribe subscribe all the same, as a
	// driver that goes on with it in the background does.
	subscribes bool
}

func (d *flakyShards) SubscribeSharded(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	sub, err := d.Driver.SubscribeSharded(ctx, notify)
	if err != nil {
		return nil, err
	}
	return &flakySubscription{Subscription: sub, d: d}, nil
}

type flakySubscription struct {
	dlock.Subscription
	d *flakyShards
}

func (s *flakySubscription) Subscribe(ctx context.Context, channels ...string) error {
	s.d.mu.Lock()
	for _, ch := range channels {
		s.d.asked[ch]++
	}
	fail := s.d.fails > 0
	if fail {
		s.d.fails--
	}
	s.d.mu.Unlock()
	if fail {
		if s.d.subscribes {
			_ = s.Subscription.Subscribe(ctx, channels...)
		}
		return errors.New("flaky: SSUBSCRIBE timed out")
	}
	return s.Subscription.Subscribe(ctx, channels...)
}

// TestAChannelWhoseSubscribeFailedIsLetGoOfToo: a Subscribe that failed
// may be one the driver goes on with (both drivers subscribe anew in the
// background). When the client lets go of that idle channel, it
// unsubscribes it as well: it was left subscribed on its primary, unknown
// to the client, until Close.
func TestAChannelWhoseSubscribeFailedIsLetGoOfToo(t *testing.T) {
	e := newClusterEnv(t)
	ctx := context.Background()
	holder, _ := e.newClient(t)
	drv := &flakyShards{Driver: goredis.New(e.newRedis(t)), fails: 1, asked: map[string]int{}, subscribes: true}
	c := dlock.New(drv)
	t.Cleanup(func() { _ = c.Close() })
	dlock.KeepIdleShardChannels(c, 0)
	for _, name := range e.names[:2] {
		l, err := holder.TryLock(ctx, name, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		wctx, giveUp, cancel := untilRefused(ctx)
		if _, err := c.Lock(wctx, name, giveUp); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("wait for %s: err = %v, want ErrNotObtained", name, err)
		}
		cancel()
	}
	key := dlock.DefaultPrefix + "{" + e.names[0] + "}"
	node, err := e.rdb.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if chans := node.PubSubShardChannels(ctx, key+":w:*").Val(); len(chans) > 0 {
		t.Errorf("shard channels left subscribed after the client let go of them: %v", chans)
	}
}

// TestAShardSubscriptionThatFailedIsAskedForAgain: a wait whose shard
// channel could not be subscribed falls back to timers, and the next wait
// for the lock subscribes again and is woken by the release's notice.
func TestAShardSubscriptionThatFailedIsAskedForAgain(t *testing.T) {
	e := newClusterEnv(t)
	ctx := context.Background()
	holder, _ := e.newClient(t)
	drv := &flakyShards{Driver: goredis.New(e.newRedis(t)), fails: 1, asked: map[string]int{}}
	c := dlock.New(drv)
	t.Cleanup(func() { _ = c.Close() })
	name := e.names[0]
	key := dlock.DefaultPrefix + "{" + name + "}"
	held, err := holder.TryLock(ctx, name, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	wctx, giveUp, cancel := untilRefused(ctx)
	defer cancel()
	if _, err := c.Lock(wctx, name, giveUp); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("first wait: err = %v, want ErrNotObtained", err)
	}
	got := lockAndRelease(c, name, 10*time.Second)
	awaitCond(t, 5*time.Second, func() bool { return e.rdb.ZCard(ctx, key+":waiters").Val() == 1 })
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("second wait: %v", err)
	}
	drv.mu.Lock()
	defer drv.mu.Unlock()
	if len(drv.asked) != 1 {
		t.Fatalf("subscriptions asked for: %v, want one channel", drv.asked)
	}
	for ch, n := range drv.asked {
		if n != 2 {
			t.Errorf("%s asked for %d times, want twice: once by each wait", ch, n)
		}
	}
}

// gatedShards is a goredis driver whose shard subscriptions hold each
// Unsubscribe until the test lets it go on; or, with firstSubscribe, their
// first Subscribe instead, as a stalled primary of one of its channels
// would.
type gatedShards struct {
	*goredis.Driver
	entered        chan []string // a call held began, with its channels
	proceed        chan struct{} // closed to let it go on
	firstSubscribe bool
	once           sync.Once
}

// gatedClient returns a Client over a gatedShards on a client of e's
// cluster, closed at the test's end, and that driver.
func gatedClient(t *testing.T, e *clusterEnv, firstSubscribe bool) (*dlock.Client, *gatedShards) {
	drv := &gatedShards{Driver: goredis.New(e.newRedis(t)), entered: make(chan []string, 1), proceed: make(chan struct{}),
		firstSubscribe: firstSubscribe}
	c := dlock.New(drv)
	t.Cleanup(func() { _ = c.Close() })
	return c, drv
}

func (d *gatedShards) SubscribeSharded(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	sub, err := d.Driver.SubscribeSharded(ctx, notify)
	if err != nil {
		return nil, err
	}
	return &gatedSubscription{Subscription: sub, d: d}, nil
}

type gatedSubscription struct {
	dlock.Subscription
	d *gatedShards
}

func (s *gatedSubscription) Unsubscribe(ctx context.Context, channels ...string) error {
	if !s.d.firstSubscribe {
		s.d.entered <- channels
		<-s.d.proceed
	}
	return s.Subscription.Unsubscribe(ctx, channels...)
}

func (s *gatedSubscription) Subscribe(ctx context.Context, channels ...string) error {
	first := false
	if s.d.firstSubscribe {
		s.d.once.Do(func() { first = true })
	}
	if first {
		s.d.entered <- channels
		<-s.d.proceed
	}
	return s.Subscription.Subscribe(ctx, channels...)
}

// TestLettingGoOfIdleChannelsDoesNotHoldUpAWait: the wait whose end makes
// the client let go of its idle shard channels returns at once, while the
// Unsubscribe goes on (a primary that does not answer held the wait, and
// the waits wanting those channels back, until it did).
func TestLettingGoOfIdleChannelsDoesNotHoldUpAWait(t *testing.T) {
	e := newClusterEnv(t)
	ctx := context.Background()
	holder, _ := e.newClient(t)
	c, drv := gatedClient(t, e, false)
	dlock.KeepIdleShardChannels(c, 0)
	name := e.names[0]
	held, err := holder.TryLock(ctx, name, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		wctx, giveUp, cancel := untilRefused(ctx)
		defer cancel()
		_, err := c.Lock(wctx, name, giveUp)
		gaveUp <- err
	}()
	<-drv.entered
	select {
	case err := <-gaveUp:
		if !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("wait: err = %v, want ErrNotObtained", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the wait waited for the Unsubscribe of its idle channel")
	}
	close(drv.proceed)
}

// TestAShardChannelWantedWhileLetGoStaysSubscribed: a client lets go of
// its idle shard channels, and a new wait wants one of them back while
// the Unsubscribe is under way. The channel must be subscribed after the
// Unsubscribe, not before: else the driver takes the Subscribe for the
// channel it still has, drops it, and the client, which counts it as
// subscribed, hears no release of that lock until it lets go of it again.
// When the Unsubscribe takes longer than a wait waits for it (a stalled
// primary), the channel is subscribed at the wait's next attempt.
func TestAShardChannelWantedWhileLetGoStaysSubscribed(t *testing.T) {
	for _, held := range []time.Duration{0, 600 * time.Millisecond} {
		t.Run(fmt.Sprintf("UnsubscribeHeld%v", held), func(t *testing.T) {
			testShardChannelWantedWhileLetGo(t, held)
		})
	}
}

func testShardChannelWantedWhileLetGo(t *testing.T, unsubscribeHeld time.Duration) {
	e := newClusterEnv(t)
	ctx := context.Background()
	holder, _ := e.newClient(t)
	c, drv := gatedClient(t, e, false)
	dlock.KeepIdleShardChannels(c, 1)
	a, b := e.names[0], e.names[1]
	held := map[string]*dlock.Lock{}
	for _, name := range []string{a, b} {
		l, err := holder.TryLock(ctx, name, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		held[name] = l
	}
	giveUp := func(name string) error {
		ctx, refused, cancel := untilRefused(ctx)
		defer cancel()
		if _, err := c.Lock(ctx, name, refused); !errors.Is(err, dlock.ErrNotObtained) {
			return fmt.Errorf("wait for %s: err = %v, want ErrNotObtained", name, err)
		}
		return nil
	}
	// A wait for a that gives up leaves a's channel subscribed, idle.
	if err := giveUp(a); err != nil {
		t.Fatal(err)
	}
	// So does one for b: two idle channels, one more than kept, so both go,
	// and their Unsubscribe waits for the test.
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- giveUp(b) }()
	if dropped := <-drv.entered; len(dropped) != 2 {
		t.Fatalf("unsubscribed %v, want a's and b's channels", dropped)
	}
	// A new wait for a wants its channel back meanwhile.
	got := lockAndRelease(c, a, 10*time.Second)
	awaitCond(t, 5*time.Second, func() bool { n, _ := dlock.ShardListeners(c, a); return n == 1 })
	time.Sleep(unsubscribeHeld) // the primary's answer
	close(drv.proceed)
	if err := <-gaveUp; err != nil {
		t.Fatal(err)
	}
	key := dlock.DefaultPrefix + "{" + a + "}"
	awaitCond(t, 5*time.Second, func() bool { return e.rdb.ZCard(ctx, key+":waiters").Val() == 1 })
	node, err := e.rdb.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	awaitCond(t, 5*time.Second, func() bool {
		return len(node.PubSubShardChannels(ctx, key+":w:*").Val()) == 1
	})
	if err := held[a].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("new wait for %s: %v", a, err)
	}
	// The client still counts a's channel as subscribed; so must its primary.
	if _, ok := dlock.ShardListeners(c, a); !ok {
		t.Fatal("the client no longer keeps a's channel")
	}
	chans, err := node.PubSubShardChannels(ctx, key+":w:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(chans) != 1 {
		t.Errorf("shard channels of %s on its primary: %v, want the waiting client's", a, chans)
	}
}

// TestSweepingIdleChannelsKeepsAPrimarysConnection: waits for names that
// each wait once, all on one primary, pass the client's bound on idle shard
// channels again and again. Each sweep lets go of those idle longest and
// keeps the newest, so the primary keeps its one pub/sub connection: a
// sweep that let go of every channel closed it, and the next wait opened
// another (with TLS, a handshake each time).
func TestSweepingIdleChannelsKeepsAPrimarysConnection(t *testing.T) {
	e := newClusterEnv(t)
	ctx := context.Background()
	holder, _ := e.newClient(t)
	c := dlock.New(goredis.New(e.newRedis(t)))
	t.Cleanup(func() { _ = c.Close() })
	dlock.KeepIdleShardChannels(c, 4)
	primary := e.cluster.PrimaryOf(t, c.RedisKey(e.names[0]))
	names := namesOn(t, e.cluster, c, primary, 13)
	conns := map[string]bool{} // the ids of the pub/sub connections seen on primary
	for _, name := range names {
		held, err := holder.TryLock(ctx, name, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		got := lockAndRelease(c, name, 10*time.Second)
		key := c.RedisKey(name)
		awaitCond(t, 5*time.Second, func() bool { return primary.Do(t, "PUBSUB", "SHARDCHANNELS", key+":w:*") != "" })
		for _, line := range strings.Split(primary.Do(t, "CLIENT", "LIST", "TYPE", "pubsub"), "\n") {
			if id, _, ok := strings.Cut(line, " "); ok {
				conns[id] = true
			}
		}
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("wait for %s: %v", name, err)
		}
	}
	if len(conns) != 1 {
		t.Errorf("%d waits on one primary, sweeping idle channels every 5: pub/sub connections %v, want one", len(names), conns)
	}
	kept := 0
	for _, name := range names {
		if _, ok := dlock.ShardListeners(c, name); ok {
			kept++
		}
	}
	if kept < 2 || kept > 4 {
		t.Errorf("the client keeps %d idle channels, want 2 to 4 (half of the bound after a sweep, up to the bound)", kept)
	}
}

// TestAWaitIsNotHeldUpByAnotherWaitsSubscribe: a lock on two names waits,
// and its Subscribe of their channels is held up (one of them on a
// stalled primary). A wait for one of those names on the same client does
// not wait for that Subscribe to return (it waited for as long as its own
// context allowed): it makes its attempts, and obtains the name once it
// is released.
func TestAWaitIsNotHeldUpByAnotherWaitsSubscribe(t *testing.T) {
	e := newClusterEnv(t)
	ctx := context.Background()
	holder, _ := e.newClient(t)
	c, drv := gatedClient(t, e, true)
	a, b := e.names[0], e.names[1]
	held, err := holder.TryLock(ctx, b, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	multi := make(chan error, 1)
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, err := c.LockMulti(mctx, []string{a, b})
		multi <- err
	}()
	<-drv.entered
	got := lockAndRelease(c, b, 10*time.Second)
	key := dlock.DefaultPrefix + "{" + b + "}"
	awaitCond(t, 5*time.Second, func() bool { return e.rdb.ZCard(ctx, key+":waiters").Val() == 1 })
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Errorf("the wait for %s, behind the held-up Subscribe: %v", b, err)
	}
	close(drv.proceed)
	cancel()
	<-multi
}

// TestALockHeldWhileItsSlotMigrates moves the slot of a held lock (an
// exclusive lock, a write hold, the one permit of a semaphore) to another
// primary key by key (MIGRATE), as a resharding does, while another client
// keeps trying to take it: it never does while the holder holds it, and
// the holder, refreshing all along, keeps it through a migration shorter
// than its TTL, then releases it on the new primary, and a waiter gets it.
func TestALockHeldWhileItsSlotMigrates(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	holder, contender, waiter := newClusterClient(t, cluster), newClusterClient(t, cluster), newClusterClient(t, cluster)
	type acquire func(c *dlock.Client, ctx context.Context, name string, opts ...dlock.Option) (*dlock.Lock, error)
	for _, tc := range []struct {
		kind       string
		take, wait acquire
		try        acquire // another kind of hold where it has one: a reader
	}{
		{"exclusive", (*dlock.Client).TryLock, (*dlock.Client).Lock, (*dlock.Client).TryLock},
		{"write",
			func(c *dlock.Client, ctx context.Context, name string, opts ...dlock.Option) (*dlock.Lock, error) {
				return c.RWMutex(name).TryLock(ctx, opts...)
			},
			func(c *dlock.Client, ctx context.Context, name string, opts ...dlock.Option) (*dlock.Lock, error) {
				return c.RWMutex(name).Lock(ctx, opts...)
			},
			func(c *dlock.Client, ctx context.Context, name string, opts ...dlock.Option) (*dlock.Lock, error) {
				return c.RWMutex(name).TryRLock(ctx, opts...)
			}},
		{"permit",
			func(c *dlock.Client, ctx context.Context, name string, opts ...dlock.Option) (*dlock.Lock, error) {
				return c.Semaphore(name, 1).TryAcquire(ctx, opts...)
			},
			func(c *dlock.Client, ctx context.Context, name string, opts ...dlock.Option) (*dlock.Lock, error) {
				return c.Semaphore(name, 1).Acquire(ctx, opts...)
			},
			func(c *dlock.Client, ctx context.Context, name string, opts ...dlock.Option) (*dlock.Lock, error) {
				return c.Semaphore(name, 1).TryAcquire(ctx, opts...)
			}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			name := "moving:" + tc.kind
			key := holder.RedisKey(name)
			l, err := tc.take(holder, ctx, name, dlock.WithTTL(5*time.Second), dlock.WithRefreshInterval(100*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			// Another client waits for it too, so that its waiter set exists.
			wctx, wcancel := context.WithCancel(ctx)
			defer wcancel()
			waited := whenRefused(t, tc.kind, func(opts ...dlock.Option) (*dlock.Lock, error) {
				return tc.wait(waiter, wctx, name, opts...)
			})

			var taken, refused, failed, attempts atomic.Int64
			var firstFailure atomic.Value
			stop := make(chan struct{})
			contended := make(chan struct{})
			var stopOnce sync.Once
			stopContending := func() {
				stopOnce.Do(func() { close(stop) })
				<-contended
			}
			t.Cleanup(stopContending) // also when the test fails before it stops it
			go func() {
				defer close(contended)
				for {
					select {
					case <-stop:
						return
					default:
					}
					attempts.Add(1)
					tctx, cancel := context.WithTimeout(ctx, time.Second)
					other, err := tc.try(contender, tctx, name, dlock.WithTTL(time.Second))
					cancel()
					switch {
					case err == nil:
						taken.Add(1)
						_ = other.Release(ctx)
					case errors.Is(err, dlock.ErrNotObtained):
						refused.Add(1)
					default:
						failed.Add(1)
						firstFailure.CompareAndSwap(nil, err.Error())
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()

			from := cluster.PrimaryOf(t, key)
			var to *redistest.Server
			for _, p := range cluster.Nodes { // all primaries: no replicas
				if p != from {
					to = p
					break
				}
			}
			slot := from.Do(t, "CLUSTER", "KEYSLOT", key)
			to.Do(t, "CLUSTER", "SETSLOT", slot, "IMPORTING", from.Do(t, "CLUSTER", "MYID"))
			from.Do(t, "CLUSTER", "SETSLOT", slot, "MIGRATING", to.Do(t, "CLUSTER", "MYID"))
			keys := strings.Fields(from.Do(t, "CLUSTER", "GETKEYSINSLOT", slot, "100"))
			if len(keys) < 3 {
				t.Fatalf("slot %s holds %q; want the lock's keys and its waiter set", slot, keys)
			}
			// awaitAttempt waits until the other client has made a whole
			// attempt since it was called: one begun after the call and
			// ended (the next one begun). An attempt can take a while:
			// go-redis retries TRYAGAIN.
			awaitAttempt := func(when string) {
				t.Helper()
				want := attempts.Load() + 2
				deadline := time.Now().Add(10 * time.Second)
				for attempts.Load() < want {
					if time.Now().After(deadline) {
						t.Fatalf("%s: the other client made no whole attempt within 10s", when)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			host, port, _ := strings.Cut(to.Addr(), ":")
			for i, k := range keys {
				from.Do(t, "MIGRATE", host, port, k, "0", "5000")
				if i < len(keys)-1 { // the lock's keys split between the two
					awaitAttempt(fmt.Sprintf("with %d of %d keys moved", i+1, len(keys)))
				}
			}
			toID := to.Do(t, "CLUSTER", "MYID")
			for _, n := range cluster.Nodes {
				n.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", toID)
			}
			// The holder refreshes on the new primary: the key's PTTL there
			// rises; and the other client tries there too.
			pttl := func() int {
				n, err := strconv.Atoi(to.Do(t, "PTTL", key))
				if err != nil || n < 0 {
					t.Fatalf("PTTL of %s on the new primary: %d, %v", key, n, err)
				}
				return n
			}
			// A refresh shows as a reading above the one before it. (The first
			// reading can itself follow a refresh, at the TTL's ceiling: a
			// later one need not pass it.)
			prev := pttl()
			deadline := time.Now().Add(10 * time.Second)
			for {
				cur := pttl()
				if cur > prev {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no refresh reached the new primary within 10s (PTTL of %s only fell, to %d ms)", key, cur)
				}
				prev = cur
				time.Sleep(10 * time.Millisecond)
			}
			awaitAttempt("after the slot moved")
			stopContending()
			t.Logf("%d keys moved; the other client was refused %d times and failed %d times (%v)", len(keys), refused.Load(), failed.Load(), firstFailure.Load())
			if n := taken.Load(); n != 0 {
				t.Fatalf("the other client took the held lock %d times while its slot moved", n)
			}
			select {
			case <-l.Done():
				t.Fatalf("the holder lost the lock during a migration shorter than its TTL: %v", l.Err())
			default:
			}
			if got := cluster.PrimaryOf(t, key); got != to || to.Do(t, "EXISTS", key) != "1" {
				t.Fatalf("the lock's key is not on the new primary %s", to.Addr())
			}
			if _, err := tc.try(contender, ctx, name); !errors.Is(err, dlock.ErrNotObtained) {
				t.Fatalf("an attempt on the held lock after the move: %v, want ErrNotObtained", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-waited // woken by the release on the new primary, or by its beat
			if r.err != nil {
				t.Fatalf("the waiter: %v", r.err)
			}
			if tc.kind != "permit" && r.l.Fence() <= l.Fence() {
				t.Errorf("fence %d after %d", r.l.Fence(), l.Fence())
			}
			_ = r.l.Release(ctx)
		})
	}
}

// TestAClusterReleaseGrantsToTheWaitersItCanHear: on a cluster, a release
// grants the lock to a waiter listening on its plain channel through
// another node (PUBLISH reaches it there, though the lock's node counts no
// listener), on each of the three primaries; and, with shard channels,
// skips a waiter registered ahead that no longer listens, granting the
// lock to the live one behind it.
func TestAClusterReleaseGrantsToTheWaitersItCanHear(t *testing.T) {
	e := newClusterEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	holder, _ := e.newClient(t)
	t.Run("plain", func(t *testing.T) {
		waiter, _ := e.newClient(t) // no ShardedSubscriber: PUBLISH
		for _, name := range e.names {
			held, err := holder.TryLock(ctx, name, dlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			got := lockWhenRefused(t, ctx, waiter, name, dlock.WithTTL(time.Minute))
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			tok := e.hget(t, name, "token")
			if tok == "" {
				t.Errorf("%s: the lock is free after the release, want it granted to the waiter", name)
			}
			r := <-got
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.l.Token() != tok {
				t.Errorf("%s: the waiter holds %q, the lock %q", name, r.l.Token(), tok)
			}
			if err := r.l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("sharded", func(t *testing.T) {
		waiter := dlock.New(goredis.New(e.newRedis(t)))
		t.Cleanup(func() { _ = waiter.Close() })
		name := e.names[1]
		key := dlock.DefaultPrefix + "{" + name + "}"
		held, err := holder.TryLock(ctx, name, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		got := lockWhenRefused(t, ctx, waiter, name, dlock.WithTTL(time.Minute))
		live, err := e.rdb.ZRangeWithScores(ctx, key+":waiters", 0, -1).Result()
		if err != nil || len(live) != 1 || !strings.HasPrefix(live[0].Member.(string), "s|") {
			t.Fatalf("waiters: %v, %v; want one on shard channels", live, err)
		}
		if live[0].Score == float64(int64(live[0].Score)) {
			t.Fatalf("the live client's registration, %v, does not say the server heard it", live[0].Score)
		}
		// A client that registered just before, left its request and died.
		dead := "s|dead"
		if err := e.rdb.ZAdd(ctx, key+":waiters", redis.Z{Score: live[0].Score - 1, Member: dead}).Err(); err != nil {
			t.Fatal(err)
		}
		request := `["dead-request","60000","","","1","` + strconv.FormatInt(time.Now().UnixMicro(), 10) + `"]`
		if err := e.rdb.HSet(ctx, key, "g:"+dead, request).Err(); err != nil {
			t.Fatal(err)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		tok := e.hget(t, name, "token")
		if tok == "" || tok == "dead-request" {
			t.Errorf("the lock is held with %q after the release, want it granted to the live waiter", tok)
		}
		if n, err := e.rdb.ZScore(ctx, key+":waiters", dead).Result(); !errors.Is(err, redis.Nil) {
			t.Errorf("the dead client is still registered: %v, %v", n, err)
		}
		if e.hget(t, name, "g:"+dead) != "" {
			t.Error("the dead client's request is still there")
		}
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.l.Token() != tok {
			t.Errorf("the waiter holds %q, the lock %q", r.l.Token(), tok)
		}
		if err := r.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// slotMove is a move of a slot from one primary to another, as redis-cli
// --cluster reshard makes it: the slot importing on one, migrating on the
// other, its keys moved by MIGRATE (without REPLACE), then given to the
// new primary on every node.
type slotMove struct {
	t                      *testing.T
	cluster                *redistest.Cluster
	from, to               *redistest.Server
	slot, toID, host, port string
}

// startSlotMove starts moving the slot of key from its primary to another,
// and moves none of its keys yet.
func startSlotMove(t *testing.T, cluster *redistest.Cluster, key string) *slotMove {
	m := &slotMove{t: t, cluster: cluster, from: cluster.PrimaryOf(t, key)}
	for _, p := range cluster.Nodes {
		if p != m.from {
			m.to = p
			break
		}
	}
	m.slot = m.from.Do(t, "CLUSTER", "KEYSLOT", key)
	m.toID = m.to.Do(t, "CLUSTER", "MYID")
	m.host, m.port, _ = strings.Cut(m.to.Addr(), ":")
	m.to.Do(t, "CLUSTER", "SETSLOT", m.slot, "IMPORTING", m.from.Do(t, "CLUSTER", "MYID"))
	m.from.Do(t, "CLUSTER", "SETSLOT", m.slot, "MIGRATING", m.toID)
	return m
}

// left returns the keys of the slot still on the primary it leaves.
func (m *slotMove) left() []string {
	return strings.Fields(m.from.Do(m.t, "CLUSTER", "GETKEYSINSLOT", m.slot, "100"))
}

// migrate moves keys to the new primary.
func (m *slotMove) migrate(keys ...string) {
	for _, k := range keys {
		m.from.Do(m.t, "MIGRATE", m.host, m.port, k, "0", "5000")
	}
}

// finish moves the keys left and ends the move.
func (m *slotMove) finish() {
	m.migrate(m.left()...)
	for _, n := range m.cluster.Nodes {
		n.Do(m.t, "CLUSTER", "SETSLOT", m.slot, "NODE", m.toID)
	}
}

// splitSlot starts moving the slot of key to another primary, and moves
// key alone, so that the slot's keys are split between the two (a request
// on several of them is refused with TRYAGAIN, or ASK); finish moves the
// rest and ends the move.
func splitSlot(t *testing.T, cluster *redistest.Cluster, key string) (finish func()) {
	m := startSlotMove(t, cluster, key)
	m.migrate(key)
	if len(m.left()) == 0 {
		t.Fatalf("nothing of the lock left on %s: the move is not split", m.from.Addr())
	}
	return m.finish
}

// TestAReleaseDuringASlotMigrationWaitsItOut: a Release that finds its
// lock's keys split between two primaries while their slot moves (the
// lock's hash moved, its fence counter not yet: TRYAGAIN) is sent again a
// little later, and frees the lock once the move is over, rather than
// failing and leaving the name taken for its TTL.
func TestAReleaseDuringASlotMigrationWaitsItOut(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	holder, other := newClusterClient(t, cluster), newClusterClient(t, cluster)
	name := "split:release"
	key := holder.RedisKey(name)
	l, err := holder.TryLock(ctx, name, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	finish := splitSlot(t, cluster, key)
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		time.Sleep(300 * time.Millisecond) // the Release meets the split slot
		finish()
	}()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = l.Release(rctx)
	<-moved
	if err != nil {
		t.Fatalf("Release while the slot moved: %v", err)
	}
	l2, err := other.TryLock(ctx, name)
	if err != nil {
		t.Fatalf("TryLock after the Release: %v", err)
	}
	_ = l2.Release(ctx)
}

// TestAWriterThatGivesUpDuringASlotMigrationLeavesNoPendingRecord: a
// waiting writer records itself as pending, which keeps new readers out,
// and gives up (its context ends, or Close ends its wait) while its slot's
// keys are split between two primaries. Its clean-up, refused until the
// move ends, is sent again in the background (Close waits for it), where
// it took the record back only when its TTL ran out.
func TestAWriterThatGivesUpDuringASlotMigrationLeavesNoPendingRecord(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	for _, by := range []string{"cancel", "Close"} {
		t.Run(by, func(t *testing.T) {
			holder, writer, reader := newClusterClient(t, cluster), newClusterClient(t, cluster), newClusterClient(t, cluster)
			name := "split:writer:" + by
			held, err := holder.RWMutex(name).TryLock(ctx, dlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			gaveUp := make(chan error, 1)
			go func() {
				_, err := writer.RWMutex(name).Lock(wctx, dlock.WithTTL(time.Minute))
				gaveUp <- err
			}()
			awaitCond(t, 5*time.Second, func() bool {
				info, err := holder.Inspect(ctx, name)
				return err == nil && info.WriterWaiting
			})
			finish := splitSlot(t, cluster, holder.RedisKey(name))
			want := context.Canceled
			if by == "cancel" {
				cancel() // the writer gives up while the keys are split
			} else {
				want = dlock.ErrClosed
				moved := make(chan struct{})
				go func() {
					defer close(moved)
					time.Sleep(300 * time.Millisecond) // Close waits for the clean-up meanwhile
					finish()
				}()
				_ = writer.Close()
				<-moved
			}
			if err := <-gaveUp; !errors.Is(err, want) {
				t.Fatalf("the waiting writer's Lock = %v, want %v", err, want)
			}
			if by == "cancel" {
				finish()
			}
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			// The clean-up is sent again within 2s: a reader gets in then.
			awaitCond(t, 3*time.Second, func() bool {
				r, err := reader.RWMutex(name).TryRLock(ctx)
				if err == nil {
					_ = r.Release(ctx)
				}
				return err == nil
			})
		})
	}
}

// TestACleanUpWhileItsSlotMigratesLeavesTheSlotMovable: a clean-up (the
// release after an acquire whose reply was lost) keeps its record in a key
// of its own beside the lock's hash (…:late, two seconds). While the
// lock's slot moves to another primary, with the hash, the waiter set and
// the fence counter moved and that key not yet, a clean-up runs on the
// importing node (the source answers ASK: it has none of the keys the
// script names). Its record must not make a second copy of the key there:
// MIGRATE of the source's copy would then fail (BUSYKEY), and so would
// `redis-cli --cluster reshard`, leaving the slot half-moved.
func TestACleanUpWhileItsSlotMigratesLeavesTheSlotMovable(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	holder, waiter := newClusterClient(t, cluster), newClusterClient(t, cluster)
	name := "migrating:late"
	key := holder.RedisKey(name)
	held, err := holder.TryLock(ctx, name, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// A waiter, so that the waiter set exists: a release's keys are all
	// there and it runs wherever they are.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	waited := lockWhenRefused(t, wctx, waiter, name)
	// cleanedUp makes an acquire whose reply is lost: its clean-up runs.
	cleanedUp := func() *copyingDriver {
		t.Helper()
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		d := &copyingDriver{Driver: goredis.New(rdb), holdBack: true}
		c := dlock.New(d)
		t.Cleanup(func() { _ = c.Close() })
		if _, err := c.TryLock(ctx, name); !errors.Is(err, errLostReply) {
			t.Fatalf("TryLock: %v, want the lost reply's error", err)
		}
		return d
	}
	cleanedUp()
	from := cluster.PrimaryOf(t, key)
	late := key + ":late"
	if from.Do(t, "EXISTS", late) != "1" {
		t.Fatalf("no %s after a clean-up", late)
	}
	from.Do(t, "PERSIST", late) // its two seconds do not run out during the test
	m := startSlotMove(t, cluster, key)
	m.migrate(slices.DeleteFunc(m.left(), func(k string) bool { return k == late })...)
	d := cleanedUp() // while the lock's keys but its clean-ups' record have moved
	// The rest of the move, as redis-cli does it: MIGRATE without REPLACE.
	m.finish()
	if n := from.Do(t, "CLUSTER", "COUNTKEYSINSLOT", m.slot); n != "0" {
		t.Errorf("the old primary keeps %s keys of the slot", n)
	}
	// Once the move is over, the second clean-up's record is there: a late
	// copy of its acquire takes nothing, once the name is free.
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-waited
	if r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The clean-up runs on the new primary, sent again there if the move
	// refused it: its record names the acquire's request token.
	word := d.kept[0].Args[0].(string)[:11]
	awaitCond(t, 5*time.Second, func() bool { return strings.Contains(m.to.Do(t, "GET", late), word) })
	if v := d.sendCopies(t); !refusal(v[0]) {
		t.Errorf("a late copy of the acquire cleaned up during the move replied %v, want a refusal", v[0])
	}
}

// TestAContendedLockIsHandedOverWhileItsSlotMigrates: while a lock's slot
// is being moved, before any of its keys has, its release and its
// waiter's acquire run on the node the slot leaves, which has every key
// they name: the clean-ups' record (…:late), which they only read and
// which is seldom there, is not among them (only a clean-up, which writes
// it, names it), or Redis would refuse them (TRYAGAIN) for as long as the
// slot moves, the release failing and the waiter waiting for the TTL.
func TestAContendedLockIsHandedOverWhileItsSlotMigrates(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	holder, waiter := newClusterClient(t, cluster), newClusterClient(t, cluster)
	name := "migrating:handover"
	key := holder.RedisKey(name)
	held, err := holder.TryLock(ctx, name, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	waited := lockWhenRefused(t, wctx, waiter, name, dlock.WithTTL(time.Minute))
	m := startSlotMove(t, cluster, key)
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release while the slot migrates: %v", err)
	}
	r := <-waited // by the TTL's minute, wctx's 20 seconds end it
	if r.err != nil {
		t.Fatalf("the waiter, while the slot migrates: %v", r.err)
	}
	// (Its own release, the name's waiter set gone with the grant, would
	// be refused until the move ends: see docs/guarantees.md.)
	m.finish()
	if err := r.l.Release(ctx); err != nil {
		t.Fatalf("the waiter's Release once the slot moved: %v", err)
	}
}
