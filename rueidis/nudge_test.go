package dlockrueidis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
	dlockrueidis "github.com/dlockio/dlock/rueidis"
	"github.com/redis/rueidis"
)

// TestANewPrimaryIsFoundWithSendToReplicas: a cluster client that sends
// read-only commands to replicas (SendToReplicas: cmd.IsReadOnly()) is
// made to read the cluster's topology again when a slot's primary is one
// it has no connection to (see unconnected), here a replica of a lock's
// primary that was marked failed (paused) when the client read the
// topology, and took over since in a manual failover. The request that
// makes it read it, an EXISTS of a key of the slot, was flagged read-only,
// so such a client sent it to the slot's other replica, known to it, which
// answered (it copies the new primary): nothing was read again, and List
// failed for good ("no connection"), as a shard subscription on the slot
// waited for good for its new primary. It now goes to the slot's primary as
// the client knows it, whose MOVED makes the client connect to the new one.
func TestANewPrimaryIsFoundWithSendToReplicas(t *testing.T) {
	c := redistest.StartCluster(t, 3, 2)
	const name = "nudge"
	locks := dlock.New(dlockrueidis.New(newClusterClient(t, c, nil)))
	defer locks.Close()
	old := c.PrimaryOf(t, locks.RedisKey(name))
	replicas := c.ReplicasOf(t, old)
	if len(replicas) != 2 {
		t.Fatalf("%s has %d replicas, want 2", old.Addr(), len(replicas))
	}
	next := replicas[0]
	resume := next.PauseAWhile(t)
	awaitFailFlag(t, c, next, true)
	client := newClusterClient(t, c, func(cmd rueidis.Completed) bool { return cmd.IsReadOnly() }, old.Addr())
	resume()
	if hasNode(client, next.Addr()) {
		t.Fatalf("the client knows %s, marked failed when it read the topology", next.Addr())
	}
	awaitFailFlag(t, c, next, false)
	c.AwaitReplica(t, next, old, 20*time.Second)
	locks = dlock.New(dlockrueidis.New(client))
	defer locks.Close()
	ctx := context.Background()
	if _, err := locks.TryLock(ctx, name, dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}

	next.Do(t, "CLUSTER", "FAILOVER")
	if p := c.AwaitFailover(t, locks.RedisKey(name), old, 20*time.Second); p != next {
		t.Fatalf("%s took over, want %s", p.Addr(), next.Addr())
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		infos, err := locks.List(ctx, "")
		if err == nil {
			if len(infos) != 1 || infos[0].Name != name {
				t.Errorf("List = %v, want the lock %q", infos, name)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("List 10s after the failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newClusterClient returns a client of cluster c, with sendToReplicas, on
// the seed addrs (c's first node if none), closed when the test ends.
func newClusterClient(t *testing.T, c *redistest.Cluster, sendToReplicas func(rueidis.Completed) bool, addrs ...string) rueidis.Client {
	t.Helper()
	if len(addrs) == 0 {
		addrs = c.Addrs()[:1]
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, SendToReplicas: sendToReplicas})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return client
}

// awaitFailFlag waits, at most 20s, until every node of c but n marks n
// failed (the flag fail, not fail?), or until none does.
func awaitFailFlag(t *testing.T, c *redistest.Cluster, n *redistest.Server, failed bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !failFlagged(t, c, n, failed) {
		if time.Now().After(deadline) {
			t.Fatalf("%s not marked failed=%v by every other node within 20s", n.Addr(), failed)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// failFlagged reports whether every node of c but n has n's fail flag as
// failed says.
func failFlagged(t *testing.T, c *redistest.Cluster, n *redistest.Server, failed bool) bool {
	for _, o := range c.Nodes {
		if o == n {
			continue
		}
		flagged := false
		for _, line := range strings.Split(o.Do(t, "CLUSTER", "NODES"), "\n") {
			if f := strings.Fields(line); len(f) > 2 && strings.HasPrefix(f[1], n.Addr()+"@") {
				flagged = strings.Contains(f[2], "fail") && !strings.Contains(f[2], "fail?")
			}
		}
		if flagged != failed {
			return false
		}
	}
	return true
}
