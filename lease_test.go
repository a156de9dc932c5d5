package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// waitDone waits for a lock's Done channel, failing the test after limit.
func waitDone(t *testing.T, l *dlock.Lock, limit time.Duration) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(limit):
		t.Fatalf("Done not closed within %v", limit)
	}
}

// awaitCond waits until cond holds, looking every millisecond, and fails
// the test if it does not within limit.
func awaitCond(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	end := time.After(limit)
	for !cond() {
		select {
		case <-tick.C:
		case <-end:
			t.Fatalf("condition not met within %v", limit)
		}
	}
}

func TestAutoRefreshKeepsTheLockPastManyTTLs(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "kept", dlock.WithTTL(300*time.Millisecond), dlock.WithRefreshInterval(30*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	other := e.newClient(t)
	for end := time.Now().Add(1200 * time.Millisecond); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if _, err := other.TryLock(ctx, "kept"); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("another client got the lock: %v", err)
		}
	}
	select {
	case <-l.Done():
		t.Fatalf("Done closed while refreshed: %v", l.Err())
	default:
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, time.Second)
	if l.Err() != nil {
		t.Errorf("Err after release = %v, want nil", l.Err())
	}
}

func TestDoneClosesAtTheDeadlineWithoutRefresh(t *testing.T) {
	e := newEnv(t)
	l, err := e.c.TryLock(context.Background(), "short", dlock.WithTTL(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 2*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost", l.Err())
	}
	if time.Now().Before(l.Deadline()) {
		t.Error("Done closed before the deadline")
	}
	if err := l.Refresh(context.Background(), time.Second); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh after loss: err = %v, want ErrNotHeld", err)
	}
}

// TestLossIsNoticedAtTheNextRefresh takes a refreshed lock away in each way
// production does and checks that the holder hears of it from a refresh,
// long before the lock's own deadline would have told it.
func TestLossIsNoticedAtTheNextRefresh(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		take func(t *testing.T, e *env)
	}{
		{"deleted by another client", func(t *testing.T, e *env) { e.srv.Do(t, "DEL", "dlock:{victim}") }},
		{"taken over after a force delete", func(t *testing.T, e *env) {
			e.srv.Do(t, "DEL", "dlock:{victim}")
			if _, err := e.newClient(t).TryLock(ctx, "victim"); err != nil {
				t.Fatal(err)
			}
		}},
		{"redis restarted without persistence", func(t *testing.T, e *env) { e.srv.Restart(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			l, err := e.c.TryLock(ctx, "victim", dlock.WithTTL(time.Minute), dlock.WithRefreshInterval(20*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			lctx := l.Context(ctx)
			tc.take(t, e)
			waitDone(t, l, 5*time.Second)
			if !errors.Is(l.Err(), dlock.ErrLost) || !errors.Is(l.Err(), dlock.ErrNotHeld) {
				t.Errorf("Err = %v, want ErrLost from a refresh", l.Err())
			}
			checkLossMessage(t, l.Err())
			checkNotHeldAfterLoss(t, l.Refresh(ctx, time.Minute))
			<-lctx.Done()
			if !errors.Is(context.Cause(lctx), dlock.ErrLost) {
				t.Errorf("context cause = %v, want ErrLost", context.Cause(lctx))
			}
		})
	}
}

// checkLossMessage checks that a loss error reads as one line that says
// "dlock: " once, at its start.
func checkLossMessage(t *testing.T, err error) {
	t.Helper()
	msg := err.Error()
	if !strings.HasPrefix(msg, "dlock: lock lost: ") || strings.Count(msg, "dlock: ") != 1 || strings.Contains(msg, "\n") {
		t.Errorf("loss message %q: want one line that says \"dlock: \" once, at its start", msg)
	}
}

// checkNotHeldAfterLoss checks the error of a call on a lock already lost:
// it matches ErrNotHeld and ErrLost, and says "dlock: " and "not held" once.
func checkNotHeldAfterLoss(t *testing.T, err error) {
	t.Helper()
	msg := fmt.Sprint(err)
	if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) || strings.Count(msg, "dlock: ") != 1 || strings.Count(msg, "not held") != 1 {
		t.Errorf("a call after the loss: %q; want ErrNotHeld and ErrLost, saying \"dlock: \" and \"not held\" once", msg)
	}
}

func TestUnreachableRedisEndsTheLeaseAtItsDeadline(t *testing.T) {
	e := newEnv(t)
	l, err := e.c.TryLock(context.Background(), "unreachable",
		dlock.WithTTL(300*time.Millisecond), dlock.WithRefreshInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Kill(t)
	waitDone(t, l, 5*time.Second)
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) || !strings.Contains(err.Error(), "deadline") {
		t.Errorf("Err = %v, want ErrLost at the deadline", err)
	}
}

// A lock whose automatic refreshes fail until its deadline is lost then,
// and Err says why the last one failed (a permission the ACL user lacks,
// say), where it said only that the deadline passed: the reason was in
// the log alone.
func TestALossAtTheDeadlineSaysWhyTheRefreshesFailed(t *testing.T) {
	e := newEnv(t)
	d := &dropDriver{Driver: e.newDriver(t), script: "refresh", drops: 1 << 20,
		err: errors.New("NOPERM this user has no permissions to run the 'evalsha' command")}
	c := dlock.New(d)
	defer c.Close()
	l, err := c.TryLock(context.Background(), "refused", dlock.WithTTL(300*time.Millisecond), dlock.WithRefreshInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 5*time.Second)
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) || !strings.Contains(err.Error(), "deadline") || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("Err = %v, want ErrLost at the deadline, with the refreshes' NOPERM", err)
	}
}

// A lock whose refreshes fail before its max hold is lost at its deadline,
// not to the max hold, even when the refresh that failed was capped by it.
func TestARefreshFailureBeforeTheMaxHoldIsNotTheMaxHold(t *testing.T) {
	e := newEnv(t)
	// The first refresh, at 600ms, asks for the 600ms left of the max hold.
	l, err := e.c.TryLock(context.Background(), "unreachable-capped",
		dlock.WithTTL(time.Second), dlock.WithRefreshInterval(600*time.Millisecond), dlock.WithMaxHold(1200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Kill(t)
	waitDone(t, l, 5*time.Second)
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) || errors.Is(err, dlock.ErrMaxHold) || !strings.Contains(err.Error(), "deadline") {
		t.Errorf("Err = %v, want ErrLost at the deadline, not ErrMaxHold", err)
	}
}

// AutoRefresh after a Release that failed is refused: the lock is no longer
// refreshed, so that a lock whose release was lost runs out.
func TestAutoRefreshAfterAFailedReleaseIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "let-go", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Kill(t)
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := l.Release(rctx); err == nil {
		t.Fatal("Release succeeded with Redis gone")
	}
	if err := l.AutoRefresh(); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("AutoRefresh after a failed Release: err = %v, want ErrNotHeld", err)
	}
}

// A Refresh to a shorter TTL whose outcome is unknown may have run: the
// holder's deadline moves to where that TTL puts it, not the longer one it
// had, as the lock may expire on the server then. A longer one leaves the
// deadline as it was.
func TestARefreshWhoseOutcomeIsUnknownCountsOnTheShorterTTL(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "unsure", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	before := l.Deadline()
	e.drv.loseReplies(1)
	if err := l.Refresh(ctx, 2*time.Minute); err == nil {
		t.Fatal("Refresh with its reply lost succeeded")
	}
	if got := l.Deadline(); !got.Equal(before) {
		t.Errorf("a longer refresh of unknown outcome moved the deadline by %v", got.Sub(before))
	}
	start := time.Now()
	e.drv.loseReplies(1)
	if err := l.Refresh(ctx, 200*time.Millisecond); err == nil {
		t.Fatal("Refresh with its reply lost succeeded")
	}
	if got := l.Deadline(); got.After(time.Now().Add(200 * time.Millisecond)) {
		t.Fatalf("deadline %v after a 200ms refresh of unknown outcome, begun %v ago", time.Until(got), time.Since(start))
	}
	// It may indeed have run: the server expires the lock then.
	if left := e.pttl(t, "unsure"); left > 200*time.Millisecond {
		t.Fatalf("PTTL %v after the refresh", left)
	}
	waitDone(t, l, 2*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost at the shorter deadline", l.Err())
	}
}

// A Refresh to a shorter TTL whose reply is lost and whose failure comes
// back only after the lock's deadline passed: the deadline still moves to
// where that refresh would put it, which the server may have kept.
func TestARefreshOfUnknownOutcomeEndingPastTheDeadlineStillShortensIt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "unsure-late", dlock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	old := l.Deadline()
	start := time.Now()
	e.drv.loseReplyThen(func() { time.Sleep(time.Until(old) + 30*time.Millisecond) })
	if err := l.Refresh(ctx, 50*time.Millisecond); err == nil {
		t.Fatal("Refresh with its reply lost succeeded")
	}
	if got, bound := l.Deadline(), start.Add(50*time.Millisecond); got.After(bound) {
		t.Errorf("Deadline %v after the refresh was sent, past where its 50ms TTL ends", got.Sub(start))
	}
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost", l.Err())
	}
}

func TestMaxHoldStopsRefreshing(t *testing.T) {
	e := newEnv(t)
	start := time.Now()
	l, err := e.c.TryLock(context.Background(), "capped",
		dlock.WithTTL(time.Second), dlock.WithRefreshInterval(100*time.Millisecond), dlock.WithMaxHold(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 5*time.Second)
	if !errors.Is(l.Err(), dlock.ErrMaxHold) || !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrMaxHold", l.Err())
	}
	checkLossMessage(t, l.Err())
	checkNotHeldAfterLoss(t, l.Refresh(context.Background(), time.Minute))
	// Refreshed past its TTL, up to the cap.
	if held := time.Since(start); held < 1900*time.Millisecond {
		t.Errorf("lock ended after %v, before its max hold", held)
	}
}

// The max hold bounds the automatic refreshing, not the holder's own
// Refresh calls: they keep the lock past it, and once they stop, the lock
// runs out at its deadline, for the max hold.
func TestARefreshByHandIsNotBoundedByTheMaxHold(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const ttl, maxHold = 300 * time.Millisecond, 400 * time.Millisecond
	l, err := e.c.TryLock(ctx, "by-hand", dlock.WithTTL(ttl), dlock.WithAutoRefresh(), dlock.WithMaxHold(maxHold))
	if err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); time.Since(start) < 2*maxHold; time.Sleep(ttl / 3) {
		if err := l.Refresh(ctx, ttl); err != nil {
			t.Fatalf("Refresh %v after the acquire: %v", time.Since(start), err)
		}
	}
	if pttl := e.pttl(t, "by-hand"); pttl <= 0 || l.Err() != nil {
		t.Fatalf("past the max hold, refreshed by hand: PTTL %v, Err %v", pttl, l.Err())
	}
	waitDone(t, l, 5*time.Second)
	if !errors.Is(l.Err(), dlock.ErrMaxHold) {
		t.Errorf("Err = %v, want ErrMaxHold", l.Err())
	}
}

// gatedDriver holds the reply of the calls of one script, once armed,
// until the test opens the gate: each runs on the server at once, and ran
// says so (a slow way back, or a client goroutine slow to be scheduled).
type gatedDriver struct {
	dlock.Driver
	script atomic.Value // string
	ran    chan struct{}
	open   chan struct{}
}

func (d *gatedDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	d.Driver.Eval(ctx, calls...)
	name, _ := d.script.Load().(string)
	for _, c := range calls {
		if name != "" && c.Script.Name == name {
			select {
			case d.ran <- struct{}{}:
			default:
			}
			<-d.open
			return
		}
	}
}

