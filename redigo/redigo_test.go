package redigo_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/dlocktest"
	"github.com/dlockio/dlock/internal/redistest"
	dlockredigo "github.com/dlockio/dlock/redigo"
	"github.com/gomodule/redigo/redis"
)

func TestMain(m *testing.M) { redistest.VerifyNoLeaks(m) }

// TestConformance runs the driver conformance suite over a redigo pool on
// a single server, the only deployment redigo knows, alone and with a
// replica to confirm writes on.
func TestConformance(t *testing.T) {
	dlocktest.Run(t, func(t testing.TB, d dlocktest.Deployment) dlock.Driver {
		return dlockredigo.New(newPool(t, d.Addrs[0]))
	}, dlocktest.Standalone, dlocktest.Replicated)
}

// newPool returns a pool of connections to addr, closed with the test.
func newPool(t testing.TB, addr string) *redis.Pool {
	pool := &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", addr, redis.DialReadTimeout(5*time.Second))
		},
		MaxIdle: 4,
	}
	t.Cleanup(func() { _ = pool.Close() })
	return pool
}

// TestClusterIsUnsupported: on a cluster node, names that another node
// serves fail with ErrUnsupported (the node answers MOVED), and so does
// List; names that node serves work.
func TestClusterIsUnsupported(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	locks := dlock.New(dlockredigo.New(newPool(t, c.Nodes[0].Addr())))
	defer locks.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	moved, served := 0, 0
	for i := range 12 {
		name := "n" + strconv.Itoa(i)
		l, err := locks.TryLock(ctx, name)
		var ce *dlockredigo.ClusterError
		switch {
		case err == nil:
			served++
			_ = l.Release(ctx)
		case errors.Is(err, dlock.ErrUnsupported) && errors.As(err, &ce):
			moved++
		default:
			t.Errorf("TryLock(%q): %v, want ErrUnsupported or success", name, err)
		}
	}
	if moved == 0 || served == 0 {
		t.Errorf("%d names served by the node, %d moved: want some of each", served, moved)
	}
	if _, err := locks.List(ctx, ""); !errors.Is(err, dlock.ErrUnsupported) {
		t.Errorf("List on a cluster node: err = %v, want ErrUnsupported", err)
	}
}

// A request whose context has no deadline ends after the driver's timeout
// when the server hangs: a pool dialed without a read timeout would wait
// for as long as the server does.
func TestARequestToAHungServerEnds(t *testing.T) {
	srv := redistest.Start(t)
	pool := &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", srv.Addr())
		},
		MaxIdle: 4,
	}
	defer pool.Close()
	tryLockOnAHungServerTimesOut(t, srv, pool)
}

// A pool's TestOnBorrowContext is given the request's context, bounded by
// the driver's timeout: a PING in it (redis.DoContext) to a server that
// hangs fails the request in time, where a TestOnBorrow, given no context,
// waits for as long as the connection's read timeout, without one for ever.
func TestATestOnBorrowContextIsBoundedByTheRequest(t *testing.T) {
	srv := redistest.Start(t)
	pool := &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", srv.Addr())
		},
		TestOnBorrowContext: func(ctx context.Context, c redis.Conn, _ time.Time) error {
			_, err := redis.DoContext(c, ctx, "PING")
			return err
		},
		MaxIdle: 4,
	}
	defer pool.Close()
	tryLockOnAHungServerTimesOut(t, srv, pool)
}

// tryLockOnAHungServerTimesOut takes and releases a lock through pool
// (which leaves an idle connection), pauses srv, and checks that a
// TryLock through a driver with a 300ms timeout fails with a timeout
// instead of waiting for the server.
func tryLockOnAHungServerTimesOut(t *testing.T, srv *redistest.Server, pool *redis.Pool) {
	t.Helper()
	locks := dlock.New(dlockredigo.New(pool, dlockredigo.WithTimeout(300*time.Millisecond)))
	defer locks.Close()
	ctx := context.Background()
	l, err := locks.TryLock(ctx, "warm")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	resume := srv.PauseAWhile(t)
	done := make(chan error, 1)
	go func() {
		_, err := locks.TryLock(ctx, "hung")
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		resume()
		t.Fatal("TryLock still waits on the hung server")
	}
	resume()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("err = %v, want a timeout", err)
	}
}

