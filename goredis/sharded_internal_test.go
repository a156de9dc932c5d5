package goredis

import (
	"bytes"
	"context"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/keyslot"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestAChannelLetGoWhileMovingStaysGone: a channel unsubscribed while its
// connection's failure has it waiting to be subscribed anew is not
// subscribed again.
func TestAChannelLetGoWhileMovingStaysGone(t *testing.T) {
	passes := make(chan struct{}, 16)
	resubscribed = func() { passes <- struct{}{} }
	defer func() { resubscribed = nil }()
	c := redistest.StartCluster(t, 3, 0)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	sub, err := New(rdb).SubscribeSharded(ctx, func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	s := sub.(*shardedSubscription)
	const ch = "dlock:{moving}:w:test"
	if err := s.Subscribe(ctx, ch); err != nil {
		t.Fatal(err)
	}
	srv := c.PrimaryOf(t, ch)
	srv.Do(t, "CLIENT", "KILL", "TYPE", "pubsub")
	moving := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.moving[ch]
	}
	for end := time.Now().Add(5 * time.Second); !moving(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the channel was not found to move after its connection was killed")
		}
	}
	if err := s.Unsubscribe(ctx, ch); err != nil {
		t.Fatal(err)
	}
	// Subscribing anew comes after shardRetryMin, in a pass that ends
	// once nothing is left to subscribe.
	select {
	case <-passes:
	case <-time.After(10 * time.Second):
		t.Fatal("the channels of the failed connection were not taken up again")
	}
	if n := srv.Do(t, "PUBSUB", "SHARDNUMSUB", ch); n != ch+"\n0" && n != ch+" 0" {
		t.Errorf("PUBSUB SHARDNUMSUB after the channel was let go: %q", n)
	}
	s.mu.Lock()
	_, subscribed := s.where[ch]
	s.mu.Unlock()
	if subscribed {
		t.Error("the channel was subscribed again after it was let go")
	}
}

