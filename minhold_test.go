package dlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// keptHolder inspects name and returns its one holder, which must be a hold
// kept for its minimum hold: released (count 0), with its TTL left.
func keptHolder(t *testing.T, c *dlock.Client, name string) dlock.Holder {
	t.Helper()
	info, err := c.Inspect(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if info.Kind != dlock.KindLock || len(info.Holders) != 1 {
		t.Fatalf("%s: kind %v with %d holders; want the exclusive lock kept by its released holder", name, info.Kind, len(info.Holders))
	}
	h := info.Holders[0]
	if h.Count != 0 || h.TTL <= 0 {
		t.Fatalf("%s: holder count %d with TTL %v; want 0 (released) and time left", name, h.Count, h.TTL)
	}
	return h
}

// serverPast waits until the Redis server's clock is past at.
func serverPast(t *testing.T, e *env, at time.Time) {
	t.Helper()
	for {
		f := strings.Fields(e.srv.Do(t, "TIME"))
		if len(f) != 2 {
			t.Fatalf("TIME replied %q", f)
		}
		s, _ := strconv.ParseInt(f[0], 10, 64)
		us, _ := strconv.ParseInt(f[1], 10, 64)
		now := time.Unix(s, us*1000)
		if now.After(at) {
			return
		}
		time.Sleep(at.Sub(now) + time.Millisecond)
	}
}

// TestMinHoldKeepsAReleasedLock: a lock released before its minimum hold
// has passed stays taken until then (counted from when it was obtained),
// by nobody: others are refused, a Lock sharing its token cannot refresh
// it, neither its token nor Attach can take it, and a waiter obtains it
// once the minimum hold has passed by the server's clock.
func TestMinHoldKeepsAReleasedLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	other := e.newClient(t)
	const minHold, heldFor = 2 * time.Second, 300 * time.Millisecond

	l, err := e.c.TryLock(ctx, "report", dlock.WithMinHold(minHold), dlock.WithMetadata("host-a"), dlock.WithAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	shared, err := other.TryLock(ctx, "report", dlock.WithToken(l.Token())) // one holder (see WithToken)
	if err != nil {
		t.Fatal(err)
	}
	info, err := other.Inspect(ctx, "report")
	if err != nil || len(info.Holders) != 1 {
		t.Fatalf("Inspect: %+v, %v", info, err)
	}
	since := info.Holders[0].Since
	serverPast(t, e, since.Add(heldFor))
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	default:
		t.Error("Done is open after Release")
	}
	if l.Err() != nil {
		t.Errorf("Err after Release = %v, want nil", l.Err())
	}
	if _, err := other.TryLock(ctx, "report"); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock within the minimum hold: %v, want ErrNotObtained", err)
	}
	h := keptHolder(t, other, "report")
	if h.Metadata != "host-a" || h.Fence != l.Fence() || h.Owner != "" || !h.Since.Equal(since) || h.TTL > minHold-heldFor {
		t.Errorf("kept holder %+v; want metadata host-a, fence %d, no owner, since %v, TTL within %v", h, l.Fence(), since, minHold-heldFor)
	}

	// Nobody's to act on.
	if err := shared.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh by a Lock of the same token: %v, want ErrNotHeld", err)
	}
	if _, err := other.TryLock(ctx, "report", dlock.WithToken(l.Token())); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("TryLock with the released holder's token: %v, want ErrNotObtained", err)
	}
	if _, err := other.Attach(ctx, "report", l.Token()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Attach with the released holder's token: %v, want ErrNotHeld", err)
	}
	if got := keptHolder(t, other, "report"); got.TTL > h.TTL {
		t.Errorf("the kept hold was extended to %v (from %v)", got.TTL, h.TTL)
	}

	next, err := other.Lock(ctx, "report", dlock.WithMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	info, err = other.Inspect(ctx, "report")
	if err != nil || len(info.Holders) != 1 {
		t.Fatalf("Inspect: %+v, %v", info, err)
	}
	if got := info.Holders[0].Since; got.Before(since.Add(minHold)) {
		t.Errorf("the next holder obtained it %v after the first, within the minimum hold of %v", got.Sub(since), minHold)
	}
	if next.Fence() <= l.Fence() {
		t.Errorf("next fence %d after %d", next.Fence(), l.Fence())
	}
}

