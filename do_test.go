package dlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// heldBackDriver holds back the next release it sees: its caller gets a
// timeout at once, and the call itself runs on the server only when run
// is closed (a copy, so that the caller's Call is not written late).
type heldBackDriver struct {
	*tapDriver
	armed atomic.Bool
	run   chan struct{}
	done  chan []*dlock.Call
}

func (d *heldBackDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if len(calls) > 0 && (calls[0].Script.Name == "release" || calls[0].Script.Name == "holds_release") && d.armed.CompareAndSwap(true, false) {
		copies := make([]*dlock.Call, len(calls))
		for i, c := range calls {
			cp := &dlock.Call{Script: c.Script, Keys: c.Keys, Args: c.Args, Lib: c.Lib}
			copies[i] = cp
			c.Val, c.Err = nil, context.DeadlineExceeded
		}
		go func() {
			<-d.run
			d.tapDriver.Eval(context.Background(), copies...)
			d.done <- copies
		}()
		return
	}
	d.tapDriver.Eval(ctx, calls...)
}

// ends hears the ends of locks, as their End hooks report them.
type ends chan error

func (e ends) hook(_ dlock.HookInfo, _ time.Duration, err error) { e <- err }

// await returns the error of the next lock's end; ok is false when none
// came within 3 seconds.
func (e ends) await() (ok bool, err error) {
	select {
	case err := <-e:
		return true, err
	case <-time.After(3 * time.Second):
		return false, nil
	}
}

// A Do whose release ran but whose reply was lost (a timeout): the give-back
// sends that release again, which finds its own id and counts as done, so
// the lock ends released (its End hook and metrics say so), where a
// clean-up found nothing left to free and the lock ended lost at its
// deadline. For every kind of hold.
func TestADoWhoseReleaseReplyWasLostEndsReleased(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, tc := range []struct {
		kind string
		do   func(c *dlock.Client, fn func(context.Context) error) error
	}{
		{"lock", func(c *dlock.Client, fn func(context.Context) error) error {
			return c.Do(ctx, "do-reply-lost", fn, dlock.WithTTL(time.Second))
		}},
		{"write hold", func(c *dlock.Client, fn func(context.Context) error) error {
			return c.RWMutex("do-reply-lost-rw").Do(ctx, fn, dlock.WithTTL(time.Second))
		}},
		{"read hold", func(c *dlock.Client, fn func(context.Context) error) error {
			return c.RWMutex("do-reply-lost-rd").RDo(ctx, fn, dlock.WithTTL(time.Second))
		}},
		{"permit", func(c *dlock.Client, fn func(context.Context) error) error {
			return c.Semaphore("do-reply-lost-sem", 2).Do(ctx, fn, dlock.WithTTL(time.Second))
		}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			d := e.newDriver(t)
			ended := make(ends, 4)
			c := dlock.New(d, dlock.WithHooks(dlock.Hooks{End: ended.hook}))
			defer c.Close()
			err := tc.do(c, func(context.Context) error {
				d.timeOutReplies(1) // the release's: it runs
				return nil
			})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Do = %v, want the release's timeout", err)
			}
			if ok, err := ended.await(); !ok {
				t.Error("End hook never called")
			} else if err != nil {
				t.Errorf("End hook reports %v for a lock whose release ran", err)
			}
		})
	}
}

