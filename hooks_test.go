package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/redis/go-redis/v9"
)

// hookLog records every hook call as a line, with the context each got.
type hookLog struct {
	mu    sync.Mutex
	lines []string
	res   []dlock.AcquireResult
	held  []time.Duration
	ctxOK []bool // the context a hook got carries the start hook's value
}

type hookKey struct{}

func (r *hookLog) add(ctx context.Context, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
	if ctx != nil {
		r.ctxOK = append(r.ctxOK, ctx.Value(hookKey{}) != nil)
	}
}

func (r *hookLog) hooks() dlock.Hooks {
	return dlock.Hooks{
		AcquireStart: func(ctx context.Context, h dlock.HookInfo) context.Context {
			r.add(nil, "acquire %s %v wait=%v", h.Mode, h.Names, h.Wait)
			return context.WithValue(ctx, hookKey{}, "acquire")
		},
		Retry: func(ctx context.Context, h dlock.HookInfo, failed int, err error) {
			r.add(ctx, "retry %v %d notObtained=%v", h.Names, failed, errors.Is(err, dlock.ErrNotObtained))
		},
		AcquireDone: func(ctx context.Context, h dlock.HookInfo, res dlock.AcquireResult) {
			r.add(ctx, "acquired %v %s", h.Names, res.Outcome)
			r.mu.Lock()
			r.res = append(r.res, res)
			r.mu.Unlock()
		},
		Refresh: func(ctx context.Context, h dlock.HookInfo, err error) {
			r.add(nil, "refresh %v ok=%v", h.Names, err == nil)
		},
		ReleaseStart: func(ctx context.Context, h dlock.HookInfo) context.Context {
			r.add(nil, "release %s %v", h.Mode, h.Names)
			return context.WithValue(ctx, hookKey{}, "release")
		},
		ReleaseDone: func(ctx context.Context, h dlock.HookInfo, held time.Duration, err error) {
			r.add(ctx, "released %v ok=%v", h.Names, err == nil)
			r.mu.Lock()
			r.held = append(r.held, held)
			r.mu.Unlock()
		},
		End: func(h dlock.HookInfo, held time.Duration, err error) {
			if err == nil {
				r.add(nil, "end %v released", h.Names)
				return
			}
			r.add(nil, "end %v lost=%v", h.Names, errors.Is(err, dlock.ErrLost))
		},
	}
}

func (r *hookLog) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.lines
	r.lines = nil
	return out
}

func wantLines(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("hook calls:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestHooksFollowAnAcquisitionAndItsLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rec := &hookLog{}
	c := e.newClient(t, dlock.WithHooks(rec.hooks()))

	l, err := c.TryLock(ctx, "hooked", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // a measurable hold time
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Release: %v", err)
	}
	wantLines(t, rec.take(),
		"acquire exclusive [hooked] wait=false",
		"acquired [hooked] obtained",
		"refresh [hooked] ok=true",
		"release exclusive [hooked]",
		"end [hooked] released",
		"released [hooked] ok=true",
		"release exclusive [hooked]",
		"released [hooked] ok=false",
	)
	r := rec.res[0]
	if r.Attempts != 1 || r.Err != nil || r.Fence != l.Fence() || r.Fence == 0 || r.Wait <= 0 {
		t.Errorf("AcquireResult = %+v, fence %d", r, l.Fence())
	}
	if rec.held[0] < 5*time.Millisecond {
		t.Errorf("held = %v, want at least 5ms", rec.held[0])
	}
	for i, ok := range rec.ctxOK {
		if !ok {
			t.Errorf("hook call %d did not get the start hook's context", i)
		}
	}

	// Refused at once: not obtained, one attempt.
	other, err := e.c.TryLock(ctx, "hooked")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release(ctx)
	if _, err := c.TryLock(ctx, "hooked"); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatal(err)
	}
	wantLines(t, rec.take(), "acquire exclusive [hooked] wait=false", "acquired [hooked] not_obtained")
	if r := rec.res[1]; r.Attempts != 1 || !errors.Is(r.Err, dlock.ErrNotObtained) || r.Fence != 0 {
		t.Errorf("refused AcquireResult = %+v", r)
	}
}

