package dlocktest

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
)

var shardedTests = []test{
	{name: "Sharded", run: testSharded},
	{name: "ShardedWake", run: testShardedWake},
	{name: "ShardedSubscribedAgainAtOnce", run: testShardedSubscribedAgainAtOnce},
	{name: "ShardedRefused", run: testShardedRefused, only: onCluster},
	{name: "ShardedLaterRefused", run: testShardedLaterRefused, only: onCluster},
	{name: "ShardedBusyAtResubscribe", run: testShardedBusyAtResubscribe, only: onCluster},
}

// testShardedBusyAtResubscribe: as testBusyAtResubscribe, for shard
// channels: a primary's connection that the server closes, and whose
// channels are subscribed anew while it is busy with a script, has them
// subscribed once the script is over.
func testShardedBusyAtResubscribe(t *testing.T, e *env) {
	ctx := timeout(t)
	rec := newRecorder()
	sub := e.subscribeSharded(t, ctx, rec.notify)
	ch := prefix(t) + "{" + e.tagOn(t, e.primaries[0]) + "}:w:1"
	if err := sub.Subscribe(ctx, ch); err != nil {
		t.Fatal(err)
	}
	e.awaitShardNumsub(t, ch, 1)
	end := e.primaries[0].Busy(t, "CLIENT", "KILL", "TYPE", "pubsub")
	time.Sleep(busyFor) // the fault's length: the driver connects again meanwhile
	end()
	e.awaitShardNumsub(t, ch, 1)
	e.do(t, ch, "SPUBLISH", ch, "after")
	for n := 1; !slices.Contains(rec.await(t, n), message{ch, "after"}); n++ {
		// The notice that the channel was subscribed again comes first.
	}
	sub.Close()
	rec.closed.Store(true)
	rec.check(t)
}

// testShardedLaterRefused: a shard channel that the server refuses
// (NOPERM) on a primary's connection where another channel is subscribed
// costs only that channel: the connection goes on delivering the other's
// messages, and is not taken for failed (which would lose them, make a
// new connection and tell notify that notices may have been missed, again
// and again for as long as the refused channel is wanted).
func testShardedLaterRefused(t *testing.T, e *env) {
	ctx := timeout(t)
	rec := newRecorder()
	sub := e.subscribeSharded(t, ctx, rec.notify)
	e.allowOnlyChannels(t)
	tag := e.tagOn(t, e.primaries[0])
	allowed, refused := prefix(t)+"allowed:{"+tag+"}:w:1", prefix(t)+"{"+tag+"}:w:1"
	if err := sub.Subscribe(ctx, allowed); err != nil {
		t.Fatal(err)
	}
	e.awaitShardNumsub(t, allowed, 1)
	// Refused or not, as the driver can tell: a later Subscribe need not
	// wait for the answer.
	if err := sub.Subscribe(ctx, refused); err != nil && !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Subscribe to a refused channel: %v", err)
	}
	// The server sends the refusal before this message, on the same
	// connection.
	e.do(t, allowed, "SPUBLISH", allowed, "after")
	if got := rec.await(t, 1); got[0] != (message{allowed, "after"}) {
		t.Errorf("after a refused channel, notify got %q first, want the message on the other channel (the connection was taken for failed)", got)
	}
	sub.Close()
	rec.closed.Store(true)
	rec.check(t)
}

// testShardedRefused: a Subscribe to shard channels that the server
// refuses (NOPERM: a user who may not listen on them) returns the refusal,
// which dlock logs, the waiters falling back to timers, rather than wait
// for notices that never come.
func testShardedRefused(t *testing.T, e *env) {
	ctx := timeout(t)
	sub := e.subscribeSharded(t, ctx, newRecorder().notify)
	e.allowOnlyChannels(t)
	ch := prefix(t) + "{" + e.tagOn(t, e.primaries[0]) + "}:w:1"
	if err := sub.Subscribe(ctx, ch); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("Subscribe to a shard channel the user may not listen on: err = %v, want the server's NOPERM", err)
	}
}

// subscribeSharded opens a sharded subscription of a new driver with
// notify, within ctx, closed with the test; it skips the test if the
// driver has no ShardedSubscriber.
func (e *env) subscribeSharded(t *testing.T, ctx context.Context, notify func(channel, payload string)) dlock.Subscription {
	t.Helper()
	ss, ok := e.driver(t).(dlock.ShardedSubscriber)
	if !ok {
		t.Skip("the driver has no ShardedSubscriber: notices go by PUBLISH")
	}
	sub, err := ss.SubscribeSharded(ctx, notify)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
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

// testShardedSubscribedAgainAtOnce: Unsubscribe and Subscribe of one shard
// channel in a row, as dlock lets go of an idle channel that a new wait
// wants back at once, while other messages keep the connection busy. The
// server's reply to the SUNSUBSCRIBE, read after the channel is wanted
// again, is not the server letting the channel go (a slot that moved):
// taken for one, the channel was subscribed anew, with a notify("", "")
// for notices it had not missed, and could be dropped.
func testShardedSubscribedAgainAtOnce(t *testing.T, e *env) {
	ss, ok := e.driver(t).(dlock.ShardedSubscriber)
	if !ok || e.dep.Topology != Cluster {
		t.Skip("shard channels need a cluster and a ShardedSubscriber")
	}
	var missed atomic.Int64
	got := make(chan string, 16)
	ctx, cancel := opening()
	sub, err := ss.SubscribeSharded(ctx, func(ch, payload string) {
		switch {
		case ch == "" && payload == "":
			missed.Add(1)
		case payload != "busy":
			got <- payload
		}
	})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	tag := e.tagOn(t, e.primaries[0])
	x, busy := prefix(t)+"{"+tag+"}:w:x", prefix(t)+"{"+tag+"}:w:busy"
	ctx = timeout(t)
	if err := sub.Subscribe(ctx, x, busy); err != nil {
		t.Fatal(err)
	}
	redistest.PublishUntilReceived(t, e.primaries[0], x, "subscribed", got)
	publish := dlock.NewScript("spublish", "return redis.call('SPUBLISH', KEYS[1], 'busy')")
	drv, stop := e.driver(t), make(chan struct{})
	var publishing sync.WaitGroup
	publishing.Add(1)
	go func() {
		defer publishing.Done()
		for {
			select {
			case <-stop:
				return
			default:
				drv.Eval(context.Background(), &dlock.Call{Script: publish, Keys: []string{busy}})
			}
		}
	}()
	for range 1000 {
		if err := sub.Unsubscribe(ctx, x); err != nil {
			t.Fatal(err)
		}
		if err := sub.Subscribe(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	publishing.Wait()
	// Received after every reply to the requests before it.
	redistest.PublishUntilReceived(t, e.primaries[0], x, "last", got)
	if n := missed.Load(); n != 0 {
		t.Errorf("the channel was subscribed anew %d times, though no slot moved", n)
	}
	e.awaitShardNumsub(t, x, 1)
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
