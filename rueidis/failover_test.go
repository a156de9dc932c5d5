package dlockrueidis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/dlocktest"
	"github.com/dlockio/dlock/internal/redistest"
	dlockrueidis "github.com/dlockio/dlock/rueidis"
	"github.com/redis/rueidis"
)

// TestWithReplicasAfterAFailover: after a primary is killed and its
// replica takes over, acquisitions confirmed on replicas (EvalWait, which
// keeps a slot map of its own) reach the new primary, as plain ones do.
func TestWithReplicasAfterAFailover(t *testing.T) {
	c := redistest.StartCluster(t, 3, 2) // the new primary keeps a replica
	locks := dlock.New(newClusterDriver(t, c))
	defer locks.Close()
	ctx := context.Background()
	opts := []dlock.Option{dlock.WithReplicas(1, 500*time.Millisecond), dlock.WithTTL(time.Minute)}

	l, err := locks.TryLock(ctx, "failover", opts...)
	if err != nil {
		t.Fatal(err)
	}
	old := c.PrimaryOf(t, locks.RedisKey("failover"))
	old.Kill(t)
	c.AwaitFailover(t, locks.RedisKey("failover"), old, 20*time.Second)

	// The lock was confirmed on a replica, so it is still held; a lock on
	// another name of the same slot is granted by the new primary.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := locks.TryLock(ctx, "failover", opts...)
		if err == nil {
			t.Fatal("the lock confirmed on a replica was granted again after the failover")
		}
		l2, err2 := locks.TryLock(ctx, "{failover}:other", opts...)
		if err2 == nil {
			_ = l2.Release(ctx)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after the failover, acquisitions with WithReplicas still fail: %v", err2)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Plain calls go by rueidis's own routing, which finds the new primary
	// by itself.
	start := time.Now()
	tries := 1
	for err := l.Release(ctx); err != nil; err = l.Release(ctx) {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("Release 20s after the failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
		tries++
	}
	t.Logf("released %v after the new primary granted a lock, at try %d", time.Since(start).Round(time.Microsecond), tries)
}

// TestShardedSubscriptionResilience: shard subscriptions over a rueidis
// cluster client follow failovers and slot moves, on a connection per
// primary.
func TestShardedSubscriptionResilience(t *testing.T) {
	dlocktest.RunShardedResilience(t, newDriver(rueidis.ClientOption{}))
}

// TestLocksThroughASentinelFailover runs dlocktest's Sentinel failovers
// (auto-refreshed locks and waiters, a killed primary and SENTINEL
// FAILOVER, with and without WithReplicas) over rueidis's Sentinel client.
func TestLocksThroughASentinelFailover(t *testing.T) {
	dlocktest.RunSentinelFailover(t, newDriver(rueidis.ClientOption{}))
}

// newClusterDriver returns a driver over a client of cluster c, closed
// when the test ends.
func newClusterDriver(t *testing.T, c *redistest.Cluster) *dlockrueidis.Driver {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs()[:1]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return dlockrueidis.New(client)
}

// TestFunctionsWithAReplicaDown: a client that also reaches a replica
// loads dlock's functions on the primary alone; the replica being down
// does not make it fail.
func TestFunctionsWithAReplicaDown(t *testing.T) {
	r := redistest.StartReplicated(t, 1, 0)
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Primary.Addr()},
		Standalone:     rueidis.StandaloneOption{ReplicaAddress: []string{r.Replicas[0].Addr()}},
		SendToReplicas: func(rueidis.Completed) bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	if n := len(client.Nodes()); n != 2 {
		t.Fatalf("the client knows %d nodes, want the primary and its replica", n)
	}
	r.Replicas[0].Kill(t)
	locks := dlock.New(dlockrueidis.New(client), dlock.WithFunctions())
	defer locks.Close()
	ctx := context.Background()
	l, err := locks.TryLock(ctx, "functions")
	if err != nil {
		t.Fatalf("TryLock by FCALL with the replica down: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestListReadsThePrimaryWithSendToReplicas: a client that sends its
// read-only commands to replicas (SendToReplicas, as rueidis suggests it:
// cmd.IsReadOnly()) still lists the locks the primary holds: its SCAN
// goes to the primary, not to a replica that may lag behind it, which
// here has stopped copying the primary (REPLICAOF NO ONE) since a lock
// was taken on both: List showed nothing, the lock taken since missing
// on the replica and the one released since gone from the primary.
func TestListReadsThePrimaryWithSendToReplicas(t *testing.T) {
	r := redistest.StartReplicated(t, 1, 0)
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Primary.Addr()},
		Standalone:     rueidis.StandaloneOption{ReplicaAddress: []string{r.Replicas[0].Addr()}},
		SendToReplicas: func(cmd rueidis.Completed) bool { return cmd.IsReadOnly() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	locks := dlock.New(dlockrueidis.New(client))
	defer locks.Close()
	ctx := context.Background()
	before, err := locks.TryLock(ctx, "before")
	if err != nil {
		t.Fatal(err)
	}
	// StartReplicated's replica receives the primary's stream at once:
	// WAIT returns when it has the lock.
	if n := r.Primary.Do(t, "WAIT", "1", "5000"); n != "1" {
		t.Fatalf("WAIT 1 = %s: the replica does not have the first lock", n)
	}
	r.Replicas[0].Do(t, "REPLICAOF", "NO", "ONE")
	if _, err := locks.TryLock(ctx, "after"); err != nil {
		t.Fatal(err)
	}
	if err := before.Release(ctx); err != nil {
		t.Fatal(err)
	}
	infos, err := locks.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, info := range infos {
		names = append(names, info.Name)
	}
	if len(names) != 1 || names[0] != "after" {
		t.Errorf("List = %q, want [\"after\"], as the primary holds", names)
	}
}

// TestSubscriptionFollowsASentinelSwitch: after Sentinel switches to a new
// primary while the old one lives on (here refusing REPLICAOF, so that it
// never turns replica and passes the new primary's messages on), the
// subscription moves to the new primary and says so (an empty notice):
// rueidis's Sentinel client keeps a dedicated connection on the old
// primary otherwise, and waiters would hear no release until their beat.
func TestSubscriptionFollowsASentinelSwitch(t *testing.T) {
	r := redistest.StartReplicated(t, 1, 3)
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: r.SentinelAddrs(),
		Sentinel: rueidis.SentinelOption{MasterSet: r.MasterName}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	got := make(chan [2]string, 64)
	sub, err := dlockrueidis.New(client).Subscribe(context.Background(), func(channel, payload string) {
		select {
		case got <- [2]string{channel, payload}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sub.Subscribe(ctx, "notices"); err != nil {
		t.Fatal(err)
	}
	r.Primary.Do(t, "ACL", "SETUSER", "default", "-replicaof", "-slaveof")
	r.Sentinels[0].Do(t, "SENTINEL", "FAILOVER", r.MasterName)
	next := r.Replicas[0]
	for !hasNode(client, next.Addr()) {
		if ctx.Err() != nil {
			t.Fatal("the client did not switch to the new primary within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	resubscribed := false
	for tick := time.NewTicker(50 * time.Millisecond); ; {
		next.Do(t, "PUBLISH", "notices", "released")
		select {
		case n := <-got:
			switch n {
			case [2]string{"", ""}:
				resubscribed = true
			case [2]string{"notices", "released"}:
				if !resubscribed {
					t.Error("a notice came before the empty one that says notices were lost meanwhile")
				}
				tick.Stop()
				return
			}
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("no notice published on the new primary reached the subscription within 30s")
		}
	}
}

// hasNode reports whether client sends its commands to addr.
func hasNode(client rueidis.Client, addr string) bool {
	_, ok := client.Nodes()[addr]
	return ok
}

// TestAReleaseAfterAFailoverOfAnIdleClient: a client idle while its lock's
// primary fails over still has the old slot map, and its next request goes
// to the dead primary, which refuses the dial. Release gets through all
// the same: the call, which never ran, goes again once rueidis has read
// the slots again.
func TestAReleaseAfterAFailoverOfAnIdleClient(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	locks := dlock.New(newClusterDriver(t, c))
	defer locks.Close()
	ctx := context.Background()
	l, err := locks.TryLock(ctx, "idle", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	old := c.PrimaryOf(t, locks.RedisKey("idle"))
	old.Kill(t)
	c.AwaitFailover(t, locks.RedisKey("idle"), old, 20*time.Second)
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after the failover: %v", err)
	}
}

// TestServerFollowsASlotThatMoved: rueidis follows a slot that moved
// (MOVED) without telling; the driver's Server, which keeps the client's
// requests to each primary apart, reads the slot map again when it is a
// few seconds old, and so follows it too.
func TestServerFollowsASlotThatMoved(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	d := newClusterDriver(t, c)
	ctx := context.Background()
	key := "{moves}"
	from := c.PrimaryOf(t, key)
	if got := d.Server(ctx, key); got != from.Addr() {
		t.Fatalf("Server = %q, want %q", got, from.Addr())
	}
	var to *redistest.Server
	for _, n := range c.Nodes {
		if n != from {
			to = n
			break
		}
	}
	c.MoveEmptySlot(t, key, to)
	deadline := time.Now().Add(15 * time.Second)
	for d.Server(ctx, key) != to.Addr() {
		if time.Now().After(deadline) {
			t.Fatalf("Server still %q 15s after the slot moved to %s", d.Server(ctx, key), to.Addr())
		}
		time.Sleep(50 * time.Millisecond)
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
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Primary.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	c := dlock.New(dlockrueidis.New(client))
	t.Cleanup(func() { _ = c.Close() })
	r.Replicas[0].Pause(t)
	defer r.Replicas[0].Resume(t)
	const timeout = time.Second
	start := time.Now()
	_, err = c.TryLock(context.Background(), "first", dlock.WithReplicas(1, timeout))
	took := time.Since(start)
	if !errors.Is(err, dlock.ErrNotReplicated) {
		t.Fatalf("err = %v, want ErrNotReplicated", err)
	}
	if took > timeout*17/10 {
		t.Errorf("an acquire WithReplicas(1, %v) failed after %v, want about its timeout", timeout, took)
	}
}
