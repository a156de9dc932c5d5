package dlockrueidis_test

import (
	"context"
	"crypto/tls"
	"net"
	"sync/atomic"
	"testing"
	"time"

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
	sub, err := dlockrueidis.New(client).SubscribeSharded(ctx, func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
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