// A Refresh by hand past the max hold is not cut short by the watchdog:
// its next refresh would ask for what is left of the max hold, cutting the
// TTL on the server while the holder counted on its Refresh's deadline
// until that refresh's reply came. The lock runs out at that deadline, for
// the max hold.
func TestTheMaxHoldDoesNotCutARefreshByHandShort(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &gatedDriver{Driver: e.newDriver(t), ran: make(chan struct{}, 1), open: make(chan struct{})}
	c := dlock.New(d)
	defer c.Close()
	defer close(d.open) // first: Close waits for the refresh under way
	l, err := c.TryLock(ctx, "max-hold-by-hand", dlock.WithTTL(500*time.Millisecond),
		dlock.WithRefreshInterval(100*time.Millisecond), dlock.WithMaxHold(600*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	d.script.Store("refresh")
	select {
	case <-d.ran:
		// A watchdog refresh ran; its reply is held back.
		if left, pttl := time.Until(l.Deadline()), e.pttl(t, "max-hold-by-hand"); l.Err() == nil && pttl < left-10*time.Millisecond {
			t.Errorf("the watchdog's refresh left %v on the server while its holder counts on %v", pttl, left)
		}
	case <-l.Done():
		if !errors.Is(l.Err(), dlock.ErrMaxHold) {
			t.Errorf("Err = %v, want ErrMaxHold", l.Err())
		}
	}
}

// A max hold given when the lock was obtained bounds the refreshing that a
// later AutoRefresh without one starts.
func TestAutoRefreshKeepsTheMaxHoldTheLockWasObtainedWith(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "kept-cap", dlock.WithTTL(time.Second), dlock.WithMaxHold(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if err := l.AutoRefresh(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("still held long after the max hold")
	}
	if err := l.Err(); !errors.Is(err, dlock.ErrMaxHold) {
		t.Errorf("Err = %v, want ErrMaxHold", err)
	}
}

func TestAutoRefreshResumesRefreshingThatTheMaxHoldStopped(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// The first refresh, at 600ms, can extend the lock by only 400ms.
	const ttl, every, maxHold = time.Second, 600 * time.Millisecond, time.Second
	t.Run("after it stopped", func(t *testing.T) {
		l, err := e.c.TryLock(ctx, "recapped", dlock.WithTTL(ttl), dlock.WithRefreshInterval(every), dlock.WithMaxHold(maxHold))
		if err != nil {
			t.Fatal(err)
		}
		// After the acquire was sent, from when the max hold counts.
		start := time.Now()
		defer l.Release(ctx)
		// That refresh is the last: the watchdog lets the lock go, to run
		// out at the max hold.
		awaitCond(t, 3*time.Second, func() bool { return dlock.LeaseDropped(l) })
		if !l.Deadline().Before(start.Add(maxHold)) {
			t.Fatalf("deadline %v after the max hold", l.Deadline().Sub(start))
		}
		// A longer max hold hands it back to the watchdog, which refreshes
		// it past the old one, with its own TTL, not what the capped
		// refresh asked for.
		if err := l.AutoRefresh(dlock.WithRefreshInterval(every), dlock.WithMaxHold(time.Hour)); err != nil {
			t.Fatal(err)
		}
		awaitCond(t, 3*time.Second, func() bool { return l.Deadline().After(start.Add(maxHold + 200*time.Millisecond)) })
		if err := l.Err(); err != nil {
			t.Fatalf("Err = %v, want held", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("while the capped refresh runs", func(t *testing.T) {
		start := time.Now()
		l, err := e.c.TryLock(ctx, "recapped2", dlock.WithTTL(ttl), dlock.WithRefreshInterval(every), dlock.WithMaxHold(maxHold))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		raised := make(chan error, 1)
		e.drv.runAfterNext(func() { raised <- l.AutoRefresh(dlock.WithRefreshInterval(every), dlock.WithMaxHold(time.Hour)) })
		if err := <-raised; err != nil {
			t.Fatal(err)
		}
		// The next refresh comes before the capped one's deadline, not an
		// interval after it.
		awaitCond(t, 3*time.Second, func() bool { return l.Deadline().After(start.Add(maxHold + 200*time.Millisecond)) })
		if err := l.Err(); err != nil {
			t.Fatalf("Err = %v, want held", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestLeaseOptionsAreChecked(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for name, opts := range map[string][]dlock.Option{
		"interval equal to the TTL":   {dlock.WithTTL(time.Second), dlock.WithRefreshInterval(time.Second)},
		"interval above the TTL":      {dlock.WithTTL(time.Second), dlock.WithRefreshInterval(2 * time.Second)},
		"zero interval":               {dlock.WithRefreshInterval(0)},
		"interval under 1ms":          {dlock.WithRefreshInterval(time.Nanosecond)},
		"max hold shorter than a TTL": {dlock.WithTTL(time.Second), dlock.WithAutoRefresh(), dlock.WithMaxHold(time.Millisecond)},
		"negative max hold":           {dlock.WithMaxHold(-time.Second)},
	} {
		if _, err := e.c.TryLock(ctx, "opts", opts...); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s: err = %v, want ErrInvalidOption", name, err)
		}
	}
	l, err := e.c.TryLock(ctx, "opts")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.AutoRefresh(); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("AutoRefresh after release: err = %v, want ErrNotHeld", err)
	}
}

func TestAutoRefreshStartedLaterAndStoppedByClose(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.newClient(t)
	l, err := c.TryLock(ctx, "later", dlock.WithTTL(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.AutoRefresh(dlock.WithRefreshInterval(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// Refreshed: still held after three TTLs.
	time.Sleep(1500 * time.Millisecond)
	if _, err := l.TTL(ctx); err != nil {
		t.Fatalf("lost while refreshed: %v", err)
	}
	// Close stops the watchdog: the lock then runs out.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 2*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLost) || !errors.Is(l.Err(), dlock.ErrClosed) {
		t.Errorf("Err = %v, want ErrLost and ErrClosed", l.Err())
	}
	if _, err := c.TryLock(ctx, "x", dlock.WithAutoRefresh()); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("auto-refresh after Close: err = %v, want ErrClosed", err)
	}
}

// TestADoThatCloseOvertakesIsToldWhy: Close does not end a Do's function,
// whose lock is no longer refreshed; at its deadline the function's context
// ends, and Do returns, with a loss that says Close was the cause.
func TestADoThatCloseOvertakesIsToldWhy(t *testing.T) {
	e := newEnv(t)
	c := e.newClient(t)
	running := make(chan struct{})
	var cause error
	done := make(chan error, 1)
	go func() {
		done <- c.Do(context.Background(), "job", func(ctx context.Context) error {
			close(running)
			<-ctx.Done()
			cause = context.Cause(ctx)
			return ctx.Err()
		}, dlock.WithTTL(300*time.Millisecond))
	}()
	<-running
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	err := <-done
	if !errors.Is(err, dlock.ErrLost) || !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("Do = %v, want ErrLost and ErrClosed", err)
	}
	if !errors.Is(cause, dlock.ErrClosed) {
		t.Errorf("the function's context ended for %v, want ErrClosed", cause)
	}
}

// TestADoWhoseFunctionReturnsTheLossSaysItOnce: a function that returns
// the cause of its context's end, the loss itself, gets it back from Do
// once, not joined to itself.
func TestADoWhoseFunctionReturnsTheLossSaysItOnce(t *testing.T) {
	e := newEnv(t)
	err := e.c.Do(context.Background(), "cause", func(ctx context.Context) error {
		e.srv.Do(t, "DEL", "dlock:{cause}") // lost at the next refresh
		<-ctx.Done()
		return context.Cause(ctx)
	}, dlock.WithTTL(300*time.Millisecond))
	if !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Do = %v, want ErrLost", err)
	}
	if msg := err.Error(); strings.Count(msg, "lock lost") != 1 {
		t.Errorf("Do's error says the loss %d times: %s", strings.Count(msg, "lock lost"), msg)
	}
}

// TestALockWhoseRefreshesFailedBeforeCloseIsNotLostToIt: a lock whose
// refreshes were failing when Close came would have been lost anyway: its
// loss does not blame Close.
func TestALockWhoseRefreshesFailedBeforeCloseIsNotLostToIt(t *testing.T) {
	e := newEnv(t)
	d := &unsentDriver{tapDriver: e.newDriver(t)}
	var failed atomic.Bool
	c := dlock.New(d, dlock.WithHooks(dlock.Hooks{Refresh: func(_ context.Context, _ dlock.HookInfo, err error) {
		if err != nil {
			failed.Store(true)
		}
	}}))
	defer c.Close()
	ctx := context.Background()
	l, err := c.TryLock(ctx, "failing", dlock.WithTTL(600*time.Millisecond), dlock.WithAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	d.unsent.Store(1 << 20) // every refresh fails from now on
	awaitCond(t, 5*time.Second, failed.Load)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 2*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLost) || errors.Is(l.Err(), dlock.ErrClosed) {
		t.Errorf("Err = %v, want ErrLost, not ErrClosed", l.Err())
	}
	d.unsent.Store(0)
}

// TestAutoRefreshKeepsTheLocksTTL: the TTL is the lock's; a WithTTL given
// to AutoRefresh changes neither it nor the default interval (TTL/3).
func TestAutoRefreshKeepsTheLocksTTL(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "own-ttl", dlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if err := l.AutoRefresh(dlock.WithTTL(300 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if got := dlock.RefreshEvery(l); got != 10*time.Second {
		t.Errorf("refreshed every %v, want 10s (a third of the lock's TTL)", got)
	}
}

// TestWatchdogBatchesRefreshes: the watchdog refreshes the locks due
// together in one round trip, not one for each lock. The locks are taken
// while it is paused, and it resumes once every one is due; it then
// refreshes each of them five times, counted at the driver.
func TestWatchdogBatchesRefreshes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c, refreshTrips, refreshCalls := refreshCounting(t, e)
	const (
		locks    = 200
		interval = 100 * time.Millisecond
		rounds   = 5
	)
	resume := dlock.PauseWatchdog(c)
	held := make([]*dlock.Lock, 0, locks)
	for i := range locks {
		l, err := c.TryLock(ctx, "batch:"+strconv.Itoa(i),
			dlock.WithTTL(10*time.Second), dlock.WithRefreshInterval(interval))
		if err != nil {
			resume()
			t.Fatal(err)
		}
		held = append(held, l)
	}
	// The last lock's first refresh falls due an interval after it was
	// taken: then every lock is due.
	time.Sleep(interval)
	resume()
	awaitCond(t, 10*time.Second, func() bool { return refreshCalls.Load() >= rounds*locks })
	// Each round is one round trip; one for each lock would be 1,000.
	if trips, calls := refreshTrips.Load(), refreshCalls.Load(); trips > 2*rounds {
		t.Errorf("%d round trips to refresh %d locks %d times (%d refreshes)", trips, locks, rounds, calls)
	}
	releaseAllHeld(t, held)
}

// refreshCounting returns a client, closed with the test, whose refresh
// round trips and refresh calls are counted.
func refreshCounting(t *testing.T, e *env) (c *dlock.Client, trips, calls *atomic.Int64) {
	trips, calls = new(atomic.Int64), new(atomic.Int64)
	d := &hookDriver{Driver: e.newDriver(t), after: func(cs []*dlock.Call) {
		if isRefresh(cs) {
			trips.Add(1)
			calls.Add(int64(len(cs)))
		}
	}}
	c = dlock.New(d)
	t.Cleanup(func() { _ = c.Close() })
	return c, trips, calls
}

// releaseAllHeld checks that none of the locks was lost, and releases them.
func releaseAllHeld(t *testing.T, held []*dlock.Lock) {
	t.Helper()
	for _, l := range held {
		if l.Err() != nil {
			t.Fatalf("lost: %v", l.Err())
		}
		_ = l.Release(context.Background())
	}
}

// TestWatchdogGroupsLocksTakenApart: locks taken one after the other, so
// not due together, share round trips all the same: a lock due within a
// tenth of its interval joins a batch that goes out anyway. Round trips per
// round stay near the number of such tenths the locks were taken over,
// not one for each lock.
func TestWatchdogGroupsLocksTakenApart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c, refreshTrips, refreshCalls := refreshCounting(t, e)
	const (
		locks    = 200
		interval = 300 * time.Millisecond
		window   = interval / 10 // how early a lock may join a batch
		rounds   = 3
	)
	held := make([]*dlock.Lock, 0, locks)
	start := time.Now()
	for i := range locks {
		if i%20 == 19 {
			time.Sleep(window / 4) // taken apart: over several windows
		}
		l, err := c.TryLock(ctx, "apart:"+strconv.Itoa(i),
			dlock.WithTTL(10*time.Second), dlock.WithRefreshInterval(interval))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	spread := time.Since(start)
	awaitCond(t, 10*time.Second, func() bool { return refreshCalls.Load() >= rounds*locks })
	// A batch for each window the locks were taken over, and one more,
	// every round (and a round begun); one for each lock would be 600.
	limit := int64(rounds+1) * (int64(spread/window) + 2)
	if trips, calls := refreshTrips.Load(), refreshCalls.Load(); trips > limit {
		t.Errorf("%d round trips to refresh %d locks taken over %v, %d times (%d refreshes); want at most %d",
			trips, locks, spread, rounds, calls, limit)
	}
	releaseAllHeld(t, held)
}

// TestPausedHolderIsFencedOut: the holder's process stops (its watchdog is
// held) for longer than the TTL; another holder takes the lock and writes.
// When the first resumes, its Done has closed and the fenced resource
// refuses its write.
func TestPausedHolderIsFencedOut(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	paused := e.newClient(t)
	old, err := paused.TryLock(ctx, "report", dlock.WithTTL(100*time.Millisecond), dlock.WithAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	if err := paused.SetFenced(ctx, "report:data", old.Fence(), "v1 by old"); err != nil {
		t.Fatal(err)
	}
	resume := dlock.PauseWatchdog(paused)
	cur, err := e.c.Lock(ctx, "report", dlock.WithRetry(dlock.ConstantBackoff(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.c.SetFenced(ctx, "report:data", cur.Fence(), "v2 by new"); err != nil {
		t.Fatal(err)
	}
	resume()
	waitDone(t, old, time.Second)
	if !errors.Is(old.Err(), dlock.ErrLost) {
		t.Errorf("paused holder's Err = %v, want ErrLost", old.Err())
	}
	err = paused.SetFenced(ctx, "report:data", old.Fence(), "v3 by old")
	if !errors.Is(err, dlock.ErrStaleFence) {
		t.Errorf("stale write: err = %v, want ErrStaleFence", err)
	}
	if got := e.srv.Do(t, "HGET", "report:data", "value"); got != "v2 by new" {
		t.Errorf("resource = %q, want the new holder's write", got)
	}
	if err := cur.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSetFencedInput(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if err := e.c.SetFenced(ctx, "", 1, "v"); !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrEmptyName) {
		t.Errorf("empty key: err = %v, want ErrInvalidArgument, not ErrEmptyName (a key is not a lock's name)", err)
	}
	// Fence 0 is what a Lock without a fence (a read hold, a permit)
	// reports: it would protect nothing.
	if err := e.c.SetFenced(ctx, "fresh", 0, "v"); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("fence 0: err = %v, want ErrInvalidArgument", err)
	}
	if e.exists(t, "fresh") {
		t.Error("a write with fence 0 was made")
	}
	e.srv.Do(t, "SET", "plain", "x")
	if err := e.c.SetFenced(ctx, "plain", 1, "v"); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("string key: err = %v, want ErrWrongType", err)
	} else if msg := err.Error(); msg != `dlock: key holds data that is not a fenced value: "plain" (a hash of "value" and "fence" only)` {
		t.Errorf("string key: the error says %q", msg) // the key is the caller's, not a lock's
	}
	e.srv.Do(t, "HSET", "words", "fence", "seven", "value", "x")
	if err := e.c.SetFenced(ctx, "words", 1, "v"); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("hash whose fence is not a number: err = %v, want ErrWrongType", err)
	}
	if got := e.srv.Do(t, "HGET", "words", "value"); got != "x" {
		t.Errorf("the refused write changed the value to %q", got)
	}
	// A hash of other fields, with or without a fence among them, is the
	// caller's other data: nothing is added to it or overwritten.
	for key, fields := range map[string][]string{
		"user":        {"name", "bob"},
		"user:value":  {"name", "bob", "value", "x"},
		"user:fenced": {"name", "bob", "fence", "3"},
		"user:all":    {"name", "bob", "fence", "3", "value", "x"},
	} {
		e.srv.Do(t, append([]string{"HSET", key}, fields...)...)
		before := e.srv.Do(t, "HGETALL", key)
		if err := e.c.SetFenced(ctx, key, 5, "v"); !errors.Is(err, dlock.ErrWrongType) {
			t.Errorf("hash %v: err = %v, want ErrWrongType", fields, err)
		}
		if after := e.srv.Do(t, "HGETALL", key); after != before {
			t.Errorf("the refused write changed hash %v to %q", fields, after)
		}
	}
	if err := e.c.SetFenced(ctx, "res", 5, "a"); err != nil {
		t.Fatal(err)
	}
	if err := e.c.SetFenced(ctx, "res", 5, "b"); err != nil {
		t.Errorf("same fence refused: %v", err)
	}
	if err := e.c.SetFenced(ctx, "res", 4, "c"); !errors.Is(err, dlock.ErrStaleFence) {
		t.Errorf("older fence: err = %v, want ErrStaleFence", err)
	}
	// Fences past 2^53, which a float comparison cannot tell apart.
	for _, f := range [][2]uint64{{math.MaxUint64, math.MaxUint64 - 1}, {1<<53 + 1, 1 << 53}, {10000000000000001, 10000000000000000}} {
		key := "big" + strconv.FormatUint(f[0], 10)
		if err := e.c.SetFenced(ctx, key, f[0], "new"); err != nil {
			t.Fatal(err)
		}
		if err := e.c.SetFenced(ctx, key, f[1], "stale"); !errors.Is(err, dlock.ErrStaleFence) {
			t.Errorf("fence %d after %d: err = %v, want ErrStaleFence", f[1], f[0], err)
		}
		if err := e.c.SetFenced(ctx, key, f[0], "again"); err != nil {
			t.Errorf("fence %d again: %v", f[0], err)
		}
	}
	// A lock's own hash has a fence: SetFenced there would move it.
	for _, kind := range []string{"lock", "rwlock", "semaphore"} {
		var l interface{ Release(context.Context) error }
		var err error
		switch kind {
		case "lock":
			l, err = e.c.TryLock(ctx, "guarded")
		case "rwlock":
			l, err = e.c.RWMutex("guarded").TryLock(ctx)
		default:
			l, err = e.c.Semaphore("guarded", 2).TryAcquire(ctx)
		}
		if err != nil {
			t.Fatal(kind, err)
		}
		before := e.srv.Do(t, "HGETALL", "dlock:{guarded}")
		if err := e.c.SetFenced(ctx, e.c.RedisKey("guarded"), 1<<60, "v"); !errors.Is(err, dlock.ErrWrongType) {
			t.Errorf("a %s's key: err = %v, want ErrWrongType", kind, err)
		}
		if after := e.srv.Do(t, "HGETALL", "dlock:{guarded}"); after != before {
			t.Errorf("the refused write changed the %s to %q", kind, after)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"nan", "inf", "-1", "1.5"} {
		e.srv.Do(t, "HSET", "odd", "fence", bad)
		if err := e.c.SetFenced(ctx, "odd", 1, "v"); !errors.Is(err, dlock.ErrWrongType) {
			t.Errorf("a stored fence %q: err = %v, want ErrWrongType", bad, err)
		}
	}
}

// GetFenced reads back what SetFenced wrote, fences past 2^53 exactly,
// nothing for a key never written, and refuses what SetFenced refuses.
func TestGetFencedReadsWhatSetFencedWrote(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if v, f, err := e.c.GetFenced(ctx, "never"); v != "" || f != 0 || err != nil {
		t.Errorf("a key never written: %q, %d, %v; want \"\", 0, nil", v, f, err)
	}
	for _, f := range []uint64{1, 1<<53 + 1, math.MaxUint64} {
		key := "got" + strconv.FormatUint(f, 10)
		if err := e.c.SetFenced(ctx, key, f, "v\x00"+key); err != nil {
			t.Fatal(err)
		}
		if v, got, err := e.c.GetFenced(ctx, key); v != "v\x00"+key || got != f || err != nil {
			t.Errorf("after SetFenced(%d): %q, %d, %v", f, v, got, err)
		}
	}
	if _, _, err := e.c.GetFenced(ctx, ""); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("empty key: err = %v, want ErrInvalidArgument", err)
	}
	var nilCtx context.Context
	if _, _, err := e.c.GetFenced(nilCtx, "never"); !errors.Is(err, dlock.ErrNilContext) {
		t.Errorf("nil context: err = %v, want ErrNilContext", err)
	}
	e.srv.Do(t, "SET", "plain", "x")
	e.srv.Do(t, "HSET", "user", "name", "bob", "fence", "3")
	e.srv.Do(t, "HSET", "words", "fence", "seven", "value", "x")
	l, err := e.c.TryLock(ctx, "guarded")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	for _, key := range []string{"plain", "user", "words", e.c.RedisKey("guarded")} {
		if v, f, err := e.c.GetFenced(ctx, key); !errors.Is(err, dlock.ErrWrongType) || v != "" || f != 0 {
			t.Errorf("%s: %q, %d, %v; want ErrWrongType", key, v, f, err)
		}
	}
}

// TestFencesStrictlyIncreaseUnderCompetition has four clients take one lock
// 1,000 times in all; the fences, in the order the holders held the lock,
// must strictly increase.
func TestFencesStrictlyIncreaseUnderCompetition(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	var fences []uint64
	var wg sync.WaitGroup
	for range 4 {
		c := e.newClient(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 250 {
				l, err := c.Lock(ctx, "fence-race", dlock.WithRetry(dlock.ConstantBackoff(0)))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				fences = append(fences, l.Fence())
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(fences) != 1000 {
		t.Fatalf("%d acquisitions", len(fences))
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fence %d: %d after %d", i, fences[i], fences[i-1])
		}
	}
}

func TestDo(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	errJob := errors.New("job failed")
	err := e.c.Do(ctx, "job", func(ctx context.Context) error {
		if _, err := e.newClient(t).TryLock(ctx, "job"); !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("lock not held inside Do: %v", err)
		}
		return errJob
	})
	if !errors.Is(err, errJob) {
		t.Errorf("Do = %v, want the function's error", err)
	}
	if e.locked(t, "dlock:{job}") {
		t.Error("Do did not release")
	}
	err = e.c.Do(ctx, "job", func(ctx context.Context) error {
		e.srv.Do(t, "DEL", "dlock:{job}") // the lock is taken away mid-job
		<-ctx.Done()
		return ctx.Err()
	}, dlock.WithRefreshInterval(20*time.Millisecond))
	if !errors.Is(err, dlock.ErrLost) || !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "\n") {
		t.Errorf("Do = %q, want the loss and the cancelled context, on one line", err)
	}
	if err := e.c.Do(ctx, "job", nil); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("nil fn: err = %v", err)
	}
}

// TestADoWhoseReleaseNoServerAnswersGivesItBackLater: the release at the
// end of Do that a stalled server does not answer in time (for a lock, a
// write hold, a permit) goes on in the background: the name is free again
// once the server answers, where it stayed taken for its TTL (a minute
// here), as nobody can call Release again.
func TestADoWhoseReleaseNoServerAnswersGivesItBackLater(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &unsentDriver{tapDriver: e.newDriver(t)}
	c := dlock.New(d)
	defer c.Close()
	for _, tc := range []struct {
		name string
		do   func(fn func(context.Context) error) error
		try  func() (*dlock.Lock, error)
	}{
		{"lock", func(fn func(context.Context) error) error {
			return c.Do(ctx, "stalled", fn, dlock.WithTTL(time.Minute))
		},
			func() (*dlock.Lock, error) { return e.c.TryLock(ctx, "stalled") }},
		{"write hold", func(fn func(context.Context) error) error {
			return c.RWMutex("stalled-rw").Do(ctx, fn, dlock.WithTTL(time.Minute))
		}, func() (*dlock.Lock, error) { return e.c.RWMutex("stalled-rw").TryLock(ctx) }},
		{"permit", func(fn func(context.Context) error) error {
			return c.Semaphore("stalled-sem", 1).Do(ctx, fn, dlock.WithTTL(time.Minute))
		}, func() (*dlock.Lock, error) { return e.c.Semaphore("stalled-sem", 1).TryAcquire(ctx) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fn := func(context.Context) error {
				d.unsent.Store(3) // the release, and the first two tries of its give-back
				return nil
			}
			if err := tc.do(fn); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Do = %v, want the release's timeout", err)
			}
			var l *dlock.Lock
			awaitCond(t, 15*time.Second, func() bool { l, _ = tc.try(); return l != nil })
			if err := l.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestADoWhoseReleaseReplyComesLateReturnsNil: fn returns well before the
// lock's deadline, and the reply of the release that frees the name comes
// after it: Do returns fn's nil, as the lock was not lost while fn ran (a
// Release would return the loss).
func TestADoWhoseReleaseReplyComesLateReturnsNil(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		if calls[0].Script.Name == "release" {
			time.Sleep(400 * time.Millisecond)
		}
	}}
	c := dlock.New(d)
	defer c.Close()
	if err := c.Do(ctx, "do-late-reply", func(context.Context) error { return nil }, dlock.WithTTL(300*time.Millisecond)); err != nil {
		t.Errorf("Do = %v; fn returned nil well before the deadline, and the name was freed", err)
	}
	if e.locked(t, "dlock:{do-late-reply}") {
		t.Error("still held")
	}
}

// TestADoGivenBackLaterEndsReleased: a lock whose final release Do gave
// back in the background before its deadline ends released, not lost at
// its deadline: its End hook says so.
func TestADoGivenBackLaterEndsReleased(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &unsentDriver{tapDriver: e.newDriver(t)}
	ended := make(ends, 4)
	c := dlock.New(d, dlock.WithHooks(dlock.Hooks{End: ended.hook}))
	defer c.Close()
	err := c.Do(ctx, "do-given-back", func(context.Context) error {
		d.unsent.Store(1) // the release only
		return nil
	}, dlock.WithTTL(time.Second))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do = %v, want the release's timeout", err)
	}
	if ok, err := ended.await(); !ok {
		t.Error("End hook never called")
	} else if err != nil {
		t.Errorf("End hook reports %v for a lock that Do gave back", err)
	}
}

// A Do whose release finds no connection (a server down, or one a
// failover replaced that the client library has yet to find) gives the
// lock back once it connects again, rather than leaving the name held
// until its TTL: the release, sent again at once and then in the
// background, frees it, and the lock ends released.
func TestADoWhoseReleaseCannotConnectGivesItBackLater(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &unsentDriver{tapDriver: e.newDriver(t), err: errRefusedDial}
	ended := make(ends, 4)
	c := dlock.New(d, dlock.WithHooks(dlock.Hooks{End: ended.hook}))
	defer c.Close()
	err := c.Do(ctx, "do-unconnected", func(context.Context) error {
		d.unsent.Store(3) // the release, its copy sent at once, and the first in the background
		return nil
	}, dlock.WithTTL(time.Minute))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Do = %v, want the release's refused dial", err)
	}
	if ok, err := ended.await(); !ok {
		t.Fatal("End hook never called")
	} else if err != nil {
		t.Errorf("End hook reports %v for a lock that Do gave back", err)
	}
	if e.locked(t, "dlock:{do-unconnected}") {
		t.Error("still held")
	}
}

// TryDo and its kin run the function under the hold when they obtain it
// in one attempt, and skip it at once, with ErrNotObtained, when the name
// is held: a Do that waited would wait its minute (the test's context ends
// first).
func TestTryDoRunsOrSkipsAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other := e.newClient(t)
	doc, quota := e.c.RWMutex("try-doc"), e.c.Semaphore("try-quota", 1)
	for _, tc := range []struct {
		name string
		do   func(fn func(ctx context.Context) error) error
		// hold takes, with the other client, what keeps the call out;
		// tryInside tries it with the other client while fn runs.
		hold, tryInside func() (*dlock.Lock, error)
	}{
		{"Client.TryDo", func(fn func(ctx context.Context) error) error { return e.c.TryDo(ctx, "try-job", fn) },
			func() (*dlock.Lock, error) { return other.TryLock(ctx, "try-job") },
			func() (*dlock.Lock, error) { return other.TryLock(ctx, "try-job") }},
		{"Client.TryDoMulti", func(fn func(ctx context.Context) error) error {
			return e.c.TryDoMulti(ctx, []string{"try-pay", "try-ship"}, fn)
		},
			func() (*dlock.Lock, error) { return other.TryLock(ctx, "try-ship") },
			func() (*dlock.Lock, error) { return other.TryLock(ctx, "try-pay") }},
		{"RWMutex.TryDo", func(fn func(ctx context.Context) error) error { return doc.TryDo(ctx, fn) },
			func() (*dlock.Lock, error) { return other.RWMutex("try-doc").TryRLock(ctx) },
			func() (*dlock.Lock, error) { return other.RWMutex("try-doc").TryRLock(ctx) }},
		{"RWMutex.TryRDo", func(fn func(ctx context.Context) error) error { return doc.TryRDo(ctx, fn) },
			func() (*dlock.Lock, error) { return other.RWMutex("try-doc").TryLock(ctx) },
			func() (*dlock.Lock, error) { return other.RWMutex("try-doc").TryLock(ctx) }},
		{"Semaphore.TryDo", func(fn func(ctx context.Context) error) error { return quota.TryDo(ctx, fn) },
			func() (*dlock.Lock, error) { return other.Semaphore("try-quota", 1).TryAcquire(ctx) },
			func() (*dlock.Lock, error) { return other.Semaphore("try-quota", 1).TryAcquire(ctx) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errJob := errors.New("job failed")
			ran := false
			err := tc.do(func(context.Context) error {
				ran = true
				if l, err := tc.tryInside(); !errors.Is(err, dlock.ErrNotObtained) {
					t.Errorf("another client inside fn: err = %v, want ErrNotObtained", err)
					if err == nil {
						_ = l.Release(ctx)
					}
				}
				return errJob
			})
			if !ran || !errors.Is(err, errJob) {
				t.Fatalf("free: ran %v, returned %v; want fn's error", ran, err)
			}
			held, err := tc.hold()
			if err != nil {
				t.Fatalf("after fn: %v (the hold was not released)", err)
			}
			ran = false
			err = tc.do(func(context.Context) error { ran = true; return nil })
			if ran || !errors.Is(err, dlock.ErrNotObtained) {
				t.Errorf("held: ran %v, returned %v; want ErrNotObtained at once", ran, err)
			}
			if err := held.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestDoOnEveryPrimitive: DoMulti, RWMutex.Do and RDo, and Semaphore.Do
// run the function while holding what they obtained, return its error,
// and give the hold back.
func TestDoOnEveryPrimitive(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	other := e.newClient(t)
	errJob := errors.New("job failed")
	refuses := func(what string, acquire func() (*dlock.Lock, error)) {
		t.Helper()
		if l, err := acquire(); !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("%s inside Do: err = %v, want ErrNotObtained", what, err)
			if err == nil {
				_ = l.Release(ctx)
			}
		}
	}
	obtains := func(what string, acquire func() (*dlock.Lock, error)) {
		t.Helper()
		l, err := acquire()
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("%s: Release: %v", what, err)
		}
	}
	doc, otherDoc := e.c.RWMutex("doc"), other.RWMutex("doc")
	quota, otherQuota := e.c.Semaphore("quota", 1), other.Semaphore("quota", 1)
	for _, tc := range []struct {
		name     string
		do       func(fn func(ctx context.Context) error) error
		inside   func()
		afterFor func() (*dlock.Lock, error)
	}{
		{"DoMulti", func(fn func(ctx context.Context) error) error {
			return e.c.DoMulti(ctx, []string{"pay", "ship"}, fn)
		}, func() {
			refuses("a lock on one of the names", func() (*dlock.Lock, error) { return other.TryLock(ctx, "ship") })
		}, func() (*dlock.Lock, error) { return other.TryLockMulti(ctx, []string{"pay", "ship"}) }},
		{"RWMutex.RDo", func(fn func(ctx context.Context) error) error {
			return doc.RDo(ctx, fn)
		}, func() {
			obtains("another read hold", func() (*dlock.Lock, error) { return otherDoc.TryRLock(ctx) })
			refuses("the write hold", func() (*dlock.Lock, error) { return otherDoc.TryLock(ctx) })
		}, func() (*dlock.Lock, error) { return otherDoc.TryLock(ctx) }},
		{"RWMutex.Do", func(fn func(ctx context.Context) error) error {
			return doc.Do(ctx, fn)
		}, func() {
			refuses("a read hold", func() (*dlock.Lock, error) { return otherDoc.TryRLock(ctx) })
		}, func() (*dlock.Lock, error) { return otherDoc.TryRLock(ctx) }},
		{"Semaphore.Do", func(fn func(ctx context.Context) error) error {
			return quota.Do(ctx, fn)
		}, func() {
			refuses("the only other permit", func() (*dlock.Lock, error) { return otherQuota.TryAcquire(ctx) })
		}, func() (*dlock.Lock, error) { return otherQuota.TryAcquire(ctx) }},
	} {
		ran := false
		err := tc.do(func(ctx context.Context) error {
			ran = true
			tc.inside()
			return errJob
		})
		if !ran || !errors.Is(err, errJob) {
			t.Errorf("%s: ran %v, returned %v; want the function's error", tc.name, ran, err)
		}
		obtains(tc.name+": after it", tc.afterFor)
		if err := tc.do(nil); !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Errorf("%s with a nil function: err = %v, want ErrInvalidArgument", tc.name, err)
		}
	}
}

// BenchmarkRefresh measures what keeping locks alive costs: it holds 1, 100
// and 10,000 auto-refreshed locks and reports, per refresh interval, the
// round trips the client made and the commands the server ran (EVALSHA and
// the commands inside the scripts).
func BenchmarkRefresh(b *testing.B) {
	for _, n := range []int{1, 100, 10000} {
		b.Run("locks="+strconv.Itoa(n), func(b *testing.B) {
			e := newEnv(b)
			ctx := context.Background()
			const interval = 100 * time.Millisecond
			var wg sync.WaitGroup
			for w := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < n; i += 16 {
						if _, err := e.c.TryLock(ctx, "held:"+strconv.Itoa(i), dlock.WithTTL(time.Second), dlock.WithRefreshInterval(interval)); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			time.Sleep(interval) // let the first refreshes settle into batches
			before := e.drv.trips.Load()
			e.srv.Do(b, "CONFIG", "RESETSTAT")
			b.ResetTimer()
			for range b.N {
				time.Sleep(interval)
			}
			b.StopTimer()
			trips := float64(e.drv.trips.Load() - before)
			var commands float64
			for _, line := range strings.Split(e.srv.Do(b, "INFO", "commandstats"), "\n") {
				if _, rest, ok := strings.Cut(line, ":calls="); ok && !strings.Contains(line, "info") && !strings.Contains(line, "config") {
					c, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
					commands += float64(c)
				}
			}
			b.ReportMetric(trips/float64(b.N), "roundtrips/interval")
			b.ReportMetric(commands/float64(b.N), "commands/interval")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// hookDriver calls a test's functions around every Eval: before with the
// calls before they are sent, after with their replies before Eval hands
// them back. Either may block, to hold a request back or delay its reply,
// and so put the two sides of a race in a chosen order.
type hookDriver struct {
	dlock.Driver
	before, after func(calls []*dlock.Call)
	beforeCtx     func(ctx context.Context, calls []*dlock.Call) // before, given the calls' context
}

func (d *hookDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if d.before != nil {
		d.before(calls)
	}
	if d.beforeCtx != nil {
		d.beforeCtx(ctx, calls)
	}
	d.Driver.Eval(ctx, calls...)
	if d.after != nil {
		d.after(calls)
	}
}

// TestARefreshToAShorterTTLMovesTheDeadlineBeforeItsReply: the server
// cuts the TTL as soon as it runs the refresh; while its reply is on the
// way, Deadline is already the shorter one's, for exclusive locks and
// permits alike.
func TestARefreshToAShorterTTLMovesTheDeadlineBeforeItsReply(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ran, proceed := make(chan struct{}), make(chan struct{})
	d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		if strings.HasSuffix(calls[0].Script.Name, "refresh") {
			ran <- struct{}{}
			<-proceed
		}
	}}
	c := dlock.New(d)
	defer c.Close()
	for _, k := range []struct {
		name    string
		acquire func() (*dlock.Lock, error)
	}{
		{"lock", func() (*dlock.Lock, error) { return c.TryLock(ctx, "shorter", dlock.WithTTL(10*time.Second)) }},
		{"permit", func() (*dlock.Lock, error) {
			return c.Semaphore("shorter-sem", 1).TryAcquire(ctx, dlock.WithTTL(10*time.Second))
		}},
	} {
		t.Run(k.name, func(t *testing.T) {
			l, err := k.acquire()
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(ctx)
			refreshed := make(chan error, 1)
			go func() { refreshed <- l.Refresh(ctx, 100*time.Millisecond) }()
			<-ran // the server has cut the TTL; the reply is held back
			if left := time.Until(l.Deadline()); left > 100*time.Millisecond {
				t.Errorf("Deadline %v away while the refresh to 100ms that ran awaits its reply", left)
			}
			close(proceed)
			if err := <-refreshed; err != nil {
				t.Fatal(err)
			}
			proceed = make(chan struct{})
		})
	}
}

// TestARefreshWhoseReplyComesAfterItsDeadlineReportsTheLoss: the reply to
// a refresh comes back after the deadline that refresh sets (a slow
// server): the lock may have expired there before the refresh reached it,
// so Refresh returns the loss, whether or not anything armed the deadline
// timer (Done, a hook, a logger). Unarmed, it returned nil, and Err the
// loss right after.
func TestARefreshWhoseReplyComesAfterItsDeadlineReportsTheLoss(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		if isRefresh(calls) {
			time.Sleep(30 * time.Millisecond) // the reply comes late
		}
	}}
	c := dlock.New(d)
	defer c.Close()
	for _, armed := range []bool{false, true} {
		t.Run(fmt.Sprintf("armed=%v", armed), func(t *testing.T) {
			l, err := c.TryLock(ctx, "late-refresh", dlock.WithTTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(ctx)
			if armed {
				_ = l.Done()
			}
			// Its deadline: 10ms less 2.1ms for clock drift after it is sent.
			if err := l.Refresh(ctx, 10*time.Millisecond); !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) {
				t.Errorf("Refresh: err = %v, want the loss (ErrNotHeld, ErrLost)", err)
			}
			select {
			case <-l.Done():
			default:
				t.Error("Done is open after Refresh returned the loss")
			}
		})
	}
}

// TestARefreshAfterTheLocksDeadlineReportsTheLoss: a Refresh whose reply
// comes after the lock's deadline (though before the one it sets), or one
// sent once the deadline has passed (the server, whose TTL counts from
// when it got the acquire, may still have the lock), returns the loss,
// whether or not anything armed the deadline timer. Unarmed, both returned
// nil and the lock lived on.
func TestARefreshAfterTheLocksDeadlineReportsTheLoss(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var slowReply, slowAcquire atomic.Bool
	d := &hookDriver{Driver: e.newDriver(t),
		before: func(calls []*dlock.Call) {
			if calls[0].Script.Name == "acquire" && slowAcquire.Load() {
				time.Sleep(40 * time.Millisecond) // the acquire reaches the server late
			}
		},
		after: func(calls []*dlock.Call) {
			if isRefresh(calls) && slowReply.Load() {
				time.Sleep(150 * time.Millisecond)
			}
		}}
	c := dlock.New(d)
	defer c.Close()
	for _, when := range []string{"reply", "sent"} {
		for _, armed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s after/armed=%v", when, armed), func(t *testing.T) {
				slowAcquire.Store(when == "sent")
				l, err := c.TryLock(ctx, "refresh-past-deadline", dlock.WithTTL(100*time.Millisecond))
				slowAcquire.Store(false)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Release(ctx)
				if armed {
					_ = l.Done()
				}
				if when == "sent" {
					time.Sleep(time.Until(l.Deadline()) + 10*time.Millisecond) // the server has about 30ms left
				} else {
					slowReply.Store(true) // past the deadline, about 97ms from the acquire
					defer slowReply.Store(false)
				}
				if err := l.Refresh(ctx, 2*time.Second); !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) {
					t.Errorf("Refresh: err = %v, want the loss (ErrNotHeld, ErrLost)", err)
				}
			})
		}
	}
}

// TestAReleaseAfterTheLocksDeadlineReportsTheLoss: a Release of a lock
// whose deadline passed (Done closed, Err says it was lost) while the
// server still had it, as the server's TTL counts from when it got the
// acquire, frees the name and returns the loss, as Refresh does. It
// returned nil: code that takes Release's error for whether the work
// outlived the lock missed it.
func TestAReleaseAfterTheLocksDeadlineReportsTheLoss(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &hookDriver{Driver: e.newDriver(t), before: func(calls []*dlock.Call) {
		if calls[0].Script.Name == "acquire" {
			time.Sleep(500 * time.Millisecond) // the acquire reaches the server late
		}
	}}
	c := dlock.New(d)
	defer c.Close()
	l, err := c.TryLock(ctx, "released-past-deadline", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	<-l.Done() // about 500ms before the server's TTL runs out
	err = l.Release(ctx)
	if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) || l.Err() == nil {
		t.Errorf("Release: err = %v, Err = %v; want the loss (ErrNotHeld, ErrLost)", err, l.Err())
	}
	checkNotHeldAfterLoss(t, err)
	if e.locked(t, "dlock:{released-past-deadline}") {
		t.Error("the name is still held after Release")
	}
}

// TestAReleaseWhoseReplyComesAfterTheDeadlineReportsTheLoss: a Release
// whose reply comes after the lock's deadline returns the loss, as Err
// and the End hook say, whether something watched the deadline (Done,
// Context, hooks arm a timer) or not. Its outcome depended on that: with a
// timer, Release returned nil and Err the loss; without, both nil. One
// whose request fails returns the loss joined with the failure.
func TestAReleaseWhoseReplyComesAfterTheDeadlineReportsTheLoss(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name           string
		watched, fails bool
	}{{"unwatched", false, false}, {"watched", true, false}, {"failing", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			var l *dlock.Lock
			d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
				if calls[0].Script.Name != "release" {
					return
				}
				time.Sleep(time.Until(l.Deadline()) + 20*time.Millisecond) // the reply comes late
				if tc.fails {
					calls[0].Val, calls[0].Err = nil, errors.New("connection reset")
				}
			}}
			var mu sync.Mutex
			var ended []error
			var opts []dlock.ClientOption
			if tc.watched { // hooks arm the deadline timer
				opts = append(opts, dlock.WithHooks(dlock.Hooks{End: func(_ dlock.HookInfo, _ time.Duration, err error) {
					mu.Lock()
					defer mu.Unlock()
					ended = append(ended, err)
				}}))
			}
			c := dlock.New(d, opts...)
			defer c.Close()
			var err error
			if l, err = c.TryLock(ctx, "late-reply-"+tc.name, dlock.WithTTL(200*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			if tc.watched {
				_ = l.Done() // so do Done and Context
			}
			err = l.Release(ctx)
			select {
			case <-l.Done():
			default:
				t.Fatal("Done not closed when Release returned")
			}
			mu.Lock()
			defer mu.Unlock()
			var se *dlock.ServerError
			if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) || errors.As(err, &se) != tc.fails ||
				!errors.Is(l.Err(), dlock.ErrLost) || tc.watched && (len(ended) != 1 || !errors.Is(ended[0], dlock.ErrLost)) {
				t.Errorf("Release = %v, Err = %v, End hook %v; want the loss everywhere (and the failure: %v)", err, l.Err(), ended, tc.fails)
			}
		})
	}
}

// TestAFailedReleaseOfALostLockReportsTheLoss: a Release of a lock lost
// before it whose request fails returns the loss (ErrNotHeld, ErrLost) and
// the failure (a *ServerError: the server may still have the name). It
// returned the failure alone, hiding the loss.
func TestAFailedReleaseOfALostLockReportsTheLoss(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		if calls[0].Script.Name == "release" {
			calls[0].Val, calls[0].Err = nil, errors.New("connection reset")
		}
	}}
	c := dlock.New(d)
	defer c.Close()
	l, err := c.TryLock(ctx, "failed-after-loss", dlock.WithTTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	err = l.Release(ctx)
	var se *dlock.ServerError
	if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) || !errors.As(err, &se) || strings.Count(err.Error(), "dlock: ") != 1 {
		t.Errorf("Release: %v; want the loss (ErrNotHeld, ErrLost) and the *ServerError, saying \"dlock: \" once", err)
	}
}

// TestALockWhoseReleaseIsHeldBackEndsAtItsDeadline: a Release held back
// in the client (no connection free, say) past the lock's deadline does
// not keep the lock alive: once another client has taken the name, Err
// reports the loss and the lock's Context is cancelled.
func TestALockWhoseReleaseIsHeldBackEndsAtItsDeadline(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	taken := make(chan struct{})
	d := &hookDriver{Driver: e.newDriver(t), before: func(calls []*dlock.Call) {
		if calls[0].Script.Name == "release" {
			<-taken
		}
	}}
	c := dlock.New(d)
	defer c.Close()
	l, err := c.TryLock(ctx, "held-back", dlock.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	work := l.Context(ctx)
	released := make(chan error, 1)
	go func() { released <- l.Release(ctx) }()
	other := e.newClient(t)
	var o *dlock.Lock
	awaitCond(t, 5*time.Second, func() bool { o, _ = other.TryLock(ctx, "held-back"); return o != nil })
	errNow, workErr := l.Err(), work.Err()
	close(taken)
	if err := <-released; !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Release = %v, want the loss", err)
	}
	if err := o.Release(ctx); err != nil {
		t.Error(err)
	}
	if !errors.Is(errNow, dlock.ErrLost) || workErr == nil {
		t.Errorf("another client holds the lock; Err = %v, Context.Err = %v; want the loss", errNow, workErr)
	}
}

// TestAReleaseAfterTheLockRanOutReportsTheLoss: a Release of a lock whose
// deadline passed and that the server has let go of since returns the
// loss (ErrLost), as Release's doc says, not only that the name was not
// held: "had expired or was taken" hid why. So does one of a lock that
// was force-released after its deadline.
func TestAReleaseAfterTheLockRanOutReportsTheLoss(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, force := range []bool{false, true} {
		name := "ran-out-" + strconv.FormatBool(force)
		l, err := e.c.TryLock(ctx, name, dlock.WithTTL(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if force {
			// The server keeps it past the local deadline, for the force
			// release to find (else it may run out there first, under
			// load, and the force release find nothing).
			e.srv.Do(t, "PEXPIRE", "dlock:{"+name+"}", "60000")
		}
		<-l.Done()
		if force {
			if _, err := e.c.ForceRelease(ctx, name); err != nil {
				t.Fatal(err)
			}
		}
		for deadline := time.Now().Add(5 * time.Second); e.locked(t, "dlock:{"+name+"}"); {
			if time.Now().After(deadline) {
				t.Fatal("the server kept the lock 5s past its TTL")
			}
			time.Sleep(time.Millisecond)
		}
		err = l.Release(ctx)
		checkNotHeldAfterLoss(t, err)
		if force && !errors.Is(err, dlock.ErrForceReleased) {
			t.Errorf("Release after a force release: %v, want ErrForceReleased too", err)
		}
	}
}

// TestASecondReleaseOfALostLockReportsTheLoss: a Release called again
// after one that reported the loss says the loss again, not only that
// the lock "was already released".
func TestASecondReleaseOfALostLockReportsTheLoss(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "twice", dlock.WithTTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	checkNotHeldAfterLoss(t, l.Release(ctx))
	checkNotHeldAfterLoss(t, l.Release(ctx))
}

// TestAReleaseThatFindsTheLockGoneReportsTheLoss: a Release that finds
// the lock force-released, or gone (expired, taken), ends it as lost, as
// Err then says: its error matches ErrLost too, for every kind of hold, and
// a second Release says so again. It matched ErrNotHeld only. With one of
// two names gone, it says so.
func TestAReleaseThatFindsTheLockGoneReportsTheLoss(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, kind := range []string{"lock", "rw-write", "rw-read", "sem", "multi"} {
		for _, force := range []bool{true, false} {
			if !force && kind != "lock" && kind != "multi" {
				continue // a read/write lock's or a semaphore's holds are in keys of their own
			}
			name := fmt.Sprintf("gone-%s-%v", kind, force)
			var l *dlock.Lock
			var err error
			switch kind {
			case "lock":
				l, err = e.c.TryLock(ctx, name)
			case "rw-write":
				l, err = e.c.RWMutex(name).TryLock(ctx)
			case "rw-read":
				l, err = e.c.RWMutex(name).TryRLock(ctx)
			case "sem":
				l, err = e.c.Semaphore(name, 2).TryAcquire(ctx)
			case "multi":
				l, err = e.c.TryLockMulti(ctx, []string{"other-" + name, name})
			}
			if err != nil {
				t.Fatal(err)
			}
			if force {
				if _, err := e.c.ForceRelease(ctx, name); err != nil {
					t.Fatal(err)
				}
			} else {
				e.srv.Do(t, "DEL", "dlock:{"+name+"}") // expired there, say
			}
			for _, call := range []string{"Release", "Release again"} {
				err := l.Release(ctx)
				if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) || errors.Is(err, dlock.ErrForceReleased) != force {
					t.Errorf("%s, %s: %v; want ErrNotHeld and ErrLost (ErrForceReleased %v)", name, call, err, force)
				}
				if kind == "multi" && !strings.Contains(fmt.Sprint(err), "(1 of its 2 names gone)") {
					// It said both names had gone.
					t.Errorf("%s, %s: %v; want it to say that 1 of its 2 names had gone", name, call, err)
				}
			}
			if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
				t.Errorf("%s: Err = %v, want the loss", name, err)
			}
		}
	}
}

// TestAReleaseAnsweredDoneAfterAFailedOneReportsNoOldFailure: the first
// Release ran on the server but its reply was lost, and a refresh sent
// before it reached the server after it and found the lock gone (the lock
// is lost, with the failed Release among its causes): a second Release,
// which the server answers done (it knows its id), reports the loss but
// not the first's failure, for every kind of hold; and a third says what
// the second did.
func TestAReleaseAnsweredDoneAfterAFailedOneReportsNoOldFailure(t *testing.T) {
	for _, kind := range []string{"lock", "rw-write", "rw-read", "sem", "multi"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			var armed, loseRelease atomic.Bool
			loseRelease.Store(true)
			var once, relOnce sync.Once
			refreshHeld, letRefresh := make(chan struct{}), make(chan struct{})
			d := &hookDriver{Driver: e.newDriver(t)}
			d.before = func(calls []*dlock.Call) {
				if armed.Load() && strings.HasSuffix(calls[0].Script.Name, "refresh") {
					once.Do(func() { close(refreshHeld); <-letRefresh })
				}
			}
			d.after = func(calls []*dlock.Call) {
				if strings.HasSuffix(calls[0].Script.Name, "release") && loseRelease.Load() {
					for _, c := range calls {
						c.Val, c.Err = nil, context.DeadlineExceeded // ran, its reply lost
					}
					relOnce.Do(func() { close(letRefresh) }) // the refresh reaches the server after it
				}
			}
			c := dlock.New(d)
			defer c.Close()
			opts := []dlock.Option{dlock.WithTTL(time.Minute), dlock.WithRefreshInterval(20 * time.Millisecond)}
			var l *dlock.Lock
			var err error
			switch kind {
			case "lock":
				l, err = c.TryLock(ctx, "n", opts...)
			case "rw-write":
				l, err = c.RWMutex("n").TryLock(ctx, opts...)
			case "rw-read":
				l, err = c.RWMutex("n").TryRLock(ctx, opts...)
			case "sem":
				l, err = c.Semaphore("n", 2).TryAcquire(ctx, opts...)
			case "multi":
				l, err = c.TryLockMulti(ctx, []string{"n", "m", "{n}x"}, opts...)
			}
			if err != nil {
				t.Fatal(err)
			}
			armed.Store(true)
			<-refreshHeld
			_ = l.Release(ctx) // its reply lost
			waitDone(t, l, 5*time.Second)
			loseRelease.Store(false)
			again := l.Release(ctx)
			checkNotHeldAfterLoss(t, again)
			var se *dlock.ServerError
			if errors.As(again, &se) || errors.Is(again, context.DeadlineExceeded) {
				t.Errorf("a Release the server answered matches the earlier Release's failure: %v", again)
			}
			if third := l.Release(ctx); third.Error() != again.Error() || errors.As(third, &se) {
				t.Errorf("a third Release: %v, after %v", third, again)
			}
		})
	}
}