// A request whose context never ends does not wait for ever on a dial that
// stalls (a host that vanished, a sentinel that does not answer): taking a
// connection is bounded by WithTimeout too.
func TestARequestOnAStalledDialEnds(t *testing.T) {
	srv := redistest.Start(t)
	var stalled atomic.Bool
	pool := &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			if stalled.Load() {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return redis.DialContext(ctx, "tcp", srv.Addr())
		},
	}
	defer pool.Close()
	locks := dlock.New(dlockredigo.New(pool, dlockredigo.WithTimeout(300*time.Millisecond)))
	defer locks.Close()
	ctx := context.Background()
	l, err := locks.TryLock(ctx, "before-the-stall", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	stalled.Store(true)
	done := make(chan error, 2)
	go func() { _, err := locks.TryLock(ctx, "stalled"); done <- err }()
	go func() { done <- l.Release(ctx) }()
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("err = %v, want the bound's DeadlineExceeded", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a request still waits on the stalled dial")
		}
	}
	stalled.Store(false)
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release once dials work again: %v", err)
	}
}

// A subscription whose connection is cut off without a reset (no reply,
// no error) notices by its pings and subscribes again on a new one.
func TestASilentlyCutSubscriptionComesBack(t *testing.T) {
	defer dlockredigo.SetPing(50*time.Millisecond, 200*time.Millisecond)()
	srv := redistest.Start(t)
	px := redistest.StartCutProxy(t, srv.Addr())
	pool := &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", px.Addr())
		},
	}
	defer pool.Close()
	got := make(chan string, 16)
	sub, err := dlockredigo.New(pool).Subscribe(context.Background(), func(ch, payload string) { got <- payload })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(context.Background(), "news"); err != nil {
		t.Fatal(err)
	}
	publish := func(msg string) bool {
		deadline := time.After(10 * time.Second)
		for {
			srv.Do(t, "PUBLISH", "news", msg)
			select {
			case p := <-got:
				if p == msg {
					return true
				}
			case <-time.After(50 * time.Millisecond):
			case <-deadline:
				return false
			}
		}
	}
	if !publish("before") {
		t.Fatal("no message before the cut")
	}
	px.Cut() // the connections open now go silent; new ones work
	if !publish("after") {
		t.Fatal("no message after the cut: the silent connection was kept")
	}
}

// TestAnIdleConnectionTheServerClosedIsReplaced: redigo's pool hands out
// an idle connection the server has closed (CLIENT KILL, its timeout)
// unchecked; a call that finds it closed runs again on a new connection.
func TestAnIdleConnectionTheServerClosedIsReplaced(t *testing.T) {
	srv := redistest.Start(t)
	drv := dlockredigo.New(newPool(t, srv.Addr()))
	echo := dlock.NewScript("echo", "return ARGV[1]")
	warm := &dlock.Call{Script: echo, Args: []any{"warm"}}
	drv.Eval(context.Background(), warm) // leaves an idle connection in the pool
	if warm.Err != nil {
		t.Fatal(warm.Err)
	}
	srv.Do(t, "CLIENT", "KILL", "TYPE", "normal")
	call := &dlock.Call{Script: echo, Args: []any{"again"}}
	drv.Eval(context.Background(), call)
	if call.Err != nil || call.Val != "again" {
		t.Errorf("after the idle connection was closed: %v, %v; want the reply", call.Val, call.Err)
	}
}

// TestAListOnAnIdleConnectionTheServerClosedIsSentAgain: List, whose SCAN
// takes an idle connection of the pool as every request does, runs again
// on a new connection when the server had closed it (CLIENT KILL, its
// timeout, a restart), as a script call does.
func TestAListOnAnIdleConnectionTheServerClosedIsSentAgain(t *testing.T) {
	srv := redistest.Start(t)
	locks := dlock.New(dlockredigo.New(newPool(t, srv.Addr())))
	defer locks.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := locks.TryLock(ctx, "listed") // leaves an idle connection in the pool
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	srv.Do(t, "CLIENT", "KILL", "TYPE", "normal")
	got, err := locks.List(ctx, "")
	if err != nil || len(got) != 1 || got[0].Name != "listed" {
		t.Errorf("List after the idle connection was closed: %v, %v; want the lock held", got, err)
	}
}

