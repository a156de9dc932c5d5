package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// muteDriver is a tapDriver whose subscription can drop the notices of
// grants before the client sees them, as a lost connection would, and
// keep them to be passed on later, as a slow one would.
type muteDriver struct {
	*tapDriver
	mute    atomic.Bool
	dropped chan func() // gets, for each notice dropped, what passes it on
}

func (d *muteDriver) Subscribe(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	return d.tapDriver.Subscribe(ctx, func(channel, payload string) {
		if d.mute.Load() && strings.HasPrefix(payload, "\x00") {
			select {
			case d.dropped <- func() { notify(channel, payload) }:
			default: // more than the test waits for: lost for good
			}
			return
		}
		notify(channel, payload)
	})
}

func (e *env) newMuteClient(t *testing.T) (*dlock.Client, *muteDriver) {
	d := &muteDriver{tapDriver: e.newDriver(t), dropped: make(chan func(), 8)}
	c := dlock.New(d)
	t.Cleanup(func() { _ = c.Close() })
	return c, d
}

// lockWhenRefused runs c.Lock on name in the background, once the lock
// is held, and returns when its first attempt was refused (it is then
// registered as a waiter); the channel gets its outcome.
func lockWhenRefused(t *testing.T, ctx context.Context, c *dlock.Client, name string, opts ...dlock.Option) <-chan lockResult {
	t.Helper()
	return whenRefused(t, fmt.Sprintf("Lock(%q)", name), func(opts ...dlock.Option) (*dlock.Lock, error) { return c.Lock(ctx, name, opts...) }, opts...)
}