// TestASecondReleaseSaysWhatTheFirstFound: a lock force-released by an
// operator, then lost at its own deadline (its Err does not know of the
// force release): the first Release is answered force-released, and a
// second says so again, not only the loss.
func TestASecondReleaseSaysWhatTheFirstFound(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "force-then-twice", dlock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.newClient(t).ForceRelease(ctx, "force-then-twice"); err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	first, second := l.Release(ctx), l.Release(ctx)
	if !errors.Is(first, dlock.ErrForceReleased) || !errors.Is(second, dlock.ErrForceReleased) || !errors.Is(second, dlock.ErrLost) {
		t.Errorf("Releases of a lock force-released, then lost: %v, then %v; want both ErrForceReleased (and ErrLost)", first, second)
	}
}

// TestAReleaseAnsweredAfterAFailedOneReportsNoOldFailure: a Release the
// server answers (not held) of a lock that was lost while an earlier
// Release failed (its reply lost, as a refresh found the lock gone)
// reports the loss, but not the earlier Release's failure: it matched
// that *ServerError and context.DeadlineExceeded, as if this request had
// failed too.
func TestAReleaseAnsweredAfterAFailedOneReportsNoOldFailure(t *testing.T) {
	e := newEnv(t)
	l, _, answer := lostWhileReleasing(t, e, "failed-then-answered", context.DeadlineExceeded)
	answer()
	again := l.Release(context.Background())
	checkNotHeldAfterLoss(t, again)
	var se *dlock.ServerError
	if errors.As(again, &se) || errors.Is(again, context.DeadlineExceeded) {
		t.Errorf("a Release the server answered matches the earlier Release's failure: %v", again)
	}
}

