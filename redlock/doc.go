// Package redlock provides Redlock locks: a lock spread over N independent
// Redis masters that counts as held while a majority of them, N/2+1, hold
// it. It keeps working while fewer than half of the masters are down or
// unreachable, where a lock on one server (package dlock) stops with its
// server.
//
//	var nodes []redlock.Node
//	for _, addr := range []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379", "10.0.0.4:6379", "10.0.0.5:6379"} {
//		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
//		nodes = append(nodes, redlock.Node{Addr: addr, Client: dlock.New(goredis.New(rdb))})
//	}
//	locks, err := redlock.New(nodes)
//	...
//	l, err := locks.TryLock(ctx, "orders:42", redlock.WithTTL(10*time.Second))
//	if errors.Is(err, dlock.ErrNotObtained) {
//		return nil // held by another
//	} else if err != nil {
//		return err // nodes failing (redlock.ErrNoQuorum), other data under the key, or ctx ended
//	}
//	defer l.Release(ctx)
//
// # The algorithm
//
// An acquisition sends the request for the lock to every node at once,
// with one random token for all of them, and waits for each at most the
// node timeout (WithNodeTimeout, 50ms by default), so that a dead or
// paused node costs the timeout and no more. It succeeds if a quorum
// granted the lock and its validity has not run out: the TTL, measured on
// the monotonic clock from before the first request, less the time the
// round took and an allowance for clock drift (1% of the TTL + 2ms).
// Otherwise the lock is released on every node that granted it, and Lock
// tries again after a random delay. On each node the lock is an ordinary
// dlock lock (one atomic script to take it, token-checked scripts to
// refresh and release it).
//
// A held lock is a lease, as in package dlock: Refresh extends it on every
// node (and takes it again on nodes that lost it), WithAutoRefresh keeps it
// alive, Deadline says until when a quorum is known to hold it, and Done
// closes the moment fewer than a quorum do.
//
// # Errors
//
// A failed acquisition returns an error joined with a *NodeError for each
// node that did not grant the lock. It matches dlock.ErrNotObtained when
// the lock is held by another (the nodes that refused it rule out a quorum
// on their own), and ErrNoQuorum instead when nodes that failed could have
// made the quorum: the lock may be free, and code that skips its work when
// the lock is held must not skip it silently while the nodes are down.
// When nodes holding other data under the lock's key decide (with those
// that refused), it matches their dlock.ErrWrongType or
// dlock.ErrKindMismatch, not dlock.ErrNotObtained; a quorum that granted
// the lock too late for it to be valid is ErrNoQuorum. When the caller's
// context ended before enough nodes answered to tell, it matches none of
// these, but the context's error. A node's own error (a *dlock.ServerError,
// dlock.ErrWrongType) matches whatever decided. The error of Lock is that
// of its last attempt that the nodes' answers decided. The errors of a
// lock once obtained (Refresh, Release, Err, Do once it ran the function)
// never match dlock.ErrNotObtained, though a node that never granted the
// lock refused it: only an acquisition's error says "held by another".
// Bad input matches
// dlock.ErrInvalidArgument and is returned before any request: ErrNoNodes,
// ErrInvalidNode and ErrDuplicateNode from New, dlock's own for options.
//
// # Logging
//
// A Locker logs through log/slog (see WithLogger; by default through its
// nodes' clients' logger when they all have the same one): a warning,
// "redlock: lock lost", when one of its locks is lost, naming it
// (attribute "names") and saying why (attribute "err": the error Err
// returns, with each node that lost it and its cause), and an info record,
// "redlock: a node lost the lock; the quorum still holds it", when a node
// loses its copy of a lock that a quorum still holds (a node restarted
// without persistence, or one whose deadline passed while it did not
// answer), found by the next refresh or Release, and a warning, "redlock:
// refresh did not reach a quorum; retrying until the lock's deadline",
// when an automatic refresh fails (once, until one succeeds again). The nodes' dlock clients
// then log the end of a node's lock as a debug record, "dlock: a Redlock
// node's lock ended", not as the warning "dlock: lock lost" of a lock of
// their own: one node's loss is not the lock's. Clients with loggers of
// their own and no WithLogger: the Locker logs nothing, and the clients
// warn of each node's loss, so that a lost lock is not left untold. A
// node's dlock.Hooks still see each node's lock, its loss included.
//
// # What it rests on
//
// Redlock is safe only while its assumptions hold: the masters fail
// independently; clocks run at about the same rate everywhere (the drift
// allowance covers 1%); and a master that restarts either keeps its data
// (appendonly with appendfsync always) or stays down for longer than the
// longest TTL, since a master that comes back empty can give a second
// locker the vote that completes its quorum. A process paused for longer
// than its lock's validity finds it ended (Err, Done) the moment it looks
// when it resumes, too late to stop a write it was making. Martin Kleppmann's critique of
// Redlock turns on that last point and on the absence of fencing tokens:
// Redlock cannot hand out a number that grows with every holder, because
// the nodes count separately. For correctness under pauses, use a
// single-instance dlock lock with dlock.WithReplicas and check its fence at
// the resource; Redlock is for availability, and for efficiency where a
// rare double holder costs only duplicate work.
//
// An even number of masters works, with a quorum of N/2+1, but buys
// nothing: four masters need three votes and tolerate one failure, as
// three do.
package redlock