// TestASilentPrimaryConnectionIsTakenForFailed: a primary's connection cut
// off without a reset (it passes nothing, and stays open) is noticed by
// the PING sent after a silence, so that its channels are subscribed anew
// instead of waiting for TCP keep-alive. Quiet connections that answer the
// PING go on.
func TestASilentPrimaryConnectionIsTakenForFailed(t *testing.T) {
	srv, px, rdb := behindCutProxy(t)
	ctx := context.Background()
	ps := rdb.SSubscribe(ctx, "ch")
	defer ps.Close()
	got := make(chan string, 4)
	ns := &nodeSubscription{s: &shardedSubscription{notify: func(_, p string) { got <- p }}, ps: ps, channels: map[string]bool{"ch": true}}
	done := make(chan []string, 1)
	go func() { done <- ns.receive() }()
	redistest.PublishUntilReceived(t, srv, "ch", "hello", got)
	// Quiet, but alive: several silences pass, each answered by a PING.
	pings := pingCalls(t, srv)
	for deadline := time.Now().Add(10 * time.Second); pingCalls(t, srv) < pings+3; time.Sleep(10 * time.Millisecond) {
		select {
		case moved := <-done:
			t.Fatalf("a quiet connection was given up: %v", moved)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server was sent %d PINGs in 10s, want 3 or more", pingCalls(t, srv)-pings)
		}
	}
	select {
	case moved := <-done:
		t.Fatalf("a quiet connection was given up: %v", moved)
	default:
	}
	px.Cut()
	select {
	case moved := <-done:
		if moved != nil {
			t.Errorf("moved %v, want a failed connection", moved)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the silent connection is still taken for alive")
	}
}

// TestAPrimaryDownCostsOneRetryLoop: while the primary of a shard
// channel's slot is down, with no replica to take over, the subscription
// retries the channel in one loop (a failed new connection is left to its
// own goroutine, which had made every retry two), with a backoff that
// grows (50ms, 100ms, 200ms, then shardRetryMax) across the connections it
// makes, and tells notify nothing: nothing was subscribed anew.
func TestAPrimaryDownCostsOneRetryLoop(t *testing.T) {
	passes := make(chan time.Time, 64) // when each pass ended
	resubscribed = func() {
		select {
		case passes <- time.Now():
		default: // the test has seen enough
		}
	}
	defer func() { resubscribed = nil }()
	c := redistest.StartCluster(t, 3, 0)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	var words atomic.Int64
	sub, err := New(rdb).SubscribeSharded(ctx, func(ch, p string) {
		if ch == "" && p == "" {
			words.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	const ch = "dlock:{down}:w:test"
	srv := subscribedOn(t, ctx, c, sub, ch)
	before := runtime.NumGoroutine()
	srv.Kill(t)
	// The first pass waits shardRetryMin; each later one, the step of
	// the backoff the connection of the one before was made with: twice
	// as long, up to shardRetryMax.
	var ended []time.Time
	for len(ended) < 8 {
		select {
		case at := <-passes:
			ended = append(ended, at)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d passes to subscribe the channel anew, then none in 10s", len(ended))
		}
	}
	// A pass begins a moment before the one whose connection failed has
	// ended (a moment a loaded machine can stretch), so one gap may fall
	// short of its wait: the passes are timed in all. Their waits add up
	// to 1.55s; a backoff that did not grow would take 350ms.
	gaps := make([]time.Duration, len(ended)-1)
	for k := range gaps {
		gaps[k] = ended[k+1].Sub(ended[k])
	}
	t.Logf("the passes ended %v apart", gaps)
	want, wait := time.Duration(0), shardRetryMin
	for range gaps {
		wait = min(2*wait, shardRetryMax)
		want += wait
	}
	if total := ended[len(ended)-1].Sub(ended[0]); total < want-150*time.Millisecond {
		t.Errorf("the passes took %v in all, want about %v: the backoff does not grow", total, want)
	}
	// Capped: the gaps of a backoff that doubled on would have reached
	// 6.4s by the last one.
	if gap := gaps[len(gaps)-1]; gap > 8*shardRetryMax {
		t.Errorf("the last pass ended %v after the one before: the backoff is not capped at %v", gap, shardRetryMax)
	}
	if n := runtime.NumGoroutine(); n > before+10 {
		t.Errorf("%d goroutines after %d passes with the primary down, %d before", n, len(ended), before)
	}
	if n := words.Load(); n > 0 {
		t.Errorf("notify(\"\", \"\") called %d times while nothing could be subscribed anew", n)
	}
}

// TestASubscribeWhoseWriteFailsIsNotStranded: an SSUBSCRIBE whose write
// fails (the connection reset) has go-redis connect anew inside the call,
// with the connection's other channels but not this one. The channel is
// subscribed all the same: by a retry after the user's Subscribe failed,
// and, for a channel that moved, by the subscription itself, which then
// says so.
func TestASubscribeWhoseWriteFailsIsNotStranded(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	var fault resetOnSSubscribe
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), Dialer: fault.dialer})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	got := make(chan string, 100)
	var words atomic.Int32
	sub, err := New(rdb).SubscribeSharded(ctx, func(ch, p string) {
		if ch == "" && p == "" {
			words.Add(1)
			return
		}
		got <- p
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	// A user's Subscribe on a primary it has no connection to yet.
	const fresh = "dlock:{fresh}:w:test"
	srv := c.PrimaryOf(t, fresh)
	fault.arm(srv.Port())
	if err := sub.Subscribe(ctx, fresh); err == nil {
		t.Fatal("Subscribe succeeded through a reset connection")
	}
	redistest.PublishUntilReceived(t, srv, fresh, "fresh", got)

	// A channel whose slot moves to a primary it has no connection to.
	const moving = "dlock:{moving}:w:test"
	if err := sub.Subscribe(ctx, moving); err != nil {
		t.Fatal(err)
	}
	old := c.PrimaryOf(t, moving)
	redistest.PublishUntilReceived(t, old, moving, "before", got)
	next := c.Nodes[0]
	if next == old || next == srv {
		next = c.Nodes[1]
	}
	if next == old || next == srv {
		next = c.Nodes[2]
	}
	before := words.Load()
	fault.arm(next.Port())
	c.MoveEmptySlot(t, moving, next)
	redistest.PublishUntilReceived(t, next, moving, "after", got)
	if fault.fired.Load() != 2 {
		t.Errorf("the reset was made %d times, want 2", fault.fired.Load())
	}
	if words.Load() == before {
		t.Error("the moved channel was subscribed anew without notify(\"\", \"\")")
	}
}

// resetOnSSubscribe makes the next write carrying SSUBSCRIBE on a
// connection to port fail as a connection reset by the peer does (the
// connection is closed, the write returns ECONNRESET). go-redis then
// connects anew inside the failing SSubscribe, and the new connection
// works.
type resetOnSSubscribe struct {
	mu    sync.Mutex
	port  string // armed for this port; "" when not armed
	fired atomic.Int32
}

func (r *resetOnSSubscribe) arm(port int) {
	r.mu.Lock()
	r.port = strconv.Itoa(port)
	r.mu.Unlock()
}

func (r *resetOnSSubscribe) dialer(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	cn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &faultConn{Conn: cn, addr: addr, r: r}, nil
}

type faultConn struct {
	net.Conn
	addr string
	r    *resetOnSSubscribe
}

func (c *faultConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("ssubscribe")) {
		c.r.mu.Lock()
		hit := c.r.port != "" && strings.HasSuffix(c.addr, ":"+c.r.port)
		if hit {
			c.r.port = ""
		}
		c.r.mu.Unlock()
		if hit {
			c.r.fired.Add(1)
			_ = c.Conn.Close()
			return 0, &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.ECONNRESET)}
		}
	}
	return c.Conn.Write(b)
}

