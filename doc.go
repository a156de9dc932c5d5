// Package dlock provides distributed locks on Redis for Go.
//
// A Client obtains locks through a Driver; package
// github.com/dlockio/dlock/goredis adapts a go-redis v9 client:
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	locks := dlock.New(goredis.New(rdb))
//	defer locks.Close()
//
// (ContextTimeoutEnabled makes a request end with its context, so that a
// server that hangs cannot hold up refreshes and clean-ups.)
//
// # Exclusive locks
//
// TryLock obtains a lock if it is free and returns ErrNotObtained at once if
// it is not; Lock waits for it. Either costs one round trip per attempt, and
// Release one more:
//
//	l, err := locks.TryLock(ctx, "orders:42", dlock.WithTTL(10*time.Second))
//	if errors.Is(err, dlock.ErrNotObtained) {
//		return nil // someone else is on it
//	} else if err != nil {
//		return err
//	}
//	work() // within the TTL; for longer work see Do and WithAutoRefresh
//	       // (Do waits for a held lock, then runs too; TryDo skips)
//	return l.Release(ctx) // ErrNotHeld: the lock ran out during the work
//
// A lock lives for its TTL unless refreshed: Refresh extends it while it is
// still held and returns ErrNotHeld once it was lost. Each acquisition gets
// its own random 128-bit token, and only the holder of the token can
// refresh or release the lock (or, for a lock obtained WithOwner, whoever
// knows the owner id: see Attach). Attach hands a lock over to another
// process that knows its name and token.
//
// # Waiting
//
// Lock waits without polling: the script that frees a lock publishes a
// notice to one waiting client, whose first waiting caller then tries
// again, so a release costs one attempt, however many wait. Callers of one
// client queue in arrival order (the first attempt of an owner's or a
// token's caller excepted: it may re-enter a hold the others wait for). A Lock on one name (without WithReplicas)
// leaves its request with its attempt, and the release grants it the lock
// at once: the notice then says it is held, and its deadline counts from
// before that attempt, moved on by the time the grant came after it. A waiter also wakes when the holder's lock
// is due to expire and at least twice a second, so a lost notice or a dead
// holder delays it briefly, never for good. The RLock and Lock of an
// RWMutex and the Acquire of a Semaphore wait alike; a change that may let
// several in (a read/write lock left free) wakes every waiting client, a
// freed permit the next one. A RetryStrategy (WithRetry)
// decides how many attempts are made and the backoff after Redis errors:
// NoRetry, ConstantBackoff, LinearBackoff, ExponentialBackoff, Intervals,
// LimitRetry, RetryFunc, each optionally wrapped in Jitter. Strategies are
// stateless and may be shared. Lock gives up when the strategy stops, ctx
// ends or WithMaxWait's bound passes; without either bound it waits at most
// DefaultMaxWait.
//
// Requests that many goroutines make at once through one client are sent
// together in pipelines (see WithPipelines); a lone request goes at once.
//
// # Leases
//
// A held lock is a lease. WithAutoRefresh has the client's watchdog (one
// goroutine for all its locks, refreshing in pipelined batches, which
// leave a quarter of a bounded connection pool to other calls: see
// Pooled) keep it alive until released. Done closes the moment the lock is known lost (a
// refresh found it gone: a deletion is noticed at the next refresh), or
// its local Deadline passes without a refresh, and Err says why (ErrLost);
// Context returns a context cancelled then. Do runs a function under a
// lock that is refreshed, with such a context, and releases it after, also
// when the function panics; DoMulti, RWMutex.Do and RDo, and Semaphore.Do
// do the same for the other primitives; the function finds its Lock with
// LockFromContext (for its Fence, say). TryDo and its kin make one
// attempt, as TryLock does, and skip the function when the name is held.
// When the lock is lost, the function's context ends with
// context.Canceled, and its Cause is the loss: Do's error matches ErrLost,
// and context.Canceled too when the function returned its context's error,
// so code that reads Canceled as a shutdown checks ErrLost first.
// Refreshes of one lock, by Refresh or the watchdog, go one at a time, so
// that Deadline follows the last one the server ran.
// WithMaxHold caps how long refreshing may keep a lock. WithMinHold keeps
// an exclusive lock taken after an early Release, until that long after it
// was obtained: a job that every host's schedule starts then runs at most
// once per period.
//
// # Several names at once
//
// TryLockMulti and LockMulti obtain a lock on several names all or nothing,
// in one atomic script; Release, Refresh and TTL then act on all of them.
// On Redis Cluster, names in several hash slots are taken slot by slot, in
// an order every client shares, and a refused attempt gives back what it
// took: not atomic (others may briefly see names taken by an attempt that
// then gives them up), but never left half taken, and each name has one
// holder at a time.
//
// # Fencing
//
// Every hold of an exclusive lock, and every write hold of a read/write
// lock, gets a fencing token (Lock.Fence) larger than any given for that
// name before (an owner's re-entry joins its hold, and keeps its fence),
// so a resource can refuse writes from a holder whose lock has expired and
// passed to another. SetFenced does that for a value kept in Redis, and
// GetFenced reads it back with its fence. A
// name's fence counter is kept for a day after its last fence;
// WithFenceRetention sets another time, or none.
//
// # Re-entrant owners
//
// WithOwner makes a lock re-entrant for an explicit owner id: the owner may
// obtain it again while holding it, and it is freed after as many releases.
// Each Lock's release takes away its own acquisition, once, and a lock held
// more than once is only ever extended, never cut short by one of them.
//
// # Read/write locks
//
// Client.RWMutex returns a read/write lock: RLock and TryRLock obtain read
// holds, which any number of holders may have at once; Lock and TryLock
// obtain the write hold, which excludes everyone else. Each hold is a
// *Lock of its own, with its own token and TTL, so a reader that crashed
// frees its share after its TTL while the other readers refresh theirs:
//
//	cfg := locks.RWMutex("config")
//	r, err := cfg.RLock(ctx, dlock.WithAutoRefresh())
//	if err != nil {
//		return err
//	}
//	defer r.Release(ctx)
//
// Writers go first: while a writer waits, no new reader gets in, and the
// writer's claim expires with its TTL if it dies. With the Fair option
// the lock serves readers and writers in the order they arrive instead,
// through a queue in Redis whose entries expire too. Write holds get
// fencing tokens. A name is used by one kind of primitive at a time: a
// read/write lock on a name held as an exclusive lock or a semaphore (or
// with the other fairness) fails with ErrKindMismatch.
//
// # Semaphores
//
// Client.Semaphore returns a semaphore that lets a given number of holders
// in at once. Acquire and TryAcquire obtain a permit, a *Lock with its own
// token and TTL, so that a holder that crashed frees its permit after its
// TTL. Each acquire is judged against the count of the Semaphore value it
// is made through; SetPermits changes that count from the next attempt on
// (a change wakes the client's first waiting Acquires at once), and never revokes
// a permit held.
//
// Every hold, exclusive, read, write or permit, is a *Lock: Release,
// Refresh, TTL, Done, Context, WithAutoRefresh and WithMaxHold work alike,
// and WithOwner makes each of them re-entrant.
//
// # Inspection
//
// Inspect reports what holds a name: its kind; its holders with their
// mode, owner, metadata, hold count, time obtained and TTL left; the
// waiters of a read/write lock; the newest fence. List reports every name
// that matches a pattern, walking the keys with SCAN. ForceRelease frees a
// name whoever holds it and returns what it removed; the holders learn of
// the loss at their next refresh, and that it was force-released
// (ErrForceReleased) while the record of that lasts.
//
// # Server-side commands and observability
//
// WithFunctions runs dlock's scripts as a Redis Functions library (Redis 7)
// called by FCALL, so that lock traffic shows by function name in SLOWLOG,
// MONITOR and client lists, and costs the server less (the library defines
// the scripts' shared helpers once); Open reports ErrNoFunctions up front
// on a server without functions. WithLogger logs acquisitions, retries,
// refreshes and releases at debug level, refresh failures and losses as
// warnings, and an automatic refresh Redis denies (ErrDenied) and a
// hook's panic on one of its own goroutines as errors; it is silent by
// default and never logs tokens. WithHooks
// follows every acquisition, refresh, release and loss for metrics and
// tracing (package github.com/dlockio/dlock/otel turns the hooks into
// OpenTelemetry metrics and spans).
//
// # Keys
//
// Every key dlock writes starts with a prefix (DefaultPrefix, "dlock:", or
// WithPrefix), and all keys of one lock share the name's Redis Cluster hash
// tag (see Client.RedisKey). A name whose key already holds data dlock did
// not write is refused with ErrWrongType and left untouched.
//
// # Drivers
//
// Applications use a driver that comes with dlock: package
// github.com/dlockio/dlock/goredis (go-redis v9, in this module), or the
// rueidis and redigo drivers, modules of their own. The Driver interface,
// its Subscription, the interfaces a driver may add to it (Scanner,
// Replicator, Partitioned, Pooled, ShardedSubscriber), Call, Script,
// Scripts, and the helpers AsScripts, Unknown, Resend, ResendWait,
// EvalAgain, Loaded, FailFunctions and ConnectionClosed are for writing a
// driver for another Redis client; package
// github.com/dlockio/dlock/dlocktest is the conformance suite it runs. Code
// that only takes locks needs none of them.
//
// # Errors
//
// Errors match the package's sentinels with errors.Is:
//
//   - acquiring: ErrNotObtained (the name is held: TryLock found it so,
//     or Lock's wait ended while it was), ErrKindMismatch, ErrWrongType,
//     ErrClosed (after Client.Close);
//   - holding: ErrLost (Lock.Err, and the errors of Do and of Release
//     for a lock lost while held; ErrMaxHold and ErrForceReleased say
//     why), ErrNotHeld (Release, Refresh or TTL of a lock no longer held),
//     ErrModeMismatch;
//   - ErrStaleFence (SetFenced), ErrNotReplicated (WithReplicas),
//     ErrNoFunctions (WithFunctions), ErrUnsupported (the driver);
//   - ErrDenied: Redis refuses the client for good, a setting to fix
//     rather than an outage to wait out (see below);
//   - bad arguments: ErrInvalidArgument and its more specific children
//     (ErrEmptyName, ErrInvalidTTL, ErrInvalidPermits, …), which are
//     returned before anything is sent to Redis.
//
// Failures of Redis itself come as a *ServerError (errors.As), never as
// ErrNotObtained, so that code that skips its work while another holds
// the lock does not skip it silently while Redis is down. A waiting
// acquire retries them until its wait ends, as a
// Redis restarting or failing over comes back, except a refusal that no
// wait changes, which ends it at once and matches ErrDenied (the
// *ServerError keeps Redis's words): a missing or wrong password
// (NOAUTH, WRONGPASS), a missing ACL permission (NOPERM), a server that
// does not know the script commands (ERR unknown command), a database it
// does not have, a client name it refuses, a TLS certificate that either
// side refuses.
// errors.Is(err, ErrDenied) tells such a setting to fix from an outage.
//
// No input makes dlock panic, except a nil Driver given to New (or one
// that its package's New did not make, such as a zero goredis.Driver), a
// Client, RWMutex or Semaphore that New, Client.RWMutex or
// Client.Semaphore did not make (a zero value, or a nil *Client), calling
// methods on a nil *Lock or on a Lock no acquire or Attach returned (the
// zero Lock, whose methods panic with a message that says so), and a nil
// parent given to Lock.Context (as context.WithCancel panics).
package dlock
