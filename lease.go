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

func (s *lease) init(c *Client, holder leaseHolder, o *options) {
	s.c, s.holder, s.repl = c, holder, o.repl
	s.ttl, s.maxHold = o.ttl, o.maxHold
	s.interval.Store(int64(o.refreshInterval()))
	s.index = -1
}

// every returns the auto-refresh period; zero when off.
func (s *lease) every() time.Duration { return time.Duration(s.interval.Load()) }

// start begins the lease once obtained, and hands it to the watchdog if
// it refreshes automatically. The deadline timer is armed only when
// something waits for the deadline: the watchdog, hooks, a logger that
// reports losses, or a caller of Done or Context (see arm). Err and Done
// look at the clock themselves, so a lock nobody watches costs no timer.
func (s *lease) start(acquired, deadline time.Time) {
	s.mu.Lock()
	s.acquired, s.deadline, s.started = acquired, deadline, true
	auto := s.every() > 0
	if auto || s.hook != nil || s.c.log.Enabled(context.Background(), slog.LevelWarn) {
		s.arm()
	}
	s.mu.Unlock()
	if auto {
		s.watch()
	}
}

// arm starts the deadline timer unless it runs already; s.mu must be held.
func (s *lease) arm() {
	if s.timer == nil && s.started && !s.ending {
		s.timer = time.AfterFunc(time.Until(s.deadline), s.expire)
	}
}

