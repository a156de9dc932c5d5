// Package dlock provides distributed locks on Redis for Go.
//
// A Client obtains locks through a Driver; package
// github.com/dlockio/dlock/goredis adapts a go-redis v9 client:
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	locks := dlock.New(goredis.New(rdb))
//
// # Exclusive locks
//
// TryLock obtains a lock if it is free and returns ErrNotObtained at once if
// it is not; Lock waits for it. Either costs one round trip per attempt, and
// Release one more:
//
//	l, err := locks.TryLock(ctx, "orders:42", dlock.WithTTL(10*time.Second))
//	if errors.Is(err, dlock.ErrNotObtained) {
//		return // someone else is on it
//	} else if err != nil {
//		return err
//	}
//	defer l.Release(ctx)
//
// A lock lives for its TTL unless refreshed: Refresh extends it while it is
// still held and returns ErrNotHeld once it was lost. Each acquisition gets
// its own random 128-bit token, and only the holder of the token can
// refresh or release the lock. Attach hands a lock over to another process
// that knows its name and token.
//
// # Waiting
//
// Lock retries according to a RetryStrategy (WithRetry): NoRetry,
// ConstantBackoff, LinearBackoff, ExponentialBackoff, Intervals, LimitRetry,
// RetryFunc, each optionally wrapped in Jitter. It wakes early when the
// holder's lock is due to expire. Strategies are stateless and may be shared.
// Lock gives up when the strategy stops or ctx ends; without a deadline on
// ctx it waits at most DefaultMaxWait (see WithMaxWait).
//
// # Several names at once
//
// TryLockMulti and LockMulti obtain a lock on several names all or nothing,
// in one atomic script; Release, Refresh and TTL then act on all of them.
//
// # Fencing
//
// Every acquisition of a name gets a fencing token (Lock.Fence) larger than
// any given for that name before, so a resource can refuse writes from a
// holder whose lock has expired and passed to another.
//
// # Re-entrant owners
//
// WithOwner makes a lock re-entrant for an explicit owner id: the owner may
// obtain it again while holding it, and it is freed after as many releases.
//
// # Keys
//
// Every key dlock writes starts with a prefix (DefaultPrefix, "dlock:", or
// WithPrefix), and all keys of one lock share the name's Redis Cluster hash
// tag (see Client.RedisKey). A name whose key already holds data dlock did
// not write is refused with ErrWrongType and left untouched.
//
// # Errors
//
// Errors match the package's sentinels with errors.Is: ErrNotObtained,
// ErrNotHeld, ErrWrongType, and for bad arguments ErrInvalidArgument and its
// more specific children (ErrEmptyKey, ErrInvalidTTL, …), which are returned
// before anything is sent to Redis. Failures of Redis itself come as a
// *ServerError. No input makes dlock panic, except calling methods on a nil
// *Lock.
package dlock
