package dlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock/internal/causes"
)

// lease is the lifetime of a held lock, shared by every primitive: its TTL
// and local deadline, the channel that closes when it ends, and its place
// in the client's watchdog when it is refreshed automatically.
//
// A lease ends once: released (err nil), lost (err wraps ErrLost), or past
// its deadline without a successful refresh.
type lease struct {
	c      *Client
	holder leaseHolder
	repl   replication // confirm acquire and refreshes on replicas
	hook   *hooked     // the client's hooks; nil when it has none, or for an attached lock
	part   bool        // one node's part of a Redlock lock: its loss is no warning (see friend.QuorumPart)

	// interval is the auto-refresh period, a time.Duration; zero when off.
	// It is written under mu, and read by the watchdog without it: under
	// its own lock, as it orders its heap.
	interval atomic.Int64

	mu          sync.Mutex
	ttl         time.Duration
	acquired    time.Time     // when the acquire request was sent
	deadline    time.Time     // local validity, on the monotonic clock
	maxHold     time.Duration // zero when unbounded
	capped      bool          // the max hold stopped the refreshing (see extendAuto)
	failing     bool          // the last refresh failed, not for Close (see expireAt)
	dropped     bool          // the watchdog let it go then; AutoRefresh may hand it back
	released    bool          // Release was called and succeeded
	relReturned bool          // that Release has returned: later ones report ErrNotHeld
	letGo       bool          // Release was called: no longer refreshed, even if it failed
	byHand      bool          // the deadline is a Refresh by hand's (see nextRefresh)
	failedWith  error         // why the last refresh failed, while failing
	relOut      error         // what the Release that succeeded returns: nil, or why the lock was not held
	gone        error         // a refresh found the lock not held after Release was called (see endIfGoneAndNotReleased)
	relFailed   error         // why the last Release failed, if it did
	backLater   bool          // Do's give-back may still find that release done: a refresh's "gone" waits for it
	givenBack   bool          // the clean-up after a give-back that failed was answered (see giveBackNode)
	givingBack  chan struct{} // closed once that clean-up has its outcome
	started     bool          // obtained: acquired and deadline are set
	ending      bool          // end was called; the lease is over once the hooks have run
	hooksTold   bool          // the AcquireDone hooks said obtained: End may reach the hooks
	endLate     bool          // the lease ended before that: End comes after AcquireDone (see told)
	over        bool          // the lease ended: err is set, done closed
	lateHeld    time.Duration // how long it was held then
	done        chan struct{} // made by the first Done, closed when over
	err         error
	timer       *time.Timer // fires at the deadline
	onEnd       map[*int]func()
	// rootCtx is the Context made from context.Background() or
	// context.TODO(), which every later call with either returns.
	rootCtx context.Context

	// Refreshes of one lease, by Refresh or by the watchdog, go one at a
	// time (see takeTurn), so that its deadline follows the refresh the
	// server ran last: two in flight at once could have their replies
	// come back in the other order.
	inFlight    bool          // a refresh is under way
	inFlightTTL time.Duration // the TTL a Refresh under way asks for; zero for the watchdog's
	turn        chan struct{} // made by a Refresh that waits for it; closed when it ends

	// Under mu, for the refresh turn's holder (see refreshNumber):
	// refreshes numbers the refreshes sent; fencing is set once one got no
	// answer, until one that fences it off succeeds; fenced tells whether
	// the last one sent does. floor is the shortest TTL sent since the
	// last fencing refresh that succeeded (that one's included; zero for
	// none), sentTTL the last one's: a copy of an earlier refresh that the
	// client library sent again, answered, may still come late, so a
	// refresh to a longer TTL than floor fences too.
	fencing, fenced bool
	refreshes       uint64
	floor, sentTTL  time.Duration

	// Owned by the watchdog, under its lock.
	next  time.Time // when the watchdog refreshes it next
	index int       // position in the watchdog's heap; -1 when not in it
	moved bool      // rescheduled while out of the heap (see reschedule)
}

