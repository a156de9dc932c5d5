package goredis_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/dlocktest"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/keyslot"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.VerifyNoLeaks(m) }

// TestConformance runs the driver conformance suite over a go-redis client
// of each kind: a single node, a cluster, and a failover client that finds
// the primary through the sentinels.
func TestConformance(t *testing.T) {
	dlocktest.Run(t, newDriver, dlocktest.Standalone, dlocktest.Cluster, dlocktest.Sentinel)
}

func newDriver(t testing.TB, d dlocktest.Deployment) dlock.Driver {
	var rdb redis.UniversalClient
	switch d.Topology {
	case dlocktest.Cluster:
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: d.Addrs, ContextTimeoutEnabled: true})
	case dlocktest.Sentinel:
		rdb = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: d.MasterName, SentinelAddrs: d.Addrs, ContextTimeoutEnabled: true})
	default:
		rdb = redis.NewClient(&redis.Options{Addr: d.Addrs[0], ContextTimeoutEnabled: true})
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return goredis.New(rdb)
}

// newRing starts two servers and returns them, a go-redis Ring over them
// and a dlock client on it, closed with the test.
func newRing(t *testing.T) ([]*redistest.Server, *redis.Ring, *dlock.Client) {
	srvs := redistest.StartMasters(t, 2)
	rdb := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srvs[0].Addr(), "b": srvs[1].Addr()}})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	return srvs, rdb, c
}

