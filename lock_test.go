package dlock_test

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/keyslot"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestTryLockExcludesOthersUntilReleased(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	other := e.newClient(t)

	l, err := e.c.TryLock(ctx, "orders:42", dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if l.Name() != "orders:42" {
		t.Errorf("Key() = %q", l.Name())
	}
	if _, err := other.TryLock(ctx, "orders:42"); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("second TryLock: err = %v, want ErrNotObtained", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("second Release: err = %v, want ErrNotHeld", err)
	}
	l2, err := other.TryLock(ctx, "orders:42")
	if err != nil {
		t.Fatalf("TryLock after release: %v", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{orders:42}") {
		t.Error("lock key left behind after release")
	}
}

// TestTheZeroLockPanics: every method of a Lock that no acquire or Attach
// made panics at once with a message that says so, as the zero Client's
// do, instead of failing deep inside (Release, Refresh, Name) or going on
// as a lock that never ends (Done, Context) or whose TTL is invalid
// (AutoRefresh).
func TestTheZeroLockPanics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var l dlock.Lock
	for _, tc := range []struct {
		name string
		call func()
	}{
		{"Release", func() { _ = l.Release(ctx) }},
		{"Refresh", func() { _ = l.Refresh(ctx, time.Second) }},
		{"AutoRefresh", func() { _ = l.AutoRefresh() }},
		{"TTL", func() { _, _ = l.TTL(ctx) }},
		{"Done", func() { l.Done() }},
		{"Err", func() { _ = l.Err() }},
		{"Deadline", func() { l.Deadline() }},
		{"Context", func() { l.Context(ctx) }},
		{"Mode", func() { l.Mode() }},
		{"Name", func() { l.Name() }},
		{"Names", func() { l.Names() }},
		{"Token", func() { l.Token() }},
		{"Metadata", func() { l.Metadata() }},
		{"Fence", func() { l.Fence() }},
		{"Fences", func() { l.Fences() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := func() (p any) {
				defer func() { p = recover() }()
				tc.call()
				return nil
			}()
			if msg, _ := p.(string); !strings.HasPrefix(msg, "dlock: ") || !strings.Contains(msg, "zero Lock") {
				t.Errorf("panic = %v, want a \"dlock: \" message about the zero Lock", p)
			}
		})
	}
}

func TestUncontendedAcquireAndReleaseCostTwoRoundTrips(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Do(t, "CONFIG", "RESETSTAT")
	before := e.drv.trips.Load()
	l, err := e.c.TryLock(ctx, "cheap")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.drv.trips.Load() - before; n != 2 {
		t.Errorf("round trips = %d, want 2", n)
	}
	// EVALSHA twice, after one EVAL each the first time the server saw the
	// scripts: the server ran exactly the two requests, plus the fallbacks.
	stats := e.srv.Do(t, "INFO", "commandstats")
	if !containsAll(stats, "cmdstat_evalsha:calls=2") {
		t.Errorf("server saw:\n%s", stats)
	}
}

func TestLockWaitsForRelease(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	var once sync.Once
	got := make(chan error, 1)
	go func() {
		l, err := e.newClient(t).Lock(ctx, "job",
			dlock.WithRetry(dlock.ConstantBackoff(5*time.Millisecond)),
			dlock.WithOnRetry(func(int, error) { once.Do(func() { close(waiting) }) }))
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	<-waiting
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
}

func TestLockTakesOverAtTheHoldersExpiry(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.c.TryLock(ctx, "crashed", dlock.WithTTL(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// The holder never releases. A retry interval far longer than the
	// context proves the waiter woke at the holder's expiry instead.
	l, err := e.newClient(t).Lock(ctx, "crashed", dlock.WithRetry(dlock.ConstantBackoff(time.Hour)))
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	_ = l.Release(ctx)
}

// TestAWaitOnAFailingRedisIsNotTakenForAHeldLock: a wait in which Redis
// never said the lock was held, because it refused connections or did not
// answer, ends with Redis's error, not ErrNotObtained: a caller that skips
// its work while another holds the lock must learn that Redis is down.
func TestAWaitOnAFailingRedisIsNotTakenForAHeldLock(t *testing.T) {
	check := func(t *testing.T, err error, name string, maxWait bool) {
		t.Helper()
		var se *dlock.ServerError
		if errors.Is(err, dlock.ErrNotObtained) || !errors.As(err, &se) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want a *ServerError matching DeadlineExceeded and not ErrNotObtained", err)
		}
		if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, strconv.Quote(name)) || (maxWait && !strings.Contains(msg, "max wait, 300ms")) {
			t.Errorf("message %q: want one line naming the lock and why the wait ended", msg)
		}
	}
	refusing := func(t *testing.T) (*dlock.Client, string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close() // nothing listens there now
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		c := dlock.New(goredis.New(rdb))
		t.Cleanup(func() { _ = c.Close() })
		return c, addr
	}
	t.Run("refused", func(t *testing.T) {
		c, addr := refusing(t)
		_, err := c.Lock(context.Background(), "job", dlock.WithMaxWait(300*time.Millisecond))
		check(t, err, "job", true)
		if msg := err.Error(); !strings.Contains(msg, "with Redis failing") || !strings.Contains(msg, "dial tcp "+addr) || !strings.Contains(msg, "connection refused") {
			t.Errorf("err = %v, want Redis failing, with the connection's failure", err)
		}
	})
	// A strategy of no wait still waits a millisecond after an attempt
	// Redis did not answer: a Redis that is down answers at once, and the
	// caller would otherwise try hundreds of thousands of times a second
	// (about 200,000 before).
	t.Run("refused, retried without a wait", func(t *testing.T) {
		c, _ := refusing(t)
		for _, s := range []dlock.RetryStrategy{dlock.ConstantBackoff(0), dlock.ExponentialBackoff(0, 0)} {
			attempts := 0
			_, err := c.Lock(context.Background(), "job", dlock.WithMaxWait(200*time.Millisecond), dlock.WithRetry(s),
				dlock.WithOnRetry(func(failed int, _ error) { attempts = failed }))
			check(t, err, "job", false)
			if attempts < 2 || attempts > 201 {
				t.Errorf("%d attempts in 200ms, want one at most every millisecond", attempts)
			}
		}
	})
	// Callers of one client queue behind the first, whose attempts fail:
	// what they found is the queued callers' answer too.
	t.Run("refused, queued", func(t *testing.T) {
		c, _ := refusing(t)
		errs := make(chan error, 3)
		for i := range 3 {
			go func() {
				_, err := c.Lock(context.Background(), "job", dlock.WithMaxWait(time.Duration(300+100*i)*time.Millisecond))
				errs <- err
			}()
		}
		for range 3 {
			check(t, <-errs, "job", false)
		}
	})
	// What the callers of a client found at a name answers only for those
	// that waited behind them at that name, at the time: a lock on several
	// names refused (for another of its names) or a caller that left
	// before a Redis failure do not make a later caller take the lock for
	// held.
	t.Run("what others found", func(t *testing.T) {
		e := newEnv(t)
		proxy := redistest.StartCutProxy(t, e.srv.Addr())
		rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		c := dlock.New(goredis.New(rdb))
		t.Cleanup(func() { _ = c.Close() })
		ctx := context.Background()
		if _, err := e.c.TryLock(ctx, "b", dlock.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if _, err := e.c.TryLock(ctx, "c", dlock.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
		// lock starts a wait for names, of which refused is closed at the
		// first failed attempt.
		lock := func(names []string, wait time.Duration, refused chan<- struct{}) <-chan error {
			got := make(chan error, 1)
			var once sync.Once
			go func() {
				opts := []dlock.Option{dlock.WithMaxWait(wait), dlock.WithOnRetry(func(int, error) {
					once.Do(func() { close(refused) })
				})}
				var err error
				if len(names) == 1 {
					_, err = c.Lock(ctx, names[0], opts...)
				} else {
					_, err = c.LockMulti(ctx, names, opts...)
				}
				got <- err
			}()
			return got
		}
		multiRefused := make(chan struct{})
		multi := lock([]string{"a", "b"}, 3*time.Second, multiRefused)
		<-multiRefused
		s1Refused := make(chan struct{})
		s1 := lock([]string{"c"}, 300*time.Millisecond, s1Refused)
		<-s1Refused
		s2 := lock([]string{"c"}, 800*time.Millisecond, make(chan struct{}))
		proxy.Close() // Redis goes away: refused from now on
		if err := <-s1; !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("the caller that found c held: err = %v, want ErrNotObtained", err)
		}
		s3 := lock([]string{"c"}, 1300*time.Millisecond, make(chan struct{}))
		a := lock([]string{"a"}, 300*time.Millisecond, make(chan struct{}))
		check(t, <-a, "a", false)
		<-s2
		check(t, <-s3, "c", false)
		<-multi
	})
	// Behind a caller of the client that found the lock held, a short wait
	// and a lock on several names take that for their answer.
	t.Run("held, queued", func(t *testing.T) {
		e := newEnv(t)
		ctx := context.Background()
		if _, err := e.c.TryLock(ctx, "x", dlock.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
		c := e.newClient(t)
		refused := make(chan struct{})
		var once sync.Once
		first := make(chan error, 1)
		go func() {
			_, err := c.Lock(ctx, "x", dlock.WithMaxWait(time.Second), dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
			first <- err
		}()
		<-refused
		if _, err := c.Lock(ctx, "x", dlock.WithMaxWait(100*time.Millisecond)); !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("a short wait behind it: err = %v, want ErrNotObtained", err)
		}
		if _, err := c.LockMulti(ctx, []string{"x", "y"}, dlock.WithMaxWait(100*time.Millisecond)); !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("a lock on several names behind it: err = %v, want ErrNotObtained", err)
		}
		if err := <-first; !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("the caller first in line: err = %v, want ErrNotObtained", err)
		}
	})
	// Refused, then an attempt that the end of the wait cuts short (a
	// paused server; go-redis reports the socket's deadline, set from the
	// context, as an i/o timeout): Redis's last answer was the refusal,
	// whether the strategy stops with that attempt or the wait ends after.
	t.Run("refused, then cut short", func(t *testing.T) {
		e := newEnv(t)
		ctx := context.Background()
		if _, err := e.c.TryLock(ctx, "x", dlock.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
		var refusals sync.WaitGroup
		refusals.Add(3)
		errs := make(chan error, 3)
		stops := dlock.LimitRetry(dlock.ConstantBackoff(time.Millisecond), 2)
		// The last one's OnRetry takes its time over the attempt cut short.
		for i, retry := range []dlock.RetryStrategy{dlock.DefaultRetry(), stops, stops} {
			rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = rdb.Close() })
			c := dlock.New(goredis.New(rdb))
			t.Cleanup(func() { _ = c.Close() })
			go func() {
				var once sync.Once
				wctx, cancel := context.WithTimeout(ctx, 800*time.Millisecond)
				defer cancel()
				_, err := c.Lock(wctx, "x", dlock.WithRetry(retry), dlock.WithOnRetry(func(n int, _ error) {
					once.Do(refusals.Done)
					if i == 2 && n == 2 {
						time.Sleep(100 * time.Millisecond)
					}
				}))
				errs <- err
			}()
		}
		refusals.Wait()
		e.srv.Pause(t)
		defer e.srv.Resume(t)
		for range 3 {
			if err := <-errs; !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("err = %v, want ErrNotObtained and DeadlineExceeded", err)
			}
		}
	})
	// A caller obtains the lock while another of its client waits behind
	// it, whose own attempt gets no answer in time: behind a read hold it
	// did not find the lock held; behind an exclusive lock it did. The
	// first caller's acquire is held back until the second is in line
	// behind it; the second's attempt is held back until its wait ended.
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("behind a hold just taken, shared %v", shared), func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			// The wait ends once its attempt is under way, as at a deadline.
			wctx, endWait := context.WithCancelCause(ctx)
			defer endWait(nil)
			started, proceed, second := make(chan struct{}), make(chan struct{}), make(chan struct{})
			var letGo sync.Once
			defer letGo.Do(func() { close(proceed) })
			var acquires atomic.Int32
			drv := &hookDriver{Driver: e.newDriver(t), beforeCtx: func(ctx context.Context, calls []*dlock.Call) {
				if !strings.HasSuffix(calls[0].Script.Name, "acquire") {
					return
				}
				if acquires.Add(1) == 1 {
					close(started)
					<-proceed // the first caller's attempt
				} else {
					// The second's: no answer in time. (Its own context,
					// which ends with wctx but may end an instant after it:
					// the call then fails as a real one would.)
					close(second) // once: the wait ends at its first attempt
					<-ctx.Done()
				}
			}}
			c := dlock.New(drv)
			t.Cleanup(func() { _ = c.Close() })
			m := c.RWMutex("shared")
			name := "excl"
			if shared {
				name = "shared"
			}
			lock := func(ctx context.Context) (*dlock.Lock, error) {
				if shared {
					return m.RLock(ctx)
				}
				return c.Lock(ctx, name)
			}
			first := make(chan error, 1)
			go func() {
				l, err := lock(ctx)
				if err == nil {
					_ = l.Release(ctx)
				}
				first <- err
			}()
			<-started
			behind := make(chan error, 1)
			go func() {
				_, err := lock(wctx)
				behind <- err
			}()
			awaitWaiting(t, c, name, 2)
			letGo.Do(func() { close(proceed) })
			<-second
			endWait(context.DeadlineExceeded)
			if err := awaitErr(t, behind, "the caller behind"); errors.Is(err, dlock.ErrNotObtained) == shared || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("the caller behind: err = %v, want DeadlineExceeded, and ErrNotObtained %v", err, !shared)
			}
			if err := awaitErr(t, first, "the first caller"); err != nil {
				t.Errorf("the first caller: %v", err)
			}
		})
	}
	t.Run("silent", func(t *testing.T) {
		e := newEnv(t)
		rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
		defer rdb.Close()
		c := dlock.New(goredis.New(rdb))
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		e.srv.Pause(t)
		defer e.srv.Resume(t)
		_, err := c.Lock(ctx, "job")
		check(t, err, "job", false)
	})
}

