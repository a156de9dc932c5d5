package dlockrueidis_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/dlockio/dlock"
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
	opts := []dlock.Option{dlock.WithReplicas(1, 500*time.Millisecond), dlock.WithTTL(10 * time.Second)}

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

// TestShardedSubscriptionFollowsAFailover: a shard channel stays subscribed
// through the failover of the primary that serves its slot, on the
// replica that takes over.
func TestShardedSubscriptionFollowsAFailover(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	const ch = "dlock:{failover}:w:test"
	sub, got := shardedSubscription(t, c)
	subscribe(t, sub, ch)
	old := c.PrimaryOf(t, ch)
	redistest.PublishUntilReceived(t, old, ch, "before", got)

	old.Kill(t)
	next := c.AwaitFailover(t, ch, old, 20*time.Second)
	start := time.Now()
	redistest.PublishUntilReceived(t, next, ch, "after", got)
	t.Logf("received on the new primary %v after the failover", time.Since(start).Round(time.Millisecond))
}

// TestShardedSubscriptionFollowsASlotMove: when a channel's slot moves to
// another primary, whose node then unsubscribes the channel by itself, the
// channel is subscribed there, and the channels of the old primary's
// other slots stay on their connection.
func TestShardedSubscriptionFollowsASlotMove(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	const moving = "dlock:{moving}:w:test"
	sub, got := shardedSubscription(t, c)
	subscribe(t, sub, moving)
	old := c.PrimaryOf(t, moving)
	staying := c.ChannelOn(t, old, "staying")
	subscribe(t, sub, staying)
	redistest.PublishUntilReceived(t, old, moving, "before", got)
	redistest.PublishUntilReceived(t, old, staying, "staying before", got)

	// The slot holds no key: it moves without MIGRATE.
	next := c.Nodes[0]
	if next == old {
		next = c.Nodes[1]
	}
	c.MoveEmptySlot(t, moving, next)
	start := time.Now()
	redistest.PublishUntilReceived(t, next, moving, "after", got)
	t.Logf("received on the new primary %v after the move", time.Since(start).Round(time.Millisecond))
	redistest.PublishUntilReceived(t, old, staying, "staying after", got)
	if n := old.Do(t, "PUBSUB", "SHARDNUMSUB", moving); n != moving+"\n0" {
		t.Errorf("the old primary still has a subscriber: PUBSUB SHARDNUMSUB = %q", n)
	}
	if conns := old.PubSubConnections(t); conns != 1 {
		t.Errorf("the old primary has %d pub/sub connections, want 1", conns)
	}
}

// TestShardedSubscriptionHasAConnectionPerPrimary: channels in many slots
// cost one connection to each primary that serves them, not one a slot.
func TestShardedSubscriptionHasAConnectionPerPrimary(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	sub, got := shardedSubscription(t, c)
	var channels []string
	for i := range 60 {
		ch := "dlock:{n" + strconv.Itoa(i) + "}:w:test"
		channels = append(channels, ch)
		subscribe(t, sub, ch)
	}
	for _, ch := range channels {
		redistest.PublishUntilReceived(t, c.PrimaryOf(t, ch), ch, ch, got)
	}
	for _, n := range c.Nodes {
		if conns := n.PubSubConnections(t); conns != 1 {
			t.Errorf("%s: %d pub/sub connections, want 1", n.Addr(), conns)
		}
	}
	if err := sub.Unsubscribe(context.Background(), channels...); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		deadline := time.Now().Add(10 * time.Second)
		for n.PubSubConnections(t) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: pub/sub connections left after the last channel was unsubscribed", n.Addr())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
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

// shardedSubscription opens a sharded subscription over a client of
// cluster c, closed with the test, and returns it with the payloads it
// receives.
func shardedSubscription(t *testing.T, c *redistest.Cluster) (dlock.Subscription, <-chan string) {
	got := make(chan string, 1000)
	sub, err := newClusterDriver(t, c).SubscribeSharded(context.Background(), func(_, payload string) { got <- payload })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub, got
}

func subscribe(t *testing.T, sub dlock.Subscription, ch string) {
	t.Helper()
	if err := sub.Subscribe(context.Background(), ch); err != nil {
		t.Fatal(err)
	}
}
