package dlockrueidis_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
	dlockrueidis "github.com/dlockio/dlock/rueidis"
	"github.com/redis/rueidis"
)

// TestASubscribeToAPrimaryBeingConnectedWaitsForIt: a shard subscription
// has no connection to a primary yet; one Subscribe opens it, and another
// for a channel of that primary comes while the dial is under way. The
// second returns once its channel is subscribed: it returned at once,
// having only recorded the channel, and a notice sent before the new
// connection caught up with it was lost (a waiter then slept until its
// next beat).
func TestASubscribeToAPrimaryBeingConnectedWaitsForIt(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	q, other := c.Nodes[0], c.Nodes[1]
	var gate atomic.Pointer[chan struct{}]
	dialing := make(chan struct{}, 1)
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs()[:1],
		DialCtxFn: func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
			if g := gate.Load(); g != nil && addr == q.Addr() {
				select {
				case dialing <- struct{}{}:
				default:
				}
				select {
				case <-*g:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return d.DialContext(ctx, "tcp", addr)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	ctx := context.Background()
	sub := subscribeSharded(t, client)
	one, two := c.ChannelOn(t, q, "one"), c.ChannelOn(t, q, "two")
	// The slot map is read, and the client's own connection to q is open:
	// the next dial to q is the subscription's.
	if err := sub.Subscribe(ctx, c.ChannelOn(t, other, "warm")); err != nil {
		t.Fatal(err)
	}
	if err := client.Do(ctx, client.B().Exists().Key(one).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	g := make(chan struct{})
	gate.Store(&g)
	first := make(chan error, 1)
	go func() { first <- sub.Subscribe(ctx, one) }()
	<-dialing
	second := make(chan error, 1)
	go func() { second <- sub.Subscribe(ctx, two) }()
	open := time.AfterFunc(200*time.Millisecond, func() {
		gate.Store(nil)
		close(g)
	})
	defer open.Stop()
	if err := <-second; err != nil {
		t.Fatalf("the second Subscribe: %v", err)
	}
	if n := q.Do(t, "SPUBLISH", two, "x"); n != "1" {
		t.Errorf("a notice sent once the second Subscribe returned reached %s subscribers, want 1", n)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first Subscribe: %v", err)
	}
}

// TestAStalledPrimaryDoesNotHoldUpASubscription: whether the cluster has
// shard channels is asked of one primary, and of others while it does not
// answer, so that subscriptions open while a primary stalls (each in
// turn: the first asked is that of slot 0), and carry the notices of the
// other primaries. rueidis sent the question to a node of its choosing, which
// could be the stalled one: the subscription then failed, and the
// client's waits polled.
func TestAStalledPrimaryDoesNotHoldUpASubscription(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	drv := dlockrueidis.New(client)
	for _, stalled := range c.Nodes {
		stalledAWhile(t, c, drv, stalled)
	}
}

// stalledAWhile opens shard subscriptions of drv while stalled stalls, and
// checks that they carry another primary's notices.
func stalledAWhile(t *testing.T, c *redistest.Cluster, drv *dlockrueidis.Driver, stalled *redistest.Server) {
	ctx := context.Background()
	var healthy *redistest.Server
	for _, n := range c.Nodes {
		if n != stalled {
			healthy = n
			break
		}
	}
	ch := c.ChannelOn(t, healthy, "hedged")
	_ = drv.Server(ctx, ch) // the slot map is read before the stall
	resume := stalled.PauseAWhile(t)
	type opened struct {
		sub dlock.Subscription
		got chan string
		err error
	}
	const subscriptions = 6 // a node of rueidis's choosing is the stalled one 1 time in 3
	subs := make(chan opened, subscriptions)
	for i := range subscriptions {
		go func() {
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			o := opened{got: make(chan string, 16)}
			o.sub, o.err = drv.SubscribeSharded(ctx, func(_, payload string) {
				if payload != "" {
					o.got <- payload
				}
			})
			if o.err != nil {
				o.err = fmt.Errorf("subscription %d: SubscribeSharded while one primary stalls: %w", i, o.err)
			} else if o.err = o.sub.Subscribe(ctx, ch); o.err != nil {
				o.err = fmt.Errorf("subscription %d: %w", i, o.err)
			}
			subs <- o
		}()
	}
	for range subscriptions {
		o := <-subs
		if o.err != nil {
			t.Error(o.err)
		} else {
			redistest.PublishUntilReceived(t, healthy, ch, "free", o.got)
		}
		if o.sub != nil {
			defer o.sub.Close()
		}
	}
	resume()
}

// TestASubscribeToAStalledNewPrimaryEndsWithItsContext: a Subscribe that
// must open a connection to a primary that stalls returns when its
// context ends (the wait it serves goes on without notices), while the
// connection goes on opening; rueidis dials whatever the context says, and
// the call waited for the handshake's own timeout. An Unsubscribe of the
// channel then does not wait for it either.
func TestASubscribeToAStalledNewPrimaryEndsWithItsContext(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	q, other := c.Nodes[0], c.Nodes[1]
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	ctx := context.Background()
	sub := subscribeSharded(t, client)
	if err := sub.Subscribe(ctx, c.ChannelOn(t, other, "warm")); err != nil {
		t.Fatal(err)
	}
	ch := c.ChannelOn(t, q, "stalled")
	resume := q.PauseAWhile(t)
	defer resume()
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = sub.Subscribe(sctx, ch)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Subscribe returned %v after its context's 300ms", took)
	}
	if err == nil {
		t.Error("Subscribe on a stalled primary: err = nil, want its context's end")
	}
	// Let go of at once, the connection still opening: it closes once open.
	start = time.Now()
	_ = sub.Unsubscribe(ctx, ch)
	if took := time.Since(start); took > time.Second {
		t.Errorf("Unsubscribe of the channel of a connection still opening took %v", took)
	}
	resume()
}

// subscribeSharded opens a shard subscription over client, closed with the
// test, whose notices go nowhere.
func subscribeSharded(t *testing.T, client rueidis.Client) dlock.Subscription {
	t.Helper()
	sub, err := dlockrueidis.New(client).SubscribeSharded(context.Background(), func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}