// A Do's release held up on its way (a stalled connection) runs after
// the one its give-back sent again, and after another client took the
// name: it must change nothing.
func TestHeldUpReleaseRunsAfterTheResentOne(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, tc := range []struct {
		kind string
		do   func(c *dlock.Client, fn func(context.Context) error) error
		take func() (*dlock.Lock, error)
	}{
		{"lock", func(c *dlock.Client, fn func(context.Context) error) error {
			return c.Do(ctx, "held-up", fn, dlock.WithTTL(time.Second))
		}, func() (*dlock.Lock, error) { return e.c.TryLock(ctx, "held-up") }},
		{"write hold", func(c *dlock.Client, fn func(context.Context) error) error {
			return c.RWMutex("held-up-rw").Do(ctx, fn, dlock.WithTTL(time.Second))
		}, func() (*dlock.Lock, error) { return e.c.RWMutex("held-up-rw").TryLock(ctx) }},
		{"read hold", func(c *dlock.Client, fn func(context.Context) error) error {
			return c.RWMutex("held-up-rd").RDo(ctx, fn, dlock.WithTTL(time.Second))
		}, func() (*dlock.Lock, error) { return e.c.RWMutex("held-up-rd").TryLock(ctx) }},
		{"permit", func(c *dlock.Client, fn func(context.Context) error) error {
			return c.Semaphore("held-up-sem", 1).Do(ctx, fn, dlock.WithTTL(time.Second))
		}, func() (*dlock.Lock, error) { return e.c.Semaphore("held-up-sem", 1).TryAcquire(ctx) }},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			d := &heldBackDriver{tapDriver: e.newDriver(t), run: make(chan struct{}), done: make(chan []*dlock.Call, 1)}
			ended := make(ends, 4)
			c := dlock.New(d, dlock.WithHooks(dlock.Hooks{End: ended.hook}))
			defer c.Close()
			err := tc.do(c, func(context.Context) error {
				d.armed.Store(true)
				return nil
			})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Do = %v, want the release's timeout", err)
			}
			if ok, err := ended.await(); !ok {
				t.Fatal("End hook never called")
			} else if err != nil {
				t.Errorf("End hook: %v", err)
			}
			other, err := tc.take()
			if err != nil {
				t.Fatalf("the name is not free after the give-back: %v", err)
			}
			close(d.run)
			late := <-d.done
			t.Logf("held-up release replied %v %v", late[0].Val, late[0].Err)
			if err := other.Refresh(ctx, time.Second); err != nil {
				t.Errorf("the other holder lost the name to the held-up release: %v", err)
			}
			if err := other.Release(ctx); err != nil {
				t.Errorf("the other holder's Release: %v", err)
			}
		})
	}
}

// A re-entry's Do (WithOwner) whose release ran, its reply lost, or did not
// run: its give-back must leave the outer Do's hold held.
func TestReentrantDoGiveBackLeavesTheOuterHold(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, ran := range []bool{true, false} {
		for _, kind := range []string{"lock", "write hold"} {
			name := "reent-" + kind
			if !ran {
				name += "-unrun"
			}
			t.Run(name, func(t *testing.T) {
				d := &unsentDriver{tapDriver: e.newDriver(t)}
				var mu sync.Mutex
				var ends []error
				endedInner := make(chan struct{}, 4)
				c := dlock.New(d, dlock.WithHooks(dlock.Hooks{End: func(_ dlock.HookInfo, _ time.Duration, err error) {
					mu.Lock()
					ends = append(ends, err)
					mu.Unlock()
					endedInner <- struct{}{}
				}}))
				defer c.Close()
				do := func(fn func(context.Context) error) error {
					if kind == "lock" {
						return c.Do(ctx, name, fn, dlock.WithTTL(2*time.Second), dlock.WithOwner("o"))
					}
					return c.RWMutex(name).Do(ctx, fn, dlock.WithTTL(2*time.Second), dlock.WithOwner("o"))
				}
				taken := func() bool {
					var l *dlock.Lock
					if kind == "lock" {
						l, _ = e.c.TryLock(ctx, name)
					} else {
						l, _ = e.c.RWMutex(name).TryLock(ctx)
					}
					if l != nil {
						_ = l.Release(ctx)
						return false
					}
					return true
				}
				err := do(func(context.Context) error {
					ierr := do(func(context.Context) error {
						if ran {
							d.timeOutReplies(1)
						} else {
							d.unsent.Store(1)
						}
						return nil
					})
					if !errors.Is(ierr, context.DeadlineExceeded) {
						t.Errorf("inner Do = %v, want the release's timeout", ierr)
					}
					select {
					case <-endedInner:
					case <-time.After(3 * time.Second):
						t.Error("inner End hook never called")
					}
					if !taken() {
						t.Error("the outer Do's hold was freed by the inner one's give-back")
					}
					return nil
				})
				if err != nil {
					t.Errorf("outer Do = %v", err)
				}
				mu.Lock()
				defer mu.Unlock()
				for _, err := range ends {
					if err != nil {
						t.Errorf("End hook: %v", err)
					}
				}
			})
		}
	}
}