// TestARefreshWithAnEndedContextSendsNothing: a Refresh called with a
// context that has ended sends nothing and leaves the deadline as it is.
// It cut the deadline to its TTL, as for a refresh whose outcome is
// unknown, and the lock, still held on the server, ended as lost.
func TestARefreshWithAnEndedContextSendsNothing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	drv := e.newDriver(t)
	c := dlock.New(drv)
	defer c.Close()
	l, err := c.TryLock(ctx, "ended-refresh", dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	deadline, trips := l.Deadline(), drv.trips.Load()
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.Refresh(ended, 5*time.Millisecond); !errors.Is(err, context.Canceled) {
		t.Errorf("Refresh: err = %v, want context.Canceled", err)
	}
	if got := drv.trips.Load() - trips; got != 0 {
		t.Errorf("Refresh with an ended context made %d round trips, want none", got)
	}
	if got := l.Deadline(); !got.Equal(deadline) {
		t.Errorf("Deadline moved by %v", got.Sub(deadline))
	}
	if err := l.Err(); err != nil {
		t.Errorf("Err = %v", err)
	}
}

// TestAnIntervalJustShortOfTheDeadlineLeavesTheRefreshTime: an interval
// that ends 78µs before the lock's deadline is valid, and the watchdog
// refreshes a tenth of the TTL before the deadline all the same, so the
// lock is not lost for want of time to answer.
func TestAnIntervalJustShortOfTheDeadlineLeavesTheRefreshTime(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	refreshes := make(chan error, 8)
	d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		if isRefresh(calls) {
			refreshes <- calls[0].Err
		}
	}}
	c := dlock.New(d)
	defer c.Close()
	ttl := 1012200 * time.Microsecond // less 1% and 2ms: 1000.078ms
	l, err := c.TryLock(ctx, "just-short", dlock.WithTTL(ttl), dlock.WithRefreshInterval(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	for i := 0; i < 2; i++ {
		select {
		case err := <-refreshes:
			if err != nil {
				t.Fatalf("refresh %d: %v", i+1, err)
			}
		case <-l.Done():
			t.Fatalf("lost before refresh %d: %v", i+1, l.Err())
		}
	}
	if err := l.Err(); err != nil {
		t.Errorf("after two refreshes: %v", err)
	}
}

// isRefresh reports whether calls are a refresh of an exclusive lock.
func isRefresh(calls []*dlock.Call) bool { return calls[0].Script.Name == "refresh" }

// TestAutoRefreshAgainWhileRefreshed changes the refresh interval of a lock
// the watchdog refreshes every few milliseconds, over and over: under -race,
// the watchdog's reads of the interval must not race with the changes.
func TestAutoRefreshAgainWhileRefreshed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	refreshed := make(chan struct{}, 1)
	d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		if isRefresh(calls) {
			select {
			case refreshed <- struct{}{}:
			default:
			}
		}
	}}
	c := dlock.New(d)
	defer c.Close()
	l, err := c.TryLock(ctx, "again", dlock.WithTTL(time.Second), dlock.WithRefreshInterval(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := l.AutoRefresh(dlock.WithRefreshInterval(time.Duration(4+i%3) * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-refreshed:
		case <-l.Done():
			t.Fatalf("lost: %v", l.Err())
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRefreshesOfOneLockGoOneAtATime: a Refresh(10s) runs on the server but
// its reply is held back; a Refresh(500ms) of the same lock is sent
// meanwhile. Had the second run on the server before the first's reply came
// back, the first's late reply would set the deadline 10s out while the
// server keeps the lock for 500ms. The second waits for the first instead,
// so the deadline follows the refresh the server ran last.
func TestRefreshesOfOneLockGoOneAtATime(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	executed := make(chan struct{})    // the long refresh ran on the server
	letReply := make(chan struct{})    // its reply may come back
	shortRan := make(chan struct{}, 1) // the short refresh ran on the server
	d := &hookDriver{Driver: e.newDriver(t)}
	d.after = func(calls []*dlock.Call) {
		if !isRefresh(calls) {
			return
		}
		switch calls[0].Args[2] {
		case int64(10000):
			close(executed)
			<-letReply
		case int64(500):
			shortRan <- struct{}{}
		}
	}
	c := dlock.New(d)
	defer c.Close()
	l, err := c.TryLock(ctx, "reordered", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	long := make(chan error, 1)
	go func() { long <- l.Refresh(ctx, 10*time.Second) }()
	<-executed
	short := make(chan error, 1)
	go func() { short <- l.Refresh(ctx, 500*time.Millisecond) }()
	// Before the long refresh's reply comes back, the short one either runs
	// on the server or waits for the long one.
	ran := false
	awaitCond(t, 5*time.Second, func() bool {
		select {
		case <-shortRan:
			ran = true
		default:
		}
		return ran || dlock.RefreshWaiting(l)
	})
	close(letReply)
	if err := <-long; err != nil {
		t.Fatal(err)
	}
	if err := <-short; err != nil {
		t.Fatal(err)
	}
	pttl, err := strconv.Atoi(e.srv.Do(t, "PTTL", "dlock:{reordered}"))
	expiry := time.Now().Add(time.Duration(pttl+1) * time.Millisecond) // at the latest
	if err != nil || pttl < 0 {
		t.Fatalf("PTTL = %d, %v: the lock is gone", pttl, err)
	}
	if dl := l.Deadline(); dl.After(expiry) {
		t.Errorf("Deadline is %v past the server's expiry", dl.Sub(expiry))
	}
}

// A refresh to a short TTL whose reply was lost, and which reaches Redis
// after a later refresh to a long one has run, does not cut the later one
// short: the lock's holder counts on the long one, and another would take
// the name while it still held it, untold.
func TestALateRefreshDoesNotCutALaterOneShort(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, tc := range []struct {
		kind, script string
		take         func(c *dlock.Client, name string) (*dlock.Lock, error)
	}{
		{"lock", "refresh", func(c *dlock.Client, name string) (*dlock.Lock, error) {
			return c.TryLock(ctx, name, dlock.WithTTL(5*time.Second))
		}},
		{"lock on two names", "refresh", func(c *dlock.Client, name string) (*dlock.Lock, error) {
			return c.TryLockMulti(ctx, []string{name, name + ":2"}, dlock.WithTTL(5*time.Second))
		}},
		{"write hold", "holds_refresh", func(c *dlock.Client, name string) (*dlock.Lock, error) {
			return c.RWMutex(name).TryLock(ctx, dlock.WithTTL(5*time.Second))
		}},
		{"read hold", "holds_refresh", func(c *dlock.Client, name string) (*dlock.Lock, error) {
			return c.RWMutex(name).TryRLock(ctx, dlock.WithTTL(5*time.Second))
		}},
		{"permit", "holds_refresh", func(c *dlock.Client, name string) (*dlock.Lock, error) {
			return c.Semaphore(name, 1).TryAcquire(ctx, dlock.WithTTL(5*time.Second))
		}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			name := "late-refresh-" + strings.ReplaceAll(tc.kind, " ", "-")
			d := &copyingDriver{Driver: e.newDriver(t)}
			c := dlock.New(d)
			defer c.Close()
			l, err := tc.take(c, name)
			if err != nil {
				t.Fatal(err)
			}
			d.holdBackScript(tc.script)
			if err := l.Refresh(ctx, 200*time.Millisecond); !errors.Is(err, errLostReply) {
				t.Fatalf("the held-back refresh: %v", err)
			}
			if err := l.Refresh(ctx, time.Minute); err != nil {
				t.Fatal(err)
			}
			d.sendCopies(t) // the first refresh reaches Redis now
			if left, err := l.TTL(ctx); err != nil || left < 50*time.Second {
				t.Errorf("TTL after the late refresh = %v, %v; want the later refresh's minute", left, err)
			}
			// Refreshes that come after go on as before: a shorter TTL
			// shortens the lock again.
			if err := l.Refresh(ctx, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			if left, err := l.TTL(ctx); err != nil || left > 10*time.Second {
				t.Errorf("TTL after a shorter refresh = %v, %v; want at most 10s", left, err)
			}
			// The release takes the record of the fence away with the hold.
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if fields := e.srv.Do(t, "HKEYS", "dlock:{"+name+"}"); strings.Contains(fields, "q:") {
				t.Errorf("the released lock's hash keeps the fence's record: %s", fields)
			}
		})
	}
}

// The same when the refresh that got no answer was the watchdog's.
func TestALateRefreshOfTheWatchdogDoesNotCutALaterOneShort(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &copyingDriver{Driver: e.newDriver(t)}
	c := dlock.New(d)
	defer c.Close()
	l, err := c.TryLock(ctx, "late-auto-refresh", dlock.WithTTL(3*time.Second),
		dlock.WithAutoRefresh(), dlock.WithRefreshInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	d.holdBackScript("refresh")
	awaitCond(t, 5*time.Second, d.heldBack)
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	d.sendCopies(t) // the watchdog's refresh, to 3s, reaches Redis now
	if left, err := l.TTL(ctx); err != nil || left < 50*time.Second {
		t.Errorf("TTL after the watchdog's late refresh = %v, %v; want the later refresh's minute", left, err)
	}
}

// A hold counted by two acquisitions of one owner (a permit, a read hold
// re-entered WithOwner) keeps one fence record ('q' in its JSON): the
// second acquisition's fencing refresh overwrites the first's, and once
// the second is released (count back to 1, no longer extend-only), the
// first's late refresh to a short TTL cuts its later minute short.
func TestALateRefreshOfAReenteredHoldDoesNotCutItShort(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, tc := range []struct {
		kind string
		take func(c *dlock.Client, name string) (*dlock.Lock, error)
	}{
		{"permit", func(c *dlock.Client, name string) (*dlock.Lock, error) {
			return c.Semaphore(name, 1).TryAcquire(ctx, dlock.WithOwner("o"), dlock.WithTTL(5*time.Second))
		}},
		{"read hold", func(c *dlock.Client, name string) (*dlock.Lock, error) {
			return c.RWMutex(name).TryRLock(ctx, dlock.WithOwner("o"), dlock.WithTTL(5*time.Second))
		}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			name := "late-reentered-" + strings.ReplaceAll(tc.kind, " ", "-")
			d := &copyingDriver{Driver: e.newDriver(t)}
			c := dlock.New(d)
			defer c.Close()
			a, err := tc.take(c, name)
			if err != nil {
				t.Fatal(err)
			}
			b, err := tc.take(c, name)
			if err != nil {
				t.Fatal(err)
			}
			// a's refresh to a short TTL gets no answer; it is held back.
			d.holdBackScript("holds_refresh")
			if err := a.Refresh(ctx, 200*time.Millisecond); !errors.Is(err, errLostReply) {
				t.Fatalf("a's held-back refresh: %v", err)
			}
			late := d.takeCopies()
			if err := a.Refresh(ctx, time.Minute); err != nil { // fences: "a:2"
				t.Fatal(err)
			}
			// b has a refresh lost too (never delivered); its next fences,
			// and overwrites a's record.
			d.holdBackScript("holds_refresh")
			if err := b.Refresh(ctx, time.Minute); !errors.Is(err, errLostReply) {
				t.Fatalf("b's held-back refresh: %v", err)
			}
			d.takeCopies() // never delivered
			if err := b.Refresh(ctx, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := b.Release(ctx); err != nil {
				t.Fatal(err)
			}
			d.putCopies(late)
			d.sendCopies(t) // a's first refresh reaches Redis now
			if left, err := a.TTL(ctx); err != nil || left < 50*time.Second {
				t.Errorf("a's TTL after its late refresh = %v, %v; want the minute its Deadline counts on (%v left)",
					left, err, time.Until(a.Deadline()).Round(time.Second))
			}
			_ = a.Release(ctx)
		})
	}
}

// On a full server (maxmemory, by EVALSHA), a fencing refresh of an
// exclusive lock held more than once (WithOwner) or shared (attached) that
// only extends finds nothing to extend: its HSET of 'q:' is the script's
// first write, and Redis refuses it (OOM). Before the change the refresh
// succeeded there; now it fails, and goes on failing, fencing, until the
// lock runs out.
func TestAFencingRefreshOfASharedLockRunsOnAFullServer(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &copyingDriver{Driver: e.newDriver(t)}
	c := dlock.New(d)
	defer c.Close()
	const name = "full-fence"
	outer, err := c.TryLock(ctx, name, dlock.WithOwner("o"), dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	inner, err := c.TryLock(ctx, name, dlock.WithOwner("o"), dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	d.holdBackScript("refresh")
	if err := outer.Refresh(ctx, time.Minute); !errors.Is(err, errLostReply) {
		t.Fatalf("held-back refresh: %v", err)
	}
	d.takeCopies() // never delivered
	e.srv.Do(t, "CONFIG", "SET", "maxmemory", "1")
	defer e.srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
	if err := outer.Refresh(ctx, 30*time.Second); err != nil {
		t.Errorf("fencing Refresh of a re-entered lock at maxmemory: %v", err)
	}
	e.srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
	_ = inner.Release(ctx)
	_ = outer.Release(ctx)
}

// The record of a fence ('q:' .. req) stays in the hash when the Lock
// that fenced is not the one whose Release ends the acquisition: a lock
// handed over (Attach) and released by the other process. The free hash
// is reused by the next holder, and so on for as long as the name stays
// hot: one stale field per such hand-over, never taken away.
func TestAFenceRecordDoesNotOutliveAHandedOverLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &copyingDriver{Driver: e.newDriver(t)}
	c := dlock.New(d)
	defer c.Close()
	const name = "handover"
	key := "dlock:{" + name + "}"
	a, err := c.TryLock(ctx, name, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	d.holdBackScript("refresh")
	if err := a.Refresh(ctx, time.Minute); !errors.Is(err, errLostReply) {
		t.Fatalf("held-back refresh: %v", err)
	}
	d.takeCopies() // never delivered
	// This one fences.
	if err := a.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	// Handed over: another process attaches and releases.
	b, err := e.c.Attach(ctx, name, a.Token())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := e.c.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if fields := e.srv.Do(t, "HKEYS", key); strings.Contains(fields, "q:") {
		t.Errorf("the next holder's hash keeps the released acquisition's fence record: %s", fields)
	}
}

// A copy of a refresh that the client library sent again (go-redis's
// MaxRetries, 3 by default, after a read timeout or a broken connection),
// whose second copy answered, while the first, held up on the connection
// given up on, reaches Redis later: dlock saw an answer, and did not know a
// copy was out. A later refresh to a longer TTL fences it off all the same.
func TestALateLibraryCopyOfARefreshDoesNotCutALaterOneShort(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &copyingDriver{Driver: e.newDriver(t)}
	c := dlock.New(d)
	defer c.Close()
	l, err := c.TryLock(ctx, "library-copy", dlock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	d.copyScript("refresh")
	if err := l.Refresh(ctx, 200*time.Millisecond); err != nil { // answered: its copy is out
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	d.sendCopies(t) // the first copy reaches Redis now
	if left, err := l.TTL(ctx); err != nil || left < 50*time.Second {
		t.Errorf("TTL after a late copy of an earlier refresh = %v, %v; want the later refresh's minute (Deadline in %v)",
			left, err, time.Until(l.Deadline()).Round(time.Second))
	}
}

// TestRefreshShorterThanTheRefreshIntervalIsRefused: the watchdog would come
// back only after such a TTL had run out, so an auto-refreshed lock refuses
// it (as WithRefreshInterval refuses an interval not shorter than the TTL);
// a lock without auto-refresh takes it, and then refuses an AutoRefresh
// whose interval it does not fit.
func TestRefreshShorterThanTheRefreshIntervalIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "auto", dlock.WithTTL(time.Second), dlock.WithRefreshInterval(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for _, ttl := range []time.Duration{200 * time.Millisecond, 300 * time.Millisecond} {
		if err := l.Refresh(ctx, ttl); !errors.Is(err, dlock.ErrInvalidTTL) {
			t.Errorf("Refresh(%v) with a 300ms interval: err = %v, want ErrInvalidTTL", ttl, err)
		}
	}
	if err := l.Refresh(ctx, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	manual, err := e.c.TryLock(ctx, "manual", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := manual.Refresh(ctx, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := manual.AutoRefresh(dlock.WithRefreshInterval(300 * time.Millisecond)); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("AutoRefresh with an interval above the TTL: err = %v, want ErrInvalidOption", err)
	}
}

// TestARefreshThatMeetsTheReleaseDoesNotReportALoss: a refresh (by the
// watchdog, or by Refresh) is held back until Release has run on the server;
// it then finds the lock gone. Release succeeded all the same, so the lock
// was released, not lost: Err stays nil.
func TestARefreshThatMeetsTheReleaseDoesNotReportALoss(t *testing.T) {
	for _, by := range []string{"watchdog", "Refresh"} {
		t.Run(by, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			var held sync.Once
			refreshHeld, letRefresh := make(chan struct{}), make(chan struct{})
			releaseRan, letRelease := make(chan struct{}), make(chan struct{})
			d := &hookDriver{Driver: e.newDriver(t)}
			d.before = func(calls []*dlock.Call) {
				if isRefresh(calls) {
					held.Do(func() {
						close(refreshHeld)
						<-letRefresh
					})
				}
			}
			d.after = func(calls []*dlock.Call) {
				if calls[0].Script.Name == "release" {
					close(releaseRan)
					<-letRelease
				}
			}
			c := dlock.New(d)
			defer c.Close()
			opts := []dlock.Option{dlock.WithTTL(time.Second)}
			if by == "watchdog" {
				opts = append(opts, dlock.WithRefreshInterval(20*time.Millisecond))
			}
			l, err := c.TryLock(ctx, "released", opts...)
			if err != nil {
				t.Fatal(err)
			}
			refreshed := make(chan error, 1)
			if by == "Refresh" {
				go func() { refreshed <- l.Refresh(ctx, time.Second) }()
			}
			<-refreshHeld
			released := make(chan error, 1)
			go func() { released <- l.Release(ctx) }()
			<-releaseRan
			close(letRefresh) // the refresh reaches the server after the release
			if by == "Refresh" {
				if err := <-refreshed; !errors.Is(err, dlock.ErrNotHeld) {
					t.Errorf("Refresh = %v, want ErrNotHeld", err)
				}
			} else {
				dlock.SettleWatchdog(c) // the watchdog has read the refresh's reply
			}
			close(letRelease)
			if err := <-released; err != nil {
				t.Fatalf("Release = %v", err)
			}
			waitDone(t, l, time.Second)
			if err := l.Err(); err != nil {
				t.Errorf("Err after a successful Release = %v, want nil", err)
			}
		})
	}
}

// TestAutoRefreshOfAnAttachedLockWithLittleLeft: the lock is attached with
// 500ms of its 3s TTL left. Its first refresh must come before those 500ms
// run out, not one interval (1s) after the attach.
func TestAutoRefreshOfAnAttachedLockWithLittleLeft(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "handed", dlock.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "PEXPIRE", "dlock:{handed}", "500") // as if 2.5s had passed
	refreshed := make(chan struct{}, 1)
	d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		if isRefresh(calls) && calls[0].Err == nil && calls[0].Val == int64(0) {
			select {
			case refreshed <- struct{}{}:
			default:
			}
		}
	}}
	c := dlock.New(d)
	defer c.Close()
	heir, err := c.Attach(ctx, "handed", l.Token(), dlock.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := heir.AutoRefresh(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-refreshed:
	case <-heir.Done():
		t.Fatalf("lost before its first refresh: %v", heir.Err())
	}
	dlock.SettleWatchdog(c) // the watchdog has read the refresh's reply
	if err := heir.Err(); err != nil {
		t.Fatalf("Err = %v", err)
	}
	if left := time.Until(heir.Deadline()); left < 2*time.Second {
		t.Errorf("the refresh left the deadline %v away, want about 3s", left)
	}
}

// TestDoReleasesWhenTheFunctionPanics: the panic goes on to the caller, and
// the lock is released on its way, not left held and refreshed for good by a
// caller that recovers it.
func TestDoReleasesWhenTheFunctionPanics(t *testing.T) {
	e := newEnv(t)
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the function's panic", p)
			}
		}()
		_ = e.c.Do(context.Background(), "panicky", func(context.Context) error { panic("boom") },
			dlock.WithTTL(time.Second), dlock.WithRefreshInterval(20*time.Millisecond))
	}()
	if e.locked(t, "dlock:{panicky}") {
		t.Error("the lock is still held after the function panicked")
	}
}

func TestARefreshWhoseDeadlineComesBeforeTheNextAutoRefreshIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "soon", dlock.WithTTL(time.Second), dlock.WithRefreshInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	// 51ms less 2.51ms for clock drift ends before the next refresh.
	if err := l.Refresh(ctx, 51*time.Millisecond); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Errorf("Refresh(51ms) of a lock refreshed every 50ms: err = %v, want ErrInvalidTTL", err)
	}
	if err := l.Refresh(ctx, 60*time.Millisecond); err != nil {
		t.Errorf("Refresh(60ms): %v", err)
	}
}

// TestDoReportsALossItsReleaseFinds loses the lock while the function runs,
// to another holder, before any refresh can notice: the release that ends
// Do finds it, and Do's error says the lock was lost.
func TestDoReportsALossItsReleaseFinds(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	other := e.newClient(t)
	err := e.c.Do(ctx, "lostjob", func(ctx context.Context) error {
		e.srv.Do(t, "DEL", "dlock:{lostjob}")
		l, err := other.TryLock(ctx, "lostjob")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Release(context.Background()) })
		return nil
	}, dlock.WithTTL(time.Minute))
	if !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Do = %v, want the loss (ErrLost)", err)
	}
}

// TestATTLThatFindsTheLockGoneEndsIt: TTL learns that the lock is held by
// another; the holder's Done closes then, as after a refresh that finds it.
func TestATTLThatFindsTheLockGoneEndsIt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "ttlgone", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "DEL", "dlock:{ttlgone}")
	o, err := e.newClient(t).TryLock(ctx, "ttlgone")
	if err != nil {
		t.Fatal(err)
	}
	defer o.Release(ctx)
	if _, err := l.TTL(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("TTL = %v, want ErrNotHeld", err)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("TTL found the lock held by another, and Done is still open")
	}
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost", l.Err())
	}
}

