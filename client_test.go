package dlock_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/redis/go-redis/v9"
)

// TestAClientNotMadeByNewPanics: every method of the zero Client, and of an
// RWMutex or Semaphore that its constructor did not make, panics at once
// with a message that says so, instead of waiting for ever for a request
// to be sent or failing deep inside; so does Close of a nil *Client.
func TestAClientNotMadeByNewPanics(t *testing.T) {
	// Bounded, should a call wait instead of panicking (a call without a
	// deadline then waits for ever).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var c dlock.Client
	var nilClient *dlock.Client
	var m dlock.RWMutex
	var s dlock.Semaphore
	for _, tc := range []struct {
		name string
		call func()
		want string
	}{
		{"TryLock", func() { _, _ = c.TryLock(ctx, "x") }, "Client used without New"},
		{"TryLock, no deadline", func() { _, _ = c.TryLock(context.Background(), "x") }, "Client used without New"},
		{"Lock", func() { _, _ = c.Lock(ctx, "x") }, "Client used without New"},
		{"TryLockMulti", func() { _, _ = c.TryLockMulti(ctx, []string{"x", "y"}) }, "Client used without New"},
		{"LockMulti", func() { _, _ = c.LockMulti(ctx, []string{"x", "y"}) }, "Client used without New"},
		{"Lock, auto-refreshed", func() { _, _ = c.Lock(ctx, "x", dlock.WithAutoRefresh()) }, "Client used without New"},
		{"Do", func() { _ = c.Do(ctx, "x", func(context.Context) error { return nil }) }, "Client used without New"},
		{"Attach", func() { _, _ = c.Attach(ctx, "x", "token") }, "Client used without New"},
		{"Inspect", func() { _, _ = c.Inspect(ctx, "x") }, "Client used without New"},
		{"ForceRelease", func() { _, _ = c.ForceRelease(ctx, "x") }, "Client used without New"},
		{"List", func() { _, _ = c.List(ctx, "*") }, "Client used without New"},
		{"SetFenced", func() { _ = c.SetFenced(ctx, "x", 1, "v") }, "Client used without New"},
		{"GetFenced", func() { _, _, _ = c.GetFenced(ctx, "x") }, "Client used without New"},
		{"Prepare", func() { _ = c.Prepare(ctx) }, "Client used without New"},
		{"RWMutex", func() { c.RWMutex("x") }, "Client used without New"},
		{"Semaphore", func() { c.Semaphore("x", 1) }, "Client used without New"},
		{"Prefix", func() { c.Prefix() }, "Client used without New"},
		{"RedisKey", func() { c.RedisKey("x") }, "Client used without New"},
		{"Close", func() { _ = c.Close() }, "Client used without New"},
		{"Close of a nil *Client", func() { _ = nilClient.Close() }, "nil *Client"},
		{"TryLock of a nil *Client", func() { _, _ = nilClient.TryLock(ctx, "x") }, "nil *Client"},
		{"SetFenced of a nil *Client", func() { _ = nilClient.SetFenced(ctx, "x", 1, "v") }, "nil *Client"},
		{"zero RWMutex: RLock", func() { _, _ = m.RLock(ctx) }, "RWMutex used without Client.RWMutex"},
		{"zero RWMutex: TryRLock", func() { _, _ = m.TryRLock(ctx) }, "RWMutex used without Client.RWMutex"},
		{"zero RWMutex: Lock", func() { _, _ = m.Lock(ctx) }, "RWMutex used without Client.RWMutex"},
		{"zero RWMutex: TryLock", func() { _, _ = m.TryLock(ctx) }, "RWMutex used without Client.RWMutex"},
		{"zero Semaphore: Acquire", func() { _, _ = s.Acquire(ctx) }, "Semaphore used without Client.Semaphore"},
		{"zero Semaphore: TryAcquire", func() { _, _ = s.TryAcquire(ctx) }, "Semaphore used without Client.Semaphore"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := func() (p any) {
				defer func() { p = recover() }()
				tc.call()
				return nil
			}()
			msg, _ := p.(string)
			if !strings.HasPrefix(msg, "dlock: ") || !strings.Contains(msg, tc.want) {
				t.Errorf("panic = %v, want a \"dlock: \" message saying %q", p, tc.want)
			}
		})
	}
}