func TestLockGivesUp(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.c.TryLock(ctx, "busy"); err != nil {
		t.Fatal(err)
	}
	t.Run("context deadline", func(t *testing.T) {
		// Long enough for the client's first wait to open its subscription.
		ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err := e.c.Lock(ctx, "busy")
		if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want ErrNotObtained and DeadlineExceeded", err)
		}
	})
	t.Run("max wait without a deadline", func(t *testing.T) {
		_, err := e.c.Lock(ctx, "busy", dlock.WithMaxWait(50*time.Millisecond))
		if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want ErrNotObtained and DeadlineExceeded", err)
		}
		// One line, for logs, that names the lock and why the wait ended.
		if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, `"busy" still held`) || !strings.Contains(msg, "max wait, 50ms") {
			t.Errorf("message %q: want one line naming the lock and the max wait", msg)
		}
	})
	t.Run("max wait within a later deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := e.c.Lock(ctx, "busy", dlock.WithMaxWait(50*time.Millisecond))
		if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "max wait, 50ms") {
			t.Errorf("err = %v, want ErrNotObtained at the max wait", err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctx)
		_, err := e.c.Lock(ctx, "busy", dlock.WithOnRetry(func(int, error) { cancel() }))
		if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want ErrNotObtained and Canceled", err)
		}
	})
	t.Run("strategy exhausted", func(t *testing.T) {
		var attempts []int
		_, err := e.c.Lock(ctx, "busy",
			dlock.WithRetry(dlock.LimitRetry(dlock.ConstantBackoff(time.Millisecond), 3)),
			dlock.WithOnRetry(func(n int, err error) {
				if !errors.Is(err, dlock.ErrNotObtained) {
					t.Errorf("attempt %d: err = %v", n, err)
				}
				attempts = append(attempts, n)
			}))
		if !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("err = %v, want ErrNotObtained", err)
		}
		if len(attempts) != 3 || attempts[2] != 3 {
			t.Errorf("attempts seen = %v, want [1 2 3]", attempts)
		}
	})
}

func TestRefreshAndTTL(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "long", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	left, err := l.TTL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if left <= time.Second || left > time.Minute {
		t.Errorf("TTL after refresh = %v, want about 1m", left)
	}
	if d := time.Until(l.Deadline()); d <= 50*time.Second || d > time.Minute {
		t.Errorf("Deadline in %v, want just under 1m", d)
	}
	if err := l.Refresh(ctx, 0); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Errorf("Refresh(0): err = %v, want ErrInvalidTTL", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh after release: err = %v, want ErrNotHeld", err)
	}
	if _, err := l.TTL(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("TTL after release: err = %v, want ErrNotHeld", err)
	}
}