// TestAStalledPrimaryDoesNotHoldUpASubscription: whether the cluster has
// shard channels is asked of one primary, and of others while it does not
// answer, so that a subscription opens while the primary that go-redis
// would send the question to (the slot of "INFO") stalls, and carries the
// notices of the other primaries.
func TestAStalledPrimaryDoesNotHoldUpASubscription(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	if err := rdb.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		return node.Ping(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}
	stalled := c.PrimaryOf(t, "INFO")
	var healthy *redistest.Server
	for _, n := range c.Nodes {
		if n != stalled {
			healthy = n
			break
		}
	}
	ch := c.ChannelOn(t, healthy, "hedged") // asks every node: before the stall
	resume := stalled.PauseAWhile(t)

	got := make(chan string, 16)
	opened, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	sub, err := New(rdb).SubscribeSharded(opened, func(_, payload string) {
		if payload != "" {
			got <- payload
		}
	})
	if err != nil {
		t.Fatalf("SubscribeSharded while one primary stalls: %v", err)
	}
	defer sub.Close()
	if err := sub.Subscribe(opened, ch); err != nil {
		t.Fatal(err)
	}
	redistest.PublishUntilReceived(t, healthy, ch, "free", got)
	resume()
}

// TestUnsubscribingChannelsOfSeveralSlotsKeepsTheConnection: the idle
// channels a client lets go of lie in several slots of one primary, which
// refuses a SUNSUBSCRIBE across slots (CROSSSLOT). Sent one a slot, they go
// on the primary's connection, and the channel kept there still hears its
// notices; sent at once, the refusal closed the connection, and notices
// were lost until it was subscribed anew.
func TestUnsubscribingChannelsOfSeveralSlotsKeepsTheConnection(t *testing.T) {
	c, sub, _ := shardedPayloads(t)
	ctx := context.Background()
	p := c.Nodes[0]
	keep, a, b := c.ChannelOn(t, p, "keep"), c.ChannelOn(t, p, "a"), c.ChannelOn(t, p, "b")
	if keyslot.Of(a) == keyslot.Of(b) {
		t.Fatalf("%s and %s share a slot", a, b)
	}
	if err := sub.Subscribe(ctx, keep, a, b); err != nil {
		t.Fatal(err)
	}
	before := p.Do(t, "CLIENT", "LIST", "TYPE", "pubsub")
	if err := sub.Unsubscribe(ctx, a, b); err != nil {
		t.Fatalf("Unsubscribe: %v", err)
	}
	if n := p.Do(t, "SPUBLISH", keep, "kept"); n != "1" {
		t.Errorf("a notice on the kept channel right after the Unsubscribe reached %s subscribers, want 1", n)
	}
	id := func(list string) string { // the first connection's id=…
		if f := strings.Fields(list); len(f) > 0 {
			return f[0]
		}
		return ""
	}
	if after := p.Do(t, "CLIENT", "LIST", "TYPE", "pubsub"); id(after) != id(before) {
		t.Errorf("the primary's pub/sub connection was replaced: %q, then %q", before, after)
	}
	if chans := p.Do(t, "PUBSUB", "SHARDCHANNELS"); strings.Contains(chans, a) || strings.Contains(chans, b) {
		t.Errorf("still subscribed after the Unsubscribe: %q", chans)
	}
}