// An acquire that Close overtakes after its first check (here Close runs
// from its AcquireStart hook, and returns) sends nothing and fails with
// ErrClosed: Close waits for the acquisitions under way, so that none
// reaches Redis after it returned, when the caller may have closed the
// Redis client.
func TestAnAcquireThatCloseOvertakesSendsNothing(t *testing.T) {
	e := newEnv(t)
	d := e.newDriver(t)
	var c *dlock.Client
	c = dlock.New(d, dlock.WithHooks(dlock.Hooks{AcquireStart: func(ctx context.Context, _ dlock.HookInfo) context.Context {
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		if err := <-closed; err != nil {
			t.Errorf("Close: %v", err)
		}
		return ctx
	}}))
	before := d.trips.Load()
	if l, err := c.TryLock(context.Background(), "overtaken"); l != nil || !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("TryLock overtaken by Close: %v, %v; want ErrClosed", l != nil, err)
	}
	if n := d.trips.Load() - before; n != 0 {
		t.Errorf("%d round trips after Close returned, want none", n)
	}
}

// TestCloseRefusesAcquiresAndEndsWaits: after Close, every acquire fails
// with ErrClosed without a round trip, and the callers waiting when Close
// came stop waiting with ErrClosed, leaving nothing behind in Redis; the
// locks the client holds can still be refreshed and released.
func TestCloseRefusesAcquiresAndEndsWaits(t *testing.T) {
	e := newEnv(t)
	drv := e.newDriver(t)
	c := dlock.New(drv)
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	hold := func(l *dlock.Lock, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// Held by another client: the names c's callers wait for.
	hold(e.c.TryLock(ctx, "x", dlock.WithTTL(time.Minute)))
	hold(e.c.TryLock(ctx, "m2", dlock.WithTTL(time.Minute)))
	hold(e.c.RWMutex("written").TryLock(ctx, dlock.WithTTL(time.Minute)))
	hold(e.c.RWMutex("read").TryRLock(ctx, dlock.WithTTL(time.Minute)))
	hold(e.c.RWMutex("fair", dlock.Fair()).TryLock(ctx, dlock.WithTTL(time.Minute)))
	hold(e.c.Semaphore("sem", 1).TryAcquire(ctx, dlock.WithTTL(time.Minute)))
	// Held by c.
	mine, err := c.TryLock(ctx, "mine", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}

	waits := []struct {
		name    string // the name whose waiter set the wait registers in
		acquire func(ctx context.Context) (*dlock.Lock, error)
	}{
		{"x", func(ctx context.Context) (*dlock.Lock, error) { return c.Lock(ctx, "x") }},
		{"m2", func(ctx context.Context) (*dlock.Lock, error) { return c.LockMulti(ctx, []string{"m1", "m2"}) }},
		{"written", func(ctx context.Context) (*dlock.Lock, error) { return c.RWMutex("written").RLock(ctx) }},
		{"read", func(ctx context.Context) (*dlock.Lock, error) { return c.RWMutex("read").Lock(ctx) }},
		{"fair", func(ctx context.Context) (*dlock.Lock, error) { return c.RWMutex("fair", dlock.Fair()).RLock(ctx) }},
		{"sem", func(ctx context.Context) (*dlock.Lock, error) { return c.Semaphore("sem", 1).Acquire(ctx) }},
	}
	// Long enough that only Close ends the waits.
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	errs := make([]chan error, len(waits))
	for i, w := range waits {
		errs[i] = make(chan error, 1)
		go func() {
			l, err := w.acquire(waitCtx)
			if err == nil {
				_ = l.Release(ctx)
			}
			errs[i] <- err
		}()
	}
	inspect := func(name string) *dlock.Info {
		t.Helper()
		info, err := e.c.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	for _, w := range waits {
		awaitCond(t, 5*time.Second, func() bool { return inspect(w.name).WaitingClients == 1 })
	}
	if !inspect("read").WriterWaiting || inspect("fair").Waiters != 1 {
		t.Fatal("the waiting writer, or the fair lock's waiting reader, is not recorded")
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for i, w := range waits {
		if err := <-errs[i]; !errors.Is(err, dlock.ErrClosed) || errors.Is(err, context.Canceled) {
			t.Errorf("wait at %q: err = %v, want ErrClosed, not Canceled", w.name, err)
		}
		info := inspect(w.name)
		if info.WaitingClients != 0 || info.Waiters != 0 || info.WriterWaiting || len(info.Holders) != 1 {
			t.Errorf("%q after the wait Close ended: %+v; want its one holder and no waiter", w.name, info)
		}
	}
	if info := inspect("m1"); info.Kind != dlock.KindNone {
		t.Errorf("m1 after the wait Close ended: %+v, want free", info)
	}

	// New acquires are refused without a round trip.
	trips := drv.trips.Load()
	m, s := c.RWMutex("free"), c.Semaphore("free-sem", 1)
	for _, a := range []struct {
		name    string
		acquire func() error
	}{
		{"TryLock", func() error { _, err := c.TryLock(ctx, "free"); return err }},
		{"Lock", func() error { _, err := c.Lock(ctx, "free"); return err }},
		{"TryLockMulti", func() error { _, err := c.TryLockMulti(ctx, []string{"f1", "f2"}); return err }},
		{"LockMulti", func() error { _, err := c.LockMulti(ctx, []string{"f1", "f2"}); return err }},
		{"Do", func() error { return c.Do(ctx, "free", func(context.Context) error { return nil }) }},
		{"RWMutex.TryRLock", func() error { _, err := m.TryRLock(ctx); return err }},
		{"RWMutex.RLock", func() error { _, err := m.RLock(ctx); return err }},
		{"RWMutex.TryLock", func() error { _, err := m.TryLock(ctx); return err }},
		{"RWMutex.Lock", func() error { _, err := m.Lock(ctx); return err }},
		{"Semaphore.TryAcquire", func() error { _, err := s.TryAcquire(ctx); return err }},
		{"Semaphore.Acquire", func() error { _, err := s.Acquire(ctx); return err }},
	} {
		if err := a.acquire(); !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("%s after Close: err = %v, want ErrClosed", a.name, err)
		}
	}
	if n := drv.trips.Load() - trips; n != 0 {
		t.Errorf("the acquires after Close made %d round trips, want none", n)
	}

	// The lock c holds is still its own to refresh and release.
	if err := mine.Refresh(ctx, time.Minute); err != nil {
		t.Errorf("Refresh after Close: %v", err)
	}
	if _, err := mine.TTL(ctx); err != nil {
		t.Errorf("TTL after Close: %v", err)
	}
	if err := mine.Release(ctx); err != nil {
		t.Errorf("Release after Close: %v", err)
	}
	if e.locked(t, "dlock:{mine}") {
		t.Error("the lock is still held after its Release")
	}
}

// TestAnAcquireWhoseContextHasEndedSendsNothing: an acquire called with a
// context that has already ended fails with the context's error (and its
// cause) without a round trip, and leaves nothing in Redis, not even the
// clean-up's record of a request that was never sent.
func TestAnAcquireWhoseContextHasEndedSendsNothing(t *testing.T) {
	e := newEnv(t)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	why := errors.New("the request was dropped")
	expired, cancel2 := context.WithDeadlineCause(context.Background(), time.Now().Add(-time.Second), why)
	defer cancel2()
	acquires := map[string]func(ctx context.Context) (*dlock.Lock, error){
		"TryLock":      func(ctx context.Context) (*dlock.Lock, error) { return e.c.TryLock(ctx, "ended") },
		"Lock":         func(ctx context.Context) (*dlock.Lock, error) { return e.c.Lock(ctx, "ended") },
		"TryLockMulti": func(ctx context.Context) (*dlock.Lock, error) { return e.c.TryLockMulti(ctx, []string{"ended", "x"}) },
		"LockMulti":    func(ctx context.Context) (*dlock.Lock, error) { return e.c.LockMulti(ctx, []string{"ended", "x"}) },
		"TryRLock":     func(ctx context.Context) (*dlock.Lock, error) { return e.c.RWMutex("ended").TryRLock(ctx) },
		"RWMutex.Lock": func(ctx context.Context) (*dlock.Lock, error) { return e.c.RWMutex("ended").Lock(ctx) },
		"TryAcquire":   func(ctx context.Context) (*dlock.Lock, error) { return e.c.Semaphore("ended", 2).TryAcquire(ctx) },
		"Acquire":      func(ctx context.Context) (*dlock.Lock, error) { return e.c.Semaphore("ended", 2).Acquire(ctx) },
	}
	for what, acquire := range acquires {
		before := e.drv.trips.Load()
		if l, err := acquire(cancelled); l != nil || !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: %v, %v; want context.Canceled", what, l, err)
		} else if msg := err.Error(); !strings.HasPrefix(msg, "dlock: ") || strings.Count(msg, "dlock: ") != 1 {
			t.Errorf("%s with a cancelled context: error %q, want it to say \"dlock: \" once, first", what, msg)
		}
		if l, err := acquire(expired); l != nil || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, why) {
			t.Errorf("%s past its deadline: %v, %v; want context.DeadlineExceeded and its cause", what, l, err)
		}
		if n := e.drv.trips.Load() - before; n != 0 {
			t.Errorf("%s: %d round trips, want none", what, n)
		}
	}
	if keys := e.srv.Do(t, "KEYS", "*"); keys != "" {
		t.Errorf("keys left: %q", keys)
	}
}

