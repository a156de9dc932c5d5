package dlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock/internal/causes"
	"github.com/dlockio/dlock/internal/keyslot"
)

// batcher coalesces the script calls that many goroutines issue at once
// into pipelines. While fewer than max pipelines are in flight a call goes
// out at once, alone, with no added delay. Beyond that, calls queue; when a
// pipeline returns, the goroutine that sent it hands everything queued
// meanwhile to one queued caller, which sends it as one pipeline: the
// caller of the latest deadline, so that nobody waits for a deadline later
// than their own. So under load each round trip carries many calls, and no
// goroutine is started: every call is sent by a goroutine that waits for
// it. A caller whose context ends does not wait longer: a queued call is
// not sent, and one in a pipeline that another caller sent is left as a
// call whose reply was lost (but for a refresh: see stays). On a
// Partitioned driver, each server has a batcher of its own (see lanes).
type batcher struct {
	driver Driver
	max    int
	lib    *Library // set by WithFunctions
	// closedUnder is called when a call fails with an error matching
	// ErrClosed: the Redis client under the driver was closed (see
	// Client.closedUnder).
	closedUnder func()

	mu       sync.Mutex
	inflight int
	queue    []*queued

	// In a laneSet: the calls that hold it, and the last epoch it was
	// used in (see laneSet).
	users atomic.Int32
	epoch atomic.Uint32
}

// queued is a call waiting for a pipeline.
type queued struct {
	ctx  context.Context
	call *Call // the caller's: gets sent's reply once the pipeline is back
	// sent is what the pipeline sends and fills, a copy of call, so that a
	// caller that leaves while its pipeline is out (see eval) shares
	// nothing with it.
	sent  Call
	done  chan struct{}  // closed when sent has its reply
	lead  chan []*queued // receives a batch for this caller to send
	leads bool           // set, under the batcher's mu, once it is to send one
}

// DefaultPipelines is how many pipelines a client keeps in flight at once
// before it queues calls to coalesce them (see WithPipelines).
const DefaultPipelines = 4

func (b *batcher) eval(ctx context.Context, call *Call) {
	b.made()
	b.mu.Lock()
	limit := b.max
	if givesBack(call) {
		limit += b.max
	}
	if b.inflight < limit {
		b.inflight++
		b.mu.Unlock()
		b.run(ctx, call.one()...)
		b.handOver()
		return
	}
	q := &queued{ctx: ctx, call: call, sent: *call, done: make(chan struct{}), lead: make(chan []*queued, 1)}
	b.queue = append(b.queue, q)
	b.mu.Unlock()
	select {
	case <-q.done:
		q.reply()
	case batch := <-q.lead:
		b.send(q, batch)
	case <-ctx.Done():
		if leads, queued := b.withdraw(q); queued {
			call.Err = ctx.Err()
			return
		} else if leads {
			// Its batch is handed to it (the caller of the latest
			// deadline of the batch): it sends it.
			b.send(q, <-q.lead)
			return
		}
		// In a pipeline another caller sent: unless the reply is there,
		// it leaves it, as a call whose reply was lost (the pipeline
		// fills sent, which nobody reads), and does not wait beyond its
		// context for callers with later deadlines, or none. A refresh
		// stays (see stays).
		if stays(call) {
			<-q.done
			q.reply()
			return
		}
		select {
		case <-q.done:
			q.reply()
		default:
			call.Val, call.Err = nil, ctx.Err()
		}
	}
}

// lanes are the batchers of a client over a Partitioned driver: one for
// each server, and one for each hash slot of the keys whose server the
// driver cannot tell. So the requests that a stalled server holds take
// only the pipeline slots of its own lane, and a pipeline never mixes
// requests to two servers, which would return with the slower (but for a
// while after the cluster moved a slot, until the driver's map follows).
// Those of servers gone (a failover, a change of nodes) are dropped once
// idle (see laneSet).
type lanes struct {
	p   Partitioned
	set laneSet[laneKey]
}