// leaseHolder is what a lease is the lifetime of: the Lock that refreshes
// it and names it in messages.
type leaseHolder interface {
	// refreshCalls builds the calls that extend the lease to ttl (one, or
	// one for each slot of a lock split by slot).
	refreshCalls(ttl time.Duration) []*Call
	// refreshed reads their replies: nil when extended, an error wrapping
	// ErrNotHeld when the lock is gone, any other error when the outcome
	// is unknown.
	refreshed(calls []*Call) error
	// describe names the lock, for messages.
	describe() string
	// lockNames returns the lock's names, for log records.
	lockNames() []string
	// giveBackRest releases, within ctx, what is left of a lock a refresh
	// found lost: the other names of a lock on several.
	giveBackRest(ctx context.Context)
}

// notALock is the panic of a method of a Lock that no acquire or Attach
// made.
const notALock = "dlock: Lock used without an acquire or Attach (the zero Lock is not usable)"

// made panics unless an acquire or Attach made the Lock whose lease l is:
// a zero Lock has no client to reach, and nothing would ever end it (its
// Done would never close).
func (l *lease) made() {
	if l.c == nil {
		panic(notALock)
	}
}

func (l *lease) init(c *Client, holder leaseHolder, o *options) {
	l.c, l.holder, l.repl, l.part = c, holder, o.repl, o.part
	l.ttl, l.maxHold = o.ttl, o.maxHold
	l.interval.Store(int64(o.refreshInterval()))
	l.index = -1
}

// every returns the auto-refresh period; zero when off.
func (l *lease) every() time.Duration { return time.Duration(l.interval.Load()) }

// start begins the lease once obtained, and hands it to the watchdog if
// it refreshes automatically. The deadline timer is armed only when
// something waits for the deadline: the watchdog, hooks, a logger that
// reports losses, or a caller of Done or Context (see arm). Err and Done
// look at the clock themselves, so a lock nobody watches costs no timer.
func (l *lease) start(acquired, deadline time.Time) {
	l.mu.Lock()
	l.acquired, l.deadline, l.started = acquired, deadline, true
	auto := l.every() > 0
	if auto || l.hook != nil || l.c.log.Enabled(context.Background(), slog.LevelWarn) {
		l.arm()
	}
	l.mu.Unlock()
	if auto {
		l.watch()
	}
}

// arm starts the deadline timer unless it runs already; l.mu must be held.
func (l *lease) arm() {
	if l.timer == nil && l.started && !l.ending {
		l.timer = time.AfterFunc(time.Until(l.deadline), l.expire)
	}
}

// watch hands the lease to the client's watchdog; after Close there is
// none, and the lease runs out at its deadline.
func (l *lease) watch() {
	if w := l.c.watchdog(); w != nil {
		w.add(l)
	}
}

// takeTurn waits until no refresh of the lease is under way, or ctx ends,
// and then marks one to ttl under way, for Refresh: it must call endTurn
// when done. It returns ctx's error when ctx has ended (nothing is sent
// then, and the deadline stays), why the lease cannot be refreshed if it
// ended meanwhile, and ErrInvalidTTL if the lease is refreshed automatically and
// the deadline ttl gives (ttl less the drift allowance) does not come after
// the interval: the watchdog would come back only after the lock had run
// out.
func (l *lease) takeTurn(ctx context.Context, ttl time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.inFlight {
		if l.turn == nil {
			l.turn = make(chan struct{})
		}
		turn := l.turn
		l.mu.Unlock()
		select {
		case <-turn:
		case <-ctx.Done():
			l.mu.Lock()
			return ctx.Err()
		}
		l.mu.Lock()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.aliveLocked(); err != nil {
		return err
	}
	if every := l.every(); every > 0 && !refreshesInTime(every, ttl) {
		return fmt.Errorf("%w: %v less %v for clock drift is not longer than the auto-refresh interval %v", ErrInvalidTTL, ttl, drift(ttl), every)
	}
	l.inFlight, l.inFlightTTL = true, ttl
	return nil
}

// tryTurn marks a refresh under way, for the watchdog, unless one is
// already: the watchdog then tries again later rather than wait.
func (l *lease) tryTurn() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inFlight {
		return false
	}
	l.inFlight = true
	return true
}

// endTurn ends the refresh under way and wakes a Refresh waiting for it.
func (l *lease) endTurn() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight, l.inFlightTTL = false, 0
	if l.turn != nil {
		close(l.turn)
		l.turn = nil
	}
}