// TestTheContextOfALockPastItsDeadlineIsDone asks for the Context of a lock
// whose deadline has passed, before any timer has run (nothing watched
// it): the context is done at once, as Done is closed; so is the context
// of Background made before the deadline, which Context returns again (a
// holder back from a pause past the deadline, before the deadline timer
// ran).
func TestTheContextOfALockPastItsDeadlineIsDone(t *testing.T) {
	for _, before := range []bool{false, true} {
		t.Run(fmt.Sprintf("made before %v", before), func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			l, err := e.c.TryLock(ctx, "pastdeadline", dlock.WithTTL(50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			if before {
				_ = l.Context(ctx)
				dlock.HoldDeadlineTimer(l)
			}
			time.Sleep(time.Until(l.Deadline()) + time.Millisecond)
			lctx := l.Context(ctx)
			if lctx.Err() == nil {
				t.Fatal("the Context of a lock past its deadline is not done")
			}
			if !errors.Is(context.Cause(lctx), dlock.ErrLost) {
				t.Errorf("Cause = %v, want ErrLost", context.Cause(lctx))
			}
		})
	}
}

// TestALockKeepsOneContextOfBackground: Context called again and again
// from context.Background() or context.TODO() returns one context, which
// the lock keeps once, and which ends with the lock; a context made from a
// parent that ends is forgotten when the parent ends.
func TestALockKeepsOneContextOfBackground(t *testing.T) {
	e := newEnv(t)
	l, err := e.c.TryLock(context.Background(), "onecontext")
	if err != nil {
		t.Fatal(err)
	}
	first := l.Context(context.Background())
	for range 1000 {
		if l.Context(context.Background()) != first || l.Context(context.TODO()) != first {
			t.Fatal("Context(Background) made another context")
		}
	}
	if n := dlock.ContextsKept(l); n != 1 {
		t.Errorf("the lock keeps %d contexts, want 1", n)
	}
	if dlock.LockFromContext(first) != l {
		t.Error("the context does not carry its Lock")
	}

	parent, cancel := context.WithCancel(context.Background())
	child := l.Context(parent)
	if n := dlock.ContextsKept(l); n != 2 {
		t.Errorf("with a child of a parent that ends, the lock keeps %d contexts, want 2", n)
	}
	cancel()
	<-child.Done()
	// AfterFunc forgets it on a goroutine of its own, after Done: no signal
	// tells when.
	for end := time.Now().Add(10 * time.Second); dlock.ContextsKept(l) != 1; runtime.Gosched() {
		if time.Now().After(end) {
			t.Fatalf("the lock keeps %d contexts 10s after the parent of one ended, want 1", dlock.ContextsKept(l))
		}
	}

	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.Done():
	default:
		t.Fatal("the context of Background did not end with the lock")
	}
	if !errors.Is(context.Cause(first), context.Canceled) {
		t.Errorf("Cause = %v, want context.Canceled after a release", context.Cause(first))
	}
	if got := l.Context(context.Background()); got.Err() == nil {
		t.Error("Context(Background) of a released lock is not done")
	}
}

