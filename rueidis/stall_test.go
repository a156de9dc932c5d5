package dlockrueidis_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
	dlockrueidis "github.com/dlockio/dlock/rueidis"
	"github.com/redis/rueidis"
)

// TestACancelledCallerLeavesAStalledServer: a caller that sends a pipeline
// of queued requests for the others, and is cancelled while the server is
// stopped, returns once everyone in it has left (after the clean-up of its
// attempt, within its own bound), not when the server answers: rueidis
// ends a request at its context's cancellation, and dlock cancels the
// pipeline then.
func TestACancelledCallerLeavesAStalledServer(t *testing.T) {
	srv := redistest.Start(t)
	c := newSingleClient(t, srv, dlock.WithPipelines(1))
	ctx := context.Background()
	l, err := c.TryLock(ctx, "warm") // a connection to the server
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Pause(t)
	defer srv.Resume(t)
	soon, cancelSoon := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelSoon()
	first := make(chan error, 1)
	go func() {
		_, err := c.TryLock(soon, "first") // the one pipeline slot, until its deadline
		first <- err
	}()
	time.Sleep(50 * time.Millisecond) // the first call goes out before the second queues
	patient, cancel := context.WithCancel(ctx)
	defer cancel()
	second := make(chan error, 1)
	go func() {
		_, err := c.TryLock(patient, "second")
		second <- err
	}()
	if err := <-first; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first: %v, want context.DeadlineExceeded", err)
	}
	// The second has sent its request, when the first left its slot.
	cancel()
	select {
	case err := <-second:
		// Canceled; or, where rueidis's health check of the connection
		// failed its request first, that failure.
		if err == nil {
			t.Error("the cancelled caller obtained a lock on the stopped server")
		}
	case <-time.After(8 * time.Second): // its clean-up's 2s, and rueidis's 5s dial at worst
		t.Error("the cancelled caller waited on for the stopped server")
		srv.Resume(t)
		<-second
	}
}

// TestACallWaitsForAnotherCallersDialAtMostTheDialTimeout: after the server
// closed the client's connection and stalled, the caller whose request
// makes the new connection waits for its handshake, which heeds rueidis's
// dial timeout (ClientOption.Dialer.Timeout) rather than the other callers'
// contexts: a second caller whose request goes on that connection waits
// for the handshake too, past its own deadline, then for its clean-up's 2s
// (see the README's Drivers). With the default dial timeout, 5s, such a
// TryLock with a 100ms context returned 6.8s after it began, where the
// README promised 2s past the context.
func TestACallWaitsForAnotherCallersDialAtMostTheDialTimeout(t *testing.T) {
	const dialTimeout = time.Second
	srv, c := stalledAfterItsConnectionClosed(t, dialTimeout)
	defer srv.Resume(t)
	ctx := context.Background()
	long, cancelLong := context.WithTimeout(ctx, 20*time.Second)
	defer cancelLong()
	first := make(chan error, 1)
	go func() {
		_, err := c.TryLock(long, "n") // dials; the handshake waits for the stalled server
		first <- err
	}()
	time.Sleep(200 * time.Millisecond)
	const wait = 100 * time.Millisecond
	short, cancelShort := context.WithTimeout(ctx, wait)
	defer cancelShort()
	start := time.Now()
	_, err := c.TryLock(short, "n")
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second TryLock: %v, want context.DeadlineExceeded", err)
	}
	if bound := wait + dialTimeout + 2*time.Second + 500*time.Millisecond; took > bound {
		t.Errorf("second TryLock returned after %v, beyond its context, the dial timeout and the clean-up's 2s (%v)", took, bound)
	}
	srv.Resume(t)
	<-first
}

// TestADialTimeoutIsNotAnUnconfirmedWrite: a call WithReplicas whose
// connection's handshake times out (the server stalled after it closed
// the client's connection) reports that failure, which rueidis words as
// context.DeadlineExceeded, and not ErrNotReplicated's "no reply within
// the WAIT timeout": nothing was sent, and that timeout is far off. A lone
// call took any failure matching context.DeadlineExceeded before its own
// WAIT deadline for that deadline's.
func TestADialTimeoutIsNotAnUnconfirmedWrite(t *testing.T) {
	const dialTimeout = 300 * time.Millisecond
	srv, c := stalledAfterItsConnectionClosed(t, dialTimeout)
	defer srv.Resume(t)
	ctx := context.Background()
	const timeout = 10 * time.Second
	start := time.Now()
	_, err := c.TryLock(ctx, "n", dlock.WithReplicas(1, timeout))
	took := time.Since(start)
	if err == nil {
		t.Fatal("obtained a lock on a stopped server")
	}
	if took >= timeout {
		t.Fatalf("returned after %v, not before the WAIT timeout: the test shows nothing", took)
	}
	if errors.Is(err, dlock.ErrNotReplicated) {
		t.Errorf("after %v, before the %v WAIT timeout: %v, want the dial's failure, not ErrNotReplicated", took.Round(time.Millisecond), timeout, err)
	}
}

// stalledAfterItsConnectionClosed starts a server and a client over
// rueidis with the given dial timeout that has connected to it (a lock
// taken and released), then closes the client's connection and stops the
// server: the client's next request dials, and its handshake waits.
func stalledAfterItsConnectionClosed(t *testing.T, dialTimeout time.Duration) (*redistest.Server, *dlock.Client) {
	srv := redistest.Start(t)
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{srv.Addr()},
		Dialer:      net.Dialer{Timeout: dialTimeout},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	c := dlock.New(dlockrueidis.New(client))
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	l, err := c.TryLock(ctx, "n") // a connection to the server
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Do(t, "CLIENT", "KILL", "TYPE", "normal")
	time.Sleep(100 * time.Millisecond) // rueidis reads the EOF
	srv.Pause(t)
	return srv, c
}
