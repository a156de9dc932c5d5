package harness

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Locker is one lock library seen through the few operations the scenarios
// use. One Locker is one client: it owns its connections, and is safe for
// concurrent use.
type Locker interface {
	// TryLock makes one attempt and returns ErrBusy at once if the lock is
	// held by another.
	TryLock(ctx context.Context, key string) (Held, error)
	// Lock waits until it obtains the lock, the library gives up, or ctx
	// ends.
	Lock(ctx context.Context, key string) (Held, error)
	// TryLockAutoRefresh is TryLock for a lock that the library keeps alive
	// by itself until it is released. It returns ErrUnsupported when the
	// library cannot do that.
	TryLockAutoRefresh(ctx context.Context, key string) (Held, error)
	// Close closes the client's connections.
	Close() error
}

// Held is a lock a Locker obtained.
type Held interface {
	Release(ctx context.Context) error
}

var (
	// ErrBusy is what TryLock returns when the lock is held by another.
	ErrBusy = errors.New("lock is held by another")
	// ErrUnsupported is what a Locker returns for an operation its library
	// does not offer.
	ErrUnsupported = errors.New("not supported by this library")
)

// ClientConfig is what every library's constructor gets.
type ClientConfig struct {
	Addr string
	// TTL is the lock's time to live (rueidislock: its key validity).
	// The floor and rueidislock refresh every TTL/2, dlock every TTL/3
	// (its default).
	TTL time.Duration
	// PoolSize is the connection pool size of go-redis clients.
	PoolSize int
	// Counters counts the requests the client sends; never nil.
	Counters *Counters
}

// Library is one lock library under test.
type Library struct {
	Name string
	// Setup says in a few words how the library is configured here.
	Setup string
	New   func(cfg ClientConfig) (Locker, error)
}

// Libraries returns the libraries a run compares by default: floor first,
// then dlock over each of its drivers, then its peers.
func Libraries() []Library {
	return []Library{
		floorLibrary, dlockLibrary, dlockRueidisLibrary, dlockRedigoLibrary,
		redislockLibrary, redsyncLibrary, rueidislockLibrary,
	}
}

// Variants returns extra configurations that a run includes only when asked
// for by name.
func Variants() []Library {
	return []Library{dlockDefaultLibrary, dlockFunctionsLibrary, dlockNoCounterLibrary}
}

// Counters counts requests on the client side: Commands is every command
// sent at the top level (an EVALSHA is one, whatever its script does), and
// RoundTrips every exchange a caller waits for (a pipeline is one).
type Counters struct {
	Commands   atomic.Int64
	RoundTrips atomic.Int64
}

// Reset zeroes the counters.
func (c *Counters) Reset() {
	c.Commands.Store(0)
	c.RoundTrips.Store(0)
}

// countHook is a go-redis hook that feeds Counters.
type countHook struct{ c *Counters }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.c.Commands.Add(1)
		h.c.RoundTrips.Add(1)
		return next(ctx, cmd)
	}
}

func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.c.Commands.Add(int64(len(cmds)))
		h.c.RoundTrips.Add(1)
		return next(ctx, cmds)
	}
}

// newGoRedis returns the go-redis client that every go-redis based library
// gets: same pool size, no client-name handshake, counted.
func newGoRedis(cfg ClientConfig) *redis.Client {
	rdb := redis.NewClient(&redis.Options{
		Addr:            cfg.Addr,
		PoolSize:        cfg.PoolSize,
		DisableIdentity: true,
	})
	rdb.AddHook(countHook{cfg.Counters})
	return rdb
}

// sleepCtx waits d on t (stopped, or fired and drained) or until ctx ends.
// With Go ≥ 1.23 timer semantics a stopped timer holds no stale tick.
func sleepCtx(ctx context.Context, t *time.Timer, d time.Duration) error {
	t.Reset(d)
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}
