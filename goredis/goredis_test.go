package goredis_test

import (
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
