package dlock_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// failoverClient returns a dlock client over a go-redis failover client of
// r's sentinels with the given pool size (0: go-redis's default), both
// closed with the test.
func failoverClient(t *testing.T, r *redistest.Replicated, poolSize int) *dlock.Client {
	t.Helper()
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: r.MasterName, SentinelAddrs: r.SentinelAddrs(), PoolSize: poolSize})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// failOver makes r's primary fail over, by killing it or by SENTINEL
// FAILOVER, and waits until the sentinels name the replica, which it
// returns, with the time the switch was seen.
func failOver(t *testing.T, r *redistest.Replicated, kill bool) (*redistest.Server, time.Time) {
	t.Helper()
	old := r.Primary.Addr()
	if kill {
		r.Primary.Kill(t)
	} else {
		r.Sentinels[0].Do(t, "SENTINEL", "FAILOVER", r.MasterName)
	}
	for deadline := time.Now().Add(20 * time.Second); r.CurrentPrimary(t) == old; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no failover within 20s")
		}
	}
	if got := r.CurrentPrimary(t); got != r.Replicas[0].Addr() {
		t.Fatalf("the sentinels name %s, not the replica %s", got, r.Replicas[0].Addr())
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

// TestAutoRefreshedLocksThroughASentinelFailover: a client of a Sentinel
// deployment holds many locks refreshed automatically, taken one after the
// other so that their refreshes go in many pipelines (over a small pool,
// whose share holds some back), while the primary fails over to its replica,
// which had every lock. Each lock is then either refreshed on the new
// primary (its deadline moves past the failover, the key there holds its
// token) or told lost (Done, ErrLost); a second client obtains none whose
// holder was not told; Refresh and Release right after the failover succeed
// on those held, and report the loss of the others.
func TestAutoRefreshedLocksThroughASentinelFailover(t *testing.T) {
	for _, tc := range []struct {
		name     string
		kill     bool
		replicas bool
		pool     int
	}{
		{"Killed", true, false, 0},
		{"KilledSmallPool", true, false, 3},
		{"KilledWithReplicas", true, true, 3},
		{"SentinelFailoverWithReplicas", false, true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testAutoRefreshedFailover(t, tc.kill, tc.replicas, tc.pool)
		})
	}
}

func testAutoRefreshedFailover(t *testing.T, kill, replicas bool, pool int) {
	const n, ttl = 200, 8 * time.Second
	r := redistest.StartReplicated(t, 1, 3)
	holder := failoverClient(t, r, pool)
	other := failoverClient(t, r, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := []dlock.Option{dlock.WithTTL(ttl), dlock.WithAutoRefresh()}
	if replicas {
		opts = append(opts, dlock.WithReplicas(1, 500*time.Millisecond))
	}
	locks := make([]*dlock.Lock, n)
	for i := range locks {
		l, err := holder.TryLock(ctx, "fo:"+strconv.Itoa(i), opts...)
		if err != nil {
			t.Fatal(err)
		}
		locks[i] = l
	}
	// The replica has every lock.
	if got := r.Primary.Do(t, "WAIT", "1", "5000"); got != "1" {
		t.Fatalf("WAIT 1 = %s", got)
	}
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
	t.Logf("%d locks: %d lost (told), %d taken by another while held; switch seen %v", n, lost, doubled, seen.Format("15:04:05.000"))
}

// TestWaitersThroughASentinelFailover: callers of one client wait in Lock
// for locks another client holds while the primary fails over; the waiting
// client's subscription follows the new primary, and once the holders
// release the locks there each waiter obtains its lock, never while its
// holder had not yet begun to release it.
func TestWaitersThroughASentinelFailover(t *testing.T) {
	for _, kill := range []bool{true, false} {
		name := "Killed"
		if !kill {
			name = "SentinelFailover"
		}
		t.Run(name, func(t *testing.T) { testWaitersFailover(t, kill) })
	}
}

func testWaitersFailover(t *testing.T, kill bool) {
	const n = 100
	r := redistest.StartReplicated(t, 1, 3)
	holder := failoverClient(t, r, 0)
	waiter := failoverClient(t, r, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	held := make([]*dlock.Lock, n)
	for i := range held {
		l, err := holder.TryLock(ctx, "w:"+strconv.Itoa(i), dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		held[i] = l
	}
	var releasing [n]atomic.Bool
	var retries atomic.Int64
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
			l, err := waiter.Lock(ctx, "w:"+strconv.Itoa(i), dlock.WithTTL(time.Minute), dlock.WithMaxWait(40*time.Second),
				dlock.WithOnRetry(func(int, error) { retries.Add(1) }))
			results <- result{i, l, err, err == nil && !releasing[i].Load()}
		}()
	}
	// Every waiter is registered.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		all := true
		for i := range n {
			if r.Primary.Do(t, "ZCARD", holder.RedisKey("w:"+strconv.Itoa(i))+":waiters") == "0" {
				all = false
				break
			}
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiters did not all register within 10s")
		}
	}
	if got := r.Primary.Do(t, "WAIT", "1", "5000"); got != "1" {
		t.Fatalf("WAIT 1 = %s", got)
	}
	next, _ := failOver(t, r, kill)
	// The waiting client listens on the new primary.
	for deadline := time.Now().Add(10 * time.Second); next.PubSubConnections(t) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no subscription on the new primary within 10s of the failover")
		}
	}
	for i, l := range held {
		releasing[i].Store(true)
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release of lock %d after the failover: %v", i, err)
		}
	}
	wg.Wait()
	close(results)
	got := 0
	for res := range results {
		if res.err != nil {
			t.Errorf("waiter %d: %v", res.i, res.err)
			continue
		}
		got++
		if res.bad {
			t.Errorf("waiter %d obtained its lock before its holder released it", res.i)
		}
		_ = res.l.Release(ctx)
	}
	t.Logf("%d of %d waiters obtained their lock after the failover; %d retries", got, n, retries.Load())
}