// laneKey names a lane: a server, or else a hash slot.
type laneKey struct {
	server string
	slot   int // -1 with a server
}

// evalOne sends one call through its lane: on a Partitioned driver, its
// server's (see lanes), elsewhere the client's one batcher.
func (c *Client) evalOne(ctx context.Context, call *Call) {
	if c.lanes == nil || len(call.Keys) == 0 {
		c.batch.eval(ctx, call)
		return
	}
	k := laneKey{server: c.lanes.p.Server(ctx, call.Keys[0]), slot: -1}
	if k.server == "" {
		k.slot = keyslot.Of(call.Keys[0])
	}
	b := c.lanes.set.get(k)
	if b == nil {
		b = c.lanes.set.add(k, c.newLane())
	}
	defer b.done()
	b.eval(ctx, call)
}

// newLane makes a batcher of the client's settings, for a lane.
func (c *Client) newLane() *batcher {
	return &batcher{driver: c.batch.driver, max: c.batch.max, lib: c.batch.lib, closedUnder: c.batch.closedUnder}
}

// laneSet is a map of lanes made as they are first needed, which drops
// those that nobody used for a while: the client makes one for each
// server it sends to (and WithReplicas setting), and after each failover
// or change of nodes, one for each new one, while those of the servers
// gone stayed for good. Each time a lane is made, at most once per idle
// (laneIdle, unless a test sets it), the set drops the lanes that nobody
// used since the last time: so a lane goes when it was idle from one such
// time to the next, no sooner than idle after its last call, and without
// a goroutine. A lane that a call holds (counted from its lookup, under
// the set's lock, to when the call returns: see get) is never dropped, so
// that two batchers of one server never send at once, past its bound.
type laneSet[K comparable] struct {
	mu     sync.RWMutex
	m      map[K]*batcher
	idle   time.Duration // 0 for laneIdle; under mu
	pruned time.Time     // the last time lanes were dropped, under mu
	epoch  atomic.Uint32 // how many times: written under mu, read under its read lock
}

// laneIdle is how long after the last time a laneSet dropped its idle
// lanes the next lane made has it drop them again.
const laneIdle = time.Minute

// get returns the lane of k, counted as used (see laneSet), or nil when
// there is none: the caller adds one (see add), and ends its use with
// done.
func (s *laneSet[K]) get(k K) *batcher {
	s.mu.RLock()
	defer s.mu.RUnlock()
	b := s.m[k]
	if b != nil {
		b.use(s.epoch.Load())
	}
	return b
}

// add makes b the lane of k, or returns the one another caller added
// meanwhile, counted as used; first it drops the idle lanes, once idle
// has passed since the last time.
func (s *laneSet[K]) add(k K, b *batcher) *batcher {
	s.mu.Lock()
	defer s.mu.Unlock()
	if had := s.m[k]; had != nil {
		b = had
	} else {
		idle := s.idle
		if idle == 0 {
			idle = laneIdle
		}
		if now := time.Now(); now.Sub(s.pruned) >= idle {
			s.pruned = now
			s.dropIdle()
		}
		if s.m == nil {
			s.m = map[K]*batcher{}
		}
		s.m[k] = b
	}
	b.use(s.epoch.Load())
	return b
}

// dropIdle drops the lanes that nobody used since the last time, and
// starts anew the count of those used, under mu.
func (s *laneSet[K]) dropIdle() {
	e := s.epoch.Load()
	for k, b := range s.m {
		if b.users.Load() == 0 && b.epoch.Load() != e {
			delete(s.m, k)
		}
	}
	s.epoch.Store(e + 1)
}

// prune drops the idle lanes now (see dropIdle).
func (s *laneSet[K]) prune() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruned = time.Now()
	s.dropIdle()
}

// setIdle sets the set's idle time (at least 1ns).
func (s *laneSet[K]) setIdle(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idle = max(d, 1)
}

// len returns how many lanes the set keeps.
func (s *laneSet[K]) len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.m)
}