// TestAFailedReleaseAfterARefreshFoundTheLockGoneEndsIt: the lock is taken
// by another while a refresh is under way; Release is called, the refresh
// then finds the lock not held, and the release's reply is lost. The lock
// is not the holder's either way, so Done closes at once, not at the
// deadline a minute later.
func TestAFailedReleaseAfterARefreshFoundTheLockGoneEndsIt(t *testing.T) {
	e := newEnv(t)
	l, released, _ := lostWhileReleasing(t, e, "gonewhilereleased", errors.New("i/o timeout"))
	if released == nil {
		t.Fatal("Release succeeded although its reply was lost")
	}
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost", l.Err())
	}
}

// lostWhileReleasing has a client of its own take name, then another take
// it from under it while its next refresh is held back; the first's
// Release is called, and once it is sent the refresh goes on and finds the
// lock not held, while the release's reply is lost (as lostReply), until
// answer is called. It returns the Lock, ended, and that Release's error.
func lostWhileReleasing(t *testing.T, e *env, name string, lostReply error) (l *dlock.Lock, released error, answer func()) {
	t.Helper()
	ctx := context.Background()
	var armed, lose atomic.Bool
	lose.Store(true)
	var once, relOnce sync.Once
	refreshHeld, letRefresh, releasing := make(chan struct{}), make(chan struct{}), make(chan struct{})
	d := &hookDriver{Driver: e.newDriver(t)}
	d.before = func(calls []*dlock.Call) {
		switch {
		case !armed.Load():
		case isRefresh(calls):
			once.Do(func() { close(refreshHeld); <-letRefresh })
		case calls[0].Script.Name == "release":
			relOnce.Do(func() { close(releasing) }) // sent twice: its reply is lost
		}
	}
	d.after = func(calls []*dlock.Call) {
		if calls[0].Script.Name == "release" && lose.Load() {
			for _, c := range calls {
				c.Val, c.Err = nil, lostReply // the reply is lost
			}
		}
	}
	c := dlock.New(d)
	t.Cleanup(func() { _ = c.Close() })
	l, err := c.TryLock(ctx, name, dlock.WithTTL(time.Minute), dlock.WithRefreshInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// Armed first: the next refresh is held back whether it comes before
	// or after the lock is taken away, so none finds it gone unheld.
	armed.Store(true)
	e.srv.Do(t, "DEL", "dlock:{"+name+"}")
	other, err := e.newClient(t).TryLock(ctx, name, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Release(ctx) })
	select {
	case <-refreshHeld:
	case <-time.After(10 * time.Second):
		t.Fatal("no refresh within 10s")
	}
	relErr := make(chan error, 1)
	go func() { relErr <- l.Release(ctx) }()
	<-releasing
	close(letRefresh)
	released = <-relErr
	waitDone(t, l, 5*time.Second)
	return l, released, func() { lose.Store(false) }
}