// TestCloseWaitsForTheWaitsItEnds: a Client closed while its callers wait,
// and its Redis client closed right after (stacked defers), leaves nothing
// of the waits in Redis: no waiter registration or grant request, no
// pending writer that keeps readers out. Close waited for their clean-up.
func TestCloseWaitsForTheWaitsItEnds(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	holder, err := e.c.TryLock(ctx, "x", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	reader, err := e.c.RWMutex("rw").TryRLock(ctx, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Release(ctx)
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), ContextTimeoutEnabled: true})
	c := dlock.New(goredis.New(rdb))
	errs := make(chan error, 2)
	go func() { _, err := c.Lock(ctx, "x"); errs <- err }()
	go func() { _, err := c.RWMutex("rw").Lock(ctx); errs <- err }()
	awaitCond(t, 5*time.Second, func() bool {
		x, err1 := e.c.Inspect(ctx, "x")
		rw, err2 := e.c.Inspect(ctx, "rw")
		return err1 == nil && err2 == nil && x.WaitingClients == 1 && rw.WriterWaiting
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, dlock.ErrClosed) || errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("wait: err = %v, want ErrClosed, not ErrNotObtained", err)
		}
	}
	if x, err := e.c.Inspect(ctx, "x"); err != nil || x.WaitingClients != 0 {
		t.Errorf("x: %+v, %v; want no waiting client", x, err)
	}
	if fields := e.srv.Do(t, "HKEYS", "dlock:{x}"); strings.Contains(fields, "g:") {
		t.Errorf("x keeps a grant request: %q", fields)
	}
	if rw, err := e.c.Inspect(ctx, "rw"); err != nil || rw.WriterWaiting {
		t.Errorf("rw: %+v, %v; want no writer waiting", rw, err)
	}
	if l, err := e.newClient(t).RWMutex("rw").TryRLock(ctx); err != nil {
		t.Errorf("a reader after Close: %v", err)
	} else {
		_ = l.Release(ctx)
	}
}

