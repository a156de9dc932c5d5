package harness

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

var redsyncLibrary = Library{
	Name:  "redsync",
	Setup: "go-redsync/redsync v4, one go-redis v9 pool; Lock retries every 1 ms without limit; no auto-refresh",
	New:   newRedsync,
}

type redsyncLocker struct {
	rdb      *redis.Client
	rs       *redsync.Redsync
	tryOpts  []redsync.Option
	waitOpts []redsync.Option
}

func newRedsync(cfg ClientConfig) (Locker, error) {
	rdb := newGoRedis(cfg)
	return &redsyncLocker{
		rdb:     rdb,
		rs:      redsync.New(goredis.NewPool(rdb)),
		tryOpts: []redsync.Option{redsync.WithExpiry(cfg.TTL), redsync.WithTries(1)},
		waitOpts: []redsync.Option{
			redsync.WithExpiry(cfg.TTL),
			redsync.WithTries(math.MaxInt32),
			redsync.WithRetryDelay(time.Millisecond),
		},
	}, nil
}

type redsyncHeld struct{ m *redsync.Mutex }

func (h redsyncHeld) Release(ctx context.Context) error {
	ok, err := h.m.UnlockContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errNotHeld
	}
	return nil
}

func (r *redsyncLocker) TryLock(ctx context.Context, key string) (Held, error) {
	m := r.rs.NewMutex(key, r.tryOpts...)
	if err := m.TryLockContext(ctx); err != nil {
		var taken *redsync.ErrTaken
		if errors.As(err, &taken) || errors.Is(err, redsync.ErrFailed) {
			return nil, ErrBusy
		}
		return nil, err
	}
	return redsyncHeld{m}, nil
}

func (r *redsyncLocker) Lock(ctx context.Context, key string) (Held, error) {
	m := r.rs.NewMutex(key, r.waitOpts...)
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return redsyncHeld{m}, nil
}

func (r *redsyncLocker) TryLockAutoRefresh(context.Context, string) (Held, error) {
	return nil, ErrUnsupported
}

func (r *redsyncLocker) Close() error { return r.rdb.Close() }