func TestHooksReportRetriesAndTheWait(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rec := &hookLog{}
	c := e.newClient(t, dlock.WithHooks(rec.hooks()))

	const ttl = 500 * time.Millisecond
	taken := time.Now()
	holder, err := e.c.TryLock(ctx, "waited", dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	_ = holder // left to expire: the waiter takes over at its expiry
	called := time.Now()
	l, err := c.Lock(ctx, "waited")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	lines := rec.take()
	if len(lines) < 3 || lines[0] != "acquire exclusive [waited] wait=true" ||
		lines[1] != "retry [waited] 1 notObtained=true" || lines[len(lines)-1] != "acquired [waited] obtained" {
		t.Errorf("hook calls: %q", lines)
	}
	r := rec.res[0]
	if r.Attempts != len(lines)-1 || r.Attempts < 2 {
		t.Errorf("Attempts = %d, want one more than the %d retries", r.Attempts, len(lines)-2)
	}
	// The holder's lock expired no sooner than its TTL after it was asked
	// for (the clock's granularity aside).
	if left := ttl - called.Sub(taken); r.Wait < left-5*time.Millisecond {
		t.Errorf("Wait = %v, want at least the holder's remaining %v", r.Wait, left)
	}

	// Given up after its first refusal: not obtained.
	wctx, giveUp, cancel := untilRefused(ctx)
	defer cancel()
	if _, err := c.Lock(wctx, "waited", giveUp); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatal(err)
	}
	lines = rec.take()
	if lines[len(lines)-1] != "acquired [waited] not_obtained" {
		t.Errorf("hook calls: %q", lines)
	}
}

func TestHooksReportALossOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rec := &hookLog{}
	c := e.newClient(t, dlock.WithHooks(rec.hooks()))

	l, err := c.TryLock(ctx, "lost", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "DEL", "dlock:{lost}")
	if err := l.Refresh(ctx, time.Second); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatal(err)
	}
	wantLines(t, rec.take(),
		"acquire exclusive [lost] wait=false",
		"acquired [lost] obtained",
		"refresh [lost] ok=false",
		"end [lost] lost=true",
		"release exclusive [lost]",
		"released [lost] ok=false",
	)

	// A deadline that passes without a refresh.
	l, err = c.TryLock(ctx, "lapsed", dlock.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-l.Done()
	wantLines(t, rec.take(),
		"acquire exclusive [lapsed] wait=false",
		"acquired [lapsed] obtained",
		"end [lapsed] lost=true",
	)
}