// TestARingIsPartitioned: a Ring spreads keys over its shards, and the
// driver tells a key's shard as the Ring finds it, so that its client
// batches each shard's requests apart; a shard that stalls does not cost
// the client its automatically refreshed locks on the other.
func TestARingIsPartitioned(t *testing.T) {
	srvs, rdb, c := newRing(t)
	d := goredis.New(rdb)
	if !d.Partitioned() {
		t.Error("Partitioned() = false on a Ring")
	}
	ctx := context.Background()
	on := map[string]string{} // a key on each shard, by address
	for i := 0; len(on) < len(srvs) && i < 1000; i++ {
		key := "{k" + strconv.Itoa(i) + "}"
		if err := rdb.Set(ctx, key, "x", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		for _, srv := range srvs {
			if srv.Do(t, "EXISTS", key) == "1" {
				if got := d.Server(ctx, key); got != srv.Addr() {
					t.Fatalf("Server(%q) = %q; the Ring put it on %s", key, got, srv.Addr())
				}
				on[srv.Addr()] = key
			}
		}
	}
	stalled, healthy := srvs[0], srvs[1]
	long, err := c.TryLock(ctx, on[stalled.Addr()], dlock.WithTTL(3*time.Second), dlock.WithAutoRefresh(), dlock.WithRefreshInterval(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	short, err := c.TryLock(ctx, on[healthy.Addr()], dlock.WithTTL(600*time.Millisecond), dlock.WithAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	stalled.Pause(t)
	time.Sleep(time.Second) // the stall: under the Ring's heartbeat failures that take a shard out
	stalled.Resume(t)
	select {
	case <-short.Done():
		t.Errorf("the lock on the other shard was lost through the stall: %v", short.Err())
	default:
	}
	if err := short.Release(ctx); err != nil {
		t.Error(err)
	}
	_ = long.Release(ctx)
}

// TestRingRefusesLocksAcrossShards: a Ring sends a script to its first
// key's shard, so a lock on names of several hash tags is refused rather
// than taken where another client would not see it; locks whose names
// share a tag, and one-name locks, work. A waiting acquire is refused at
// once, as WithReplicas is, which a Ring cannot do either.
func TestRingRefusesLocksAcrossShards(t *testing.T) {
	srvs, _, c := newRing(t)
	ctx := context.Background()

	if _, err := c.TryLockMulti(ctx, []string{"orders", "invoices"}); !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("names of two tags: err = %v, want ErrUnsupported", err)
	}
	for _, srv := range srvs {
		if keys := srv.Do(t, "KEYS", "*"); keys != "" {
			t.Errorf("a refused lock left keys on %s: %q", srv.Addr(), keys)
		}
	}
	// A waiting acquire ends at once: no retry makes the driver able.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := c.LockMulti(wctx, []string{"orders", "invoices"}); !errors.Is(err, dlock.ErrUnsupported) || wctx.Err() != nil {
		t.Fatalf("waiting for names of two tags: err = %v (wait's context: %v), want ErrUnsupported at once", err, wctx.Err())
	}
	if _, err := c.Lock(wctx, "orders", dlock.WithReplicas(1, time.Second)); !errors.Is(err, dlock.ErrUnsupported) || wctx.Err() != nil {
		t.Fatalf("waiting WithReplicas on a Ring: err = %v (wait's context: %v), want ErrUnsupported at once", err, wctx.Err())
	}
	for _, names := range [][]string{{"orders"}, {"{order:42}:pay", "{order:42}:ship"}} {
		l, err := c.TryLockMulti(ctx, names)
		if err != nil {
			t.Fatalf("%q: %v", names, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("%q: Release: %v", names, err)
		}
	}
}

// embeddedRing is a type of the caller's that embeds a Ring, as a wrapper
// that instruments one would.
type embeddedRing struct{ *redis.Ring }

// wrapped is a type of the caller's that wraps any go-redis client by
// embedding the interface, as an instrumenting wrapper would; it counts
// the requests by EVALSHA and the pipelines sent through it.
type wrapped struct {
	redis.UniversalClient
	sent *atomic.Int64
}

func wrap(rdb redis.UniversalClient) wrapped { return wrapped{rdb, new(atomic.Int64)} }

func (w wrapped) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	w.sent.Add(1)
	return w.UniversalClient.EvalSha(ctx, sha1, keys, args...)
}

func (w wrapped) Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	w.sent.Add(1)
	return w.UniversalClient.Pipelined(ctx, fn)
}

// sentThrough fails t when rdb is a wrapped that nothing was sent through.
func sentThrough(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	if w, ok := rdb.(wrapped); ok && w.sent.Load() == 0 {
		t.Errorf("nothing was sent through the %T", rdb)
	}
}

// TestATypeThatWrapsARingIsARing: a client that embeds a Ring, or a
// redis.UniversalClient that holds one (or holds such a wrapper), is a
// Ring for the driver. Taken for a single server, it ran a lock on names
// of two hash tags on the first name's shard, and another client then took
// the second name on its own shard: two holders at once. The requests go
// through the wrapper.
func TestATypeThatWrapsARingIsARing(t *testing.T) {
	srvs, rdb, c := newRing(t)
	for _, tc := range []struct {
		name string
		rdb  redis.UniversalClient
	}{
		{"embeds the Ring", embeddedRing{rdb}},
		{"embeds a UniversalClient", wrap(rdb)},
		{"wraps a wrapper", wrap(wrap(rdb))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, srv := range srvs {
				srv.Do(t, "FLUSHALL") // the fences of the cases before
			}
			d := goredis.New(tc.rdb)
			if !d.Partitioned() {
				t.Errorf("Partitioned() = false on a %T that wraps a Ring", tc.rdb)
			}
			through := dlock.New(d)
			t.Cleanup(func() { _ = through.Close() })
			ctx := context.Background()
			if l, err := through.TryLockMulti(ctx, []string{"orders", "invoices"}); !errors.Is(err, dlock.ErrUnsupported) {
				if err == nil {
					_ = l.Release(ctx)
				}
				t.Fatalf("names of two tags: err = %v, want ErrUnsupported", err)
			}
			for _, srv := range srvs {
				if keys := srv.Do(t, "KEYS", "*"); keys != "" {
					t.Errorf("a refused lock left keys on %s: %q", srv.Addr(), keys)
				}
			}
			// One name's lock is the Ring's: the other client sees it.
			l, err := through.TryLock(ctx, "orders")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.TryLock(ctx, "orders"); !errors.Is(err, dlock.ErrNotObtained) {
				t.Errorf("a name held through the wrapping type: TryLock = %v, want ErrNotObtained", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			sentThrough(t, tc.rdb)
		})
	}
}

// TestATypeThatWrapsAClientIsASingleServer: a redis.UniversalClient that
// holds a Client is a single server, with the Client's pool, and the
// requests go through it.
func TestATypeThatWrapsAClientIsASingleServer(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 7})
	t.Cleanup(func() { _ = rdb.Close() })
	w := wrap(rdb)
	d := goredis.New(w)
	if d.Partitioned() {
		t.Error("Partitioned() = true on a wrapped Client")
	}
	if got := d.PoolSize(); got != 7 {
		t.Errorf("PoolSize() = %d, want the wrapped Client's 7", got)
	}
	c := dlock.New(d)
	defer c.Close()
	ctx := context.Background()
	l, err := c.TryLock(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	sentThrough(t, w)
}

// TestNewPanicsOnANilClient: a nil pointer to one of go-redis's clients is
// a nil client, refused with New's own panic rather than one from deep
// inside go-redis.
func TestNewPanicsOnANilClient(t *testing.T) {
	for _, rdb := range []redis.UniversalClient{nil, (*redis.Client)(nil), (*redis.ClusterClient)(nil), (*redis.Ring)(nil), (*wrapped)(nil)} {
		func() {
			defer func() {
				if r := recover(); r != "goredis: New with a nil client" {
					t.Errorf("New(%T(nil)): panic %v, want New's own", rdb, r)
				}
			}()
			goredis.New(rdb)
		}()
	}
	// A type that embeds one of them nil, or a redis.UniversalClient that
	// holds nil, one of them nil or such a type (a wrapper of a wrapper):
	// New's own panic, naming the type, where go-redis's nil dereference
	// came from inside Options, or from the first request.
	type ring struct{ *redis.Ring }
	type cluster struct{ *redis.ClusterClient }
	type client struct{ *redis.Client }
	for _, rdb := range []redis.UniversalClient{ring{}, cluster{}, client{},
		wrapped{}, wrap((*redis.Client)(nil)), wrap((*redis.ClusterClient)(nil)), wrap((*redis.Ring)(nil)),
		wrap(wrapped{}), wrap(cluster{}), wrap(&wrapped{}), wrap((*wrapped)(nil))} {
		func() {
			defer func() {
				r := recover()
				if msg, _ := r.(string); !strings.HasPrefix(msg, fmt.Sprintf("goredis: New with a %T that holds a nil client", rdb)) {
					t.Errorf("New(%#v): panic %v, want New's own", rdb, r)
				}
			}()
			goredis.New(rdb)
		}()
	}
}

// TestRingListsEveryShard: a Ring sends a keyless SCAN to a shard at
// random, so List walks every shard itself.
func TestRingListsEveryShard(t *testing.T) {
	srvs, rdb, c := newRing(t)
	ctx := context.Background()
	const names = 40
	for i := range names {
		if _, err := c.TryLock(ctx, "job:"+strconv.Itoa(i), dlock.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	for _, srv := range srvs {
		if srv.Do(t, "DBSIZE") == "0" {
			t.Fatalf("all the locks went to one shard; the test needs both")
		}
	}
	infos, err := c.List(ctx, "job:*")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != names {
		t.Errorf("List found %d locks, want %d", len(infos), names)
	}
	// A shard the Ring takes for down is not skipped without a word.
	srvs[1].Kill(t)
	awaitShardDown(t, rdb)
	if infos, err := c.List(ctx, "job:*"); err == nil {
		t.Errorf("List with a shard down: %d locks and no error", len(infos))
	}
}

// TestRingWaitsAndRunsFunctions: on a Ring, a Lock that must wait gets
// the lock once it is released (its waits poll: a Ring cannot subscribe),
// and WithFunctions loads the library on every shard.
func TestRingWaitsAndRunsFunctions(t *testing.T) {
	srvs, rdb, c := newRing(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	held, err := c.TryLock(ctx, "ring-wait")
	if err != nil {
		t.Fatal(err)
	}
	got, refused := make(chan error, 1), make(chan struct{})
	go func() {
		var once sync.Once
		l, err := c.Lock(ctx, "ring-wait", dlock.WithRetry(dlock.ConstantBackoff(20*time.Millisecond)),
			dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	select {
	case <-refused:
	case err := <-got:
		t.Fatalf("Lock returned before the lock was released: %v", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Lock waiting on a Ring: %v", err)
	}

	fc, err := dlock.Open(ctx, goredis.New(rdb), dlock.WithFunctions())
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	lockEach := func(prefix, what string) {
		t.Helper()
		for i := range 20 {
			l, err := fc.TryLock(ctx, prefix+strconv.Itoa(i))
			if err != nil {
				t.Fatalf("TryLock %d %s: %v", i, what, err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	lockEach("fn:", "with functions on a Ring")
	for _, srv := range srvs {
		if srv.Do(t, "FUNCTION", "LIST") == "" {
			t.Errorf("no library on %s", srv.Addr())
		}
	}

	// A shard down does not fail the calls of the others when the library
	// must be loaded again (a shard that restarted empty).
	srvs[1].Kill(t)
	awaitShardDown(t, rdb)
	srvs[0].Do(t, "FUNCTION", "FLUSH")
	lockEach("fn-again:", "with a shard down")
}

// awaitShardDown waits until rdb takes one of its two shards for down.
func awaitShardDown(t *testing.T, rdb *redis.Ring) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); rdb.Len() > 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the Ring did not take the killed shard for down")
		}
	}
}

// TestAWaitLongerThanTheReadTimeout: WithReplicas waits on the server for
// its own timeout, though go-redis reads a pipeline within the client's
// read timeout; the wait runs out as such (ErrNotReplicated, nothing
// held), not as an i/o timeout after go-redis sent the scripts again.
func TestAWaitLongerThanTheReadTimeout(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	for _, s := range dlock.Scripts() { // loaded: one round, one WAIT
		if err := rdb.ScriptLoad(ctx, s.Src).Err(); err != nil {
			t.Fatal(err)
		}
	}
	srv.Do(t, "CONFIG", "RESETSTAT")
	_, err := c.TryLock(ctx, "replicated", dlock.WithReplicas(1, 500*time.Millisecond))
	if !errors.Is(err, dlock.ErrNotReplicated) {
		t.Fatalf("TryLock with no replica: err = %v, want ErrNotReplicated", err)
	}
	if got := srv.Do(t, "INFO", "commandstats"); !strings.Contains(got, "cmdstat_wait:calls=1,") {
		t.Errorf("want one WAIT, the pipeline sent once:\n%s", got)
	}
	if tok := srv.Do(t, "HGET", "dlock:{replicated}", "token"); tok != "" && tok != "(nil)" {
		t.Errorf("a lock not replicated is still held: token %q", tok)
	}
}

// TestWithReplicasReportsWhyNothingWasSent: a pipeline with WAIT that
// go-redis could not send reports why (no server, or the context's
// deadline while it waited for a connection), not that WAIT's reply was
// missing.
func TestWithReplicasReportsWhyNothingWasSent(t *testing.T) {
	ctx := context.Background()
	t.Run("no server", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		c := dlock.New(goredis.New(rdb))
		t.Cleanup(func() { _ = c.Close() })
		_, err = c.TryLock(ctx, "a", dlock.WithReplicas(1, 100*time.Millisecond))
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("err = %v, want the refused connection's", err)
		}
	})
	t.Run("no connection before the deadline", func(t *testing.T) {
		srv := redistest.Start(t)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1, MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		c := dlock.New(goredis.New(rdb))
		t.Cleanup(func() { _ = c.Close() })
		if err := c.Prepare(ctx); err != nil {
			t.Fatal(err)
		}
		// The pool's only connection waits in BLPOP until the test ends.
		bctx, unblock := context.WithCancel(ctx)
		blocked := make(chan struct{})
		go func() {
			defer close(blocked)
			rdb.BLPop(bctx, 0, "never")
		}()
		defer func() {
			srv.Do(t, "CLIENT", "UNBLOCK", blpopClient(t, srv))
			unblock()
			<-blocked
		}()
		for end := time.Now().Add(5 * time.Second); blpopClient(t, srv) == ""; {
			if time.Now().After(end) {
				t.Fatal("BLPOP never reached the server")
			}
			time.Sleep(time.Millisecond)
		}
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := c.TryLock(tctx, "b", dlock.WithReplicas(1, 100*time.Millisecond))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want one matching context.DeadlineExceeded", err)
		}
	})
}

// blpopClient returns the id of the server's client waiting in BLPOP, or
// "" when there is none.
func blpopClient(t *testing.T, srv *redistest.Server) string {
	for _, line := range strings.Split(srv.Do(t, "CLIENT", "LIST"), "\n") {
		if strings.Contains(line, "cmd=blpop") {
			id, _, _ := strings.Cut(strings.TrimPrefix(line, "id="), " ")
			return id
		}
	}
	return ""
}

// TestARefusalOutlivesAFailedWait: when WAIT itself fails (here the user
// may not run it), the scripts' replies are kept: an acquire refused
// because another holds the name says so.
func TestARefusalOutlivesAFailedWait(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "ACL", "SETUSER", "nowait", "on", ">pw", "~*", "&*", "+@all", "-wait")
	holder := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = holder.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nowait", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	h := dlock.New(goredis.New(holder))
	t.Cleanup(func() { _ = h.Close() })
	if _, err := h.TryLock(ctx, "busy", dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.TryLock(ctx, "busy", dlock.WithReplicas(1, 100*time.Millisecond)); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("TryLock of a held name, WAIT refused: err = %v, want ErrNotObtained", err)
	}
}

// TestARingLoadsTheLibraryOnShardsAddedLater: with WithFunctions on a Ring
// whose shards changed (SetAddrs), the shard that now holds the names gets
// the library, and the calls run by FCALL there.
func TestARingLoadsTheLibraryOnShardsAddedLater(t *testing.T) {
	srvs := redistest.StartMasters(t, 2)
	rdb := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srvs[0].Addr()}})
	t.Cleanup(func() { _ = rdb.Close() })
	rdb.SetAddrs(map[string]string{"b": srvs[1].Addr()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := rdb.Set(ctx, "probe", "x", time.Minute).Err(); err == nil && srvs[1].Do(t, "EXISTS", "probe") == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Ring did not take the new shard")
		}
	}
	c, err := dlock.Open(ctx, goredis.New(rdb), dlock.WithFunctions())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 10 {
		l, err := c.TryLock(ctx, "ring-moved-"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lib := dlock.FunctionLibrary()
	if got := srvs[1].Do(t, "FUNCTION", "LIST", "LIBRARYNAME", lib.Name); !strings.Contains(got, lib.Name) {
		t.Errorf("the Ring's new shard has no library: %q", got)
	}
	for _, line := range strings.Split(srvs[1].Do(t, "INFO", "commandstats"), "\n") {
		if strings.HasPrefix(line, "cmdstat_eval:") || strings.HasPrefix(line, "cmdstat_evalsha:") {
			t.Errorf("calls ran as scripts on the new shard: %s", line)
		}
	}
}

// embeddedCluster is a type of the caller's that embeds a cluster client,
// as a wrapper that instruments one would.
type embeddedCluster struct{ *redis.ClusterClient }

// TestClusterSlotsOverStandaloneServers: a cluster client made with
// ClusterSlots over standalone servers, each given half of the slots,
// takes a lock on names of both halves slot by slot, each on its own
// server, as on a cluster: another client's lock on one of those names is
// refused. (The servers never refuse keys of slots they do not own: taken
// in one request, on the first name's server, the second name was locked
// twice.) So does one WithReplicas, each server with a replica, and so do
// both through a type that wraps the cluster client, embedding it or a
// redis.UniversalClient that holds it or such a type (taken for a single
// server, it locked both names on the first one's server, and refused
// WithReplicas); the requests without WithReplicas go through the
// wrapper.
func TestClusterSlotsOverStandaloneServers(t *testing.T) {
	sets := []*redistest.Replicated{redistest.StartReplicated(t, 1, 0), redistest.StartReplicated(t, 1, 0)}
	srvs := []*redistest.Server{sets[0].Primary, sets[1].Primary}
	newClient := func(wrapper func(*redis.ClusterClient) redis.UniversalClient) (redis.UniversalClient, *goredis.Driver, *dlock.Client) {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{
			ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
				return []redis.ClusterSlot{
					{Start: 0, End: 8191, Nodes: []redis.ClusterNode{{Addr: srvs[0].Addr()}, {Addr: sets[0].Replicas[0].Addr()}}},
					{Start: 8192, End: 16383, Nodes: []redis.ClusterNode{{Addr: srvs[1].Addr()}, {Addr: sets[1].Replicas[0].Addr()}}},
				}, nil
			},
			MaxRetries: -1,
		})
		t.Cleanup(func() { _ = rdb.Close() })
		var u redis.UniversalClient = rdb
		if wrapper != nil {
			u = wrapper(rdb)
		}
		d := goredis.New(u)
		c := dlock.New(d)
		t.Cleanup(func() { _ = c.Close() })
		return u, d, c
	}
	// A name in each half.
	_, _, a := newClient(nil)
	var names [2]string
	for i := 0; names[0] == "" || names[1] == ""; i++ {
		name := "n" + strconv.Itoa(i)
		half := 0
		if keyslot.Of(a.RedisKey(name)) > 8191 {
			half = 1
		}
		if names[half] == "" {
			names[half] = name
		}
	}
	ctx := context.Background()
	for _, w := range []struct {
		name string
		wrap func(*redis.ClusterClient) redis.UniversalClient
	}{
		{"the cluster client", nil},
		{"a type that embeds it", func(c *redis.ClusterClient) redis.UniversalClient { return embeddedCluster{c} }},
		{"a type that embeds a UniversalClient", func(c *redis.ClusterClient) redis.UniversalClient { return wrap(c) }},
		{"a wrapper of a wrapper", func(c *redis.ClusterClient) redis.UniversalClient { return wrap(embeddedCluster{c}) }},
	} {
		for _, opts := range [][]dlock.Option{nil, {dlock.WithReplicas(1, time.Second)}} {
			// New clients: one that has met a cluster's refusal splits
			// every lock by slot before it sends it.
			rdb, d, a := newClient(w.wrap)
			_, _, b := newClient(nil)
			if !d.Partitioned() {
				t.Errorf("through %s: Partitioned() = false", w.name)
			}
			held, err := a.TryLockMulti(ctx, names[:], append(opts, dlock.WithTTL(time.Minute))...)
			if err != nil {
				t.Fatalf("through %s, %d options: %v", w.name, len(opts), err)
			}
			for i, name := range names {
				if _, err := b.TryLock(ctx, name); !errors.Is(err, dlock.ErrNotObtained) {
					t.Errorf("%q (through %s, %d options), held by another client's lock on both names: TryLock = %v, want ErrNotObtained", name, w.name, len(opts), err)
				}
				if got := srvs[i].Do(t, "HGET", a.RedisKey(name), "token"); got == "" || got == "(nil)" {
					t.Errorf("%q (through %s, %d options) is not held on the server of its slot", name, w.name, len(opts))
				}
				if got := d.Server(ctx, a.RedisKey(name)); got != srvs[i].Addr() {
					t.Errorf("through %s: Server(%q) = %q, want %s", w.name, a.RedisKey(name), got, srvs[i].Addr())
				}
			}
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if opts == nil {
				sentThrough(t, rdb)
				// Shard channels, on the primaries the cluster client gives.
				sub, err := d.SubscribeSharded(ctx, func(string, string) {})
				if err != nil {
					t.Errorf("through %s: SubscribeSharded: %v", w.name, err)
				} else {
					_ = sub.Close()
				}
			}
		}
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

// TestAReleaseWithNoConnectionFreeIsSentAgain: a Release that go-redis
// could not send, its pool at MaxActiveConns, goes again a little later,
// once a connection is free, and frees the name.
func TestAReleaseWithNoConnectionFreeIsSentAgain(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1, MaxActiveConns: 1, PoolTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	d := &tapped{Driver: goredis.New(rdb)}
	c := dlock.New(d)
	defer c.Close()
	l, err := c.TryLock(ctx, "pool", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// The pool's only connection, taken until the Release and the copy
	// sent at once after it failed.
	held := rdb.Conn()
	if err := held.Ping(ctx).Err(); err != nil {
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

// TestAClientOnAClusterNodeIsUnsupported: a go-redis Client (not a
// ClusterClient) given a Redis Cluster node's address gets ErrUnsupported
// for a name another node serves, at once, where it waited out its max
// wait on MOVED.
func TestAClientOnAClusterNodeIsUnsupported(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	node := cluster.Nodes[0]
	rdb := redis.NewClient(&redis.Options{Addr: node.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	var logged redistest.Buffer
	c := dlock.New(goredis.New(rdb), dlock.WithLogger(slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	defer c.Close()
	name := ""
	for i := 0; name == ""; i++ {
		if n := "elsewhere" + strconv.Itoa(i); cluster.PrimaryOf(t, c.RedisKey(n)) != node {
			name = n
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.TryLock(ctx, name); !errors.Is(err, dlock.ErrUnsupported) {
		t.Errorf("TryLock: %v, want ErrUnsupported", err)
	}
	if _, err := c.Lock(ctx, name); !errors.Is(err, dlock.ErrUnsupported) || ctx.Err() != nil {
		t.Errorf("Lock: %v (its context: %v), want ErrUnsupported at once", err, ctx.Err())
	}
	// The node ran nothing: no clean-up goes, and no warning says that a
	// lock may stay held until its TTL.
	if err := c.Close(); err != nil {
		t.Error(err)
	}
	if s := logged.String(); s != "" {
		t.Errorf("logged:\n%s", s)
	}
}

// TestAClosedRedisClientEndsAWaitAtOnce: once the go-redis client under
// the driver is closed (a shutdown that closes it first), an acquire fails
// with an error matching dlock.ErrClosed, and a wait under way ends then,
// rather than trying for its whole max wait: a Client, a Ring or a cluster
// client.
func TestAClosedRedisClientEndsAWaitAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3, 0)
	for _, tc := range []struct {
		kind     string
		make     func() redis.UniversalClient
		replicas bool // it can WithReplicas
	}{
		{"Client", func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr()}) }, true},
		{"Ring", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr()}})
		}, false},
		{"ClusterClient", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
		}, true},
		// A cluster client tries another node after each ErrClosed, pausing
		// in between, up to MaxRedirects times.
		{"ClusterClientWithManyRedirects", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), MaxRedirects: 8})
		}, true},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			name := "held-" + tc.kind
			holder := tc.make()
			t.Cleanup(func() { _ = holder.Close() })
			h := dlock.New(goredis.New(holder))
			defer h.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if _, err := h.TryLock(ctx, name, dlock.WithTTL(time.Minute)); err != nil {
				t.Fatal(err)
			}
			rdb := tc.make()
			c := dlock.New(goredis.New(rdb))
			defer c.Close()
			got := make(chan error, 1)
			refused := make(chan struct{})
			var once sync.Once
			go func() {
				_, err := c.Lock(ctx, name, dlock.WithOnRetry(func(int, error) { once.Do(func() { close(refused) }) }))
				got <- err
			}()
			<-refused
			_ = rdb.Close()
			select {
			case err := <-got:
				if !errors.Is(err, dlock.ErrClosed) {
					t.Errorf("a wait when its Redis client closed: %v, want ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the wait went on for 5s after its Redis client closed")
			}
			if _, err := c.Lock(ctx, name); !errors.Is(err, dlock.ErrClosed) || ctx.Err() != nil {
				t.Errorf("a wait after its Redis client closed: %v (its context: %v), want ErrClosed at once", err, ctx.Err())
			}
			if tc.replicas {
				if _, err := c.TryLock(ctx, name+"-replicas", dlock.WithReplicas(1, 50*time.Millisecond)); !errors.Is(err, dlock.ErrClosed) {
					t.Errorf("TryLock WithReplicas after its Redis client closed: %v, want ErrClosed", err)
				}
			}
		})
	}
}

