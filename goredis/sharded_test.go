package goredis_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlockio/dlock/dlocktest"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestShardedSubscriptionResilience: shard subscriptions over a go-redis
// cluster client follow failovers and slot moves, on a connection per
// primary.
func TestShardedSubscriptionResilience(t *testing.T) {
	dlocktest.RunShardedResilience(t, newDriver)
}

// TestAShardChannelWhoseSubscribeFailedIsSubscribedAfterAll: a channel
// whose SSUBSCRIBE could not be sent on its primary's connection (which
// go-redis then drops) is subscribed with the others when the connection
// is made again, and a Subscribe asking for it again succeeds.
func TestAShardChannelWhoseSubscribeFailedIsSubscribedAfterAll(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	got := make(chan string, 16)
	sub, err := goredis.New(rdb).SubscribeSharded(ctx, func(_, payload string) {
		select {
		case got <- payload:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	srv := cluster.Nodes[0]
	first, second := cluster.ChannelOn(t, srv, "first"), cluster.ChannelOn(t, srv, "second")
	if err := sub.Subscribe(ctx, first); err != nil { // the primary's connection
		t.Fatal(err)
	}
	redistest.PublishUntilReceived(t, srv, first, "on first", got)
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if err := sub.Subscribe(expired, second); err == nil {
		t.Fatal("Subscribe with an expired context reported no error")
	}
	if err := sub.Subscribe(ctx, second); err != nil {
		t.Fatal(err)
	}
	redistest.PublishUntilReceived(t, srv, second, "on second", got)
}