// watch hands the lease to the client's watchdog; after Close there is
// none, and the lease runs out at its deadline.
func (s *lease) watch() {
	if w := s.c.watchdog(); w != nil {
		w.add(s)
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
func (s *lease) takeTurn(ctx context.Context, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.inFlight {
		if s.turn == nil {
			s.turn = make(chan struct{})
		}
		turn := s.turn
		s.mu.Unlock()
		select {
		case <-turn:
		case <-ctx.Done():
			s.mu.Lock()
			return ctx.Err()
		}
		s.mu.Lock()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.aliveLocked(); err != nil {
		return err
	}
	if every := s.every(); every > 0 && !refreshesInTime(every, ttl) {
		return fmt.Errorf("%w: %v less %v for clock drift is not longer than the auto-refresh interval %v", ErrInvalidTTL, ttl, drift(ttl), every)
	}
	s.inFlight, s.inFlightTTL = true, ttl
	return nil
}

// tryTurn marks a refresh under way, for the watchdog, unless one is
// already: the watchdog then tries again later rather than wait.
func (s *lease) tryTurn() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight {
		return false
	}
	s.inFlight = true
	return true
}

// endTurn ends the refresh under way and wakes a Refresh waiting for it.
func (s *lease) endTurn() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight, s.inFlightTTL = false, 0
	if s.turn != nil {
		close(s.turn)
		s.turn = nil
	}
}

// extend records a successful refresh sent at sent with ttl. The caller
// holds the refresh turn, so no later refresh can have been sent. It
// returns why the lease is not held when it ended first (its deadline
// passed while the reply was on its way): the holder was told the lock
// was lost, and the refresh counts for nothing. due reports, changing
// nothing, a deadline that has passed with nothing to end the lease yet
// (no timer): the caller ends it (see Lock.Refresh).
func (s *lease) extend(sent time.Time, ttl time.Duration) (due bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.aliveLocked(); err != nil {
		return false, err
	}
	if !time.Now().Before(s.deadline) {
		// Its deadline passed while the reply was on its way (no timer
		// ended it, or not yet): lost, as an armed timer counts it.
		return true, nil
	}
	s.ttl, s.deadline = ttl, sent.Add(ttl-drift(ttl))
	s.byHand = true
	s.failing, s.failedWith = false, nil
	if s.timer != nil {
		s.timer.Reset(time.Until(s.deadline))
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
func (s *lease) unsure(sent time.Time, ttl time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended() {
		return false
	}
	if d := sent.Add(ttl - drift(ttl)); d.Before(s.deadline) {
		s.deadline = d
		if s.timer != nil {
			s.timer.Reset(time.Until(d))
		}
	}
	return time.Now().Before(s.deadline)
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
func (s *lease) refreshNumber(ttl time.Duration) (n uint64, fence bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refreshes++
	s.fenced = s.fencing || (s.floor > 0 && ttl > s.floor)
	s.sentTTL = ttl
	if s.floor == 0 || ttl < s.floor {
		s.floor = ttl
	}
	return s.refreshes, s.fenced
}

// refreshAnswered records the outcome of the refresh last numbered, for
// the holder of the refresh turn: known (it ran, or was refused), or not.
func (s *lease) refreshAnswered(known bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !known:
		s.fencing = true
	case s.fenced:
		// The earlier refreshes, all of them, are fenced off: the floor
		// starts again from this one.
		s.fencing, s.floor = false, s.sentTTL
	}
}

// refreshFailed notes that a refresh of the watchdog failed with err,
// until one succeeds.
func (s *lease) refreshFailed(err error) {
	s.mu.Lock()
	s.failing, s.failedWith = true, err
	s.mu.Unlock()
}

// expire ends the lease at its deadline, for the deadline timer.
func (s *lease) expire() { s.expireAt(true) }

// expireAt ends the lease if its deadline has passed, and reports whether
// it did: a refresh may have moved the deadline meanwhile. background is
// set on dlock's own goroutines (see endBy).
func (s *lease) expireAt(background bool) bool {
	s.mu.Lock()
	if left := time.Until(s.deadline); left > 0 {
		// A refresh moved the deadline as the timer fired.
		if s.timer != nil {
			s.timer.Reset(left)
		}
		s.mu.Unlock()
		return false
	}
	capped, ending, failing, failedWith := s.capped, s.ending, s.failing, s.failedWith
	s.mu.Unlock()
	// The refreshes that failed may have extended its other names (the
	// parts of a lock split by slot on the nodes they reached): they are
	// given back, also when the End hook panics.
	if !ending && s.every() > 0 {
		defer func() {
			if w := s.c.watchdogIfAny(); w != nil {
				w.giveBack([]*lease{s})
			}
		}()
	}
	if capped {
		s.endBy(&causes.Error{Msg: ErrLost.Error() + ": " + s.holder.describe() + ": max hold reached", Errs: []error{ErrLost, ErrMaxHold}}, background)
		return true
	}
	if s.every() > 0 && !failing && s.c.isClosed() {
		// Its holder's shutdown may have to tell this loss from Redis's:
		// refreshed until Close, it would not have been lost.
		s.endBy(&causes.Error{Msg: ErrLost.Error() + ": " + s.holder.describe() + ": its deadline passed without a refresh, as Client.Close ended its auto-refresh", Errs: []error{ErrLost, ErrClosed}}, background)
	} else if failing && failedWith != nil {
		// Why the refreshes failed (a permission the ACL user lacks, a
		// server that does not answer) is told with the loss: in words,
		// since a failure such as a context's deadline must not make the
		// loss match it.
		s.endBy(fmt.Errorf("%w: %s: its deadline passed without a refresh (the last one failed: %s)", ErrLost, s.holder.describe(), causes.Unprefixed(failedWith)), background)
	} else {
		s.endBy(fmt.Errorf("%w: %s: its deadline passed without a refresh", ErrLost, s.holder.describe()), background)
	}
	return true
}

// expireIfDue ends the lease at once if its deadline has passed, without
// waiting for the deadline timer: after a process pause, the holder's own
// goroutine may run before the timer's does.
func (s *lease) expireIfDue() {
	s.mu.Lock()
	due := s.started && !s.ended() && !time.Now().Before(s.deadline)
	s.mu.Unlock()
	if due {
		s.expireAt(false) // an End hook's panic reaches the caller
	}
}

// drop ends the lease of a lock its caller never got: no hook hears of it.
func (s *lease) drop() {
	s.mu.Lock()
	s.hook = nil
	s.mu.Unlock()
	s.end(nil)
}

// end closes the lease with err (nil for a release), on its caller's
// goroutine: see endBy.
func (s *lease) end(err error) { s.endBy(err, false) }

// endBy closes the lease with err. Only the first call counts. An End
// hook's panic goes on once the lease has ended, unless background is set
// (dlock's own goroutines: the watchdog's, a timer's), where nobody could
// recover it and it would end the program: it is logged then.
func (s *lease) endBy(err error, background bool) {
	s.mu.Lock()
	if s.ending {
		s.mu.Unlock()
		return
	}
	s.ending = true
	var panicked *hookPanic // by an End hook: raised again once the lease ended
	hook := s.hook
	if hook != nil {
		// Before Done closes, so that whoever waits on it finds the end
		// counted; Err already says why. Not before AcquireDone said
		// obtained: the hooks must hear of the lock before its end (see
		// told). Nobody can wait on Done before then.
		s.err = err
		held := time.Since(s.acquired)
		if s.hooksTold {
			s.mu.Unlock()
			panicked = hook.end(held, err)
			s.mu.Lock()
		} else {
			s.endLate, s.lateHeld = true, held
		}
	}
	s.err, s.over = err, true
	if s.done != nil {
		close(s.done)
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	fns := s.onEnd
	s.onEnd = nil
	s.mu.Unlock()
	if s.every() > 0 {
		s.c.unwatch(s)
	}
	for _, f := range fns {
		f()
	}
	if err != nil {
		s.c.log.Warn("dlock: lock lost", "names", s.holder.lockNames(), "err", err)
	}
	switch {
	case panicked != nil && background:
		s.c.logHookPanic("End", panicked)
	case panicked != nil:
		hook.raise("End", panicked)
	}
}

// told records that the AcquireDone hooks said the lock obtained, and
// calls the End hooks now when it ended as they ran: its deadline passed
// or a refresh found it lost.
func (s *lease) told() {
	s.mu.Lock()
	s.hooksTold = true
	late, held, err := s.endLate, s.lateHeld, s.err
	s.endLate = false
	s.mu.Unlock()
	if late {
		s.hook.raise("End", s.hook.end(held, err))
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
func (s *lease) lose(err error, background bool) bool {
	s.mu.Lock()
	letGo := s.letGo
	if letGo && s.gone == nil {
		s.gone = err
	}
	s.mu.Unlock()
	if letGo {
		s.endIfGoneAndNotReleased(background)
		return false
	}
	s.endBy(lostBy(err), background)
	return true
}

// releaseFailed records that Release failed (err): the lease runs on to
// its deadline, as a failed Release leaves it, unless a refresh found the
// lock not held meanwhile (see endIfGoneAndNotReleased).
func (s *lease) releaseFailed(err error) {
	s.mu.Lock()
	s.relFailed = err
	s.mu.Unlock()
	s.endIfGoneAndNotReleased(false)
}

// endIfGoneAndNotReleased ends the lease as lost once both a Release failed
// and a refresh sent before it found the lock not held, in either order:
// whether the release ran or another holder has the lock, it is not this
// lease's any more. background as for endBy.
func (s *lease) endIfGoneAndNotReleased(background bool) {
	s.mu.Lock()
	gone, failed, giving := s.gone, s.relFailed, s.backLater
	s.mu.Unlock()
	if gone != nil && failed != nil && !giving {
		s.endBy(&causes.Error{Msg: ErrLost.Error() + ": " + unprefixed(gone) + " (and Release failed: " + unprefixed(failed) + ")",
			Errs: []error{ErrLost, gone, failed}}, background)
	}
}

// heldFor returns how long the lease has been held.
func (s *lease) heldFor() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Since(s.acquired)
}

// ended reports whether the lease has ended; s.mu must be held.
func (s *lease) ended() bool { return s.over }

// aliveLocked returns nil while the lease runs, or why it does not; s.mu
// must be held.
func (s *lease) aliveLocked() error {
	if s.released {
		return fmt.Errorf("%w: %s was released", ErrNotHeld, s.holder.describe())
	}
	if s.ended() || (s.ending && s.err != nil) {
		// Ending: its End hook runs, and Err already says why.
		return notHeldFor(s.err)
	}
	return nil
}

// aliveErr returns nil while the lease runs, or why it does not (see
// aliveLocked).
func (s *lease) aliveErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.aliveLocked()
}

// refreshing reports whether the watchdog should go on refreshing the
// lease: not once Release was called, even if it failed, so that a lock
// whose release was lost runs out within its TTL.
func (s *lease) refreshing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.letGo && !s.released && !s.ended()
}

// Done returns a channel that is closed when the lock ends: when it is
// released, or the moment it is known lost (a refresh found it expired or
// taken) or its deadline passes without a successful refresh. Err then says
// which. Done and Err look at the clock themselves, so a holder whose
// process was paused past its deadline finds the lock ended the moment it
// looks, even before the deadline timer has run.
func (s *lease) Done() <-chan struct{} {
	s.expireIfDue()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.arm() // someone waits for the deadline now
	if s.done == nil {
		if s.over {
			return closedChan
		}
		s.done = make(chan struct{})
	}
	return s.done
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
func (s *lease) Err() error {
	s.expireIfDue()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Deadline returns when the lock stops being safe to rely on without a
// refresh: its TTL measured from before the request that obtained or last
// refreshed it, less an allowance for clock drift (1% of the TTL + 2ms).
func (s *lease) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// Context returns a context derived from parent that is cancelled when the
// lock ends: context.Cause then returns Err, or context.Canceled after a
// release. Work done under the lock should use it, so that it stops as
// soon as the lock is known lost (see Done: at its local deadline, or at
// the refresh that finds it gone). It carries the Lock, which
// LockFromContext returns (Do's function gets such a context). Like
// context.WithCancel, it panics if parent is nil.
func (s *lease) Context(parent context.Context) context.Context {
	if l, ok := s.holder.(*Lock); ok {
		parent = context.WithValue(parent, lockKey{}, l)
	}
	ctx, cancel := context.WithCancelCause(parent)
	s.expireIfDue()
	s.mu.Lock()
	s.arm()
	if s.ended() {
		err := s.err
		s.mu.Unlock()
		cancel(err)
		return ctx
	}
	if s.onEnd == nil {
		s.onEnd = make(map[*int]func())
	}
	key := new(int)
	s.onEnd[key] = func() { cancel(s.Err()) }
	s.mu.Unlock()
	// Forget the callback when parent ends first, so that a long-held lock
	// does not collect one per request.
	context.AfterFunc(ctx, func() {
		s.mu.Lock()
		delete(s.onEnd, key)
		s.mu.Unlock()
	})
	return ctx
}

// lockKey is the key of the Lock that a context made by Lock.Context
// carries.
type lockKey struct{}

// LockFromContext returns the Lock whose Context made ctx (or a context
// ctx derives from), the innermost one when there are several; nil when
// none did. Do's function (and that of TryDo, RWMutex.Do, Semaphore.Do and
// the others) gets such a context: it finds its Lock so, to read its Fence
// for the writes it makes, say.
func LockFromContext(ctx context.Context) *Lock {
	l, _ := ctx.Value(lockKey{}).(*Lock)
	return l
}

// autoRefresh starts refreshing a lease that was obtained without it.
func (s *lease) autoRefresh(o *options) error {
	s.mu.Lock()
	if err := s.aliveLocked(); err != nil {
		s.mu.Unlock()
		return err
	}
	if s.letGo {
		s.mu.Unlock()
		return fmt.Errorf("%w: %s: Release was called", ErrNotHeld, s.holder.describe())
	}
	// The options must fit the TTL, and that of a Refresh under way, which
	// the lease has once it succeeds.
	for _, ttl := range []time.Duration{s.ttl, s.inFlightTTL} {
		if ttl == 0 {
			continue
		}
		if err := o.checkLease(ttl); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	// A lease the watchdog let go at its max hold goes back to it: the new
	// max hold may allow more. One it still has (or refreshes now) learns
	// the new max hold at its next refresh.
	rewatch := s.every() == 0 || s.dropped
	s.interval.Store(int64(o.refreshInterval()))
	// Without WithMaxHold, the max hold stays what it was (given when the
	// lock was obtained, or by an earlier AutoRefresh).
	if o.maxHold > 0 {
		s.maxHold = o.maxHold
	}
	s.capped, s.dropped = false, false
	s.arm()
	s.mu.Unlock()
	if rewatch {
		s.watch()
	} else {
		s.rescheduled() // a shorter interval brings the next refresh forward
	}
	return nil
}

// rescheduled brings the watchdog's next refresh of the lease forward to
// when its deadline and interval, as they are now, call for it (see
// nextAt), when that is sooner than planned: after a Refresh to a shorter
// TTL, or AutoRefresh with a shorter interval.
func (s *lease) rescheduled() {
	if s.every() == 0 {
		return
	}
	if w := s.c.watchdogIfAny(); w != nil {
		w.reschedule(s)
	}
}

// nextRefresh returns the TTL for the watchdog's refresh sent now: the
// lease's TTL, or what is left of the max hold when that is less. ok is
// false when the max hold allows no more refreshing: the watchdog lets the
// lease go (it runs out at its deadline), and AutoRefresh may hand it back.
func (s *lease) nextRefresh(now time.Time) (ttl time.Duration, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ttl = s.ttl
	if s.maxHold <= 0 {
		return ttl, true
	}
	if left := s.acquired.Add(s.maxHold).Sub(now); left < ttl {
		// The holder's own Refresh, which the max hold does not bound,
		// may have set a deadline past it: a refresh to what is left would
		// cut that TTL short on the server while the holder counts on the
		// deadline until the reply comes. The lock runs out at that
		// deadline instead. Not a deadline the watchdog's own refreshes
		// set (AutoRefresh may have shortened the max hold since): the
		// refresh cuts it to the max hold, as unsure counts it.
		if left < time.Millisecond || (s.byHand && now.Add(left).Before(s.deadline)) {
			s.capped, s.dropped = true, true
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
func (s *lease) extendAuto(sent time.Time, ttl time.Duration) (next time.Time, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Released before the reply came (as Refresh reports it), or ending
	// as lost: its End hook may be running.
	if err := s.aliveLocked(); err != nil {
		return time.Time{}, false, err
	}
	if s.ended() || s.ending {
		return time.Time{}, false, nil // dropped: never handed out
	}
	s.deadline = sent.Add(ttl - drift(ttl))
	s.byHand = false
	s.failing, s.failedWith = false, nil
	if s.timer != nil {
		s.timer.Reset(time.Until(s.deadline))
	}
	if s.maxHold > 0 && !s.acquired.Add(s.maxHold).After(sent.Add(ttl+time.Millisecond)) {
		s.capped, s.dropped = true, true
		return time.Time{}, false, nil
	}
	return s.nextAt(), true, nil
}

// refreshAt returns nextAt, for a lease whose deadline a Refresh moved.
func (s *lease) refreshAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nextAt()
}

// nextAt returns when the watchdog refreshes the lease next: as long
// before its deadline as a full refresh sent now would leave, one interval
// from now after a full refresh; sooner (at once, if that is past) when the
// last refresh was capped by a max hold that AutoRefresh has raised since.
// It is at least a tenth of the TTL (less the drift allowance) before the
// deadline, so that an interval barely shorter than that leaves the
// refresh time to be answered. s.mu must be held.
func (s *lease) nextAt() time.Time {
	valid := s.ttl - drift(s.ttl)
	return s.deadline.Add(-max(valid-s.every(), valid/10))
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
func (s *lease) setGivingBack(on bool, background bool) {
	s.mu.Lock()
	s.backLater = on
	s.mu.Unlock()
	if !on {
		s.endIfGoneAndNotReleased(background)
	}
}
