package dlocktest

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
)

// RunSentinelFailover checks dlock over a driver of a Sentinel deployment
// (Topology Sentinel) where Run cannot, as it fails the primary over: each
// subtest starts a primary with one replica and three sentinels of its
// own, and makes the primary fail over to the replica, by killing it
// (Killed) or by SENTINEL FAILOVER, where the old primary lives on and
// comes back as the new one's replica (SentinelFailover).
//
// AutoRefreshed: a client holds 200 locks of 8 seconds refreshed
// automatically (WithAutoRefresh), with and without WithReplicas(1,
// 500ms), which the replica had every one of. Each is then either
// refreshed on the new primary (its deadline moves past the failover, the
// key there holds its token) or told lost (Done closes, Err matches
// dlock.ErrLost); a second client obtains none whose holder was not told;
// Refresh and Release succeed on those held, and report the loss of the
// others.
//
// Waiters: 100 callers of a client wait in Lock for locks another client
// holds while the primary fails over; once the waiting client listens on
// the new primary, the holders release the locks there, and each release
// grants its waiter the lock (it is not passed over as dead, which would
// leave it to take the lock by an attempt of its own), never before its
// holder began to release it.
//
// A driver without dlock.Replicator skips the WithReplicas subtests. The
// subtests run one after the other, in about 45 seconds (10 more over a
// driver that follows a SENTINEL FAILOVER only when Sentinel closes the
// old primary's connections).
func RunSentinelFailover(t *testing.T, newDriver NewDriver) {
	t.Helper()
	if newDriver == nil {
		t.Fatal("dlocktest: RunSentinelFailover with a nil NewDriver")
	}
	for _, tc := range []struct {
		name           string
		kill, replicas bool
	}{
		{"Killed", true, false},
		{"KilledWithReplicas", true, true},
		{"SentinelFailover", false, false},
		{"SentinelFailoverWithReplicas", false, true},
	} {
		t.Run("AutoRefreshed/"+tc.name, func(t *testing.T) {
			testAutoRefreshedFailover(t, newDriver, tc.kill, tc.replicas)
		})
	}
	t.Run("Waiters/Killed", func(t *testing.T) { testWaitersFailover(t, newDriver, true) })
	t.Run("Waiters/SentinelFailover", func(t *testing.T) { testWaitersFailover(t, newDriver, false) })
}