// TestAFirstAcquireWithReplicasWaitsItsTimeoutOnce: a server that does not
// know dlock's scripts yet (a new server, or one that took over in a
// failover, just when its replicas may lag) answers a first pipeline by
// EVALSHA with NOSCRIPT, and the calls go again by EVAL. The first
// pipeline's WAIT, which had nothing to confirm, waited its whole timeout
// for a lagging replica all the same, and the second's as long again: an
// acquire WithReplicas(1, 1s) failed after 2s.
func TestAFirstAcquireWithReplicasWaitsItsTimeoutOnce(t *testing.T) {
	r := redistest.StartReplicated(t, 1, 0)
	rdb := redis.NewClient(&redis.Options{Addr: r.Primary.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	r.Replicas[0].Pause(t)
	defer r.Replicas[0].Resume(t)
	const timeout = time.Second
	start := time.Now()
	_, err := c.TryLock(context.Background(), "first", dlock.WithReplicas(1, timeout))
	took := time.Since(start)
	if !errors.Is(err, dlock.ErrNotReplicated) {
		t.Fatalf("err = %v, want ErrNotReplicated", err)
	}
	if took > timeout*17/10 {
		t.Errorf("an acquire WithReplicas(1, %v) failed after %v, want about its timeout", timeout, took)
	}
}

// PoolSize is what the client's pool lets out at once to one server (see
// dlock.Pooled): its PoolSize, or MaxActiveConns when less, per node of a
// cluster and shard of a Ring, with go-redis's defaults for none; a
// wrapper's, the client's it wraps.
func TestPoolSizeIsTheClientsPerServer(t *testing.T) {
	procs := runtime.GOMAXPROCS(0)
	for _, tc := range []struct {
		name string
		rdb  redis.UniversalClient
		want int
	}{
		{"client", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 7}), 7},
		{"client, MaxActiveConns less", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 7, MaxActiveConns: 3}), 3},
		{"client, MaxActiveConns more", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 7, MaxActiveConns: 30}), 7},
		{"client, default", redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), 10 * procs},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, PoolSize: 5}), 5},
		{"cluster, default", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), 5 * procs},
		{"ring", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, PoolSize: 6}), 6},
		{"ring, default", redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}}), 10 * procs},
		{"client, wrapped", wrap(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", PoolSize: 7})), 7},
		{"cluster, wrapped", wrap(redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, PoolSize: 5})), 5},
		{"ring, wrapped", wrap(redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, PoolSize: 6})), 6},
	} {
		if got := goredis.New(tc.rdb).PoolSize(); got != tc.want {
			t.Errorf("%s: PoolSize = %d, want %d", tc.name, got, tc.want)
		}
		_ = tc.rdb.Close()
	}
}