func TestHooksFollowEveryPrimitiveAndChain(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	first, second := &hookLog{}, &hookLog{}
	c := e.newClient(t, dlock.WithHooks(first.hooks()), dlock.WithHooks(second.hooks()))

	r, err := c.RWMutex("doc").TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := c.Semaphore("pool", 2).Acquire(ctx, dlock.WithTTL(5*time.Second), dlock.WithRefreshInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// The watchdog's refreshes are reported too.
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Contains(second.take(), "refresh [pool] ok=true") {
		if time.Now().After(deadline) {
			t.Fatal("no automatic refresh reported")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lines := first.take()
	for _, want := range []string{"acquire read [doc] wait=false", "released [doc] ok=true",
		"acquire permit [pool] wait=true", "refresh [pool] ok=true", "released [pool] ok=true"} {
		if !slices.Contains(lines, want) {
			t.Errorf("first hooks missed %q in %q", want, lines)
		}
	}
	// Attached locks are not followed.
	l, err := c.TryLock(ctx, "attached")
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Attach(ctx, "attached", l.Token())
	if err != nil {
		t.Fatal(err)
	}
	first.take()
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := first.take(); len(got) != 0 {
		t.Errorf("hooks followed an attached lock: %q", got)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatal(err)
	}
	wantLines(t, first.take(), "release exclusive [attached]", "end [attached] lost=true", "released [attached] ok=false")
}

func TestHooksEndALockOnceWhenReleasedAfterItsDeadline(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rec := &hookLog{}
	c := e.newClient(t, dlock.WithHooks(rec.hooks()))
	l, err := c.TryLock(ctx, "late", dlock.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// The key outlives the local deadline: the lock is lost to its holder,
	// and a Release that still finds it on the server does not end it again.
	e.srv.Do(t, "PEXPIRE", "dlock:{late}", "60000")
	<-l.Done()
	if got := rec.take(); got[len(got)-1] != "end [late] lost=true" {
		t.Fatalf("End not called before Done closed: %q", got)
	}
	_ = l.Release(ctx)
	for _, line := range rec.take() {
		if strings.HasPrefix(line, "end ") {
			t.Errorf("the lock ended twice: %q", line)
		}
	}
}

// A hook may use the lock it reports on: Err already says why the lock
// ended when End runs, and a Refresh hook may refresh the lock again (the
// refresh it reports is over).
func TestHooksMayUseTheirLock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var l *dlock.Lock
	var mu sync.Mutex
	var endErr, nested error
	refreshes := 0
	c := e.newClient(t, dlock.WithHooks(dlock.Hooks{
		Refresh: func(ctx context.Context, _ dlock.HookInfo, err error) {
			mu.Lock()
			refreshes++
			first := refreshes == 1
			mu.Unlock()
			if first && err == nil {
				rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				err := l.Refresh(rctx, time.Minute)
				mu.Lock()
				nested = err
				mu.Unlock()
			}
		},
		End: func(_ dlock.HookInfo, _ time.Duration, _ error) {
			mu.Lock()
			endErr = l.Err()
			mu.Unlock()
		},
	}))
	var err error
	if l, err = c.TryLock(ctx, "hooked", dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if nested != nil || refreshes != 2 {
		t.Errorf("the Refresh hook's own Refresh: err = %v, %d refreshes; want nil and 2", nested, refreshes)
	}
	mu.Unlock()
	if _, err := e.c.ForceRelease(ctx, "hooked"); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh of a force-released lock: err = %v", err)
	}
	<-l.Done()
	mu.Lock()
	defer mu.Unlock()
	if !errors.Is(endErr, dlock.ErrLost) {
		t.Errorf("Err inside End = %v, want ErrLost", endErr)
	}
}

// countingClient returns a client whose hooks count the acquisitions that
// start and end.
func countingClient(t *testing.T, e *env) (c *dlock.Client, starts, dones *atomic.Int64) {
	starts, dones = new(atomic.Int64), new(atomic.Int64)
	c = e.newClient(t, dlock.WithHooks(dlock.Hooks{
		AcquireStart: func(ctx context.Context, _ dlock.HookInfo) context.Context { starts.Add(1); return ctx },
		AcquireDone:  func(context.Context, dlock.HookInfo, dlock.AcquireResult) { dones.Add(1) },
	}))
	return c, starts, dones
}

// checkOnce fails t unless one acquisition started and ended.
func checkOnce(t *testing.T, starts, dones *atomic.Int64) {
	t.Helper()
	if starts.Load() != 1 || dones.Load() != 1 {
		t.Errorf("AcquireStart %d, AcquireDone %d times; want once each", starts.Load(), dones.Load())
	}
}

// A WithOnRetry function or a Retry hook that panics still leaves nothing
// behind: the acquisition is abandoned (a waiting writer's pending
// acquire goes), AcquireDone sees it end, and the panic goes on.
func TestAPanicInARetryHookLeavesNothingBehind(t *testing.T) {
	e := newEnv(t)
	c, starts, dones := countingClient(t, e)
	writerPanicsInItsWait(t, e, c, "panicky", "the callback's", dlock.WithOnRetry(func(int, error) { panic("boom") }))
	checkOnce(t, starts, dones)
}

// writerPanicsInItsWait has a writer of c's wait for name, held by a
// reader of e's, with opts, which make its wait panic "boom" (what
// panics, for the error's words); it checks that the panic reaches the
// caller and that no writer is left waiting in Redis, which would keep
// every reader out for the writer's TTL.
func writerPanicsInItsWait(t *testing.T, e *env, c *dlock.Client, name, what string, opts ...dlock.Option) {
	t.Helper()
	ctx := context.Background()
	reader, err := e.c.RWMutex(name).TryRLock(ctx, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Release(ctx)
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want %s panic", p, what)
			}
		}()
		_, _ = c.RWMutex(name).Lock(ctx, append([]dlock.Option{dlock.WithTTL(time.Minute)}, opts...)...)
	}()
	info, err := e.c.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if info.WriterWaiting || info.Waiters != 0 {
		t.Errorf("after the panic the writer still waits: %+v", info)
	}
}

// A WithOnRetry function that ends its goroutine (runtime.Goexit, as
// t.FailNow does) leaves nothing behind either, and AcquireDone sees the
// acquisition end.
func TestAGoexitInARetryFunctionLeavesNothingBehind(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c, starts, dones := countingClient(t, e)
	held, err := e.c.TryLock(ctx, "goexit", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_, _ = c.Lock(ctx, "goexit", dlock.WithOnRetry(func(int, error) { runtime.Goexit() }))
	}()
	<-exited
	if got := e.srv.Do(t, "ZCARD", "dlock:{goexit}:waiters"); got != "0" {
		t.Errorf("%s clients registered after the waiter's goroutine exited, want 0", got)
	}
	checkOnce(t, starts, dones)
}

// A panic once the lock is obtained, before the caller gets it (here an
// AcquireDone hook's; a logger's would do), gives the lock back: the
// caller never sees the Lock, and nothing would release or stop
// refreshing it.
func TestAPanicAfterTheLockIsObtainedGivesItBack(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.newClient(t, dlock.WithHooks(dlock.Hooks{
		AcquireDone: func(context.Context, dlock.HookInfo, dlock.AcquireResult) { panic("boom") },
	}))
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the hook's panic", p)
			}
		}()
		_, _ = c.TryLock(ctx, "obtained-then-panic", dlock.WithTTL(time.Minute), dlock.WithAutoRefresh())
	}()
	if e.locked(t, "dlock:{obtained-then-panic}") {
		t.Error("the lock obtained before the panic is still held")
	}
	if n := dlock.WatchedLeases(c); n != 0 {
		t.Errorf("the watchdog still refreshes %d leases", n)
	}
}