// A TryDo WithMinHold (the once-per-period pattern) whose release got no
// answer, whether it ran or not: its give-back sends that same release,
// which keeps the hold for its minimum hold only, not its whole TTL.
func TestADoWithMinHoldWhoseReleaseTimedOutIsKeptOnlyItsMinHold(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, ran := range []bool{true, false} {
		d := &unsentDriver{tapDriver: e.newDriver(t)}
		ended := make(ends, 4)
		c := dlock.New(d, dlock.WithHooks(dlock.Hooks{End: ended.hook}))
		name := "minhold-do"
		if ran {
			name += "-ran"
		}
		err := c.TryDo(ctx, name, func(context.Context) error {
			if ran {
				d.timeOutReplies(1)
			} else {
				d.unsent.Store(1)
			}
			return nil
		}, dlock.WithTTL(time.Minute), dlock.WithMinHold(300*time.Millisecond))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("TryDo = %v, want the release's timeout", err)
		}
		if l, err := e.c.TryLock(ctx, name); err == nil {
			t.Errorf("ran=%v: taken again before its minimum hold passed", ran)
			_ = l.Release(ctx)
		}
		if ok, err := ended.await(); !ok {
			t.Errorf("ran=%v: End hook not called within 3s (the lock runs out with its minute's TTL)", ran)
		} else if err != nil {
			t.Errorf("ran=%v: End hook reports %v", ran, err)
		}
		// Free once the minimum hold has passed, not a minute later.
		awaitCond(t, 3*time.Second, func() bool { return !e.locked(t, "dlock:{"+name+"}") })
		_ = c.Close()
	}
}

// crossDriver holds the watchdog's next refresh until the release has run
// on the server, and loses the release's reply (a timeout) once that
// refresh has answered: the refresh, sent before the release, finds the
// name gone.
type crossDriver struct {
	*tapDriver
	armed      atomic.Bool
	releasing  atomic.Bool
	refreshing chan struct{}
	released   chan struct{}
	refreshed  chan struct{}
}

func (d *crossDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	switch {
	case calls[0].Script.Name == "refresh" && d.armed.CompareAndSwap(true, false):
		close(d.refreshing)
		select {
		case <-d.released:
		case <-time.After(5 * time.Second):
		}
		d.tapDriver.Eval(ctx, calls...)
		close(d.refreshed)
	case calls[0].Script.Name == "release" && d.releasing.CompareAndSwap(true, false):
		d.tapDriver.Eval(ctx, calls...) // it runs
		close(d.released)
		select {
		case <-d.refreshed:
		case <-time.After(5 * time.Second):
		}
		for _, c := range calls {
			c.Val, c.Err = nil, context.DeadlineExceeded // its reply is lost
		}
	default:
		d.tapDriver.Eval(ctx, calls...)
	}
}

// A Do whose release ran, its reply lost, while a refresh sent before it
// crossed it (and found the name gone): the give-back finds the release
// done, but the lock already ended as lost.
func TestADoWhoseReleaseRanAsARefreshCrossedItEndsReleased(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &crossDriver{tapDriver: e.newDriver(t), refreshing: make(chan struct{}), released: make(chan struct{}), refreshed: make(chan struct{})}
	ended := make(ends, 4)
	c := dlock.New(d, dlock.WithHooks(dlock.Hooks{End: ended.hook}))
	defer c.Close()
	err := c.Do(ctx, "crossed", func(context.Context) error {
		d.armed.Store(true)
		<-d.refreshing // the watchdog's refresh is on its way
		d.releasing.Store(true)
		return nil
	}, dlock.WithTTL(2*time.Second), dlock.WithRefreshInterval(50*time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do = %v, want the release's timeout", err)
	}
	if ok, err := ended.await(); !ok {
		t.Error("End hook never called")
	} else if err != nil {
		t.Errorf("End hook reports %v for a lock whose release ran", err)
	}
}

// lossCrossDriver holds the watchdog's next refresh, once armed, until the
// release has been sent; the release, once armed, gets a timeout without
// running (a stalled server). The test takes the lock away meanwhile, so
// the refresh finds it gone: a real loss.
type lossCrossDriver struct {
	*tapDriver
	armed, releasing atomic.Bool
	refreshing       chan struct{}
	released         chan struct{}
}

func (d *lossCrossDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	switch {
	case calls[0].Script.Name == "refresh" && d.armed.CompareAndSwap(true, false):
		close(d.refreshing)
		select {
		case <-d.released:
		case <-time.After(5 * time.Second):
		}
		d.tapDriver.Eval(ctx, calls...)
	case calls[0].Script.Name == "release" && d.releasing.CompareAndSwap(true, false):
		for _, c := range calls {
			c.Val, c.Err = nil, context.DeadlineExceeded
		}
		close(d.released)
	default:
		d.tapDriver.Eval(ctx, calls...)
	}
}

// A ReleaseDone hook that panics as Do's release fails cuts Do short
// before its give-back: the refresh that crossed the release and found the
// lock gone (taken away: a real loss) still ends it as lost at once, not
// at its deadline, a TTL later.
func TestAPanicInDosReleaseLeavesNoGiveBackPending(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &lossCrossDriver{tapDriver: e.newDriver(t), refreshing: make(chan struct{}), released: make(chan struct{})}
	ended := make(ends, 4)
	c := dlock.New(d, dlock.WithHooks(dlock.Hooks{
		End: ended.hook,
		ReleaseDone: func(_ context.Context, _ dlock.HookInfo, _ time.Duration, err error) {
			if err != nil {
				panic("release hook")
			}
		},
	}))
	defer c.Close()
	func() {
		defer func() {
			if p := recover(); p == nil {
				t.Error("Do did not panic")
			}
		}()
		_ = c.Do(ctx, "crossed-loss", func(context.Context) error {
			d.armed.Store(true)
			<-d.refreshing // the watchdog's refresh is on its way
			e.srv.Do(t, "DEL", "dlock:{crossed-loss}")
			d.releasing.Store(true)
			return nil
		}, dlock.WithTTL(30*time.Second), dlock.WithRefreshInterval(50*time.Millisecond))
	}()
	if ok, err := ended.await(); !ok {
		t.Error("the loss the refresh found is not told (the lock ends at its 30s deadline)")
	} else if !errors.Is(err, dlock.ErrLost) {
		t.Errorf("End hook reports %v, want the loss", err)
	}
}

// A ReleaseStart hook that panics as Do releases does not leave the lock
// held and refreshed for good (the deferred release is only for fn's
// panic): it is no longer refreshed, and runs out with its TTL.
func TestAPanicInDosReleaseStartDoesNotLeaveTheLockRefreshed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := dlock.New(e.newDriver(t), dlock.WithHooks(dlock.Hooks{
		ReleaseStart: func(ctx context.Context, _ dlock.HookInfo) context.Context { panic("release start") },
	}))
	defer c.Close()
	func() {
		defer func() { _ = recover() }()
		_ = c.Do(ctx, "release-start-panic", func(context.Context) error { return nil }, dlock.WithTTL(300*time.Millisecond))
	}()
	// It runs out with its 300ms TTL; refreshed, it would stay.
	awaitCond(t, 3*time.Second, func() bool { return !e.locked(t, "dlock:{release-start-panic}") })
}

