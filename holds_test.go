package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/redis/go-redis/v9"
)

// The tests of this file check how the holds of read/write locks and
// semaphores are counted, kept and given back: re-entries, repeated and
// lost acquires, and what a hold's death leaves behind.

// holdKindCase is one kind of hold, obtained and contested on a name.
type holdKindCase struct {
	what string
	// obtain gets the hold on name for c, waiting (RLock, Lock, Acquire)
	// when wait is set.
	obtain func(ctx context.Context, c *dlock.Client, name string, wait bool, opts ...dlock.Option) (*dlock.Lock, error)
	// contest is a TryRLock, TryLock or TryAcquire that the hold keeps out.
	contest func(ctx context.Context, c *dlock.Client, name string) error
}

var holdKindCases = []holdKindCase{
	{"read", func(ctx context.Context, c *dlock.Client, name string, wait bool, opts ...dlock.Option) (*dlock.Lock, error) {
		if wait {
			return c.RWMutex(name).RLock(ctx, opts...)
		}
		return c.RWMutex(name).TryRLock(ctx, opts...)
	}, func(ctx context.Context, c *dlock.Client, name string) error {
		return tryAndRelease(ctx)(c.RWMutex(name).TryLock(ctx))
	}},
	{"write", func(ctx context.Context, c *dlock.Client, name string, wait bool, opts ...dlock.Option) (*dlock.Lock, error) {
		if wait {
			return c.RWMutex(name).Lock(ctx, opts...)
		}
		return c.RWMutex(name).TryLock(ctx, opts...)
	}, func(ctx context.Context, c *dlock.Client, name string) error {
		return tryAndRelease(ctx)(c.RWMutex(name).TryRLock(ctx))
	}},
	{"permit", func(ctx context.Context, c *dlock.Client, name string, wait bool, opts ...dlock.Option) (*dlock.Lock, error) {
		if wait {
			return c.Semaphore(name, 1).Acquire(ctx, opts...)
		}
		return c.Semaphore(name, 1).TryAcquire(ctx, opts...)
	}, func(ctx context.Context, c *dlock.Client, name string) error {
		return tryAndRelease(ctx)(c.Semaphore(name, 1).TryAcquire(ctx))
	}},
}

// tryAndRelease returns a function that releases the hold a Try… obtained
// and reports the Try…'s error.
func tryAndRelease(ctx context.Context) func(*dlock.Lock, error) error {
	return func(l *dlock.Lock, err error) error {
		if err == nil {
			err = l.Release(ctx)
		}
		return err
	}
}

// holdCount is the count of the single hold Inspect reports on name.
func holdCount(t *testing.T, ctx context.Context, c *dlock.Client, name string) int {
	t.Helper()
	info, err := c.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) != 1 {
		t.Fatalf("Inspect %q: %d holders, want 1", name, len(info.Holders))
	}
	return info.Holders[0].Count
}

// steppedWaiter is a waiting acquire on a goroutine and a client of its
// own that does not subscribe. After each failed attempt it parks in its
// OnRetry hook, handing the attempt's error to the test, until the test
// lets it go on; it then waits delay and tries again.
type steppedWaiter struct {
	parked chan error
	next   chan struct{}
	done   chan stepResult
}

type stepResult struct {
	l   *dlock.Lock
	err error
}

// startStepped starts obtain on a client of its own over drv (which may
// lose replies).
func startStepped(ctx context.Context, drv *tapDriver, delay time.Duration,
	obtain func(ctx context.Context, c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error), opts ...dlock.Option) *steppedWaiter {
	w := &steppedWaiter{parked: make(chan error), next: make(chan struct{}), done: make(chan stepResult, 1)}
	c := dlock.New(noSubscribe{drv})
	opts = append(opts,
		dlock.WithRetry(dlock.RetryFunc(func(int) (time.Duration, bool) { return delay, true })),
		dlock.WithOnRetry(func(_ int, err error) {
			select {
			case w.parked <- err:
				select {
				case <-w.next:
				case <-ctx.Done():
				}
			case <-ctx.Done():
			}
		}))
	go func() {
		defer c.Close()
		l, err := obtain(ctx, c, opts...)
		w.done <- stepResult{l, err}
	}()
	return w
}