func TestExpiredHolderCannotReleaseOrRefreshTheNewHolders(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	old, err := e.c.TryLock(ctx, "shared", dlock.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	other := e.newClient(t)
	cur, err := other.Lock(ctx, "shared", dlock.WithRetry(dlock.ConstantBackoff(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("stale Refresh: err = %v, want ErrNotHeld", err)
	}
	if err := old.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("stale Release: err = %v, want ErrNotHeld", err)
	}
	if _, err := cur.TTL(ctx); err != nil {
		t.Errorf("new holder lost its lock: %v", err)
	}
	if _, err := e.c.Attach(ctx, "shared", "guessed-token"); !errors.Is(err, dlock.ErrNotHeld) || !strings.Contains(err.Error(), "not held with that token") {
		t.Errorf("Attach with a wrong token: err = %v, want ErrNotHeld, saying the token does not hold it", err)
	}
	if err := cur.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestTokensAreRandom128Bits(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	seen := map[string]bool{}
	for i := range 50 {
		l, err := e.c.TryLock(ctx, "tok:"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		b, err := base64.RawURLEncoding.DecodeString(l.Token())
		if err != nil || len(b) != 16 {
			t.Fatalf("token %q is not 16 base64url bytes", l.Token())
		}
		if seen[l.Token()] {
			t.Fatalf("token %q repeated", l.Token())
		}
		seen[l.Token()] = true
	}
}

func TestMetadataAndHandOff(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "migration", dlock.WithMetadata("host=a pid=42"), dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if l.Metadata() != "host=a pid=42" {
		t.Errorf("Metadata() = %q", l.Metadata())
	}
	// Another process, told the name and token, takes the lock over.
	heir, err := e.newClient(t).Attach(ctx, "migration", l.Token())
	if err != nil {
		t.Fatal(err)
	}
	if heir.Metadata() != "host=a pid=42" || heir.Fence() != l.Fence() || heir.Token() != l.Token() {
		t.Errorf("attached lock = %q fence %d, want the holder's", heir.Metadata(), heir.Fence())
	}
	if err := heir.Refresh(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := heir.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("release after the heir released: err = %v, want ErrNotHeld", err)
	}
}

func TestAcquireWithTheSameTokenIsIdempotent(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	first, err := e.c.TryLock(ctx, "idem", dlock.WithToken("token-of-request-7"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.newClient(t).TryLock(ctx, "idem", dlock.WithToken("token-of-request-7"))
	if err != nil {
		t.Fatalf("repeated acquire: %v", err)
	}
	if again.Fence() != first.Fence() {
		t.Errorf("fence changed on a repeated acquire: %d then %d", first.Fence(), again.Fence())
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{idem}") {
		t.Error("one release must free a lock acquired twice with one token")
	}
}

func TestAcquireRetriedAfterALostReplyGetsTheLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.drv.loseReplies(1) // the grant happens on the server, its reply is lost
	l, err := e.c.Lock(ctx, "lossy", dlock.WithRetry(dlock.ConstantBackoff(time.Millisecond)))
	if err != nil {
		t.Fatalf("Lock after a lost reply: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{lossy}") {
		t.Error("lock left behind")
	}
}

func TestFailedAcquireLeavesNothingBehind(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.drv.loseReplies(1)
	if _, err := e.c.TryLock(ctx, "lost"); err == nil || errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("err = %v, want the transport error", err)
	}
	if e.locked(t, "dlock:{lost}") {
		t.Error("a TryLock whose reply was lost left its lock behind")
	}
}

func TestMultiKeyIsAllOrNothing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	blocker, err := e.newClient(t).TryLock(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.c.TryLockMulti(ctx, []string{"a", "b", "c"})
	if !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("err = %v, want ErrNotObtained", err)
	}
	if e.exists(t, "dlock:{a}") || e.exists(t, "dlock:{c}") {
		t.Fatal("a refused multi-key acquire left keys behind")
	}
	if err := blocker.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := e.c.TryLockMulti(ctx, []string{"a", "b", "c"}, dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Names(); len(got) != 3 || len(l.Fences()) != 3 {
		t.Errorf("Keys() = %v, Fences() = %v", got, l.Fences())
	}
	if _, err := e.c.TryLock(ctx, "c"); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("single TryLock on a multi-held name: err = %v", err)
	}
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if left, err := l.TTL(ctx); err != nil || left <= time.Second {
		t.Errorf("TTL = %v, %v after refresh", left, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "c"} {
		if e.locked(t, "dlock:{"+k+"}") {
			t.Errorf("%s left behind", k)
		}
	}
}

// TestMultiKeyAcrossSlotsOnOneServerIsOneRoundTrip: a single server runs a
// script on keys of any slots, so names in different cluster slots are
// still taken, refused and released atomically, one round trip each.
func TestMultiKeyAcrossSlotsOnOneServerIsOneRoundTrip(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	names := []string{"a", "b", "c"}
	if keyslot.Of(e.c.RedisKey("a")) == keyslot.Of(e.c.RedisKey("b")) {
		t.Fatal("the names share a slot")
	}
	blocker, err := e.newClient(t).TryLock(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	before := e.drv.trips.Load()
	if _, err := e.c.TryLockMulti(ctx, names); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("err = %v, want ErrNotObtained", err)
	}
	if n := e.drv.trips.Load() - before; n != 1 {
		t.Errorf("refused attempt: %d round trips, want 1", n)
	}
	if err := blocker.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		before = e.drv.trips.Load()
		l, err := e.c.TryLockMulti(ctx, names)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n := e.drv.trips.Load() - before; n != 2 {
			t.Errorf("acquire and release: %d round trips, want 2", n)
		}
	}
}

func TestMultiKeyReleaseReportsTheLostName(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLockMulti(ctx, []string{"x", "y"})
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "DEL", "dlock:{y}")
	if err := l.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh: err = %v, want ErrNotHeld", err)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release: err = %v, want ErrNotHeld", err)
	}
	if e.locked(t, "dlock:{x}") {
		t.Error("the name still held was not released")
	}
}

// A refresh that finds one name of a lock on several names gone (here
// force-released) ends the lock and gives back the others at once, by
// its own acquisition: they are not left held, by nobody, until their TTL.
func TestALockFoundLostGivesBackItsOtherNames(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, names := range [][]string{{"{t}x", "{t}y"}, {"x2", "y2"}} {
		l, err := e.c.TryLockMulti(ctx, names, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.newClient(t).ForceRelease(ctx, names[1]); err != nil {
			t.Fatal(err)
		}
		if err := l.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
			t.Errorf("%v: Refresh: err = %v, want ErrNotHeld", names, err)
		}
		if e.locked(t, e.c.RedisKey(names[0])) {
			t.Errorf("%v: %s still held after the lock was found lost", names, names[0])
		}
	}
}

func TestReentrantOwner(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	first, err := e.c.TryLock(ctx, "reent", dlock.WithOwner("job-7"))
	if err != nil {
		t.Fatal(err)
	}
	second, err := e.newClient(t).TryLock(ctx, "reent", dlock.WithOwner("job-7"))
	if err != nil {
		t.Fatalf("re-entry: %v", err)
	}
	if second.Fence() != first.Fence() {
		t.Errorf("re-entry changed the fence: %d then %d", first.Fence(), second.Fence())
	}
	if _, err := e.c.TryLock(ctx, "reent", dlock.WithOwner("job-8")); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("another owner: err = %v, want ErrNotObtained", err)
	}
	if got := e.srv.Do(t, "HGET", "dlock:{reent}", "count"); got != "2" {
		t.Errorf("hold count = %s, want 2", got)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.TryLock(ctx, "reent"); !errors.Is(err, dlock.ErrNotObtained) {
		t.Error("lock freed while the owner still held it once")
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{reent}") {
		t.Error("lock not freed when the count reached zero")
	}
}

func TestFencesIncrease(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var last uint64
	for i := range 20 {
		c := e.c
		if i%2 == 1 {
			c = e.newClient(t)
		}
		l, err := c.TryLock(ctx, "fenced")
		if err != nil {
			t.Fatal(err)
		}
		if l.Fence() <= last {
			t.Fatalf("acquisition %d: fence %d after %d", i, l.Fence(), last)
		}
		last = l.Fence()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The counter is kept for a day after the last fence, so that names
	// locked once do not stay in Redis for good.
	if ttl, _ := strconv.Atoi(e.srv.Do(t, "PTTL", "dlock:{fenced}:fence")); ttl < 86_000_000 || ttl > 86_400_000 {
		t.Errorf("fence counter PTTL = %d ms, want about a day", ttl)
	}
	// A counter ahead of the clock (a clock set back, or a burst within one
	// microsecond) is overtaken by one, not reset to the clock: read from
	// the counter once the released lock's hash is gone (after a minute),
	// and from that hash, which keeps the last fence, while it lasts.
	ahead := last + 1_000_000_000
	e.srv.Do(t, "DEL", "dlock:{fenced}")
	e.srv.Do(t, "SET", "dlock:{fenced}:fence", strconv.FormatUint(ahead, 10))
	for _, want := range []uint64{ahead + 1, ahead + 2} {
		l, err := e.c.TryLock(ctx, "fenced")
		if err != nil {
			t.Fatal(err)
		}
		if l.Fence() != want {
			t.Errorf("fence %d after a fence of %d, want one more", l.Fence(), want-1)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.srv.Do(t, "GET", "dlock:{fenced}:fence"); got != strconv.FormatUint(ahead+2, 10) {
		t.Errorf("fence counter %s, want the last fence %d", got, ahead+2)
	}
}

// TestFenceRetention: WithFenceRetention sets how long a name's fence
// counter is kept, for an exclusive lock's acquire, a grant to its waiter
// and a read/write lock's writer; with 0 the client keeps none, and its
// fences still grow, from the released lock's hash. Clients of each
// retention take turns on one server, by EVALSHA and as Redis Functions,
// whose library keeps the helpers between calls (see scripts/library.lua):
// each call has its own client's retention, and the default is a day.
func TestFenceRetention(t *testing.T) {
	for _, functions := range []bool{false, true} {
		t.Run(fmt.Sprintf("functions=%v", functions), func(t *testing.T) { testFenceRetention(t, functions) })
	}
}

func testFenceRetention(t *testing.T, functions bool) {
	e := newEnv(t)
	ctx := context.Background()
	// client makes a client with opts, and WithFunctions when asked.
	client := func(opts ...dlock.ClientOption) *dlock.Client {
		if functions {
			opts = append(opts, dlock.WithFunctions())
		}
		return e.newClient(t, opts...)
	}
	// fences takes name, lets a waiter of c be granted it, and takes the
	// write hold of the read/write lock rw:name, returning their fences.
	fences := func(c *dlock.Client, name string) []uint64 {
		t.Helper()
		held, err := c.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		granted := handedOver(t, ctx, held, c, name)
		if err := granted.Release(ctx); err != nil {
			t.Fatal(err)
		}
		w, err := c.RWMutex("rw:" + name).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Release(ctx); err != nil {
			t.Fatal(err)
		}
		return []uint64{held.Fence(), granted.Fence(), w.Fence()}
	}
	counterTTL := func(name string) int {
		t.Helper()
		ttl, err := strconv.Atoi(e.srv.Do(t, "PTTL", "dlock:{"+name+"}:fence"))
		if err != nil {
			t.Fatal(err)
		}
		return ttl
	}

	for _, tc := range []struct {
		d        time.Duration
		min, max int // the counter's PTTL in ms
	}{
		{time.Hour, 3_590_000, 3_600_000},
		{time.Hour + time.Nanosecond, 3_590_000, 3_600_001}, // rounded up to a millisecond
		{dlock.DefaultFenceRetention, 86_390_000, 86_400_000},
	} {
		c := client(dlock.WithFenceRetention(tc.d))
		name := "kept:" + tc.d.String()
		f := fences(c, name)
		if f[1] <= f[0] {
			t.Errorf("%v: a grant's fence %d after %d", tc.d, f[1], f[0])
		}
		// The counter's TTL after the exclusive lock's grant, then the writer's.
		for _, key := range []string{name, "rw:" + name} {
			if ttl := counterTTL(key); ttl < tc.min || ttl > tc.max {
				t.Errorf("%v: %s's fence counter PTTL = %d ms, want %d to %d", tc.d, key, ttl, tc.min, tc.max)
			}
		}
	}

	// With none (and a negative retention counts as none), no counter is
	// read or written: one holding other data is not refused, and none is
	// made.
	for _, d := range []time.Duration{0, -time.Second} {
		c := client(dlock.WithFenceRetention(d))
		name := "uncounted:" + d.String()
		e.srv.Do(t, "RPUSH", "dlock:{"+name+"}:fence", "not a counter")
		e.srv.Do(t, "RPUSH", "dlock:{rw:"+name+"}:fence", "not a counter")
		before := uint64(time.Now().UnixMicro())
		f := fences(c, name)
		if f[0] < before-1_000_000 || f[1] <= f[0] || f[2] < before-1_000_000 {
			t.Errorf("fences %v with no counter, want at least the clock (%d), and a grant's above the holder's", f, before)
		}
		for _, key := range []string{name, "rw:" + name} {
			if got := e.srv.Do(t, "TYPE", "dlock:{"+key+"}:fence"); got != "list" {
				t.Errorf("%s's fence counter is a %s, want the list left alone", key, got)
			}
		}
		// A fresh name gets no counter; the released hash keeps its fence,
		// which the next fence overtakes even when it is ahead of the clock.
		fresh := "fresh:" + d.String()
		l, err := c.TryLock(ctx, fresh)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if e.exists(t, "dlock:{"+fresh+"}:fence") {
			t.Errorf("a fence counter for %s, from a client that keeps none", fresh)
		}
		ahead := l.Fence() + 1_000_000_000
		e.srv.Do(t, "HSET", "dlock:{"+fresh+"}", "fence", strconv.FormatUint(ahead, 10))
		info, err := c.Inspect(ctx, fresh)
		if err != nil {
			t.Fatal(err)
		}
		if info.Fence != ahead {
			t.Errorf("Inspect: newest fence %d, want the released hash's %d", info.Fence, ahead)
		}
		l, err = c.TryLock(ctx, fresh)
		if err != nil {
			t.Fatal(err)
		}
		if l.Fence() != ahead+1 {
			t.Errorf("fence %d after the hash's %d, want one more", l.Fence(), ahead)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if e.exists(t, "dlock:{"+fresh+"}:fence") {
			t.Errorf("a fence counter for %s, from a client that keeps none", fresh)
		}
	}

	// A client with the default after those that keep none: a day.
	fences(client(), "default")
	for _, key := range []string{"default", "rw:default"} {
		if ttl := counterTTL(key); ttl < 86_390_000 || ttl > 86_400_000 {
			t.Errorf("%s's fence counter PTTL = %d ms after clients that keep none, want a day", key, ttl)
		}
	}
}

// A fence retention within a millisecond of the longest duration keeps
// the counter that long: rounded up to whole milliseconds without
// overflowing into a negative time, which Redis refuses on every acquire.
func TestFenceRetentionOfTheLongestDuration(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.newClient(t, dlock.WithFenceRetention(math.MaxInt64))
	for _, take := range []func() (*dlock.Lock, error){
		func() (*dlock.Lock, error) { return c.TryLock(ctx, "long") },
		func() (*dlock.Lock, error) { return c.RWMutex("rw:long").TryLock(ctx) },
	} {
		l, err := take()
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range []string{"dlock:{long}:fence", "dlock:{rw:long}:fence"} {
		if ttl, _ := strconv.ParseInt(e.srv.Do(t, "PTTL", key), 10, 64); ttl < math.MaxInt64/int64(time.Millisecond)-1000 {
			t.Errorf("%s's PTTL = %d ms, want about %d", key, ttl, math.MaxInt64/int64(time.Millisecond))
		}
	}
}

// TestAWrongTypeErrorNamesTheKeyAtFault: a name refused because one of its
// keys other than its own holds data dlock did not write says which key;
// one refused for its own key says the name alone.
func TestAWrongTypeErrorNamesTheKeyAtFault(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var holder *dlock.Lock // of "granted"
	for _, tc := range []struct {
		name, key string // key: the foreign data's, "" for the name's own key
		take      func(name string) error
	}{
		{"own", "", func(n string) error { _, err := e.c.TryLock(ctx, n); return err }},
		{"fenced", ":fence", func(n string) error { _, err := e.c.TryLock(ctx, n); return err }},
		// Released: its hash keeps the last fence, and the counter is not read.
		{"refenced", ":fence", func(n string) error { _, err := e.c.TryLock(ctx, n); return err }},
		// Not granted to its waiter by the release, which is not refused.
		{"granted", ":fence", func(n string) error {
			got := lockWhenRefused(t, ctx, e.c, n)
			if err := holder.Release(ctx); err != nil {
				t.Errorf("the holder's release: %v", err)
			}
			return (<-got).err
		}},
		{"multi", ":fence", func(n string) error { _, err := e.c.TryLockMulti(ctx, []string{"other", n}); return err }},
		{"waited", ":waiters", func(n string) error { _, err := e.c.Lock(ctx, n, dlock.WithMaxWait(time.Second)); return err }},
		{"rwown", "", func(n string) error { _, err := e.c.RWMutex(n).TryRLock(ctx); return err }},
		{"writefence", ":fence", func(n string) error { _, err := e.c.RWMutex(n).TryLock(ctx); return err }},
		{"rwmarker", ":released", func(n string) error { _, err := e.c.RWMutex(n).TryRLock(ctx); return err }},
		{"semmarker", ":released", func(n string) error { _, err := e.c.Semaphore(n, 2).TryAcquire(ctx); return err }},
		{"semwaited", ":waiters", func(n string) error {
			_, err := e.c.Semaphore(n, 1).Acquire(ctx, dlock.WithMaxWait(time.Second))
			return err
		}},
		{"inspected", ":holds", func(n string) error { _, err := e.c.Inspect(ctx, n); return err }},
	} {
		key := "dlock:{" + tc.name + "}" + tc.key
		switch tc.name {
		case "refenced":
			l, err := e.c.TryLock(ctx, tc.name)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			e.srv.Do(t, "DEL", key)
		case "granted":
			var err error
			if holder, err = e.newClient(t).TryLock(ctx, tc.name, dlock.WithTTL(time.Minute)); err != nil {
				t.Fatal(err)
			}
			e.srv.Do(t, "DEL", key)
		case "waited": // held, so that the Lock registers as a waiter
			if _, err := e.newClient(t).TryLock(ctx, tc.name, dlock.WithTTL(time.Minute)); err != nil {
				t.Fatal(err)
			}
		case "semwaited":
			if _, err := e.newClient(t).Semaphore(tc.name, 1).TryAcquire(ctx, dlock.WithTTL(time.Minute)); err != nil {
				t.Fatal(err)
			}
		case "inspected":
			if _, err := e.c.Semaphore(tc.name, 1).TryAcquire(ctx, dlock.WithTTL(time.Minute)); err != nil {
				t.Fatal(err)
			}
			e.srv.Do(t, "DEL", key)
		}
		e.srv.Do(t, "RPUSH", key, "user data")
		err := tc.take(tc.name)
		want := strconv.Quote(tc.name)
		if tc.key != "" {
			want += " (at its key " + strconv.Quote(key) + ")"
		}
		if !errors.Is(err, dlock.ErrWrongType) || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("foreign data at %s: err = %v, want ErrWrongType ending in %s", key, err, want)
		}
		if got := e.srv.Do(t, "LRANGE", key, "0", "-1"); got != "user data" || e.srv.Do(t, "PTTL", key) != "-1" {
			t.Errorf("foreign data at %s: %q, PTTL %s after the refusal, want it untouched", key, got, e.srv.Do(t, "PTTL", key))
		}
	}
}

func TestKeysThatHoldOtherDataAreRefusedAndUntouched(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Do(t, "SET", "dlock:{str}", "user data")
	e.srv.Do(t, "RPUSH", "dlock:{list}", "1")
	e.srv.Do(t, "HSET", "dlock:{hash}", "field", "v")
	for _, name := range []string{"str", "list", "hash"} {
		_, err := e.c.TryLock(ctx, name)
		if !errors.Is(err, dlock.ErrWrongType) {
			t.Errorf("%s: err = %v, want ErrWrongType", name, err)
		} else if !containsAll(err.Error(), strconv.Quote(name)) {
			t.Errorf("%s: error %q does not name the key", name, err)
		}
	}
	_, err := e.c.TryLockMulti(ctx, []string{"free", "list"})
	if !errors.Is(err, dlock.ErrWrongType) || !containsAll(err.Error(), `"list"`) {
		t.Errorf("multi: err = %v, want ErrWrongType naming \"list\"", err)
	}
	if e.exists(t, "dlock:{free}") {
		t.Error("refused multi-key acquire left a key behind")
	}
	e.srv.Do(t, "SET", "dlock:{badfence}:fence", "not a number")
	_, err = e.c.TryLockMulti(ctx, []string{"free", "badfence"})
	if !errors.Is(err, dlock.ErrWrongType) || e.exists(t, "dlock:{free}") {
		t.Errorf("fence counter with other data: err = %v, want ErrWrongType and nothing taken", err)
	}
	if got := e.srv.Do(t, "GET", "dlock:{badfence}:fence"); got != "not a number" {
		t.Errorf("fence counter with other data changed to %q", got)
	}
	// A counter at 2^53 or past it, where one more is the same double: the
	// fences would stop growing.
	for _, big := range []string{"9007199254740992", "18446744073709551615", "inf"} {
		e.srv.Do(t, "SET", "dlock:{bigfence}:fence", big)
		if _, err := e.c.TryLock(ctx, "bigfence"); !errors.Is(err, dlock.ErrWrongType) || e.exists(t, "dlock:{bigfence}") {
			t.Errorf("fence counter at %s: err = %v, want ErrWrongType and nothing taken", big, err)
		}
		if _, err := e.c.RWMutex("bigfence").TryLock(ctx); !errors.Is(err, dlock.ErrWrongType) || e.exists(t, "dlock:{bigfence}") {
			t.Errorf("fence counter at %s, write lock: err = %v, want ErrWrongType and nothing taken", big, err)
		}
	}
	e.srv.Do(t, "RPUSH", "dlock:{listfence}:fence", "x")
	if _, err := e.c.TryLock(ctx, "listfence"); !errors.Is(err, dlock.ErrWrongType) || e.exists(t, "dlock:{listfence}") {
		t.Errorf("fence counter of another type: err = %v, want ErrWrongType and nothing taken", err)
	}
	if got := e.srv.Do(t, "LRANGE", "dlock:{listfence}:fence", "0", "-1"); got != "x" {
		t.Errorf("fence counter of another type changed to %q", got)
	}
	if got := e.srv.Do(t, "GET", "dlock:{str}"); got != "user data" {
		t.Errorf("data changed to %q", got)
	}
	if got := e.srv.Do(t, "HGETALL", "dlock:{hash}"); got != "field\nv" {
		t.Errorf("hash changed to %q", got)
	}
}

func TestAWaiterSetThatHoldsOtherDataIsNeverWritten(t *testing.T) {
	// A key at a lock's waiter set that holds other data: a caller that
	// would wait is refused with ErrWrongType at once (it cannot be told
	// of the release), one that finds the lock free gets it, and the
	// holder's release frees it; the key is never changed.
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Do(t, "SET", "dlock:{busy}:waiters", "user data")
	held, err := e.newClient(t).TryLock(ctx, "busy", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := e.c.Lock(wctx, "busy"); !errors.Is(err, dlock.ErrWrongType) || wctx.Err() != nil {
		t.Errorf("waiting: err = %v, want ErrWrongType before the context ends", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Errorf("release: %v", err)
	}
	l, err := e.c.Lock(wctx, "busy")
	if err != nil {
		t.Fatalf("the free lock: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.srv.Do(t, "GET", "dlock:{busy}:waiters"); got != "user data" {
		t.Errorf("waiter set's key changed to %q", got)
	}
}

func TestBadInputIsRefusedBeforeAnyRoundTrip(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var nilCtx context.Context
	cases := []struct {
		name string
		do   func() error
		want error
	}{
		{"nil context", func() error { _, err := e.c.TryLock(nilCtx, "k"); return err }, dlock.ErrNilContext},
		{"nil context Lock", func() error { _, err := e.c.Lock(nilCtx, "k"); return err }, dlock.ErrNilContext},
		{"empty name", func() error { _, err := e.c.TryLock(ctx, ""); return err }, dlock.ErrEmptyName},
		{"name starting with }", func() error { _, err := e.c.TryLock(ctx, "}x"); return err }, dlock.ErrInvalidName},
		{"name of another lock's fence counter", func() error { _, err := e.c.TryLock(ctx, "{x}:fence"); return err }, dlock.ErrInvalidName},
		{"name of another lock's late record", func() error { _, err := e.c.TryLock(ctx, "{x}:late"); return err }, dlock.ErrInvalidName},
		{"name of another lock's waiter set in multi", func() error {
			_, err := e.c.TryLockMulti(ctx, []string{"a", "{a}:waiters"})
			return err
		}, dlock.ErrInvalidName},
		{"read/write lock on another's queue", func() error { _, err := e.c.RWMutex("{doc}:queue").TryLock(ctx); return err }, dlock.ErrInvalidName},
		{"semaphore on another's holds", func() error { _, err := e.c.Semaphore("{s}:holds", 2).TryAcquire(ctx); return err }, dlock.ErrInvalidName},
		{"inspect another's released marker", func() error { _, err := e.c.Inspect(ctx, "{s}:released"); return err }, dlock.ErrInvalidName},
		{"force-release another's pending acquires", func() error { _, err := e.c.ForceRelease(ctx, "{s}:pending"); return err }, dlock.ErrInvalidName},
		{"empty name in multi", func() error { _, err := e.c.TryLockMulti(ctx, []string{"a", ""}); return err }, dlock.ErrEmptyName},
		{"no names", func() error { _, err := e.c.LockMulti(ctx, nil); return err }, dlock.ErrNoNames},
		{"duplicate names", func() error { _, err := e.c.TryLockMulti(ctx, []string{"a", "a"}); return err }, dlock.ErrDuplicateName},
		{"names of one lock", func() error { _, err := e.c.TryLockMulti(ctx, []string{"a", "{a}"}); return err }, dlock.ErrDuplicateName},
		{"names of one lock among many", func() error {
			_, err := e.c.TryLockMulti(ctx, []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "{e}"})
			return err
		}, dlock.ErrDuplicateName},
		{"zero TTL", func() error { _, err := e.c.TryLock(ctx, "k", dlock.WithTTL(0)); return err }, dlock.ErrInvalidTTL},
		{"negative TTL", func() error { _, err := e.c.TryLock(ctx, "k", dlock.WithTTL(-time.Second)); return err }, dlock.ErrInvalidTTL},
		{"sub-millisecond TTL", func() error { _, err := e.c.Lock(ctx, "k", dlock.WithTTL(500*time.Microsecond)); return err }, dlock.ErrInvalidTTL},
		{"empty token", func() error { _, err := e.c.TryLock(ctx, "k", dlock.WithToken("")); return err }, dlock.ErrInvalidToken},
		{"token with a space", func() error { _, err := e.c.TryLock(ctx, "k", dlock.WithToken("job 42")); return err }, dlock.ErrInvalidToken},
		{"empty owner", func() error { _, err := e.c.TryLock(ctx, "k", dlock.WithOwner("")); return err }, dlock.ErrInvalidOption},
		{"nil retry", func() error { _, err := e.c.Lock(ctx, "k", dlock.WithRetry(nil)); return err }, dlock.ErrInvalidOption},
		{"limit of a nil retry", func() error {
			_, err := e.c.Lock(ctx, "k", dlock.WithRetry(dlock.LimitRetry(nil, 3)))
			return err
		}, dlock.ErrInvalidOption},
		{"jitter of a nil retry", func() error {
			_, err := e.c.Lock(ctx, "k", dlock.WithRetry(dlock.Jitter(dlock.LimitRetry(nil, 3), 0.5)))
			return err
		}, dlock.ErrInvalidOption},
		{"nil retry func", func() error {
			var f dlock.RetryFunc
			_, err := e.c.Lock(ctx, "k", dlock.WithRetry(f))
			return err
		}, dlock.ErrInvalidOption},
		{"jitter of a nil retry func", func() error {
			var f dlock.RetryFunc
			_, err := e.c.Lock(ctx, "k", dlock.WithRetry(dlock.Jitter(f, 0.5)))
			return err
		}, dlock.ErrInvalidOption},
		{"zero max wait", func() error { _, err := e.c.Lock(ctx, "k", dlock.WithMaxWait(0)); return err }, dlock.ErrInvalidOption},
		{"zero min hold", func() error { _, err := e.c.TryLock(ctx, "k", dlock.WithMinHold(0)); return err }, dlock.ErrInvalidOption},
		{"negative min hold", func() error { _, err := e.c.Lock(ctx, "k", dlock.WithMinHold(-time.Second)); return err }, dlock.ErrInvalidOption},
		{"min hold of a read hold", func() error {
			_, err := e.c.RWMutex("doc").RLock(ctx, dlock.WithMinHold(time.Second))
			return err
		}, dlock.ErrInvalidOption},
		{"min hold of a write hold", func() error {
			_, err := e.c.RWMutex("doc").TryLock(ctx, dlock.WithMinHold(time.Second))
			return err
		}, dlock.ErrInvalidOption},
		{"min hold of a permit", func() error {
			_, err := e.c.Semaphore("s", 2).Acquire(ctx, dlock.WithMinHold(time.Second))
			return err
		}, dlock.ErrInvalidOption},
		{"refresh interval past the deadline", func() error {
			// The deadline is 100ms less 3ms for clock drift.
			_, err := e.c.TryLock(ctx, "k", dlock.WithTTL(100*time.Millisecond), dlock.WithRefreshInterval(98*time.Millisecond))
			return err
		}, dlock.ErrInvalidOption},
		{"attach empty token", func() error { _, err := e.c.Attach(ctx, "k", ""); return err }, dlock.ErrInvalidToken},
		{"attach token with a space", func() error { _, err := e.c.Attach(ctx, "k", "job 42"); return err }, dlock.ErrInvalidToken},
		{"attach nil context", func() error { _, err := e.c.Attach(nilCtx, "k", "t"); return err }, dlock.ErrNilContext},
	}
	before := e.drv.trips.Load()
	for _, tc := range cases {
		err := tc.do()
		if !errors.Is(err, tc.want) || !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
		// Which name of several is at fault, and only then.
		if msg := fmt.Sprint(err); strings.Contains(msg, "name 1 of 1") || tc.name == "empty owner" && !strings.Contains(msg, "is empty") {
			t.Errorf("%s: %q", tc.name, msg)
		}
	}
	if n := e.drv.trips.Load() - before; n != 0 {
		t.Errorf("bad input made %d round trips", n)
	}
	if keys := e.srv.Do(t, "DBSIZE"); keys != "0" {
		t.Errorf("bad input left %s keys", keys)
	}
}

// A name with a hash tag of its own is its key: one that ends like the
// other keys of a lock would be one of them ("{doc}:queue" is the queue of
// the read/write lock "{doc}", whose release deleted it under its holder).
// Without a tag, such an ending is an ordinary name.
func TestANameCannotBeAnotherLocksKey(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.c.TryLock(ctx, "{doc}:queue"); !errors.Is(err, dlock.ErrInvalidName) {
		t.Fatalf("TryLock {doc}:queue: err = %v, want ErrInvalidName", err)
	}
	w, err := e.c.RWMutex("{doc}").TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := e.c.TryLock(ctx, "doc:queue")
	if err != nil {
		t.Fatalf("a name without a tag ending in :queue: %v", err)
	}
	if got, want := e.c.RedisKey("doc:queue"), "dlock:{doc:queue}"; got != want {
		t.Errorf("RedisKey = %q, want %q", got, want)
	}
	for _, r := range []interface{ Release(context.Context) error }{w, l} {
		if err := r.Release(ctx); err != nil {
			t.Error(err)
		}
	}
}

// A deferred Release usually gets the context of the request the lock
// served, which may have ended by then: the lock is given back all the same.
func TestReleaseWithAnEndedContextGivesTheLockBack(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	l, err := e.c.TryLock(ctx, "ended")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	info, err := e.c.Inspect(context.Background(), "ended")
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) != 0 {
		t.Errorf("still held: %+v", info.Holders)
	}
}

// Attaching to a name that another kind of lock holds says so.
func TestAttachToAnotherKindIsAKindMismatch(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	w, err := e.c.RWMutex("rw").TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release(ctx)
	_, err = e.c.Attach(ctx, "rw", w.Token())
	if !errors.Is(err, dlock.ErrKindMismatch) || !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("err = %v, want ErrNotHeld and ErrKindMismatch", err)
	} else if want := `"rw" is a writer-preferring read/write lock`; !strings.Contains(err.Error(), want) {
		t.Errorf("err = %v, want it to say %s", err, want)
	}
}

// Attaching to a free name, or one whose lock expired, is ErrNotHeld alone.
func TestAttachToAFreeNameIsNotHeld(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "expires", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "DEL", "dlock:{expires}")
	for _, name := range []string{"never-locked", "expires"} {
		for _, opts := range [][]dlock.Option{nil, {dlock.WithOwner("o")}} {
			_, err := e.c.Attach(ctx, name, l.Token(), opts...)
			if !errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrKindMismatch) || errors.Is(err, dlock.ErrWrongType) {
				t.Errorf("Attach to %s (%d options): err = %v, want ErrNotHeld alone", name, len(opts), err)
			}
		}
	}
}

// Attaching to a hold an operator made permanent (PERSIST) gives a Lock
// held for the TTL its refreshes give it, not one lost at once; with
// several names, the least TTL of those that have one counts, whatever
// their order.
func TestAttachToAHoldWithNoExpiry(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "persisted", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "PERSIST", "dlock:{persisted}")
	a, err := e.c.Attach(ctx, "persisted", l.Token(), dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(a.Deadline()); left < 9*time.Second || left > 10*time.Second {
		t.Errorf("attached to a hold with no expiry: %v left, want about the 10s TTL", left)
	}
	if err := a.Err(); err != nil {
		t.Errorf("Err = %v, want nil", err)
	}
	if err := a.Refresh(ctx, 10*time.Second); err != nil {
		t.Errorf("Refresh: %v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, persisted := range []string{"first", "second"} {
		m, err := e.c.TryLockMulti(ctx, []string{"first", "second"}, dlock.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		e.srv.Do(t, "PERSIST", "dlock:{"+persisted+"}")
		a, err := e.c.AttachMulti(ctx, []string{"first", "second"}, m.Token(), dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if left := time.Until(a.Deadline()); left > 5*time.Second {
			t.Errorf("%s persisted: %v left, more than the other name's 5s", persisted, left)
		}
		if left, err := m.TTL(ctx); err != nil || left > 5*time.Second || left <= 0 {
			t.Errorf("%s persisted: TTL = %v, %v; want the other name's, up to 5s", persisted, left, err)
		}
		if err := m.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A Lock that finds its hold gone says what may have become of it: one
// whose token another Lock shares (attached) may have been released by
// that Lock; one whose token is its own cannot have been.
func TestALockFoundGoneSaysWhatMayHaveEndedIt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "shared", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	attached, err := e.c.Attach(ctx, "shared", l.Token())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	err = attached.Release(ctx)
	if want := `"shared" had expired, was taken, or was released by another Lock of its token`; !errors.Is(err, dlock.ErrNotHeld) || !strings.Contains(err.Error(), want) {
		t.Errorf("Release of the attached Lock: err = %v, want ErrNotHeld saying %s", err, want)
	}
	own, err := e.c.TryLock(ctx, "own", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "DEL", "dlock:{own}")
	err = own.Release(ctx)
	if want := `"own" had expired or was taken`; !errors.Is(err, dlock.ErrNotHeld) || !strings.HasSuffix(err.Error(), want) {
		t.Errorf("Release of a Lock whose hold was deleted: err = %v, want ErrNotHeld saying %s", err, want)
	}
}

// Attaching to a name whose key holds data dlock did not write says so,
// as acquiring it does, and leaves the data alone.
func TestAttachToOtherDataIsWrongType(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Do(t, "SET", "dlock:{str}", "user data")
	e.srv.Do(t, "HSET", "dlock:{hash}", "field", "user data")
	for _, name := range []string{"str", "hash"} {
		_, err := e.c.Attach(ctx, name, "some-token")
		if !errors.Is(err, dlock.ErrWrongType) || !errors.Is(err, dlock.ErrNotHeld) || strings.Count(fmt.Sprint(err), "dlock: ") != 1 {
			t.Errorf("Attach to %s: err = %v, want ErrNotHeld and ErrWrongType, saying \"dlock: \" once", name, err)
		}
	}
	if got := e.srv.Do(t, "GET", "dlock:{str}"); got != "user data" {
		t.Errorf("the string is now %q", got)
	}
	if got := e.srv.Do(t, "HGET", "dlock:{hash}", "field"); got != "user data" {
		t.Errorf("the hash is now %s", got)
	}
}

// A TryLock whose reply comes back after the lock's TTL has run out fails
// as a request whose reply was lost does (a *ServerError, not a refusal:
// nobody else held the lock), and gives the lock back. The server keeps
// the key for a minute here, so that only the give-back frees it.
func TestATryLockWhoseReplyComesTooLateFailsAndGivesItBack(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var scripts []string // the scripts sent, in order
	d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		scripts = append(scripts, calls[0].Script.Name)
		if calls[0].Script.Name == "acquire" && calls[0].Err == nil {
			e.srv.Do(t, "PEXPIRE", "dlock:{slow}", "60000")
			time.Sleep(60 * time.Millisecond) // the reply is slow to come back
		}
	}}
	c := dlock.New(d)
	defer c.Close()
	_, err := c.TryLock(ctx, "slow", dlock.WithTTL(50*time.Millisecond))
	var serr *dlock.ServerError
	if !errors.As(err, &serr) || errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("err = %v, want a *ServerError, not ErrNotObtained", err)
	}
	if len(scripts) != 2 || scripts[0] != "acquire" || scripts[1] != "release" {
		t.Errorf("scripts sent: %v, want acquire then release", scripts)
	}
	if e.locked(t, "dlock:{slow}") {
		t.Error("the lock whose reply came too late is still held")
	}
}

// The errors of a lock on many names list a few of them, not every one.
func TestErrorsOfAManyNamedLockStayShort(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	names := make([]string, 1000)
	for i := range names {
		names[i] = "many-" + strconv.Itoa(i)
	}
	l, err := e.c.TryLockMulti(ctx, names)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	err = l.Release(ctx)
	if !errors.Is(err, dlock.ErrNotHeld) || !strings.Contains(err.Error(), "and 992 more") || len(err.Error()) > 300 {
		t.Errorf("err = %v", err)
	}
}

func TestReleaseOfANilLockPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	var l *dlock.Lock
	_ = l.Release(context.Background())
}

// TestMutualExclusionUnderContention has 16 workers, each with its own
// client, take one lock 20 times each. Inside the critical section a
// detector counts holders and a counter is incremented without atomics: any
// overlap shows as a second holder or a lost increment.
func TestMutualExclusionUnderContention(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const workers, rounds = 16, 20
	var inside, overlaps atomic.Int32
	counter := 0
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		c := e.newClient(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				l, err := c.Lock(ctx, "contended", dlock.WithTTL(5*time.Second))
				if err != nil {
					errs <- err
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				v := counter
				time.Sleep(50 * time.Microsecond)
				counter = v + 1
				inside.Add(-1)
				if err := l.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if overlaps.Load() != 0 {
		t.Errorf("%d overlapping holders", overlaps.Load())
	}
	if counter != workers*rounds {
		t.Errorf("counter = %d, want %d", counter, workers*rounds)
	}
}

func TestRedisRestartWhileHeld(t *testing.T) {
	ctx := context.Background()
	t.Run("without persistence the lock is lost", func(t *testing.T) {
		e := newEnv(t)
		l, err := e.c.TryLock(ctx, "restart", dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		e.srv.Restart(t)
		if err := l.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
			t.Errorf("Refresh after restart: err = %v, want ErrNotHeld", err)
		}
		l2, err := e.newClient(t).TryLock(ctx, "restart")
		if err != nil {
			t.Fatalf("TryLock after restart: %v", err)
		}
		if l2.Fence() <= l.Fence() {
			t.Errorf("fence went backwards across a restart: %d then %d", l.Fence(), l2.Fence())
		}
	})
	t.Run("with persistence the lock survives", func(t *testing.T) {
		e := newEnv(t, redistest.WithArgs("--appendonly", "yes", "--appendfsync", "always"))
		l, err := e.c.TryLock(ctx, "restart", dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		e.srv.Restart(t)
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Errorf("Refresh after restart: %v", err)
		}
		if _, err := e.newClient(t).TryLock(ctx, "restart"); !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("TryLock by another after restart: err = %v, want ErrNotObtained", err)
		}
	})
}

func TestKeyLayout(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.newClient(t, dlock.WithPrefix("app:locks:"))
	l, err := c.TryLock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if !e.exists(t, "app:locks:{report}") || !e.exists(t, "app:locks:{report}:fence") {
		t.Errorf("keys: %s", e.srv.Do(t, "KEYS", "*"))
	}
	// Another prefix is another namespace.
	if _, err := e.c.TryLock(ctx, "report"); err != nil {
		t.Errorf("default prefix collided with a custom one: %v", err)
	}
	_ = l.Release(ctx)
	for name, want := range map[string]string{
		"orders:42":      "dlock:{orders:42}",
		"{order:42}:pay": "dlock:{order:42}:pay",
		"a{}b":           "dlock:{a{}b}",
	} {
		if got := e.c.RedisKey(name); got != want {
			t.Errorf("RedisKey(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestScriptsOnTheServer(t *testing.T) {
	e := newEnv(t)
	for _, s := range dlock.Scripts() {
		if got := e.srv.Do(t, "SCRIPT", "LOAD", s.Src); got != s.SHA1 {
			t.Errorf("%s: server hash %s, shipped %s", s.Name, got, s.SHA1)
		}
	}
	// After a SCRIPT FLUSH, EVALSHA fails with NOSCRIPT and the driver falls
	// back to EVAL.
	e.srv.Do(t, "SCRIPT", "FLUSH")
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "flushed")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// repeatDriver sends every release twice, as a client library does when a
// reply is lost and it sends the request again.
type repeatDriver struct{ dlock.Driver }

func (d repeatDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	d.Driver.Eval(ctx, calls...)
	for _, c := range calls {
		if c.Script.Name == "release" || c.Script.Name == "holds_release" {
			d.Driver.Eval(ctx, c)
		}
	}
}

// TestARepeatedReleaseCountsOnce: a release sent twice reports success and
// takes away one hold, not two.
func TestARepeatedReleaseCountsOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := dlock.New(repeatDriver{e.newDriver(t)})
	defer c.Close()
	l, err := c.TryLock(ctx, "twice")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("a release sent twice: %v", err)
	}
	outer, err := c.TryLock(ctx, "owned", dlock.WithOwner("job-1"))
	if err != nil {
		t.Fatal(err)
	}
	inner, err := c.TryLock(ctx, "owned", dlock.WithOwner("job-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := inner.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.TryLock(ctx, "owned"); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("a repeated release of one hold freed a lock held twice: %v", err)
	}
	if err := outer.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Releases of one Lock called before any of them has returned each
// return nil, also one that starts while the first, its reply in, is
// still ending the lease (here held up in the End hook).
func TestReleasesCalledAtOnceEachReturnNil(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ending, proceed := make(chan struct{}), make(chan struct{})
	c := dlock.New(e.newDriver(t), dlock.WithHooks(dlock.Hooks{End: func(dlock.HookInfo, time.Duration, error) {
		close(ending)
		<-proceed
	}}))
	defer c.Close()
	for _, kind := range []struct {
		name    string
		acquire func() (*dlock.Lock, error)
	}{
		{"lock", func() (*dlock.Lock, error) { return c.TryLock(ctx, "at-once") }},
		{"permit", func() (*dlock.Lock, error) { return c.Semaphore("at-once-s", 2).TryAcquire(ctx) }},
	} {
		ending, proceed = make(chan struct{}), make(chan struct{})
		l, err := kind.acquire()
		if err != nil {
			t.Fatal(err)
		}
		first := make(chan error, 1)
		go func() { first <- l.Release(ctx) }()
		<-ending // the first has its reply, and has not returned
		if err := l.Release(ctx); err != nil {
			t.Errorf("%s: a Release called before the first returned: %v", kind.name, err)
		}
		close(proceed)
		if err := <-first; err != nil {
			t.Errorf("%s: the first Release: %v", kind.name, err)
		}
		if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
			t.Errorf("%s: a Release called after one returned: err = %v, want ErrNotHeld", kind.name, err)
		}
		// And so do Releases called together after that.
		late := make(chan error, 2)
		for range 2 {
			go func() { late <- l.Release(ctx) }()
		}
		for range 2 {
			if err := <-late; !errors.Is(err, dlock.ErrNotHeld) {
				t.Errorf("%s: Releases called together after one returned: err = %v, want ErrNotHeld", kind.name, err)
			}
		}
	}
}

// TestARepeatedHoldReleaseCountsOnce: the release of a read hold, a write
// hold or a permit sent twice reports success and takes away one hold of a
// re-entered one, not two.
func TestARepeatedHoldReleaseCountsOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := dlock.New(repeatDriver{e.newDriver(t)})
	defer c.Close()
	obtainers := []struct {
		what   string
		obtain func(name string, opts ...dlock.Option) (*dlock.Lock, error)
		other  func(name string) error // another client tries to get in
	}{
		{"read hold", func(name string, opts ...dlock.Option) (*dlock.Lock, error) {
			return c.RWMutex(name).TryRLock(ctx, opts...)
		}, func(name string) error { _, err := e.c.RWMutex(name).TryLock(ctx); return err }},
		{"write hold", func(name string, opts ...dlock.Option) (*dlock.Lock, error) {
			return c.RWMutex(name).TryLock(ctx, opts...)
		}, func(name string) error { _, err := e.c.RWMutex(name).TryRLock(ctx); return err }},
		{"permit", func(name string, opts ...dlock.Option) (*dlock.Lock, error) {
			return c.Semaphore(name, 1).TryAcquire(ctx, opts...)
		}, func(name string) error { _, err := e.c.Semaphore(name, 1).TryAcquire(ctx); return err }},
	}
	for _, o := range obtainers {
		name := strings.ReplaceAll(o.what, " ", "-")
		l, err := o.obtain(name)
		if err != nil {
			t.Fatalf("%s: %v", o.what, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("%s: a release sent twice: %v", o.what, err)
		}
		outer, err := o.obtain(name, dlock.WithOwner("job-1"))
		if err != nil {
			t.Fatalf("%s: %v", o.what, err)
		}
		inner, err := o.obtain(name, dlock.WithOwner("job-1"))
		if err != nil {
			t.Fatalf("%s: re-entry: %v", o.what, err)
		}
		if err := inner.Release(ctx); err != nil {
			t.Errorf("%s: a release sent twice: %v", o.what, err)
		}
		if err := o.other(name); !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("%s: a repeated release of one hold freed a name held twice: %v", o.what, err)
		}
		if err := outer.Release(ctx); err != nil {
			t.Errorf("%s: %v", o.what, err)
		}
		if err := o.other(name); err != nil {
			t.Errorf("%s: released twice, the name stays taken: %v", o.what, err)
		}
	}
}

func TestAReleasedLockIsAFreeName(t *testing.T) {
	// A released lock keeps its hash for a minute, with an empty token, so
	// that the next holder finds its fence and a repeated release its id
	// in one read. Everything treats that hash as a free name.
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "kept", dlock.WithOwner("worker-1"), dlock.WithMetadata("host a"))
	if err != nil {
		t.Fatal(err)
	}
	fence := l.Fence()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := strconv.Atoi(e.srv.Do(t, "PTTL", "dlock:{kept}")); ttl <= 0 || ttl > 60_000 {
		t.Errorf("released lock's hash PTTL = %d ms, want at most a minute", ttl)
	}
	if got := e.srv.Do(t, "HMGET", "dlock:{kept}", "token", "owner", "meta"); strings.TrimSpace(got) != "" {
		t.Errorf("released lock's hash keeps token, owner or metadata: %q", got)
	}
	if keys := e.srv.Do(t, "KEYS", "*"); strings.Contains(keys, ":released") {
		t.Errorf("an exclusive release left a marker key: %s", keys)
	}
	if info, err := e.c.Inspect(ctx, "kept"); err != nil || info.Kind != dlock.KindNone || len(info.Holders) != 0 || info.Fence != fence {
		t.Errorf("Inspect = %+v, %v; want a free name with fence %d", info, err, fence)
	}
	if infos, err := e.c.List(ctx, "*"); err != nil || len(infos) != 0 {
		t.Errorf("List = %v, %v; want nothing", infos, err)
	}
	for _, op := range []func(*dlock.Lock) error{
		func(l *dlock.Lock) error { return l.Refresh(ctx, time.Minute) },
		func(l *dlock.Lock) error { _, err := l.TTL(ctx); return err },
	} {
		if err := op(l); !errors.Is(err, dlock.ErrNotHeld) {
			t.Errorf("on the released lock: err = %v, want ErrNotHeld", err)
		}
	}

	// The same owner gets a new hold, not a re-entry of the released one.
	again, err := e.newClient(t).TryLock(ctx, "kept", dlock.WithOwner("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	if again.Fence() <= fence {
		t.Errorf("fence %d after %d", again.Fence(), fence)
	}
	if info, err := e.c.Inspect(ctx, "kept"); err != nil || len(info.Holders) != 1 || info.Holders[0].Count != 1 || info.Holders[0].Metadata != "" {
		t.Errorf("Inspect = %+v, %v; want one new hold, count 1, no metadata", info, err)
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{kept}") {
		t.Error("one release did not free a hold taken once")
	}

	// Other kinds take the name, and fences keep growing across kinds.
	w, err := e.c.RWMutex("kept").TryLock(ctx)
	if err != nil {
		t.Fatalf("write lock on a released exclusive lock's name: %v", err)
	}
	if w.Fence() <= again.Fence() {
		t.Errorf("write fence %d after exclusive fence %d", w.Fence(), again.Fence())
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	x, err := e.c.TryLock(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	if x.Fence() <= w.Fence() {
		t.Errorf("exclusive fence %d after write fence %d", x.Fence(), w.Fence())
	}
	if err := x.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := e.c.Semaphore("kept", 2).TryAcquire(ctx)
	if err != nil {
		t.Fatalf("permit on a released exclusive lock's name: %v", err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestAReentryWhoseReplyWasLostIsTakenBack(t *testing.T) {
	// The owner's second acquisition runs but its reply is lost: the
	// cleanup that follows takes back the count it added, once, and the
	// first acquisition's release then frees the lock.
	e := newEnv(t)
	ctx := context.Background()
	first, err := e.c.TryLock(ctx, "rejoin", dlock.WithOwner("job-7"))
	if err != nil {
		t.Fatal(err)
	}
	e.drv.loseReplies(1)
	if _, err := e.c.TryLock(ctx, "rejoin", dlock.WithOwner("job-7")); err == nil || errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("err = %v, want the transport error", err)
	}
	if got := e.srv.Do(t, "HGET", "dlock:{rejoin}", "count"); got != "1" {
		t.Errorf("count %s after the lost re-entry was cleaned up, want 1", got)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{rejoin}") {
		t.Error("the first acquisition's release did not free the lock")
	}
}

// TestTTLsWithinTheDriftAllowanceAreRefused: a lock's deadline is its TTL
// less 1% and 2ms for clock drift, so a TTL of 2ms or less would have its
// deadline before the request that obtains it: no lock could ever be
// obtained. Such TTLs are refused up front, with the minimum in the message.
func TestTTLsWithinTheDriftAllowanceAreRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, ttl := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 2500 * time.Microsecond} {
		_, err := e.c.TryLock(ctx, "brief", dlock.WithTTL(ttl))
		if !errors.Is(err, dlock.ErrInvalidTTL) || !strings.Contains(err.Error(), "3ms") {
			t.Errorf("WithTTL(%v): err = %v, want ErrInvalidTTL naming the 3ms minimum", ttl, err)
		}
	}
	l, err := e.c.TryLock(ctx, "brief")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, 2*time.Millisecond); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Errorf("Refresh(2ms): err = %v, want ErrInvalidTTL", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// 3ms passes: the attempt may still come back too late to count on a
	// loaded machine, but it is made.
	if _, err := e.c.TryLock(ctx, "brief", dlock.WithTTL(3*time.Millisecond)); errors.Is(err, dlock.ErrInvalidTTL) {
		t.Errorf("WithTTL(3ms): err = %v", err)
	}
}

// A nil ClientOption is skipped, as a nil Option is.
func TestANilClientOptionIsSkipped(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := dlock.New(e.drv, nil, dlock.WithPrefix("nilopt:"), nil)
	defer c.Close()
	l, err := c.TryLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.RedisKey("k"); !strings.HasPrefix(got, "nilopt:") {
		t.Errorf("RedisKey = %q: the options after nil were not applied", got)
	}
}

// awaitErr returns what got gives, failing the test if it gives nothing
// within 10 seconds: who has not returned.
func awaitErr(t *testing.T, got <-chan error, who string) error {
	t.Helper()
	select {
	case err := <-got:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s has not returned", who)
		return nil
	}
}

// copyingDriver keeps a copy of every acquire (of every kind), to be sent again late with
// sendCopies, as a client library resending it, or a connection slow to
// deliver it, would. With holdBack, the first acquire does not reach the
// server: its caller sees it fail as a lost request does.
type copyingDriver struct {
	dlock.Driver
	mu       sync.Mutex
	holdBack bool
	// holdBackAsking holds back, instead, the first attempt that asks to
	// be granted the lock (a waiting caller's, see grant.lua).
	holdBackAsking bool
	// pick names a script whose next call is held back (see
	// holdBackScript), or, with pickSends, copied and sent (see copyScript).
	pick      string
	pickSends bool
	kept      []*dlock.Call
}

// copyScript keeps a copy of the next call of the script called name, alone
// (what was kept goes), and sends it too: the client library sent it
// again, its second copy answered, and the first, held up on a connection
// given up on, reaches Redis when sendCopies sends it.
func (d *copyingDriver) copyScript(name string) {
	d.mu.Lock()
	d.pick, d.pickSends, d.kept = name, true, nil
	d.mu.Unlock()
}

// takeCopies returns the calls kept, and forgets them; putCopies keeps
// calls again.
func (d *copyingDriver) takeCopies() []*dlock.Call {
	d.mu.Lock()
	defer d.mu.Unlock()
	kept := d.kept
	d.kept = nil
	return kept
}

func (d *copyingDriver) putCopies(calls []*dlock.Call) {
	d.mu.Lock()
	d.kept = calls
	d.mu.Unlock()
}

// holdBackScript holds back the next call of the script called name, alone
// (what was kept goes): its caller sees its reply lost, and sendCopies sends
// it later, as a connection the client gave up on may still deliver it.
func (d *copyingDriver) holdBackScript(name string) {
	d.mu.Lock()
	d.pick, d.pickSends, d.kept = name, false, nil
	d.mu.Unlock()
}

// heldBack reports whether the call holdBackScript asked for was held back.
func (d *copyingDriver) heldBack() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pick == "" && len(d.kept) > 0
}

func (d *copyingDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	var send []*dlock.Call
	d.mu.Lock()
	for _, c := range calls {
		if d.pick != "" && c.Script.Name == d.pick {
			d.pick = ""
			d.kept = append(d.kept, &dlock.Call{Script: c.Script, Keys: slices.Clone(c.Keys), Args: slices.Clone(c.Args)})
			if !d.pickSends {
				c.Err = errLostReply
				continue
			}
		}
		if strings.HasSuffix(c.Script.Name, "acquire") {
			asking := len(c.Args) > 7 && c.Args[7] != ""
			if d.holdBackAsking && !asking {
				send = append(send, c)
				continue
			}
			d.kept = append(d.kept, &dlock.Call{Script: c.Script, Keys: slices.Clone(c.Keys), Args: slices.Clone(c.Args)})
			if d.holdBack || d.holdBackAsking {
				d.holdBack, d.holdBackAsking = false, false
				c.Err = errLostReply
				continue
			}
		}
		send = append(send, c)
	}
	d.mu.Unlock()
	if len(send) > 0 {
		d.Driver.Eval(ctx, send...)
	}
}

// sendCopies sends the kept calls again, and returns their replies.
func (d *copyingDriver) sendCopies(t *testing.T) []any {
	t.Helper()
	d.mu.Lock()
	kept := d.kept
	d.kept = nil
	d.mu.Unlock()
	if len(kept) == 0 {
		t.Fatal("no acquire was kept")
	}
	d.Driver.Eval(context.Background(), kept...)
	var out []any
	for _, c := range kept {
		if c.Err != nil {
			t.Fatalf("late %s: %v", c.Script.Name, c.Err)
		}
		out = append(out, c.Val)
	}
	return out
}

// refusal reports whether an acquire's reply is a refusal ({0, pttl, i},
// and for a read/write lock whether the caller is queued).
func refusal(v any) bool {
	r, ok := v.([]any)
	return ok && len(r) >= 3 && r[0] == int64(0)
}

// A copy of an acquire that reaches the server after its Lock was
// released takes nothing: the name stays free, where it was held for
// nobody until its TTL.
func TestALateCopyOfAReleasedAcquireTakesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &copyingDriver{Driver: e.newDriver(t)}
	c := dlock.New(d)
	defer c.Close()
	l, err := c.TryLockMulti(ctx, []string{"late-a", "late-b"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := d.sendCopies(t); !refusal(r[0]) {
		t.Errorf("late acquire replied %v, want a refusal", r[0])
	}
	for _, k := range []string{"dlock:{late-a}", "dlock:{late-b}"} {
		if e.locked(t, k) {
			t.Errorf("%s is held after a late copy of a released acquire", k)
		}
	}
	if _, err := e.c.TryLock(ctx, "late-b"); err != nil {
		t.Errorf("TryLock after the late copy: %v", err)
	}
}

// A copy of an acquire that reaches the server after its caller gave it
// up (the request seemed lost, and the clean-up found nothing to take
// back) takes nothing either.
func TestALateCopyOfAnAcquireGivenUpTakesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &copyingDriver{Driver: e.newDriver(t), holdBack: true}
	c := dlock.New(d)
	defer c.Close()
	if _, err := c.TryLock(ctx, "given-up"); !errors.Is(err, errLostReply) {
		t.Fatalf("err = %v, want the lost request's", err)
	}
	if r := d.sendCopies(t); !refusal(r[0]) {
		t.Errorf("late acquire replied %v, want a refusal", r[0])
	}
	if e.locked(t, "dlock:{given-up}") {
		t.Error("a late copy of an acquire given up holds the lock")
	}
	l, err := e.c.TryLock(ctx, "given-up")
	if err != nil {
		t.Fatalf("TryLock after the late copy: %v", err)
	}
	if l.Fence() == 0 {
		t.Error("no fence")
	}
}

// holdThatRunsOut takes name with e's client for a hold that runs out in
// 100ms: one whose holder dies, or, with minHold, one released at once and
// kept for the rest of its minimum hold.
func holdThatRunsOut(t *testing.T, e *env, name string, minHold bool) {
	t.Helper()
	ctx := context.Background()
	opts := []dlock.Option{dlock.WithTTL(100 * time.Millisecond)}
	if minHold {
		opts = []dlock.Option{dlock.WithTTL(time.Minute), dlock.WithMinHold(100 * time.Millisecond)}
	}
	l, err := e.c.TryLock(ctx, name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if minHold {
		if err := l.Release(ctx); err != nil { // kept for the rest of its minimum hold
			t.Fatal(err)
		}
	}
}

// A late copy of an acquire given up while another held the name takes
// nothing when that hold has run out since, and its hash with it: a hold
// kept for its minimum hold, one whose holder died, and one another holder
// took and released since. The clean-up's record went with the hash, and
// the copy took the name, for nobody, until its TTL.
func TestALateCopyOfAnAcquireGivenUpOutlivesTheHoldItMet(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, how := range []string{"min hold", "holder died", "taken since"} {
		t.Run(how, func(t *testing.T) {
			name := "outlived-" + strings.ReplaceAll(how, " ", "-")
			key := "dlock:{" + name + "}"
			holdThatRunsOut(t, e, name, how == "min hold")
			d := &copyingDriver{Driver: e.newDriver(t), holdBack: true}
			c := dlock.New(d)
			defer c.Close()
			if _, err := c.TryLock(ctx, name, dlock.WithTTL(time.Minute)); !errors.Is(err, errLostReply) {
				t.Fatalf("err = %v, want the lost request's", err)
			}
			awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "EXISTS", key) == "0" })
			if how == "taken since" {
				churn(ctx, t, e.c, name, 1)
			}
			if r := d.sendCopies(t); !refusal(r[0]) {
				t.Errorf("late acquire replied %v, want a refusal", r[0])
			}
			if e.locked(t, key) {
				t.Error("a late copy of an acquire given up holds the lock")
			}
			if l, err := e.c.TryLock(ctx, name); err != nil {
				t.Errorf("TryLock after the late copy: %v", err)
			} else if err := l.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
}

// The same when the hold that ran out was taken after the clean-up (which
// found no hash and left a free one with its record): the record went
// with that hold's hash.
func TestALateCopyOfAnAcquireGivenUpOutlivesAHoldTakenAfterIt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, how := range []string{"holder died", "min hold"} {
		t.Run(how, func(t *testing.T) {
			name := "after-" + how
			key := "dlock:{" + name + "}"
			d := &copyingDriver{Driver: e.newDriver(t), holdBack: true}
			c := dlock.New(d)
			defer c.Close()
			// The acquire is held back (never sent): the clean-up finds no
			// hash and leaves a free one, with the word in 'rel' and 'late'.
			if _, err := c.TryLock(ctx, name, dlock.WithTTL(time.Minute)); !errors.Is(err, errLostReply) {
				t.Fatalf("err = %v, want the lost request's", err)
			}
			if late := e.srv.Do(t, "HGET", key, "late"); late == "" || late == "(nil)" {
				t.Fatalf("no late record after the clean-up: %q", late)
			}
			// Another holder takes the free hash, and its hold runs out.
			holdThatRunsOut(t, e, name, how == "min hold")
			awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "EXISTS", key) == "0" })
			if r := d.sendCopies(t); !refusal(r[0]) {
				t.Errorf("late acquire replied %v, want a refusal", r[0])
			}
			if e.locked(t, key) {
				t.Errorf("a late copy of an acquire given up holds the lock (pttl %s)", e.srv.Do(t, "PTTL", key))
			}
		})
	}
}

// A late copy of a waiting caller's attempt that asked to be granted the
// lock, given up while another held the name, is not granted it when the
// hash holding the clean-up's record ran out before the copy came and
// another holder took the name: the copy leaves its request with the new
// hold, and its release granted it, for nobody (until the waiting client,
// if it still listened, gave it back).
func TestALateCopyOfAnAttemptThatAskedIsNotGrantedTheLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const name = "late-ask"
	key := "dlock:{" + name + "}"
	holdThatRunsOut(t, e, name, false)
	d := &copyingDriver{Driver: e.newDriver(t), holdBackAsking: true}
	c := dlock.New(d)
	defer c.Close()
	// The caller gives up before the hold runs out.
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Lock(wctx, name, dlock.WithTTL(time.Minute)); err == nil {
		t.Fatal("Lock obtained a lock held by another")
	}
	if late := e.srv.Do(t, "GET", key+":late"); late == "" || late == "(nil)" {
		t.Fatalf("no late record after the clean-up: %q", late)
	}
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "EXISTS", key) == "0" })
	l, err := e.c.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if r := d.sendCopies(t); !refusal(r[0]) {
		t.Fatalf("late attempt replied %v, want a refusal", r[0])
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Read at once: the release ran whole, and a grant would be there now.
	if e.locked(t, key) {
		t.Errorf("the release granted the lock to a late copy of an attempt given up (pttl %s)", e.srv.Do(t, "PTTL", key))
	}
	if l, err := e.c.TryLock(ctx, name); err != nil {
		t.Errorf("TryLock after the release: %v", err)
	} else if err := l.Release(ctx); err != nil {
		t.Error(err)
	}
}

