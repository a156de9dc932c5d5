package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// awaitWaiting waits until n callers of c wait for name.
func awaitWaiting(t *testing.T, c *dlock.Client, name string, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); dlock.Waiting(c, name) != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d callers waiting for %q, want %d", dlock.Waiting(c, name), name, n)
		}
	}
}

// TestReleaseWakesTheWaiter: the holder keeps its lock for a minute and the
// waiter's retry strategy would not retry for an hour; the waiter's
// context ends before its periodic wake-up, so only the release's notice
// can let it in.
func TestReleaseWakesTheWaiter(t *testing.T) {
	e := newEnv(t)
	held, err := e.c.TryLock(context.Background(), "notice", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waiter := e.newClient(t)
	err = wokenByRelease(t, held, func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
		return waiter.Lock(ctx, "notice", opts...)
	})
	if err != nil {
		t.Fatalf("waiter not woken by the release: %v", err)
	}
}

// TestReleaseOfAnyNameWakesAMultiKeyWaiter: as TestReleaseWakesTheWaiter,
// for a lock on two names of which the second is held: the waiter queues
// by the first name and registers at the second, whose release wakes it.
func TestReleaseOfAnyNameWakesAMultiKeyWaiter(t *testing.T) {
	e := newEnv(t)
	held, err := e.c.TryLock(context.Background(), "second", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waiter := e.newClient(t)
	err = wokenByRelease(t, held, func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
		return waiter.LockMulti(ctx, []string{"first", "second"}, opts...)
	})
	if err != nil {
		t.Fatalf("waiter not woken by the release of its second name: %v", err)
	}
}

// wokenByRelease runs lock in the background with a retry strategy that
// would not retry for an hour and a context that ends before the periodic
// wake-up, releases held once lock's first attempt was refused, and
// returns lock's error (or its Release's): nil only if the release's
// notice woke it.
func wokenByRelease(t *testing.T, held *dlock.Lock, lock func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error)) error {
	t.Helper()
	ctx := context.Background()
	registered := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		// The wait ends 0.8 of the beat after its last refusal (the first
		// may come late on a loaded machine: a new client dials).
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		end := time.AfterFunc(time.Hour, cancel)
		defer end.Stop()
		var once sync.Once
		l, err := lock(wctx, dlock.WithRetry(dlock.ConstantBackoff(time.Hour)),
			dlock.WithOnRetry(func(int, error) {
				end.Reset(dlock.WaitBeat * 8 / 10)
				once.Do(func() { close(registered) })
			}))
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	<-registered
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return <-got
}

// TestAMultiKeyWaiterThatGivesUpLeavesTheWaiterSet: a waiter for two names
// registered at the held one takes its registration back when it gives up.
func TestAMultiKeyWaiterThatGivesUpLeavesTheWaiterSet(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.c.TryLock(ctx, "taken", dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	wctx, giveUp, cancel := untilRefused(ctx)
	defer cancel()
	if _, err := e.newClient(t).LockMulti(wctx, []string{"free", "taken"}, giveUp); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("err = %v, want ErrNotObtained", err)
	}
	if got := e.srv.Do(t, "ZCARD", "dlock:{taken}:waiters"); got != "0" {
		t.Errorf("%s clients registered after the only waiter gave up, want 0", got)
	}
	if e.locked(t, "dlock:{free}") {
		t.Error("the free name was left taken")
	}
}

// TestAWaiterWhoseOnlyAttemptWasCutShortLeavesTheWaiterSet: the first
// attempt of a waiter registers its client, but the reply is lost as the
// wait ends. The client is registered all the same, and the waiter, giving
// up, takes the registration back: else the next release would tell that
// client, which nobody waits in, instead of the next waiting one.
func TestAWaiterWhoseOnlyAttemptWasCutShortLeavesTheWaiterSet(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	kinds := []struct {
		name string
		take func(c *dlock.Client, ctx context.Context, name string) (*dlock.Lock, error)
		wait func(c *dlock.Client, ctx context.Context, name string) (*dlock.Lock, error)
	}{
		{"lock",
			func(c *dlock.Client, ctx context.Context, name string) (*dlock.Lock, error) {
				return c.TryLock(ctx, name, dlock.WithTTL(time.Minute))
			},
			func(c *dlock.Client, ctx context.Context, name string) (*dlock.Lock, error) {
				return c.Lock(ctx, name)
			}},
		{"semaphore",
			func(c *dlock.Client, ctx context.Context, name string) (*dlock.Lock, error) {
				return c.Semaphore(name, 1).TryAcquire(ctx, dlock.WithTTL(time.Minute))
			},
			func(c *dlock.Client, ctx context.Context, name string) (*dlock.Lock, error) {
				return c.Semaphore(name, 1).Acquire(ctx)
			}},
		{"rwmutex",
			func(c *dlock.Client, ctx context.Context, name string) (*dlock.Lock, error) {
				return c.RWMutex(name).TryLock(ctx, dlock.WithTTL(time.Minute))
			},
			func(c *dlock.Client, ctx context.Context, name string) (*dlock.Lock, error) {
				return c.RWMutex(name).RLock(ctx)
			}},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			name := "cut-" + k.name
			if _, err := k.take(e.c, ctx, name); err != nil {
				t.Fatal(err)
			}
			d := e.newDriver(t)
			c := dlock.New(d)
			defer c.Close()
			if err := c.Prepare(ctx); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			d.loseReplyThen(cancel)
			if _, err := k.wait(c, wctx, name); !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			if got := e.srv.Do(t, "ZCARD", "dlock:{"+name+"}:waiters"); got != "0" {
				t.Errorf("%s clients registered after the only waiter gave up, want 0", got)
			}
		})
	}
}

// TestAnAttemptThatObtainsALockLeavesTheWaiterSetToTheCallerBehindIt: two
// callers of one client wait for an exclusive lock whose holder's TTL runs
// out; the first one's attempt at that expiry obtains it. It takes the
// client out of the waiter set, as a grant does, rather than registering it
// again for the second: the second tries as soon as the first leaves the
// line, and its attempt, refused, registers the client and asks for the
// lock, which the first one's release grants it. Registered again, the
// client would be told at that release that the lock may be free, while
// the second's attempt was already under way, or done.
func TestAnAttemptThatObtainsALockLeavesTheWaiterSetToTheCallerBehindIt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const name, key, waiters = "behind", "dlock:{behind}", "dlock:{behind}:waiters"
	if _, err := e.c.TryLock(ctx, name, dlock.WithTTL(time.Second)); err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	var firstReq atomic.Value
	held, proceed := make(chan struct{}), make(chan struct{})
	d := &hookDriver{Driver: e.newDriver(t), before: func(calls []*dlock.Call) {
		for _, c := range calls {
			if c.Script.Name != "acquire" || !armed.Load() {
				continue
			}
			// The attempts once armed are the first caller's, then the
			// second's (another request token), which waits until the
			// waiter set has been looked at.
			req, _ := c.Args[0].(string)
			if firstReq.CompareAndSwap(nil, req) || firstReq.Load() == req {
				continue
			}
			close(held)
			<-proceed
		}
	}}
	c := dlock.New(d)
	defer c.Close()
	first, second := make(chan *dlock.Lock, 1), make(chan *dlock.Lock, 1)
	lock := func(got chan<- *dlock.Lock) {
		l, err := c.Lock(ctx, name, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Error(err)
		}
		got <- l
	}
	go lock(first)
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", waiters) == "1" })
	go lock(second)
	awaitCond(t, 5*time.Second, func() bool { return dlock.Waiting(c, name) == 2 })
	armed.Store(true)
	l1 := <-first // its attempt at the holder's expiry
	if l1 == nil {
		t.FailNow()
	}
	<-held // the second caller's attempt is under way, not yet sent
	if got := e.srv.Do(t, "ZCARD", waiters); got != "0" {
		t.Errorf("%s clients registered once the first caller obtained the lock, want 0", got)
	}
	close(proceed)
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", waiters) == "1" })
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-second
	if l2 == nil {
		t.FailNow()
	}
	if got := e.srv.Do(t, "HGET", key, "token"); got != l2.Token() {
		t.Errorf("the lock is held with %q, want the second caller's %q", got, l2.Token())
	}
	if err := l2.Release(ctx); err != nil {
		t.Error(err)
	}
	if got := e.srv.Do(t, "ZCARD", waiters); got != "0" {
		t.Errorf("%s clients registered once both callers were served, want 0", got)
	}
}

