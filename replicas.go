package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrNotReplicated means Redis did not confirm, within the WithReplicas
// timeout, that enough replicas have the write that took or refreshed the
// lock. An acquire that was not confirmed is released again and not
// reported as held (by a waiting Lock, once its wait ends: until then its
// next attempt takes that hold again and asks the replicas anew, and the
// name stays taken for nobody else); a refresh that was not confirmed does not extend the
// lock's deadline and is retried. An acquire the server refused, or a
// refresh that found the lock gone, wrote nothing to confirm: it reports
// ErrNotObtained or ErrNotHeld, whatever the replicas acknowledged.
var ErrNotReplicated = errors.New("dlock: write not confirmed by enough replicas")

// Replicator is implemented by drivers that can confirm writes on
// replicas, which WithReplicas needs. EvalWait runs the calls as Eval does
// and then, on the connection that carried them, WAIT replicas timeout; it
// returns how many replicas acknowledged the writes (the least, when the
// calls went to several primaries).
type Replicator interface {
	// EvalWait runs calls and then WAIT replicas timeout (see Replicator).
	EvalWait(ctx context.Context, replicas int, timeout time.Duration, calls ...*Call) (acked int, err error)
}

// replication is what WithReplicas asks for; zero asks for nothing.
type replication struct {
	replicas int
	timeout  time.Duration
}

// WithReplicas confirms every acquire and refresh of the lock on n replicas:
// after the script, dlock sends WAIT n timeout on the same connection (or
// what is left of the request's context, when that is less: the server
// answers a WAIT only at its timeout), and
// an acquire that fewer replicas acknowledged is released and returns
// ErrNotReplicated (a waiting Lock keeps the hold while it waits, and
// tries again, as ErrNotReplicated says); a refresh that fewer
// acknowledged does not count. This
// keeps a lock on the server through a failover to any replica that
// acknowledged it (Sentinel, or Redis Cluster), so no other client obtains
// it. The holder keeps it only while its refreshes are acknowledged: when
// the new primary has fewer than n replicas (n was all of them), they fail
// with ErrNotReplicated, and the lock ends at its deadline (Done), while
// the server keeps the key, extended by those unconfirmed refreshes, for
// up to a TTL more. On Redis Cluster, the script and WAIT go to the
// primary of the slot in the client's slot map, without following ASK:
// while a slot migrates, the acquisitions and refreshes of names whose
// keys have moved fail (a *ServerError with the ASK reply), and a lock
// refreshed automatically may end at its deadline; a lock without
// WithReplicas follows ASK. n must be at least 1 and timeout at least
// 1ms; the driver must implement Replicator (the goredis driver does).
func WithReplicas(n int, timeout time.Duration) Option {
	return func(o *options) {
		if n < 1 || timeout < time.Millisecond {
			o.fail(fmt.Errorf("%w: WithReplicas(%d, %v) needs at least 1 replica and 1ms", ErrInvalidOption, n, timeout))
		}
		o.repl = replication{replicas: n, timeout: timeout}
	}
}

// evalWith sends calls, confirming them on replicas when r asks for it:
// calls whose writes were not confirmed fail with ErrNotReplicated (or with
// the driver's error, when it could not tell). A call the server refused
// keeps its reply: it took or kept no hold, so it wrote nothing that needs
// confirming, and its caller must learn that the lock is held by another,
// or was lost.
func (c *Client) evalWith(ctx context.Context, r replication, calls ...*Call) {
	if r.replicas == 0 {
		if len(calls) == 1 {
			c.lane(ctx, calls[0]).eval(ctx, calls[0])
		} else {
			c.batch.run(ctx, calls...)
		}
		return
	}
	rep, ok := c.driver.(Replicator)
	if !ok {
		for _, call := range calls {
			call.Err = fmt.Errorf("%w: WithReplicas needs a driver that can WAIT", ErrUnsupported)
		}
		return
	}
	// A WAIT that lasts past the end of ctx is of no use, and the server
	// answers it only at its timeout, whatever ctx says: it waits that long
	// at most (a millisecond at least: 0 waits for ever).
	timeout := r.timeout
	if end, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(time.Until(end), time.Millisecond))
	}
	c.batch.mark(calls)
	acked, err := rep.EvalWait(ctx, r.replicas, timeout, calls...)
	// The calls' errors are read once they include the WAIT's (see
	// batcher.check).
	defer c.batch.check(calls)
	if err == nil && acked < r.replicas {
		err = fmt.Errorf("%w: %d of %d replicas acknowledged within %v", ErrNotReplicated, acked, r.replicas, timeout)
	}
	if err == nil {
		return
	}
	for _, call := range calls {
		if call.Err == nil && !refused(call.Val) {
			call.Val, call.Err = nil, err
		}
	}
}

// refused reports whether a reply of a script that WithReplicas confirms
// says it took or kept no hold: an acquire of a name held by another
// answers {0, …}, a refresh of a hold it no longer has the position of the
// name (1 or more).
func refused(v any) bool {
	switch v := v.(type) {
	case int64:
		return v > 0
	case []any:
		if len(v) == 0 {
			return false
		}
		got, ok := v[0].(int64)
		return ok && got == 0
	}
	return false
}