// TestAnEndedLockLeavesTheWatchdog: locks refreshed automatically leave the
// watchdog when they end, not at their next refresh, which may be long
// after (and which would keep each Lock until then).
func TestAnEndedLockLeavesTheWatchdog(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for i := range 20 {
		if err := e.c.Do(ctx, "leaves"+strconv.Itoa(i), func(context.Context) error { return nil }, dlock.WithTTL(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	l, err := e.c.TryLock(ctx, "leaves", dlock.WithTTL(time.Hour), dlock.WithAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	if n := dlock.WatchedLeases(e.c); n != 1 {
		t.Errorf("the watchdog has %d leases with one lock held, want 1", n)
	}
	e.srv.Do(t, "DEL", "dlock:{leaves}")
	if _, err := l.TTL(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("TTL = %v, want ErrNotHeld", err)
	}
	if n := dlock.WatchedLeases(e.c); n != 0 {
		t.Errorf("the watchdog has %d leases after every lock ended, want 0", n)
	}
}

// nextRefresh returns when c's watchdog refreshes l next, failing the test
// when l is not in its heap.
func nextRefresh(t *testing.T, c *dlock.Client, l *dlock.Lock) time.Time {
	t.Helper()
	next, ok := dlock.NextRefresh(c, l)
	if !ok {
		t.Fatal("the lock is not in the watchdog's heap")
	}
	return next
}

// refreshMargin is how long before a deadline the watchdog refreshes a
// lock whose TTL barely outlasts its interval: a tenth of the TTL less the
// drift allowance (1% and 2ms).
func refreshMargin(ttl time.Duration) time.Duration {
	return (ttl - ttl/100 - 2*time.Millisecond) / 10
}

// A Refresh to a TTL that barely outlasts the refresh interval brings the
// watchdog's next refresh forward, to a tenth of the TTL before the new
// deadline: it stayed one interval after the lock was obtained, too close
// to that deadline for a refresh to be answered on a slow network, and the
// lock was reported lost while the server held it.
func TestARefreshToAShorterTTLBringsTheNextAutoRefreshForward(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "sooner", dlock.WithTTL(6*time.Second), dlock.WithRefreshInterval(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	const short = 2050 * time.Millisecond
	if err := l.Refresh(ctx, short); err != nil {
		t.Fatal(err)
	}
	if next, want := nextRefresh(t, e.c, l), l.Deadline().Add(-refreshMargin(short)); next.After(want.Add(time.Millisecond)) {
		t.Errorf("next refresh %v before the deadline, want %v or more", l.Deadline().Sub(next), refreshMargin(short))
	}
}

// The same when the Refresh ends while the watchdog's own refresh of the
// lock is out of its schedule (its Refresh hook runs): the watchdog puts
// the lock back by the new deadline, not by the one its refresh set.
func TestARefreshDuringTheWatchdogsRefreshHookBringsTheNextForward(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	inHook, leave := make(chan struct{}), make(chan struct{})
	var hooked atomic.Int32
	c := dlock.New(e.newDriver(t), dlock.WithHooks(dlock.Hooks{Refresh: func(context.Context, dlock.HookInfo, error) {
		if hooked.Add(1) == 1 { // the watchdog's: the first refresh
			close(inHook)
			<-leave
		}
	}}))
	defer c.Close()
	l, err := c.TryLock(ctx, "hooked", dlock.WithTTL(600*time.Millisecond), dlock.WithRefreshInterval(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	<-inHook
	const short = 206 * time.Millisecond // its deadline 1.94ms after the interval
	if err := l.Refresh(ctx, short); err != nil {
		t.Fatal(err)
	}
	close(leave)
	awaitCond(t, 5*time.Second, func() bool { _, ok := dlock.NextRefresh(c, l); return ok })
	next, _ := dlock.NextRefresh(c, l)
	if want := l.Deadline().Add(-refreshMargin(short)); next.After(want.Add(time.Millisecond)) {
		t.Errorf("next refresh %v before the deadline, want %v or more", l.Deadline().Sub(next), refreshMargin(short))
	}
}

// AutoRefresh with a shorter interval on a lock the watchdog refreshes
// brings its next refresh forward: it came one old interval after the
// lock was obtained, so a lock deleted meanwhile was noticed that late.
func TestAutoRefreshWithAShorterIntervalBringsTheNextRefreshForward(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "shorter-interval", dlock.WithTTL(30*time.Second), dlock.WithAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if err := l.AutoRefresh(dlock.WithRefreshInterval(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if next := nextRefresh(t, e.c, l); time.Until(next) > 100*time.Millisecond {
		t.Errorf("next refresh in %v after AutoRefresh with a 100ms interval", time.Until(next))
	}
}

// A Refresh whose reply comes after the lock's deadline has passed (the
// holder was told the lock was lost) reports that, matching ErrNotHeld and
// ErrLost: it returned nil, with Done closed and Deadline in the past.
func TestARefreshAnsweredAfterTheDeadlineReportsTheLoss(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var done <-chan struct{}
	d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		if isRefresh(calls) {
			<-done // the reply comes once the deadline has ended the lock
		}
	}}
	c := dlock.New(d)
	defer c.Close()
	l, err := c.TryLock(ctx, "answered-late", dlock.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	done = l.Done()
	err = l.Refresh(ctx, 10*time.Second)
	if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Refresh answered after the deadline: err = %v, want ErrNotHeld and ErrLost", err)
	}
	// The server ran it: Release frees the name all the same, and reports
	// the loss.
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Release after the late refresh: err = %v, want the loss", err)
	}
	if e.locked(t, "dlock:{answered-late}") {
		t.Error("the name is still held after Release")
	}
}