// whenRefused runs acquire (with opts) in the background and returns when
// its first attempt was refused, as lockWhenRefused does, for any kind of
// waiting acquisition; what names it in failures.
func whenRefused(t *testing.T, what string, acquire func(...dlock.Option) (*dlock.Lock, error), opts ...dlock.Option) <-chan lockResult {
	t.Helper()
	refused := make(chan struct{})
	got := make(chan lockResult, 1)
	var once sync.Once
	opts = append(opts, dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
	go func() {
		l, err := acquire(opts...)
		got <- lockResult{l, err}
	}()
	select {
	case <-refused:
	case r := <-got:
		t.Fatalf("%s returned before it waited: %v", what, r.err)
	}
	return got
}

// handedOver has c wait for name (see lockWhenRefused), releases held,
// the name's holder, and returns the Lock the waiter obtained then.
func handedOver(t *testing.T, ctx context.Context, held *dlock.Lock, c *dlock.Client, name string) *dlock.Lock {
	t.Helper()
	got := lockWhenRefused(t, ctx, c, name)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.l
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
	// Counted from the grant: the attempt's send time plus the grant's
	// elapsed time on the server, less the drift allowance, which comes
	// before the grant by the attempt's latency (a dial on a loaded
	// machine) and that allowance. Counted from the attempt, it would be
	// later (300ms) earlier still: half of that tells the two apart.
	if min := released.Add(ttl - later/2); r.l.Deadline().Before(min) {
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
			// The driver itself, which can WAIT (a tapDriver cannot).
			c := dlock.New(e.newDriver(t).Driver)
			defer c.Close()
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

// TestAClientThatDiedIsNotGranted: a client that died while it waited
// (here its registration and request written as a client leaves them,
// ahead of a live waiter, with nobody listening on its channel, as when
// its connection closed) is not granted the lock, which would then stay
// held, unheard, for its TTL. The release sees that nobody listens there,
// takes the client out of the waiter set with its request, and grants the
// lock to the live waiter behind it.
func TestAClientThatDiedIsNotGranted(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held, err := e.c.TryLock(ctx, "died", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := lockWhenRefused(t, ctx, e.newClient(t), "died", dlock.WithTTL(time.Minute))
	registerDeadAhead(t, e, "died", "dead-client",
		`["dead-request","60000","","","1","`+strconv.FormatInt(time.Now().UnixMicro(), 10)+`"]`)
	// And another ahead of that one, with no request.
	registerDeadAhead(t, e, "died", "dead-client-2", "")
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	tok := e.srv.Do(t, "HGET", "dlock:{died}", "token")
	if tok == "dead-request" || tok == "" {
		t.Fatalf("lock held with %q after the release, want it granted to the live waiter", tok)
	}
	if g := e.srv.Do(t, "HEXISTS", "dlock:{died}", "g:dead-client"); g != "0" {
		t.Error("the dead client's request is still there")
	}
	if z := e.srv.Do(t, "ZSCORE", "dlock:{died}:waiters", "dead-client-2"); z != "(nil)" {
		t.Errorf("the other dead client is still registered (score %s)", z)
	}
	l := passedOver(t, e, "died", "dead-client", got)
	if l.Token() != tok {
		t.Errorf("the waiter holds token %q, the lock %q", l.Token(), tok)
	}
	if l.Fence() <= held.Fence() {
		t.Errorf("fence %d not after the first holder's %d", l.Fence(), held.Fence())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// registerDeadAhead registers member as a waiter for name ahead of the
// first client registered there, as a client that the server heard
// listening and that then died would have left it, with request as its
// request for a grant ("" for none).
func registerDeadAhead(t *testing.T, e *env, name, member, request string) {
	t.Helper()
	set := "dlock:{" + name + "}:waiters"
	live := strings.Split(e.srv.Do(t, "ZRANGE", set, "0", "0", "WITHSCORES"), "\n")
	if len(live) != 2 {
		t.Fatalf("first waiter of %q: %q", name, live)
	}
	score, err := strconv.ParseFloat(live[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	if score == float64(int64(score)) {
		t.Fatalf("the live client's registration, %s, does not say the server heard it", live[1])
	}
	// A ms earlier, and heard too (see wake.lua).
	e.srv.Do(t, "ZADD", set, strconv.FormatFloat(score-1, 'f', -1, 64), member)
	if request != "" {
		e.srv.Do(t, "HSET", "dlock:{"+name+"}", "g:"+member, request)
	}
}

// TestAGrantToAClientNeverHeardRunsOutWithItsTTL: a client that the server
// did not see listening when it registered (its subscription on another
// node, or not yet confirmed) is never taken for dead; if it died while
// it waited, it can still be granted the lock while its registration lasts
// (here written as a client leaves it, with a whole score, and never taken
// back); the lock then runs out with the TTL it asked for, and the next
// waiter takes it.
func TestAGrantToAClientNeverHeardRunsOutWithItsTTL(t *testing.T) {
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
	if tok := e.srv.Do(t, "HGET", "dlock:{died}", "token"); tok != "dead-request" {
		t.Fatalf("lock held with %q after the release, want the dead client's request", tok)
	}
	// The grant runs out with the TTL it asked for, not the minute the
	// first holder had.
	if pttl, err := strconv.ParseInt(e.srv.Do(t, "PTTL", "dlock:{died}"), 10, 64); err != nil || pttl <= 0 || pttl > ttl.Milliseconds() {
		t.Errorf("the granted lock's PTTL is %d ms (%v), want at most the grant's TTL, %v", pttl, err, ttl)
	}
	// A bound well below the minute, only to keep a hang from lasting.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	l, err := e.newClient(t).Lock(wctx, "died", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
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

// TestAClientOnlyToldStaysRegisteredUntilItsRegistrationExpires: a
// release that only tells its next waiting client (one that left no
// request: a lock on several names, WithReplicas) leaves it registered as
// it was, in a waiter set that still expires: a client that then never
// comes back (it died unheard, its subscription hidden behind a proxy or
// on another node) is forgotten with its registration, as every key of a
// name is (docs/keys.md). The release takes the client out of the set to
// look at it and puts it back; when it was the only one there, the set
// went with it, and came back without its expiry.
func TestAClientOnlyToldStaysRegisteredUntilItsRegistrationExpires(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "told", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waiters := "dlock:{told}:waiters"
	score := strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10)
	e.srv.Do(t, "ZADD", waiters, score, "told-client")
	e.srv.Do(t, "PEXPIRE", waiters, "60000")
	e.srv.Do(t, "HSET", "dlock:{told}", "w", "1")
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{told}") {
		t.Fatalf("lock held with %q after the release, want it free", e.srv.Do(t, "HGET", "dlock:{told}", "token"))
	}
	if got := e.srv.Do(t, "ZSCORE", waiters, "told-client"); got != score {
		t.Errorf("the client told is registered with score %q after the release, want %s as before", got, score)
	}
	pttl, err := strconv.ParseInt(e.srv.Do(t, "PTTL", waiters), 10, 64)
	if err != nil || pttl <= 0 || pttl > time.Minute.Milliseconds() {
		t.Errorf("the waiter set's PTTL is %d ms (%v) after the release, want at most its registration's minute", pttl, err)
	}
}

// TestALateNoticeOfAnEarlierGrantLeavesTheNextOneAlone: the notice of a
// first grant arrives after that grant ran out, another holder came and
// went, and a second grant to the same caller was made, with a third
// caller waiting behind. The late notice is dropped, not acted on: the
// caller holds the lock by the second grant, and the third does not get
// it.
func TestALateNoticeOfAnEarlierGrantLeavesTheNextOneAlone(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "late", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waiter, d := e.newMuteClient(t)
	d.mute.Store(true)
	const ttl = 200 * time.Millisecond
	refusals := make(chan int, 64)
	got := make(chan lockResult, 1)
	go func() {
		// Bounded: a waiter that gave its grant away could wait for good.
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		// Refreshed, so that it outlasts the checks below once obtained.
		l, err := waiter.Lock(wctx, "late", dlock.WithTTL(ttl), dlock.WithAutoRefresh(), dlock.WithOnRetry(func(n int, _ error) { refusals <- n }))
		got <- lockResult{l, err}
	}()
	<-refusals
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := <-d.dropped // the first grant's notice, kept back
	other := e.newClient(t)
	between, err := other.Lock(ctx, "late", dlock.WithTTL(time.Minute)) // once the first grant ran out
	if err != nil {
		t.Fatal(err)
	}
	if n := <-refusals; n != 2 {
		t.Fatalf("refusal %d, want the waiter's second", n)
	}
	// A third caller waits behind the waiter: a grant given back would go
	// to it.
	third := e.newClient(t)
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	thirdGot := lockWhenRefused(t, tctx, third, "late", dlock.WithTTL(time.Minute))
	if err := between.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-d.dropped
	first()
	// The waiter drops the late notice and takes the lock by its next
	// attempt; a waiter that gave the second grant away on the late
	// notice would be refused instead, and then take the second notice.
	var r lockResult
	select {
	case r = <-got:
	case <-refusals:
		second()
		r = <-got
	}
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	if tok := e.srv.Do(t, "HGET", "dlock:{late}", "token"); tok != r.l.Token() {
		t.Errorf("lock held with %q, the waiter's Lock has %q", tok, r.l.Token())
	}
	cancel()
	if tr := <-thirdGot; tr.err == nil {
		t.Error("the third caller got the lock while the waiter held it")
	}
}

// TestAGrantToATokenWithQuotesAndSlashes: a request token (WithToken) with
// quotes and slashes, which JSON escapes, is granted and told as any other.
// And a caller with such a token that gives up takes its request back
// itself: here another caller of its client still waits for the name (a
// lock on several names, registered there first), so the client stays
// registered, and a request left behind would have the release grant the
// lock to the caller that gave up instead of waking the other.
func TestAGrantToATokenWithQuotesAndSlashes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "odd", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	wd := e.newDriver(t)
	waiter := dlock.New(wd)
	t.Cleanup(func() { _ = waiter.Close() })
	bctx, bcancel := context.WithTimeout(ctx, 5*time.Second)
	defer bcancel()
	other := make(chan lockResult, 1)
	refused := make(chan struct{})
	go func() {
		var once sync.Once
		l, err := waiter.LockMulti(bctx, []string{"odd-first", "odd"},
			dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
		other <- lockResult{l, err}
	}()
	<-refused
	wctx, cancel := context.WithCancel(ctx)
	gaveUp := lockWhenRefused(t, wctx, waiter, "odd", dlock.WithToken(`svc/job"1`))
	cancel()
	if r := <-gaveUp; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("waiter: %v, want context.Canceled", r.err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-other
	if r.err != nil {
		t.Fatalf("the other caller: %v (the lock is held with %q)", r.err, e.srv.Do(t, "HGET", "dlock:{odd}", "token"))
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	held, err = e.c.TryLock(ctx, "odd", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := lockWhenRefused(t, ctx, waiter, "odd", dlock.WithToken(`svc/job"2`))
	trips := wd.trips.Load()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r = <-got
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	if n := wd.trips.Load() - trips; n != 0 {
		t.Errorf("the waiter made %d round trips after the release; a grant needs none", n)
	}
	if tok := e.srv.Do(t, "HGET", "dlock:{odd}", "token"); tok != `svc/job"2` {
		t.Errorf("lock held with %q, want %q", tok, `svc/job"2`)
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAnAcquireWithoutNoticesTakesBackTheRequestLeftBefore: a caller
// whose earlier attempt asked for a grant, and whose client then lost its
// notices, obtains the lock by an attempt that does not register: that
// attempt takes the request back (it names the channel it asked with), so
// that a later release does not grant the lock to it. The scripts run as
// the client sends them, on a lock whose hash holds such a request.
func TestAnAcquireWithoutNoticesTakesBackTheRequestLeftBefore(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	scripts := map[string]*dlock.Script{}
	for _, s := range dlock.Scripts() {
		scripts[s.Name] = s
	}
	key, waiters, fence := "dlock:{quiet}", "dlock:{quiet}:waiters", "dlock:{quiet}:fence"
	e.srv.Do(t, "HSET", key, "kind", "lock", "token", "", "req", "", "owner", "", "count", "0", "meta", "", "fence", "5",
		"w", "1", "g:chan", `["req-1","60000","","","1","0"]`)
	e.srv.Do(t, "ZADD", waiters, strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10), "chan")
	acquire := &dlock.Call{Script: scripts["acquire"], Keys: []string{key, waiters, fence},
		Args: []any{"req-1", "60000", "", "", "", "", "1500", "", "chan"}}
	e.drv.Eval(ctx, acquire)
	if r, _ := acquire.Val.([]any); acquire.Err != nil || len(r) < 1 || r[0] != int64(1) {
		t.Fatalf("acquire: %v %v", acquire.Val, acquire.Err)
	}
	if e.srv.Do(t, "HEXISTS", key, "g:chan") != "0" {
		t.Error("the request is still there after its caller obtained the lock")
	}
	// A release names three keys a name, a clean-up four (its record, see
	// scripts/held.lua): a release given a clean-up's is refused, and
	// writes nothing.
	wrong := &dlock.Call{Script: scripts["release"], Keys: []string{key, waiters, fence, key + ":late"}, Args: []any{"req-1", "id-1"}}
	e.drv.Eval(ctx, wrong)
	if wrong.Err == nil || !strings.Contains(wrong.Err.Error(), "release given 4 keys") || !e.locked(t, key) {
		t.Fatalf("a release given four keys: %v %v, want refused with the lock held", wrong.Val, wrong.Err)
	}
	release := &dlock.Call{Script: scripts["release"], Keys: []string{key, waiters, fence}, Args: []any{"req-1", "id-1"}}
	e.drv.Eval(ctx, release)
	if release.Err != nil {
		t.Fatal(release.Err)
	}
	if e.locked(t, key) {
		t.Errorf("the release granted the lock to %q", e.srv.Do(t, "HGET", key, "token"))
	}
}

// lateDriver sends a Lock's first acquire late, so that its reply comes
// after its validity, and runs clean-ups (releases without an id) a while
// after reporting their replies lost, as a slow connection would.
type lateDriver struct {
	*tapDriver
	sendLate, runLate time.Duration
	sent              atomic.Bool
	wg                sync.WaitGroup
}

func (d *lateDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	for _, c := range calls {
		switch {
		case c.Script.Name == "acquire" && d.sent.CompareAndSwap(false, true):
			time.Sleep(d.sendLate)
		case c.Script.Name == "release" && len(c.Args) > 1 && c.Args[1] == "":
			late := &dlock.Call{Script: c.Script, Keys: c.Keys, Args: c.Args}
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				time.Sleep(d.runLate)
				d.tapDriver.Eval(context.Background(), late)
			}()
			c.Val, c.Err = nil, errLostReply
			return
		}
	}
	d.tapDriver.Eval(ctx, calls...)
}

// TestAWaiterWhoseGrantCameLateTakesItAgainWithoutGivingItBack: a waiting
// caller's attempt obtains the lock, but its reply comes after its
// validity. The caller does not give the lock back (a release sent then
// could run after its next attempt took the lock again, and free it under
// it); its next attempt, at once, takes it again with a fresh deadline.
func TestAWaiterWhoseGrantCameLateTakesItAgainWithoutGivingItBack(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const ttl = time.Second
	d := &lateDriver{tapDriver: e.newDriver(t), sendLate: ttl, runLate: ttl}
	c := dlock.New(d)
	t.Cleanup(func() { _ = c.Close() })
	t.Cleanup(d.wg.Wait)
	l, err := c.Lock(ctx, "slow", dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	d.wg.Wait() // a clean-up, had one been sent, has run
	if tok := e.srv.Do(t, "HGET", "dlock:{slow}", "token"); tok != l.Token() {
		t.Fatalf("lock held with %q, the caller's Lock has %q (deadline in %v)", tok, l.Token(), time.Until(l.Deadline()))
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAGrantToALockThatEndedIsGivenBack: an attempt of a Lock that has
// since been released runs late (as one held up on a slow connection, or
// sent again by the client library, would) and leaves its request; the
// next release grants the lock to it. No caller waits with that request
// token any more, and the client gives the lock back instead of leaving it
// held by nobody for its TTL.
func TestAGrantToALockThatEndedIsGivenBack(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "ended", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waiter := e.newClient(t)
	ended := handedOver(t, ctx, held, waiter, "ended")
	if err := ended.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The late attempt, while another holds the lock.
	if held, err = e.c.TryLock(ctx, "ended", dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	member := dlock.Member(waiter)
	e.srv.Do(t, "ZADD", "dlock:{ended}:waiters", strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10), member)
	e.srv.Do(t, "HSET", "dlock:{ended}", "g:"+member,
		`["`+ended.Token()+`","60000","","","1","`+strconv.FormatInt(time.Now().UnixMicro(), 10)+`"]`)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); e.locked(t, "dlock:{ended}"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the lock granted to a released Lock's request is still held with %q", e.srv.Do(t, "HGET", "dlock:{ended}", "token"))
		}
	}
}

// A Lock numbers its attempts from a random start: the notice of a grant
// to another Lock's attempt with the same token (WithToken), here forged
// as an earlier Lock's first attempt would have it, names none of its own,
// and is not taken for its grant.
func TestAGrantToAnotherLockOfTheSameTokenIsNotTaken(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "same-token", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waiter := e.newClient(t)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got := lockWhenRefused(t, wctx, waiter, "same-token", dlock.WithToken("T"), dlock.WithTTL(5*time.Second))
	key := "dlock:{same-token}"
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "HEXISTS", key, "g:"+dlock.Member(waiter)) == "1" })
	handled := make(chan struct{}, 3)
	dlock.OnNotice(waiter, func() { handled <- struct{}{} })
	for attempt := 1; attempt <= 3; attempt++ {
		notice := fmt.Sprintf("\x00%d 1 0 1 T%s", attempt, key)
		e.srv.Do(t, "PUBLISH", dlock.Member(waiter), notice)
	}
	for range 3 {
		<-handled
	}
	// A Lock that took a notice for its grant returns within a
	// scheduling delay.
	select {
	case r := <-got:
		t.Fatalf("Lock returned on another Lock's grant notice: %v (the server holds it with %q)", r.err, e.srv.Do(t, "HGET", key, "token"))
	case <-time.After(300 * time.Millisecond):
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if tok := e.srv.Do(t, "HGET", key, "token"); tok != "T" {
		t.Errorf("the waiter obtained the lock, but the server holds it with %q", tok)
	}
	_ = r.l.Release(ctx)
}

// TestALateNoticeOfAGrantALockTookIsNotGivenBack: the notice of a grant
// comes after the Lock it was for took the hold by an attempt of its own,
// and after that Lock ended; meanwhile another Lock of the same token
// (WithToken) holds the name. The notice is not taken for a grant nobody
// claimed: giving it back would free the hold under that other Lock. A
// notice of a later grant, which no Lock took, is still given back, if its
// hold is still there.
func TestALateNoticeOfAGrantALockTookIsNotGivenBack(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const key = "dlock:{took}"
	held, err := e.c.TryLock(ctx, "took", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waiter := e.newClient(t)
	got := lockWhenRefused(t, ctx, waiter, "took", dlock.WithToken("T"), dlock.WithTTL(time.Minute))
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	first := r.l.Fence()
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := waiter.TryLock(ctx, "took", dlock.WithToken("T"), dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan struct{}, 3)
	dlock.OnNotice(waiter, func() { handled <- struct{}{} })
	// The first grant's notice again, late; then that of the hold the
	// second Lock has, as if a grant had made it and the Lock had taken it
	// before its notice came.
	for _, fence := range []uint64{first, again.Fence()} {
		e.srv.Do(t, "PUBLISH", dlock.Member(waiter), fmt.Sprintf("\x00%d %d 0 1 T%s", 1, fence, key))
	}
	// A notice of a grant that no Lock took: given back, but only if that
	// hold is still there, which it is not: the name stays with the
	// second Lock.
	e.srv.Do(t, "PUBLISH", dlock.Member(waiter), fmt.Sprintf("\x00%d %d 0 1 T%s", 1, again.Fence()+1, key))
	for range 3 {
		<-handled
	}
	dlock.GivenBack(waiter)
	if !e.locked(t, key) {
		t.Fatal("a late grant notice freed the hold of another Lock of the same token")
	}
	if err := again.Release(ctx); err != nil {
		t.Fatalf("the second Lock's Release: %v", err)
	}
}
