package goredis_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

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
	redistest.PublishUntilReceived(t, next, ch, "after", got)
}

// TestShardedSubscriptionFollowsASlotMove: when a channel's slot moves to
// another primary, the channel is subscribed there, and the channels of
// the old primary's other slots stay on their connection.
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
	redistest.PublishUntilReceived(t, next, moving, "after", got)
	redistest.PublishUntilReceived(t, old, staying, "staying after", got)
	if n := old.Do(t, "PUBSUB", "SHARDNUMSUB", moving); n != moving+"\n0" {
		t.Errorf("the old primary still has a subscriber: PUBSUB SHARDNUMSUB = %q", n)
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

// shardedSubscription opens a sharded subscription over a client of
// cluster c, closed with the test, and returns it with the payloads it
// receives.
func shardedSubscription(t *testing.T, c *redistest.Cluster) (dlock.Subscription, <-chan string) {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	got := make(chan string, 1000)
	sub, err := goredis.New(rdb).SubscribeSharded(context.Background(), func(_, payload string) { got <- payload })
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