// TestEveryCloseWaitsForTheFirst: a Close called while another runs returns
// only once the first has done its work (here, waited for a refresh under
// way), so that either caller may close the Redis client next.
func TestEveryCloseWaitsForTheFirst(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	inRefresh, unblock := make(chan struct{}), make(chan struct{})
	var first, refreshed atomic.Bool
	d := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		if isRefresh(calls) && first.CompareAndSwap(false, true) {
			close(inRefresh)
			<-unblock
			refreshed.Store(true)
		}
	}}
	c := dlock.New(d)
	l, err := c.TryLock(ctx, "closed-twice", dlock.WithTTL(time.Minute), dlock.WithRefreshInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	<-inRefresh
	firstDone := make(chan struct{})
	go func() { _ = c.Close(); close(firstDone) }()
	awaitCond(t, 10*time.Second, func() bool { _, err := c.TryLock(ctx, "after-close"); return errors.Is(err, dlock.ErrClosed) })
	second := make(chan bool, 1)
	go func() { _ = c.Close(); second <- refreshed.Load() }()
	// Both calls are in Close (or, wrongly, the second has returned).
	awaitCond(t, 10*time.Second, func() bool { return len(second) > 0 || inClose() == 2 })
	close(unblock)
	if !<-second {
		t.Error("the second Close returned while the first waited for a refresh under way")
	}
	<-firstDone
}

