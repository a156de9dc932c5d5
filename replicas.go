package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlockio/dlock/internal/keyslot"
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
// answers a WAIT only at its timeout; no more than WithPipelines such
// requests of one setting are in flight at once, and those that queue
// meanwhile go out together, under one WAIT of what is left of their
// timeout, or of the earliest refresh's among them, which does not leave
// its request; an acquire whose reply has not come 300ms past its timeout
// (Redis answers a WAIT at the first tick of its clock after its timeout,
// up to 100ms late by default, twice for a script sent again), so
// queued, or on a server that stalls, ends as one whose reply was lost,
// what it may have taken given back, with ErrNotReplicated and
// context.DeadlineExceeded, and a refresh as one that was not confirmed), and
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
// or was lost. A lone call confirmed on replicas goes through a batcher of
// its own (see waitLane), as a lone call without goes through the
// client's.
func (c *Client) evalWith(ctx context.Context, r replication, calls ...*Call) {
	if r.replicas == 0 {
		if len(calls) == 1 {
			c.evalOne(ctx, calls[0])
		} else {
			c.batch.run(ctx, calls...)
		}
		return
	}
	if _, ok := c.driver.(Replicator); !ok {
		for _, call := range calls {
			call.Err = fmt.Errorf("%w: WithReplicas needs a driver that can WAIT", ErrUnsupported)
		}
		return
	}
	if len(calls) == 1 {
		// Queued, the call may go out with others made later, under one
		// WAIT of what is left of the latest's timeout (see evalWait): it
		// leaves the pipeline at its own, as a call whose reply was lost
		// at its context's end (but a refresh: see stays), so that it
		// fails at its timeout, not at up to twice it.
		by := time.Now().Add(r.timeout)
		calls[0].waitBy = by
		own := by.Add(waitBySlack)
		wctx, cancel := context.WithDeadlineCause(ctx, own, errWaitBy)
		defer cancel()
		b := c.waitLane(wctx, r, calls[0])
		defer b.done()
		b.eval(wctx, calls[0])
		// Its own deadline, not the caller's (whose context lives on), cut
		// it short: the driver may say so (rueidis, by its own timer)
		// before wctx's ends. Only once that deadline came: a failure
		// matching context.DeadlineExceeded before it is another's (a
		// dial's timeout: net's "i/o timeout", or rueidis's handshake),
		// and nothing was sent.
		if call := calls[0]; call.Err != nil && ctx.Err() == nil && !time.Now().Before(own) &&
			errors.Is(call.Err, context.DeadlineExceeded) {
			call.Val, call.Err = nil, fmt.Errorf("%w: no reply within the %v WAIT timeout: %w", ErrNotReplicated, r.timeout, call.Err)
		}
		return
	}
	c.batch.mark(calls)
	c.evalWait(ctx, r, calls)
	// The calls' errors are read once they include the WAIT's (see
	// batcher.check).
	c.batch.check(calls)
}

// errWaitBy is the cause of the end of the context of a lone call
// confirmed on replicas whose WAIT timeout, and waitBySlack, passed (see
// evalWith).
var errWaitBy = errors.New("dlock: the WAIT timeout passed")

// waitBySlack is how long past its WAIT timeout a lone call confirmed on
// replicas waits for the reply: the server answers WAIT at the first tick
// of its clock after the timeout (hz 10 by default: up to 100ms late), a
// call sent again with its script after NOSCRIPT waits a second WAIT so,
// and the reply then has to come back.
const waitBySlack = 300 * time.Millisecond