// TestAPanicAfterALockIsObtainedWithATokenLeavesItsHold: a lock obtained
// WithToken shares its hold with the Lock whose token it is, so a panic in
// AcquireDone does not give it back; End's error says the lock is lost to
// the panic, not that it was given back.
func TestAPanicAfterALockIsObtainedWithATokenLeavesItsHold(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var panics atomic.Bool
	var mu sync.Mutex
	var ends []error
	c := e.newClient(t, dlock.WithHooks(dlock.Hooks{
		AcquireDone: func(context.Context, dlock.HookInfo, dlock.AcquireResult) {
			if panics.Load() {
				panic("boom")
			}
		},
		End: func(_ dlock.HookInfo, _ time.Duration, err error) {
			mu.Lock()
			ends = append(ends, err)
			mu.Unlock()
		},
	}))
	held, err := c.TryLock(ctx, "token-then-panic", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	panics.Store(true)
	func() {
		defer func() { _ = recover() }()
		_, _ = c.TryLock(ctx, "token-then-panic", dlock.WithTTL(time.Minute), dlock.WithToken(held.Token()))
	}()
	if err := held.Refresh(ctx, time.Minute); err != nil {
		t.Errorf("the Lock whose token it was: Refresh: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ends) != 1 || !errors.Is(ends[0], dlock.ErrLost) || strings.Contains(ends[0].Error(), "given back") {
		t.Errorf("End: %v; want once, an ErrLost that does not say the hold was given back", ends)
	}
}

// TestARefreshCloseAbandonsIsNotReportedAsFailed: Close ends a refresh
// that is under way (its reply held back); that refresh is not reported as
// a failed one, to the Refresh hook.
func TestARefreshCloseAbandonsIsNotReportedAsFailed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var armed atomic.Bool
	inFlight := make(chan struct{})
	var once sync.Once
	// A short read timeout: Close waits for the refresh to give up.
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), MaxRetries: -1, ReadTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	d := &hookDriver{Driver: goredis.New(rdb), before: func(calls []*dlock.Call) {
		if armed.Load() && isRefresh(calls) {
			once.Do(func() {
				e.srv.Pause(t) // the refresh gets no reply; none other is on its way
				close(inFlight)
			})
		}
	}}
	var failed atomic.Int32
	c := dlock.New(d, dlock.WithHooks(dlock.Hooks{Refresh: func(_ context.Context, _ dlock.HookInfo, err error) {
		if err != nil {
			failed.Add(1)
		}
	}}))
	l, err := c.TryLock(ctx, "closing", dlock.WithTTL(time.Minute), dlock.WithRefreshInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	<-inFlight
	defer e.srv.Resume(t)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := failed.Load(); n != 0 {
		t.Errorf("the Refresh hook was told of %d failed refreshes; Close abandoned the one under way", n)
	}
	_ = l
}

// TestARefreshWhileTheEndHookRunsFails: a lock's deadline passes (its
// acquire was slow to reach the server, which holds it a little longer),
// and while its End hook runs, a Refresh must not bring it back.
func TestARefreshWhileTheEndHookRunsFails(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &hookDriver{Driver: e.newDriver(t), before: func(calls []*dlock.Call) {
		if calls[0].Script.Name == "acquire" {
			time.Sleep(100 * time.Millisecond) // the request is slow to arrive
		}
	}}
	ending, proceed := make(chan struct{}), make(chan struct{})
	c := dlock.New(d, dlock.WithHooks(dlock.Hooks{End: func(dlock.HookInfo, time.Duration, error) {
		close(ending)
		<-proceed
	}}))
	defer c.Close()
	l, err := c.TryLock(ctx, "ending", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	<-ending // the deadline passed; the server still holds the lock
	err = l.Refresh(ctx, time.Second)
	close(proceed)
	if !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh while the End hook runs = %v, want ErrNotHeld", err)
	}
}

// TestTheHooksHearOfALockBeforeItsEnd: a lock whose deadline passes while
// the AcquireDone hooks run (a TTL shorter than they take) ends for the
// hooks after every set's AcquireDone, never before: a count of locks held
// must not go below zero.
func TestTheHooksHearOfALockBeforeItsEnd(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rec := &hookLog{}
	slow := dlock.Hooks{AcquireDone: func(context.Context, dlock.HookInfo, dlock.AcquireResult) {
		time.Sleep(150 * time.Millisecond) // past the lock's deadline, and its timer's
	}}
	c := e.newClient(t, dlock.WithHooks(slow), dlock.WithHooks(rec.hooks()))
	l, err := c.TryLock(ctx, "short", dlock.WithTTL(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	default:
		t.Error("Done is open after the lock's deadline and its End")
	}
	wantLines(t, rec.take(),
		"acquire exclusive [short] wait=false",
		"acquired [short] obtained",
		"end [short] lost=true",
	)
}

// TestAPanicInOneSetOfHooksLeavesTheOthersTheirCalls: hooks given before
// or after a set that panics still get their AcquireDone, ReleaseDone and
// End, so that a span ends and a count of locks held comes back to zero;
// the panic goes on, and a lock its caller did not get is given back.
func TestAPanicInOneSetOfHooksLeavesTheOthersTheirCalls(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	boom := func() { panic("boom") }
	// recovered runs f and reports whether it panicked with boom.
	recovered := func(f func()) (ok bool) {
		defer func() { ok = recover() == "boom" }()
		f()
		return false
	}
	for _, first := range []bool{true, false} {
		t.Run(fmt.Sprintf("AcquireDone/panicking set first=%v", first), func(t *testing.T) {
			rec := &hookLog{}
			panicky := dlock.WithHooks(dlock.Hooks{AcquireDone: func(context.Context, dlock.HookInfo, dlock.AcquireResult) { boom() }})
			sets := []dlock.ClientOption{dlock.WithHooks(rec.hooks()), panicky}
			if first {
				sets[0], sets[1] = sets[1], sets[0]
			}
			c := e.newClient(t, sets...)
			name := fmt.Sprintf("panicky-%v", first)
			if !recovered(func() { _, _ = c.TryLock(ctx, name, dlock.WithTTL(time.Minute), dlock.WithAutoRefresh()) }) {
				t.Fatal("TryLock did not pass the hook's panic on")
			}
			wantLines(t, rec.take(),
				"acquire exclusive ["+name+"] wait=false",
				"acquired ["+name+"] obtained",
				"end ["+name+"] lost=true",
			)
			if e.locked(t, "dlock:{"+name+"}") {
				t.Error("the lock obtained before the panic is still held")
			}
			if n := dlock.WatchedLeases(c); n != 0 {
				t.Errorf("the watchdog still refreshes %d leases", n)
			}
		})
	}
	t.Run("ReleaseDone", func(t *testing.T) {
		rec := &hookLog{}
		c := e.newClient(t, dlock.WithHooks(dlock.Hooks{ReleaseDone: func(context.Context, dlock.HookInfo, time.Duration, error) { boom() }}),
			dlock.WithHooks(rec.hooks()))
		l, err := c.TryLock(ctx, "panicky-release")
		if err != nil {
			t.Fatal(err)
		}
		if !recovered(func() { _ = l.Release(ctx) }) {
			t.Fatal("Release did not pass the hook's panic on")
		}
		wantLines(t, rec.take()[2:],
			"release exclusive [panicky-release]",
			"end [panicky-release] released",
			"released [panicky-release] ok=true",
		)
	})
	t.Run("AcquireDoneAndEnd", func(t *testing.T) {
		// AcquireDone said obtained, then panicked; the End of the lock
		// given back for it panics too: the lock is given back all the
		// same.
		c := e.newClient(t, dlock.WithHooks(dlock.Hooks{
			AcquireDone: func(context.Context, dlock.HookInfo, dlock.AcquireResult) { boom() },
			End:         func(dlock.HookInfo, time.Duration, error) { panic("end") },
		}))
		func() {
			defer func() { _ = recover() }()
			_, _ = c.TryLock(ctx, "panicky-twice", dlock.WithTTL(time.Minute))
		}()
		if e.locked(t, "dlock:{panicky-twice}") {
			t.Error("the lock obtained before the panics is still held")
		}
	})
	t.Run("End", func(t *testing.T) {
		rec := &hookLog{}
		c := e.newClient(t, dlock.WithHooks(dlock.Hooks{End: func(dlock.HookInfo, time.Duration, error) { boom() }}),
			dlock.WithHooks(rec.hooks()))
		l, err := c.TryLock(ctx, "panicky-end")
		if err != nil {
			t.Fatal(err)
		}
		if !recovered(func() { _ = l.Release(ctx) }) {
			t.Fatal("Release did not pass the End hook's panic on")
		}
		lines := rec.take()
		if !slices.Contains(lines, "end [panicky-end] released") {
			t.Errorf("the second set had no End:\n  %s", strings.Join(lines, "\n  "))
		}
		if !slices.Contains(lines, "released [panicky-end] ok=false") {
			t.Errorf("the second set had no ReleaseDone:\n  %s", strings.Join(lines, "\n  "))
		}
		select {
		case <-l.Done():
		default:
			t.Error("Done is open after the lock ended with a panicking End hook")
		}
		if e.locked(t, "dlock:{panicky-end}") {
			t.Error("the lock is still held")
		}
	})
}

// TestTheRefreshHookHearsOfALossToldBeforeItsReply: a watchdog refresh
// whose reply comes after the lock's deadline passed extends nothing: the
// Refresh hook hears of the loss that End and Done told, not of a refresh
// that succeeded, as Lock.Refresh reports it in that case.
func TestTheRefreshHookHearsOfALossToldBeforeItsReply(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	locked := make(chan *dlock.Lock, 1)
	var first atomic.Bool
	d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		if isRefresh(calls) && first.CompareAndSwap(false, true) {
			<-(<-locked).Done() // the reply comes back after the deadline
		}
	}}
	rec := &hookLog{}
	refreshed := make(chan error, 1)
	c := dlock.New(d, dlock.WithHooks(rec.hooks()), dlock.WithHooks(dlock.Hooks{
		Refresh: func(_ context.Context, _ dlock.HookInfo, err error) { refreshed <- err },
	}))
	defer c.Close()
	l, err := c.TryLock(ctx, "late-reply", dlock.WithTTL(300*time.Millisecond), dlock.WithRefreshInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	locked <- l
	if err := <-refreshed; !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Refresh hook: err = %v, want the loss (ErrNotHeld, ErrLost)", err)
	}
	wantLines(t, rec.take(),
		"acquire exclusive [late-reply] wait=false",
		"acquired [late-reply] obtained",
		"end [late-reply] lost=true",
		"refresh [late-reply] ok=false",
	)
}

