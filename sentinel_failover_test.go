package dlock_test

import (
	"testing"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/dlocktest"
	"github.com/dlockio/dlock/goredis"
	"github.com/redis/go-redis/v9"
)

// TestLocksThroughASentinelFailover runs dlocktest's Sentinel failovers
// (auto-refreshed locks and waiters, a killed primary and SENTINEL
// FAILOVER, with and without WithReplicas) over go-redis's failover
// client, with a pool of 3 connections, whose share (see dlock.Pooled)
// holds some of the watchdog's refresh pipelines back.
func TestLocksThroughASentinelFailover(t *testing.T) {
	dlocktest.RunSentinelFailover(t, func(t testing.TB, d dlocktest.Deployment) dlock.Driver {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: d.MasterName, SentinelAddrs: d.Addrs, PoolSize: 3})
		t.Cleanup(func() { _ = rdb.Close() })
		return goredis.New(rdb)
	})
}