// The same for a re-entry (WithOwner) cleaned up: when the owner's hold
// ran out, its late copy took the name afresh, for nobody.
func TestALateCopyOfAReentryGivenUpOutlivesItsOwnersHold(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, how := range []string{"holder died", "min hold"} {
		t.Run(how, func(t *testing.T) {
			name := "reentry-" + how
			key := "dlock:{" + name + "}"
			first := []dlock.Option{dlock.WithOwner("o"), dlock.WithTTL(150 * time.Millisecond)}
			again := []dlock.Option{dlock.WithOwner("o"), dlock.WithTTL(150 * time.Millisecond)}
			if how == "min hold" {
				first = []dlock.Option{dlock.WithOwner("o"), dlock.WithTTL(time.Minute), dlock.WithMinHold(150 * time.Millisecond)}
				again = []dlock.Option{dlock.WithOwner("o"), dlock.WithTTL(time.Minute)}
			}
			l, err := e.c.TryLock(ctx, name, first...)
			if err != nil {
				t.Fatal(err)
			}
			tap := e.newDriver(t)
			d := &copyingDriver{Driver: tap}
			c := dlock.New(d)
			defer c.Close()
			tap.loseReplies(1) // the re-entry runs, its reply is lost: cleaned up
			if _, err := c.TryLock(ctx, name, again...); !errors.Is(err, errLostReply) {
				t.Fatalf("err = %v, want the lost request's", err)
			}
			if n := e.srv.Do(t, "HGET", key, "count"); n != "1" {
				t.Fatalf("count = %s after the clean-up, want 1", n)
			}
			if how == "min hold" {
				if err := l.Release(ctx); err != nil { // kept for the rest of its min hold
					t.Fatal(err)
				}
			}
			awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "EXISTS", key) == "0" })
			if r := d.sendCopies(t); !refusal(r[0]) {
				t.Errorf("late copy of the re-entry replied %v, want a refusal", r[0])
			}
			if e.locked(t, key) {
				t.Errorf("a late copy of a re-entry cleaned up holds the lock (owner %s, pttl %s)",
					e.srv.Do(t, "HGET", key, "owner"), e.srv.Do(t, "PTTL", key))
			}
		})
	}
}

