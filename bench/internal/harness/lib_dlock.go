package harness

import (
	"context"
	"errors"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/redis/go-redis/v9"
)

// dlockPoll is the constant retry interval of the dlock-poll row, the same
// as the floor's polling.
const dlockPoll = time.Millisecond

var dlockLibrary = Library{
	Name:  "dlock",
	Setup: "dlock over its go-redis driver, as it comes: Lock woken by Redis (waiter sets and one notice per release), requests of one client coalesced into pipelines, WithAutoRefresh for scenario 6",
	New: func(cfg ClientConfig) (Locker, error) {
		return newDlock(cfg, dlock.DefaultRetry())
	},
}

// dlockDefaultLibrary is dlock with a 1 ms constant retry strategy, an extra
// row to ask for with -libs: with notices the strategy only paces retries
// after errors, so it should change little.
var dlockDefaultLibrary = Library{
	Name:  "dlock-poll",
	Setup: "dlock with WithRetry(ConstantBackoff(1 ms))",
	New: func(cfg ClientConfig) (Locker, error) {
		return newDlock(cfg, dlock.ConstantBackoff(dlockPoll))
	},
}

type dlockLocker struct {
	rdb      *redis.Client
	c        *dlock.Client
	tryOpts  []dlock.Option
	waitOpts []dlock.Option
}

func newDlock(cfg ClientConfig, retry dlock.RetryStrategy) (Locker, error) {
	rdb := newGoRedis(cfg)
	return &dlockLocker{
		rdb:      rdb,
		c:        dlock.New(goredis.New(rdb)),
		tryOpts:  []dlock.Option{dlock.WithTTL(cfg.TTL)},
		waitOpts: []dlock.Option{dlock.WithTTL(cfg.TTL), dlock.WithRetry(retry)},
	}, nil
}

func (d *dlockLocker) TryLock(ctx context.Context, key string) (Held, error) {
	return d.tryLock(ctx, key, d.tryOpts)
}

func (d *dlockLocker) tryLock(ctx context.Context, key string, opts []dlock.Option) (Held, error) {
	l, err := d.c.TryLock(ctx, key, opts...)
	if errors.Is(err, dlock.ErrNotObtained) {
		return nil, ErrBusy
	}
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (d *dlockLocker) Lock(ctx context.Context, key string) (Held, error) {
	l, err := d.c.Lock(ctx, key, d.waitOpts...)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// TryLockAutoRefresh takes a lock that the client's watchdog refreshes
// every third of its TTL, batched with the client's other locks.
func (d *dlockLocker) TryLockAutoRefresh(ctx context.Context, key string) (Held, error) {
	return d.tryLock(ctx, key, append(d.tryOpts[:len(d.tryOpts):len(d.tryOpts)], dlock.WithAutoRefresh()))
}

func (d *dlockLocker) Close() error {
	_ = d.c.Close()
	return d.rdb.Close()
}