// TestABatchToAHungServerEnds: a batch too large for the socket's buffers,
// of large calls or of many small ones, sent to a server that stopped
// reading, ends at its context's deadline too; the connection is dropped,
// so that the next request gets its own reply.
func TestABatchToAHungServerEnds(t *testing.T) {
	srv := redistest.Start(t)
	pool := &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", srv.Addr()) // no read or write timeout
		},
		MaxIdle: 4,
	}
	defer pool.Close()
	drv := dlockredigo.New(pool)
	echo := dlock.NewScript("echo", "return ARGV[1]")
	for _, tc := range []struct {
		name  string
		calls int
		size  int
	}{
		{"large calls", 200, 32 << 10},
		{"many small calls", 60000, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			warm := &dlock.Call{Script: echo, Args: []any{"warm"}}
			drv.Eval(context.Background(), warm)
			if warm.Err != nil {
				t.Fatal(warm.Err)
			}
			srv.Pause(t)
			arg := strings.Repeat("x", tc.size)
			calls := make([]*dlock.Call, tc.calls)
			for i := range calls {
				calls[i] = &dlock.Call{Script: echo, Args: []any{arg}}
			}
			evalOnHungServer(t, srv, drv, 300*time.Millisecond, calls)
			for _, i := range []int{0, len(calls) - 1} {
				if !errors.Is(calls[i].Err, context.DeadlineExceeded) {
					t.Errorf("call %d: %v, %v; want an error matching the deadline", i, calls[i].Val, calls[i].Err)
				}
			}
			next := &dlock.Call{Script: echo, Args: []any{"next"}}
			drv.Eval(context.Background(), next)
			if next.Err != nil || next.Val != "next" {
				t.Errorf("the next request got %v, %v; want its own reply", next.Val, next.Err)
			}
		})
	}
}

// pauseAtEval is a connection that stops its server (SIGSTOP) when the
// first EVAL is written on it: the calls' retry after NOSCRIPT.
type pauseAtEval struct {
	redis.Conn
	pause func()
}

func (c *pauseAtEval) Send(cmd string, args ...any) error {
	if cmd == "EVAL" {
		c.pause()
	}
	return c.Conn.Send(cmd, args...)
}

func (c *pauseAtEval) DoContext(ctx context.Context, cmd string, args ...any) (any, error) {
	if cmd == "EVAL" {
		c.pause()
	}
	return c.Conn.(redis.ConnWithContext).DoContext(ctx, cmd, args...)
}

func (c *pauseAtEval) ReceiveContext(ctx context.Context) (any, error) {
	return c.Conn.(redis.ConnWithContext).ReceiveContext(ctx)
}

// TestARetryOfLargeScriptsToAHungServerEnds: the retry by EVAL of calls
// the server answered NOSCRIPT carries each script's source; a batch of
// them, sent to a server that stopped reading, ends at its deadline too.
func TestARetryOfLargeScriptsToAHungServerEnds(t *testing.T) {
	srv := redistest.Start(t)
	var once sync.Once
	pool := &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			c, err := redis.DialContext(ctx, "tcp", srv.Addr()) // no read or write timeout
			if err != nil {
				return nil, err
			}
			return &pauseAtEval{Conn: c, pause: func() { once.Do(func() { srv.Pause(t) }) }}, nil
		},
		MaxIdle: 4,
	}
	defer pool.Close()
	drv := dlockredigo.New(pool)
	big := dlock.NewScript("big", "-- "+strings.Repeat("x", 30<<10)+"\nreturn ARGV[1]")
	calls := make([]*dlock.Call, 400) // 12 MB of scripts by EVAL
	for i := range calls {
		calls[i] = &dlock.Call{Script: big, Args: []any{"v"}}
	}
	evalOnHungServer(t, srv, drv, 500*time.Millisecond, calls)
	if !errors.Is(calls[0].Err, context.DeadlineExceeded) {
		t.Errorf("call 0: %v, %v; want an error matching the deadline", calls[0].Val, calls[0].Err)
	}
}