// The same when a Release of a lock that had expired, finding no hash,
// made a free one without the record: the copy took the free name.
func TestALateCopyOfAnAcquireGivenUpOutlivesAFreeHashMadeAnew(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	name := "free-anew"
	key := "dlock:{" + name + "}"
	old, err := e.c.TryLock(ctx, name, dlock.WithTTL(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "EXISTS", key) == "0" })
	if _, err := e.c.TryLock(ctx, name, dlock.WithTTL(300*time.Millisecond)); err != nil { // dies
		t.Fatal(err)
	}
	d := &copyingDriver{Driver: e.newDriver(t), holdBack: true}
	c := dlock.New(d)
	defer c.Close()
	if _, err := c.TryLock(ctx, name, dlock.WithTTL(time.Minute)); !errors.Is(err, errLostReply) {
		t.Fatalf("err = %v, want the lost request's", err)
	}
	if !e.exists(t, key+":late") {
		t.Fatal("no late key")
	}
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "EXISTS", key) == "0" })
	if err := old.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release of the expired lock = %v", err)
	}
	if r := d.sendCopies(t); !refusal(r[0]) {
		t.Errorf("late acquire replied %v, want a refusal", r[0])
	}
	if e.locked(t, key) {
		t.Error("a late copy of an acquire given up holds the lock")
	}
}

