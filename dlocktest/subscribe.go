package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

var subscribeTests = []test{
	{name: "Messages", run: testMessages},
	{name: "Unsubscribe", run: testUnsubscribe},
	{name: "ConcurrentSubscribe", run: testConcurrentSubscribe},
	{name: "Close", run: testClose},
	{name: "CloseWaitsForNotify", run: testCloseWaitsForNotify},
	{name: "SubscribeWhileNotifyBlocks", run: testSubscribeWhileNotifyBlocks},
	{name: "Reconnects", run: testReconnects},
	{name: "Refused", run: testRefused},
	{name: "LaterRefused", run: testLaterRefused},
	{name: "BusyAtResubscribe", run: testBusyAtResubscribe},
}

// busyFor is how long testBusyAtResubscribe keeps the servers busy: long
// enough for a driver to connect again meanwhile.
const busyFor = 300 * time.Millisecond

// testBusyAtResubscribe: a subscription whose connection the server closes
// and that connects again while the server is busy with a script, which
// answers its SUBSCRIBE with BUSY, subscribes its channels once the script
// is over: it does not stay deaf for as long as that connection lasts.
func testBusyAtResubscribe(t *testing.T, e *env) {
	rec := newRecorder()
	sub := e.subscribe(t, rec.notify)
	ch := prefix(t) + "busy"
	if err := sub.Subscribe(timeout(t), ch); err != nil {
		t.Fatal(err)
	}
	e.awaitNumsub(t, ch, 1)
	var ends []func()
	for _, n := range e.nodes {
		ends = append(ends, n.Busy(t, "CLIENT", "KILL", "TYPE", "pubsub"))
	}
	time.Sleep(busyFor) // the fault's length: the driver connects again meanwhile
	for _, end := range ends {
		end()
	}
	e.awaitNumsub(t, ch, 1)
	e.publish(t, ch, "after")
	for n := 1; !slices.Contains(rec.await(t, n), message{ch, "after"}); n++ {
		// The notice that the subscription connected again comes first.
	}
}

// message is one notice delivered to notify.
type message struct{ channel, payload string }

// recorder is a notify function that records what it is given, from which
// goroutines, and whether it was called after Close returned.
type recorder struct {
	mu      sync.Mutex
	msgs    []message
	gids    []uint64 // the goroutines that called notify, in order of first call
	arrived chan struct{}

	linger  time.Duration // how long each call lasts, so that calls at once meet
	running atomic.Int32  // calls in progress
	overlap atomic.Bool   // two calls ran at once
	closed  atomic.Bool   // set once Close returned
	late    atomic.Int32  // calls after Close returned
}

func newRecorder() *recorder { return &recorder{arrived: make(chan struct{}, 1)} }

func (r *recorder) notify(channel, payload string) {
	if r.running.Add(1) > 1 {
		r.overlap.Store(true)
	}
	defer r.running.Add(-1)
	if r.closed.Load() {
		r.late.Add(1)
	}
	id := goroutineID()
	r.mu.Lock()
	r.msgs = append(r.msgs, message{channel, payload})
	if !slices.Contains(r.gids, id) {
		r.gids = append(r.gids, id)
	}
	r.mu.Unlock()
	if r.linger > 0 {
		time.Sleep(r.linger)
	}
	select {
	case r.arrived <- struct{}{}:
	default:
	}
}

// await waits until n messages arrived and returns them.
func (r *recorder) await(t testing.TB, n int) []message {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		r.mu.Lock()
		msgs := slices.Clone(r.msgs)
		r.mu.Unlock()
		if len(msgs) >= n {
			return msgs
		}
		select {
		case <-r.arrived:
		case <-deadline:
			t.Fatalf("dlocktest: %d of %d messages arrived within %v: %v", len(msgs), n, waitFor, msgs)
		}
	}
}

// check fails t if notify ran on more than one goroutine at once, or after
// Close returned.
func (r *recorder) check(t testing.TB) {
	t.Helper()
	if r.overlap.Load() {
		t.Error("notify was called from two goroutines at once")
	}
	if n := r.late.Load(); n > 0 {
		t.Errorf("notify was called %d times after Close returned", n)
	}
}