// TestAClientRegisteredAgainForCallersThatGaveUpLeaves: the attempt that
// obtains a permit registers its client again for the client's next
// caller; when that caller gives up while the attempt runs, the client
// leaves the waiter set all the same: else the next release would tell it,
// where nobody waits, instead of the next waiting client.
func TestAClientRegisteredAgainForCallersThatGaveUpLeaves(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const name, waiters = "rejoined", "dlock:{rejoined}:waiters"
	held, err := e.c.Semaphore(name, 1).TryAcquire(ctx, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	entered, proceed := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	d := &hookDriver{Driver: e.newDriver(t), before: func(calls []*dlock.Call) {
		for _, c := range calls {
			// An attempt that says that more callers of the client wait.
			if c.Script.Name == "sem_acquire" && len(c.Args) > 5 && c.Args[5] == "1" && armed.CompareAndSwap(true, false) {
				close(entered)
				<-proceed
			}
		}
	}}
	c := dlock.New(d)
	defer c.Close()
	sem := c.Semaphore(name, 1)
	first := make(chan *dlock.Lock, 1)
	go func() {
		l, err := sem.Acquire(ctx, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Error(err)
		}
		first <- l
	}()
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", waiters) == "1" })
	sctx, giveUp := context.WithCancel(ctx)
	second := make(chan error, 1)
	go func() {
		_, err := sem.Acquire(sctx)
		second <- err
	}()
	awaitCond(t, 5*time.Second, func() bool { return dlock.Waiting(c, name) == 2 })
	armed.Store(true)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-entered // the first caller's attempt, for the second too, is under way
	giveUp()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Errorf("the second caller: err = %v, want context.Canceled", err)
	}
	close(proceed)
	l := <-first
	if l == nil {
		t.FailNow()
	}
	defer l.Release(ctx)
	if got := e.srv.Do(t, "ZCARD", waiters); got != "0" {
		t.Errorf("%s clients registered once the only caller still waiting gave up, want 0", got)
	}
}

// TestAGivingUpWaiterKeepsTheRegistrationOthersUse: two callers of one
// client wait, one for two names, one for one of them; the client is
// registered once, at the held name. When the first gives up, the
// registration stays for the second, whom the release then wakes.
func TestAGivingUpWaiterKeepsTheRegistrationOthersUse(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "shared", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c := e.newClient(t)
	single := make(chan error, 1)
	go func() {
		l, err := c.Lock(ctx, "shared")
		if err == nil {
			err = l.Release(ctx)
		}
		single <- err
	}()
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", "dlock:{shared}:waiters") == "1" })
	wctx, giveUp, cancel := untilRefused(ctx)
	defer cancel()
	if _, err := c.LockMulti(wctx, []string{"other", "shared"}, giveUp); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("LockMulti: err = %v, want ErrNotObtained", err)
	}
	if got := e.srv.Do(t, "ZCARD", "dlock:{shared}:waiters"); got != "1" {
		t.Errorf("%s registrations left after one of two callers gave up, want 1", got)
	}
	e.srv.Do(t, "CONFIG", "RESETSTAT")
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-single; err != nil {
		t.Fatalf("the caller still waiting: %v", err)
	}
	if n := commandCalls(t, e, "publish"); n < 1 {
		t.Error("the release sent no notice to the caller still waiting")
	}
}

// TestCallersOfOneClientQueueInOrder: 12 callers of one client wait for a
// lock in turn; they obtain it in the order they came, and only the first
// in line makes attempts, so the round trips stay near three per
// acquisition (an attempt that wins, the release, and the next caller's
// attempt that registers).
func TestCallersOfOneClientQueueInOrder(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder := e.newClient(t)
	held, err := holder.TryLock(ctx, "queue", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	const callers = 12
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	before := e.drv.trips.Load()
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := e.c.Lock(ctx, "queue")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := l.Release(ctx); err != nil {
				t.Error(err)
			}
		}()
		awaitWaiting(t, e.c, "queue", i+1)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("callers obtained the lock in the order %v", order)
		}
	}
	trips := e.drv.trips.Load() - before
	t.Logf("%d round trips for %d acquisitions", trips, callers)
	if trips > 4*callers {
		t.Errorf("%d round trips for %d acquisitions: callers behind the first made attempts", trips, callers)
	}
}