// extend records a successful refresh sent at sent with ttl. The caller
// holds the refresh turn, so no later refresh can have been sent. It
// returns why the lease is not held when it ended first (its deadline
// passed while the reply was on its way): the holder was told the lock
// was lost, and the refresh counts for nothing. due reports, changing
// nothing, a deadline that has passed with nothing to end the lease yet
// (no timer): the caller ends it (see Lock.Refresh).
func (l *lease) extend(sent time.Time, ttl time.Duration) (due bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.aliveLocked(); err != nil {
		return false, err
	}
	if !time.Now().Before(l.deadline) {
		// Its deadline passed while the reply was on its way (no timer
		// ended it, or not yet): lost, as an armed timer counts it.
		return true, nil
	}
	l.ttl, l.deadline = ttl, sent.Add(ttl-drift(ttl))
	l.byHand = true
	l.failing, l.failedWith = false, nil
	if l.timer != nil {
		l.timer.Reset(time.Until(l.deadline))
	}
	return false, nil
}

// lateReply reports whether the reply to a refresh sent at sent with ttl
// came back after the deadline that refresh sets: the lock may have
// expired on the server before the refresh reached it, so it counts as
// lost, as the deadline timer counts it (see Lock.Refresh).
func lateReply(sent time.Time, ttl time.Duration) bool {
	return !time.Now().Before(sent.Add(ttl - drift(ttl)))
}

// unsure records a refresh sent at sent with ttl whose outcome is unknown
// (its reply was lost, or it failed on some parts of a split lock): it may
// have run, so the deadline moves to where that refresh would put it when
// that is sooner. A refresh to a shorter TTL must not leave the holder
// counting on the longer one. The caller holds the refresh turn. It
// reports whether the lease still runs: not once it ended, or its deadline
// passed (its timer is about to end it).
func (l *lease) unsure(sent time.Time, ttl time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended() {
		return false
	}
	if d := sent.Add(ttl - drift(ttl)); d.Before(l.deadline) {
		l.deadline = d
		if l.timer != nil {
			l.timer.Reset(time.Until(d))
		}
	}
	return time.Now().Before(l.deadline)
}

// refreshNumber numbers the refresh about to be sent, for the holder of
// the refresh turn, and reports whether it fences off the earlier ones: a
// refresh that got no answer may still reach Redis, held up on a
// connection the client gave up on, after a later one has run; with a
// shorter TTL it would cut the later one's short, and the name would go
// to another while this holder counts on its deadline. Redis records the
// number of a refresh that fences (one sent after a refresh that got no
// answer, until such a refresh succeeds), and one numbered lower that
// runs after it only ever extends the lock (see refresh.lua).
func (l *lease) refreshNumber(ttl time.Duration) (n uint64, fence bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refreshes++
	l.fenced = l.fencing || (l.floor > 0 && ttl > l.floor)
	l.sentTTL = ttl
	if l.floor == 0 || ttl < l.floor {
		l.floor = ttl
	}
	return l.refreshes, l.fenced
}

// refreshAnswered records the outcome of the refresh last numbered, for
// the holder of the refresh turn: known (it ran, or was refused), or not.
func (l *lease) refreshAnswered(known bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case !known:
		l.fencing = true
	case l.fenced:
		// The earlier refreshes, all of them, are fenced off: the floor
		// starts again from this one.
		l.fencing, l.floor = false, l.sentTTL
	}
}

// refreshFailed notes that a refresh of the watchdog failed with err,
// until one succeeds.
func (l *lease) refreshFailed(err error) {
	l.mu.Lock()
	l.failing, l.failedWith = true, err
	l.mu.Unlock()
}

// expire ends the lease at its deadline, for the deadline timer.
func (l *lease) expire() { l.expireAt(true) }