// inClose returns how many goroutines are in Client.Close.
func inClose() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "dlock.(*Client).Close(")
}

// TestCloseWaitsForATryLockUnderWay: Close called while a TryLock
// WithAutoRefresh is under way returns only once that TryLock has given
// back the lock it obtained after Close, so that the caller may close the
// Redis client next and find the name free.
func TestCloseWaitsForATryLockUnderWay(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	obtained, proceed := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var order []string
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, s)
	}
	c := dlock.New(&hookDriver{Driver: goredis.New(rdb), after: func(calls []*dlock.Call) {
		if calls[0].Keys[0] != "dlock:{underway}" {
			return // the probe below
		}
		switch calls[0].Script.Name {
		case "acquire":
			close(obtained) // once: the only acquire sent
			<-proceed
		case "release":
			note("given back")
		}
	}})
	tried := make(chan error, 1)
	go func() {
		_, err := c.TryLock(ctx, "underway", dlock.WithAutoRefresh(), dlock.WithTTL(time.Minute))
		tried <- err
	}()
	<-obtained
	closed := make(chan struct{})
	go func() {
		_ = c.Close()
		note("Close returned")
		close(closed)
	}()
	awaitCond(t, 5*time.Second, func() bool {
		l, err := c.TryLock(ctx, "probe") // ErrClosed without a request once Close has begun
		if err == nil {
			_ = l.Release(ctx)
		}
		return errors.Is(err, dlock.ErrClosed)
	})
	close(proceed)
	<-closed
	if err := rdb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-tried; !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("TryLock: err = %v, want ErrClosed", err)
	}
	mu.Lock()
	got := strings.Join(order, ", ")
	mu.Unlock()
	if got != "given back, Close returned" {
		t.Errorf("order: %s; want the lock given back before Close returned", got)
	}
	if info, err := e.c.Inspect(ctx, "underway"); err != nil || len(info.Holders) != 0 {
		t.Errorf("%+v, %v; want the name free", info, err)
	}
}