// TestTheRefreshHookHearsOfAReleaseBeforeItsReply: a watchdog refresh
// whose reply comes after a Release ended the lock (and after the lock's
// deadline) is no success for the Refresh hook, as Lock.Refresh in the
// same race reports the release. It heard nil.
func TestTheRefreshHookHearsOfAReleaseBeforeItsReply(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	inFlight, proceed := make(chan struct{}, 1), make(chan struct{})
	var first atomic.Bool
	d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		if isRefresh(calls) && first.CompareAndSwap(false, true) {
			inFlight <- struct{}{}
			<-proceed
		}
	}}
	refreshed := make(chan error, 4)
	c := dlock.New(d, dlock.WithHooks(dlock.Hooks{Refresh: func(_ context.Context, _ dlock.HookInfo, err error) { refreshed <- err }}))
	defer c.Close()
	l, err := c.TryLock(ctx, "released-before-reply", dlock.WithTTL(300*time.Millisecond), dlock.WithRefreshInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-inFlight // the refresh ran on the server; its reply waits
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(l.Deadline()) + 20*time.Millisecond)
	close(proceed)
	if err := <-refreshed; !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh hook: err = %v, want ErrNotHeld (released)", err)
	}
}

// TestTheRefreshHookHearsOfALossWhileEndTellsIt: a watchdog refresh
// whose reply comes while the End hook tells the loss (the deadline passed)
// extends nothing either.
func TestTheRefreshHookHearsOfALossWhileEndTellsIt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ending := make(chan struct{})
	var first atomic.Bool
	d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		if isRefresh(calls) && first.CompareAndSwap(false, true) {
			<-ending // the reply comes back as the End hook runs
		}
	}}
	refreshed := make(chan error, 1)
	c := dlock.New(d, dlock.WithHooks(dlock.Hooks{
		Refresh: func(_ context.Context, _ dlock.HookInfo, err error) { refreshed <- err },
		End: func(dlock.HookInfo, time.Duration, error) {
			close(ending)
			if err := <-refreshed; !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) {
				t.Errorf("Refresh hook: err = %v, want the loss (ErrNotHeld, ErrLost)", err)
			}
		},
	}))
	defer c.Close()
	l, err := c.TryLock(ctx, "reply-in-end", dlock.WithTTL(300*time.Millisecond), dlock.WithRefreshInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-l.Done()
}

