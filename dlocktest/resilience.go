package dlocktest

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
)

// RunShardedResilience checks a driver's dlock.ShardedSubscriber (it skips
// drivers without one) where Run cannot, as it changes the cluster under
// test: each subtest starts a Redis Cluster of its own. A shard channel
// stays subscribed through a failover of its slot's primary and through a
// move of its slot to another primary (and the driver says so, calling
// notify with an empty channel and payload, before the channel's first
// notice), the other channels of the old primary keep their connection
// (closed once the last of them moved too), channels in many slots cost one
// connection to each primary, none once all are unsubscribed, a channel
// whose Subscribe failed is subscribed by asking again, and a primary that
// does not answer holds up no Subscribe of another primary's channels. It
// takes about 25 seconds.
func RunShardedResilience(t *testing.T, newDriver NewDriver) {
	t.Helper()
	if newDriver == nil {
		t.Fatal("dlocktest: RunShardedResilience with a nil NewDriver")
	}
	t.Run("Failover", func(t *testing.T) { testShardedFailover(t, newDriver) })
	t.Run("SlotMove", func(t *testing.T) { testShardedSlotMove(t, newDriver) })
	t.Run("ConnectionPerPrimary", func(t *testing.T) { testShardedConnectionPerPrimary(t, newDriver) })
	t.Run("FailedSubscribe", func(t *testing.T) { testShardedFailedSubscribe(t, newDriver) })
	t.Run("PausedPrimary", func(t *testing.T) { testShardedPausedPrimary(t, newDriver) })
}

// testShardedPausedPrimary: while a Subscribe waits for a paused primary,
// a Subscribe of a channel on another primary returns, and its notices
// arrive. Once the primary resumes, the first Subscribe completes and its
// channel's notices arrive too. The first round subscribes the primary's
// first channel, so the connection's handshake gets no answer; the second
// uses the connection made, where a driver that only sends SSUBSCRIBE may
// return at once, and one that waits for the confirmation waits. In both,
// a second Subscribe on the paused primary is under way too. Each
// pause is shorter than the cluster's node timeout, so no node is marked
// failed.
func testShardedPausedPrimary(t *testing.T, newDriver NewDriver) {
	c := redistest.StartCluster(t, 3, 0)
	sub, got, _ := shardedOn(t, newDriver, c)
	paused, other := c.Nodes[0], c.Nodes[1]
	subscribeShard(t, sub, c.ChannelOn(t, other, "warm")) // the other primary's connection is up
	t.Cleanup(func() { paused.Resume(t) })                // after a failure while paused
	for round, connected := range []bool{false, true} {
		slow := c.ChannelOn(t, paused, "slow"+strconv.Itoa(round)+"-")
		fast := c.ChannelOn(t, other, "fast"+strconv.Itoa(round)+"-")
		slow2 := c.ChannelOn(t, paused, "slower"+strconv.Itoa(round)+"-")
		paused.Pause(t)
		slowDone := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			slowDone <- sub.Subscribe(ctx, slow)
		}()
		paused.AwaitUnread(t, 5*time.Second) // the request reached the paused primary
		// A second Subscribe on the paused primary waits behind the
		// first, and must not hold up the other primary's either.
		slow2Done, asking := make(chan error, 1), make(chan struct{})
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			close(asking)
			slow2Done <- sub.Subscribe(ctx, slow2)
		}()
		<-asking
		if err := sub.Subscribe(timeout(t), fast); err != nil {
			t.Fatalf("round %d: Subscribe on another primary: %v", round, err)
		}
		select {
		case err := <-slowDone:
			if !connected || err != nil {
				t.Fatalf("round %d: the Subscribe on the paused primary returned (%v) before the one on another primary", round, err)
			}
			slowDone <- nil
		default:
		}
		redistest.PublishUntilReceived(t, other, fast, "while paused", got)
		paused.Resume(t)
		if err := <-slowDone; err != nil {
			t.Fatalf("round %d: Subscribe on the primary once resumed: %v", round, err)
		}
		if err := <-slow2Done; err != nil {
			t.Fatalf("round %d: second Subscribe on the primary once resumed: %v", round, err)
		}
		redistest.PublishUntilReceived(t, paused, slow, "after the pause", got)
		redistest.PublishUntilReceived(t, paused, slow2, "after the pause, second", got)
	}
}

// testShardedFailedSubscribe: a channel whose Subscribe failed (here its
// context had expired) on a primary the subscription already has a
// connection to is subscribed once it is asked for again, as dlock's wait
// hub does at the next wait for the lock.
func testShardedFailedSubscribe(t *testing.T, newDriver NewDriver) {
	c := redistest.StartCluster(t, 3, 0)
	sub, got, _ := shardedOn(t, newDriver, c)
	srv := c.Nodes[0]
	first, second := c.ChannelOn(t, srv, "first"), c.ChannelOn(t, srv, "second")
	subscribeShard(t, sub, first)
	redistest.PublishUntilReceived(t, srv, first, "on first", got)
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_ = sub.Subscribe(expired, second) // may fail, or succeed all the same
	subscribeShard(t, sub, second)
	redistest.PublishUntilReceived(t, srv, second, "on second", got)
}

