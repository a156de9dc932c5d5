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
