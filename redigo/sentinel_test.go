package redigo_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/dlocktest"
	dlockredigo "github.com/dlockio/dlock/redigo"
	"github.com/gomodule/redigo/redis"
)

// TestLocksThroughASentinelFailover runs dlocktest's Sentinel failovers
// (auto-refreshed locks and waiters, a killed primary and SENTINEL
// FAILOVER, with and without WithReplicas) over a pool whose Dial asks
// the sentinels for the primary's address, as the README says to do for
// Sentinel: redigo knows no Sentinel itself. Sentinel closes the clients
// of an old primary it turns into a replica, and the driver dials again,
// through the pool's Dial, what it finds closed.
func TestLocksThroughASentinelFailover(t *testing.T) {
	dlocktest.RunSentinelFailover(t, func(t testing.TB, d dlocktest.Deployment) dlock.Driver {
		pool := &redis.Pool{DialContext: func(ctx context.Context) (redis.Conn, error) {
			addr, err := askSentinels(ctx, d.Addrs, d.MasterName)
			if err != nil {
				return nil, err
			}
			return redis.DialContext(ctx, "tcp", addr, redis.DialReadTimeout(5*time.Second), redis.DialWriteTimeout(5*time.Second))
		}, MaxIdle: 4}
		t.Cleanup(func() { _ = pool.Close() })
		return dlockredigo.New(pool)
	})
}

// askSentinels returns the primary's address that the first sentinel of
// addrs to answer names for master.
func askSentinels(ctx context.Context, addrs []string, master string) (string, error) {
	var errs []error
	for _, a := range addrs {
		c, err := redis.DialContext(ctx, "tcp", a, redis.DialReadTimeout(time.Second), redis.DialWriteTimeout(time.Second))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		hp, err := redis.Strings(redis.DoContext(c, ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", master))
		_ = c.Close()
		if err == nil && len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1]), nil
		}
		errs = append(errs, errors.New("sentinel "+a+" names no primary"))
	}
	return "", errors.Join(errs...)
}