// shardedOn opens a sharded subscription of a new driver on cluster c,
// closed with the test, and returns it with the payloads it receives and
// the count of its words that it subscribed channels anew (an empty
// channel and payload, left out of the payloads).
func shardedOn(t *testing.T, newDriver NewDriver, c *redistest.Cluster) (dlock.Subscription, <-chan string, *atomic.Int32) {
	t.Helper()
	d := newDriver(t, Deployment{Topology: Cluster, Addrs: c.Addrs()})
	ss, ok := d.(dlock.ShardedSubscriber)
	if !ok {
		t.Skip("the driver has no ShardedSubscriber")
	}
	got, resumed := make(chan string, 1000), new(atomic.Int32)
	ctx, cancel := opening()
	sub, err := ss.SubscribeSharded(ctx, func(channel, payload string) {
		if channel == "" && payload == "" {
			resumed.Add(1)
			return
		}
		got <- payload
	})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub, got, resumed
}

func subscribeShard(t *testing.T, sub dlock.Subscription, channels ...string) {
	t.Helper()
	ctx, cancel := opening()
	defer cancel()
	if err := sub.Subscribe(ctx, channels...); err != nil {
		t.Fatal(err)
	}
}

// testShardedFailover: a shard channel stays subscribed through the
// failover of the primary that serves its slot, on the replica that takes
// over.
func testShardedFailover(t *testing.T, newDriver NewDriver) {
	c := redistest.StartCluster(t, 3, 1)
	const ch = "dlock:{failover}:w:test"
	sub, got, resumed := shardedOn(t, newDriver, c)
	subscribeShard(t, sub, ch)
	old := c.PrimaryOf(t, ch)
	redistest.PublishUntilReceived(t, old, ch, "before", got)

	old.Kill(t)
	next := c.AwaitFailover(t, ch, old, 20*time.Second)
	start := time.Now()
	redistest.PublishUntilReceived(t, next, ch, "after", got)
	t.Logf("received on the new primary %v after the failover", time.Since(start).Round(time.Millisecond))
	// Once for the channel; a few more would do no harm, but not one for
	// every attempt made while its primary was away.
	if n := resumed.Load(); n == 0 || n > 3 {
		t.Errorf("the driver said %d times that it subscribed the channel anew (notify with an empty channel and payload), want once before its first notice", n)
	}
}

// testShardedSlotMove: when a channel's slot moves to another primary,
// whose old node then unsubscribes the channel by itself, the channel is
// subscribed there, and the channels of the old primary's other slots stay
// on their connection, which closes once the last of them moved too.
func testShardedSlotMove(t *testing.T, newDriver NewDriver) {
	c := redistest.StartCluster(t, 3, 0)
	const moving = "dlock:{moving}:w:test"
	sub, got, resumed := shardedOn(t, newDriver, c)
	subscribeShard(t, sub, moving)
	old := c.PrimaryOf(t, moving)
	staying := c.ChannelOn(t, old, "staying")
	subscribeShard(t, sub, staying)
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
	// Once for the channel; a few more would do no harm, but not one for
	// every attempt made while its primary was away.
	if n := resumed.Load(); n == 0 || n > 3 {
		t.Errorf("the driver said %d times that it subscribed the moved channel anew (notify with an empty channel and payload), want once before its first notice", n)
	}
	redistest.PublishUntilReceived(t, old, staying, "staying after", got)
	if n := old.Do(t, "PUBSUB", "SHARDNUMSUB", moving); n != moving+"\n0" {
		t.Errorf("the old primary still has a subscriber: PUBSUB SHARDNUMSUB = %q", n)
	}
	if conns := old.PubSubConnections(t); conns != 1 {
		t.Errorf("the old primary has %d pub/sub connections, want 1", conns)
	}

	// The old primary's last channel moves away too: its connection
	// closes, as when the last one is unsubscribed.
	var id string // of the connection subscribed to staying
	for _, line := range strings.Split(old.Do(t, "CLIENT", "LIST"), "\n") {
		if strings.Contains(line, " ssub=1 ") {
			id = strings.Fields(line)[0] + " "
		}
	}
	c.MoveEmptySlot(t, staying, next)
	redistest.PublishUntilReceived(t, next, staying, "staying moved", got)
	await(t, "the old primary's connection to close", func() bool { return id == "" || !strings.Contains(old.Do(t, "CLIENT", "LIST"), id) })
	if id == "" {
		t.Error("no connection of the old primary was subscribed")
	}
}

// testShardedConnectionPerPrimary: channels in many slots cost one
// connection to each primary that serves them, not one a slot.
func testShardedConnectionPerPrimary(t *testing.T, newDriver NewDriver) {
	c := redistest.StartCluster(t, 3, 0)
	sub, got, _ := shardedOn(t, newDriver, c)
	var channels []string
	for i := range 60 {
		ch := "dlock:{n" + strconv.Itoa(i) + "}:w:test"
		channels = append(channels, ch)
		subscribeShard(t, sub, ch)
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
		await(t, "no pub/sub connection left on "+n.Addr(), func() bool { return n.PubSubConnections(t) == 0 })
	}
}