// evalOnHungServer runs calls with a deadline of d on srv, which is paused
// or pauses meanwhile, and resumes it once Eval has returned; it fails the
// test if Eval still waits 20s on. The pools given dial with no read or
// write timeout: a driver that ignored the context would wait for the
// server until it resumed, and only the 20s bound would end it.
func evalOnHungServer(t *testing.T, srv *redistest.Server, drv *dlockredigo.Driver, d time.Duration, calls []*dlock.Call) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		drv.Eval(ctx, calls...)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		srv.Resume(t)
		<-done
		t.Fatal("Eval still waited on the hung server after 20s: it ignores its context")
	}
	srv.Resume(t)
}

// TestARefusedSubscribeIsReported: the first Subscribe waits for the
// server's answer, so that an ACL user who may not listen on dlock's
// channels is told: dlock logs it, and its waiting callers poll by their
// retry strategy. The refusal went unseen: the waiters slept for their
// beat, half a second, at every hand-off, and nothing was logged.
func TestARefusedSubscribeIsReported(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "ACL", "SETUSER", "locker", "on", ">s3cret", "resetkeys", "~dlock:*", "resetchannels", "&other:*", "+@all")
	pool := &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", srv.Addr(), redis.DialUsername("locker"), redis.DialPassword("s3cret"))
		},
		MaxIdle: 4,
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	sub, err := dlockredigo.New(pool).Subscribe(ctx, func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Subscribe(ctx, "dlock:client:x"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("Subscribe to a channel the user may not listen on: err = %v, want NOPERM", err)
	}
	_ = sub.Close()

	var logs redistest.Buffer
	waiter := dlock.New(dlockredigo.New(pool), dlock.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	defer waiter.Close()
	holder := dlock.New(dlockredigo.New(pool))
	defer holder.Close()
	l, err := holder.TryLock(ctx, "x", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan struct{})
	var once sync.Once
	got := make(chan error, 1)
	go func() {
		w, err := waiter.Lock(ctx, "x", dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
		if err == nil {
			err = w.Release(ctx)
		}
		got <- err
	}()
	<-refused
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	if log := logs.String(); !strings.Contains(log, "cannot subscribe") || !strings.Contains(log, "NOPERM") {
		t.Errorf("the refused subscription was not logged: %q", log)
	}
}

// TestAnErrorReplyOnAConfirmedSubscriptionKeepsIt: an UNSUBSCRIBE answered
// BUSY (another client's script runs) on a connection whose channels the
// server confirmed leaves the connection as it is: no new one is dialed,
// and the other channel's messages go on with no notice that some were
// lost.
func TestAnErrorReplyOnAConfirmedSubscriptionKeepsIt(t *testing.T) {
	srv := redistest.Start(t)
	var dials atomic.Int32
	pool := &redis.Pool{
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			dials.Add(1)
			return redis.DialContext(ctx, "tcp", srv.Addr())
		},
		MaxIdle: 4,
	}
	defer pool.Close()
	ctx := context.Background()
	got := make(chan string, 16)
	sub, err := dlockredigo.New(pool).Subscribe(ctx, func(ch, p string) { got <- ch + " " + p })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(ctx, "kept", "dropped"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); srv.Do(t, "PUBSUB", "NUMSUB", "kept", "dropped") != "kept\n1\ndropped\n1"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the channels were not subscribed within 5s")
		}
	}
	before := dials.Load()
	end := srv.Busy(t)
	if err := sub.Unsubscribe(ctx, "dropped"); err != nil {
		t.Fatal(err)
	}
	end()
	srv.Do(t, "PUBLISH", "kept", "after")
	select {
	case m := <-got:
		if m != "kept after" {
			t.Errorf("after an UNSUBSCRIBE answered BUSY, notify got %q first, want the message", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no message within 10s")
	}
	if n := dials.Load() - before; n != 0 {
		t.Errorf("%d connections dialed after an error reply on a sound one", n)
	}
}

// tapped is a driver that runs a function armed for it once its next Eval
// has returned.
type tapped struct {
	dlock.Driver
	mu   sync.Mutex
	then func()
}

func (d *tapped) Eval(ctx context.Context, calls ...*dlock.Call) {
	d.Driver.Eval(ctx, calls...)
	d.mu.Lock()
	f := d.then
	d.then = nil
	d.mu.Unlock()
	if f != nil {
		f()
	}
}

func (d *tapped) afterNext(f func()) {
	d.mu.Lock()
	d.then = f
	d.mu.Unlock()
}

// TestAReleaseWithNoConnectionFreeIsSentAgain: a Release that the pool had
// no connection for (MaxActive reached, without Wait) goes again a little
// later, once one is free, and frees the name.
func TestAReleaseWithNoConnectionFreeIsSentAgain(t *testing.T) {
	srv := redistest.Start(t)
	pool := newPool(t, srv.Addr())
	pool.MaxActive = 1
	ctx := context.Background()
	d := &tapped{Driver: dlockredigo.New(pool)}
	c := dlock.New(d)
	defer c.Close()
	l, err := c.TryLock(ctx, "pool", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// The pool's only connection, taken until the Release and the copy
	// sent at once after it failed.
	held := pool.Get()
	if err := held.Err(); err != nil {
		t.Fatal(err)
	}
	d.afterNext(func() { d.afterNext(func() { _ = held.Close() }) })
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release with no connection free, then sent again: %v", err)
	}
	if got := srv.Do(t, "HGET", c.RedisKey("pool"), "token"); got != "" {
		t.Errorf("the name is still held after Release (token %q)", got)
	}
}

// plainConn is a connection wrapper that passes on only redis.Conn, as
// instrumentation may.
type plainConn struct{ redis.Conn }

// TestAConnectionThatCannotBeBoundedIsUnsupported: a pool whose Dial wraps
// its connections in a type without DoContext and DoWithTimeout, by which
// dlock bounds each request, gets ErrUnsupported, and a wait ends at once.
func TestAConnectionThatCannotBeBoundedIsUnsupported(t *testing.T) {
	srv := redistest.Start(t)
	pool := &redis.Pool{
		Dial: func() (redis.Conn, error) {
			c, err := redis.Dial("tcp", srv.Addr())
			return plainConn{c}, err
		},
		MaxIdle: 4,
	}
	defer pool.Close()
	c := dlock.New(dlockredigo.New(pool))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.TryLock(ctx, "plain"); !errors.Is(err, dlock.ErrUnsupported) {
		t.Errorf("TryLock: %v, want ErrUnsupported", err)
	}
	if _, err := c.Lock(ctx, "plain"); !errors.Is(err, dlock.ErrUnsupported) || ctx.Err() != nil {
		t.Errorf("Lock: %v (its context: %v), want ErrUnsupported at once", err, ctx.Err())
	}
}

// TestAClosedPoolEndsAWaitAtOnce: once the pool under the driver is closed
// (a shutdown that closes it first), a wait fails at once with an error
// matching dlock.ErrClosed, rather than trying for its whole max wait.
func TestAClosedPoolEndsAWaitAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	pool := newPool(t, srv.Addr())
	c := dlock.New(dlockredigo.New(pool))
	defer c.Close()
	_ = pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Lock(ctx, "closed"); !errors.Is(err, dlock.ErrClosed) || ctx.Err() != nil {
		t.Errorf("a wait after its pool closed: %v (its context: %v), want ErrClosed at once", err, ctx.Err())
	}
}

