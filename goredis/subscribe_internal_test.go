package goredis

import (
	"context"
	"net"
	"strconv"
	"strings"
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
	pings := pingCalls(t, srv)
	for deadline := time.Now().Add(10 * time.Second); pingCalls(t, srv) < pings+3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server was sent %d PINGs in 10s, want 3 or more", pingCalls(t, srv)-pings)
		}
	}
	if sub.(*subscription).current() != first {
		t.Error("a quiet connection that answers its PINGs was replaced")
	}
	px.Cut()
	redistest.PlainPublishUntilReceived(t, srv, "ch", "after the cut", got)
}

// pingCalls returns how many PINGs srv has answered.
func pingCalls(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	for _, line := range strings.Split(srv.Do(t, "INFO", "commandstats"), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_ping:calls="); ok {
			n, err := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			if err != nil {
				t.Fatalf("INFO commandstats: %q", line)
			}
			return n
		}
	}
	return 0 // none yet
}

// current returns the subscription's PubSub.
func (s *subscription) current() *redis.PubSub {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ps
}

// behindCutProxy shortens the silence after which a connection is sent a
// PING to 500ms, for the test, and returns a server, a CutProxy in front
// of it and a go-redis client through the proxy, closed with the test.
func behindCutProxy(t *testing.T) (*redistest.Server, *redistest.CutProxy, *redis.Client) {
	saved := shardSilence
	shardSilence = 500 * time.Millisecond
	t.Cleanup(func() { shardSilence = saved })
	srv := redistest.Start(t)
	px := redistest.StartCutProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return srv, px, rdb
}

// TestAReconnectInsideSubscribeIsTold: go-redis connects a PubSub anew
// inside Subscribe when its write fails (here a context whose deadline had
// passed, which go-redis takes for a bad connection). The reading goroutine,
// in notify meanwhile, sees no failed read; the new connection's
// confirmation still comes with notify("", ""), as a notice was lost
// while no connection was subscribed.
func TestAReconnectInsideSubscribeIsTold(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	got := make(chan string, 16)
	entered, release := make(chan struct{}), make(chan struct{})
	sub, err := New(rdb).Subscribe(ctx, func(ch, p string) {
		if p == "block" {
			close(entered)
			<-release
		}
		got <- ch + "/" + p
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	subscribed := func() bool { return srv.Do(t, "PUBSUB", "NUMSUB", "a") == "a\n1" }
	awaitTrue(t, subscribed)
	srv.Do(t, "PUBLISH", "a", "block")
	<-entered
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if err := sub.Subscribe(expired, "b"); err == nil {
		t.Fatal("Subscribe with an expired context succeeded")
	}
	if subscribed() {
		t.Fatal("the connection survived the failed write")
	}
	close(release)
	if m := <-got; m != "a/block" {
		t.Fatalf("got %q first", m)
	}
	awaitTrue(t, subscribed)
	srv.Do(t, "PUBLISH", "a", "after")
	for _, want := range []string{"/", "a/after"} {
		select {
		case m := <-got:
			if m != want {
				t.Fatalf("got %q, want %q", m, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%q did not arrive", want)
		}
	}
}

// awaitTrue waits up to 5s for cond.
func awaitTrue(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition not met within 5s")
		}
	}
}

// TestASubscriptionClosesWhileItConnectsToAStalledServer: Close does not
// wait out go-redis's read timeout (10s here) for a new connection that
// the subscription is making to a server that stalls: with
// ContextTimeoutEnabled, each of its requests has pubsubConnect.
func TestASubscriptionClosesWhileItConnectsToAStalledServer(t *testing.T) {
	saved := shardSilence
	shardSilence = 200 * time.Millisecond
	t.Cleanup(func() { shardSilence = saved })
	srv := redistest.Start(t)
	dials := make(chan struct{}, 64)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 10 * time.Second, ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			select {
			case dials <- struct{}{}:
			default:
			}
			return conn, err
		}})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	got := make(chan string, 16)
	sub, err := New(rdb).Subscribe(ctx, func(_, p string) {
		if p != "" {
			got <- p
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Subscribe(ctx, "ch"); err != nil {
		t.Fatal(err)
	}
	redistest.PlainPublishUntilReceived(t, srv, "ch", "hello", got)
	for len(dials) > 0 {
		<-dials
	}
	resume := srv.PauseAWhile(t)
	// Silent, then no answer to the PING: the connection is replaced (one
	// dial, whose handshake gets no answer), and the next read connects
	// anew (another): Close comes during that one's handshake.
	for range 2 {
		select {
		case <-dials:
		case <-time.After(10 * time.Second):
			t.Fatal("the subscription did not connect anew to the stalled server")
		}
	}
	start := time.Now()
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	resume()
	if took > 5*time.Second {
		t.Errorf("Close took %v while the subscription connected to a stalled server, want about pubsubConnect", took)
	}
}

// TestAnErrorReplyOnAConfirmedSubscriptionKeepsIt: an UNSUBSCRIBE answered
// BUSY (another client's script runs) on a connection whose channels the
// server confirmed leaves the connection as it is: it is not replaced, and
// the other channel's messages go on with no notice that some were lost.
func TestAnErrorReplyOnAConfirmedSubscriptionKeepsIt(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	got := make(chan string, 16)
	sub, err := New(rdb).Subscribe(ctx, func(ch, p string) { got <- ch + " " + p })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(ctx, "kept", "dropped"); err != nil {
		t.Fatal(err)
	}
	awaitTrue(t, func() bool { return srv.Do(t, "PUBSUB", "NUMSUB", "kept", "dropped") == "kept\n1\ndropped\n1" })
	first := sub.(*subscription).current()
	end := srv.Busy(t)
	if err := sub.Unsubscribe(ctx, "dropped"); err != nil {
		t.Fatal(err)
	}
	end()
	srv.Do(t, "PUBLISH", "kept", "after")
	select {
	case m := <-got:
		if m != "kept after" {
			t.Errorf("after an UNSUBSCRIBE answered BUSY, notify got %q first, want the message", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no message within 10s")
	}
	if sub.(*subscription).current() != first {
		t.Error("the connection was replaced")
	}
}