// TestAConnectionWhoseChannelsAllMovedCloses: a primary's connection whose
// last channel moved away with its slot closes, as one whose last channel
// is unsubscribed does, instead of staying open, and pinged, until Close.
func TestAConnectionWhoseChannelsAllMovedCloses(t *testing.T) {
	c, sub, got := shardedPayloads(t)
	ctx := context.Background()
	from, to := c.Nodes[0], c.Nodes[1]
	ch := c.ChannelOn(t, from, "moves")
	if err := sub.Subscribe(ctx, ch); err != nil {
		t.Fatal(err)
	}
	redistest.PublishUntilReceived(t, from, ch, "before", got)
	c.MoveEmptySlot(t, ch, to)
	redistest.PublishUntilReceived(t, to, ch, "after", got)
	s := sub.(*shardedSubscription)
	awaitTrue(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.nodes) == 1 && s.nodes[from.Addr()] == nil
	})
	awaitTrue(t, func() bool { return !strings.Contains(from.Do(t, "CLIENT", "LIST"), "cmd=ssubscribe") })
}

// shardedPayloads starts a cluster and opens a shard subscription on it,
// over a client with ContextTimeoutEnabled, whose notices pass their
// payloads (not the empty ones) to got; both close with the test.
func shardedPayloads(t *testing.T) (*redistest.Cluster, dlock.Subscription, <-chan string) {
	t.Helper()
	c := redistest.StartCluster(t, 3, 0)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	got := make(chan string, 16)
	sub, err := New(rdb).SubscribeSharded(context.Background(), func(_, payload string) {
		if payload != "" {
			got <- payload
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return c, sub, got
}

// TestAConnectionWhoseSetUpIsRefusedIsMadeWithTheBackoff: a primary that
// refuses a command of a new connection's set-up (CLIENT SETNAME, for a
// client with a ClientName, after an ACL change) makes the channels of
// that primary be subscribed anew with the backoff, not a connection made
// again at once, over and over: its NOPERM names a command, not a channel.
func TestAConnectionWhoseSetUpIsRefusedIsMadeWithTheBackoff(t *testing.T) {
	passes := make(chan struct{}, 64)
	resubscribed = func() {
		select {
		case passes <- struct{}{}:
		default:
		}
	}
	defer func() { resubscribed = nil }()
	c := redistest.StartCluster(t, 3, 0)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ClientName: "dlock-test"})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	sub, err := New(rdb).SubscribeSharded(ctx, func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	const ch = "dlock:{setup}:w:test"
	srv := subscribedOn(t, ctx, c, sub, ch)
	srv.Do(t, "ACL", "SETUSER", "default", "-client|setname")
	defer srv.Do(t, "ACL", "SETUSER", "default", "+client|setname")
	connections := func() int {
		for _, line := range strings.Split(srv.Do(t, "INFO", "stats"), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_connections_received:"); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
		t.Fatal("no total_connections_received in INFO stats")
		return 0
	}
	before := connections()
	srv.Do(t, "CLIENT", "KILL", "TYPE", "pubsub")
	// Three passes of the backoff (50, 100, 200ms): a few connections each.
	for range 3 {
		select {
		case <-passes:
		case <-time.After(10 * time.Second):
			t.Fatal("the channel was not subscribed anew within 10s")
		}
	}
	if n := connections() - before; n > 50 {
		t.Errorf("%d connections made to the primary in three passes of the backoff", n)
	}
}

// subscribedOn subscribes sub to the shard channel ch and returns the
// primary of its slot once that counts the subscriber.
func subscribedOn(t *testing.T, ctx context.Context, c *redistest.Cluster, sub dlock.Subscription, ch string) *redistest.Server {
	t.Helper()
	if err := sub.Subscribe(ctx, ch); err != nil {
		t.Fatal(err)
	}
	srv := c.PrimaryOf(t, ch)
	awaitTrue(t, func() bool { return srv.Do(t, "PUBSUB", "SHARDNUMSUB", ch) == ch+"\n1" })
	return srv
}