// TestARefusalForGoodEndsAWaitAtOnce: over redigo, a refusal that no
// retry changes ends a wait at its first attempt with an error that
// matches dlock.ErrDenied and keeps Redis's words: a missing or wrong
// password, a missing permission, a server without the script commands,
// a server certificate the client does not trust (which a wait tried
// again until its max wait).
func TestARefusalForGoodEndsAWaitAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "ACL", "SETUSER", "noscripts", "on", ">s3cret", "~*", "&*", "+@all", "-evalsha", "-eval")
	srv.Do(t, "CONFIG", "SET", "requirepass", "pw") // last: srv.Do has no password
	noScripts := redistest.Start(t, redistest.WithArgs("--rename-command", "EVALSHA", "", "--rename-command", "EVAL", ""))
	certs := redistest.NewTLS(t)
	tlsSrv := redistest.Start(t, redistest.WithTLS(certs))
	for _, tc := range []struct {
		name string
		addr string
		opts []redis.DialOption
		want string
	}{
		{"no password", srv.Addr(), nil, "not authenticated (NOAUTH)"},
		{"wrong password", srv.Addr(), []redis.DialOption{redis.DialPassword("wrong")}, "WRONGPASS"},
		{"no permission", srv.Addr(), []redis.DialOption{redis.DialUsername("noscripts"), redis.DialPassword("s3cret")}, "NOPERM"},
		{"no script commands", noScripts.Addr(), nil, "unknown command"},
		{"an unknown authority", tlsSrv.Addr(), []redis.DialOption{redis.DialUseTLS(true), redis.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12})},
			"certificate signed by unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := &redis.Pool{
				DialContext: func(ctx context.Context) (redis.Conn, error) {
					return redis.DialContext(ctx, "tcp", tc.addr, append([]redis.DialOption{redis.DialReadTimeout(5 * time.Second)}, tc.opts...)...)
				},
				MaxIdle: 4,
			}
			t.Cleanup(func() { _ = pool.Close() })
			c := dlock.New(dlockredigo.New(pool))
			t.Cleanup(func() { _ = c.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			retried := false
			_, err := c.Lock(ctx, "x", dlock.WithOnRetry(func(_ int, err error) {
				if tc.name == "no password" && dlock.ConnectionClosed(err) {
					// Redis closes the connection after its refusal: a
					// reset may reach the client before the refusal does.
					return
				}
				retried = true
				cancel() // the wait would go on
			}))
			var se *dlock.ServerError
			if retried || !errors.As(err, &se) || !errors.Is(err, dlock.ErrDenied) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Lock: retried %v, err = %v; want no retry and a *ServerError saying %q that matches ErrDenied", retried, err, tc.want)
			}
			// TryLock, after the wait has met the refusal.
			tctx, tcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer tcancel()
			if _, err := c.TryLock(tctx, "y"); !errors.Is(err, dlock.ErrDenied) {
				t.Errorf("TryLock: err = %v, want one that matches ErrDenied", err)
			}
		})
	}
}

