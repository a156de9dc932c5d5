package dlock_test

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
)

// muteDriver is a tapDriver whose subscription can drop the notices of
// grants before the client sees them, as a lost connection would.
type muteDriver struct {
	*tapDriver
	mute    atomic.Bool
	dropped chan struct{} // gets a value for each notice dropped
}

func (d *muteDriver) Subscribe(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	return d.tapDriver.Subscribe(ctx, func(channel, payload string) {
		if d.mute.Load() && strings.HasPrefix(payload, "\x00") {
			d.dropped <- struct{}{}
			return
		}
		notify(channel, payload)
	})
}

func (e *env) newMuteClient(t *testing.T) (*dlock.Client, *muteDriver) {
	d := &muteDriver{tapDriver: e.newDriver(t), dropped: make(chan struct{}, 8)}
	c := dlock.New(d)
	t.Cleanup(func() { _ = c.Close() })
	return c, d
}

// lockWhenRefused runs c.Lock on name in the background, once the lock
// is held, and returns when its first attempt was refused (it is then
// registered as a waiter); the channel gets its outcome.
func lockWhenRefused(t *testing.T, ctx context.Context, c *dlock.Client, name string, opts ...dlock.Option) <-chan lockResult {
	t.Helper()
	refused := make(chan struct{})
	got := make(chan lockResult, 1)
	var once sync.Once
	opts = append(opts, dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
	go func() {
		l, err := c.Lock(ctx, name, opts...)
		got <- lockResult{l, err}
	}()
	select {
	case <-refused:
	case r := <-got:
		t.Fatalf("Lock(%q) returned before it waited: %v", name, r.err)
	}
	return got
}

type lockResult struct {
	l   *dlock.Lock
	err error
}

// TestAReleaseGrantsTheLockToTheNextWaiter: the waiter's Lock returns with
// no round trip after the release: the release handed it the lock, with a
// fence after the holder's, and a deadline that comes before the server's
// expiry.
func TestAReleaseGrantsTheLockToTheNextWaiter(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "handoff", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	wd := e.newDriver(t)
	waiter := dlock.New(wd)
	t.Cleanup(func() { _ = waiter.Close() })
	got := lockWhenRefused(t, ctx, waiter, "handoff", dlock.WithTTL(5*time.Second))
	if e.srv.Do(t, "HEXISTS", "dlock:{handoff}", "g:"+dlock.Member(waiter)) != "1" {
		t.Fatal("the refused attempt left no request for a grant")
	}
	trips := wd.trips.Load()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	if n := wd.trips.Load() - trips; n != 0 {
		t.Errorf("the waiter made %d round trips after the release; a grant needs none", n)
	}
	if tok := e.srv.Do(t, "HGET", "dlock:{handoff}", "token"); tok != r.l.Token() {
		t.Errorf("lock held with %q, the waiter's Lock has %q", tok, r.l.Token())
	}
	if r.l.Fence() <= held.Fence() {
		t.Errorf("granted fence %d, not after the holder's %d", r.l.Fence(), held.Fence())
	}
	pttl, _ := time.ParseDuration(e.srv.Do(t, "PTTL", "dlock:{handoff}") + "ms")
	if expiry := time.Now().Add(pttl); r.l.Deadline().After(expiry) {
		t.Errorf("deadline %v after the server's expiry %v", r.l.Deadline(), expiry)
	}
	if e.srv.Do(t, "HEXISTS", "dlock:{handoff}", "g:"+dlock.Member(waiter)) != "0" {
		t.Error("the grant left the request behind")
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{handoff}") {
		t.Error("the granted lock is still held after its Release")
	}
}

// TestAGrantCountsItsTTLFromTheGrant: a grant that comes well after the
// waiter's attempt gives it the TTL from about the grant, not from the
// attempt, and still no later than the server's expiry.
func TestAGrantCountsItsTTLFromTheGrant(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "late-grant", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	const ttl, later = time.Second, 300 * time.Millisecond
	// No attempt between the first and the grant: no wait beat within
	// later, and a notice that is the only way in.
	got := lockWhenRefused(t, ctx, e.newClient(t), "late-grant", dlock.WithTTL(ttl))
	registered := time.Now()
	time.Sleep(later) // the grant is to come this long after the attempt
	released := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	pttl, _ := time.ParseDuration(e.srv.Do(t, "PTTL", "dlock:{late-grant}") + "ms")
	if expiry := time.Now().Add(pttl); r.l.Deadline().After(expiry) {
		t.Errorf("deadline %v after the server's expiry %v", r.l.Deadline(), expiry)
	}
	if min := released.Add(ttl - ttl/50 - 2*time.Millisecond - later/50); r.l.Deadline().Before(min) {
		t.Errorf("deadline %v before %v: counted from the attempt %v before the grant, not from the grant", r.l.Deadline(), min, released.Sub(registered))
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// grantUnheard has a caller of a new client wait, on ctx, for the lock
// called name, held by another, and has the release grant it the lock with
// the notice lost on the way; the channel gets the caller's outcome.
func grantUnheard(t *testing.T, e *env, ctx context.Context, name string, opts ...dlock.Option) (*dlock.Client, <-chan lockResult) {
	t.Helper()
	held, err := e.c.TryLock(context.Background(), name, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waiter, d := e.newMuteClient(t)
	d.mute.Store(true)
	got := lockWhenRefused(t, ctx, waiter, name, opts...)
	if err := held.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-d.dropped
	return waiter, got
}

// TestAGrantWhoseNoticeIsLostIsTakenByTheNextAttempt: the notice of the
// grant never arrives; the waiter's next attempt, at its wait beat, finds
// the lock held with its own request token and takes it.
func TestAGrantWhoseNoticeIsLostIsTakenByTheNextAttempt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	_, got := grantUnheard(t, e, ctx, "lost-grant", dlock.WithTTL(5*time.Second))
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	if tok := e.srv.Do(t, "HGET", "dlock:{lost-grant}", "token"); tok != r.l.Token() {
		t.Errorf("lock held with %q, the waiter's Lock has %q", tok, r.l.Token())
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAWaiterThatGivesUpGivesBackItsGrant: the waiter's context ends after
// the release granted it the lock and before it heard so; the lock does
// not stay held by a caller that gave up.
func TestAWaiterThatGivesUpGivesBackItsGrant(t *testing.T) {
	e := newEnv(t)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiter, got := grantUnheard(t, e, wctx, "given-up", dlock.WithTTL(time.Minute))
	if !e.locked(t, "dlock:{given-up}") {
		t.Fatal("the release granted no one the lock")
	}
	cancel()
	if r := <-got; !errors.Is(r.err, dlock.ErrNotObtained) || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("waiter: %v, want ErrNotObtained and context.Canceled", r.err)
	}
	if e.locked(t, "dlock:{given-up}") {
		t.Error("the grant of a caller that gave up is still held")
	}
	if e.srv.Do(t, "HEXISTS", "dlock:{given-up}", "g:"+dlock.Member(waiter)) != "0" {
		t.Error("the request of a caller that gave up is still there")
	}
}

// TestAWaiterThatGivesUpTakesBackItsRequest: a caller that gives up before
// any release takes back the request it left, so that no later release
// grants the lock to it.
func TestAWaiterThatGivesUpTakesBackItsRequest(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "request", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waiter := e.newClient(t)
	wctx, cancel := context.WithCancel(ctx)
	got := lockWhenRefused(t, wctx, waiter, "request")
	cancel()
	if r := <-got; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("waiter: %v, want context.Canceled", r.err)
	}
	if e.srv.Do(t, "HEXISTS", "dlock:{request}", "g:"+dlock.Member(waiter)) != "0" {
		t.Error("the request of a caller that gave up is still there")
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{request}") {
		t.Error("the release granted the lock to a caller that gave up")
	}
}

// TestOnlyOneNameWaitersAskForAGrant: a lock on several names and one
// confirmed on replicas are only woken: they leave no request.
func TestOnlyOneNameWaitersAskForAGrant(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.c.TryLock(ctx, "ask", dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		lock func(ctx context.Context, c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error)
	}{
		{"several names", func(ctx context.Context, c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error) {
			return c.LockMulti(ctx, []string{"ask", "other"}, opts...)
		}},
		{"replicas", func(ctx context.Context, c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error) {
			return c.Lock(ctx, "ask", append(opts, dlock.WithReplicas(1, time.Second))...)
		}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			c := e.newClient(t)
			wctx, cancel := context.WithCancel(ctx)
			refused := make(chan struct{})
			got := make(chan error, 1)
			go func() {
				var once sync.Once
				_, err := tc.lock(wctx, c, dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
				got <- err
			}()
			select {
			case <-refused:
			case err := <-got:
				t.Fatalf("returned before it waited: %v", err)
			}
			if e.srv.Do(t, "HEXISTS", "dlock:{ask}", "g:"+dlock.Member(c)) != "0" {
				t.Error("the waiter left a request for a grant")
			}
			cancel()
			<-got
		})
	}
}

// TestAGrantToAClientThatDiedRunsOutWithItsTTL: a client that died while
// it waited can still be granted the lock while its registration lasts
// (here written as a client leaves it, and never taken back); the lock
// then runs out with the TTL it asked for, and the next waiter takes it.
func TestAGrantToAClientThatDiedRunsOutWithItsTTL(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "died", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ttl := 2 * time.Second
	e.srv.Do(t, "ZADD", "dlock:{died}:waiters", strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10), "dead-client")
	e.srv.Do(t, "HSET", "dlock:{died}", "w", "1", "g:dead-client",
		`["dead-request","`+strconv.FormatInt(ttl.Milliseconds(), 10)+`","","","1","`+strconv.FormatInt(time.Now().UnixMicro(), 10)+`"]`)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if tok := e.srv.Do(t, "HGET", "dlock:{died}", "token"); tok != "dead-request" {
		t.Fatalf("lock held with %q after the release, want the dead client's request", tok)
	}
	l, err := e.newClient(t).Lock(ctx, "died", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited > ttl+time.Second {
		t.Errorf("the next waiter took the lock after %v, more than the grant's TTL %v and a second", waited, ttl)
	}
	if l.Fence() <= held.Fence() {
		t.Errorf("fence %d not after the first holder's %d", l.Fence(), held.Fence())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestARequestThatDoesNotReadIsNotGranted: a waiter's request field that
// holds something else (here a TTL that is no number) is not granted; the
// lock is freed and the waiter only told.
func TestARequestThatDoesNotReadIsNotGranted(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "junk", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "ZADD", "dlock:{junk}:waiters", strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10), "junk-client")
	e.srv.Do(t, "HSET", "dlock:{junk}", "w", "1", "g:junk-client", `["junk-request","soon","","","1","0"]`)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{junk}") {
		t.Fatalf("lock held with %q after the release, want it free", e.srv.Do(t, "HGET", "dlock:{junk}", "token"))
	}
	if pttl := e.srv.Do(t, "PTTL", "dlock:{junk}"); pttl == "-1" {
		t.Error("the freed hash has no TTL")
	}
}