// churn takes and releases name n times with c, pushing the records of
// earlier releases out of the few a lock's hash keeps (eight to ten).
func churn(ctx context.Context, t *testing.T, c *dlock.Client, name string, n int, opts ...dlock.Option) {
	t.Helper()
	for range n {
		l, err := c.TryLock(ctx, name, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A late copy of an acquire given up takes nothing even when the name was
// released many times since its clean-up, as a name released hundreds of
// times a second is within the 100 ms such a copy can take: the clean-up's
// record stays for two seconds at least ('late'), where the release
// records kept it for the next eight releases or so.
func TestALateCopyOfAnAcquireGivenUpTakesNothingOnAHotName(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &copyingDriver{Driver: e.newDriver(t), holdBack: true}
	c := dlock.New(d)
	defer c.Close()
	if _, err := c.TryLock(ctx, "hot"); !errors.Is(err, errLostReply) {
		t.Fatalf("err = %v, want the lost request's", err)
	}
	churn(ctx, t, e.c, "hot", 12)
	if r := d.sendCopies(t); !refusal(r[0]) {
		t.Errorf("late acquire replied %v, want a refusal", r[0])
	}
	if e.locked(t, "dlock:{hot}") {
		t.Error("a late copy of an acquire given up holds the lock after 12 releases")
	}
}

// The same with an owner: a late copy of an owner's acquire given up would
// join the owner's hold, adding an acquisition nobody releases, and the
// name would stay taken while the owner came back to it.
func TestALateCopyOfAnOwnersAcquireGivenUpAddsNothingToItsHold(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	own := dlock.WithOwner("worker-1")
	held, err := e.c.TryLock(ctx, "owned", own)
	if err != nil {
		t.Fatal(err)
	}
	d := &copyingDriver{Driver: e.newDriver(t), holdBack: true}
	c := dlock.New(d)
	defer c.Close()
	if _, err := c.TryLock(ctx, "owned", own); !errors.Is(err, errLostReply) {
		t.Fatalf("err = %v, want the lost request's", err)
	}
	churn(ctx, t, e.c, "owned", 12, own)
	if r := d.sendCopies(t); !refusal(r[0]) {
		t.Errorf("late acquire replied %v, want a refusal", r[0])
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{owned}") {
		t.Error("the owner released its only acquisition, and the name is still held")
	}
}

// A lock hash's 'late' keeps the words of its clean-ups for two seconds
// from the last one, the last 64 of them, and lets the older ones go with
// their time: at the next clean-up, or emptied by the next release. A
// clean-up sent again adds no word, and keeps them two seconds more. A
// word or two keep the hash in Redis's compact encoding.
func TestACleanupsRecordStaysTwoSecondsForItsLast64(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	key := "dlock:{late}"
	late := func() (int64, []string) {
		t.Helper()
		f := strings.Fields(e.srv.Do(t, "HGET", key, "late"))
		if len(f) < 2 {
			t.Fatalf("late = %q, want a lapse and words", f)
		}
		lapse, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			t.Fatalf("late = %q: %v", f, err)
		}
		return lapse, f[1:]
	}
	nowMS := func() int64 {
		t.Helper()
		ms, err := strconv.ParseInt(e.srv.Do(t, "EVAL", "local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000)", "0"), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	var cleanup *dlock.Call // the last clean-up, as sent
	lost := func() {
		t.Helper()
		c := dlock.New(&copyingDriver{Driver: &hookDriver{Driver: e.drv, before: func(calls []*dlock.Call) {
			for _, call := range calls {
				if call.Script.Name == "release" {
					cleanup = &dlock.Call{Script: call.Script, Keys: call.Keys, Args: call.Args}
				}
			}
		}}, holdBack: true})
		defer c.Close()
		if _, err := c.TryLock(ctx, "late"); !errors.Is(err, errLostReply) {
			t.Fatalf("err = %v, want the lost request's", err)
		}
	}
	before := nowMS()
	lost()
	lapse, words := late()
	if after := nowMS(); lapse < before+2000 || lapse > after+2000 {
		t.Errorf("lapse %d, want 2 s after the clean-up, between %d and %d", lapse, before+2000, after+2000)
	}
	churn(ctx, t, e.c, "late", 3)
	lost()
	if _, w := late(); len(w) != 2 || w[0] != words[0] {
		t.Fatalf("words after a second clean-up: %q, want the first one's %q, then its own", w, words[0])
	}
	if enc := e.srv.Do(t, "OBJECT", "ENCODING", key); enc != "listpack" {
		t.Errorf("encoding with two clean-ups' words: %s, want listpack", enc)
	}

	// Their time up, the words go at the next clean-up.
	e.srv.Do(t, "HSET", key, "late", "1 AAAAAAAAAAA")
	lost()
	_, words = late()
	if len(words) != 1 || words[0] == "AAAAAAAAAAA" {
		t.Errorf("words after a clean-up past the lapse: %q, want its own alone", words)
	}

	// Sent again when their time is up (a clean-up that got no answer in
	// time is sent again for up to a minute), it keeps its word two seconds
	// more, and adds it once.
	e.srv.Do(t, "HSET", key, "late", "1 "+words[0])
	before = nowMS()
	e.drv.Eval(ctx, cleanup)
	if cleanup.Err != nil {
		t.Fatal(cleanup.Err)
	}
	if lapse, w := late(); lapse < before+2000 || len(w) != 1 || w[0] != words[0] {
		t.Errorf("after the clean-up sent again: lapse %d, words %q, want %d or later and %q", lapse, w, before+2000, words[0])
	}

	// Their time up, the next release empties the field.
	e.srv.Do(t, "HSET", key, "late", "1 "+words[0])
	churn(ctx, t, e.c, "late", 1)
	if v := e.srv.Do(t, "HGET", key, "late"); v != "" {
		t.Errorf("late after a release past its lapse: %q, want it emptied", v)
	}

	// The last 64 stay.
	var full []string
	for i := range 64 {
		full = append(full, fmt.Sprintf("A%010d", i))
	}
	e.srv.Do(t, "HSET", key, "late", fmt.Sprint(nowMS()+60000)+" "+strings.Join(full, " "))
	lost()
	if _, w := late(); len(w) != 64 || w[0] != full[1] || w[62] != full[63] {
		t.Errorf("kept %d words, from %q, want the last 63 of 64 and the new one", len(w), w[0])
	}
}

// dropDriver fails the next calls of one script without sending them, as
// a connection the server closed under them does.
type dropDriver struct {
	dlock.Driver
	mu     sync.Mutex
	script string
	drops  int
	err    error // the dropped calls' error; nil for a reset connection's
	sent   int   // calls of script asked for, dropped or not
}

func (d *dropDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	var send []*dlock.Call
	d.mu.Lock()
	for _, c := range calls {
		if c.Script.Name == d.script {
			d.sent++
		}
		if c.Script.Name == d.script && d.drops > 0 {
			d.drops--
			c.Err = cmp.Or(d.err, errors.New("read: connection reset by peer"))
			continue
		}
		send = append(send, c)
	}
	d.mu.Unlock()
	if len(send) > 0 {
		d.Driver.Eval(ctx, send...)
	}
}

// The clean-up after an acquire whose reply was lost is sent once more
// when it fails, so a connection closed under it does not leave the name
// held, by nobody, until its TTL.
func TestACleanUpThatFailsIsSentAgain(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, k := range []struct {
		name, release string
		try           func(c *dlock.Client) error
		free          func() error
	}{
		{"cleanup-lock", "release",
			func(c *dlock.Client) error {
				_, err := c.TryLock(ctx, "cleanup-lock", dlock.WithTTL(time.Minute))
				return err
			},
			func() error { _, err := e.c.TryLock(ctx, "cleanup-lock"); return err }},
		{"cleanup-sem", "holds_release",
			func(c *dlock.Client) error {
				_, err := c.Semaphore("cleanup-sem", 1).TryAcquire(ctx, dlock.WithTTL(time.Minute))
				return err
			},
			func() error { _, err := e.c.Semaphore("cleanup-sem", 1).TryAcquire(ctx); return err }},
	} {
		t.Run(k.name, func(t *testing.T) {
			tap := e.newDriver(t)
			c := dlock.New(&dropDriver{Driver: tap, script: k.release, drops: 1})
			defer c.Close()
			tap.loseReplies(1) // the acquire runs; its reply is lost
			if err := k.try(c); !errors.Is(err, errLostReply) {
				t.Fatalf("err = %v, want the lost reply's", err)
			}
			if err := k.free(); err != nil {
				t.Errorf("the name is still taken after the clean-up: %v", err)
			}
		})
	}
}

// A Release that fails (a connection the server closed under it) is sent
// once more at once: the lock is freed, and Release returns nil.
func TestAReleaseThatFailsIsSentAgain(t *testing.T) {
	e := newEnv(t)
	if _, _, err := releaseDroppingOnce(t, e, "released-again", nil); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if e.locked(t, "dlock:{released-again}") {
		t.Error("the lock is still held")
	}
}

// releaseDroppingOnce takes name on a client of its own whose driver then
// fails the first release call with err (a reset connection's when nil),
// releases it, and returns the Lock, how many release calls the driver was
// asked for and Release's error.
func releaseDroppingOnce(t *testing.T, e *env, name string, err error) (l *dlock.Lock, sent int, relErr error) {
	t.Helper()
	ctx := context.Background()
	d := &dropDriver{Driver: e.newDriver(t), script: "release", err: err}
	c := dlock.New(d)
	t.Cleanup(func() { _ = c.Close() })
	l, lerr := c.TryLock(ctx, name, dlock.WithTTL(time.Minute))
	if lerr != nil {
		t.Fatal(lerr)
	}
	d.mu.Lock()
	d.drops = 1
	d.mu.Unlock()
	relErr = l.Release(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	return l, d.sent, relErr
}

// A Release whose request timed out (a server that stalled, under a
// context without a deadline) is not sent again: the copy would wait as
// long for the same server, doubling the caller's wait. It fails, and the
// lock runs out with its TTL unless Release is called again.
func TestAReleaseThatTimedOutIsNotSentAgain(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	l, sent, err := releaseDroppingOnce(t, e, "timed-out", timeout)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Release: err = %v, want the timeout", err)
	}
	if sent != 1 {
		t.Errorf("the release was asked for %d times, want once", sent)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release called again: %v", err)
	}
	if e.locked(t, "dlock:{timed-out}") {
		t.Error("the lock is still held")
	}
}

// The record that refuses such a late copy lasts a minute from the
// clean-up, also when the name's free hash, which keeps it, was near the
// end of its own minute.
func TestTheRecordOfAnAcquireGivenUpOutlivesAnOldFreeHash(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "old-free")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "PEXPIRE", "dlock:{old-free}", "2000") // most of its minute gone
	d := &copyingDriver{Driver: e.newDriver(t), holdBack: true}
	c := dlock.New(d)
	defer c.Close()
	if _, err := c.TryLock(ctx, "old-free"); !errors.Is(err, errLostReply) {
		t.Fatalf("err = %v, want the lost request's", err)
	}
	if ms, _ := strconv.Atoi(e.srv.Do(t, "PTTL", "dlock:{old-free}")); ms < 50000 {
		t.Errorf("the hash with the clean-up's record expires in %d ms, want about a minute", ms)
	}
	if r := d.sendCopies(t); !refusal(r[0]) {
		t.Errorf("late acquire replied %v, want a refusal", r[0])
	}
}

// A late copy of an owner's re-entry, released since, does not re-enter
// the hold again: the first acquisition's Release frees the name.
func TestALateCopyOfAReleasedReentryTakesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &copyingDriver{Driver: e.newDriver(t)}
	c := dlock.New(d)
	defer c.Close()
	first, err := c.TryLock(ctx, "reentered", dlock.WithOwner("job-7"))
	if err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	d.kept = nil // only the re-entry's copy is sent late
	d.mu.Unlock()
	again, err := c.TryLock(ctx, "reentered", dlock.WithOwner("job-7"))
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := d.sendCopies(t); !refusal(r[0]) {
		t.Errorf("late re-entry replied %v, want a refusal", r[0])
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{reentered}") {
		t.Error("the name is held after every acquisition was released")
	}
}

// A token given WithToken is the caller's to use again: its release does
// not keep a later Lock of the same token out, even when dlock made the
// token for an earlier Lock, whose Release recorded it.
func TestAGivenTokenCanTakeTheLockAgainAfterItsRelease(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	first, err := e.c.TryLock(ctx, "again")
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		l, err := e.c.TryLock(ctx, "again", dlock.WithToken(first.Token()))
		if err != nil {
			t.Fatalf("TryLock %d: %v", i+1, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A waiting Lock too.
	l, err := e.c.Lock(ctx, "again", dlock.WithToken(first.Token()))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestACleanUpThatGetsNoAnswerIsSentAgainUntilItIs: an acquire whose reply
// was lost took the lock; its clean-up gets no answer in time (a server
// that stalls, where a new connection gets nowhere). Sent again in the
// background, until the server answers, it frees the name: it was left
// held, by nobody, for its TTL.
func TestACleanUpThatGetsNoAnswerIsSentAgainUntilItIs(t *testing.T) {
	e := newEnv(t)
	d := &unsentDriver{tapDriver: e.newDriver(t)}
	c := dlock.New(d)
	defer c.Close()
	ctx := context.Background()
	d.loseReplyThen(func() { d.unsent.Store(3) })
	if _, err := c.TryLock(ctx, "late", dlock.WithTTL(time.Minute)); err == nil || errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("err = %v, want the transport error", err)
	}
	awaitCond(t, 10*time.Second, func() bool { return !e.locked(t, "dlock:{late}") })
	if n := d.unsent.Load(); n > 0 {
		t.Fatalf("%d clean-ups left unsent", n)
	}
}

// TestACleanUpIsSentAgainLongEnoughForASlowServer: a server that answers,
// but later than a try of the background clean-up allows (its
// handshake on a new connection too), answers a later, longer try; with
// tries of one length the name stayed held, by nobody, for its TTL.
func TestACleanUpIsSentAgainLongEnoughForASlowServer(t *testing.T) {
	e := newEnv(t)
	d := &slowDriver{tapDriver: e.newDriver(t)}
	c := dlock.New(d)
	defer c.Close()
	ctx := context.Background()
	d.loseReplyThen(func() { d.needs.Store(int64(2500 * time.Millisecond)) })
	if _, err := c.TryLock(ctx, "slow", dlock.WithTTL(time.Minute)); err == nil || errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("err = %v, want the transport error", err)
	}
	awaitCond(t, 15*time.Second, func() bool { return !e.locked(t, "dlock:{slow}") })
}

// slowDriver is a tapDriver for a server that takes needs to answer: a
// request whose context allows less fails with a timeout, at once.
type slowDriver struct {
	*tapDriver
	needs atomic.Int64
}

func (d *slowDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < time.Duration(d.needs.Load()) {
		for _, c := range calls {
			c.Val, c.Err = nil, context.DeadlineExceeded
		}
		return
	}
	d.tapDriver.Eval(ctx, calls...)
}

// errRefusedDial is a driver's error for a request it could not connect
// to send (a server down, or replaced in a failover).
var errRefusedDial = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

// unsentDriver is a tapDriver that fails the next unsent calls, unsent,
// with a timeout, as a server that stalls fails a request that needs a new
// connection, or with err when set (a refused dial, say).
type unsentDriver struct {
	*tapDriver
	unsent atomic.Int32
	err    error
}

func (d *unsentDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if d.unsent.Add(-1) >= 0 {
		for _, c := range calls {
			c.Val, c.Err = nil, cmp.Or(d.err, context.DeadlineExceeded)
		}
		return
	}
	d.unsent.Store(0)
	d.tapDriver.Eval(ctx, calls...)
}

// TestANameWhoseKeyHasAnEmptyHashTagIsRefused: a prefix whose first '{'
// opens an empty hash tag, or a name that closes the prefix's brace at
// once, gives keys that a Redis Cluster puts in different slots: every call
// refuses it with ErrInvalidName, and nothing is written.
func TestANameWhoseKeyHasAnEmptyHashTagIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, tc := range []struct{ prefix, name string }{{"p{}:", "x"}, {"{}", "x"}, {"p{", "}a{b}"}} {
		c := e.newClient(t, dlock.WithPrefix(tc.prefix))
		calls := map[string]func() error{
			"TryLock":              func() error { _, err := c.TryLock(ctx, tc.name); return err },
			"RWMutex.TryLock":      func() error { _, err := c.RWMutex(tc.name).TryLock(ctx); return err },
			"RWMutex.TryRLock":     func() error { _, err := c.RWMutex(tc.name).TryRLock(ctx); return err },
			"Semaphore.TryAcquire": func() error { _, err := c.Semaphore(tc.name, 2).TryAcquire(ctx); return err },
			"Inspect":              func() error { _, err := c.Inspect(ctx, tc.name); return err },
		}
		for what, call := range calls {
			if err := call(); !errors.Is(err, dlock.ErrInvalidName) {
				t.Errorf("prefix %q, name %q, %s: %v, want ErrInvalidName", tc.prefix, tc.name, what, err)
			}
		}
	}
	if n := e.srv.Do(t, "DBSIZE"); n != "0" {
		t.Errorf("%s keys written", n)
	}
}

// Only a name with a hash tag of its own is refused a key suffix
// ({orders}:fence would be a key of the lock {orders}); orders:fence is a
// name like any other.
func TestOnlyANameWithAHashTagIsRefusedAKeySuffix(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "orders:fence")
	if err != nil {
		t.Errorf("orders:fence: %v", err)
	} else {
		_ = l.Release(ctx)
	}
	if _, err := e.c.TryLock(ctx, "{orders}:fence"); !errors.Is(err, dlock.ErrInvalidName) {
		t.Errorf("{orders}:fence: %v, want ErrInvalidName", err)
	}
}

