package goredis_test

import (
	"testing"

	"github.com/dlockio/dlock/dlocktest"
)

// TestShardedSubscriptionResilience: shard subscriptions over a go-redis
// cluster client follow failovers and slot moves, on a connection per
// primary.
func TestShardedSubscriptionResilience(t *testing.T) {
	dlocktest.RunShardedResilience(t, newDriver)
}
