package dlockrueidis_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
	dlockrueidis "github.com/dlockio/dlock/rueidis"
	"github.com/redis/rueidis"
)

// TestRequestsAfterKilledConnections: rueidis learns that the server
// closed its connections only from the requests it sends there; the driver
// sends those again, so a Release, and the next acquire, on connections
// CLIENT KILL closed succeed.
func TestRequestsAfterKilledConnections(t *testing.T) {
	srv := redistest.Start(t)
	c := newSingleClient(t, srv)
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		l, err := c.TryLock(ctx, "killed", dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatalf("round %d: TryLock after the connections were killed: %v", i, err)
		}
		srv.Do(t, "CLIENT", "KILL", "TYPE", "normal")
		if err := l.Release(ctx); err != nil {
			t.Fatalf("round %d: Release after the connections were killed: %v", i, err)
		}
		srv.Do(t, "CLIENT", "KILL", "TYPE", "normal")
	}
}

// newSingleClient returns a dlock client with opts over a rueidis client
// of srv alone, both closed with the test.
func newSingleClient(t *testing.T, srv *redistest.Server, opts ...dlock.ClientOption) *dlock.Client {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	c := dlock.New(dlockrueidis.New(client), opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestCloseDoesNotWaitForAConnectionBeingMade: a subscription whose
// connection the server closed connects again; Close, called while the new
// connection's handshake waits for a server that does not answer, returns
// at once. It waited for rueidis's dial timeout (5s by default), which its
// handshake heeds rather than any context.
func TestCloseDoesNotWaitForAConnectionBeingMade(t *testing.T) {
	srv := redistest.Start(t)
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sub, err := dlockrueidis.New(client).Subscribe(ctx, func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Subscribe(ctx, "news"); err != nil {
		t.Fatal(err)
	}
	srv.Do(t, "CLIENT", "KILL", "TYPE", "pubsub")
	srv.Pause(t)
	defer srv.Resume(t)
	// Time for the subscription to see its connection closed and start
	// another (after 10ms); Close returns at once whether or not it has.
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := sub.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Close took %v, waiting for a connection to a server that does not answer", took)
	}
}