// use counts a call of a lane of a laneSet in epoch e, under the set's
// read lock at least.
func (b *batcher) use(e uint32) {
	b.users.Add(1)
	if b.epoch.Load() != e {
		b.epoch.Store(e)
	}
}

// done ends a use of a lane (see use).
func (b *batcher) done() { b.users.Add(-1) }

// stays reports whether the caller of call waits for its pipeline even
// past its context: a refresh. A Lock refreshes one call at a time, so
// that its deadline follows the refresh the server ran last; a refresh
// that left could still run (a driver sends a pipeline again after a
// timeout) after its Lock's next one, and cut short the TTL that one set,
// while the Lock counts on it. An acquire, a release or a read that runs
// late does no such harm: a late acquire takes nothing once its clean-up
// ran (when that could not be sent either, it holds the name for nobody
// until its TTL, as after any lost reply), and a release is recognised by
// its id.
func stays(call *Call) bool {
	return call.Script == scriptRefresh || call.Script == scriptHoldsRefresh
}

// givesBack reports whether call gives something back: a release (or the
// clean-up after an acquire given up, which runs the release script), or
// a client leaving a waiter set. Those go out at once while fewer than
// twice max pipelines are in flight: up to max slots of their own, which
// requests a stalled server holds (go-redis waits out its read timeout,
// whatever the context) do not take from them, so that they are not
// queued behind those until their own bound runs out, leaving names taken.
func givesBack(call *Call) bool {
	return call.Script == scriptRelease || call.Script == scriptHoldsRelease || call.Script == scriptUnwait
}

// reply gives the caller the reply its pipeline stored.
func (q *queued) reply() {
	q.call.Val, q.call.Err = q.sent.Val, q.sent.Err
}

// made panics unless New made the batcher's Client: the zero batcher
// would queue every call for ever, with no pipeline ever in flight to send
// it.
func (b *batcher) made() {
	if b.driver == nil {
		panic(notNew)
	}
}

// run hands calls to the driver at once: by FCALL with WithFunctions.
func (b *batcher) run(ctx context.Context, calls ...*Call) {
	b.made()
	b.mark(calls)
	b.driver.Eval(ctx, calls...)
	b.check(calls)
	deadlined(ctx, calls)
}

// deadlined makes the failure of a call that ctx's deadline cut short
// match context.DeadlineExceeded, as the driver may report it as a network
// timeout (go-redis with ContextTimeoutEnabled), so that a caller whose
// deadline came learns it by errors.Is whatever the driver.
func deadlined(ctx context.Context, calls []*Call) {
	for _, c := range calls {
		if c.Err != nil && !errors.Is(c.Err, context.DeadlineExceeded) && timedOut(ctx, c.Err) {
			c.Err = &causes.Error{Msg: c.Err.Error(), Errs: []error{c.Err, context.DeadlineExceeded}}
		}
	}
}

// mark sets the function library on calls, with WithFunctions.
func (b *batcher) mark(calls []*Call) {
	if b.lib == nil {
		return
	}
	for _, c := range calls {
		c.Lib = b.lib
	}
}

// check turns the replies of a server without functions into
// ErrNoFunctions, with WithFunctions, and Redis's protocol error for a
// client that has not authenticated into one that says so (see
// unauthenticated).
func (b *batcher) check(calls []*Call) {
	closed := false
	for _, c := range calls {
		switch {
		case c.Err == nil:
		case isUnauthenticated(c.Err):
			c.Err = &unauthenticated{c.Err}
		case errors.Is(c.Err, ErrClosed):
			closed = true
		case b.lib != nil:
			c.Err = functionsError(c.Err)
		}
	}
	if closed && b.closedUnder != nil {
		b.closedUnder()
	}
}