// recorder is a go-redis hook that keeps the name and arguments of every
// command the client sends, alone or in a pipeline.
type recorder struct {
	mu   sync.Mutex
	cmds [][]any
}

func (r *recorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.keep(cmd)
		return next(ctx, cmd)
	}
}

func (r *recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			r.keep(cmd)
		}
		return next(ctx, cmds)
	}
}

func (r *recorder) keep(cmd redis.Cmder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cmds = append(r.cmds, append([]any{cmd.Name(), cmd.FullName(), cmd.String()}, cmd.Args()...))
}

// take returns the commands kept since the last take.
func (r *recorder) take() [][]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	cmds := r.cmds
	r.cmds = nil
	return cmds
}

// TestHooksSeeScriptsAsGoRedisSendsThem: the commands the driver makes
// itself on a go-redis client (see send) reach its hooks as go-redis's own
// EvalSha and Eval make them (name, arguments, and their text once
// answered), alone and in a pipeline, on a single server and on a
// cluster, and a cluster routes them by their first key.
func TestHooksSeeScriptsAsGoRedisSendsThem(t *testing.T) {
	srv := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	script := dlock.NewScript("hooked", "return {KEYS[1], ARGV[1], ARGV[2]}")
	call := func(key string) *dlock.Call {
		return &dlock.Call{Script: script, Keys: []string{key, key + ":waiters"}, Args: []any{"token", int64(1500)}}
	}
	for _, tc := range []struct {
		name string
		rdb  redis.UniversalClient
	}{
		{"client", redis.NewClient(&redis.Options{Addr: srv.Addr()})},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{cluster.Nodes[0].Addr()}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer tc.rdb.Close()
			rec := &recorder{}
			tc.rdb.AddHook(rec)
			d := goredis.New(tc.rdb)
			// By EVAL after NOSCRIPT, then by EVALSHA; alone, then in a
			// pipeline.
			for _, calls := range [][]*dlock.Call{{call("{a}")}, {call("{a}")}, {call("{a}"), call("{b}")}} {
				d.Eval(ctx, calls...)
				got := rec.take()
				for _, c := range calls {
					if c.Err != nil {
						t.Fatalf("%v: %v", c.Keys, c.Err)
					}
					if want := []any{c.Keys[0], "token", "1500"}; fmt.Sprint(c.Val) != fmt.Sprint(want) {
						t.Errorf("%v: reply %v, want %v", c.Keys, c.Val, want)
					}
				}
				// Each as go-redis's own method makes it (queued, not sent).
				p := tc.rdb.Pipeline()
				for _, cmd := range got {
					args := cmd[3:]
					n, ok := args[2].(int)
					if !ok {
						t.Fatalf("the hook saw %#v, whose number of keys is no int, as go-redis's own are", cmd)
					}
					keys := make([]string, n)
					for i := range keys {
						keys[i], _ = args[3+i].(string)
					}
					var own redis.Cmder
					switch cmd[0] {
					case "evalsha":
						own = p.EvalSha(ctx, script.SHA1, keys, args[3+n:]...)
					case "eval":
						own = p.Eval(ctx, script.Src, keys, args[3+n:]...)
					default:
						t.Fatalf("the hook saw %v", cmd)
					}
					want := append([]any{own.Name(), own.FullName(), own.String()}, own.Args()...)
					if !reflect.DeepEqual(cmd, want) {
						t.Errorf("the hook saw %#v where go-redis's own method makes %#v", cmd, want)
					}
				}
				p.Discard()
				if len(got) < len(calls) {
					t.Errorf("the hook saw %d commands for %d calls", len(got), len(calls))
				}
				if tc.name == "client" {
					srv.Do(t, "SCRIPT", "FLUSH") // by EVAL again next time
				}
			}
		})
	}
}