// TestMinHoldWakesAWaiter: a release that keeps the lock tells the next
// waiting client, which then sleeps until the kept hold runs out, not until
// the end of the TTL it was refused with. (The waiter's beat is too long to
// wake it.) A waiter that left its request to be granted the lock is not
// granted it while it is kept.
func TestMinHoldWakesAWaiter(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const minHold = time.Second
	l, err := e.c.TryLock(ctx, "report", dlock.WithTTL(time.Minute), dlock.WithMinHold(minHold))
	if err != nil {
		t.Fatal(err)
	}
	other := e.newClient(t)
	dlock.SetWaitBeat(other, time.Hour)
	// Without the notice it would sleep until the minute's TTL runs out.
	got := lockWhenRefused(t, ctx, other, "report", dlock.WithMaxWait(10*time.Second))
	first, err := e.c.Inspect(ctx, "report")
	if err != nil || len(first.Holders) != 1 {
		t.Fatalf("Inspect: %+v, %v", first, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	}
	defer r.l.Release(ctx)
	info, err := e.c.Inspect(ctx, "report")
	if err != nil || len(info.Holders) != 1 {
		t.Fatalf("Inspect: %+v, %v", info, err)
	}
	if d := info.Holders[0].Since.Sub(first.Holders[0].Since); d < minHold {
		t.Errorf("the waiter obtained it %v after the first holder, within the minimum hold of %v", d, minHold)
	}
}

// TestMinHoldThatHasPassedFreesTheLock: a release after the minimum hold
// frees the lock at once, as one without it does.
func TestMinHoldThatHasPassedFreesTheLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const minHold = 100 * time.Millisecond
	l, err := e.c.TryLock(ctx, "report", dlock.WithMinHold(minHold))
	if err != nil {
		t.Fatal(err)
	}
	info, err := e.c.Inspect(ctx, "report")
	if err != nil || len(info.Holders) != 1 {
		t.Fatalf("Inspect: %+v, %v", info, err)
	}
	serverPast(t, e, info.Holders[0].Since.Add(minHold+time.Millisecond))
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{report}") {
		t.Error("a release after the minimum hold kept the lock")
	}
	next, err := e.newClient(t).TryLock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	_ = next.Release(ctx)
}

// TestMinHoldOfAReentrantLock: the release of one acquisition of a lock
// held more than once keeps nothing (the others hold it); the release that
// frees it keeps it, and its owner cannot join it then. ForceRelease ends a
// kept hold.
func TestMinHoldOfAReentrantLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	other := e.newClient(t)
	opts := []dlock.Option{dlock.WithOwner("run-1"), dlock.WithMinHold(time.Minute)}
	outer, err := e.c.TryLock(ctx, "migrate", opts...)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := e.c.TryLock(ctx, "migrate", opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := inner.Release(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := e.c.Inspect(ctx, "migrate")
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Count != 1 || info.Holders[0].Owner != "run-1" {
		t.Fatalf("after the inner release: %+v, %v; want the owner's hold, count 1", info, err)
	}
	if err := outer.Release(ctx); err != nil {
		t.Fatal(err)
	}
	keptHolder(t, e.c, "migrate")
	if _, err := e.c.TryLock(ctx, "migrate", opts...); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("the owner joined its kept hold: %v, want ErrNotObtained", err)
	}
	if _, err := other.ForceRelease(ctx, "migrate"); err != nil {
		t.Fatal(err)
	}
	next, err := other.TryLock(ctx, "migrate")
	if err != nil {
		t.Fatalf("TryLock after ForceRelease: %v", err)
	}
	_ = next.Release(ctx)
}

