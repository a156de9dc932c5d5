package redlock

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock/internal/causes"
	"github.com/dlockio/dlock/internal/friend"

	"github.com/dlockio/dlock"
)

// Lock is a lock held on a quorum of a Locker's nodes. It is obtained with
// Locker.TryLock or Locker.Lock and given up with Release. Its methods are
// safe for concurrent use. Those of a nil *Lock panic, and so do those of
// the zero Lock, which is not usable.
//
// On each node the lock is an ordinary dlock lock, so dlock.Client.Inspect
// shows it there with its metadata, held with the Lock's token (or, on a
// node a refresh took again, with that attempt's own token).
//
// A Lock has no fencing token. Each node would give its own, from its own
// counter, and numbers from different nodes cannot be compared: a newer
// holder may well get a smaller number from the nodes that count for it.
// Kleppmann's critique of Redlock (and the Redis documentation) come to
// the same point: Redlock cannot fence. Where a late write by a holder
// that lost its lock would do harm, use a single-instance dlock lock with
// dlock.WithReplicas, whose Lock.Fence only grows.
type Lock struct {
	r     *Locker
	name  string
	token string
	meta  string

	op chan struct{} // one Refresh or Release at a time: held while it has a value (see opStart)

	mu        sync.Mutex
	nodes     []nodeLock
	live      int           // nodes whose lock is held
	held      bool          // the acquisition succeeded
	stopped   bool          // no node lock may be added: released, lost or given up
	released  bool          // Release was called
	settled   bool          // a Release ended with a quorum released, or with nothing left to retry
	relFailed bool          // the lock ended with a Release that did not reach a quorum (err is its error)
	relOut    error         // what the Release that settled it returned
	ttl       time.Duration // of the last acquisition or refresh
	acquired  time.Time
	maxHold   time.Duration
	interval  time.Duration             // of the automatic refresh, 0 when off
	capped    bool                      // the max hold stopped the refreshing
	capEnd    time.Time                 // once capped: a loss from then on is the max hold's (zero: none is)
	lostAt    time.Time                 // when fewer than a quorum came to hold it
	due       atomic.Pointer[time.Time] // the quorum deadline as last computed, nil when none (see expireIfDue)
	ended     time.Time                 // Deadline once Done is closed
	relAt     time.Time                 // Deadline from when the first Release began (see Deadline)
	done      chan struct{}
	err       error
	onEnd     map[*int]func()
	rootCtx   context.Context // made by Context from context.Background() or TODO(), returned again
	kept      []nodeLoss      // nodes' losses yet to log (see logKept); nil once the Lock ended

	// The Lock's records, queued under mu in the order of what they tell
	// (a record saying that the quorum still holds the Lock never follows
	// the one saying that it is lost), and written by one goroutine at a
	// time, under no lock and outside op's turn (see writeLogs): a slog
	// handler may be slow, or call this Lock's methods.
	logs    []func()
	writing bool // a goroutine is writing the queued records

	// unrefreshed is set once an automatic refresh that reached no quorum
	// was warned of, and cleared by a refresh, automatic or not, that
	// reached one: the warning comes once a run of failures.
	unrefreshed bool
}

// nodeLock is the lock on one node.
type nodeLock struct {
	lock *dlock.Lock // the latest lock obtained on the node, or nil
	live bool        // lock is held: its lease has not ended
	busy bool        // a request to obtain or refresh the lock there is under way
	gone bool        // Release gave it up there
	err  error       // why the node does not hold it
	end  time.Time   // when lock ended there: found not held, or its deadline
	stop func() bool // stops watching lock's end
}

// round collects the outcome of one request to each node; guarded by the
// lock's mutex, because a request may record it after the round is over.
type round struct {
	errs []error
	cut  bool // the caller's context ended before the node timeout
}

// Outcomes of a node in a round, besides nil (done) and its error.
var (
	errPending   = errors.New("pending")   // the request has not returned
	errNotAsked  = errors.New("not asked") // no request went to the node
	errGivenBack = errors.New("granted after the round was over, and given back")
	errBusy      = fmt.Errorf("%w: an earlier request to it is still under way", ErrNodeTimeout)
	errNotThere  = errors.New("never held there")
	errCutShort  = errors.New("no answer yet when the caller's context ended")
)

// newRound starts a round of requests to the nodes in idx, out of n.
func newRound(n int, idx []int) *round {
	rd := &round{errs: make([]error, n)}
	for i := range rd.errs {
		rd.errs[i] = errNotAsked
	}
	for _, i := range idx {
		rd.errs[i] = errPending
	}
	return rd
}

// succeeded returns how many nodes did their part in the round.
func (rd *round) succeeded() int {
	n := 0
	for _, err := range rd.errs {
		if err == nil {
			n++
		}
	}
	return n
}

// TryLock obtains the lock called name on a quorum of the nodes, in one
// round of requests sent to all of them at once, or returns an error at
// once.
//
// The acquisition counts only if a quorum granted the lock and the TTL,
// measured on the monotonic clock from before the first request, less the
// time the round took and an allowance for clock drift (1% of the TTL +
// 2ms), has not run out. Otherwise the lock is released on every node that
// granted it, also on nodes that answer after the node timeout: each
// release has 2s, whatever the node timeout. TryLock waits for them at most
// the node timeout, after the node timeout it may have waited for the
// grants (twice the node timeout in all, when a node that granted the lock
// stalls before its release); those still under way then go on in the
// background, which Locker.Close waits for. The error joins a *NodeError for every node
// that did not grant the lock, and matches:
//   - dlock.ErrNotObtained when the nodes that refused the lock rule out a
//     quorum on their own: it is held by another;
//   - dlock.ErrWrongType or dlock.ErrKindMismatch, and not ErrNotObtained,
//     when those and the nodes that hold other data under the lock's key
//     (data dlock did not write, or another kind of lock) do;
//   - ErrNoQuorum when nodes that failed (or did not answer within the node
//     timeout) could have made the quorum, or when a quorum granted the lock
//     too late for it to be valid: the lock may be free and the nodes are
//     failing or slow, so code that skips its work when the lock is held
//     does not skip it silently while they are down;
//   - none of these, but ctx.Err(), when ctx ended before enough nodes
//     answered to tell: the nodes that had not answered are not blamed
//     (their *NodeError says that the context ended).
//
// The other nodes' own errors (a *dlock.ServerError, dlock.ErrWrongType)
// match in every case; a node's refusal in an error that does not match
// dlock.ErrNotObtained reads as one but does not match it.
//
// The error joins ctx.Err() whenever ctx ended. Bad options come back
// before any request, matching dlock.ErrInvalidArgument.
func (r *Locker) TryLock(ctx context.Context, name string, opts ...Option) (*Lock, error) {
	o, err := r.options(ctx, opts)
	if err != nil {
		return nil, err
	}
	return r.attempt(ctx, name, o)
}

