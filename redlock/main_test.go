package redlock_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/dlockio/dlock/redlock"
	"github.com/redis/go-redis/v9"
)

// exampleAddrs are the addresses of the five Redis servers the Example
// functions use.
var exampleAddrs []string

func TestMain(m *testing.M) {
	var stops []func()
	stopAll := func() {
		for _, stop := range stops {
			stop()
		}
	}
	for range 5 {
		srv, stop, err := redistest.StartForMain()
		if err != nil {
			stopAll()
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		stops = append(stops, stop)
		exampleAddrs = append(exampleAddrs, srv.Addr())
	}
	code := redistest.RunWithoutLeaks(m)
	stopAll()
	os.Exit(code)
}

// testNodeTimeout is the node timeout of the tests' Lockers unless a test
// sets its own. It is five times the default: test binaries of other
// packages share the machine's cores, and a process starved of CPU for
// 50ms finds every node late at once. That is a failure Redlock handles
// (the attempt is given back and Lock tries again), but not the one most
// tests are about.
const testNodeTimeout = 250 * time.Millisecond

// newLocker returns a Locker over the servers, as one process would have
// it: a go-redis client and a dlock client of its own for each, closed
// with the test (the Locker first).
func newLocker(t testing.TB, srvs []*redistest.Server, opts ...redlock.LockerOption) *redlock.Locker {
	t.Helper()
	r, _ := newLockerNodes(t, srvs, opts...)
	return r
}

// newLockerNodes is newLocker, and returns the Locker's nodes too.
func newLockerNodes(t testing.TB, srvs []*redistest.Server, opts ...redlock.LockerOption) (*redlock.Locker, []redlock.Node) {
	t.Helper()
	nodes := make([]redlock.Node, len(srvs))
	for i, srv := range srvs {
		nodes[i] = redlock.Node{Addr: srv.Addr(), Client: newClient(t, srv)}
	}
	r, err := redlock.New(nodes, append([]redlock.LockerOption{redlock.WithNodeTimeout(testNodeTimeout)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r, nodes
}

// retryAfterRefusal returns a retry strategy that retries every 20ms, and
// a channel closed at the first refused attempt.
func retryAfterRefusal() (dlock.RetryStrategy, <-chan struct{}) {
	var once sync.Once
	refused := make(chan struct{})
	return dlock.RetryFunc(func(int) (time.Duration, bool) {
		once.Do(func() { close(refused) })
		return 20 * time.Millisecond, true
	}), refused
}

// newClient returns a dlock client of its own on srv, closed with the test.
func newClient(t testing.TB, srv *redistest.Server) *dlock.Client {
	// MaxRetries -1: a dead node fails at once instead of after go-redis's
	// own retries, so the errors the tests see are the node's.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// holds reports whether srv holds the lock of name. A released lock keeps
// its hash for a while, with an empty token.
func holds(t testing.TB, srv *redistest.Server, name string) bool {
	t.Helper()
	tok := srv.Do(t, "HGET", "dlock:{"+name+"}", "token")
	return tok != "" && tok != "(nil)"
}

// heldOn returns how many of the servers have a lock key for name.
func heldOn(t testing.TB, srvs []*redistest.Server, name string) int {
	t.Helper()
	n := 0
	for _, srv := range srvs {
		if holds(t, srv, name) {
			n++
		}
	}
	return n
}

// tokenOn returns the token of the lock on name that srv holds, or "".
func tokenOn(t testing.TB, srv *redistest.Server, name string) string {
	t.Helper()
	v := srv.Do(t, "HGET", "dlock:{"+name+"}", "token")
	if v == "(nil)" {
		return ""
	}
	return v
}

// waitDone waits for a lock's Done channel, failing the test after limit.
func waitDone(t testing.TB, l *redlock.Lock, limit time.Duration) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(limit):
		t.Fatalf("Done not closed within %v; held on %v", limit, l.Nodes())
	}
}

// eventually polls cond every 10ms until it holds, failing after limit.
func eventually(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(limit); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, limit)
		}
	}
}

// countingDriver counts the requests sent through it and sends none.
type countingDriver struct{ calls atomic.Int64 }

func (d *countingDriver) Eval(_ context.Context, calls ...*dlock.Call) {
	d.calls.Add(1)
	for _, c := range calls {
		c.Err = fmt.Errorf("countingDriver: no server")
	}
}

func (d *countingDriver) Subscribe(context.Context, func(string, string)) (dlock.Subscription, error) {
	d.calls.Add(1)
	return nil, dlock.ErrUnsupported
}

