package harness

import (
	"context"
	"errors"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
)

var redislockLibrary = Library{
	Name:  "redislock",
	Setup: "bsm/redislock over go-redis; Lock waits with LinearBackoff(1 ms), a constant 1 ms interval; no auto-refresh",
	New:   newRedislock,
}

type redislockLocker struct {
	rdb  *redis.Client
	c    *redislock.Client
	ttl  time.Duration
	wait *redislock.Options
}

func newRedislock(cfg ClientConfig) (Locker, error) {
	rdb := newGoRedis(cfg)
	return &redislockLocker{
		rdb:  rdb,
		c:    redislock.New(rdb),
		ttl:  cfg.TTL,
		wait: &redislock.Options{RetryStrategy: redislock.LinearBackoff(time.Millisecond)},
	}, nil
}

func (r *redislockLocker) TryLock(ctx context.Context, key string) (Held, error) {
	l, err := r.c.Obtain(ctx, key, r.ttl, nil)
	if errors.Is(err, redislock.ErrNotObtained) {
		return nil, ErrBusy
	}
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Lock waits; without a deadline on ctx, redislock itself gives up after
// one TTL.
func (r *redislockLocker) Lock(ctx context.Context, key string) (Held, error) {
	l, err := r.c.Obtain(ctx, key, r.ttl, r.wait)
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (r *redislockLocker) TryLockAutoRefresh(context.Context, string) (Held, error) {
	return nil, ErrUnsupported
}

func (r *redislockLocker) Close() error { return r.rdb.Close() }
