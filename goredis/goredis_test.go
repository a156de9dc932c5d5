package goredis_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/dlocktest"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.VerifyNoLeaks(m) }

// TestConformance runs the driver conformance suite over a go-redis client
// of each kind: a single node, a cluster, and a failover client that finds
// the primary through the sentinels.
func TestConformance(t *testing.T) {
	dlocktest.Run(t, newDriver, dlocktest.Standalone, dlocktest.Cluster, dlocktest.Sentinel)
}

func newDriver(t testing.TB, d dlocktest.Deployment) dlock.Driver {
	var rdb redis.UniversalClient
	switch d.Topology {
	case dlocktest.Cluster:
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: d.Addrs})
	case dlocktest.Sentinel:
		rdb = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: d.MasterName, SentinelAddrs: d.Addrs})
	default:
		rdb = redis.NewClient(&redis.Options{Addr: d.Addrs[0]})
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return goredis.New(rdb)
}

// TestRingRefusesLocksAcrossShards: a Ring sends a script to its first
// key's shard, so a lock on names of several hash tags is refused rather
// than taken where another client would not see it; locks whose names
// share a tag, and one-name locks, work.
func TestRingRefusesLocksAcrossShards(t *testing.T) {
	srvs := redistest.StartMasters(t, 2)
	rdb := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srvs[0].Addr(), "b": srvs[1].Addr()}})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()

	if _, err := c.TryLockMulti(ctx, []string{"orders", "invoices"}); !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("names of two tags: err = %v, want ErrUnsupported", err)
	}
	for _, srv := range srvs {
		if keys := srv.Do(t, "KEYS", "*"); keys != "" {
			t.Errorf("a refused lock left keys on %s: %q", srv.Addr(), keys)
		}
	}
	for _, names := range [][]string{{"orders"}, {"{order:42}:pay", "{order:42}:ship"}} {
		l, err := c.TryLockMulti(ctx, names)
		if err != nil {
			t.Fatalf("%q: %v", names, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("%q: Release: %v", names, err)
		}
	}
}