// Lock obtains the lock called name as TryLock does, trying again after a
// random delay (WithRetry) while it is held by another or a quorum cannot
// be reached. It gives up at once when so many nodes refuse for good that
// no quorum is left: they hold other data under the lock's key, or their
// dlock Client was closed, or their server refuses the client for good (a
// missing password or permission, NOPERM; a cluster node through a client
// that follows no redirection, dlock.ErrUnsupported). It gives up when the
// retry strategy stops, when ctx ends, or
// after the WithMaxWait bound (dlock.DefaultMaxWait when ctx has no
// deadline); the error is then the last attempt's (see TryLock), joined
// with ctx.Err() when ctx ended, or, when the end of the wait cut the last
// attempt short before enough nodes answered, that of the attempt before.
func (r *Locker) Lock(ctx context.Context, name string, opts ...Option) (*Lock, error) {
	o, err := r.options(ctx, opts)
	if err != nil {
		return nil, err
	}
	bound := o.maxWait
	if _, ok := ctx.Deadline(); !ok && bound == 0 {
		bound = dlock.DefaultMaxWait
	}
	if bound > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bound)
		defer cancel()
	}
	var answered error // the error of the last attempt that the nodes' answers decided
	for failed := 1; ; failed++ {
		l, err := r.attempt(ctx, name, o)
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, errNoAnswer) {
			answered = err
		} else if answered != nil {
			// The end of the wait cut the last attempt short: the last
			// answers decide, as in package dlock.
			err = answered
		}
		if cerr := ctx.Err(); cerr != nil {
			if !errors.Is(err, cerr) {
				err = errors.Join(err, cerr)
			}
			return nil, err
		}
		if r.final(err) {
			return nil, err
		}
		d, ok := o.retry.NextBackoff(failed)
		if !ok {
			return nil, err
		}
		if serr := sleep(ctx, d); serr != nil {
			return nil, errors.Join(err, serr)
		}
	}
}

// Do runs fn while holding the lock called name: it obtains the lock as
// Lock does, refreshes it automatically, runs fn with a context that is
// cancelled as soon as the lock is known lost, and releases the lock when fn
// returns. It returns fn's error, joined with the loss (matching
// dlock.ErrLost) if the lock was lost while fn ran, the release's finding
// it lost included. If fn panics, Do releases the lock and lets the panic
// go on.
func (r *Locker) Do(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	if fn == nil {
		return fmt.Errorf("%w: Do with a nil function", dlock.ErrInvalidArgument)
	}
	l, err := r.Lock(ctx, name, append([]Option{WithAutoRefresh()}, opts...)...)
	if err != nil {
		return err
	}
	release := func() error {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		return l.Release(rctx)
	}
	returned := false
	defer func() {
		if !returned {
			// fn panicked (or called runtime.Goexit): release now, or a
			// caller that recovers the panic (net/http does) would leave
			// the lock held and refreshed for good.
			_ = release()
		}
	}()
	err = fn(l.Context(ctx))
	returned = true
	lost := l.Err()
	if rerr := release(); rerr != nil && lost == nil {
		// A release that finds the lock gone ends it as lost, which says
		// so (dlock.ErrLost); a failed one says why.
		lost = cmp.Or(l.Err(), rerr)
	}
	return errors.Join(err, lost)
}

// cleanupTimeout bounds the release of a lock obtained on a node for an
// acquisition that failed or was given up, and the release at the end of
// Do.
const cleanupTimeout = 2 * time.Second

// attempt makes one round of requests for the lock.
func (r *Locker) attempt(ctx context.Context, name string, o *options) (*Lock, error) {
	l := &Lock{op: make(chan struct{}, 1), r: r, name: name, token: newToken(), meta: o.meta, ttl: o.ttl, maxHold: o.maxHold,
		nodes: make([]nodeLock, len(r.nodes)), done: make(chan struct{})}
	all := make([]int, len(r.nodes))
	for i := range all {
		all[i] = i
		l.nodes[i].busy = true
	}
	rd := newRound(len(r.nodes), all)
	start := time.Now()
	valid := start.Add(o.ttl - drift(o.ttl))
	cut := r.fanOut(ctx, all, func(ctx context.Context, i int) { l.take(ctx, i, l.token, o.ttl, rd) })

	l.mu.Lock()
	rd.cut = cut
	now := time.Now()
	if l.live >= r.quorum && now.Before(valid) {
		l.held, l.acquired, l.interval = true, start, o.refreshInterval()
		l.mu.Unlock()
		if o.auto && !l.autoRefresh(start) {
			// Close came after the options were checked: no lock that
			// nothing refreshes.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			_ = l.Release(rctx)
			return nil, dlock.ErrClosed
		}
		return l, nil
	}
	l.stopped = true // requests that answer from now on give their node back
	var late time.Duration
	if !now.Before(valid) {
		late = now.Sub(start)
	}
	err := l.failure(ctx, rd, "obtained", late)
	l.mu.Unlock()
	l.end(err)
	// Give each grant back with cleanupTimeout, not the node timeout: a
	// client that honours its context would drop a slower release, and
	// leave the grant there until its TTL. The attempt returns after the
	// node timeout; the releases still under way go on, owned by the
	// Locker (Close waits for them).
	l.releaseAll(context.WithoutCancel(ctx), cleanupTimeout)
	return nil, err
}

// take obtains the lock on node i with token, records the outcome in rd,
// and gives the node back if the Lock no longer wants it.
func (l *Lock) take(ctx context.Context, i int, token string, ttl time.Duration, rd *round) {
	n := l.r.nodes[i]
	// The token is this attempt's alone: its end is recorded on the node,
	// so that a late copy of its request takes nothing there.
	nl, err := n.Client.TryLock(ctx, l.name, append([]dlock.Option{oneUse(token), dlock.WithTTL(ttl), dlock.WithMetadata(l.meta)}, l.r.nodeOpts...)...)
	err = atDeadline(ctx, err)
	var ended context.Context
	if err == nil {
		// Not under l.mu: a lock already past its deadline ends here, and
		// runs the node client's End hook, which may call this Lock.
		ended = nl.Context(context.Background())
	}
	l.mu.Lock()
	s := &l.nodes[i]
	s.busy = false
	rd.errs[i] = err
	switch {
	case err != nil:
		s.err = err
	case l.stopped:
		rd.errs[i] = errGivenBack
		l.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = friend.GiveBack(ctx, nl) // one that gets no answer goes on in the background
		return
	default:
		l.install(i, nl, ended)
	}
	l.mu.Unlock()
}

// install records the lock held on node i and watches for its end; l.mu
// must be held.
func (l *Lock) install(i int, nl *dlock.Lock, ended context.Context) {
	s := &l.nodes[i]
	if s.stop != nil {
		s.stop()
	}
	s.lock, s.live, s.err = nl, true, nil
	l.live++
	l.setDueLocked()
	s.stop = context.AfterFunc(ended, func() {
		if l.lose(i, nl, nl.Err()) {
			l.endLost()
		}
	})
}

// lose records that the lock on node i, nl, has ended (released when err is
// nil), and reports whether the Lock lost its quorum by it; l.mu must not be
// held.
func (l *Lock) lose(i int, nl *dlock.Lock, err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.loseLocked(i, nl, err)
}