// subscribe opens a subscription of a new driver with notify, closed with
// the test; it skips the test if the driver cannot subscribe.
func (e *env) subscribe(t *testing.T, notify func(channel, payload string)) dlock.Subscription {
	t.Helper()
	ctx, cancel := opening()
	sub, err := e.driver(t).Subscribe(ctx, notify)
	cancel()
	if errors.Is(err, dlock.ErrUnsupported) {
		t.Skip("the driver cannot subscribe: waiting polls")
	}
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	if sub == nil {
		t.Fatal("Subscribe returned neither a Subscription nor an error")
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func testMessages(t *testing.T, e *env) {
	rec := newRecorder()
	sub := e.subscribe(t, rec.notify)
	ctx := timeout(t)
	a, b := prefix(t)+"a", prefix(t)+"b"
	if err := sub.Subscribe(ctx, a, b); err != nil {
		t.Fatal(err)
	}
	e.awaitNumsub(t, a, 1)
	e.awaitNumsub(t, b, 1)
	want := []message{{a, "one"}, {b, ""}, {a, "\x00\xff binary\r\n"}, {b, "last"}}
	for _, m := range want {
		e.publish(t, m.channel, m.payload)
	}
	if got := rec.await(t, len(want)); !slices.Equal(got, want) {
		t.Errorf("notify got %q, want %q", got, want)
	}
	if err := sub.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	rec.closed.Store(true)
	rec.check(t)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.gids) != 1 {
		t.Errorf("notify was called from %d goroutines, want one", len(rec.gids))
	}
}

func testUnsubscribe(t *testing.T, e *env) {
	rec := newRecorder()
	sub := e.subscribe(t, rec.notify)
	ctx := timeout(t)
	a, b := prefix(t)+"a", prefix(t)+"b"
	if err := sub.Subscribe(ctx, a, b); err != nil {
		t.Fatal(err)
	}
	e.awaitNumsub(t, a, 1)
	e.awaitNumsub(t, b, 1)
	if err := sub.Unsubscribe(ctx, a); err != nil {
		t.Fatal(err)
	}
	e.awaitNumsub(t, a, 0)
	// A message on a would arrive before the one on b, published after it.
	e.publish(t, a, "dropped")
	e.publish(t, b, "kept")
	if got := rec.await(t, 1); !slices.Equal(got, []message{{b, "kept"}}) {
		t.Errorf("after Unsubscribe(a) notify got %q", got)
	}
	// Subscribing again brings a back.
	if err := sub.Subscribe(ctx, a); err != nil {
		t.Fatal(err)
	}
	e.awaitNumsub(t, a, 1)
	e.publish(t, a, "again")
	if got := rec.await(t, 2); got[1] != (message{a, "again"}) {
		t.Errorf("after subscribing again notify got %q", got)
	}
	rec.check(t)
}

// testRefused: the first Subscribe of a subscription returns the server's
// refusal (NOPERM: a user who may not listen on those channels), which
// dlock logs, its waiters polling then, rather than wait for notices that
// never come. A later Subscribe, which may not wait for the answer (see
// testSubscribeWhileNotifyBlocks), is not asked to report it.
func testRefused(t *testing.T, e *env) {
	rec := newRecorder()
	sub := e.subscribe(t, rec.notify)
	e.allowOnlyChannels(t)
	err := sub.Subscribe(timeout(t), prefix(t)+"refused")
	if err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("Subscribe to a channel the user may not listen on: err = %v, want the server's NOPERM", err)
	}
}

// testLaterRefused: a channel that the server refuses after another was
// subscribed costs only that channel: the connection goes on delivering
// the other's messages, and is not taken for failed.
func testLaterRefused(t *testing.T, e *env) {
	rec := newRecorder()
	sub := e.subscribe(t, rec.notify)
	e.allowOnlyChannels(t)
	ctx := timeout(t)
	allowed := prefix(t) + "allowed:1"
	if err := sub.Subscribe(ctx, allowed); err != nil {
		t.Fatal(err)
	}
	e.awaitNumsub(t, allowed, 1)
	if err := sub.Subscribe(ctx, prefix(t)+"refused"); err != nil && !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Subscribe to a refused channel: %v", err)
	}
	e.publish(t, allowed, "after")
	if got := rec.await(t, 1); got[0] != (message{allowed, "after"}) {
		t.Errorf("after a refused channel, notify got %q first, want the message on the other channel (the connection was taken for failed)", got)
	}
	sub.Close()
	rec.closed.Store(true)
	rec.check(t)
}