// slowDriver delays the calls of one script by delay, as a node under load
// would. If honour is set, it honours the context meanwhile as rueidis
// does: a call whose context ends first is not sent, and fails with the
// context's error. Otherwise it ignores the context's end, as go-redis
// does on an open connection.
type slowDriver struct {
	dlock.Driver
	script string
	delay  time.Duration
	honour bool
}

func (d *slowDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if !d.honour {
		ctx = context.WithoutCancel(ctx)
	}
	if slices.ContainsFunc(calls, func(c *dlock.Call) bool { return c.Script.Name == d.script }) {
		t := time.NewTimer(d.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			for _, c := range calls {
				c.Err = ctx.Err()
			}
			return
		}
	}
	d.Driver.Eval(ctx, calls...)
}

// newSlowLocker returns a Locker over the servers whose nodes' clients take
// delay for every call of script (see slowDriver).
func newSlowLocker(t testing.TB, srvs []*redistest.Server, script string, delay time.Duration, honour bool) *redlock.Locker {
	t.Helper()
	return newWrappedLocker(t, srvs, func(_ int, d dlock.Driver) dlock.Driver {
		return &slowDriver{Driver: d, script: script, delay: delay, honour: honour}
	})
}

// newWrappedLocker returns a Locker over the servers whose node i's client
// goes through wrap(i, its go-redis driver).
func newWrappedLocker(t testing.TB, srvs []*redistest.Server, wrap func(i int, d dlock.Driver) dlock.Driver) *redlock.Locker {
	t.Helper()
	return newLockerOf(t, srvs, func(i int, d dlock.Driver) *dlock.Client { return dlock.New(wrap(i, d)) })
}

// lockerWithNode0 is newWrappedLocker with node 0's driver alone wrapped
// by wrap.
func lockerWithNode0(t testing.TB, srvs []*redistest.Server, wrap func(d dlock.Driver) dlock.Driver) *redlock.Locker {
	t.Helper()
	return newWrappedLocker(t, srvs, func(i int, d dlock.Driver) dlock.Driver {
		if i == 0 {
			return wrap(d)
		}
		return d
	})
}

// newLockerOf returns a Locker over the servers, with opts, whose node i's
// client is made by mk over its go-redis driver.
func newLockerOf(t testing.TB, srvs []*redistest.Server, mk func(i int, d dlock.Driver) *dlock.Client, opts ...redlock.LockerOption) *redlock.Locker {
	t.Helper()
	return lockerOf(t, srvs, func(int, *redis.Options) {}, mk, opts)
}

// newLockerOfOptions is newLockerOf with the go-redis options of each node
// set by set (and dlock clients made by dlock.New unless mk is given).
func newLockerOfOptions(t testing.TB, srvs []*redistest.Server, set func(i int, o *redis.Options), mk ...func(i int, d dlock.Driver) *dlock.Client) *redlock.Locker {
	t.Helper()
	var mkClient func(i int, d dlock.Driver) *dlock.Client
	if len(mk) > 0 {
		mkClient = mk[0]
	}
	return lockerOf(t, srvs, set, mkClient, nil)
}

// lockerOf is newLockerOfOptions with the Locker's options, mk nil for
// dlock.New.
func lockerOf(t testing.TB, srvs []*redistest.Server, set func(i int, o *redis.Options), mk func(i int, d dlock.Driver) *dlock.Client, opts []redlock.LockerOption) *redlock.Locker {
	t.Helper()
	nodes := make([]redlock.Node, len(srvs))
	for i, srv := range srvs {
		o := &redis.Options{Addr: srv.Addr(), MaxRetries: -1}
		set(i, o)
		rdb := redis.NewClient(o)
		t.Cleanup(func() { _ = rdb.Close() })
		var c *dlock.Client
		if mk != nil {
			c = mk(i, goredis.New(rdb))
		} else {
			c = dlock.New(goredis.New(rdb))
		}
		t.Cleanup(func() { _ = c.Close() })
		nodes[i] = redlock.Node{Addr: srv.Addr(), Client: c}
	}
	r, err := redlock.New(nodes, append([]redlock.LockerOption{redlock.WithNodeTimeout(testNodeTimeout)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// delayedDriver delays every call of the scripts named in delay by their
// delay, ignoring the context's end meanwhile, as go-redis does on an open
// connection: a node whose requests reach it late.
type delayedDriver struct {
	dlock.Driver
	delay map[string]time.Duration
}

func (d *delayedDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	for _, c := range calls {
		if dl, ok := d.delay[c.Script.Name]; ok {
			time.Sleep(dl)
			break
		}
	}
	d.Driver.Eval(context.WithoutCancel(ctx), calls...)
}