// loseLocked is lose; l.mu must be held. A node's loss that leaves a
// quorum holding the Lock is kept for logging (see logKept).
func (l *Lock) loseLocked(i int, nl *dlock.Lock, err error) bool {
	s := &l.nodes[i]
	if s.lock != nl || !s.live {
		return false
	}
	s.live, s.end = false, time.Now()
	if d := nl.Deadline(); d.Before(s.end) {
		s.end = d // a timer that ran late, or a process that was paused
	}
	if err != nil {
		if s.err != nil {
			// Its refreshes there failed until it ran out: say why, in
			// words (as a dlock lock whose watchdog's refreshes failed
			// does), since a failure such as a deadline must not make the
			// loss match it.
			err = fmt.Errorf("%w (the last refresh there failed: %s)", err, causes.Unprefixed(s.err))
		}
		s.err = err
	}
	l.live--
	lost := l.held && !l.stopped && l.live < l.r.quorum
	switch {
	case lost:
		// The loss of the Lock says why, with every node's cause.
		l.kept = nil
	case l.held && !l.stopped && s.err != nil:
		l.kept = append(l.kept, nodeLoss{node: i, err: s.err})
	}
	if lost && l.lostAt.IsZero() {
		l.lostAt = l.quorumEndLocked()
	}
	l.setDueLocked()
	return lost
}

// nodeLoss is a node's loss of its copy of a Lock that a quorum still
// held then.
type nodeLoss struct {
	node int
	err  error // why (see nodeLock.err)
}

// logKept queues the records of the nodes' losses kept since it was last
// called, if the Lock is still held: at the start of a refresh, for those
// its deadlines and late answers found meanwhile, and at its end, for
// those it found. Not at once: nodes lost together (refused in one round,
// or run out at one deadline) would each say that the quorum still holds
// the Lock, just before it is lost, which the Lock's loss says once, with
// their causes. It is called within op's turn, whose end writes them (see
// opDone); a loss found meanwhile is queued, and so written, after them.
// l.mu must not be held.
func (l *Lock) logKept() {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept, held := l.kept, l.live
	l.kept = nil
	if l.aliveLocked() != nil || held < l.r.quorum {
		return
	}
	// An info record, not a warning: the lock is held. But a node that
	// came back empty (restarted without persistence) can give another
	// locker the vote it needs, which an operator may want to know.
	for _, k := range kept {
		l.logs = append(l.logs, func() {
			l.r.log.Info("redlock: a node lost the lock; the quorum still holds it", "names", l.logNames(),
				"node", k.node, "addr", l.r.nodes[k.node].Addr, "held", held, "quorum", l.r.quorum, "err", k.err)
		})
	}
}

// logRefreshFailed warns that an automatic refresh reached no quorum,
// failing with err, unless a warning was given since the last refresh that
// reached one, or the Lock has ended, whose records say how: a record that
// it is held goes no later than its end's. Called outside op's turn.
// l.mu must not be held.
func (l *Lock) logRefreshFailed(err error) {
	l.mu.Lock()
	select {
	case <-l.done:
		l.mu.Unlock()
		return
	default:
	}
	if l.unrefreshed {
		l.mu.Unlock()
		return
	}
	l.unrefreshed = true
	l.logs = append(l.logs, func() {
		l.r.log.Warn("redlock: refresh did not reach a quorum; retrying until the lock's deadline", "names", l.logNames(), "err", err)
	})
	l.mu.Unlock()
	l.writeLogs()
}

// writeLogs writes the queued records, in order, unless another goroutine
// is writing them, which then writes these too. It writes under no lock:
// a handler that calls this Lock's methods (a Release of the lock it is
// told is lost) queues their records after the one it is given, and
// returns. It is called outside op's turn: by opDone, and by endAs when
// nobody has the turn (whoever has it writes the records at its end).
// l.mu must not be held.
func (l *Lock) writeLogs() {
	l.mu.Lock()
	if l.writing {
		l.mu.Unlock()
		return
	}
	l.writing = true
	for len(l.logs) > 0 {
		logs := l.logs
		l.logs = nil
		l.mu.Unlock()
		l.write(logs)
		l.mu.Lock()
	}
	l.writing = false
	l.mu.Unlock()
}

// write writes records for writeLogs. A handler's panic goes on to the
// caller once the records after that one are written, with those queued
// meanwhile: whoever queued them left them to this goroutine, and a
// record left queued would wait for a later call of the Lock's, or for
// ever.
func (l *Lock) write(logs []func()) {
	i := 0
	defer func() {
		if i < len(logs) { // the record i panicked
			l.mu.Lock()
			l.logs = append(logs[i+1:], l.logs...)
			l.writing = false
			l.mu.Unlock()
			l.writeLogs()
		}
	}()
	for ; i < len(logs); i++ {
		logs[i]()
	}
}

// quorumEndLocked returns when fewer than a quorum of the nodes came to
// hold the lock, once they have: the quorum-th latest of the nodes' ends,
// a live node's being its deadline; l.mu must be held.
func (l *Lock) quorumEndLocked() time.Time {
	ends := make([]time.Time, 0, len(l.nodes))
	for _, s := range l.nodes {
		switch {
		case s.live:
			ends = append(ends, s.lock.Deadline())
		case !s.end.IsZero():
			ends = append(ends, s.end)
		}
	}
	if len(ends) < l.r.quorum {
		return time.Now()
	}
	return l.quorumLatest(ends)
}

// quorumLatest returns the quorum-th latest of ts, which holds at least a
// quorum of times; it reorders ts.
func (l *Lock) quorumLatest(ts []time.Time) time.Time {
	slices.SortFunc(ts, func(a, b time.Time) int { return b.Compare(a) })
	return ts[l.r.quorum-1]
}

// setDueLocked records the quorum deadline for expireIfDue; l.mu must be
// held, and it is called whenever a node's lock is installed, refreshed or
// lost, the only ways the deadline moves.
func (l *Lock) setDueLocked() {
	if d := l.deadlineLocked(); d.IsZero() {
		l.due.Store(nil)
	} else {
		l.due.Store(&d)
	}
}

// expireIfDue ends the lock when its deadline has passed by the clock, as
// a dlock lock does when its holder looks: a process that was paused past
// the deadline finds the lock ended the moment it looks, not once the
// timers of its nodes have run. Before the deadline it costs a clock read.
func (l *Lock) expireIfDue() {
	if d := l.due.Load(); d != nil && time.Now().Before(*d) {
		return
	}
	select {
	case <-l.done:
		return
	default:
	}
	l.mu.Lock()
	if !l.held || l.stopped {
		l.mu.Unlock()
		return
	}
	now := time.Now()
	if d := l.deadlineLocked(); !d.IsZero() && now.Before(d) {
		l.mu.Unlock()
		return
	}
	var due []int
	locks := make([]*dlock.Lock, len(l.nodes))
	for i, s := range l.nodes {
		if s.live && !now.Before(s.lock.Deadline()) {
			due, locks[i] = append(due, i), s.lock
		}
	}
	l.mu.Unlock()
	// Err ends a node's lock past its deadline, and runs the node client's
	// End hook, which may call this Lock: not under l.mu. Its end, watched
	// by install, then finds the node recorded already.
	errs := make([]error, len(l.nodes))
	for _, i := range due {
		errs[i] = locks[i].Err()
	}
	l.mu.Lock()
	for _, i := range due {
		if errs[i] != nil { // not refreshed meanwhile
			l.loseLocked(i, locks[i], errs[i])
		}
	}
	// Whoever recorded the last loss (the watcher of a node's end may
	// have, meanwhile), the caller must find the lock ended on return.
	lost := l.held && !l.stopped && l.live < l.r.quorum
	l.mu.Unlock()
	if lost {
		l.endLost()
	}
}

