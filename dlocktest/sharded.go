package dlocktest

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

var shardedTests = []test{
	{name: "Sharded", run: testSharded},
	{name: "ShardedWake", run: testShardedWake},
}

// testSharded: a driver that implements dlock.ShardedSubscriber delivers
// the SPUBLISH of shard channels in every primary's slots, stops at
// Unsubscribe and at Close, and leaves no shard subscriber behind; off a
// cluster it may answer ErrUnsupported.
func testSharded(t *testing.T, e *env) {
	ss, ok := e.driver(t).(dlock.ShardedSubscriber)
	if !ok {
		t.Skip("the driver has no ShardedSubscriber: notices go by PUBLISH")
	}
	ctx := timeout(t)
	rec := newRecorder()
	// Messages of several primaries arrive on several connections: a call
	// that lasts a while meets the next if the driver does not deliver
	// them one at a time.
	rec.linger = 20 * time.Millisecond
	sub, err := ss.SubscribeSharded(ctx, rec.notify)
	if e.dep.Topology != Cluster {
		if errors.Is(err, dlock.ErrUnsupported) {
			return
		}
		t.Fatalf("SubscribeSharded off a cluster: %v, want ErrUnsupported", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// A channel in a slot of each primary, and two in one slot.
	var channels []string
	for _, p := range e.primaries {
		channels = append(channels, prefix(t)+"{"+e.tagOn(t, p)+"}:w:1")
	}
	channels = append(channels, channels[0]+"b")
	if err := sub.Subscribe(ctx, channels...); err != nil {
		t.Fatal(err)
	}
	for _, ch := range channels {
		e.awaitShardNumsub(t, ch, 1)
	}
	var want []message
	for i, ch := range channels {
		e.do(t, ch, "SPUBLISH", ch, "m"+strconv.Itoa(i))
		want = append(want, message{ch, "m" + strconv.Itoa(i)})
	}
	// Slots may be on different connections: order holds within a slot only.
	got := rec.await(t, len(want))
	byText := func(a, b message) int { return strings.Compare(a.channel+a.payload, b.channel+b.payload) }
	if got, want := slices.SortedFunc(slices.Values(got), byText), slices.SortedFunc(slices.Values(want), byText); !slices.Equal(got, want) {
		t.Errorf("notify got %q, want %q", got, want)
	}
	// Unsubscribed: one of a slot's two channels, and a slot's only one.
	if err := sub.Unsubscribe(ctx, channels[0], channels[1]); err != nil {
		t.Fatal(err)
	}
	e.awaitShardNumsub(t, channels[0], 0)
	e.awaitShardNumsub(t, channels[1], 0)
	e.do(t, channels[3], "SPUBLISH", channels[3], "after")
	if got := rec.await(t, len(want)+1); got[len(want)] != (message{channels[3], "after"}) {
		t.Errorf("after Unsubscribe, notify got %q", got[len(want):])
	}
	if err := sub.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	rec.closed.Store(true)
	for _, ch := range channels {
		e.awaitShardNumsub(t, ch, 0)
	}
	rec.check(t)
}

// awaitShardNumsub waits until shard channel ch has want subscribers on
// the primary that owns it.
func (e *env) awaitShardNumsub(t testing.TB, ch string, want int) {
	t.Helper()
	await(t, "shard subscribers of "+ch, func() bool {
		r := e.primaryOf(t, ch).Do(t, "PUBSUB", "SHARDNUMSUB", ch)
		return r == ch+"\n"+strconv.Itoa(want)
	})
}

// testShardedWake: on a cluster, a client whose driver subscribes to shard
// channels is woken by the release of a lock through SPUBLISH in the lock's
// slot, and nothing is published cluster-wide.
func testShardedWake(t *testing.T, e *env) {
	if _, ok := e.driver(t).(dlock.ShardedSubscriber); !ok || e.dep.Topology != Cluster {
		t.Skip("notices go by PUBLISH off a cluster, or without a ShardedSubscriber")
	}
	holder, waiter := e.client(t), e.client(t)
	e.onPrimaries(t, "CONFIG", "RESETSTAT")
	for range 3 {
		wokenByRelease(t, holder, waiter, "sharded-wake", func() {
			e.awaitShardSubscribed(t, waiter.RedisKey("sharded-wake"))
		})
	}
	if n := e.calls(t, "spublish"); n < 3 {
		t.Errorf("%d SPUBLISH, want one a release", n)
	}
	if n := e.calls(t, "publish"); n != 0 {
		t.Errorf("%d PUBLISH, want none", n)
	}
}

// awaitShardSubscribed waits until a shard channel of lock key has a
// subscriber on the key's primary.
func (e *env) awaitShardSubscribed(t testing.TB, key string) {
	t.Helper()
	srv := e.primaryOf(t, key)
	await(t, "a shard subscriber for "+key, func() bool {
		for _, ch := range strings.Split(srv.Do(t, "PUBSUB", "SHARDCHANNELS", key+":w:*"), "\n") {
			if ch != "" {
				return true
			}
		}
		return false
	})
}