// expireAt ends the lease if its deadline has passed, and reports whether
// it did: a refresh may have moved the deadline meanwhile. background is
// set on dlock's own goroutines (see endBy).
func (l *lease) expireAt(background bool) bool {
	l.mu.Lock()
	if left := time.Until(l.deadline); left > 0 {
		// A refresh moved the deadline as the timer fired.
		if l.timer != nil {
			l.timer.Reset(left)
		}
		l.mu.Unlock()
		return false
	}
	capped, ending, failing, failedWith := l.capped, l.ending, l.failing, l.failedWith
	l.mu.Unlock()
	// The refreshes that failed may have extended its other names (the
	// parts of a lock split by slot on the nodes they reached): they are
	// given back, also when the End hook panics.
	if !ending && l.every() > 0 {
		defer func() {
			if w := l.c.watchdogIfAny(); w != nil {
				w.giveBack([]*lease{l})
			}
		}()
	}
	if capped {
		l.endBy(&causes.Error{Msg: ErrLost.Error() + ": " + l.holder.describe() + ": max hold reached", Errs: []error{ErrLost, ErrMaxHold}}, background)
		return true
	}
	if l.every() > 0 && !failing && l.c.isClosed() {
		// Its holder's shutdown may have to tell this loss from Redis's:
		// refreshed until Close, it would not have been lost.
		l.endBy(&causes.Error{Msg: ErrLost.Error() + ": " + l.holder.describe() + ": its deadline passed without a refresh, as Client.Close ended its auto-refresh", Errs: []error{ErrLost, ErrClosed}}, background)
	} else if failing && failedWith != nil {
		// Why the refreshes failed (a permission the ACL user lacks, a
		// server that does not answer) is told with the loss: in words,
		// since a failure such as a context's deadline must not make the
		// loss match it.
		l.endBy(fmt.Errorf("%w: %s: its deadline passed without a refresh (the last one failed: %s)", ErrLost, l.holder.describe(), causes.Unprefixed(failedWith)), background)
	} else {
		l.endBy(fmt.Errorf("%w: %s: its deadline passed without a refresh", ErrLost, l.holder.describe()), background)
	}
	return true
}

// expireIfDue ends the lease at once if its deadline has passed, without
// waiting for the deadline timer: after a process pause, the holder's own
// goroutine may run before the timer's does.
func (l *lease) expireIfDue() {
	l.mu.Lock()
	due := l.started && !l.ended() && !time.Now().Before(l.deadline)
	l.mu.Unlock()
	if due {
		l.expireAt(false) // an End hook's panic reaches the caller
	}
}

// drop ends the lease of a lock its caller never got: no hook hears of it.
func (l *lease) drop() {
	l.mu.Lock()
	l.hook = nil
	l.mu.Unlock()
	l.end(nil)
}

// end closes the lease with err (nil for a release), on its caller's
// goroutine: see endBy.
func (l *lease) end(err error) { l.endBy(err, false) }

