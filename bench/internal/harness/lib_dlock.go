package harness

import (
	"context"
	"errors"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	dlockredigo "github.com/dlockio/dlock/redigo"
	dlockrueidis "github.com/dlockio/dlock/rueidis"
	"github.com/redis/rueidis"
)

// dlockPoll is the constant retry interval of the dlock-poll row, the same
// as the floor's polling.
const dlockPoll = time.Millisecond

// dlock has a row per driver; they differ only in the Redis client that
// carries dlock's requests.
var (
	dlockLibrary        = dlockRow("dlock", "go-redis", "its connection pool", goredisDriver)
	dlockRueidisLibrary = dlockRow("dlock-rueidis", "rueidis", "one auto-pipelined connection, RESP3", rueidisDriver)
	dlockRedigoLibrary  = dlockRow("dlock-redigo", "redigo", "a redis.Pool as large as go-redis's", redigoDriver)
)

// dlockDefaultLibrary is dlock with a 1 ms constant retry strategy, an extra
// row to ask for with -libs: with notices the strategy only paces retries
// after errors, so it should change little.
var dlockDefaultLibrary = Library{
	Name:  "dlock-poll",
	Setup: "dlock with WithRetry(ConstantBackoff(1 ms))",
	New: func(cfg ClientConfig) (Locker, error) {
		return newDlock(cfg, dlock.ConstantBackoff(dlockPoll), goredisDriver)
	},
}

// dlockFunctionsLibrary is dlock WithFunctions: its scripts as a Redis
// Functions library, called by FCALL.
var dlockFunctionsLibrary = Library{
	Name:  "dlock-fn",
	Setup: "dlock over its go-redis driver WithFunctions (FCALL instead of EVALSHA)",
	New: func(cfg ClientConfig) (Locker, error) {
		return newDlock(cfg, dlock.DefaultRetry(), goredisDriver, dlock.WithFunctions())
	},
}

// dlockNoCounterLibrary is dlock WithFenceRetention(0): no fence counters,
// so a fresh name's acquire runs one command less and leaves one key less.
var dlockNoCounterLibrary = Library{
	Name:  "dlock-nocounter",
	Setup: "dlock over its go-redis driver WithFenceRetention(0) (no fence counters)",
	New: func(cfg ClientConfig) (Locker, error) {
		return newDlock(cfg, dlock.DefaultRetry(), goredisDriver, dlock.WithFenceRetention(0))
	},
}

// dlockRow is dlock as it comes over one of its drivers.
func dlockRow(name, client, conns string, open openDriver) Library {
	return Library{
		Name: name,
		Setup: "dlock over its " + client + " driver (" + conns + "), as it comes: Lock woken by Redis " +
			"(waiter sets and one notice per release, which grants the lock to the next waiter), requests of one client coalesced into pipelines, " +
			"WithAutoRefresh for scenario 6",
		New: func(cfg ClientConfig) (Locker, error) {
			return newDlock(cfg, dlock.DefaultRetry(), open)
		},
	}
}

// openDriver opens a counted client of one Redis library for cfg and
// returns dlock's driver over it, and the function that closes the client.
type openDriver func(cfg ClientConfig) (dlock.Driver, func() error, error)

func goredisDriver(cfg ClientConfig) (dlock.Driver, func() error, error) {
	rdb := newGoRedis(cfg)
	return goredis.New(rdb), rdb.Close, nil
}

func rueidisDriver(cfg ClientConfig) (dlock.Driver, func() error, error) {
	c, err := newRueidis(rueidis.ClientOption{InitAddress: []string{cfg.Addr}}, cfg.Counters)
	if err != nil {
		return nil, nil, err
	}
	return dlockrueidis.New(c), func() error { c.Close(); return nil }, nil
}

func redigoDriver(cfg ClientConfig) (dlock.Driver, func() error, error) {
	pool := newRedigo(cfg)
	return dlockredigo.New(pool), pool.Close, nil
}

type dlockLocker struct {
	c           *dlock.Client
	closeClient func() error
	tryOpts     []dlock.Option
	waitOpts    []dlock.Option
}

func newDlock(cfg ClientConfig, retry dlock.RetryStrategy, open openDriver, opts ...dlock.ClientOption) (Locker, error) {
	drv, closeClient, err := open(cfg)
	if err != nil {
		return nil, err
	}
	return &dlockLocker{
		c:           dlock.New(drv, opts...),
		closeClient: closeClient,
		tryOpts:     []dlock.Option{dlock.WithTTL(cfg.TTL)},
		waitOpts:    []dlock.Option{dlock.WithTTL(cfg.TTL), dlock.WithRetry(retry)},
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

// Close stops the dlock client, then closes the Redis client under it
// (dlock never closes it).
func (d *dlockLocker) Close() error {
	_ = d.c.Close()
	return d.closeClient()
}
