package dlockrueidis_test

import (
	"context"
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
	for err := l.Release(ctx); err != nil; err = l.Release(ctx) {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("Release 20s after the failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("released %v after the new primary granted a lock", time.Since(start).Round(time.Millisecond))
}

// TestShardedSubscriptionResilience: shard subscriptions over a rueidis
// cluster client follow failovers and slot moves, on a connection per
// primary.
func TestShardedSubscriptionResilience(t *testing.T) {
	dlocktest.RunShardedResilience(t, newDriver(rueidis.ClientOption{}))
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