// endIfLost ends the Lock as lost when a node's watcher recorded the
// quorum's loss (see install) and has yet to end it: a Release or a
// Refresh that comes between goes on from the loss, as Err will say it.
func (l *Lock) endIfLost() {
	l.mu.Lock()
	lost := l.held && !l.stopped && l.live < l.r.quorum
	l.mu.Unlock()
	if lost {
		l.endLost()
	}
}

// endLost ends the Lock because fewer than a quorum of its nodes hold it.
func (l *Lock) endLost() {
	l.mu.Lock()
	held := l.live
	var errs []error
	for i, s := range l.nodes {
		if !s.live && s.err != nil {
			errs = append(errs, l.nodeError(i, hideRefusal(s.err)))
		}
	}
	why := error(nil)
	if !l.capEnd.IsZero() && !l.lostAt.Before(l.capEnd) { // set once capped
		// Lost when the last refresh the max hold allowed ran out, not
		// earlier for another reason.
		why = dlock.ErrMaxHold
	}
	l.mu.Unlock()
	var top error = fmt.Errorf("%w: %s is held on %d of %d nodes, below the quorum of %d", dlock.ErrLost, causes.Quote(l.name), held, len(l.nodes), l.r.quorum)
	if why != nil {
		top = &causes.Error{Msg: top.Error() + ": " + causes.Unprefixed(why), Errs: []error{top, why}}
	}
	l.end(errors.Join(append([]error{top}, errs...)...))
}

// failure builds the error of a round that did not reach a quorum, from
// the nodes' outcomes in rd; l.mu must be held. late is set for an
// acquisition whose validity ran out during the round: how long the round
// took.
//
// An acquisition's error says what decided it. It matches
// dlock.ErrNotObtained only when the nodes that refused the lock rule out
// a quorum on their own (it is held by another). Else, when those and the
// nodes that hold other data under its key do, it matches their errors
// (dlock.ErrWrongType, dlock.ErrKindMismatch) and not ErrNotObtained. Else,
// when the nodes that failed could have made the quorum (or a quorum
// granted it too late), it matches ErrNoQuorum: the lock may be free. Else
// the caller's context ended before enough nodes answered to tell, and it
// matches neither (errNoAnswer marks it, see Locker.Lock). Refusals in an
// error that does not match dlock.ErrNotObtained are wrapped so that they
// do not make it match, as are those in the error of a refresh or a
// release.
func (l *Lock) failure(ctx context.Context, rd *round, did string, late time.Duration) error {
	got, refused, foreign, failing, cutShort := 0, 0, 0, 0, 0
	type outcome struct {
		node int
		err  error
	}
	var outs []outcome
	for i, err := range rd.errs {
		if rd.cut && (err == errPending || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			// Not the node's failure: the caller's context ended first.
			cutShort++
			outs = append(outs, outcome{i, errCutShort})
			continue
		}
		switch {
		case err == errPending:
			err = fmt.Errorf("%w (%v)", ErrNodeTimeout, l.r.timeout)
		case err == errNotAsked && l.nodes[i].gone:
			// Released by an earlier Release: it did its part. What
			// ended its lock there before (a loss by the local clock,
			// say) is no failure of this release, nor a loss of the
			// Lock.
			err = nil
		case err == errNotAsked:
			if err = l.nodes[i].err; err == nil {
				err = errNotThere
			}
		case errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrNodeTimeout):
			// The node timeout's (the caller's context did not end), as
			// a client that honours its context reports it.
			err = fmt.Errorf("%w (%v): %w", ErrNodeTimeout, l.r.timeout, err)
		}
		switch {
		case err == nil:
			got++
			continue
		case errors.Is(err, dlock.ErrInvalidArgument):
			return err // the same on every node, and found before any request
		case errors.Is(err, dlock.ErrNotObtained):
			refused++
		case errors.Is(err, dlock.ErrWrongType), errors.Is(err, dlock.ErrKindMismatch):
			foreign++
		default:
			failing++
		}
		outs = append(outs, outcome{i, err})
	}
	n, q := len(l.nodes), l.r.quorum
	top := fmt.Errorf("redlock: %s %s on %d of %d nodes, quorum %d", causes.Quote(l.name), did, got, n, q)
	if did == "obtained" {
		switch {
		case late > 0 && got >= q:
			top = fmt.Errorf("%w: %s obtained on %d of %d nodes, quorum %d, but the round took %v, past the validity of the TTL", ErrNoQuorum, causes.Quote(l.name), got, n, q, late)
		case refused > n-q:
			top = fmt.Errorf("%w: %s obtained on %d of %d nodes, quorum %d", dlock.ErrNotObtained, causes.Quote(l.name), got, n, q)
		case refused+foreign > n-q:
			top = fmt.Errorf("redlock: %s obtained on %d of %d nodes, quorum %d; %d hold other data under its key", causes.Quote(l.name), got, n, q, foreign)
		case got+failing >= q:
			top = fmt.Errorf("%w: %s obtained on %d of %d nodes, quorum %d; %d failed", ErrNoQuorum, causes.Quote(l.name), got, n, q, failing)
		default:
			top = fmt.Errorf("%w: %s obtained on %d of %d nodes, quorum %d", errNoAnswer, causes.Quote(l.name), got, n, q)
		}
	}
	if cutShort > 0 {
		top = fmt.Errorf("%w; the caller's context ended before %d of them answered", top, cutShort)
	}
	hide := !errors.Is(top, dlock.ErrNotObtained)
	errs := []error{top}
	for _, o := range outs {
		if hide {
			o.err = hideRefusal(o.err)
		}
		errs = append(errs, l.nodeError(o.node, o.err))
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}

// errNoAnswer marks the error of an acquisition that the caller's context
// cut short before enough nodes answered to tell whether the lock is held.
var errNoAnswer = errors.New("redlock: not known whether held")

// refusal is a node's refusal in an acquisition that something else
// decided: it reads as the node's error, but does not match
// dlock.ErrNotObtained, which the acquisition's error must not match then.
type refusal struct{ err error }

func (r refusal) Error() string { return r.err.Error() }

// hideRefusal returns a node's error so that it does not match
// dlock.ErrNotObtained: a node that refused the lock, in the error of a
// refresh, a release or a loss of a lock that was obtained, must not make
// that error read as "held by another, not obtained" (code that skips its
// work on ErrNotObtained would take work done for work skipped).
func hideRefusal(err error) error {
	if errors.Is(err, dlock.ErrNotObtained) {
		return refusal{err}
	}
	return err
}

func (l *Lock) nodeError(i int, err error) error {
	return &NodeError{Node: i, Addr: l.r.nodes[i].Addr, Err: err}
}

