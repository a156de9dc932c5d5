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
// Lock waits without polling: the script that frees a lock publishes a
// notice to one waiting client, whose first waiting caller then tries
// again, so a release costs one attempt, however many wait. Callers of one
// client queue in arrival order. A waiter also wakes when the holder's lock
// is due to expire and at least twice a second, so a lost notice or a dead
// holder delays it briefly, never for good. A RetryStrategy (WithRetry)
// decides how many attempts are made and the backoff after Redis errors:
// NoRetry, ConstantBackoff, LinearBackoff, ExponentialBackoff, Intervals,
// LimitRetry, RetryFunc, each optionally wrapped in Jitter. Strategies are
// stateless and may be shared. Lock gives up when the strategy stops or ctx
// ends; without a deadline on ctx it waits at most DefaultMaxWait (see
// WithMaxWait).
//
// Requests that many goroutines make at once through one client are sent
// together in pipelines (see WithPipelines); a lone request goes at once.
//
// # Leases
//
// A held lock is a lease. WithAutoRefresh has the client's watchdog (one
// goroutine for all its locks, refreshing in pipelined batches) keep it
// alive until released. Done closes the moment the lock is known lost, or
// its local Deadline passes without a refresh, and Err says why (ErrLost);
// Context returns a context cancelled then. Do runs a function under a
// lock that is refreshed, with such a context, and releases it after.
// WithMaxHold caps how long refreshing may keep a lock.
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
// holder whose lock has expired and passed to another. SetFenced does that
// for a value kept in Redis.
//
// # Inspection
//
// Inspect reports who holds a name, List walks all names with SCAN, and
// ForceRelease frees a name whoever holds it.
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