// TestAWaiterWhosePoolClosedIsNotGrantedTheLock: a Lock that waits with its
// request for a grant when the application closes the pool under the
// driver ends with ErrClosed, and the client stops listening for notices:
// the release that follows passes over it. Its subscription, dialed apart
// from the pool, stayed open, so the release granted it the lock, which
// nobody could give back through the closed pool: the name stayed held,
// by nobody, for the waiter's TTL.
func TestAWaiterWhosePoolClosedIsNotGrantedTheLock(t *testing.T) {
	srv := redistest.Start(t)
	h := dlock.New(dlockredigo.New(newPool(t, srv.Addr())))
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	held, err := h.TryLock(ctx, "job", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	pool := newPool(t, srv.Addr())
	c := dlock.New(dlockredigo.New(pool))
	defer c.Close()
	got := make(chan error, 1)
	refused := make(chan struct{})
	var once sync.Once
	go func() {
		_, err := c.Lock(ctx, "job", dlock.WithTTL(20*time.Second), dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
		got <- err
	}()
	<-refused // it waits, with its request for a grant
	_ = pool.Close()
	if err := <-got; !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("the wait: %v, want ErrClosed", err)
	}
	// The server has seen its subscription go (or, before, never did; the
	// release comes within its registration's lease all the same).
	for end := time.Now().Add(200 * time.Millisecond); srv.PubSubConnections(t) > 0 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := h.TryLock(ctx, "job")
	if err != nil {
		t.Fatalf("after the only holder released: %v (PTTL %s)", err, srv.Do(t, "PTTL", "dlock:{job}"))
	}
	_ = l.Release(ctx)
}

// PoolSize is the pool's MaxActive (see dlock.Pooled): 0, no bound, by
// default.
func TestPoolSizeIsMaxActive(t *testing.T) {
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", "127.0.0.1:1") }}
	if got := dlockredigo.New(pool).PoolSize(); got != 0 {
		t.Errorf("PoolSize = %d without MaxActive, want 0", got)
	}
	pool.MaxActive = 5
	if got := dlockredigo.New(pool).PoolSize(); got != 5 {
		t.Errorf("PoolSize = %d, want MaxActive, 5", got)
	}
}

// New panics on a pool that can make no connection, as on a nil one: a
// wait would retry its failures to its max wait.
func TestNewPanicsOnAPoolThatCannotDial(t *testing.T) {
	for name, pool := range map[string]*redis.Pool{"nil": nil, "without Dial": {MaxIdle: 1}} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "redigo: New with a") {
					t.Errorf("New of a %s pool: recovered %v, want redigo's own panic", name, r)
				}
			}()
			dlockredigo.New(pool)
		}()
	}
}