// final reports whether an acquisition failed in a way that trying again
// will not change: more nodes than the quorum can spare hold data under
// the lock's key that is not a dlock lock of this kind.
func (r *Locker) final(err error) bool {
	n := 0
	for _, e := range joined(err) {
		// A node whose dlock Client was closed refuses every acquire for
		// good too, as does one whose server refuses the client for good
		// (NOPERM, NOAUTH; a cluster node through a client that follows no
		// redirection: ErrUnsupported).
		if errors.Is(e, dlock.ErrWrongType) || errors.Is(e, dlock.ErrKindMismatch) || errors.Is(e, dlock.ErrClosed) ||
			friend.RefusedForGood(e) {
			n++
		}
	}
	// ErrClosed is final also when the Locker itself closed.
	return n > len(r.nodes)-r.quorum || errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrClosed) && r.isClosed()
}

// joined returns the errors joined in err, or err alone.
func joined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// releaseAll releases the lock on every node that holds it or may, each
// request bounded by timeout, and returns the outcomes once all have
// returned or the node timeout has passed; nodes whose request to obtain
// it is still under way give it back themselves.
func (l *Lock) releaseAll(ctx context.Context, timeout time.Duration) *round {
	l.mu.Lock()
	var idx []int
	locks := make([]*dlock.Lock, len(l.nodes))
	for i, s := range l.nodes {
		if s.lock != nil && !s.gone {
			idx = append(idx, i)
			locks[i] = s.lock
		}
	}
	rd := newRound(len(l.nodes), idx)
	l.mu.Unlock()
	cut := l.r.fanOutFor(ctx, idx, timeout, func(ctx context.Context, i int) {
		err := atDeadline(ctx, friend.GiveBack(ctx, locks[i]))
		l.mu.Lock()
		rd.errs[i] = err
		if err == nil && l.released {
			// Counted by a later Release too when it came back after
			// the node timeout.
			l.nodes[i].gone = true
		}
		l.mu.Unlock()
	})
	l.mu.Lock()
	rd.cut = cut
	l.mu.Unlock()
	return rd
}

// Release gives the lock up on every node that holds it (or held it and may
// still: a node whose lock ran out only by the local clock). It returns nil
// if a quorum of nodes released it. Otherwise its error is joined with a
// *NodeError for every node that did not, and matches ErrNoQuorum when some
// of them failed (did not answer, or refused the request: a denial, which
// matches dlock.ErrDenied, too) and, with those released, a quorum would be
// (Release may be called again, and retries just those),
// or dlock.ErrNotHeld when too many answered that they no longer held it for
// that (and dlock.ErrLost: it was lost before its release, as Err then says,
// unless an earlier Release had given it up). A Lock that had ended as lost
// before Release was called (Done closed: its deadline passed without a
// refresh, a refresh found it gone, WithMaxHold ended it) returns the loss
// Err reports, matching dlock.ErrNotHeld and dlock.ErrLost (and
// dlock.ErrMaxHold when the max hold ended it), whatever its nodes answer
// (joined with a *NodeError for each node that did not release it then):
// those that still hold it (for the drift allowance, say) give it back all
// the same, but the work done under it may have outlived the time it was
// safe; so does one called once the deadline has passed, though nothing had
// seen it pass yet. A node that did not answer in time, or that refused the
// release before running it for all that time (BUSY with another client's
// script, NOREPLICAS; or its client library had no connection free, or
// could not connect to it: a node restarting, or failing over), is
// given the lock back in the background once it answers (for up to a minute,
// or until the node's client is closed), or keeps it until its TTL runs out
// there. A release that comes back after the node timeout counts for the
// next Release. Done is closed once the first Release returns; Err is then
// nil if that call released a quorum, else its error (see Err), or the loss
// for a Lock lost before. Once Release has returned nil or dlock.ErrNotHeld,
// later calls return dlock.ErrNotHeld (the loss again, when that is what it
// returned), also those called at once with it: Releases of one Lock run one
// after the other. A ctx that has already ended when Release is called (that
// of a request a deferred Release belongs to, say) does not stop it: Release
// then keeps ctx's values, each node's request bounded by the node timeout.
//
// Release panics if l is nil: check the error of the call that obtained it.
func (l *Lock) Release(ctx context.Context) error {
	if l == nil {
		panic("redlock: Release of a nil *Lock")
	}
	l.made()
	if ctx == nil {
		return dlock.ErrNilContext
	}
	l.opStart()
	defer l.opDone()
	// A deadline passed that nothing has seen yet: lost before. So is a
	// quorum whose loss a node's watcher recorded (see install) and has
	// yet to end the Lock with: Release returns the loss that Err will say.
	l.expireIfDue()
	l.endIfLost()
	l.logKept()
	l.mu.Lock()
	if l.settled {
		out := l.relOut
		l.mu.Unlock()
		if errors.Is(out, dlock.ErrLost) {
			return out // the first found it lost before: it says so again
		}
		return fmt.Errorf("%w: %s was already released", dlock.ErrNotHeld, causes.Quote(l.name))
	}
	var lost error // lost before: Release gives back what is left, and says so
	if l.stopped && !l.released {
		lost = l.err
	}
	if !l.released {
		l.relAt = time.Now()
		d := l.deadlineLocked()
		if d.IsZero() {
			d = l.lostAt // lost, and not ended yet
		}
		if !d.IsZero() && d.Before(l.relAt) {
			l.relAt = d
		}
	}
	l.released, l.stopped = true, true
	l.mu.Unlock()

	if ctx.Err() != nil {
		ctx = context.WithoutCancel(ctx) // each request has the node timeout
	}
	rd := l.releaseAll(ctx, l.r.timeout)
	l.mu.Lock()
	freed, unknown := 0, 0
	for i, e := range rd.errs {
		switch {
		case e == nil, errors.Is(e, errNotAsked), errors.Is(e, dlock.ErrNotHeld):
			// Released (releaseAll marked it gone), not asked (gone
			// before, or never held), or not held there.
		default:
			if !l.nodes[i].gone {
				unknown++ // no answer, or a failure: it may hold it still
			}
		}
		if l.nodes[i].gone {
			freed++
		}
	}
	var err error
	retry := false // of unknown outcome: Release again retries
	switch {
	case lost != nil:
		// Whatever its nodes hold now, the work done under the lock may
		// have outlived the time it was safe: the loss is the answer.
		// The nodes that did not answer are given back in the background.
		l.settled = true
		err = friend.LostNotHeld(lost)
		if slices.ContainsFunc(rd.errs, func(e error) bool { return e != nil }) {
			// With a *NodeError for every node that did not release it
			// now (not held there, or of unknown outcome).
			err = errors.Join(err, l.failure(ctx, rd, "released", 0))
		}
	case freed >= l.r.quorum:
		l.settled = true
		if l.relFailed {
			// An earlier Release did not reach a quorum; this one did.
			l.err, l.relFailed = nil, false
		}
	case unknown > 0 && freed+unknown >= l.r.quorum:
		// A quorum may still be released: Release again retries.
		retry = true
		hideNotHeld(rd.errs)
		err = l.failure(ctx, rd, "released", 0)
		err = errors.Join(fmt.Errorf("%w: %s released on %d of %d nodes; Release again retries the others", ErrNoQuorum, causes.Quote(l.name), freed, len(l.nodes)), err)
	default:
		l.settled = true
		err = l.failure(ctx, rd, "released", 0)
		err = errors.Join(fmt.Errorf("%w: %s", dlock.ErrNotHeld, causes.Quote(l.name)), err)
		if l.relFailed {
			// Given up by an earlier Release: nothing is left to retry.
			l.err, l.relFailed = err, false
		} else {
			// Found gone: this Release ends the lock as lost, as Err then
			// says, and says so too.
			err = &causes.Error{Msg: err.Error(), Errs: []error{err, dlock.ErrLost}}
		}
	}
	if l.settled {
		l.relOut = err
	}
	l.mu.Unlock()
	switch {
	case retry:
		// Not lost: given up by its holder, though not yet everywhere.
		l.endReleaseFailed(err)
	case err != nil:
		l.end(causes.Because(dlock.ErrLost, err))
	default:
		l.end(nil)
	}
	return err
}