// An acquire that could not connect (the server is down) most likely ran
// nowhere: its clean-up, which cannot connect either, is sent at once and
// not in the background. It went on there for up to a minute (see
// cleanUpLate), one for each TryLock (or waiting Lock) made while the
// server was down, each dialing it again every second, and Close waited
// for them up to its bound. (Not a give-back of a held lock: see
// TestADoWhoseReleaseCannotConnectGivesItBackLater.)
func TestAnAcquireThatCannotConnectLeavesNothingToCleanUp(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t)
	c := dlock.New(d)
	defer c.Close()
	e.srv.Stop(t)
	ctx := context.Background()
	if _, err := c.TryLock(ctx, "unconnected", dlock.WithTTL(time.Minute)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("TryLock = %v, want a refused dial", err)
	}
	if n := d.trips.Load(); n > 3 {
		t.Errorf("TryLock made %d round trips, want 3 at most: its acquire, its clean-up, and that sent again", n)
	}
	// The wait gives up after its first refused attempt, not at a deadline
	// that could end it while an attempt dials (a dial cut short by its
	// context may have been under way: its clean-up would go on).
	wctx, giveUp, cancel := untilRefused(ctx)
	defer cancel()
	if _, err := c.Lock(wctx, "unconnected", dlock.WithTTL(time.Minute), giveUp); err == nil {
		t.Fatal("Lock obtained a lock on a server that is down")
	}
	at := d.trips.Load()
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := d.trips.Load() - at; n > 0 {
		t.Errorf("%d round trips after the acquisitions returned, until Close (%v)", n, time.Since(start))
	}
}