// TestARefreshHookPanicEndsTheLockItFoundLost: a Lock.Refresh that found
// the lock gone ends it (Done closed, End called) before its Refresh hook's
// panic reaches the caller.
func TestARefreshHookPanicEndsTheLockItFoundLost(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rec := &hookLog{}
	c := e.newClient(t, dlock.WithHooks(dlock.Hooks{
		Refresh: func(_ context.Context, _ dlock.HookInfo, err error) {
			if err != nil {
				panic("boom")
			}
		},
	}), dlock.WithHooks(rec.hooks()))
	l, err := c.TryLock(ctx, "refresh-panics", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "DEL", "dlock:{refresh-panics}")
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("Refresh: recovered %v, want the hook's panic", p)
			}
		}()
		_ = l.Refresh(ctx, time.Minute)
	}()
	select {
	case <-l.Done():
	default:
		t.Fatal("Done is open for a lock a refresh found gone")
	}
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost", l.Err())
	}
	wantLines(t, rec.take()[2:], "refresh [refresh-panics] ok=false", "end [refresh-panics] lost=true")
}

// hookPanics is a hook's body that panics.
func hookPanics() { panic("boom") }

// panicLog is a slog handler that passes on the hook named in each record
// of a hook's panic whose stack shows the hook (hookPanics).
type panicLog chan string