// hideNotHeld rewrites the nodes' errors that match dlock.ErrNotHeld so
// that they no longer do: where the lock is still held, or its release may
// yet reach a quorum, a node's "not held" must not make the whole error
// match it.
func hideNotHeld(errs []error) {
	for i, err := range errs {
		if errors.Is(err, dlock.ErrNotHeld) {
			errs[i] = fmt.Errorf("the lock is gone there (%v)", err)
		}
	}
}

// endReleaseFailed ends the lock with the error of a Release that did not
// reach a quorum, unless it had ended before.
func (l *Lock) endReleaseFailed(err error) { l.endAs(err, true) }

// Refresh resets the lock's TTL to ttl on every node that holds it, and
// obtains it again, with a new token for each such attempt, on the nodes
// that lost it (a node that restarted without persistence, say) or never
// granted it; all at
// once, each request bounded by the node timeout. It returns nil if a
// quorum of nodes now hold it for ttl, and moves the deadline accordingly.
//
// Otherwise it returns an error joined with a *NodeError for every node
// that failed: one matching dlock.ErrNotHeld when fewer than a quorum of
// nodes still hold the lock (it is lost: Done is closed, Err matches
// dlock.ErrLost), or one matching ErrNoQuorum, and not dlock.ErrNotHeld,
// when a quorum still holds it but fewer than a quorum refreshed it: the
// lock then stays held until its deadline, and a later Refresh may
// succeed. WithAutoRefresh tries again within 250ms in that case.
//
// The automatic refresh goes on with the TTL of the last Refresh, so while
// WithAutoRefresh refreshes the lock (not after Locker.Close, nor once the
// max hold stopped it) a TTL whose deadline (less the drift allowance) does
// not come after the refresh interval is refused with dlock.ErrInvalidTTL;
// so is one under dlock.MinTTL, or not longer, less that allowance, than
// the node timeout. Refreshes and Releases of one Lock run one after the
// other: a Refresh waits for one under way only while ctx lasts.
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	l.made()
	if ctx == nil {
		return dlock.ErrNilContext
	}
	if ttl < dlock.MinTTL {
		return fmt.Errorf("%w: %v is under the minimum of %v", dlock.ErrInvalidTTL, ttl, dlock.MinTTL)
	}
	if ttl-drift(ttl) <= l.r.timeout {
		return fmt.Errorf("%w: the TTL %v, less %v for clock drift, is not longer than the node timeout %v", dlock.ErrInvalidTTL, ttl, drift(ttl), l.r.timeout)
	}
	// Within ctx: a Release or an automatic refresh under way may wait
	// for its nodes up to the node timeout (after Locker.Close, for all of
	// its requests).
	// A free turn is taken whatever ctx: a select would pick an ended
	// ctx half the time, and say it waited for nothing.
	select {
	case l.op <- struct{}{}:
	default:
		select {
		case l.op <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("redlock: %s: Refresh waited for the Release or refresh under way: %w", causes.Quote(l.name), ctxEnd(ctx))
		}
	}
	defer l.opDone()
	return l.refresh(ctx, ttl, true)
}

// made panics unless a Locker made l: a zero Lock has no nodes, and its
// Release and Refresh would wait for ever for their turn.
func (l *Lock) made() {
	if l.r == nil {
		panic("redlock: Lock used without Locker.TryLock or Locker.Lock (the zero Lock is not usable)")
	}
}

// opStart waits for the Refresh or Release under way, if any, to end, and
// takes its turn; opDone ends it, and writes the records queued meanwhile
// (see writeLogs).
func (l *Lock) opStart() { l.op <- struct{}{} }
func (l *Lock) opDone() {
	<-l.op
	l.writeLogs()
}

// refresh is Refresh; l.op must be held. manual is set for a call of
// Refresh, which a running automatic refresh goes on from.
func (l *Lock) refresh(ctx context.Context, ttl time.Duration, manual bool) error {
	l.expireIfDue()
	l.endIfLost() // not taken again on the nodes that lost it
	l.logKept()   // those that ran out, or answered late, since the last round
	l.mu.Lock()
	if err := l.aliveLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	if manual && l.interval > 0 && !l.capped && l.r.bg.Err() == nil && ttl-drift(ttl) <= l.interval {
		// The automatic refresh, which goes on with this TTL, would come
		// after the deadline.
		l.mu.Unlock()
		return fmt.Errorf("%w: the TTL %v, less %v for clock drift, is not longer than the auto-refresh interval %v", dlock.ErrInvalidTTL, ttl, drift(ttl), l.interval)
	}
	var idx []int
	locks := make([]*dlock.Lock, len(l.nodes))
	busy := make([]bool, len(l.nodes))
	for i := range l.nodes {
		s := &l.nodes[i]
		if s.busy {
			busy[i] = true // an earlier round's request is still under way
			continue
		}
		if s.live {
			locks[i] = s.lock
		}
		s.busy = true // refresh it, or obtain it again
		idx = append(idx, i)
	}
	rd := newRound(len(l.nodes), idx)
	for i := range busy {
		if busy[i] {
			rd.errs[i] = errBusy
		}
	}
	// While the round runs, a node's deadline may move earlier (a shorter
	// TTL whose outcome is unknown): the clock check takes its slow path
	// from where that would put it.
	if d := l.due.Load(); d != nil {
		if bound := time.Now().Add(ttl - drift(ttl)); bound.Before(*d) {
			l.due.Store(&bound)
		}
	}
	l.mu.Unlock()

	caller := ctx
	cut := l.r.fanOut(ctx, idx, func(ctx context.Context, i int) {
		nl := locks[i]
		if nl == nil {
			// A token of its own for each attempt to take a node again:
			// an earlier attempt whose reply was lost sent a clean-up,
			// which may run late, and must not free this one's hold.
			l.take(ctx, i, newToken(), ttl, rd)
			return
		}
		err := atDeadline(ctx, nl.Refresh(ctx, ttl))
		lost := false
		l.mu.Lock()
		s := &l.nodes[i]
		s.busy = false
		rd.errs[i] = err
		switch {
		case s.lock != nl || !s.live:
			// Its lock there ended while the refresh was on its way (its
			// deadline passed): the loss recorded then says why.
		case errors.Is(err, dlock.ErrNotHeld):
			s.err = nil // the node's answer says why
			lost = l.loseLocked(i, nl, err)
		case err != nil && caller.Err() != nil && errors.Is(err, caller.Err()):
			// Cut short by its caller: it says nothing of the node.
		default:
			// Why the last refresh there failed, while it fails; told
			// with the loss if it runs out there (see loseLocked).
			s.err = err
		}
		// The node's deadline moved: later when refreshed, or earlier when
		// a shorter TTL's outcome is unknown.
		l.setDueLocked()
		l.mu.Unlock()
		if lost {
			l.endLost()
		}
	})

	l.expireIfDue()
	l.logKept() // those this round found, unless the lock is lost
	l.mu.Lock()
	rd.cut = cut
	if err := l.aliveLocked(); err != nil {
		// The lock ended while the round ran (its deadline passed, say):
		// a refresh that came back too late does not bring it back.
		// Release gives back the nodes it extended.
		l.mu.Unlock()
		return err
	}
	if rd.succeeded() >= l.r.quorum {
		l.ttl, l.unrefreshed = ttl, false
		l.mu.Unlock()
		return nil
	}
	live := l.live
	if live >= l.r.quorum {
		hideNotHeld(rd.errs) // still held
	}
	err := l.failure(ctx, rd, "refreshed", 0)
	l.mu.Unlock()
	if live < l.r.quorum {
		l.endLost()
		return errors.Join(fmt.Errorf("%w: %s", dlock.ErrNotHeld, causes.Quote(l.name)), err)
	}
	return errors.Join(ErrNoQuorum, err)
}

