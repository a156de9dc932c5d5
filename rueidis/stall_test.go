package dlockrueidis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
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
