package main

// Tests of dlock itself that the fault suite led to: each one shows a
// behaviour the suite measured, in a form small enough to debug.

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/redis/go-redis/v9"
)

// A holder whose Release fails (here: the connection to Redis is refused
// while it is sent) has given the lock up. The watchdog must stop
// refreshing it then, so that it runs out within its TTL as a crashed
// holder's lock would, instead of being kept alive for as long as the
// client lives.
func TestFailedReleaseStopsTheRefreshing(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	srv, err := startServer()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	px, err := newFaultProxy("redis", srv.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer px.close()
	locks, closeClient := newLockClient(px.addr(), "dlock:")
	defer closeClient()
	view := redis.NewClient(&redis.Options{Addr: srv.addr()})
	defer view.Close()

	ctx := context.Background()
	l, err := locks.Lock(ctx, "job", dlock.WithTTL(ttl), dlock.WithAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	px.partition()
	rctx, cancel := context.WithTimeout(ctx, ttl/3)
	err = l.Release(rctx)
	cancel()
	if err == nil {
		t.Fatal("Release through a partition returned nil")
	}
	if err := px.heal(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * ttl)
	if token, _ := view.HGet(ctx, locks.RedisKey("job"), "token").Result(); token == l.Token() {
		t.Errorf("%v after a Release that failed (%v), the lock is still held with its token: the watchdog kept refreshing it", 3*ttl, err)
	}
}

// A holder whose process was stopped past its lock's deadline must find
// Done closed when it resumes and looks (and the resource must refuse its
// write). The pause scenario, with 6 pauses.
func TestStoppedHoldersFindDoneClosed(t *testing.T) {
	t.Parallel()
	r := runPause(config{quick: true, seed: 1, outDir: t.TempDir(), pauses: 6})
	for _, p := range r.problems() {
		t.Error(p)
	}
	for _, f := range r.figures {
		t.Logf("%s: %s", f[0], f[1])
	}
}

// A Release whose reply is lost (the connection closes after Redis ran it)
// is sent again by go-redis, which retries failed commands by default.
// Redis has released the lock by then, and must answer the second run as
// it answered the first: the lock was released.
func TestReleaseRunTwiceReportsSuccess(t *testing.T) {
	t.Parallel()
	srv, px, locks := cutReplyEnv(t)
	ctx := context.Background()
	l, err := locks.TryLock(ctx, "job", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	view := redis.NewClient(&redis.Options{Addr: srv.addr()})
	defer view.Close()
	if err := px.toxic("cut", "cut_once", "downstream", map[string]int64{"times": 1}); err != nil {
		t.Fatal(err)
	}
	resetStats(t, view)
	err = l.Release(ctx)
	if n := scriptRuns(t, view); n != 2 {
		t.Fatalf("the release ran %d times, want 2 (the first reply cut, the request sent again)", n)
	}
	if tok, _ := view.HGet(ctx, locks.RedisKey("job"), "token").Result(); tok != "" { // a released lock's hash has no token
		t.Fatalf("the lock is still there after Release (err %v)", err)
	}
	if err != nil {
		t.Errorf("Release released the lock, then its re-sent request said %v", err)
	}
}

// The same with a lock its owner holds twice (WithOwner): releasing one
// hold must leave the other, however many times the request runs.
func TestReentrantReleaseRunTwiceKeepsTheOtherHold(t *testing.T) {
	t.Parallel()
	srv, px, locks := cutReplyEnv(t)
	ctx := context.Background()
	first, err := locks.TryLock(ctx, "job", dlock.WithTTL(time.Minute), dlock.WithOwner("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := locks.TryLock(ctx, "job", dlock.WithTTL(time.Minute), dlock.WithOwner("worker-1")); err != nil {
		t.Fatal(err)
	}
	view := redis.NewClient(&redis.Options{Addr: srv.addr()})
	defer view.Close()
	if err := px.toxic("cut", "cut_once", "downstream", map[string]int64{"times": 1}); err != nil {
		t.Fatal(err)
	}
	resetStats(t, view)
	err = first.Release(ctx)
	if n := scriptRuns(t, view); n != 2 {
		t.Fatalf("the release ran %d times, want 2 (the first reply cut, the request sent again)", n)
	}
	other, closeOther := newLockClient(srv.addr(), "dlock:")
	defer closeOther()
	if l, oerr := other.TryLock(ctx, "job"); oerr == nil {
		_ = l.Release(ctx)
		t.Errorf("releasing one of two holds (Release said %v) freed the lock: another client obtained it while the second hold was held", err)
	}
}

// resetStats clears the server's command counts (see scriptRuns).
func resetStats(t *testing.T, view *redis.Client) {
	t.Helper()
	if err := view.ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

// scriptRuns returns how many scripts the server ran by EVALSHA since
// resetStats.
func scriptRuns(t *testing.T, view *redis.Client) int {
	t.Helper()
	info, err := view.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// cutReplyEnv starts a server, a fault proxy in front of it and a client
// through the proxy, which has already run each script once (so that the
// cut reply is not a NOSCRIPT).
func cutReplyEnv(t *testing.T) (*server, *faultProxy, *dlock.Client) {
	srv, err := startServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.stop)
	px, err := newFaultProxy("redis", srv.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.close)
	locks, closeClient := newLockClient(px.addr(), "dlock:")
	t.Cleanup(closeClient)
	warm, err := locks.TryLock(context.Background(), "warm-up")
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	return srv, px, locks
}