// endBy closes the lease with err. Only the first call counts. An End
// hook's panic goes on once the lease has ended, unless background is set
// (dlock's own goroutines: the watchdog's, a timer's), where nobody could
// recover it and it would end the program: it is logged then.
func (l *lease) endBy(err error, background bool) {
	l.mu.Lock()
	if l.ending {
		l.mu.Unlock()
		return
	}
	l.ending = true
	var panicked *hookPanic // by an End hook: raised again once the lease ended
	hook := l.hook
	if hook != nil {
		// Before Done closes, so that whoever waits on it finds the end
		// counted; Err already says why. Not before AcquireDone said
		// obtained: the hooks must hear of the lock before its end (see
		// told). Nobody can wait on Done before then.
		l.err = err
		held := time.Since(l.acquired)
		if l.hooksTold {
			l.mu.Unlock()
			panicked = hook.end(held, err)
			l.mu.Lock()
		} else {
			l.endLate, l.lateHeld = true, held
		}
	}
	l.err, l.over = err, true
	if l.done != nil {
		close(l.done)
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	fns := l.onEnd
	l.onEnd = nil
	l.mu.Unlock()
	if l.every() > 0 {
		l.c.unwatch(l)
	}
	for _, f := range fns {
		f()
	}
	switch {
	case err != nil && l.part:
		// One node's part of a Redlock lock: the lock is lost only once
		// fewer than a quorum hold it, which package redlock logs.
		l.c.log.Debug("dlock: a Redlock node's lock ended", "names", l.holder.lockNames(), "err", err)
	case err != nil:
		l.c.log.Warn("dlock: lock lost", "names", l.holder.lockNames(), "err", err)
	}
	switch {
	case panicked != nil && background:
		l.c.logHookPanic("End", panicked)
	case panicked != nil:
		hook.raise("End", panicked)
	}
}

// told records that the AcquireDone hooks said the lock obtained, and
// calls the End hooks now when it ended as they ran: its deadline passed
// or a refresh found it lost.
func (l *lease) told() {
	l.mu.Lock()
	l.hooksTold = true
	late, held, err := l.endLate, l.lateHeld, l.err
	l.endLate = false
	l.mu.Unlock()
	if late {
		l.hook.raise("End", l.hook.end(held, err))
	}
}

// lose ends the lease as lost after a refresh found the lock not held
// (err), unless Release was called before the refresh's reply came back:
// the refresh may then have reached the server after the release, and it
// is the release's reply that tells whether the lock was lost or released.
// Release is called before its request is sent, so a refresh whose reply
// came back before the call ran before the release: the loss was real.
//
// It reports whether the loss was real (Release was not called), whether
// or not the lease had ended by then (its deadline may have passed as the
// refresh ran). background as for endBy.
func (l *lease) lose(err error, background bool) bool {
	l.mu.Lock()
	letGo := l.letGo
	if letGo && l.gone == nil {
		l.gone = err
	}
	l.mu.Unlock()
	if letGo {
		l.endIfGoneAndNotReleased(background)
		return false
	}
	l.endBy(lostBy(err), background)
	return true
}

// releaseFailed records that Release failed (err): the lease runs on to
// its deadline, as a failed Release leaves it, unless a refresh found the
// lock not held meanwhile (see endIfGoneAndNotReleased).
func (l *lease) releaseFailed(err error) {
	l.mu.Lock()
	l.relFailed = err
	l.mu.Unlock()
	l.endIfGoneAndNotReleased(false)
}

// endIfGoneAndNotReleased ends the lease as lost once both a Release failed
// and a refresh sent before it found the lock not held, in either order:
// whether the release ran or another holder has the lock, it is not this
// lease's any more. background as for endBy.
func (l *lease) endIfGoneAndNotReleased(background bool) {
	l.mu.Lock()
	gone, failed, giving := l.gone, l.relFailed, l.backLater
	l.mu.Unlock()
	if gone != nil && failed != nil && !giving {
		l.endBy(&causes.Error{Msg: ErrLost.Error() + ": " + unprefixed(gone) + " (and Release failed: " + unprefixed(failed) + ")",
			Errs: []error{ErrLost, gone, failed}}, background)
	}
}

// heldFor returns how long the lease has been held.
func (l *lease) heldFor() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Since(l.acquired)
}

// ended reports whether the lease has ended; l.mu must be held.
func (l *lease) ended() bool { return l.over }

// aliveLocked returns nil while the lease runs, or why it does not; l.mu
// must be held.
func (l *lease) aliveLocked() error {
	if l.released {
		return fmt.Errorf("%w: %s was released", ErrNotHeld, l.holder.describe())
	}
	if l.ended() || (l.ending && l.err != nil) {
		// Ending: its End hook runs, and Err already says why.
		return notHeldFor(l.err)
	}
	return nil
}

// aliveErr returns nil while the lease runs, or why it does not (see
// aliveLocked).
func (l *lease) aliveErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.aliveLocked()
}

// refreshing reports whether the watchdog should go on refreshing the
// lease: not once Release was called, even if it failed, so that a lock
// whose release was lost runs out within its TTL.
func (l *lease) refreshing() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.letGo && !l.released && !l.ended()
}

// Done returns a channel that is closed when the lock ends: when it is
// released, or the moment it is known lost (a refresh found it expired or
// taken) or its deadline passes without a successful refresh. Err then says
// which. Done and Err look at the clock themselves, so a holder whose
// process was paused past its deadline finds the lock ended the moment it
// looks, even before the deadline timer has run.
func (l *lease) Done() <-chan struct{} {
	l.made()
	l.expireIfDue()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.arm() // someone waits for the deadline now
	if l.done == nil {
		if l.over {
			return closedChan
		}
		l.done = make(chan struct{})
	}
	return l.done
}

