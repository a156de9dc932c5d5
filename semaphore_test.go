package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

func TestSemaphoreLetsNHoldersIn(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.c.Semaphore("pool", 2)
	a, err := s.TryAcquire(ctx, dlock.WithMetadata("worker a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.newClient(t).Semaphore("pool", 2).TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquire(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("third holder of two permits: err = %v, want ErrNotObtained", err)
	}
	if a.Token() == b.Token() || a.Mode() != dlock.ModePermit || a.Fence() != 0 || a.Metadata() != "worker a" {
		t.Errorf("permits: tokens %q %q, mode %q, fence %d, metadata %q", a.Token(), b.Token(), a.Mode(), a.Fence(), a.Metadata())
	}
	if err := a.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if left, err := a.TTL(ctx); err != nil || left <= 50*time.Second {
		t.Errorf("TTL after refresh = %v, %v", left, err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("second release: err = %v, want ErrNotHeld", err)
	}
	c, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	for _, l := range []*dlock.Lock{b, c} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if e.exists(t, "dlock:{pool}") || e.exists(t, "dlock:{pool}:holds") {
		t.Errorf("keys left after the last release: %s", e.srv.Do(t, "KEYS", "*"))
	}
}

// A refusal says the count the acquire was judged against, so that a caller
// whose Semaphore was made with another count than the holders' can tell
// why it is kept out while Inspect shows a permit free.
func TestASemaphoreRefusalSaysItsCount(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, err := e.c.Semaphore("counted", 2).TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(ctx)
	one := e.newClient(t).Semaphore("counted", 1)
	_, err = one.TryAcquire(ctx)
	if !errors.Is(err, dlock.ErrNotObtained) || !strings.Contains(err.Error(), "this Semaphore's count: 1") {
		t.Errorf("TryAcquire with a count of 1 = %v, want ErrNotObtained saying the count", err)
	}
	_, err = one.Acquire(ctx, dlock.WithMaxWait(100*time.Millisecond))
	if !errors.Is(err, dlock.ErrNotObtained) || !strings.Contains(err.Error(), "this Semaphore's count: 1") {
		t.Errorf("Acquire with a count of 1 = %v, want ErrNotObtained saying the count", err)
	}
	l, err := e.c.TryLock(ctx, "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if _, err := e.c.TryLock(ctx, "plain"); !errors.Is(err, dlock.ErrNotObtained) || strings.Contains(err.Error(), "Semaphore's count") {
		t.Errorf("an exclusive lock's refusal = %v, want ErrNotObtained without a count", err)
	}
}

// TestSemaphoreUnderContention has 16 workers, each with its own client,
// take one of 3 permits 15 times each; no more than 3 may ever be inside.
func TestSemaphoreUnderContention(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const workers, rounds, permits = 16, 15, 3
	var inside, most, total atomic.Int32
	var wg sync.WaitGroup
	for range workers {
		s := e.newClient(t).Semaphore("contended", permits)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				l, err := s.Acquire(ctx, dlock.WithTTL(5*time.Second))
				if err != nil {
					t.Error(err)
					return
				}
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(200 * time.Microsecond)
				inside.Add(-1)
				total.Add(1)
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if most.Load() > permits {
		t.Errorf("%d holders at once, permits %d", most.Load(), permits)
	}
	if total.Load() != workers*rounds {
		t.Errorf("%d acquisitions, want %d", total.Load(), workers*rounds)
	}
	t.Logf("at most %d holders at once", most.Load())
}

func TestSemaphoreCrashedHolderExpiresWhileOthersRefresh(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := e.c.Semaphore("workers", 2)
	kept, err := s.TryAcquire(ctx, dlock.WithTTL(2*time.Second), dlock.WithRefreshInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// The other holder crashes: it never refreshes or releases.
	if _, err := e.newClient(t).Semaphore("workers", 2).TryAcquire(ctx, dlock.WithTTL(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// A retry interval far longer than the context proves the waiter woke
	// when the crashed holder's permit expired.
	l, err := e.newClient(t).Semaphore("workers", 2).Acquire(ctx, dlock.WithRetry(dlock.ConstantBackoff(time.Hour)))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if kept.Err() != nil {
		t.Errorf("the refreshed holder lost its permit: %v", kept.Err())
	}
	info, err := e.c.Inspect(ctx, "workers")
	if err != nil || len(info.Holders) != 2 {
		t.Fatalf("Inspect = %+v, %v; want the refreshed holder and the new one", info, err)
	}
	_ = l.Release(ctx)
	_ = kept.Release(ctx)
}

func TestSemaphoreReentrantOwner(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.c.Semaphore("reent", 2)
	first, err := s.TryAcquire(ctx, dlock.WithOwner("job-3"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := e.newClient(t).Semaphore("reent", 2).TryAcquire(ctx, dlock.WithOwner("job-3"))
	if err != nil || second.Token() != first.Token() {
		t.Fatalf("re-entry: %v, token %q, first %q", err, second.Token(), first.Token())
	}
	info, err := e.c.Inspect(ctx, "reent")
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Count != 2 || info.Holders[0].Owner != "job-3" {
		t.Fatalf("Inspect = %+v, %v; want one permit held twice", info, err)
	}
	other, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("a re-entry took a second permit: %v", err)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquire(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("the owner's permit was freed while it held it once: err = %v", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquire(ctx); err != nil {
		t.Errorf("the owner's permit was not freed: %v", err)
	}
	_ = other.Release(ctx)
}

// TestSemaphorePermitCountChanges: the count of each acquire bounds it; a
// lower count lets nobody in until enough have left and revokes nothing, a
// higher one lets more in at once, also into an Acquire that waits.
func TestSemaphorePermitCountChanges(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.c.Semaphore("elastic", 3)
	var held []*dlock.Lock
	for range 3 {
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	if err := s.SetPermits(1); err != nil || s.Permits() != 1 {
		t.Fatalf("SetPermits(1): %v, Permits() = %d", err, s.Permits())
	}
	for i, l := range held {
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Errorf("holder %d lost its permit to a lower count: %v", i, err)
		}
	}
	for i, l := range held {
		if _, err := s.TryAcquire(ctx); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("%d of 1 permits held: err = %v, want ErrNotObtained", 3-i, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	one, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("no permit held, count 1: %v", err)
	}
	if err := s.SetPermits(4); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := s.TryAcquire(ctx); err != nil {
			t.Fatalf("count raised to 4: %v", err)
		}
	}
	if _, err := s.TryAcquire(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("5th of 4: err = %v", err)
	}
	if info, err := e.c.Inspect(ctx, "elastic"); err != nil || info.Permits != 4 || len(info.Holders) != 4 {
		t.Errorf("Inspect = %+v, %v; want 4 holders of 4 permits", info, err)
	}
	// A handle with a lower count is held to it, and revokes nothing.
	if _, err := e.newClient(t).Semaphore("elastic", 2).TryAcquire(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("count 2 with 4 held: err = %v", err)
	}
	// A raise lets a waiting Acquire in at its next attempt.
	w := e.newClient(t).Semaphore("elastic", 4)
	raised := false
	l, err := w.Acquire(ctx, dlock.WithRetry(dlock.ConstantBackoff(time.Millisecond)), dlock.WithMaxWait(5*time.Second),
		dlock.WithOnRetry(func(n int, err error) {
			if !raised {
				raised = true
				_ = w.SetPermits(5)
			}
		}))
	if err != nil || !raised {
		t.Fatalf("Acquire after a raise: %v (raised %v)", err, raised)
	}
	_ = l.Release(ctx)
	_ = one.Release(ctx)
	for _, n := range []int{0, -1} {
		if err := s.SetPermits(n); !errors.Is(err, dlock.ErrInvalidPermits) || !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Errorf("SetPermits(%d): err = %v, want ErrInvalidPermits", n, err)
		}
	}
	if s.Permits() != 4 {
		t.Errorf("a refused SetPermits changed the count to %d", s.Permits())
	}
}

// TestPermitsFreedTogetherWakeAsManyClients: two permits are freed one
// right after the other while two clients wait, before the first client
// woken has tried again. Each release wakes a client of its own, so both
// get in by notices alone (their periodic wake-ups and the holders'
// expiries are a minute away); before, both notices went to the first.
func TestPermitsFreedTogetherWakeAsManyClients(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const name, waiters = "burst", "dlock:{burst}:waiters"
	var held []*dlock.Lock
	for range 2 {
		l, err := e.c.Semaphore(name, 2).TryAcquire(ctx, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	// The first client's attempts after the releases wait until both are
	// done.
	var armed atomic.Bool
	releasesDone := make(chan struct{})
	d := &hookDriver{Driver: e.newDriver(t), before: func(calls []*dlock.Call) {
		if armed.Load() && calls[0].Script.Name == "sem_acquire" {
			<-releasesDone
		}
	}}
	first := dlock.New(d)
	t.Cleanup(func() { _ = first.Close() })
	second := e.newClient(t)
	var got []<-chan lockResult
	for i, c := range []*dlock.Client{first, second} {
		dlock.SetWaitBeat(c, time.Minute)
		s := c.Semaphore(name, 2)
		got = append(got, whenRefused(t, "Acquire", func(opts ...dlock.Option) (*dlock.Lock, error) { return s.Acquire(ctx, opts...) },
			dlock.WithTTL(time.Minute)))
		awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", waiters) == strconv.Itoa(i+1) })
	}
	armed.Store(true)
	for _, l := range held {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	close(releasesDone)
	// Neither lets the other in by its release before both are in.
	for i, ch := range got {
		r := <-ch
		if r.err != nil {
			t.Fatalf("waiting client %d: %v", i+1, r.err)
		}
		defer r.l.Release(context.Background())
	}
}

// Inspect reports a permit count as given, however large.
func TestInspectReportsHugePermitCounts(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, n := range []int{math.MaxInt, 1<<53 + 1} {
		l, err := e.c.Semaphore("huge", n).TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		info, err := e.c.Inspect(ctx, "huge")
		if err != nil {
			t.Fatal(err)
		}
		if info.Permits != n {
			t.Errorf("Inspect after an acquire with %d permits: Permits %d", n, info.Permits)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestARaisedCountWakesTheWaitingAcquires: SetPermits raising the count
// lets the callers waiting on that client in at once, not at their next
// periodic wake-up or the holder's expiry (both a minute away here).
func TestARaisedCountWakesTheWaitingAcquires(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	held, err := e.c.Semaphore("raise", 1).TryAcquire(ctx, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	c := e.newClient(t)
	dlock.SetWaitBeat(c, time.Minute)
	s := c.Semaphore("raise", 1)
	got := []<-chan lockResult{whenRefused(t, "Acquire", func(opts ...dlock.Option) (*dlock.Lock, error) { return s.Acquire(ctx, opts...) },
		dlock.WithTTL(time.Minute))}
	second := make(chan lockResult, 1)
	go func() {
		l, err := s.Acquire(ctx, dlock.WithTTL(time.Minute))
		second <- lockResult{l, err}
	}()
	got = append(got, second)
	awaitCond(t, 5*time.Second, func() bool { return dlock.Waiting(c, "raise") == 2 })
	if err := s.SetPermits(3); err != nil {
		t.Fatal(err)
	}
	for i, ch := range got {
		r := <-ch
		if r.err != nil {
			t.Fatalf("waiter %d after the raise: %v", i+1, r.err)
		}
		defer r.l.Release(context.Background())
	}
}

// TestACallerWithALargerCountDoesNotWaitBehindASmallerOne: the callers of
// one client waiting for a semaphore take turns, except that a caller
// whose count (another handle's, or a raised one) lets it in is not held
// up behind one whose smaller count does not: it gets in while that one
// still waits (a caller of another client, behind it in the waiter set,
// would get in at its next beat).
func TestACallerWithALargerCountDoesNotWaitBehindASmallerOne(t *testing.T) {
	e := newEnv(t)
	for _, raise := range []bool{false, true} {
		name := fmt.Sprintf("counts-%v", raise)
		t.Run(fmt.Sprintf("raised=%v", raise), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			held, err := e.c.Semaphore(name, 3).TryAcquire(ctx, dlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release(context.Background())
			c := e.newClient(t)
			dlock.SetWaitBeat(c, time.Minute)
			small, big := c.Semaphore(name, 1), c.Semaphore(name, 3)
			if raise {
				big = c.Semaphore(name, 1)
			}
			smallCtx, stopSmall := context.WithCancel(ctx)
			smallDone := make(chan error, 1)
			go func() {
				l, err := small.Acquire(smallCtx, dlock.WithTTL(time.Minute))
				if err == nil {
					err = l.Release(context.Background())
				}
				smallDone <- err
			}()
			awaitCond(t, 5*time.Second, func() bool { return dlock.Waiting(c, name) == 1 })
			bigCtx, stopBig := context.WithTimeout(ctx, 10*time.Second) // the small one waits 20s
			defer stopBig()
			bigDone := make(chan lockResult, 1)
			go func() {
				l, err := big.Acquire(bigCtx, dlock.WithTTL(time.Minute))
				bigDone <- lockResult{l, err}
			}()
			if raise {
				awaitCond(t, 5*time.Second, func() bool { return dlock.Waiting(c, name) == 2 })
				if err := big.SetPermits(3); err != nil {
					t.Fatal(err)
				}
			}
			r := <-bigDone
			if r.err != nil {
				t.Fatalf("a caller whose count lets it in, behind one whose count does not: %v", r.err)
			}
			if err := r.l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-smallDone:
				t.Fatalf("the caller with count 1 ended while 1 permit was held: %v", err)
			default:
			}
			stopSmall()
			if err := <-smallDone; !errors.Is(err, dlock.ErrNotObtained) {
				t.Fatalf("the caller with count 1: err = %v, want ErrNotObtained", err)
			}
		})
	}
}

// TestACutCountWakesTheCallerItLeavesFirst: a caller waiting behind one of
// the same client whose count is no smaller sleeps until that one moves;
// when SetPermits cuts that one's count below its own, it is first, and
// tries: here it gets in when a permit held expires (which no notice
// tells), while the caller ahead, with count 1, still waits.
func TestACutCountWakesTheCallerItLeavesFirst(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const name = "cut"
	long, err := e.c.Semaphore(name, 2).TryAcquire(ctx, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer long.Release(context.Background())
	if _, err := e.c.Semaphore(name, 2).TryAcquire(ctx, dlock.WithTTL(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	c := e.newClient(t)
	dlock.SetWaitBeat(c, time.Minute)
	ahead, behind := c.Semaphore(name, 2), c.Semaphore(name, 2)
	aheadCtx, stopAhead := context.WithCancel(ctx)
	aheadDone := make(chan error, 1)
	go func() {
		l, err := ahead.Acquire(aheadCtx, dlock.WithTTL(time.Minute))
		if err == nil {
			err = l.Release(context.Background())
		}
		aheadDone <- err
	}()
	awaitCond(t, 5*time.Second, func() bool { return dlock.Waiting(c, name) == 1 })
	behindCtx, stopBehind := context.WithTimeout(ctx, 10*time.Second)
	defer stopBehind()
	behindDone := make(chan lockResult, 1)
	go func() {
		l, err := behind.Acquire(behindCtx, dlock.WithTTL(time.Minute))
		behindDone <- lockResult{l, err}
	}()
	awaitCond(t, 5*time.Second, func() bool { return dlock.Waiting(c, name) == 2 })
	if err := ahead.SetPermits(1); err != nil {
		t.Fatal(err)
	}
	r := <-behindDone
	if r.err != nil {
		t.Fatalf("the caller left first by the cut, once a permit expired: %v", r.err)
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	stopAhead()
	if err := <-aheadDone; !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("the caller with count 1: err = %v, want ErrNotObtained", err)
	}
}

// TestSemaphoresOfManyNamesKeepNoState: a client that takes a permit of
// one semaphore after another, or waits for one until it is released,
// keeps nothing in memory for the names it is done with.
func TestSemaphoresOfManyNamesKeepNoState(t *testing.T) {
	e := newEnv(t)
	holder := e.newClient(t)
	ctx := context.Background()
	ttl := dlock.WithTTL(time.Minute)
	t.Run("permit", func(t *testing.T) {
		keepsNoStateByName(t, "permit", func(name string) error {
			l, err := e.c.Semaphore(name, 2).Acquire(ctx, ttl)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}, e.c)
	})
	t.Run("woken", func(t *testing.T) {
		keepsNoStateByName(t, "woken", func(name string) error {
			return wokenAfterRefusal(ctx, func() (*dlock.Lock, error) { return holder.Semaphore(name, 1).Acquire(ctx, ttl) },
				func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
					return e.c.Semaphore(name, 1).Acquire(ctx, append(opts, ttl)...)
				})
		}, e.c, holder)
	})
}
