package goredis_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestShardedSubscriptionFollowsAFailover: a shard channel stays subscribed
// through the failover of the primary that serves its slot, on the
// replica that takes over.
func TestShardedSubscriptionFollowsAFailover(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	got := make(chan string, 100)
	sub, err := goredis.New(rdb).SubscribeSharded(context.Background(), func(_, payload string) { got <- payload })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	const ch = "dlock:{failover}:w:test"
	if err := sub.Subscribe(context.Background(), ch); err != nil {
		t.Fatal(err)
	}
	old := c.PrimaryOf(t, ch)
	publishUntilReceived(t, old, ch, "before", got)

	old.Kill(t)
	next := c.AwaitFailover(t, ch, old, 20*time.Second)
	publishUntilReceived(t, next, ch, "after", got)
}

// publishUntilReceived publishes payload on srv until the subscriber gets
// it (it may still be subscribing), for at most 15s.
func publishUntilReceived(t *testing.T, srv *redistest.Server, ch, payload string, got <-chan string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		srv.Do(t, "SPUBLISH", ch, payload)
		select {
		case p := <-got:
			if p == payload {
				return
			}
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q published on %s not received within 15s", payload, srv.Addr())
		}
	}
}