// closedChan is the Done channel of a lease that ended before anyone asked
// for it.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Err returns nil while the lock is held and after it was released, and an
// error wrapping ErrLost once it was lost: ErrMaxHold when WithMaxHold ended
// it, the reason otherwise (for a lock whose automatic refreshes failed
// until its deadline, with why the last one failed, in its message).
func (l *lease) Err() error {
	l.made()
	l.expireIfDue()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Deadline returns when the lock stops being safe to rely on without a
// refresh: its TTL measured from before the request that obtained or last
// refreshed it, less an allowance for clock drift (1% of the TTL + 2ms).
func (l *lease) Deadline() time.Time {
	l.made()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Context returns a context derived from parent that is cancelled when the
// lock ends: context.Cause then returns Err, or context.Canceled after a
// release. Work done under the lock should use it, so that it stops as
// soon as the lock is known lost (see Done: at its local deadline, or at
// the refresh that finds it gone). It carries the Lock, which
// LockFromContext returns (Do's function gets such a context). Like
// context.WithCancel, it panics if parent is nil. Each context is kept by
// the lock until the lock or parent ends, but the one made from
// context.Background() or context.TODO(), which every such call returns
// again: on a lock held for long, call it once and reuse the context, or
// give it a parent that ends (a request's), rather than calling it anew
// from a parent that never ends (context.WithValue of Background, say)
// for each task.
func (l *lease) Context(parent context.Context) context.Context {
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
	if lk, ok := l.holder.(*Lock); ok {
		parent = context.WithValue(parent, lockKey{}, lk)
	}
	ctx, cancel := context.WithCancelCause(parent)
	l.mu.Lock()
	l.arm()
	if l.ended() {
		err := l.err
		l.mu.Unlock()
		cancel(err)
		return ctx
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

// lockKey is the key of the Lock that a context made by Lock.Context
// carries.
type lockKey struct{}

// LockFromContext returns the Lock whose Context made ctx (or a context
// ctx derives from), the innermost one when there are several; nil when
// none did, or ctx is nil. Do's function (and that of TryDo, RWMutex.Do,
// Semaphore.Do and the others of this package, not redlock's, whose locks
// have no fence) gets such a context: it finds its Lock so, to read its
// Fence for the writes it makes, say.
func LockFromContext(ctx context.Context) *Lock {
	if ctx == nil {
		return nil
	}
	l, _ := ctx.Value(lockKey{}).(*Lock)
	return l
}

// autoRefresh starts refreshing a lease that was obtained without it.
func (l *lease) autoRefresh(o *options) error {
	l.mu.Lock()
	if err := l.aliveLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	if l.letGo {
		l.mu.Unlock()
		return fmt.Errorf("%w: %s: Release was called", ErrNotHeld, l.holder.describe())
	}
	// The options must fit the TTL, and that of a Refresh under way, which
	// the lease has once it succeeds.
	for _, ttl := range []time.Duration{l.ttl, l.inFlightTTL} {
		if ttl == 0 {
			continue
		}
		if err := o.checkLease(ttl); err != nil {
			l.mu.Unlock()
			return err
		}
	}
	// A lease the watchdog let go at its max hold goes back to it: the new
	// max hold may allow more. One it still has (or refreshes now) learns
	// the new max hold at its next refresh.
	rewatch := l.every() == 0 || l.dropped
	l.interval.Store(int64(o.refreshInterval()))
	// Without WithMaxHold, the max hold stays what it was (given when the
	// lock was obtained, or by an earlier AutoRefresh).
	if o.maxHold > 0 {
		l.maxHold = o.maxHold
	}
	l.capped, l.dropped = false, false
	l.arm()
	l.mu.Unlock()
	if rewatch {
		l.watch()
	} else {
		l.rescheduled() // a shorter interval brings the next refresh forward
	}
	return nil
}

// rescheduled brings the watchdog's next refresh of the lease forward to
// when its deadline and interval, as they are now, call for it (see
// nextAt), when that is sooner than planned: after a Refresh to a shorter
// TTL, or AutoRefresh with a shorter interval.
func (l *lease) rescheduled() {
	if l.every() == 0 {
		return
	}
	if w := l.c.watchdogIfAny(); w != nil {
		w.reschedule(l)
	}
}

// nextRefresh returns the TTL for the watchdog's refresh sent now: the
// lease's TTL, or what is left of the max hold when that is less. ok is
// false when the max hold allows no more refreshing: the watchdog lets the
// lease go (it runs out at its deadline), and AutoRefresh may hand it back.
func (l *lease) nextRefresh(now time.Time) (ttl time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ttl = l.ttl
	if l.maxHold <= 0 {
		return ttl, true
	}
	if left := l.acquired.Add(l.maxHold).Sub(now); left < ttl {
		// The holder's own Refresh, which the max hold does not bound,
		// may have set a deadline past it: a refresh to what is left would
		// cut that TTL short on the server while the holder counts on the
		// deadline until the reply comes. The lock runs out at that
		// deadline instead. Not a deadline the watchdog's own refreshes
		// set (AutoRefresh may have shortened the max hold since): the
		// refresh cuts it to the max hold, as unsure counts it.
		if left < time.Millisecond || (l.byHand && now.Add(left).Before(l.deadline)) {
			l.capped, l.dropped = true, true
			return 0, false
		}
		return left, true
	}
	return ttl, true
}

// extendAuto records the watchdog's successful refresh sent at sent with
// ttl, which is the lease's TTL or less (see nextRefresh), and returns when
// to refresh it next; ok is false when the max hold, as it is now (AutoRefresh
// may have changed it while the refresh ran), allows no more: the lease is
// then capped, and the watchdog lets it go. A lease that ended as lost
// before the reply came (its deadline passed) is not extended: err is the
// loss, which Err already tells. The caller holds the refresh turn.
func (l *lease) extendAuto(sent time.Time, ttl time.Duration) (next time.Time, ok bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Released before the reply came (as Refresh reports it), or ending
	// as lost: its End hook may be running.
	if err := l.aliveLocked(); err != nil {
		return time.Time{}, false, err
	}
	if l.ended() || l.ending {
		return time.Time{}, false, nil // dropped: never handed out
	}
	l.deadline = sent.Add(ttl - drift(ttl))
	l.byHand = false
	l.failing, l.failedWith = false, nil
	if l.timer != nil {
		l.timer.Reset(time.Until(l.deadline))
	}
	if l.maxHold > 0 && !l.acquired.Add(l.maxHold).After(sent.Add(ttl+time.Millisecond)) {
		l.capped, l.dropped = true, true
		return time.Time{}, false, nil
	}
	return l.nextAt(), true, nil
}

// refreshAt returns nextAt, for a lease whose deadline a Refresh moved.
func (l *lease) refreshAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nextAt()
}

// nextAt returns when the watchdog refreshes the lease next: as long
// before its deadline as a full refresh sent now would leave, one interval
// from now after a full refresh; sooner (at once, if that is past) when the
// last refresh was capped by a max hold that AutoRefresh has raised since.
// It is at least a tenth of the TTL (less the drift allowance) before the
// deadline, so that an interval barely shorter than that leaves the
// refresh time to be answered. l.mu must be held.
func (l *lease) nextAt() time.Time {
	valid := l.ttl - drift(l.ttl)
	return l.deadline.Add(-max(valid-l.every(), valid/10))
}

// ErrLost is wrapped by Err, and by the errors of a lock that was lost: it
// expired, was deleted or taken by another, or its deadline passed without a
// successful refresh.
var ErrLost = errors.New("dlock: lock lost")

// lostBy returns the error of a lock lost for cause.
func lostBy(cause error) error { return because(ErrLost, cause) }

// ErrMaxHold is wrapped by Err when WithMaxHold stopped the refreshing and
// the lock ran out.
var ErrMaxHold = errors.New("dlock: max hold reached")

// setGivingBack sets whether Do's give-back of a failed release may still
// find it done (see giveBackLater); once unset, a refresh's finding that
// the lock was gone ends it as lost, as endIfGoneAndNotReleased does.
func (l *lease) setGivingBack(on bool, background bool) {
	l.mu.Lock()
	l.backLater = on
	l.mu.Unlock()
	if !on {
		l.endIfGoneAndNotReleased(background)
	}
}