// aliveLocked returns nil while the lock is held, or why it is not; l.mu
// must be held.
func (l *Lock) aliveLocked() error {
	switch {
	case l.released:
		return fmt.Errorf("%w: %s was released", dlock.ErrNotHeld, causes.Quote(l.name))
	case l.stopped:
		return causes.Also(dlock.ErrNotHeld, l.err)
	}
	return nil
}

// autoRefresh starts the goroutine that refreshes the lock every interval,
// counted from the start of the round that obtained it (from) and of each
// refresh, as the nodes count their deadlines from when the request was
// sent: a round that waits for a slow node does not delay the next. It
// reports false after Locker.Close, which lets no goroutine start.
func (l *Lock) autoRefresh(from time.Time) bool {
	interval := l.interval
	return l.r.goOwned(func() {
		timer := time.NewTimer(interval - time.Since(from))
		defer timer.Stop()
		for {
			select {
			case <-l.done:
				return
			case <-l.r.bg.Done():
				return
			case <-timer.C:
			}
			// The TTL is read once no Refresh runs: one that the tick
			// waited for sets the TTL this one must go on with.
			l.opStart()
			from = time.Now()
			ttl, last, ok := l.nextRefresh(from)
			if !ok {
				l.opDone()
				return // the max hold allows no more: the nodes' deadlines end it
			}
			err := l.refresh(l.r.bg, ttl, false)
			l.opDone()
			select {
			case <-l.done:
				return // lost (or released meanwhile)
			case <-l.r.bg.Done():
				// Close cut the round short: not the nodes' failure, and
				// nothing retries it.
				return
			default:
			}
			switch {
			case err == nil && last:
				return
			case err == nil:
				timer.Reset(interval - time.Since(from))
			default:
				// Not refreshed on a quorum, but still held on one: try
				// again soon, until the nodes' deadlines end the lock.
				// Warned of once a run of failures: it is retried up to
				// four times a second.
				l.logRefreshFailed(err)
				timer.Reset(min(interval/4, maxRetryDelay))
			}
		}
	})
}

// maxRetryDelay bounds the wait before an automatic refresh that did not
// reach a quorum is tried again.
const maxRetryDelay = 250 * time.Millisecond

// nextRefresh returns the TTL for a refresh sent now: the lock's TTL, or
// less when WithMaxHold ends the lock sooner; last is true when this is the
// final refresh the max hold allows, and ok false when it allows none.
func (l *Lock) nextRefresh(now time.Time) (ttl time.Duration, last, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ttl = l.ttl
	if l.maxHold <= 0 {
		return ttl, false, true
	}
	left := l.acquired.Add(l.maxHold).Sub(now)
	if left <= ttl {
		l.capped = true
		ok = left-drift(left) > l.r.timeout
		switch {
		case ok:
			// The nodes' deadlines of this last refresh, less a margin
			// for the TTL kept in whole milliseconds; at least past every
			// node's deadline now, which a loss for this refresh's failure
			// comes by.
			l.capEnd = l.acquired.Add(l.maxHold - drift(left) - 5*time.Millisecond)
			for _, s := range l.nodes {
				if !s.live {
					continue
				}
				if d := s.lock.Deadline(); !l.capEnd.After(d) {
					l.capEnd = d.Add(time.Microsecond)
				}
			}
		case l.capEnd.IsZero():
			// No last refresh, nor one tried (whose failure would be
			// the loss's cause): the lock runs out at the deadline it has.
			l.capEnd = l.deadlineLocked()
		}
		return left, true, ok
	}
	return ttl, false, true
}

// end closes the lock with err (nil for a release). Only the first call
// counts.
func (l *Lock) end(err error) { l.endAs(err, false) }

// endAs is end; relFailed says that err is that of a Release that did not
// reach a quorum, which a later Release may replace.
func (l *Lock) endAs(err error, relFailed bool) {
	l.mu.Lock()
	select {
	case <-l.done:
		l.mu.Unlock()
		return
	default:
	}
	l.relFailed = relFailed
	l.ended = l.deadlineLocked()
	if l.ended.IsZero() {
		l.ended = l.lostAt // the quorum is gone already
	}
	if now := time.Now(); l.ended.IsZero() || l.ended.After(now) {
		l.ended = now
	}
	if !l.relAt.IsZero() && l.relAt.Before(l.ended) {
		l.ended = l.relAt // released: not to be relied on from then
	}
	l.stopped, l.err, l.kept = true, err, nil
	close(l.done)
	fns := l.onEnd
	l.onEnd = nil
	if l.held && errors.Is(err, dlock.ErrLost) {
		// Once, for the Lock: its nodes' clients log their nodes'
		// losses as debug records (see quorumPart). Queued after the
		// records of a logKept that found the Lock held.
		l.logs = append(l.logs, func() {
			l.r.log.Warn("redlock: lock lost", "names", l.logNames(), "err", err)
		})
	}
	l.mu.Unlock()
	for _, f := range fns {
		f()
	}
	// A Refresh or a Release that has the turn (maybe on this goroutine)
	// writes the records at its end, which comes after they were queued.
	// When nobody has it (a node's deadline, or a look at the Lock, found
	// the loss), they are written now.
	if len(l.op) == 0 {
		l.writeLogs()
	}
}

// Done returns a channel that is closed when the lock ends: when it is
// released, or the moment fewer than a quorum of its nodes hold it (a
// refresh found it gone from nodes, or their deadlines passed without a
// refresh). Err then says which.
func (l *Lock) Done() <-chan struct{} {
	l.made()
	l.expireIfDue()
	return l.done
}