// TestMinHoldOfALockOnSeveralNames: every name is kept.
func TestMinHoldOfALockOnSeveralNames(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLockMulti(ctx, []string{"a", "b"}, dlock.WithMinHold(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	other := e.newClient(t)
	for _, name := range []string{"a", "b"} {
		if _, err := other.TryLock(ctx, name); !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("TryLock %s: %v, want ErrNotObtained", name, err)
		}
		keptHolder(t, other, name)
	}
}

// TestMinHoldKeepsNothingNotHeld: a failed acquire's clean-up, and the
// release of a lock that has expired, keep nothing.
func TestMinHoldKeepsNothingNotHeld(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	other := e.newClient(t)

	e.drv.loseReplies(1) // the acquire runs; its reply is lost
	if _, err := e.c.TryLock(ctx, "lost", dlock.WithMinHold(time.Minute)); err == nil {
		t.Fatal("TryLock whose reply was lost succeeded")
	}
	if next, err := other.TryLock(ctx, "lost"); err != nil {
		t.Errorf("after a failed acquire with a minimum hold: %v", err)
	} else {
		_ = next.Release(ctx)
	}

	l, err := e.c.TryLock(ctx, "expired", dlock.WithTTL(200*time.Millisecond), dlock.WithMinHold(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 5*time.Second) // the deadline passed; the TTL runs out 3ms later
	awaitCond(t, 5*time.Second, func() bool { return !e.locked(t, "dlock:{expired}") })
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release of an expired lock: %v, want ErrNotHeld", err)
	}
	if next, err := other.TryLock(ctx, "expired"); err != nil {
		t.Errorf("after the release of an expired lock with a minimum hold: %v", err)
	} else {
		_ = next.Release(ctx)
	}
}

// TestMinHoldReleaseSentTwice: a release whose reply was lost, sent again,
// counts as done and keeps the hold as the first did.
func TestMinHoldReleaseSentTwice(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := dlock.New(repeatDriver{e.newDriver(t)})
	defer c.Close()
	l, err := c.TryLock(ctx, "twice", dlock.WithMinHold(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("a release sent twice: %v", err)
	}
	keptHolder(t, e.c, "twice")
}

// TestMinHoldOfAGrantedLock: a lock granted to a waiter that left its
// request is kept by its Release as one it took itself, counted from the
// grant.
func TestMinHoldOfAGrantedLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "granted", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := lockWhenRefused(t, ctx, e.newClient(t), "granted", dlock.WithMinHold(time.Minute))
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	info, err := e.c.Inspect(ctx, "granted")
	if err != nil || len(info.Holders) != 1 {
		t.Fatalf("Inspect: %+v, %v", info, err)
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if h := keptHolder(t, e.c, "granted"); !h.Since.Equal(info.Holders[0].Since) {
		t.Errorf("kept since %v, want the grant's %v", h.Since, info.Holders[0].Since)
	}
}

// TestMinHoldOfAnAttachedLock: an attached Lock's Release keeps the hold
// when Attach was given WithMinHold, and frees it when not.
func TestMinHoldOfAnAttachedLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	other := e.newClient(t)
	for _, tc := range []struct {
		name string
		opts []dlock.Option
		kept bool
	}{
		{"with", []dlock.Option{dlock.WithMinHold(time.Minute)}, true},
		{"without", nil, false},
	} {
		l, err := e.c.TryLock(ctx, tc.name, dlock.WithMinHold(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		attached, err := other.Attach(ctx, tc.name, l.Token(), tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := attached.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if got := e.locked(t, "dlock:{"+tc.name+"}"); got != tc.kept {
			t.Errorf("Attach %s WithMinHold, released: locked %v, want %v", tc.name, got, tc.kept)
		}
	}
}
