package main

// Tests of dlock itself that the fault suite led to: each one shows a
// behaviour the suite measured, in a form small enough to debug.

import (
	"context"
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