// TestReleaseWakesOneClient: eight clients wait for one lock; each release
// wakes one of them, so the whole hand-off costs a few requests per
// acquisition whatever the number of waiting clients.
func TestReleaseWakesOneClient(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, err := e.c.TryLock(ctx, "herd", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	const clients = 8
	var wg sync.WaitGroup
	for range clients {
		c := e.newClient(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Lock(ctx, "herd")
			if err != nil {
				t.Error(err)
				return
			}
			if err := l.Release(ctx); err != nil {
				t.Error(err)
			}
		}()
		awaitWaiting(t, c, "herd", 1)
	}
	// Every client has made its attempt and registered; from here on, count.
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", "dlock:{herd}:waiters") == "8" })
	e.srv.Do(t, "CONFIG", "RESETSTAT")
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	requests := commandCalls(t, e, "evalsha") + commandCalls(t, e, "eval")
	t.Logf("%d requests for %d hand-offs", requests, clients)
	if requests > 3*clients {
		t.Errorf("%d requests for %d hand-offs: releases woke more than one client", requests, clients)
	}
}

// TestAWaiterThatGivesUpPassesTheNoticeOn: the first registered client
// gives up; the release must then wake the next one.
func TestAWaiterThatGivesUpPassesTheNoticeOn(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "baton", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	quitter := e.newClient(t)
	qctx, quit := context.WithCancel(ctx)
	quitErr := make(chan error, 1)
	go func() {
		_, err := quitter.Lock(qctx, "baton")
		quitErr <- err
	}()
	awaitWaiting(t, quitter, "baton", 1)
	got := lockAndRelease(e.newClient(t), "baton", 4*time.Second)
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", "dlock:{baton}:waiters") == "2" })
	quit()
	if err := <-quitErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("quitter: %v", err)
	}
	if got := e.srv.Do(t, "ZCARD", "dlock:{baton}:waiters"); got != "1" {
		t.Errorf("%s clients registered after one gave up, want 1", got)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestADeadWaiterDoesNotStallTheLock: the client registered first died
// (nobody listens on its channel now, where the server saw it listen when
// it registered) and left no request; the release tells it in vain, sees
// that nobody heard, takes it out of the waiter set and grants the lock to
// the live client behind it. A semaphore's release skips it the same way
// and tells the live client. One the server never heard is not taken for
// dead: the live client gets in by its periodic wake-up. Throughout, a
// client subscribed to the pattern "*" (as a monitoring tool's pub/sub view
// is) hears every notice, so that a notice to the dead client reaches
// somebody: the release asks the server who listens on the client's own
// channel instead.
func TestADeadWaiterDoesNotStallTheLock(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	monitor := redis.NewClient(&redis.Options{Addr: e.srv.Addr()})
	defer monitor.Close()
	everything := monitor.PSubscribe(ctx, "*")
	defer everything.Close()
	if _, err := everything.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	t.Run("lock", func(t *testing.T) {
		held, err := e.c.TryLock(ctx, "ghost", dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		got := lockWhenRefused(t, ctx, e.newClient(t), "ghost", dlock.WithTTL(time.Minute))
		registerDeadAhead(t, e, "ghost", "dlock:client:dead", "")
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if tok := e.srv.Do(t, "HGET", "dlock:{ghost}", "token"); tok == "" {
			t.Error("the lock is free after the release, want it granted to the live waiter")
		}
		if err := passedOver(t, e, "ghost", "dlock:client:dead", got).Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("never heard", func(t *testing.T) {
		// Registered with a whole score: the server did not see it listen
		// (its subscription elsewhere, say), so it is not taken for dead. The
		// release tells it in vain, and the live client gets in at its
		// periodic wake-up.
		held, err := e.c.TryLock(ctx, "ghost-unheard", dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		got := lockWhenRefused(t, ctx, e.newClient(t), "ghost-unheard", dlock.WithTTL(time.Minute))
		e.srv.Do(t, "ZADD", "dlock:{ghost-unheard}:waiters", "NX", strconv.FormatInt(time.Now().Add(time.Second).UnixMilli(), 10), "dlock:client:dead")
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if tok := e.srv.Do(t, "HGET", "dlock:{ghost-unheard}", "token"); tok != "" {
			t.Errorf("the lock is held with %q after the release, want it free", tok)
		}
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		if err := r.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("semaphore", func(t *testing.T) {
		held, err := e.c.Semaphore("ghost-sem", 1).TryAcquire(ctx, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		sem := e.newClient(t).Semaphore("ghost-sem", 1)
		got := whenRefused(t, "Acquire", func(opts ...dlock.Option) (*dlock.Lock, error) {
			return sem.Acquire(ctx, opts...)
		}, dlock.WithTTL(time.Minute))
		live := strings.Split(e.srv.Do(t, "ZRANGE", "dlock:{ghost-sem}:waiters", "0", "0"), "\n")[0]
		// Listen on the live client's channel too, to see it told.
		rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr()})
		defer rdb.Close()
		ps := rdb.Subscribe(ctx, live)
		defer ps.Close()
		if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
			t.Fatal(err)
		}
		registerDeadAhead(t, e, "ghost-sem", "dlock:client:dead", "")
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// (go-redis's ReceiveMessage would not end with ctx.)
		msg, err := ps.ReceiveTimeout(ctx, 5*time.Second)
		if err != nil {
			t.Fatalf("the live client was not told: %v", err)
		}
		if m, ok := msg.(*redis.Message); !ok || m.Payload != "dlock:{ghost-sem}" {
			t.Errorf("the live client was told %v", msg)
		}
		if err := passedOver(t, e, "ghost-sem", "dlock:client:dead", got).Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// passedOver checks that the waiting client member, which died, left the
// waiter set of name, and returns the lock that the live waiter behind it
// got.
func passedOver(t *testing.T, e *env, name, member string, got <-chan lockResult) *dlock.Lock {
	t.Helper()
	if z := e.srv.Do(t, "ZSCORE", "dlock:{"+name+"}:waiters", member); z != "(nil)" {
		t.Errorf("the dead client is still registered (score %s)", z)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.l
}

// noSubscribe is a driver without pub/sub.
type noSubscribe struct{ dlock.Driver }

func (noSubscribe) Subscribe(context.Context, func(string, string)) (dlock.Subscription, error) {
	return nil, dlock.ErrUnsupported
}

func TestWaitingWithoutPubSubPolls(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := dlock.New(noSubscribe{e.newDriver(t)})
	defer c.Close()
	held, err := e.c.TryLock(ctx, "poll", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var once sync.Once
	failed := make(chan struct{})
	go func() {
		l, err := c.Lock(ctx, "poll", dlock.WithRetry(dlock.ConstantBackoff(2*time.Millisecond)),
			dlock.WithOnRetry(func(int, error) { once.Do(func() { close(failed) }) }))
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	<-failed
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if n := e.srv.Do(t, "EXISTS", "dlock:{poll}:waiters"); n != "0" {
		t.Error("a client without pub/sub registered as a waiter")
	}
}

// TestAReleaseWithNoWaiterLeftReadsNoClock: a lock once waited for keeps
// the mark that sends its releases to the waiter set; once nobody waits
// there, a release finds the set empty (one ZPOPMIN) and frees the lock
// without reading the server's clock, which only a waiter found needs.
func TestAReleaseWithNoWaiterLeftReadsNoClock(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "waited")
	if err != nil {
		t.Fatal(err)
	}
	waiter := e.newClient(t)
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Lock(ctx, "waited")
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", "dlock:{waited}:waiters") == "1" })
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if e.srv.Do(t, "HGET", "dlock:{waited}", "w") != "1" {
		t.Fatal("the lock lost the mark of its waiters")
	}
	l, err := e.c.TryLock(ctx, "waited")
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "CONFIG", "RESETSTAT")
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{waited}") {
		t.Error("the lock is still held after its release")
	}
	if n := commandCalls(t, e, "zpopmin"); n != 1 {
		t.Errorf("the release looked for a waiter with %d ZPOPMIN, want 1", n)
	}
	if n := commandCalls(t, e, "time"); n != 0 {
		t.Errorf("the release with no waiter left read the clock %d times, want 0", n)
	}
}

// commandCalls returns how many times the server ran a command since the
// last CONFIG RESETSTAT.
func commandCalls(t *testing.T, e *env, cmd string) int {
	t.Helper()
	for _, line := range strings.Split(e.srv.Do(t, "INFO", "commandstats"), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			return n
		}
	}
	return 0
}

func TestAReleaseDoesNotFailForANoticeItCannotSend(t *testing.T) {
	// A server without SPUBLISH (as before Redis 7) and a waiter set with
	// a sharded member: the notice is skipped, the release succeeds.
	e := newEnv(t, redistest.WithArgs("--rename-command", "SPUBLISH", ""))
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "no-shards")
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "ZADD", "dlock:{no-shards}:waiters", "99999999999999", "s|someone")
	e.srv.Do(t, "HSET", "dlock:{no-shards}", "w", "1") // as a waiter's registration marks it
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if e.locked(t, "dlock:{no-shards}") {
		t.Error("the lock was not released")
	}

}

// An owner's re-entry does not wait behind a caller of the same client
// that waits for the owner's hold: the two would wait for each other until
// one wait ended.
func TestAReentryDoesNotWaitBehindTheOwnersWaiters(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	owner := dlock.WithOwner("job-1")
	first, err := e.c.TryLock(ctx, "reenter", owner)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	other := lockWhenRefused(t, wctx, e.c, "reenter")
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	again, err := e.c.Lock(rctx, "reenter", owner)
	if err != nil {
		t.Fatalf("the owner's re-entry: %v", err)
	}
	for _, l := range []*dlock.Lock{again, first} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if r := <-other; r.err != nil {
		t.Fatalf("the other caller, once the owner let go: %v", r.err)
	} else {
		_ = r.l.Release(ctx)
	}
}

// A grant to one caller takes its client out of the lock's waiter set; a
// caller of the same client that waits for a lock on several names, that
// one among them, registers again, so that the release of the granted
// hold wakes it. (The waiters' beat is too long to wake them.)
func TestAGrantKeepsTheClientsOtherCallersRegistered(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	x := e.newClient(t)
	held, err := x.TryLock(ctx, "b", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c := e.newClient(t)
	dlock.SetWaitBeat(c, time.Hour)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	multi := whenRefused(t, "LockMulti", func(opts ...dlock.Option) (*dlock.Lock, error) {
		return c.LockMulti(wctx, []string{"a", "b"}, opts...)
	})
	single := lockWhenRefused(t, wctx, c, "b", dlock.WithTTL(time.Minute))
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-single
	if r.err != nil {
		t.Fatal(r.err)
	}
	awaitCond(t, 5*time.Second, func() bool {
		return e.srv.Do(t, "ZSCORE", "dlock:{b}:waiters", dlock.Member(c)) != "(nil)"
	})
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	m := <-multi
	if m.err != nil {
		t.Fatalf("the lock on both names: %v", m.err)
	}
	_ = m.l.Release(ctx)
}

// refusedSubscribe is a driver whose Subscribe always fails (not
// ErrUnsupported: the server may allow it later), counting its calls.
type refusedSubscribe struct {
	dlock.Driver
	calls *atomic.Int32
}

func (d refusedSubscribe) Subscribe(context.Context, func(string, string)) (dlock.Subscription, error) {
	d.calls.Add(1)
	return nil, errors.New("refused")
}

// TestAFailedSubscribeIsNotRetriedByEveryAttempt: after a Subscribe fails,
// the waiters poll, and the next Subscribe waits a second, however many
// attempts they make meanwhile.
func TestAFailedSubscribeIsNotRetriedByEveryAttempt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	drv := refusedSubscribe{e.newDriver(t), new(atomic.Int32)}
	c := dlock.New(drv)
	defer c.Close()
	held, err := e.c.TryLock(ctx, "refused-sub", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wctx, cancel := context.WithTimeout(ctx, 1200*time.Millisecond)
			defer cancel()
			_, err := c.Lock(wctx, "refused-sub", dlock.WithRetry(dlock.ConstantBackoff(20*time.Millisecond)))
			if !errors.Is(err, dlock.ErrNotObtained) {
				t.Errorf("Lock on a held name: %v", err)
			}
		}()
	}
	wg.Wait()
	// One at the start, one a second later, and one more for slack.
	if n := drv.calls.Load(); n < 1 || n > 3 {
		t.Errorf("%d calls of Subscribe in 1.2s, want 1 to 3", n)
	}
}

// slowSubscribe is a driver whose Subscribe returns only once open is
// closed, whatever its context says, as a driver that dials a server that
// does not answer for its own timeout does.
type slowSubscribe struct {
	dlock.Driver
	open chan struct{}
}

func (d slowSubscribe) Subscribe(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	<-d.open
	return d.Driver.Subscribe(ctx, notify)
}

// TestAWaitEndsWithItsContextWhileTheSubscriptionOpens: a Lock whose
// context ends while the client's subscription is still being opened
// returns then; the subscription opens in the background, and serves the
// next waiter.
func TestAWaitEndsWithItsContextWhileTheSubscriptionOpens(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	drv := slowSubscribe{e.newDriver(t), make(chan struct{})}
	c := dlock.New(drv)
	defer c.Close()
	held, err := e.c.TryLock(ctx, "slow-sub", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := c.Lock(short, "slow-sub")
		got <- err
	}()
	select {
	case err := <-got:
		// No attempt was answered: the client cannot tell the lock is held.
		if errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Lock: err = %v, want DeadlineExceeded and not ErrNotObtained", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Lock waited for the subscription past its context")
	}
	close(drv.open)
	// The next waiter is woken by the release's notice.
	dlock.SetWaitBeat(c, time.Hour)
	go func() {
		l, err := c.Lock(ctx, "slow-sub", dlock.WithMaxWait(10*time.Second))
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); dlock.Waiting(c, "slow-sub") == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second Lock does not wait")
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Errorf("Lock after the subscription opened: %v", err)
	}
}

// silentDriver is a tapDriver whose subscription drops every notice while
// silent is set, as a connection that is slow to deliver them would keep
// them from the client until it gave up.
type silentDriver struct {
	*tapDriver
	silent atomic.Bool
}

func (d *silentDriver) Subscribe(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	return d.tapDriver.Subscribe(ctx, func(channel, payload string) {
		if !d.silent.Load() {
			notify(channel, payload)
		}
	})
}

// A semaphore's release tells one waiting client; one that gives up
// without having used that notice passes it on to the next.
func TestAWaiterThatGivesUpPassesOnASemaphoresNotice(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// Two holders: once one releases, the other keeps the name's keys.
	var held, kept *dlock.Lock
	for _, l := range []**dlock.Lock{&held, &kept} {
		var err error
		if *l, err = e.c.Semaphore("sem", 2).TryAcquire(ctx, dlock.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	defer kept.Release(ctx)
	xd := &silentDriver{tapDriver: e.newDriver(t)}
	x := dlock.New(xd)
	t.Cleanup(func() { _ = x.Close() })
	z := e.newClient(t)
	for _, c := range []*dlock.Client{x, z} {
		dlock.SetWaitBeat(c, time.Hour)
	}
	xctx, xcancel := context.WithCancel(ctx)
	defer xcancel()
	xGot := whenRefused(t, "x's Acquire", func(opts ...dlock.Option) (*dlock.Lock, error) {
		return x.Semaphore("sem", 2).Acquire(xctx, opts...)
	}) // x is registered first
	zctx, zcancel := context.WithTimeout(ctx, 30*time.Second)
	defer zcancel()
	zGot := whenRefused(t, "z's Acquire", func(opts ...dlock.Option) (*dlock.Lock, error) {
		return z.Semaphore("sem", 2).Acquire(zctx, opts...)
	})
	xd.silent.Store(true)
	if err := held.Release(ctx); err != nil { // tells x, which does not hear
		t.Fatal(err)
	}
	xcancel()
	if r := <-xGot; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("x: %v", r.err)
	}
	r := <-zGot
	if r.err != nil {
		t.Fatalf("z, after x gave up: %v", r.err)
	}
	_ = r.l.Release(ctx)
}

// A caller waiting for a lock on several names does not hold up the
// callers of its client behind it for its first name, which may be free
// while it waits for another.
func TestAMultiNameWaiterDoesNotHoldUpTheNextCaller(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	x := e.newClient(t)
	held, err := x.TryLock(ctx, "hol-b", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	multi := whenRefused(t, "LockMulti", func(opts ...dlock.Option) (*dlock.Lock, error) {
		return e.c.LockMulti(wctx, []string{"hol-a", "hol-b"}, opts...)
	})
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	defer acancel()
	l, err := e.c.Lock(actx, "hol-a")
	if err != nil {
		t.Fatalf("Lock of the free name behind a waiting LockMulti: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	if r := <-multi; !errors.Is(r.err, dlock.ErrNotObtained) {
		t.Errorf("LockMulti: %v", r.err)
	}
}

// A lock on several names never asks to be granted one: its attempt leaves
// alone the request another caller of its client left at a name they both
// wait for.
func TestAMultiNameAttemptLeavesASiblingsGrantRequest(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	x := e.newClient(t)
	held, err := x.TryLock(ctx, "sib-a", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	dlock.SetWaitBeat(e.c, time.Hour)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var multiTries atomic.Int32
	multi := make(chan error, 1)
	go func() {
		_, err := e.c.LockMulti(wctx, []string{"sib-a", "sib-b"}, dlock.WithOnRetry(func(int, error) { multiTries.Add(1) }))
		multi <- err
	}()
	awaitCond(t, 5*time.Second, func() bool { return multiTries.Load() == 1 })
	single := lockWhenRefused(t, wctx, e.c, "sib-a")
	key, field := "dlock:{sib-a}", "g:"+dlock.Member(e.c)
	if e.srv.Do(t, "HEXISTS", key, field) != "1" {
		t.Fatal("the single-name caller left no request")
	}
	// Another LockMulti of the client, in line for the other name (a notice
	// about a name that did not refuse the first wakes nobody): its first
	// attempt is refused at sib-a and registers there.
	var otherTries atomic.Int32
	other := make(chan error, 1)
	go func() {
		_, err := e.c.LockMulti(wctx, []string{"sib-b", "sib-a"}, dlock.WithOnRetry(func(int, error) { otherTries.Add(1) }))
		other <- err
	}()
	awaitCond(t, 5*time.Second, func() bool { return otherTries.Load() == 1 })
	if e.srv.Do(t, "HEXISTS", key, field) != "1" {
		t.Error("the LockMulti's attempt took away the other caller's request")
	}
	cancel()
	<-multi
	<-single
	<-other
}

// TestAMultiNameWaiterPassesOnANoticeItCannotUse: a client waiting for a
// lock on two names registered at the first, which was held; another
// client waits for that name alone, behind it. The name is released: its
// one notice goes to the first client, whose attempt is refused at the
// second name. The other client is told in its place (their periodic
// wake-ups and the holders' expiries are a minute away), and the first
// leaves the name's waiter set, where it would take every notice first.
func TestAMultiNameWaiterPassesOnANoticeItCannotUse(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	held := holdEach(t, ctx, e.c, "pass-a", "pass-b")
	const waiters = "dlock:{pass-a}:waiters"
	multi, single := e.newClient(t), e.newClient(t)
	for _, c := range []*dlock.Client{multi, single} {
		dlock.SetWaitBeat(c, time.Minute)
	}
	mctx, mcancel := context.WithCancel(ctx)
	defer mcancel()
	multiGot := whenRefused(t, "LockMulti", func(opts ...dlock.Option) (*dlock.Lock, error) {
		return multi.LockMulti(mctx, []string{"pass-a", "pass-b"}, opts...)
	}, dlock.WithTTL(time.Minute))
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", waiters) == "1" })
	singleGot := lockWhenRefused(t, ctx, single, "pass-a", dlock.WithTTL(time.Minute))
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", waiters) == "2" })
	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-singleGot
	if r.err != nil {
		t.Fatalf("the single-name waiter: %v", r.err)
	}
	if n := e.srv.Do(t, "ZSCORE", waiters, dlock.Member(multi)); n != "(nil)" {
		t.Errorf("the multi-name waiter is still registered at the name that did not refuse it (score %s)", n)
	}
	_ = r.l.Release(ctx)
	mcancel()
	<-multiGot
	_ = held[1].Release(ctx)
}

// TestTwoMultiNameWaitersPassOnANoticeNeitherCanUse: two callers of one
// client wait for locks on two names each, x and one of their own, all
// held; another client waits for x alone, behind it. x is released: its
// notice goes to the first client, whose two callers are refused at their
// other names. Each counted the other at x, and kept the client first
// there, so the other client was never told while x stayed free; each now
// counts the other only where its last attempt was refused, and not at
// all once woken (it tries again, and registers where it is refused).
func TestTwoMultiNameWaitersPassOnANoticeNeitherCanUse(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	held := holdEach(t, ctx, e.c, "two-x", "two-y", "two-z")
	multi, single := e.newClient(t), e.newClient(t)
	for _, c := range []*dlock.Client{multi, single} {
		dlock.SetWaitBeat(c, time.Hour)
	}
	mctx, mcancel := context.WithCancel(ctx)
	defer mcancel()
	var got []<-chan lockResult
	for _, other := range []string{"two-y", "two-z"} {
		got = append(got, whenRefused(t, "LockMulti", func(opts ...dlock.Option) (*dlock.Lock, error) {
			return multi.LockMulti(mctx, []string{"two-x", other}, opts...)
		}, dlock.WithTTL(time.Minute)))
	}
	awaitWaiting(t, multi, "two-x", 2)
	singleGot := lockWhenRefused(t, ctx, single, "two-x", dlock.WithTTL(time.Minute))
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", "dlock:{two-x}:waiters") == "2" })
	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-singleGot:
		if r.err != nil {
			t.Fatalf("the single-name waiter: %v", r.err)
		}
		_ = r.l.Release(ctx)
	case <-time.After(5 * time.Second):
		t.Fatal("two-x is free, and the single-name waiter was not told in 5s")
	}
	mcancel()
	for _, g := range got {
		<-g
	}
	for _, l := range held[1:] {
		_ = l.Release(ctx)
	}
}

// gate is closed once.
type gate struct {
	ch   chan struct{}
	done atomic.Bool
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }
func (g *gate) open() {
	if g.done.CompareAndSwap(false, true) {
		close(g.ch)
	}
}
func (g *gate) wait() {
	select {
	case <-g.ch:
	case <-time.After(5 * time.Second):
	}
}

// TestAWokenSiblingsAttemptDoesNotDropARegistrationAnotherNeeds: one notice (of
// q-p) wakes W (q-p, q-x) and V (q-p, q-y, q-x), two LockMulti callers of
// client A that q-p refused; both now count at no name (refusedWoken). W's attempt is
// refused at q-x, held, and registers A there, behind client C. q-x is
// released (C is told) before V's attempt runs; V's moreAt, computed while
// W was woken, says '0' at q-x, so its refusal at q-y takes A out of the
// now-free q-x's waiter set. C takes q-x and releases it: nobody tells A,
// and W slept until its beat (an hour here, 500ms by default), although
// only q-x kept it waiting. V's attempt now wakes, once it is back, the
// callers whose attempts came back refused at its other names since its
// moreAt looked (rewake): W tries again, and registers where it is refused.
// W's reply may also come back after V's (wBack "after"): V's attempt
// then finds W's still under way, which takes the notice when it comes
// back refused at one of V's names (a client under load once slept so).
func TestAWokenSiblingsAttemptDoesNotDropARegistrationAnotherNeeds(t *testing.T) {
	for _, wBack := range []string{"before", "after"} {
		t.Run("W's reply back "+wBack+" V's", func(t *testing.T) {
			wokenSiblingDropsARegistration(t, wBack == "after")
		})
	}
}

func wokenSiblingDropsARegistration(t *testing.T, wBackLast bool) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held := holdEach(t, ctx, e.c, "q-p", "q-x", "q-y")
	var armed atomic.Bool
	wRan, vEntered, vRan, vBack := newGate(), newGate(), newGate(), newGate()
	// The attempts are told apart by their keys, three a name, in each
	// call of a pipeline.
	is := func(calls []*dlock.Call, first string, names int) bool {
		return armed.Load() && slices.ContainsFunc(calls, func(c *dlock.Call) bool {
			return c.Script.Name == "acquire" && c.Keys[0] == first && len(c.Keys) == 3*names
		})
	}
	cd := &hookDriver{Driver: e.newDriver(t), before: func(calls []*dlock.Call) {
		if is(calls, "dlock:{q-x}", 2) {
			vRan.wait() // C takes q-x after V's attempt ran
		}
	}}
	cc := dlock.New(cd)
	t.Cleanup(func() { _ = cc.Close() })
	// On several names: a release grants no such lock (it would take q-x
	// at H's release).
	cGot := whenRefused(t, "C", func(opts ...dlock.Option) (*dlock.Lock, error) {
		return cc.LockMulti(ctx, []string{"q-x", "q-c"}, opts...)
	}, dlock.WithTTL(time.Minute))

	ad := &hookDriver{Driver: e.newDriver(t),
		before: func(calls []*dlock.Call) {
			if is(calls, "dlock:{q-p}", 3) && !vEntered.done.Load() { // V's
				vEntered.open()
				wRan.wait()
				if err := held[1].Release(ctx); err != nil { // q-x is free; C is told
					t.Error(err)
				}
			}
		},
		after: func(calls []*dlock.Call) {
			switch {
			case is(calls, "dlock:{q-p}", 2): // W's
				wRan.open()
				if wBackLast {
					vBack.wait() // W's reply after V's is back
				} else {
					vEntered.wait() // W's reply after V's moreAt
				}
			case is(calls, "dlock:{q-p}", 3):
				vRan.open()
			}
		}}
	a := dlock.New(ad)
	t.Cleanup(func() { _ = a.Close() })
	dlock.SetWaitBeat(a, time.Hour)
	mctx, mcancel := context.WithCancel(ctx)
	defer mcancel()
	w := whenRefused(t, "W", func(opts ...dlock.Option) (*dlock.Lock, error) {
		return a.LockMulti(mctx, []string{"q-p", "q-x"}, opts...)
	}, dlock.WithTTL(time.Minute))
	// V's first refusal, and its second, the woken attempt's, once back.
	vRefused := newGate()
	v := make(chan lockResult, 1)
	go func() {
		l, err := a.LockMulti(mctx, []string{"q-p", "q-y", "q-x"}, dlock.WithTTL(time.Minute),
			dlock.WithOnRetry(func(failed int, _ error) {
				if g := map[int]*gate{1: vRefused, 2: vBack}[failed]; g != nil {
					g.open()
				}
			}))
		v <- lockResult{l, err}
	}()
	select {
	case <-vRefused.ch:
	case r := <-v:
		t.Fatalf("V returned before it waited: %v", r.err)
	}

	armed.Store(true)
	if err := held[0].Release(ctx); err != nil { // q-p: wakes W and V
		t.Fatal(err)
	}
	// C and W each get q-x in turn (W may come first, woken again), and
	// give it up at once.
	limit := time.After(10 * time.Second)
	for got := 0; got < 2; got++ {
		var r lockResult
		who := "C"
		select {
		case r = <-cGot:
		case r = <-w:
			who = "W (q-p, q-x)"
		case <-limit:
			t.Fatalf("q-x and q-p are free by turns, and not both C and W got them in 10s")
		}
		if r.err != nil {
			t.Fatalf("%s: %v", who, r.err)
		}
		if err := r.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	armed.Store(false)
	mcancel()
	<-v
	_ = held[2].Release(ctx)
}

// TestAMultiNameCallerWaitingItsTurnDoesNotKeepItsClientFirst: a
// LockMulti in line behind a Lock of the same client on its first name
// makes no attempt until that one leaves (or made one ahead of its turn,
// as an owner's does, which registers nowhere). It counted at its other
// name as a caller whose outcome was not known, or at the name that
// refused that first attempt, so a sibling's lock there re-registered the
// client at its release, whose notice then went to a client that could not
// use it, while another client waited for the name.
func TestAMultiNameCallerWaitingItsTurnDoesNotKeepItsClientFirst(t *testing.T) {
	for _, ahead := range []bool{false, true} {
		t.Run(fmt.Sprintf("ahead=%v", ahead), func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			holder, a, b := e.newClient(t), e.newClient(t), e.newClient(t)
			for _, c := range []*dlock.Client{a, b} {
				dlock.SetWaitBeat(c, time.Hour)
			}
			ttl := dlock.WithTTL(30 * time.Second)
			var owner []dlock.Option
			if ahead {
				owner = []dlock.Option{dlock.WithOwner("o")}
			}
			if _, err := holder.TryLock(ctx, "turn-q", append(owner, ttl)...); err != nil {
				t.Fatal(err)
			}
			hx, err := holder.TryLock(ctx, "turn-x", ttl)
			if err != nil {
				t.Fatal(err)
			}
			wctx, wcancel := context.WithCancel(ctx)
			defer wcancel()
			first := lockWhenRefused(t, wctx, a, "turn-q", ttl)
			tried := make(chan struct{}, 1)
			queued := make(chan error, 1)
			go func() {
				_, err := a.LockMulti(wctx, []string{"turn-q", "turn-x"}, append(owner, ttl, dlock.WithOnRetry(func(int, error) {
					select {
					case tried <- struct{}{}:
					default:
					}
				}))...)
				queued <- err
			}()
			if ahead {
				<-tried // refused at turn-x, ahead of its turn
			} else {
				awaitWaiting(t, a, "turn-q", 2)
			}
			if err := hx.Release(ctx); err != nil {
				t.Fatal(err)
			}
			m, err := a.LockMulti(ctx, []string{"turn-x", "turn-y"}, ttl)
			if err != nil {
				t.Fatal(err)
			}
			bGot := lockWhenRefused(t, wctx, b, "turn-x", ttl)
			if err := m.Release(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-bGot:
				if r.err != nil {
					t.Fatalf("the other client's Lock: %v", r.err)
				}
				_ = r.l.Release(ctx)
			case <-time.After(5 * time.Second):
				t.Error("turn-x is free, and the other client's Lock was not told in 5s")
			}
			wcancel()
			<-first
			<-queued
		})
	}
}

// TestAWaiterTriesAgainWhenItsSubscriptionIsBack: the waiting client's
// subscription is cut (CLIENT KILL TYPE pubsub) and the lock released at
// once, before go-redis connects again (it waits 100ms first): the
// release's notice is lost, or the release takes the client for dead.
// Once the driver has subscribed again it says so, and the waiter tries
// at once, not at its next periodic wake-up (an hour away here) or the
// holder's expiry (a minute).
func TestAWaiterTriesAgainWhenItsSubscriptionIsBack(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held, err := e.c.TryLock(ctx, "resubscribed", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c := e.newClient(t)
	dlock.SetWaitBeat(c, time.Hour)
	got := lockWhenRefused(t, ctx, c, "resubscribed", dlock.WithTTL(time.Minute))
	awaitCond(t, 5*time.Second, func() bool {
		return e.srv.Do(t, "ZSCORE", "dlock:{resubscribed}:waiters", dlock.Member(c)) != "(nil)"
	})
	e.srv.Do(t, "CLIENT", "KILL", "TYPE", "pubsub")
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	}
	if r.l.Fence() <= held.Fence() {
		t.Errorf("fence %d not after the first holder's %d", r.l.Fence(), held.Fence())
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAMultiNameWaiterLeavesAnotherCallersRegistration: a caller waits for
// "a" alone; another caller of the same client, waiting for [b, a], sent
// its attempt before the first registered, so that attempt did not know
// of it. Refused at "b", it leaves "a" as it found it: held, with the
// client registered there for the first caller, whom a's release tells
// (their periodic wake-ups are a minute away).
func TestAMultiNameWaiterLeavesAnotherCallersRegistration(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held := holdEach(t, ctx, e.c, "other-a", "other-b")
	// The multi-name caller's first registering attempt is held back.
	var armed atomic.Bool
	sent, proceed := make(chan struct{}), make(chan struct{})
	d := &hookDriver{Driver: e.newDriver(t), before: func(calls []*dlock.Call) {
		if c := calls[0]; len(c.Keys) == 6 && len(c.Args) >= 5 && c.Args[4] != "" && armed.CompareAndSwap(true, false) {
			close(sent)
			<-proceed
		}
	}}
	c := dlock.New(d)
	t.Cleanup(func() { _ = c.Close() })
	dlock.SetWaitBeat(c, time.Minute)
	armed.Store(true)
	mctx, mcancel := context.WithCancel(ctx)
	defer mcancel()
	multi := make(chan error, 1)
	go func() {
		_, err := c.LockMulti(mctx, []string{"other-b", "other-a"}, dlock.WithTTL(time.Minute))
		multi <- err
	}()
	<-sent
	single := lockWhenRefused(t, ctx, c, "other-a", dlock.WithTTL(time.Minute))
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", "dlock:{other-a}:waiters") == "1" })
	close(proceed)
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", "dlock:{other-b}:waiters") == "1" })
	if err := held[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-single:
		if r.err != nil {
			t.Fatal(r.err)
		}
		_ = r.l.Release(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("the single-name caller was not told of the release")
	}
	mcancel()
	<-multi
	_ = held[1].Release(ctx)
}

// holdEach takes each of the names with c, for a minute.
func holdEach(t *testing.T, ctx context.Context, c *dlock.Client, names ...string) []*dlock.Lock {
	t.Helper()
	held := make([]*dlock.Lock, len(names))
	for i, name := range names {
		l, err := c.TryLock(ctx, name, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		held[i] = l
	}
	return held
}

// TestALateUnwaitLeavesTheNextRegistration: the last caller of a client
// gives up and sends unwait, which is slow to arrive (held back here);
// meanwhile another caller of the client starts waiting. Its attempt waits
// for the unwait, so that the unwait cannot run after the attempt
// registered the client and take that registration out: the release then
// tells the client, and the caller gets the lock by that notice alone (its
// periodic wake-up is an hour away).
func TestALateUnwaitLeavesTheNextRegistration(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const name, waiters = "late-unwait", "dlock:{late-unwait}:waiters"
	held, err := e.c.TryLock(ctx, name, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	unwaitStarted, attemptRan := make(chan struct{}), make(chan struct{})
	var startOnce, ranOnce sync.Once
	var unwaiting atomic.Bool
	d := &hookDriver{Driver: e.newDriver(t),
		before: func(calls []*dlock.Call) {
			if calls[0].Script.Name == "unwait" {
				unwaiting.Store(true)
				startOnce.Do(func() { close(unwaitStarted) })
				select { // until a registering attempt ran, if one comes
				case <-attemptRan:
				case <-time.After(time.Second):
				}
			}
		},
		after: func(calls []*dlock.Call) {
			if c := calls[0]; unwaiting.Load() && c.Script.Name == "acquire" && len(c.Args) > 4 && c.Args[4] != "" {
				ranOnce.Do(func() { close(attemptRan) })
			}
		}}
	c := dlock.New(d)
	defer c.Close()
	dlock.SetWaitBeat(c, time.Hour)

	first, cancel := context.WithCancel(ctx)
	gaveUp := whenRefused(t, "the first Lock", func(opts ...dlock.Option) (*dlock.Lock, error) { return c.Lock(first, name, opts...) })
	cancel()
	<-unwaitStarted
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	next := whenRefused(t, "the next Lock", func(opts ...dlock.Option) (*dlock.Lock, error) { return c.Lock(wctx, name, opts...) })
	if r := <-gaveUp; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the first Lock: %v, want context.Canceled", r.err)
	}
	if got := e.srv.Do(t, "ZCARD", waiters); got != "1" {
		t.Errorf("%s clients registered while the next caller waits, want 1", got)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-next
	if r.err != nil {
		t.Fatalf("the next Lock, after the release: %v", r.err)
	}
	_ = r.l.Release(ctx)
}

// slowSubscriber takes delay to open a subscription, as a driver whose
// server is far or slow to answer, or a stalled cluster primary, would.
type slowSubscriber struct {
	dlock.Driver
	delay time.Duration
}

func (d *slowSubscriber) Subscribe(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	time.Sleep(d.delay)
	return d.Driver.Subscribe(ctx, notify)
}

// TestAWaitWhoseSubscriptionIsSlowToOpenKeepsItsAttempts: a waiter's
// client takes 700ms to open its subscription. The waiter goes on without
// it after 250ms, and then waits for it (or a beat), as a registered
// waiter would, rather than polling by its retry strategy: three attempts
// are enough to register and be granted the lock at its release, where
// polling while the subscription opened used them up.
func TestAWaitWhoseSubscriptionIsSlowToOpenKeepsItsAttempts(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "slow-sub", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c := dlock.New(&slowSubscriber{Driver: e.newDriver(t), delay: 700 * time.Millisecond})
	defer c.Close()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got := make(chan lockResult, 1)
	go func() {
		l, err := c.Lock(wctx, "slow-sub", dlock.WithRetry(dlock.LimitRetry(dlock.DefaultRetry(), 3)))
		got <- lockResult{l, err}
	}()
	awaitCond(t, 5*time.Second, func() bool {
		info, err := e.c.Inspect(ctx, "slow-sub")
		return err == nil && info.WaitingClients > 0
	})
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("Lock: %v", r.err)
	}
	_ = r.l.Release(ctx)
}

// inFlight counts the driver's calls under way.
type inFlight struct {
	dlock.Driver
	n atomic.Int32
}

func (d *inFlight) Eval(ctx context.Context, calls ...*dlock.Call) {
	d.n.Add(1)
	defer d.n.Add(-1)
	d.Driver.Eval(ctx, calls...)
}

// TestCloseWaitsForAWaitItEndsOnAStalledServer: Close ends a wait while
// the server stalls. The wait's exit (the clean-up of its last attempt,
// then leaving the waiter set) has 2s in all, within Close's 3s bound, so
// no request of it is under way when Close returns, and the Redis client
// may be closed next. Each had 2s of its own before: 4s, and Close
// returned with the wait's last request still under way.
func TestCloseWaitsForAWaitItEndsOnAStalledServer(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	held, err := e.c.TryLock(ctx, "stalled-close", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	d := &inFlight{Driver: goredis.New(rdb)}
	c := dlock.New(d)
	got := lockWhenRefused(t, ctx, c, "stalled-close")
	e.srv.Pause(t)
	_ = c.Close()
	n := d.n.Load()
	e.srv.Resume(t)
	if n != 0 {
		t.Errorf("%d requests under way when Close returned", n)
	}
	if r := <-got; !errors.Is(r.err, dlock.ErrClosed) {
		t.Errorf("the wait Close ended: %v, want ErrClosed", r.err)
	}
}

// TestOddPrefixesAndNamesAreWokenByNotices: the notices of a release reach
// a waiting client whose prefix starts like a shard member's registration
// ("s|"), and one waiting for a key that starts with a NUL byte, like a
// grant's notice, as any other; not its timers.
func TestOddPrefixesAndNamesAreWokenByNotices(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, tc := range []struct{ prefix, name string }{{"s|", "x"}, {"s|locks:", "x"}, {"", "\x00{w}"}, {"\x00", "x"}} {
		holder := e.newClient(t, dlock.WithPrefix(tc.prefix))
		waiter := e.newClient(t, dlock.WithPrefix(tc.prefix))
		held, err := holder.TryLock(ctx, tc.name, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := wokenByRelease(t, held, func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
			return waiter.Lock(ctx, tc.name, opts...)
		}); err != nil {
			t.Errorf("prefix %q, lock %q: the waiter was not woken by the release: %v", tc.prefix, tc.name, err)
		}
		w, err := holder.RWMutex(tc.name).TryLock(ctx, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := wokenByRelease(t, w, func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
			return waiter.RWMutex(tc.name).RLock(ctx, opts...)
		}); err != nil {
			t.Errorf("prefix %q, read lock %q: the reader was not woken by the writer's release: %v", tc.prefix, tc.name, err)
		}
	}
}

// TestSiblingsRefusedAtEachOthersNamesDoNotWakeEachOtherOverAndOver: W
// (s-x, s-y) and V (s-y, s-x), two LockMulti callers of client A, both
// held by another client, so that W is refused at s-x and V at s-y. Their
// attempts overlap (each reply is held back here until the other attempt
// is under way too, as on a loaded client). An attempt that comes back
// while its sibling's is under way (rewake) must not make each wake the
// other, and both try again, for as long as the names stay held: A made
// thousands of attempts a second. Two rounds suffice: in the second, each
// counts the other at the name that refused it, so neither takes the
// client out of the other's waiter set; and A stays registered at both,
// so the releases wake it (its beat is an hour).
func TestSiblingsRefusedAtEachOthersNamesDoNotWakeEachOtherOverAndOver(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held := holdEach(t, ctx, e.c, "s-x", "s-y")
	var (
		armed    atomic.Bool
		attempts atomic.Int64
		mu       sync.Mutex
		alone    chan struct{} // an attempt's reply waiting for another attempt
	)
	ad := &hookDriver{Driver: e.newDriver(t), after: func(calls []*dlock.Call) {
		if !armed.Load() || calls[0].Script.Name != "acquire" {
			return
		}
		attempts.Add(1)
		mu.Lock()
		if alone != nil {
			close(alone)
			alone = nil
			mu.Unlock()
			return
		}
		ch := make(chan struct{})
		alone = ch
		mu.Unlock()
		select {
		case <-ch:
		case <-time.After(time.Second):
			mu.Lock()
			if alone == ch {
				alone = nil
			}
			mu.Unlock()
		}
	}}
	a := dlock.New(ad)
	t.Cleanup(func() { _ = a.Close() })
	dlock.SetWaitBeat(a, time.Hour)
	armed.Store(true)
	got := make(chan lockResult, 2)
	for _, names := range [][]string{{"s-x", "s-y"}, {"s-y", "s-x"}} {
		go func() {
			l, err := a.LockMulti(ctx, names, dlock.WithTTL(time.Minute))
			got <- lockResult{l, err}
		}()
	}
	awaitCond(t, 5*time.Second, func() bool { return attempts.Load() >= 4 })
	// A window in which callers waking each other would make hundreds of
	// attempts (no signal marks their absence); registrations last 1.5s
	// unrenewed: well within them.
	time.Sleep(300 * time.Millisecond)
	armed.Store(false)
	if n := attempts.Load(); n > 6 {
		t.Fatalf("%d attempts while s-x and s-y stayed held", n)
	}
	for _, l := range held {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		select {
		case r := <-got:
			if r.err != nil {
				t.Fatal(r.err)
			}
			if err := r.l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("W and V did not both obtain s-x and s-y within 5s of their release")
		}
	}
}

// TestWaitingForManyNamesKeepsNoState: a client whose callers wait for one
// name after another (woken by the release, giving up as their context
// ends or their max wait passes, waiting for several names) keeps nothing
// in memory for the names they are done with, beyond the request tokens
// of the last Locks that ended, which it remembers for a while.
func TestWaitingForManyNamesKeepsNoState(t *testing.T) {
	e := newEnv(t)
	holder := e.newClient(t)
	ctx := context.Background()
	ttl := dlock.WithTTL(time.Minute)
	t.Run("woken", func(t *testing.T) {
		keepsNoStateByName(t, "woken", func(name string) error {
			return wokenAfterRefusal(ctx, func() (*dlock.Lock, error) { return holder.TryLock(ctx, name, ttl) },
				func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
					return e.c.Lock(ctx, name, append(opts, ttl)...)
				})
		}, e.c, holder)
	})
	t.Run("cancelled", func(t *testing.T) {
		keepsNoStateByName(t, "cancelled", func(name string) error {
			held, err := holder.TryLock(ctx, name, ttl)
			if err != nil {
				return err
			}
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			if _, err := e.c.Lock(wctx, name, ttl, dlock.WithOnRetry(func(int, error) { cancel() })); !errors.Is(err, context.Canceled) {
				return fmt.Errorf("a wait whose context was cancelled: %v", err)
			}
			return held.Release(ctx)
		}, e.c, holder)
	})
	t.Run("max wait", func(t *testing.T) {
		keepsNoStateByName(t, "maxwait", func(name string) error {
			held, err := holder.TryLock(ctx, name, ttl)
			if err != nil {
				return err
			}
			if _, err := e.c.Lock(ctx, name, ttl, dlock.WithMaxWait(time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("a wait past its max wait: %v", err)
			}
			return held.Release(ctx)
		}, e.c, holder)
	})
	t.Run("several names", func(t *testing.T) {
		keepsNoStateByName(t, "multi", func(name string) error {
			return wokenAfterRefusal(ctx, func() (*dlock.Lock, error) { return holder.TryLock(ctx, name+":b", ttl) },
				func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
					return e.c.LockMulti(ctx, []string{name + ":a", name + ":b"}, append(opts, ttl)...)
				})
		}, e.c, holder)
	})
}

// wokenAfterRefusal takes a lock with hold, waits for it with wait until
// wait's first attempt is refused, releases it, and returns wait's error
// (releasing what wait obtained).
func wokenAfterRefusal(ctx context.Context, hold func() (*dlock.Lock, error), wait func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error)) error {
	held, err := hold()
	if err != nil {
		return err
	}
	refused := make(chan struct{})
	var once sync.Once
	got := make(chan error, 1)
	go func() {
		l, err := wait(ctx, dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	select {
	case <-refused:
	case err := <-got:
		return fmt.Errorf("the wait ended before it was refused: %v", err)
	}
	if err := held.Release(ctx); err != nil {
		return err
	}
	return <-got
}

// TestTheRequestsOfWaitersThatDiedAreForgotten: clients that die while
// they wait for a lock (their connections close; nothing more is sent)
// leave their registrations in its waiter set and the requests they left
// for a grant in its hash. Once their registrations expire, the next
// registration of a client still waiting takes them away: with a lock held
// all along and a client waiting all along (a leader and a follower that
// stays), the registrations and requests of followers that died must not
// pile up in Redis for as long as that lasts.
func TestTheRequestsOfWaitersThatDiedAreForgotten(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	name := "leader"
	key := e.c.RedisKey(name)
	held, err := e.c.TryLock(ctx, name, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	follower := lockAndRelease(e.newClient(t), name, time.Minute)
	awaitCond(t, 10*time.Second, func() bool { return requestsLeft(t, e, key) == 1 })
	const died = 4
	for range died {
		waitAndDie(t, e, name)
	}
	// The dead registrations expire within waitLease; the follower
	// registers again at least every beat.
	for deadline := time.Now().Add(10 * time.Second); ; <-time.After(10 * time.Millisecond) {
		n, regs := requestsLeft(t, e, key), e.srv.Do(t, "ZCARD", key+":waiters")
		if n == 1 && regs == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after %d waiting clients died: %d requests for a grant and %s registrations left, want those of the one still waiting", died, n, regs)
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-follower; err != nil {
		t.Fatal(err)
	}
}

// TestAReleaseForgetsTheRequestsOfExpiredWaiters: a release that finds
// only expired registrations in the waiter set takes them out, and the
// requests for a grant their clients left with them.
func TestAReleaseForgetsTheRequestsOfExpiredWaiters(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	name := "gone"
	key := e.c.RedisKey(name)
	held, err := e.c.TryLock(ctx, name, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// Two clients registered a second ago, for half a second, and left
	// their requests, as their waiting attempts do; they died since.
	past, err := strconv.ParseInt(strings.Fields(e.srv.Do(t, "TIME"))[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	expired := strconv.FormatInt((past-1)*1000+500, 10)
	for _, member := range []string{"dlock:client:dead1", "dlock:client:dead2"} {
		e.srv.Do(t, "ZADD", key+":waiters", expired, member)
		e.srv.Do(t, "HSET", key, "w", "1", "g:"+member, `["req-`+member+`",60000,"","",1,"0"]`)
	}
	e.srv.Do(t, "PEXPIRE", key+":waiters", "60000")
	if n := requestsLeft(t, e, key); n != 2 {
		t.Fatalf("%d requests left, want the 2 written", n)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := requestsLeft(t, e, key); n != 0 {
		t.Errorf("the release left %d requests of expired waiters in the hash", n)
	}
	if e.exists(t, key+":waiters") {
		t.Errorf("the release left the expired registrations: %s", e.srv.Do(t, "ZRANGE", key+":waiters", "0", "-1"))
	}
}

// requestsLeft counts the requests for a grant that waiting clients left
// in the hash of a lock (its 'g:' fields).
func requestsLeft(t *testing.T, e *env, key string) int {
	t.Helper()
	n := 0
	for _, f := range strings.Fields(e.srv.Do(t, "HKEYS", key)) {
		if strings.HasPrefix(f, "g:") {
			n++
		}
	}
	return n
}

// waitAndDie waits for the lock called name on a client of its own until
// its first attempt is refused, having left its request for a grant, and
// closes that client's connections then, as a process that dies does: it
// sends nothing more.
func waitAndDie(t *testing.T, e *env, name string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), MaxRetries: -1})
	c := dlock.New(goredis.New(rdb))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	refused := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := c.Lock(ctx, name, dlock.WithTTL(time.Minute),
			dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
		done <- err
	}()
	<-refused
	if e.srv.Do(t, "HEXISTS", c.RedisKey(name), "g:"+dlock.Member(c)) != "1" {
		t.Fatal("a waiting client left no request for a grant")
	}
	_ = rdb.Close()
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a client that died obtained the lock")
	}
	_ = c.Close()
}