func testConcurrentSubscribe(t *testing.T, e *env) {
	rec := newRecorder()
	sub := e.subscribe(t, rec.notify)
	ctx := timeout(t)
	channels := make([]string, 6)
	var wg sync.WaitGroup
	for i := range channels {
		channels[i] = fmt.Sprintf("%s%d", prefix(t), i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sub.Subscribe(ctx, channels[i]); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for _, ch := range channels {
		e.awaitNumsub(t, ch, 1)
	}
	for _, ch := range channels {
		e.publish(t, ch, ch)
	}
	got := rec.await(t, len(channels))
	for i, m := range got {
		if m.channel != channels[i] || m.payload != channels[i] {
			t.Errorf("message %d: %q", i, m)
		}
	}
	rec.check(t)
}

// testClose: after Close returns, notify is not called, the connection has
// left its channels, and the goroutine that called notify has ended.
func testClose(t *testing.T, e *env) {
	rec := newRecorder()
	sub := e.subscribe(t, rec.notify)
	ctx := timeout(t)
	a := prefix(t) + "a"
	if err := sub.Subscribe(ctx, a); err != nil {
		t.Fatal(err)
	}
	e.awaitNumsub(t, a, 1)
	e.publish(t, a, "before")
	rec.await(t, 1)
	// Messages are on their way while it closes.
	for range 50 {
		e.publish(t, a, "during")
	}
	if err := sub.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	rec.closed.Store(true)
	e.awaitNumsub(t, a, 0)
	e.publish(t, a, "after")
	rec.mu.Lock()
	id := rec.gids[0]
	rec.mu.Unlock()
	await(t, fmt.Sprintf("end of the goroutine %d that called notify", id), func() bool { return !goroutineAlive(id) })
	done := make(chan error, 1)
	go func() { done <- sub.Close() }()
	if err := receive(t, done, "return of a second Close"); err != nil {
		t.Errorf("second Close: %v", err)
	}
	rec.check(t)
}

// testCloseWaitsForNotify: Close does not return while notify runs.
func testCloseWaitsForNotify(t *testing.T, e *env) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var returned atomic.Bool
	sub := e.subscribe(t, func(string, string) {
		once.Do(func() {
			close(entered)
			<-release
			returned.Store(true)
		})
	})
	a := prefix(t) + "a"
	if err := sub.Subscribe(timeout(t), a); err != nil {
		t.Fatal(err)
	}
	e.awaitNumsub(t, a, 1)
	e.publish(t, a, "block")
	receive(t, entered, "call of notify")
	closed := make(chan error, 1)
	go func() { closed <- sub.Close() }()
	// A Close that does not wait would return now; give it the time to.
	select {
	case <-closed:
		t.Error("Close returned while notify was running")
		close(release)
		return
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := receive(t, closed, "return of Close once notify returned"); err != nil {
		t.Errorf("Close: %v", err)
	}
	if !returned.Load() {
		t.Error("Close returned before notify did")
	}
}

// testSubscribeWhileNotifyBlocks: Subscribe and Unsubscribe do not wait
// for the goroutine that calls notify. dlock's notify takes a lock that the
// caller of Subscribe may hold.
func testSubscribeWhileNotifyBlocks(t *testing.T, e *env) {
	var mu sync.Mutex
	entered := make(chan struct{}, 1)
	rec := newRecorder()
	sub := e.subscribe(t, func(channel, payload string) {
		select {
		case entered <- struct{}{}:
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		rec.notify(channel, payload)
	})
	a, b, c := prefix(t)+"a", prefix(t)+"b", prefix(t)+"c"
	if err := sub.Subscribe(timeout(t), a, c); err != nil {
		t.Fatal(err)
	}
	e.awaitNumsub(t, a, 1)
	mu.Lock()
	e.publish(t, a, "blocked")
	receive(t, entered, "call of notify")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errSub, errUnsub := sub.Subscribe(ctx, b), sub.Unsubscribe(ctx, c)
	mu.Unlock()
	if errSub != nil || errUnsub != nil {
		t.Fatalf("while notify was blocked: Subscribe: %v, Unsubscribe: %v", errSub, errUnsub)
	}
	e.awaitNumsub(t, b, 1)
	e.awaitNumsub(t, c, 0)
	e.publish(t, b, "then")
	if got := rec.await(t, 2); got[1] != (message{b, "then"}) {
		t.Errorf("notify got %q", got)
	}
}

// testReconnects: the server closes the subscription's connection; the
// driver connects again, subscribes its channels again, and says so to
// notify with an empty channel and payload.
func testReconnects(t *testing.T, e *env) {
	rec := newRecorder()
	sub := e.subscribe(t, rec.notify)
	a, b := prefix(t)+"a", prefix(t)+"b"
	ctx, cancel := opening()
	err := sub.Subscribe(ctx, a, b)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Unsubscribe(timeout(t), b); err != nil {
		t.Fatal(err)
	}
	e.awaitNumsub(t, a, 1)
	e.awaitNumsub(t, b, 0)
	killed := e.subscribers(t)
	if len(killed) == 0 {
		t.Fatal("no connection of the driver is in pub/sub mode")
	}
	for _, s := range killed {
		s.srv.Do(t, "CLIENT", "KILL", "ID", s.id)
	}
	await(t, "new subscription after the connection was killed", func() bool {
		for _, s := range e.subscribers(t) {
			if slices.Contains(killed, s) {
				return false
			}
		}
		return e.numsub(t, a) == 1
	})
	if e.numsub(t, b) != 0 {
		t.Error("a channel unsubscribed before the connection loss was subscribed again")
	}
	e.publish(t, a, "after")
	// The driver says that it subscribed again, before the first notice
	// on the new connection.
	want := []message{{}, {a, "after"}}
	if got := rec.await(t, len(want)); !slices.Equal(got, want) {
		t.Errorf("notify got %q, want %q", got, want)
	}
	rec.check(t)
}