// park waits for the waiter's next failed attempt and returns its error.
func (w *steppedWaiter) park(t *testing.T) error {
	t.Helper()
	select {
	case err := <-w.parked:
		return err
	case r := <-w.done:
		t.Fatalf("the waiter returned (%v) instead of failing an attempt", r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter made no attempt for 10s")
	}
	return nil
}

// finish lets a parked waiter go on and waits for its acquire to return.
func (w *steppedWaiter) finish(t *testing.T) (*dlock.Lock, error) {
	t.Helper()
	w.next <- struct{}{}
	for {
		select {
		case r := <-w.done:
			return r.l, r.err
		case err := <-w.parked:
			t.Errorf("the waiter failed again: %v", err)
			w.next <- struct{}{}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter did not return within 10s")
		}
	}
}

// TestAnExpiredWriteHoldStaysDead: a write hold that expired while a
// refused waiter kept the name's hash alive is not revived next to the
// writer that came after it, neither by its owner's re-entry nor by its
// own request token, and fences keep growing.
func TestAnExpiredWriteHoldStaysDead(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, err := e.c.RWMutex("ghost").TryLock(ctx, dlock.WithOwner("job"), dlock.WithTTL(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// Another writer waits with a longer TTL: its refused attempt records
	// it and keeps the name's keys alive for its TTL.
	w := startStepped(ctx, e.newDriver(t), 20*time.Millisecond, func(ctx context.Context, c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error) {
		return c.RWMutex("ghost").Lock(ctx, opts...)
	}, dlock.WithTTL(10*time.Second))
	if err := w.park(t); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("the waiter's first attempt: %v", err)
	}
	base, _ := strconv.Atoi(e.srv.Do(t, "PTTL", "dlock:{ghost}"))
	holds, _ := strconv.Atoi(e.srv.Do(t, "PTTL", "dlock:{ghost}:holds"))
	if base < 5000 || holds < base-100 {
		t.Errorf("after the waiter's record: PTTL %d ms of the hash, %d of the holds key; want the holds key to live as long", base, holds)
	}
	// a runs out; the waiter tries again some time after that.
	for {
		if _, err := a.TTL(ctx); errors.Is(err, dlock.ErrNotHeld) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			t.Fatal("a never expired")
		}
		time.Sleep(5 * time.Millisecond) // no notice of an expiry to wait for
	}
	b, err := w.finish(t)
	if err != nil {
		t.Fatalf("the waiter after a expired: %v", err)
	}
	if b.Fence() <= a.Fence() {
		t.Errorf("fence %d after %d", b.Fence(), a.Fence())
	}
	other := e.newClient(t).RWMutex("ghost")
	if l, err := other.TryLock(ctx, dlock.WithOwner("job")); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("the expired hold's owner re-entered it next to the live writer: err = %v, fence %d (live writer's %d)", err, l.Fence(), b.Fence())
	}
	if l, err := other.TryLock(ctx, dlock.WithToken(a.Token())); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("the expired hold's token repeated its acquire next to the live writer: err = %v, fence %d", err, l.Fence())
	}
	if info, err := e.c.Inspect(ctx, "ghost"); err != nil || len(info.Holders) != 1 || info.Holders[0].Fence != b.Fence() {
		t.Errorf("Inspect = %+v, %v; want the live writer alone", info, err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAHoldReentryWhoseReplyWasLostIsTakenBack: an owner's re-entry that
// ran but lost its reply is taken back by the cleanup that follows, once,
// so that the first acquisition's release frees the name.
func TestAHoldReentryWhoseReplyWasLostIsTakenBack(t *testing.T) {
	for _, k := range holdKindCases {
		t.Run(k.what, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			first, err := k.obtain(ctx, e.c, "lost", false, dlock.WithOwner("o"), dlock.WithTTL(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			e.drv.loseReplies(1)
			if _, err := k.obtain(ctx, e.c, "lost", false, dlock.WithOwner("o")); !errors.Is(err, errLostReply) {
				t.Fatalf("re-entry with its reply lost: err = %v, want the transport error", err)
			}
			if n := holdCount(t, ctx, e.c, "lost"); n != 1 {
				t.Errorf("count %d after the lost re-entry was taken back, want 1", n)
			}
			if err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := k.contest(ctx, e.newClient(t), "lost"); err != nil {
				t.Errorf("after the first acquisition's release: %v", err)
			}
		})
	}
}

// TestALostHoldReentryIsTakenBackThoughOthersCameAndWent: a re-entry's
// reply is lost, and before its clean-up runs the owner takes and releases
// two more acquisitions of the hold. Each release forgets its own record,
// not the oldest: the clean-up still finds the lost one's and takes its
// count back, and the first acquisition's release frees the name.
func TestALostHoldReentryIsTakenBackThoughOthersCameAndWent(t *testing.T) {
	for _, k := range holdKindCases {
		t.Run(k.what, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			own := dlock.WithOwner("o")
			first, err := k.obtain(ctx, e.c, "came", false, own, dlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			var meanwhile error
			e.drv.loseReplyThen(func() {
				other := e.newClient(t)
				var later []*dlock.Lock
				for range 2 {
					l, err := k.obtain(ctx, other, "came", false, own, dlock.WithTTL(time.Minute))
					if err != nil {
						meanwhile = err
						return
					}
					later = append(later, l)
				}
				for _, l := range later {
					if err := l.Release(ctx); err != nil {
						meanwhile = err
					}
				}
			})
			if _, err := k.obtain(ctx, e.c, "came", false, own); !errors.Is(err, errLostReply) {
				t.Fatalf("re-entry with its reply lost: err = %v, want the transport error", err)
			}
			if meanwhile != nil {
				t.Fatal(meanwhile)
			}
			if n := holdCount(t, ctx, e.c, "came"); n != 1 {
				t.Errorf("count %d after the lost re-entry was taken back, want 1", n)
			}
			if err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := k.contest(ctx, e.newClient(t), "came"); err != nil {
				t.Errorf("after the first acquisition's release: %v", err)
			}
		})
	}
}

// TestAnInterleavedRetryOfAReentryCountsOnce: a waiting re-entry whose
// reply was lost tries again with the same request after another re-entry
// of the same owner: the retry joins nothing twice.
func TestAnInterleavedRetryOfAReentryCountsOnce(t *testing.T) {
	for _, k := range holdKindCases {
		t.Run(k.what, func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			first, err := k.obtain(ctx, e.c, "retry", false, dlock.WithOwner("o"))
			if err != nil {
				t.Fatal(err)
			}
			drv := e.newDriver(t)
			drv.loseReplies(1)
			w := startStepped(ctx, drv, 0, func(ctx context.Context, c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error) {
				return k.obtain(ctx, c, "retry", true, opts...)
			}, dlock.WithOwner("o"))
			if err := w.park(t); !errors.Is(err, errLostReply) {
				t.Fatalf("the waiter's first attempt: %v, want its reply lost", err)
			}
			second, err := k.obtain(ctx, e.c, "retry", false, dlock.WithOwner("o"))
			if err != nil {
				t.Fatal(err)
			}
			third, err := w.finish(t)
			if err != nil {
				t.Fatalf("the waiter's retry: %v", err)
			}
			if n := holdCount(t, ctx, e.c, "retry"); n != 3 {
				t.Errorf("count %d after three acquisitions, want 3", n)
			}
			for _, l := range []*dlock.Lock{third, second, first} {
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := k.contest(ctx, e.newClient(t), "retry"); err != nil {
				t.Errorf("after every acquisition's release: %v", err)
			}
		})
	}
}

// TestAWaiterThatReentersLeavesNoRecord: a waiter recorded in a read/write
// lock that gets in by joining its owner's hold takes its record back, so
// that it keeps no one out once the hold is released.
func TestAWaiterThatReentersLeavesNoRecord(t *testing.T) {
	for _, tc := range []struct {
		what  string
		opts  []dlock.RWOption
		write bool // the waiter's mode
	}{
		{"writer", nil, true},
		{"fair reader", []dlock.RWOption{dlock.Fair()}, false},
	} {
		t.Run(tc.what, func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			m := e.c.RWMutex("rejoin", tc.opts...)
			// The name is held in the mode that keeps the waiter out.
			var blocker *dlock.Lock
			var err error
			if tc.write {
				blocker, err = m.TryRLock(ctx)
			} else {
				blocker, err = m.TryLock(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			w := startStepped(ctx, e.newDriver(t), 0, func(ctx context.Context, c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error) {
				if tc.write {
					return c.RWMutex("rejoin", tc.opts...).Lock(ctx, opts...)
				}
				return c.RWMutex("rejoin", tc.opts...).RLock(ctx, opts...)
			}, dlock.WithOwner("o"), dlock.WithTTL(time.Minute))
			if err := w.park(t); !errors.Is(err, dlock.ErrNotObtained) {
				t.Fatalf("the waiter's first attempt: %v", err)
			}
			if err := blocker.Release(ctx); err != nil {
				t.Fatal(err)
			}
			// The owner gets in by another call; the waiter joins it.
			var held *dlock.Lock
			if tc.write {
				held, err = m.TryLock(ctx, dlock.WithOwner("o"))
			} else {
				held, err = m.TryRLock(ctx, dlock.WithOwner("o"))
			}
			if err != nil {
				t.Fatal(err)
			}
			joined, err := w.finish(t)
			if err != nil {
				t.Fatalf("the waiter: %v", err)
			}
			if joined.Token() != held.Token() {
				t.Errorf("the waiter got token %q, the owner's hold is %q", joined.Token(), held.Token())
			}
			if info, err := e.c.Inspect(ctx, "rejoin"); err != nil || info.Waiters != 0 || info.WriterWaiting {
				t.Errorf("Inspect = %+v, %v; want no waiter recorded", info, err)
			}
			for _, l := range []*dlock.Lock{joined, held} {
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// Released: nobody waits, so anyone gets in at once.
			contest := m.TryRLock
			if !tc.write {
				contest = m.TryLock
			}
			if err := tryAndRelease(ctx)(contest(ctx)); err != nil {
				t.Errorf("after the re-entered hold's release: %v", err)
			}
		})
	}
}

// TestAShorterReentryDoesNotCutTheHoldShort: a hold acquired several times
// lives as long as the longest of its acquisitions' TTLs and refreshes;
// once held by one acquisition, a refresh may shorten it again.
func TestAShorterReentryDoesNotCutTheHoldShort(t *testing.T) {
	for _, k := range holdKindCases {
		t.Run(k.what, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			first, err := k.obtain(ctx, e.c, "short", false, dlock.WithOwner("o"), dlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			second, err := k.obtain(ctx, e.newClient(t), "short", false, dlock.WithOwner("o"), dlock.WithTTL(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if left, err := first.TTL(ctx); err != nil || left < 50*time.Second {
				t.Errorf("TTL after a re-entry with 1s = %v, %v; want the first's minute", left, err)
			}
			if err := second.Refresh(ctx, time.Second); err != nil {
				t.Fatal(err)
			}
			if left, err := first.TTL(ctx); err != nil || left < 50*time.Second {
				t.Errorf("TTL after a refresh with 1s = %v, %v; want the first's minute", left, err)
			}
			if pttl, _ := strconv.Atoi(e.srv.Do(t, "PTTL", "dlock:{short}")); pttl < 50_000 {
				t.Errorf("base key PTTL = %d ms, shorter than the hold", pttl)
			}
			if err := second.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := first.Refresh(ctx, 2*time.Second); err != nil {
				t.Fatal(err)
			}
			if left, err := first.TTL(ctx); err != nil || left > 2*time.Second {
				t.Errorf("TTL of a hold held once, refreshed to 2s = %v, %v", left, err)
			}
			if err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAHoldSharedByATokenIsOnlyExtended: a second Lock of the same token
// (WithToken) joins the hold, by an acquire with a shorter TTL or by a
// Refresh with one: the hold keeps the first Lock's minute, or another
// client would take the name while the first Lock still holds it.
func TestAHoldSharedByATokenIsOnlyExtended(t *testing.T) {
	for _, k := range holdKindCases {
		for _, how := range []string{"acquire", "refresh"} {
			t.Run(k.what+"/"+how, func(t *testing.T) {
				e := newEnv(t)
				ctx := context.Background()
				token := dlock.WithToken("shared-token")
				first, err := k.obtain(ctx, e.c, "shared", false, token, dlock.WithTTL(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				ttl := time.Second
				if how == "refresh" {
					ttl = time.Minute
				}
				second, err := k.obtain(ctx, e.newClient(t), "shared", false, token, dlock.WithTTL(ttl))
				if err != nil {
					t.Fatal(err)
				}
				if how == "refresh" {
					if err := second.Refresh(ctx, time.Second); err != nil {
						t.Fatal(err)
					}
				}
				if left, err := first.TTL(ctx); err != nil || left < 50*time.Second {
					t.Errorf("TTL after the second Lock's %s with 1s = %v, %v; want the first's minute", how, left, err)
				}
				if err := first.Release(ctx); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// An owner that gave its token (WithToken) and released that acquisition
// while its re-entries kept the hold re-enters it when it gives the token
// again, as with an exclusive lock; without the owner, the token is
// refused. Every kind, in both script modes.
func TestAnOwnerGivingItsTokenAgainReentersItsHold(t *testing.T) {
	exclusive := holdKindCase{"exclusive", func(ctx context.Context, c *dlock.Client, name string, _ bool, opts ...dlock.Option) (*dlock.Lock, error) {
		return c.TryLock(ctx, name, opts...)
	}, nil}
	for _, k := range append([]holdKindCase{exclusive}, holdKindCases...) {
		for _, functions := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/functions=%v", k.what, functions), func(t *testing.T) {
				e := newEnv(t)
				ctx := context.Background()
				var opts []dlock.ClientOption
				if functions {
					opts = append(opts, dlock.WithFunctions())
				}
				c := dlock.New(e.newDriver(t), opts...)
				defer c.Close()
				owner, token := dlock.WithOwner("O"), dlock.WithToken("T")
				first, err := k.obtain(ctx, c, "given", false, owner, token)
				if err != nil {
					t.Fatal(err)
				}
				keep, err := k.obtain(ctx, c, "given", false, owner)
				if err != nil {
					t.Fatal(err)
				}
				if err := first.Release(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := k.obtain(ctx, c, "given", false, token); !errors.Is(err, dlock.ErrNotObtained) {
					t.Errorf("the token without its owner: err = %v, want ErrNotObtained", err)
				}
				again, err := k.obtain(ctx, c, "given", false, owner, token)
				if err != nil {
					t.Fatalf("the owner giving its token again: %v", err)
				}
				if again.Token() != "T" || holdCount(t, ctx, c, "given") != 2 {
					t.Errorf("re-entry: token %q, count %d; want T, 2", again.Token(), holdCount(t, ctx, c, "given"))
				}
				for _, l := range []*dlock.Lock{again, keep} {
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				if info, err := c.Inspect(ctx, "given"); err != nil || len(info.Holders) != 0 {
					t.Errorf("after every release: %+v, %v; want the name free", info, err)
				}
			})
		}
	}
}

// TestAHoldReleaseLeavesForeignDataAtTheMarkerAlone: a release whose
// release marker key holds data dlock did not write (written there while
// the hold was held: an acquire refuses it, see
// TestAHoldAcquireRefusesForeignDataAtTheMarker) fails with ErrWrongType,
// changing nothing; the string marker an exclusive lock of an older dlock
// left there (it expires within a minute) is replaced.
func TestAHoldReleaseLeavesForeignDataAtTheMarkerAlone(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const marker = "dlock:{marked}:released"
	for _, tc := range []struct {
		what, typ string
		write     func()
		dump      []string // the command that reads it back, after the key
	}{
		{"string", "string", func() { e.srv.Do(t, "SET", marker, "user data") }, []string{"GET"}},
		{"hash", "hash", func() { e.srv.Do(t, "HSET", marker, "f", "v") }, []string{"HGETALL"}},
		{"sorted set without expiry", "zset", func() { e.srv.Do(t, "ZADD", marker, "1", "m") },
			[]string{"ZRANGE", "", "0", "-1", "WITHSCORES"}},
		{"sorted set expiring after a minute", "zset", func() {
			e.srv.Do(t, "ZADD", marker, "1", "m")
			e.srv.Do(t, "EXPIRE", marker, "3600")
		}, []string{"ZRANGE", "", "0", "-1", "WITHSCORES"}},
	} {
		// read returns the marker's type and, while it is still tc's, its
		// content.
		read := func() string {
			typ := e.srv.Do(t, "TYPE", marker)
			if typ != tc.typ {
				return typ
			}
			args := append([]string{tc.dump[0], marker}, tc.dump[min(2, len(tc.dump)):]...)
			return typ + " " + e.srv.Do(t, args...)
		}
		for _, k := range holdKindCases {
			e.srv.Do(t, "DEL", marker)
			if _, err := k.obtain(ctx, e.c, "marked", false, dlock.WithOwner("o")); err != nil {
				t.Fatalf("%s, %s: %v", tc.what, k.what, err)
			}
			inner, err := k.obtain(ctx, e.c, "marked", false, dlock.WithOwner("o"))
			if err != nil {
				t.Fatalf("%s, %s: %v", tc.what, k.what, err)
			}
			tc.write()
			before := read()
			if err := inner.Release(ctx); !errors.Is(err, dlock.ErrWrongType) || errors.Is(err, dlock.ErrNotHeld) {
				t.Errorf("%s at the marker, %s: Release err = %v, want ErrWrongType, not ErrNotHeld", tc.what, k.what, err)
			}
			if err := inner.Err(); err != nil {
				t.Errorf("%s at the marker, %s: a refused release ended the lock: %v", tc.what, k.what, err)
			}
			if after := read(); after != before {
				t.Errorf("%s at the marker, %s: %q became %q", tc.what, k.what, before, after)
			}
			if n := holdCount(t, ctx, e.c, "marked"); n != 2 {
				t.Errorf("%s at the marker, %s: count %d after a refused release, want 2", tc.what, k.what, n)
			}
			if _, err := e.c.ForceRelease(ctx, "marked"); err != nil {
				t.Fatal(err)
			}
		}
	}

	// An older dlock's exclusive release marker: a string that expires
	// within a minute. A client limited to dlock's commands replaces it.
	e.srv.Do(t, append([]string{"ACL", "SETUSER", "locker"}, aclRules...)...)
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), Username: "locker", Password: "s3cret"})
	t.Cleanup(func() { _ = rdb.Close() })
	limited := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = limited.Close() })
	for _, k := range holdKindCases {
		e.srv.Do(t, "SET", marker, "13377331", "PX", "60000")
		l, err := k.obtain(ctx, limited, "marked", false)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("%s: release beside an old exclusive marker: %v", k.what, err)
		}
		if typ := e.srv.Do(t, "TYPE", marker); typ != "zset" {
			t.Errorf("%s: the marker is a %s, want the release's sorted set", k.what, typ)
		}
		if e.exists(t, "dlock:{marked}") {
			t.Errorf("%s: the name's hash is left: %s", k.what, e.srv.Do(t, "KEYS", "*"))
		}
	}
}

// TestAHotNamesReleaseMarkerStaysSmall: a name released again and again
// within a minute keeps the records of its last 64 releases in its release
// marker, in Redis's compact encoding, where it kept every one for the
// minute (hundreds of thousands, tens of MB, at thousands of releases a
// second); but it keeps every record of the last two seconds, when a
// release sent again or a late copy of an acquire may still come. The
// records of a force release stay their minute: a holder it ended is
// still told so after many releases.
func TestAHotNamesReleaseMarkerStaysSmall(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// score is the score of a marker entry written ago before: when it is
	// forgotten, a minute after.
	score := func(ago time.Duration) string {
		t.Helper()
		sec, usec, _ := strings.Cut(e.srv.Do(t, "TIME"), "\n")
		s, _ := strconv.ParseInt(sec, 10, 64)
		us, _ := strconv.ParseInt(usec, 10, 64)
		return strconv.FormatInt(s*1000+us/1000+time.Minute.Milliseconds()-ago.Milliseconds(), 10)
	}
	// fill gives marker n entries as releases made ago before would have.
	fill := func(marker string, n int, ago time.Duration) {
		t.Helper()
		args, at := []string{"ZADD", marker}, score(ago)
		for i := range n {
			args = append(args, at, "r:filler"+strconv.Itoa(i))
		}
		e.srv.Do(t, args...)
		e.srv.Do(t, "PEXPIRE", marker, "60000")
	}
	const marker = "dlock:{hot}:released"
	for _, k := range holdKindCases {
		for _, tc := range []struct {
			filled, releases int
			ago              time.Duration
			want             string
		}{
			{120, 10, 10 * time.Second, "128"}, // the last 64 releases
			{200, 1, time.Second, "202"},       // every record of the last two seconds, and the release's own two
		} {
			fill(marker, tc.filled, tc.ago)
			for range tc.releases {
				l, err := k.obtain(ctx, e.c, "hot", false)
				if err != nil {
					t.Fatalf("%s: %v", k.what, err)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatalf("%s: %v", k.what, err)
				}
			}
			if n := e.srv.Do(t, "ZCARD", marker); n != tc.want {
				t.Errorf("%s: %d releases beside %d records made %v ago left %s entries in the marker, want %s",
					k.what, tc.releases, tc.filled, tc.ago, n, tc.want)
			}
			if enc := e.srv.Do(t, "OBJECT", "ENCODING", marker); tc.want == "128" && enc != "listpack" {
				t.Errorf("%s: the marker's encoding is %s, want listpack", k.what, enc)
			}
			e.srv.Do(t, "DEL", marker)
		}
	}

	// A force release's record, the oldest entry, stays.
	const forced = "dlock:{forced}:released"
	sem := e.c.Semaphore("forced", 3)
	ended, err := sem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.ForceRelease(ctx, "forced"); err != nil {
		t.Fatal(err)
	}
	for _, m := range strings.Fields(e.srv.Do(t, "ZRANGE", forced, "0", "-1")) {
		e.srv.Do(t, "ZADD", forced, "XX", score(20*time.Second), m)
	}
	fill(forced, 200, 10*time.Second)
	l, err := sem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.srv.Do(t, "ZCARD", forced); n != "129" {
		t.Errorf("the marker has %s entries, want 129: the last 64 releases and the force release's record", n)
	}
	if err := ended.Release(ctx); !errors.Is(err, dlock.ErrForceReleased) {
		t.Errorf("release of a permit force-released before 200 records: err = %v, want ErrForceReleased", err)
	}
}

// TestAHoldAcquireRefusesForeignDataAtTheMarker: a read hold, write hold or
// permit whose name's release marker holds data dlock did not write is
// refused with ErrWrongType, its token given or not, and nothing is
// written: a hold taken there could not be released. The string marker an
// exclusive lock of an older dlock left there (it expires within a minute)
// does not stop it (TestAHoldReleaseLeavesForeignDataAtTheMarkerAlone).
// By EVALSHA and as Redis Functions, whose library gives its helpers the
// call's KEYS, by which the error names the key.
func TestAHoldAcquireRefusesForeignDataAtTheMarker(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	fcall := e.newClient(t, dlock.WithFunctions())
	const marker = "dlock:{marked}:released"
	for _, tc := range []struct {
		what  string
		write func()
	}{
		{"string without expiry", func() { e.srv.Do(t, "SET", marker, "user data") }},
		{"string expiring after an hour", func() { e.srv.Do(t, "SET", marker, "user data", "EX", "3600") }},
		{"hash", func() { e.srv.Do(t, "HSET", marker, "f", "v") }},
		{"hash expiring within a minute", func() {
			e.srv.Do(t, "HSET", marker, "f", "v")
			e.srv.Do(t, "EXPIRE", marker, "30")
		}},
		{"sorted set without expiry", func() { e.srv.Do(t, "ZADD", marker, "1", "m") }},
		{"sorted set expiring after an hour", func() {
			e.srv.Do(t, "ZADD", marker, "1", "m")
			e.srv.Do(t, "EXPIRE", marker, "3600")
		}},
	} {
		for _, k := range holdKindCases {
			for i, given := range []bool{false, true, false, true} {
				c := e.c
				if i >= 2 {
					c = fcall
				}
				e.srv.Do(t, "DEL", marker)
				tc.write()
				before := e.srv.Do(t, "DUMP", marker)
				var opts []dlock.Option
				if given {
					opts = append(opts, dlock.WithToken("given-"+strings.ReplaceAll(k.what, " ", "-")))
				}
				if l, err := k.obtain(ctx, c, "marked", false, opts...); !errors.Is(err, dlock.ErrWrongType) || !strings.Contains(err.Error(), ":released") {
					t.Errorf("%s at the marker, %s (token given: %v, FCALL: %v): err = %v, want ErrWrongType naming the marker", tc.what, k.what, given, i >= 2, err)
					if l != nil {
						_, _ = e.c.ForceRelease(ctx, "marked")
					}
				}
				if keys := strings.Fields(e.srv.Do(t, "KEYS", "dlock:{marked}*")); len(keys) != 1 || keys[0] != marker {
					t.Errorf("%s at the marker, %s (token given: %v): keys %v after a refused acquire", tc.what, k.what, given, keys)
				}
				if after := e.srv.Do(t, "DUMP", marker); after != before {
					t.Errorf("%s at the marker, %s (token given: %v): the marker changed", tc.what, k.what, given)
				}
			}
		}
	}
}

// TestAnExpiredHoldCannotTouchItsOwnersNext: a Lock whose read hold, write
// hold or permit expired cannot release, refresh or read the hold its
// owner took after it: a hold is found by its token, and must record the
// Lock's own acquisition, never by its owner.
func TestAnExpiredHoldCannotTouchItsOwnersNext(t *testing.T) {
	for _, k := range holdKindCases {
		t.Run(k.what, func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			old, err := k.obtain(ctx, e.c, "next", false, dlock.WithOwner("o"), dlock.WithTTL(100*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			for {
				if _, err := old.TTL(ctx); errors.Is(err, dlock.ErrNotHeld) {
					break
				} else if err != nil {
					t.Fatal(err)
				}
				if ctx.Err() != nil {
					t.Fatal("the first hold never expired")
				}
				time.Sleep(5 * time.Millisecond) // no notice of an expiry to wait for
			}
			next, err := k.obtain(ctx, e.newClient(t), "next", false, dlock.WithOwner("o"), dlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := old.TTL(ctx); !errors.Is(err, dlock.ErrNotHeld) {
				t.Errorf("TTL of the expired hold: err = %v, want ErrNotHeld", err)
			}
			if err := old.Refresh(ctx, time.Second); !errors.Is(err, dlock.ErrNotHeld) {
				t.Errorf("Refresh of the expired hold: err = %v, want ErrNotHeld", err)
			}
			if err := old.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
				t.Errorf("Release of the expired hold: err = %v, want ErrNotHeld", err)
			}
			if err := k.contest(ctx, e.newClient(t), "next"); !errors.Is(err, dlock.ErrNotObtained) {
				t.Errorf("the owner's next hold was given up by the expired one's Lock: err = %v", err)
			}
			if left, err := next.TTL(ctx); err != nil || left < 50*time.Second {
				t.Errorf("TTL of the next hold = %v, %v", left, err)
			}
			if err := next.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAWaiterSetOfOtherDataIsLeftAlone: a read/write lock's or a
// semaphore's waiter set that holds data dlock did not write is never
// written, as an exclusive lock's is not: a waiting caller that obtains the
// hold gets it, and one that is refused fails with ErrWrongType at once,
// having recorded nothing.
func TestAWaiterSetOfOtherDataIsLeftAlone(t *testing.T) {
	contenders := map[string]func(ctx context.Context, c *dlock.Client) error{ // waiting, refused by the hold
		"read": func(ctx context.Context, c *dlock.Client) error {
			return tryAndRelease(ctx)(c.RWMutex("busy").Lock(ctx))
		},
		"write": func(ctx context.Context, c *dlock.Client) error {
			return tryAndRelease(ctx)(c.RWMutex("busy").RLock(ctx))
		},
		"permit": func(ctx context.Context, c *dlock.Client) error {
			return tryAndRelease(ctx)(c.Semaphore("busy", 1).Acquire(ctx))
		},
	}
	for _, k := range holdKindCases {
		t.Run(k.what, func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			e.srv.Do(t, "SET", "dlock:{busy}:waiters", "user data")
			l, err := k.obtain(ctx, e.c, "busy", true)
			if err != nil {
				t.Fatalf("waiting on a free name: %v", err)
			}
			wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
			defer wcancel()
			if err := contenders[k.what](wctx, e.newClient(t)); !errors.Is(err, dlock.ErrWrongType) || wctx.Err() != nil {
				t.Errorf("waiting while held: err = %v, want ErrWrongType before the context ends", err)
			}
			if info, err := e.c.Inspect(ctx, "busy"); err != nil || info.Waiters != 0 || len(info.Holders) != 1 {
				t.Errorf("Inspect = %+v, %v; want the hold alone, no waiter recorded", info, err)
			}
			if got := e.srv.Do(t, "GET", "dlock:{busy}:waiters"); got != "user data" {
				t.Errorf("the waiter set's data changed to %q", got)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A copy of a read/write or semaphore acquire that reaches the server after
// its Lock was released, or given up after its request seemed lost, takes
// nothing: no hold is left for nobody until its TTL. A token given
// WithToken, one dlock made for an earlier Lock included, is not refused.
func TestALateCopyOfAHoldAcquireTakesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	admin := e.newClient(t)
	for _, tc := range []struct {
		name string
		take func(c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error)
		// probe, when set, takes the name as take's holds would keep it
		// from being taken (take otherwise)
		probe func(c *dlock.Client) (*dlock.Lock, error)
	}{
		{"read", func(c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error) {
			return c.RWMutex("late-read").TryRLock(ctx, opts...)
		}, func(c *dlock.Client) (*dlock.Lock, error) { return c.RWMutex("late-read").TryLock(ctx) }},
		{"write", func(c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error) {
			return c.RWMutex("late-write").TryLock(ctx, opts...)
		}, nil},
		{"permit", func(c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error) {
			return c.Semaphore("late-permit", 1).TryAcquire(ctx, opts...)
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			free := func(when string) {
				t.Helper()
				probe := tc.probe
				if probe == nil {
					probe = func(c *dlock.Client) (*dlock.Lock, error) { return tc.take(c) }
				}
				l, err := probe(admin)
				if err != nil {
					t.Fatalf("%s: %v", when, err)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			d := &copyingDriver{Driver: e.newDriver(t)}
			c := dlock.New(d)
			defer c.Close()
			l, err := tc.take(c)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if r := d.sendCopies(t); !refusal(r[0]) {
				t.Errorf("late copy of a released acquire replied %v, want a refusal", r[0])
			}
			free("after a late copy of a released acquire")

			d.mu.Lock()
			d.holdBack = true
			d.mu.Unlock()
			if _, err := tc.take(c); !errors.Is(err, errLostReply) {
				t.Fatalf("err = %v, want the lost request's", err)
			}
			if r := d.sendCopies(t); !refusal(r[0]) {
				t.Errorf("late copy of an acquire given up replied %v, want a refusal", r[0])
			}
			free("after a late copy of an acquire given up")

			again, err := tc.take(c, dlock.WithToken(l.Token()))
			if err != nil {
				t.Fatalf("a released Lock's token given again: %v", err)
			}
			if err := again.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
