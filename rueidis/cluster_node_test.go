package dlockrueidis_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
	dlockrueidis "github.com/dlockio/dlock/rueidis"
	"github.com/redis/rueidis"
)

// TestAClientOnAClusterNodeIsUnsupported: a rueidis client that is not a
// cluster client (ForceSingleClient) given a Redis Cluster node's address
// gets ErrUnsupported for a name another node serves, at once, where it
// waited out its max wait on MOVED.
func TestAClientOnAClusterNodeIsUnsupported(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	node := cluster.Nodes[0]
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{node.Addr()}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	var logged redistest.Buffer
	c := dlock.New(dlockrueidis.New(client), dlock.WithLogger(slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	defer c.Close()
	name := ""
	for i := 0; name == ""; i++ {
		if n := "elsewhere" + strconv.Itoa(i); cluster.PrimaryOf(t, c.RedisKey(n)) != node {
			name = n
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.TryLock(ctx, name); !errors.Is(err, dlock.ErrUnsupported) {
		t.Errorf("TryLock: %v, want ErrUnsupported", err)
	}
	if _, err := c.Lock(ctx, name); !errors.Is(err, dlock.ErrUnsupported) || ctx.Err() != nil {
		t.Errorf("Lock: %v (its context: %v), want ErrUnsupported at once", err, ctx.Err())
	}
	// The node ran nothing: no clean-up goes, and no warning says that a
	// lock may stay held until its TTL.
	if err := c.Close(); err != nil {
		t.Error(err)
	}
	if s := logged.String(); s != "" {
		t.Errorf("logged:\n%s", s)
	}
}