// evalWait sends calls, and WAIT as r asks, by the driver's Replicator,
// and fails the calls whose writes were not confirmed (see evalWith).
func (c *Client) evalWait(ctx context.Context, r replication, calls []*Call) {
	// A WAIT that lasts past the end of ctx is of no use, and the server
	// answers it only at its timeout, whatever ctx says: it waits that long
	// at most (a millisecond at least: 0 waits for ever). Nor past the
	// timeout of the calls that queued for it, counted from when they were
	// made (the latest of them; an earlier one leaves at its own, see
	// evalWith): queued while a replica lagged, they fail at their
	// timeout, not up to twice that.
	timeout := r.timeout
	var by, stayBy time.Time
	for _, call := range calls {
		if call.waitBy.After(by) {
			by = call.waitBy
		}
		if stays(call) && !call.waitBy.IsZero() && (stayBy.IsZero() || call.waitBy.Before(stayBy)) {
			stayBy = call.waitBy
		}
	}
	// But a refresh does not leave its pipeline (see stays): queued with
	// calls made after it, it would wait for the latest's timeout, up to
	// twice its own. With one, the WAIT lasts no longer than what is left
	// of the earliest refresh's timeout, and the request no longer than
	// that and waitBySlack (a server that stalls), so that every call
	// ends within its own (the later ones have a shorter WAIT than they
	// asked for: one that fewer replicas acknowledged by then fails).
	if !stayBy.IsZero() {
		by = stayBy
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, stayBy.Add(waitBySlack))
		defer cancel()
		defer deadlined(ctx, calls)
	}
	// (A WAIT counts whole milliseconds: a call sent at once keeps its
	// timeout as it is.)
	if left := time.Until(by); !by.IsZero() && left < timeout-time.Millisecond {
		timeout = max(left, time.Millisecond)
	}
	// The error says the timeout the caller set, which the latest call
	// waited from when it was made, unless an earlier end cut it short.
	said := r.timeout
	if !stayBy.IsZero() {
		said = timeout
	}
	if end, ok := ctx.Deadline(); ok && time.Until(end) < timeout {
		timeout = max(time.Until(end), time.Millisecond)
		said = timeout
	}
	acked, err := c.driver.(Replicator).EvalWait(ctx, r.replicas, timeout, calls...)
	if err == nil && acked < r.replicas {
		err = fmt.Errorf("%w: %d of %d replicas acknowledged within %v", ErrNotReplicated, acked, r.replicas, said)
	}
	if err == nil {
		return
	}
	for _, call := range calls {
		// A call the server answered without knowing its script never ran:
		// the driver sends it again only once the WAIT behind it has
		// answered (see ResendWait), so one whose WAIT failed ends with
		// that failure (its context's deadline, say), not with the reply
		// the driver would have acted on.
		if (call.Err == nil && !refused(call.Val)) || (call.Err != nil && unknownScript(call.Err)) {
			call.Val, call.Err = nil, err
		}
	}
}

// waitLane returns the batcher that sends a lone call confirmed on
// replicas as r asks, counted as used (see laneSet): one for each setting
// (on a Partitioned driver, each server's, see lanes), apart from the
// calls without, dropped once idle. Their WAIT may hold
// a reply up to its timeout, on a connection of the Redis client's pool:
// sent each at once, as many as the pool has connections, while a replica
// lagged, held up every other request of the client until their WAITs
// ended. So no more than WithPipelines of them are in flight at once, as
// without WithReplicas, and the calls that come meanwhile go out together
// under one WAIT, which confirms them all, within what is left of their
// timeout (see evalWait).
func (c *Client) waitLane(ctx context.Context, r replication, call *Call) *batcher {
	k := waitKey{r: r, lane: laneKey{slot: -1}}
	if c.lanes != nil && len(call.Keys) > 0 {
		// Each server's apart: one WAIT waits for one server's replicas.
		if k.lane.server = c.lanes.p.Server(ctx, call.Keys[0]); k.lane.server == "" {
			k.lane.slot = keyslot.Of(call.Keys[0])
		}
	}
	b := c.confirmed.get(k)
	if b == nil {
		b = c.newLane()
		b.driver = waitDriver{Driver: c.driver, c: c, r: r}
		b = c.confirmed.add(k, b)
	}
	return b
}

// waitKey names the batcher of calls confirmed on replicas (see waitLane).
type waitKey struct {
	r    replication
	lane laneKey
}

// waitDriver is the driver of a waitLane batcher: its Eval confirms the
// calls on replicas as r asks.
type waitDriver struct {
	Driver
	c *Client
	r replication
}

func (d waitDriver) Eval(ctx context.Context, calls ...*Call) { d.c.evalWait(ctx, d.r, calls) }

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
