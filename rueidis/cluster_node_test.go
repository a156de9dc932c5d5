package dlockrueidis_test

import (
	"context"
	"errors"
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
	c := dlock.New(dlockrueidis.New(client))
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
}