// The function of each Do finds its own Lock in its context: the hold it
// runs under, the innermost of nested ones, and none outside (nor in a nil
// context, which panicked).
func TestLockFromContextIsTheLockDoRunsUnder(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if l := dlock.LockFromContext(ctx); l != nil {
		t.Fatalf("a context no Lock made carries %v", l)
	}
	var none context.Context
	if l := dlock.LockFromContext(none); l != nil {
		t.Fatalf("a nil context carries %v", l)
	}
	rw, sem := e.c.RWMutex("lfc-rw"), e.c.Semaphore("lfc-sem", 2)
	for _, tc := range []struct {
		kind  string
		do    func(fn func(context.Context) error) error
		fence bool
	}{
		{"lock", func(fn func(context.Context) error) error { return e.c.Do(ctx, "lfc", fn) }, true},
		{"try", func(fn func(context.Context) error) error { return e.c.TryDo(ctx, "lfc", fn) }, true},
		{"multi", func(fn func(context.Context) error) error { return e.c.DoMulti(ctx, []string{"lfc-a", "lfc-b"}, fn) }, true},
		{"write", func(fn func(context.Context) error) error { return rw.Do(ctx, fn) }, true},
		{"read", func(fn func(context.Context) error) error { return rw.RDo(ctx, fn) }, false},
		{"permit", func(fn func(context.Context) error) error { return sem.Do(ctx, fn) }, false},
	} {
		var outer, inner *dlock.Lock
		err := tc.do(func(ctx context.Context) error {
			outer = dlock.LockFromContext(ctx)
			return e.c.Do(ctx, "lfc-inner", func(ctx context.Context) error {
				inner = dlock.LockFromContext(ctx)
				return nil
			})
		})
		if err != nil {
			t.Fatalf("%s: %v", tc.kind, err)
		}
		if outer == nil || inner == nil || outer == inner || inner.Name() != "lfc-inner" {
			t.Fatalf("%s: the functions found %v and %v", tc.kind, outer, inner)
		}
		if (outer.Fence() > 0) != tc.fence {
			t.Errorf("%s: the Lock found has fence %d", tc.kind, outer.Fence())
		}
		if err := outer.Err(); err != nil || outer.Refresh(ctx, time.Second) == nil {
			t.Errorf("%s: the Lock found is not the one Do released: Err %v", tc.kind, err)
		}
	}
	// A Lock's own Context carries it too.
	l, err := e.c.TryLock(ctx, "lfc")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if got := dlock.LockFromContext(l.Context(ctx)); got != l {
		t.Fatalf("Lock.Context carries %v, not its Lock", got)
	}
}