// send sends a batch, in the order its calls queued, for lead, one of its
// callers (see handOver), hands on the queue, and wakes the other callers.
// The pipeline goes under lead's deadline, the batch's latest, and not
// lead's cancellation, so that the others still get replies; but it is
// given up once every caller of the batch has left (see leaveTogether).
func (b *batcher) send(lead *queued, batch []*queued) {
	calls := make([]*Call, len(batch))
	for i, q := range batch {
		calls[i] = &q.sent
	}
	ctx := context.WithoutCancel(lead.ctx)
	if d, ok := lead.ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d)
		defer cancel()
	}
	ctx, abandon := context.WithCancelCause(ctx)
	defer abandon(nil)
	stop := leaveTogether(batch, abandon)
	b.run(ctx, calls...)
	stop()
	if context.Cause(ctx) == errAbandoned {
		// Every caller has left, each at its own context's end, which
		// its failure matches (not the cancellation of the pipeline,
		// which may come at the lead's deadline before the deadline
		// itself).
		for _, q := range batch {
			if errors.Is(q.sent.Err, context.Canceled) {
				q.sent.Err = q.ctx.Err()
			}
		}
	}
	lead.reply()
	for _, q := range batch {
		if q != lead {
			close(q.done)
		}
	}
	b.handOver()
}

// leaveTogether arranges for abandon to be called once the contexts of
// every caller of batch have ended, cancelled or past their deadlines, and
// returns the function that undoes it. A pipeline nobody waits for is then
// given up: with a driver that ends a request at its context's
// cancellation, the caller that sends it (the one of the latest deadline,
// or of none) does not wait on for a stalled server once it is cancelled
// (by its caller, or by Client.Close) and the others have left. Never for a
// batch with a refresh, which stays (see stays), a give-back, which should
// reach the server whoever waits for it (see givesBack), or a caller whose
// context cannot end.
func leaveTogether(batch []*queued, abandon context.CancelCauseFunc) (stop func()) {
	for _, q := range batch {
		if q.ctx.Done() == nil || stays(q.call) || givesBack(q.call) {
			return func() {}
		}
	}
	var left atomic.Int32
	left.Store(int32(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, q := range batch {
		stops[i] = context.AfterFunc(q.ctx, func() {
			if left.Add(-1) == 0 {
				abandon(errAbandoned)
			}
		})
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}

// errAbandoned is the cause of the end of a pipeline that every caller of
// it left (see leaveTogether).
var errAbandoned = errors.New("dlock: every caller left the pipeline")

// handOver gives whatever queued while a pipeline was out to the queued
// caller of the latest deadline (the first with none, else the first of
// the latest), which sends it, or frees the pipeline's slot. A slot beyond
// max, which only give-backs take (see givesBack), goes to the queued
// give-backs alone: the other calls stay queued for the max slots, so
// that they do not follow requests a stalled server holds into the slots
// the next give-backs need.
func (b *batcher) handOver() {
	b.mu.Lock()
	batch := b.queue
	if b.inflight > b.max {
		var rest []*queued
		batch = nil
		for _, q := range b.queue {
			if givesBack(q.call) {
				batch = append(batch, q)
			} else {
				rest = append(rest, q)
			}
		}
		b.queue = rest
	} else {
		b.queue = nil
	}
	if len(batch) == 0 {
		b.inflight--
		b.mu.Unlock()
		return
	}
	lead := batch[0]
	for _, q := range batch {
		if later(q.ctx, lead.ctx) {
			lead = q
		}
	}
	lead.leads = true
	b.mu.Unlock()
	lead.lead <- batch
}

// later reports whether context a ends after b, by their deadlines: one
// with none ends after every one with one.
func later(a, b context.Context) bool {
	da, ok := a.Deadline()
	if !ok {
		_, hasB := b.Deadline()
		return hasB
	}
	db, ok := b.Deadline()
	return ok && da.After(db)
}

// withdraw takes a caller whose context ended out of the queue, and
// reports whether it was still there, or else whether it is to send its
// batch.
func (b *batcher) withdraw(q *queued) (leads, queued bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, x := range b.queue {
		if x == q {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			return false, true
		}
	}
	return q.leads, false
}