// TestAnAcquireThatCloseOvertakesLeavesNothing: Close called as an acquire
// starts (here from a hook): a waiting one sends nothing, and one
// WithAutoRefresh that obtains its lock gives it back, since nothing would
// refresh it; both return ErrClosed.
func TestAnAcquireThatCloseOvertakesLeavesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, tc := range []struct {
		what    string
		acquire func(c *dlock.Client) (*dlock.Lock, error)
	}{
		{"Lock", func(c *dlock.Client) (*dlock.Lock, error) { return c.Lock(ctx, "overtaken") }},
		{"RLock", func(c *dlock.Client) (*dlock.Lock, error) { return c.RWMutex("overtaken").RLock(ctx) }},
		{"TryLock WithAutoRefresh", func(c *dlock.Client) (*dlock.Lock, error) {
			return c.TryLock(ctx, "overtaken", dlock.WithAutoRefresh())
		}},
		{"Lock WithAutoRefresh", func(c *dlock.Client) (*dlock.Lock, error) {
			return c.Lock(ctx, "overtaken", dlock.WithAutoRefresh())
		}},
	} {
		var c *dlock.Client
		c = dlock.New(e.newDriver(t), dlock.WithHooks(dlock.Hooks{
			AcquireStart: func(ctx context.Context, _ dlock.HookInfo) context.Context {
				_ = c.Close()
				return ctx
			},
		}))
		if l, err := tc.acquire(c); l != nil || !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("%s: %v, %v; want ErrClosed", tc.what, l, err)
		}
		if info, err := e.c.Inspect(ctx, "overtaken"); err != nil || len(info.Holders) != 0 || info.WaitingClients != 0 {
			t.Errorf("%s: %+v, %v; want the name free, nobody waiting", tc.what, info, err)
		}
	}
}

// TestALockObtainedAfterCloseIsGivenBackAsAFailedAcquire: an acquire
// WithAutoRefresh that Close overtakes (here from a hook) gives back only
// what it took, as a failed acquire would: no minimum hold keeps the name,
// a token given to another Lock too keeps that Lock's hold, a re-entry by
// owner leaves the owner's first hold, and the hooks hear of no lock held.
func TestALockObtainedAfterCloseIsGivenBackAsAFailedAcquire(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var events []string
	closing := func() *dlock.Client {
		var c *dlock.Client
		c = dlock.New(e.newDriver(t), dlock.WithHooks(dlock.Hooks{
			AcquireStart: func(ctx context.Context, _ dlock.HookInfo) context.Context {
				_ = c.Close()
				events = append(events, "start")
				return ctx
			},
			AcquireDone: func(_ context.Context, _ dlock.HookInfo, r dlock.AcquireResult) {
				events = append(events, "done:"+r.Outcome)
			},
			End: func(dlock.HookInfo, time.Duration, error) { events = append(events, "end") },
		}))
		return c
	}
	auto := []dlock.Option{dlock.WithAutoRefresh(), dlock.WithTTL(time.Minute)}

	events = nil
	_, err := closing().TryLock(ctx, "mh", append(auto, dlock.WithMinHold(time.Minute))...)
	if !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("with a minimum hold: err = %v, want ErrClosed", err)
	}
	if strings.Join(events, " ") != "start done:error" {
		t.Errorf("hooks heard %q, want start and an error", events)
	}
	if l, err := e.c.TryLock(ctx, "mh"); err != nil {
		t.Errorf("the name given back is not free: %v", err)
	} else {
		_ = l.Release(ctx)
	}

	for _, tc := range []struct {
		what string
		opt  dlock.Option
	}{{"token", dlock.WithToken("shared-token-0123456789abcdef")}, {"owner", dlock.WithOwner("owner-1")}} {
		for _, kind := range []struct {
			what    string
			acquire func(c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error)
		}{
			{"exclusive", func(c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error) { return c.TryLock(ctx, "sh", opts...) }},
			{"read", func(c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error) {
				return c.RWMutex("sh-rw").TryRLock(ctx, opts...)
			}},
			{"write", func(c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error) {
				return c.RWMutex("sh-w").TryLock(ctx, opts...)
			}},
		} {
			first, err := kind.acquire(e.c, tc.opt, dlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kind.acquire(closing(), append(auto, tc.opt)...); !errors.Is(err, dlock.ErrClosed) {
				t.Errorf("%s, %s: err = %v, want ErrClosed", tc.what, kind.what, err)
			}
			if err := first.Refresh(ctx, time.Minute); err != nil {
				t.Errorf("%s, %s: the first Lock's hold was ended by the give-back: %v", tc.what, kind.what, err)
			}
			if err := first.Release(ctx); err != nil {
				t.Errorf("%s, %s: %v", tc.what, kind.what, err)
			}
		}
	}
}