func (h panicLog) Enabled(context.Context, slog.Level) bool { return true }
func (h panicLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h panicLog) WithGroup(string) slog.Handler            { return h }
func (h panicLog) Handle(_ context.Context, r slog.Record) error {
	if r.Level != slog.LevelError || !strings.Contains(r.Message, "a hook panicked") {
		return nil
	}
	var hook string
	stack := false
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "hook":
			hook = a.Value.String()
		case "stack":
			stack = strings.Contains(a.Value.String(), "dlock_test.hookPanics(")
		}
		return true
	})
	if stack {
		h <- hook
	}
	return nil
}

// TestAHookPanicOnDlocksOwnGoroutinesIsLogged: a hook that panics on the
// watchdog's goroutine or a deadline timer's, where no caller could take
// the panic, does not end the program: dlock logs it, with its stack, and
// goes on, refreshing the locks and giving back what a lost lock left.
func TestAHookPanicOnDlocksOwnGoroutinesIsLogged(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	boom := hookPanics
	logged := make(panicLog, 16)
	t.Run("Refresh", func(t *testing.T) {
		refreshes := make(chan struct{}, 16)
		c := e.newClient(t, dlock.WithLogger(slog.New(logged)), dlock.WithHooks(dlock.Hooks{
			Refresh: func(context.Context, dlock.HookInfo, error) { refreshes <- struct{}{}; boom() },
		}))
		l, err := c.TryLock(ctx, "panicky-refresh", dlock.WithTTL(300*time.Millisecond), dlock.WithRefreshInterval(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for range 3 { // the watchdog goes on refreshing it
			<-refreshes
			if hook := <-logged; hook != "Refresh" {
				t.Errorf("logged a panic of %q, want Refresh", hook)
			}
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	})
	t.Run("End at the deadline", func(t *testing.T) {
		c := e.newClient(t, dlock.WithLogger(slog.New(logged)), dlock.WithHooks(dlock.Hooks{
			End: func(dlock.HookInfo, time.Duration, error) { boom() },
		}))
		l, err := c.TryLock(ctx, "panicky-deadline", dlock.WithTTL(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if hook := <-logged; hook != "End" {
			t.Errorf("logged a panic of %q, want End", hook)
		}
		<-l.Done()
		if !errors.Is(l.Err(), dlock.ErrLost) {
			t.Errorf("Err = %v, want ErrLost", l.Err())
		}
	})
	t.Run("End of a lock Do gave back in the background", func(t *testing.T) {
		d := &unsentDriver{tapDriver: e.newDriver(t)}
		c := dlock.New(d, dlock.WithLogger(slog.New(logged)), dlock.WithHooks(dlock.Hooks{
			End: func(dlock.HookInfo, time.Duration, error) { boom() },
		}))
		t.Cleanup(func() { _ = c.Close() })
		err := c.Do(ctx, "panicky-given-back", func(context.Context) error {
			d.unsent.Store(1) // the release only: given back in the background
			return nil
		}, dlock.WithTTL(5*time.Second))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Do = %v, want the release's timeout", err)
		}
		if hook := <-logged; hook != "End" {
			t.Errorf("logged a panic of %q, want End", hook)
		}
	})
	t.Run("End of a lock the watchdog found lost", func(t *testing.T) {
		refreshes, gaveBack := make(chan string, 16), make(chan struct{})
		var once sync.Once
		d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
			for _, call := range calls {
				if call.Script.Name == "release" && slices.Contains(call.Keys, "dlock:{panicky-gone-too}") {
					once.Do(func() { close(gaveBack) })
				}
			}
		}}
		c := dlock.New(d, dlock.WithLogger(slog.New(logged)), dlock.WithHooks(dlock.Hooks{
			Refresh: func(_ context.Context, h dlock.HookInfo, err error) {
				if err == nil {
					refreshes <- h.Names[0]
				}
			},
			End: func(h dlock.HookInfo, _ time.Duration, err error) {
				if err != nil {
					boom()
				}
			},
		}))
		defer c.Close()
		opts := []dlock.Option{dlock.WithTTL(time.Second), dlock.WithRefreshInterval(50 * time.Millisecond)}
		gone, err := c.TryLockMulti(ctx, []string{"panicky-gone", "panicky-gone-too"}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		kept, err := c.TryLock(ctx, "panicky-kept", opts...)
		if err != nil {
			t.Fatal(err)
		}
		e.srv.Do(t, "DEL", "dlock:{panicky-gone}")
		if hook := <-logged; hook != "End" {
			t.Errorf("logged a panic of %q, want End", hook)
		}
		<-gone.Done()
		if !errors.Is(gone.Err(), dlock.ErrLost) {
			t.Errorf("Err = %v, want ErrLost", gone.Err())
		}
		// What is left of the lost lock is given back, and the watchdog
		// refreshes the other.
		<-gaveBack
		if e.locked(t, "dlock:{panicky-gone-too}") {
			t.Error("the rest of the lost lock is still held")
		}
		for len(refreshes) > 0 {
			<-refreshes
		}
		for <-refreshes != "panicky-kept" {
		}
		if err := kept.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	})
}

// TestTheWatchdogsRefreshMayComeBeforeAcquireDoneReturns: the watchdog
// refreshes an auto-refreshed lock from the moment it is obtained, so an
// AcquireDone hook slower than the refresh interval sees a Refresh call of
// that lock before it returns (see Hooks.Refresh).
func TestTheWatchdogsRefreshMayComeBeforeAcquireDoneReturns(t *testing.T) {
	e := newEnv(t)
	refreshed := make(chan struct{})
	var once sync.Once
	c := e.newClient(t, dlock.WithHooks(dlock.Hooks{
		AcquireDone: func(_ context.Context, _ dlock.HookInfo, r dlock.AcquireResult) {
			if r.Outcome != dlock.OutcomeObtained {
				return
			}
			select {
			case <-refreshed:
			case <-time.After(5 * time.Second):
				t.Error("no Refresh call while AcquireDone ran for 5s")
			}
		},
		Refresh: func(context.Context, dlock.HookInfo, error) { once.Do(func() { close(refreshed) }) },
	}))
	l, err := c.TryLock(context.Background(), "early", dlock.WithTTL(time.Second), dlock.WithAutoRefresh(), dlock.WithRefreshInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}
