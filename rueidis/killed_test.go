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
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c := dlock.New(dlockrueidis.New(client))
	defer c.Close()
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
