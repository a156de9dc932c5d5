package goredis

import (
	"context"
	"testing"
	"time"

	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestASilentSubscriptionIsReplaced: a pub/sub connection cut off without
// a reset (it passes nothing, and stays open) is noticed by the PING sent
// after a silence and replaced by a new one with the same channels,
// instead of waiting for TCP to give up; a quiet connection that answers
// the PING stays.
func TestASilentSubscriptionIsReplaced(t *testing.T) {
	srv, px, rdb := behindCutProxy(t)
	ctx := context.Background()
	got := make(chan string, 16)
	sub, err := New(rdb).Subscribe(ctx, func(_, p string) { got <- p })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(ctx, "ch"); err != nil {
		t.Fatal(err)
	}
	redistest.PlainPublishUntilReceived(t, srv, "ch", "hello", got)
	// Quiet, but alive: several silences pass, each answered by a PING.
	first := sub.(*subscription).current()
	time.Sleep(5 * shardSilence)
	if sub.(*subscription).current() != first {
		t.Error("a quiet connection that answers its PINGs was replaced")
	}
	px.Cut()
	redistest.PlainPublishUntilReceived(t, srv, "ch", "after the cut", got)
}

// current returns the subscription's PubSub.
func (s *subscription) current() *redis.PubSub {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ps
}

// behindCutProxy shortens the silence after which a connection is sent a
// PING to 100ms, for the test, and returns a server, a CutProxy in front
// of it and a go-redis client through the proxy, closed with the test.
func behindCutProxy(t *testing.T) (*redistest.Server, *redistest.CutProxy, *redis.Client) {
	saved := shardSilence
	shardSilence = 100 * time.Millisecond
	t.Cleanup(func() { shardSilence = saved })
	srv := redistest.Start(t)
	px := redistest.StartCutProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return srv, px, rdb
}