// sentinelClient returns a dlock client over a new driver of r's
// sentinels, closed with the test.
func sentinelClient(t *testing.T, newDriver NewDriver, r *redistest.Replicated, opts ...dlock.ClientOption) *dlock.Client {
	t.Helper()
	d := newDriver(t, Deployment{Topology: Sentinel, Addrs: r.SentinelAddrs(), MasterName: r.MasterName})
	if d == nil {
		t.Fatal("dlocktest: NewDriver returned nil")
	}
	c := dlock.New(d, opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// failOver makes r's primary fail over, by killing it or by SENTINEL
// FAILOVER, once the replica has every write, and waits until the
// sentinels name the replica, which it returns, with the time the switch
// was seen.
func failOver(t *testing.T, r *redistest.Replicated, kill bool) (*redistest.Server, time.Time) {
	t.Helper()
	if got := r.Primary.Do(t, "WAIT", "1", "5000"); got != "1" {
		t.Fatalf("dlocktest: WAIT 1 = %s: the replica lags", got)
	}
	old := r.Primary.Addr()
	if kill {
		r.Primary.Kill(t)
	} else {
		r.Sentinels[0].Do(t, "SENTINEL", "FAILOVER", r.MasterName)
	}
	for deadline := time.Now().Add(20 * time.Second); r.CurrentPrimary(t) == old; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("dlocktest: no failover within 20s")
		}
	}
	if got := r.CurrentPrimary(t); got != r.Replicas[0].Addr() {
		t.Fatalf("dlocktest: the sentinels name %s, not the replica %s", got, r.Replicas[0].Addr())
	}
	return r.Replicas[0], time.Now()
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func testAutoRefreshedFailover(t *testing.T, newDriver NewDriver, kill, replicas bool) {
	const n, ttl = 200, 8 * time.Second
	r := redistest.StartReplicated(t, 1, 3)
	holder := sentinelClient(t, newDriver, r)
	other := sentinelClient(t, newDriver, r)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := []dlock.Option{dlock.WithTTL(ttl), dlock.WithAutoRefresh()}
	if replicas {
		opts = append(opts, dlock.WithReplicas(1, 500*time.Millisecond))
	}
	locks := make([]*dlock.Lock, n)
	for i := range locks {
		l, err := holder.TryLock(ctx, "fo:"+strconv.Itoa(i), opts...)
		if replicas && i == 0 && errors.Is(err, dlock.ErrUnsupported) {
			t.Skip("the driver has no Replicator")
		}
		if err != nil {
			t.Fatal(err)
		}
		locks[i] = l
	}
	start := time.Now()
	next, seen := failOver(t, r, kill)

	// Each lock is refreshed after the switch was seen, or ends.
	limit := time.Now().Add(20 * time.Second)
	for i, l := range locks {
		for !isClosed(l.Done()) && !l.Deadline().After(seen.Add(ttl-ttl/100-2*time.Millisecond)) {
			if time.Now().After(limit) {
				t.Fatalf("lock %d neither refreshed after the failover nor lost within 20s (deadline %v after the switch was seen)",
					i, l.Deadline().Sub(seen))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	settled := time.Now()
	lost := 0
	for i, l := range locks {
		if isClosed(l.Done()) {
			lost++
			if !errors.Is(l.Err(), dlock.ErrLost) {
				t.Errorf("lock %d ended with %v, want ErrLost", i, l.Err())
			}
			continue
		}
		if tok := next.Do(t, "HGET", holder.RedisKey(l.Name()), "token"); tok != l.Token() {
			t.Errorf("lock %d is held, refreshed after the failover, but the new primary has token %q, not %q", i, tok, l.Token())
		}
	}
	// Nobody else obtains a lock whose holder was not told.
	doubled := 0
	for i, l := range locks {
		o, err := other.TryLock(ctx, l.Name(), dlock.WithTTL(ttl))
		if err == nil {
			if !isClosed(l.Done()) {
				doubled++
				t.Errorf("lock %d was obtained by another client while its holder still holds it", i)
			}
			_ = o.Release(ctx)
		} else if !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("TryLock of lock %d's name by another client: %v", i, err)
		}
	}
	// Refresh half, release all.
	for i, l := range locks {
		wasLost := isClosed(l.Done())
		if i%2 == 0 {
			err := l.Refresh(ctx, ttl)
			if wasLost && !errors.Is(err, dlock.ErrLost) || !wasLost && err != nil && !errors.Is(err, dlock.ErrLost) {
				t.Errorf("Refresh of lock %d (lost before: %v) after the failover: %v", i, wasLost, err)
			}
			if err != nil {
				wasLost = true
			}
		}
		err := l.Release(ctx)
		if !wasLost && err != nil {
			t.Errorf("Release of held lock %d after the failover: %v", i, err)
		} else if wasLost && err != nil && !errors.Is(err, dlock.ErrNotHeld) && !errors.Is(err, dlock.ErrLost) {
			t.Errorf("Release of lost lock %d after the failover: %v", i, err)
		}
	}
	if lost > 0 {
		t.Logf("first loss: %v", locks[0].Err())
	}
	t.Logf("%d locks: %d lost (told), %d taken by another while held; failover seen %v after it began, every lock refreshed or lost %v after that",
		n, lost, doubled, seen.Sub(start).Round(time.Millisecond), settled.Sub(seen).Round(time.Millisecond))
}

func testWaitersFailover(t *testing.T, newDriver NewDriver, kill bool) {
	const n = 100
	r := redistest.StartReplicated(t, 1, 3)
	// How each waiting Lock ended: its attempts and failed attempts (a
	// lock a release granted comes with no attempt of its own when the
	// waiter takes it up on its notice). Once the gate is set, a waiter
	// whose attempt the lock's holder refused stops there until the gate
	// opens: the releases find no attempt of the waiters under way, which
	// could take a lock in the moment it is freed, and a lock held after
	// its release was granted to its waiter.
	var mu sync.Mutex
	failed, attempts := map[string]int{}, map[string]int{}
	var gate chan struct{}
	var stopped atomic.Int32
	hooks := dlock.Hooks{
		Retry: func(_ context.Context, h dlock.HookInfo, k int, err error) {
			mu.Lock()
			failed[h.Names[0]] = k
			g := gate
			mu.Unlock()
			if g != nil && errors.Is(err, dlock.ErrNotObtained) {
				stopped.Add(1)
				<-g
			}
		},
		AcquireDone: func(_ context.Context, h dlock.HookInfo, res dlock.AcquireResult) {
			mu.Lock()
			defer mu.Unlock()
			attempts[h.Names[0]] = res.Attempts
		},
	}
	holder := sentinelClient(t, newDriver, r)
	waiter := sentinelClient(t, newDriver, r, dlock.WithHooks(hooks))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	name := func(i int) string { return "w:" + strconv.Itoa(i) }
	held := make([]*dlock.Lock, n)
	for i := range held {
		l, err := holder.TryLock(ctx, name(i), dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		held[i] = l
	}
	var releasing [n]atomic.Bool
	type result struct {
		i   int
		l   *dlock.Lock
		err error
		bad bool
	}
	results := make(chan result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := waiter.Lock(ctx, name(i), dlock.WithTTL(time.Minute), dlock.WithMaxWait(40*time.Second))
			results <- result{i, l, err, err == nil && !releasing[i].Load()}
		}()
	}
	// Every waiter is registered.
	await(t, "registration of every waiter", func() bool {
		for i := range n {
			if r.Primary.Do(t, "ZCARD", holder.RedisKey(name(i))+":waiters") == "0" {
				return false
			}
		}
		return true
	})
	// The channel the waiting client registered by.
	channel := strings.SplitN(r.Primary.Do(t, "ZRANGE", holder.RedisKey(name(0))+":waiters", "0", "0"), "\n", 2)[0]
	start := time.Now()
	next, seen := failOver(t, r, kill)
	// The waiting client listens on the new primary. A driver that learns
	// of the switch only when Sentinel, turning the old primary that lives
	// on into a replica, closes its clients' connections moves only then:
	// Sentinel waits 8 seconds, and for its next look at the old primary,
	// every 10 seconds.
	bound := waitFor
	if !kill {
		bound = 30 * time.Second
	}
	for deadline := time.Now().Add(bound); next.Do(t, "PUBSUB", "NUMSUB", channel) != channel+"\n1"; time.Sleep(poll) {
		if time.Now().After(deadline) {
			old := "killed"
			if !kill {
				old = strings.SplitN(r.Primary.Do(t, "ROLE"), "\n", 2)[0]
			}
			t.Fatalf("dlocktest: the waiting client's channel %q has no subscriber on the new primary %v after the failover (channels there: %q; the old primary: %s)",
				channel, bound, next.Do(t, "PUBSUB", "CHANNELS"), old)
		}
	}
	listening := time.Now()
	open := sync.OnceFunc(func() {
		mu.Lock()
		defer mu.Unlock()
		close(gate)
	})
	mu.Lock()
	gate = make(chan struct{})
	mu.Unlock()
	defer open()
	// Each waiter tries again within half a second (dlock's beat), and
	// stops at the gate, where its registration, made by its last attempt,
	// lasts 1.5s: the locks are released at once, not one after the
	// other, which on a loaded machine outlasted the registrations of the
	// last waiters.
	await(t, "waiter stopped at the gate", func() bool { return stopped.Load() == n })
	var releases sync.WaitGroup
	for i, l := range held {
		releasing[i].Store(true)
		releases.Add(1)
		go func() {
			defer releases.Done()
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release of lock %d after the failover: %v", i, err)
			}
		}()
	}
	releases.Wait()
	// Every lock was granted by its release to its waiter, held at the
	// gate, where no attempt of its own could take it: the lock is held.
	granted := 0
	for i := range n {
		info, err := holder.Inspect(ctx, name(i))
		switch {
		case err != nil:
			t.Errorf("Inspect of lock %d after its release: %v", i, err)
		case len(info.Holders) == 0:
			t.Errorf("lock %d was free after its release, its waiter passed over (registered with %d clients)", i, info.WaitingClients)
		default:
			granted++
		}
	}
	open()
	wg.Wait()
	close(results)
	got, byAttempt := 0, 0
	for res := range results {
		if res.err != nil {
			t.Errorf("waiter %d: %v", res.i, res.err)
			continue
		}
		got++
		if res.bad {
			t.Errorf("waiter %d obtained its lock before its holder released it", res.i)
		}
		mu.Lock()
		k, a := failed[name(res.i)], attempts[name(res.i)]
		mu.Unlock()
		if a > k {
			byAttempt++ // a grant found by its attempt, not by its notice
		}
		_ = res.l.Release(ctx)
	}
	t.Logf("%d of %d waiters obtained their lock after the failover, %d granted by the release (%d taken up by an attempt rather than on its notice); failover seen %v after it began, the waiting client listening on the new primary %v after that",
		got, n, granted, byAttempt, seen.Sub(start).Round(time.Millisecond), listening.Sub(seen).Round(time.Millisecond))
}
