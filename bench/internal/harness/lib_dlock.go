package harness

import (
	"context"
	"errors"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/redis/go-redis/v9"
)

// dlockPoll is the constant retry interval dlock waits with here, the same
// as the floor's polling; dlock's own default backs off exponentially from
// 1 ms to 100 ms.
const dlockPoll = time.Millisecond

var dlockLibrary = Library{
	Name:  "dlock",
	Setup: "dlock over its go-redis driver; Lock waits with ConstantBackoff(1 ms); no auto-refresh yet",
	New: func(cfg ClientConfig) (Locker, error) {
		return newDlock(cfg, dlock.ConstantBackoff(dlockPoll))
	},
}

// dlockDefaultLibrary is dlock with its default retry strategy, an extra
// row to ask for with -libs.
var dlockDefaultLibrary = Library{
	Name:  "dlock-default",
	Setup: "dlock with its default retry: exponential from 1 ms to 100 ms, 50 % jitter",
	New: func(cfg ClientConfig) (Locker, error) {
		return newDlock(cfg, dlock.DefaultRetry)
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
	l, err := d.c.TryLock(ctx, key, d.tryOpts...)
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

// TryLockAutoRefresh is not offered by dlock yet. Once dlock has
// WithAutoRefresh, this becomes
//
//	d.c.TryLock(ctx, key, append(d.tryOpts, dlock.WithAutoRefresh())...)
func (d *dlockLocker) TryLockAutoRefresh(ctx context.Context, key string) (Held, error) {
	return nil, ErrUnsupported
}

func (d *dlockLocker) Close() error { return d.rdb.Close() }