// The clean-up of an acquire that ran (its reply timed out, as on a server
// that stalls) goes on in the background until the server answers it, as
// the README says, also across tries that cannot connect: a stalled server
// that is restarted with its data, or replaced in a failover the client
// library has yet to learn of, refuses connections for a while, and then
// takes the clean-up. Only an acquire that could not connect itself ran
// nowhere (see TestAnAcquireThatCannotConnectLeavesNothingToCleanUp).
func TestACleanUpOfAnAcquireThatRanGoesOnPastARefusedDial(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	tap := e.newDriver(t)
	d := &failingDriver{tapDriver: tap}
	c := dlock.New(d)
	defer c.Close()
	refused := errRefusedDial
	// The acquire runs, its reply times out; its clean-up times out too
	// (not sent again at once: in the background), whose first try in
	// the background cannot connect; the next gets through.
	tap.timeOutReplies(1)
	d.arm(nil, context.DeadlineExceeded, refused)
	if _, err := c.TryLock(ctx, "cleanup-dial", dlock.WithTTL(time.Minute)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryLock = %v, want the acquire's timeout", err)
	}
	awaitCond(t, 5*time.Second, func() bool { return !e.locked(t, "dlock:{cleanup-dial}") })
}

// So for a waiting Lock whose first attempt ran (its reply timed out) and
// whose later ones could not connect: its clean-up goes on past refused
// dials, as the first attempt may have taken the name.
func TestACleanUpOfAWaitWhoseFirstAttemptRanGoesOnPastARefusedDial(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	tap := e.newDriver(t)
	d := &failingDriver{tapDriver: tap}
	c := dlock.New(d)
	defer c.Close()
	refused := errRefusedDial
	// The first attempt runs and its reply times out; every request after
	// it, for a while, cannot connect: the two attempts after it, the
	// clean-up and its copy sent at once, and a try or two in the
	// background.
	tap.timeOutReplies(1)
	d.arm(nil, refused, refused, refused, refused, refused, refused)
	_, err := c.Lock(ctx, "wait-dial", dlock.WithTTL(time.Minute), dlock.WithRetry(dlock.LimitRetry(dlock.ConstantBackoff(time.Millisecond), 2)))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Lock = %v, want its last attempt's refused dial", err)
	}
	awaitCond(t, 10*time.Second, func() bool { return !e.locked(t, "dlock:{wait-dial}") })
}

// TestLockingManyNamesKeepsNoState: a client that takes and releases one
// name after another (alone, several at once, or attached to another
// client's hold) keeps nothing in memory for the names it is done with.
func TestLockingManyNamesKeepsNoState(t *testing.T) {
	e := newEnv(t)
	other := e.newClient(t)
	ctx := context.Background()
	ttl := dlock.WithTTL(time.Minute)
	t.Run("TryLock", func(t *testing.T) {
		keepsNoStateByName(t, "try", func(name string) error {
			l, err := e.c.TryLock(ctx, name, ttl)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}, e.c)
	})
	t.Run("LockMulti", func(t *testing.T) {
		keepsNoStateByName(t, "multi", func(name string) error {
			l, err := e.c.LockMulti(ctx, []string{name + ":a", name + ":b"}, ttl)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}, e.c)
	})
	t.Run("Attach", func(t *testing.T) {
		keepsNoStateByName(t, "attach", func(name string) error {
			held, err := other.TryLock(ctx, name, ttl)
			if err != nil {
				return err
			}
			l, err := e.c.Attach(ctx, name, held.Token(), ttl)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}, e.c, other)
	})
}