// Err returns nil while the lock is held and after a release that reached
// a quorum, and an error wrapping dlock.ErrLost once the lock was lost,
// joined with a *NodeError for each node that lost it (one whose lock ran
// out there after refreshes failed says why the last one did, a
// permission its ACL user lost, say, in words only: the loss does not
// match that refresh's error): dlock.ErrMaxHold
// when WithMaxHold ended it. After a Release that did not reach a quorum it
// returns that Release's error, which matches ErrNoQuorum, not
// dlock.ErrLost (the holder gave the lock up), until a later Release
// reaches a quorum (then nil) or finds nothing left to retry (then its
// error, matching dlock.ErrNotHeld). A Context whose lock ended so keeps
// the first Release's error as its cause.
func (l *Lock) Err() error {
	l.made()
	l.expireIfDue()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Deadline returns when the lock stops being safe to rely on without a
// refresh: the moment fewer than a quorum of nodes are known to hold it.
// Each node's deadline is its TTL measured from before the request that
// obtained or last refreshed it there, less an allowance for clock drift
// (1% of the TTL + 2ms); Deadline is the quorum-th latest of them, which
// at the acquisition is no earlier than the TTL less the time the round
// took and the drift, from before the first request. From when Release
// is first called, it returns that time (or the deadline, if that came
// first), also while that Release runs; once Done is closed, when the lock
// ended, or its deadline if that came first.
func (l *Lock) Deadline() time.Time {
	l.made()
	l.expireIfDue()
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.done:
		return l.ended
	default:
	}
	if !l.relAt.IsZero() {
		return l.relAt
	}
	return l.deadlineLocked()
}

// deadlineLocked is the quorum-th latest deadline of the nodes that hold
// the lock, or the zero time when fewer than a quorum do; l.mu must be held.
func (l *Lock) deadlineLocked() time.Time {
	ds := make([]time.Time, 0, len(l.nodes))
	for _, s := range l.nodes {
		if s.live {
			ds = append(ds, s.lock.Deadline())
		}
	}
	if len(ds) < l.r.quorum {
		return time.Time{}
	}
	return l.quorumLatest(ds)
}

// Context returns a context derived from parent that is cancelled when the
// lock ends: context.Cause then returns Err as it was when the lock ended
// (the error of a Release that did not reach a quorum stays its cause
// after a later Release changes Err), or context.Canceled after a
// release. Work done under the lock should use it, so that it stops the
// moment the lock is lost. It panics if parent is nil, as
// context.WithCancelCause does. Each context is kept by the lock until the
// lock or parent ends, but the one made from context.Background() or
// context.TODO(), which every such call returns again (as dlock's
// Lock.Context).
func (l *Lock) Context(parent context.Context) context.Context {
	l.made()
	l.expireIfDue() // before the cached context too: a lock past its deadline ends now
	root := parent == context.Background() || parent == context.TODO()
	if root {
		l.mu.Lock()
		ctx := l.rootCtx
		l.mu.Unlock()
		if ctx != nil {
			return ctx
		}
		parent = context.Background() // the one context serves TODO too
	}
	ctx, cancel := context.WithCancelCause(parent)
	l.mu.Lock()
	select {
	case <-l.done:
		err := l.err
		l.mu.Unlock()
		cancel(err)
		return ctx
	default:
	}
	if root {
		if made := l.rootCtx; made != nil { // by another call meanwhile
			l.mu.Unlock()
			cancel(nil)
			return made
		}
		l.rootCtx = ctx
	}
	if l.onEnd == nil {
		l.onEnd = make(map[*int]func())
	}
	key := new(int)
	l.onEnd[key] = func() { cancel(l.Err()) }
	l.mu.Unlock()
	// Forget the callback when parent ends first, so that a long-held lock
	// does not collect one per request.
	context.AfterFunc(ctx, func() {
		l.mu.Lock()
		delete(l.onEnd, key)
		l.mu.Unlock()
	})
	return ctx
}

// Name returns the name the lock was obtained on.
func (l *Lock) Name() string {
	l.made()
	return l.name
}

// logNames names the lock in its log records: the attribute "names", as
// dlock's records have it (a name over causes.QuoteMax bytes cut short).
func (l *Lock) logNames() []string { return []string{causes.Short(l.name)} }

// Token returns the lock's token: 128 random bits, new for every attempt,
// the same on every node that granted the attempt. A node that Refresh
// takes again holds the lock with a token of its own, so that the late
// clean-up of one such attempt cannot free the next.
func (l *Lock) Token() string {
	l.made()
	return l.token
}

// Metadata returns the string stored with the lock (see WithMetadata).
func (l *Lock) Metadata() string {
	l.made()
	return l.meta
}

// Nodes returns the addresses of the nodes that hold the lock, as far as
// this process knows: those that granted it or last refreshed it, and
// whose deadline has not passed.
func (l *Lock) Nodes() []string {
	l.made()
	l.expireIfDue()
	l.mu.Lock()
	defer l.mu.Unlock()
	var addrs []string
	for i, s := range l.nodes {
		if s.live {
			addrs = append(addrs, l.r.nodes[i].Addr)
		}
	}
	return addrs
}

// drift is the allowance for clock drift between client and servers, the
// same as dlock's for a single server: 1% of the TTL plus 2ms.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// oneUse gives a node's acquire the attempt's token, used for that
// attempt only (see friend.OneUseToken).
func oneUse(token string) dlock.Option { return friend.OneUseToken(token).(dlock.Option) }

// logHookPanics has the node client's hooks log their panics for the node
// locks (see Node.Client): the Locker calls them on goroutines of its own,
// where nobody could recover a panic.
var logHookPanics = friend.LogHookPanics().(dlock.Option)

// quorumPart has the node client log the loss of a node lock as a debug
// record, not as the warning "dlock: lock lost" of a lock of its own: the
// Redlock is lost only once fewer than a quorum hold it, and its Locker
// logs that (see WithLogger). Not given when the Locker has no logger to
// tell it (see Locker.nodeOpts).
var quorumPart = friend.QuorumPart().(dlock.Option)

// newToken returns 128 random bits from crypto/rand, base64url-encoded.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// ctxEnd returns why ctx ended: ctx.Err(), which every error of a call
// whose context ended matches, with the cause given, if any.
func ctxEnd(ctx context.Context) error {
	why, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || errors.Is(cause, why) {
		return cmp.Or(cause, why)
	}
	return fmt.Errorf("%w: %w", why, cause)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// atDeadline makes the failure of a node's request whose context had ended
// by the time it returned match the context's error, whatever the client
// reported: go-redis with ContextTimeoutEnabled sets its read deadline to
// the context's and reports "i/o timeout", often before the context's own
// timer says it ended. An answer of the node (not held, refused, other
// data under the key) stays what it is.
func atDeadline(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrNotObtained) ||
		errors.Is(err, dlock.ErrWrongType) || errors.Is(err, dlock.ErrKindMismatch) {
		return err
	}
	end := ctx.Err()
	var ne net.Error
	if dl, ok := ctx.Deadline(); end == nil && ok && !time.Now().Before(dl) && errors.As(err, &ne) && ne.Timeout() {
		end = context.DeadlineExceeded // the client's own read deadline came first
	}
	if end != nil && !errors.Is(err, end) {
		return fmt.Errorf("%w: %w", end, err)
	}
	return err
}
