package dlock

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock/internal/causes"
)

// Lock is a hold on one or more names: an exclusive lock obtained with
// Client.TryLock, Client.Lock, their multi-key forms or Client.Attach; a
// read or write hold of an RWMutex; or a permit of a Semaphore. It is given
// up with Release. Its methods are safe for concurrent use. Those of a nil
// *Lock panic: check the error of the call that obtained it. So do those
// of the zero Lock, which is not usable: a Lock comes from the calls above.
type Lock struct {
	lease
	kind  *holdKind
	names []string
	keys  []string // the keys of the acquire script: for an exclusive lock the lock keys, then their waiter sets, then their fence counters
	held  []string // the keys of the refresh and ttl scripts
	rel   []string // the keys of the release script
	// parts is set for an exclusive lock whose names lie in several Redis
	// Cluster hash slots on a cluster (see split): each script then runs
	// once for each part, not once on keys, held and rel.
	parts []part
	// gaveBackBy is the bound of the last give-back of a split lock's
	// parts (see giveBack), which the clean-up after it shares.
	gaveBackBy time.Time
	// leftTaken is set once a split attempt's give-back failed (see
	// takeParts): parts it took, or may have, may be left taken, whatever
	// the error says (a give-back that could not connect hides that the
	// attempt reached the server). Written by the acquiring goroutine
	// alone.
	leftTaken bool
	// gaveBackLate is set when the last give-back (see gaveBackBy) began
	// once the acquisition's context had ended, or ran past its end: it is
	// then part of the acquisition's exit, which has cleanupTimeout in
	// all, and the clean-up after it (and a wait's leaving the waiter
	// sets) share its bound even when it was answered (see exitBy).
	gaveBackLate bool
	// took and others are, for a split lock taken WithToken, the indexes
	// of the names that its attempts took anew, and of those held with its
	// token by another Lock (see noteJoins); written by the acquiring
	// goroutine alone.
	took, others map[int]bool
	// waited is, for a split lock, set at the indexes of the parts where
	// an attempt may have registered its waiting caller, and no later one
	// took it out (see leaveStale); nil until one may have. Written by the
	// acquiring goroutine alone.
	waited []bool
	req    string // this acquisition's request token (Attach by owner sets it before handing the Lock out)
	// givenToken is set when the token (and so req) came from WithToken:
	// other Locks may share req (see Client.tookGrantable).
	givenToken bool
	// ownReq is set for a Lock whose request token dlock made for it, or
	// that is given for one use (see friend.OneUseToken; not given
	// WithToken, nor attached): its Release and clean-up end it,
	// recording it so that a late copy of an acquire is refused (see
	// release.lua, holds_release.lua).
	ownReq bool
	owner  string
	// minHold is WithMinHold in whole milliseconds, rounded up, as a
	// release argument; zero when not given.
	minHold int64
	// reqArg is req as a script argument, boxed once for the acquire
	// attempts and the release: set by the first acquireArgs, on the
	// acquiring goroutine, before the Lock is handed out.
	reqArg any

	// extra returns the kind's acquire arguments after the common ones, for
	// an attempt with wa; nil for none.
	extra func(wa waitArgs) []any
	// permits is a semaphore's count, which extra sends; nil for the
	// other kinds. A waiting caller takes its place in line by it.
	permits *atomic.Int64
	// enqueued is set when a refused attempt recorded the caller as a
	// waiter, which must be taken back if it gives up. Only the acquiring
	// goroutine uses it, and the next two.
	enqueued bool
	// asked is the client channel of the attempts that asked to be granted
	// the lock (see grant.go), whose request a clean-up takes back.
	asked string
	// sent is when the latest attempts that asked were sent.
	sent []sent
	// inline holds the name and keys of a lock on one name, which names and
	// keys then use, in place of allocations of their own.
	inline struct {
		name [1]string
		keys [4]string
	}
	// relIDText is the release id made with the request token, when dlock
	// made that token (see newTokenAndID): relID, once boxed. Set before
	// the Lock is handed out.
	relIDText string

	// Guarded by lease.mu.
	relID  any    // the id every Release of this Lock carries; set by the first
	token  string // the token the lock is held with
	meta   string
	fences []uint64
}

// holdKind is what a Lock holds: the scripts its operations run. Every kind
// answers in the exclusive lock's shapes, so that Lock, its lease and the
// watchdog treat them alike.
type holdKind struct {
	mode                           string // as in Holder.Mode
	refused                        string // why an acquire was refused, after the name
	acquire, release, refresh, ttl *Script
	// modeArg is set for the kinds whose hold scripts take the mode after
	// the common arguments (they are shared by several modes).
	modeArg bool
}

// The modes of a hold, as Holder.Mode and Lock.Mode report them.
const (
	ModeExclusive = "exclusive" // an exclusive lock
	ModeRead      = "read"      // a read hold of an RWMutex
	ModeWrite     = "write"     // the write hold of an RWMutex
	ModePermit    = "permit"    // a permit of a Semaphore
)

var exclusiveHold = &holdKind{mode: ModeExclusive, refused: "is held",
	acquire: scriptAcquire, release: scriptRelease, refresh: scriptRefresh, ttl: scriptTTL}

// args returns the arguments of a script on a hold of the kind.
func (k *holdKind) args(common ...any) []any {
	if k.modeArg {
		return append(common, k.mode)
	}
	return common
}

// TryLock obtains the exclusive lock called name if it is free, in one round
// trip, and returns ErrNotObtained at once if it is not. The options that
// shape a wait (WithMaxWait, WithRetry, WithOnRetry) do nothing here, so
// that one list of options serves TryLock and Lock alike (so for
// TryLockMulti, RWMutex.TryLock and TryRLock, and Semaphore.TryAcquire).
//
// An attempt that gets no reply (ctx ended, or the connection failed) may
// have taken the lock on the server: before returning its error, TryLock
// (as every call that acquires) gives back whatever that attempt may hold,
// for up to 2 seconds more than ctx allowed, so that no half-taken lock
// stays behind; a clean-up that fails is sent once more at once, and if
// that fails too it is logged, and the lock expires with its TTL. (One
// that a Redis Cluster slot being moved, or a cluster down for a
// failover, refuses before running it, or that gets no answer in time (a
// server that stalls, or answers slowly), is sent again in the background,
// at growing intervals up to a second, each try allowed twice as long as
// the last, from half a second up to 4 seconds, until the server answers
// it, for up to a minute or until Close, unless its token was given
// WithToken; its failure is logged then.) A ctx that has already ended
// when it is called sends nothing: the error matches ctx.Err() (every call
// that acquires does the same).
func (c *Client) TryLock(ctx context.Context, name string, opts ...Option) (*Lock, error) {
	return c.obtain(ctx, opts, false, c.exclusiveName(name))
}

// Lock obtains the exclusive lock called name, waiting while it is held.
// A waiting caller is woken by Redis: the release of the lock publishes a
// notice to one waiting client, which lets its first waiting caller try
// again; callers of one client queue in arrival order, except that the
// first attempt of a caller WithOwner or WithToken is made at once (it may
// re-enter a hold that the callers ahead of it wait for; so do those of
// semaphores and read/write locks, recording nothing in Redis), and that a
// LockMulti does not hold up the callers behind it (see LockMulti). A
// waiter also tries again when the holder's lock is due to expire (its
// holder may have died), and at least twice a second in case a notice was
// lost. The retry strategy
// (WithRetry) decides how many attempts are made and how long to back off
// after a Redis error; with a driver that cannot subscribe, its waits are
// also the polling interval.
//
// Lock gives up when the strategy stops, when ctx ends, or after the
// WithMaxWait bound (DefaultMaxWait when ctx has no deadline); the error then
// matches ErrNotObtained, and ctx.Err() when ctx ended. When the last
// answer Redis gave to the caller's attempts (or, while it waited behind
// another caller of its client, to that caller's) was a failure, or Redis
// gave none, the error does not match ErrNotObtained: it carries the
// failure (a *ServerError) when there was one, and matches ctx.Err() when
// ctx ended. So a caller that skips its work while another holds the lock
// does not skip it silently while Redis is down. A refusal that no wait
// changes ends the wait at once with Redis's error, which matches
// ErrDenied: a missing or wrong password (NOAUTH, WRONGPASS), a missing
// ACL permission (NOPERM), a server that does not know the script
// commands (ERR unknown command), a TLS certificate refused (see
// ErrDenied); so does, at the next attempt, the Redis client under the
// driver being closed (ErrClosed).
//
// The lock is not reentrant by default: a caller that already holds it (a
// Do inside a Do on the same name, say) waits for itself until its wait
// ends, with ErrNotObtained. Give both acquisitions one owner
// (WithOwner) to have the second join the first's hold.
func (c *Client) Lock(ctx context.Context, name string, opts ...Option) (*Lock, error) {
	return c.obtain(ctx, opts, true, c.exclusiveName(name))
}

// TryLockMulti obtains the exclusive locks on all of names, or none of them,
// and returns ErrNotObtained at once if any is held. On a single server,
// and on Redis Cluster when the names share one hash slot (a common hash
// tag, such as "{order:42}:pay" and "{order:42}:ship"), that takes one
// atomic round trip.
//
// On Redis Cluster, names in several slots cannot be taken atomically. The
// client learns it is on a cluster from the first such request the server
// refuses, and from then on takes the names slot by slot, one round trip
// for each slot, in an order that is the same for every client (by slot
// number, then by key), so that callers locking overlapping names cannot
// deadlock. If a slot's names are refused, those taken before are released
// before TryLockMulti returns: nothing is left taken, but other clients
// may briefly see some names taken by the attempt that then gave them up.
// Each name is still held by one holder at a time. Release, Refresh, TTL
// and the automatic refresh act on every slot, in one pipeline.
func (c *Client) TryLockMulti(ctx context.Context, names []string, opts ...Option) (*Lock, error) {
	return c.obtain(ctx, opts, false, c.exclusive(names, false))
}

// LockMulti is TryLockMulti that waits as Lock does: a notice about any of
// the names wakes it. It waits in its client's line for its first name, but
// does not hold up the callers behind it there: the name may be free while
// it waits for another, and they try as if it were not ahead of them.
// It holds no place in any name's line: a release hands a name to the
// next caller of that name alone, so beside callers that take each name
// alone without a pause, LockMulti may wait until its max wait runs out.
// Where it must get its turn, have those callers take their names through
// LockMulti too, or a coarser name that all of them lock first.
// Across cluster slots, an attempt that is refused
// gives back what it took before it waits, so it holds nothing while it
// waits, and tries again from the first slot. If Redis does not answer
// that give-back, LockMulti stops waiting, cleans up and returns the error:
// the give-back could still run after its next attempt and undo it.
func (c *Client) LockMulti(ctx context.Context, names []string, opts ...Option) (*Lock, error) {
	return c.obtain(ctx, opts, true, c.exclusive(names, false))
}

// Attach returns the Lock that is held on name with token, so that another
// process (or a later run of this one) can refresh or release a lock it was
// handed. It checks in one round trip that the lock is held with that token
// by the acquisition that made the hold, and returns ErrNotHeld if not (a
// hold re-entered WithOwner and kept by later acquisitions after the first
// was released cannot be attached: the Lock would stand for a released
// acquisition, and neither can the names that an owner's lock on several
// names took anew while it re-entered others: see Lock.Token); the error
// matches ErrKindMismatch too when another kind of
// lock holds the name (Attach is for exclusive locks: a read/write lock's
// or a semaphore's hold is shared by acquiring it again with its token,
// WithToken, whose clean-up after a failed acquire ends the hold for all,
// or WithOwner, whose acquisitions count on their own), and ErrWrongType when its key holds data dlock did not
// write. WithOwner attaches by owner id instead of token
// (token must still not be empty; any text will do), and the Lock takes the
// token the lock is held with: an owner id is then as good as the token,
// and whoever knows it can release the hold, so owner ids should be as
// hard to guess as tokens wherever that matters. The Lock stands for the acquisition that made the
// hold: its Release takes that one away (a lock re-entered by its owner
// stays held by the other acquisitions). The hold is then shared by two
// Locks, and only ever extended from then on (see Refresh), so that neither
// cuts the other's TTL short. WithTTL sets the TTL its refreshes give it
// (DefaultTTL if not given), whatever it was obtained with, and a hold
// with no expiry (an operator's PERSIST) counts as having that TTL left
// from the start; WithAutoRefresh
// and the options that go with it refresh it automatically from the start,
// the first time soon enough to keep it however little of its TTL it has
// left. WithMinHold applies to its Release as to an acquired Lock's (the
// minimum hold counts from when the hold began): a Lock handed over to
// another process keeps the hold after its Release only if Attach is given
// WithMinHold too. Options that only matter to an acquire are ignored.
func (c *Client) Attach(ctx context.Context, name, token string, opts ...Option) (*Lock, error) {
	return c.AttachMulti(ctx, []string{name}, token, opts...)
}

// AttachMulti is Attach for a lock obtained on several names at once.
func (c *Client) AttachMulti(ctx context.Context, names []string, token string, opts ...Option) (*Lock, error) {
	if ctx == nil {
		return nil, ErrNilContext
	}
	if why := badToken(token); why != "" {
		// No lock holds it: WithToken refuses it.
		return nil, fmt.Errorf("%w: Attach with a token that %s (%s)", ErrInvalidToken, why, causes.Quote(token))
	}
	o := newOptions(opts)
	if o.err != nil {
		return nil, o.err
	}
	if c.isClosed() && o.auto {
		return nil, ErrClosed
	}
	l, err := c.newLock(names, false, token, o)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	left, err := l.inspect(ctx, true)
	if l.splitIfRefused(err) {
		start = time.Now()
		left, err = l.inspect(ctx, true)
	}
	if err != nil {
		return nil, err
	}
	if left < 0 {
		// No expiry (an operator's PERSIST): held as long as a refresh
		// would give it, which is short of the truth, and so safe.
		left = o.ttl
	}
	l.start(start, start.Add(left-drift(left)))
	return l, nil
}

// newLock validates names and builds the Lock value an acquisition fills in.
// It keeps names itself when own is set (a slice dlock made), a copy
// otherwise; one name is kept in the Lock, as are its keys.
func (c *Client) newLock(names []string, own bool, token string, o *options) (*Lock, error) {
	if len(names) == 0 {
		return nil, ErrNoNames
	}
	if len(names) == 1 {
		return c.newLockOn(names[0], token, o)
	}
	l := newExclusive(token, o)
	if own {
		l.names = names
	} else {
		l.names = append([]string(nil), names...)
	}
	return c.keyLock(l, o)
}

// newLockOn is newLock for one name, which the Lock keeps itself.
func (c *Client) newLockOn(name, token string, o *options) (*Lock, error) {
	l := newExclusive(token, o)
	l.inline.name[0] = name
	l.names = l.inline.name[:]
	return c.keyLock(l, o)
}

// newExclusive returns an exclusive Lock on no names yet, with token and o.
func newExclusive(token string, o *options) *Lock {
	return &Lock{kind: exclusiveHold, req: token, token: token,
		owner: o.owner, meta: o.metadata, givenToken: o.given(),
		minHold: ceilMilliseconds(o.minHold)}
}

// keyLock validates the names of l, a Lock of newExclusive, gives it their
// keys and readies it.
func (c *Client) keyLock(l *Lock, o *options) (*Lock, error) {
	names := l.names
	n := len(names)
	var keys []string // the lock keys first, see exclusiveKeys
	if n == 1 {
		keys = l.inline.keys[:]
	} else {
		keys = make([]string, 4*n)
	}
	var seen map[string]bool // for many names; a few are compared directly
	if len(names) > 8 {
		seen = make(map[string]bool, len(names))
	}
	for i, name := range names {
		if err := c.checkName(name); err != nil {
			if n == 1 {
				return nil, err
			}
			return nil, fmt.Errorf("%w (name %d of %d)", err, i+1, n)
		}
		// Two names are the same lock when they are the same key ("x" and
		// "{x}"), not only when they are spelt the same.
		key, waiters, fence, late := c.lockKeys(name)
		if seen[key] || (seen == nil && slices.Contains(keys[:i], key)) {
			return nil, fmt.Errorf("%w: %s (the same lock as another name given)", ErrDuplicateName, causes.Quote(name))
		}
		if seen != nil {
			seen[key] = true
		}
		keys[i], keys[n+i], keys[2*n+i], keys[3*n+i] = key, waiters, fence, late
	}
	l.keys, l.held, l.rel = exclusiveKeys(keys)
	if c.cluster.Load() {
		l.parts = l.split()
	}
	l.init(c, o)
	return l, nil
}

// milliseconds returns ms milliseconds as a Duration, the longest one when
// it is longer: Redis keeps expiries (an operator's PEXPIRE, a kept
// WithMinHold(math.MaxInt64), rounded up) that no Duration holds.
func milliseconds(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// ceilMilliseconds returns d in whole milliseconds, rounded up.
func ceilMilliseconds(d time.Duration) int64 {
	ms := d.Milliseconds()
	if d%time.Millisecond > 0 {
		ms++
	}
	return ms
}

// exclusive returns what obtain builds an exclusive lock on names with;
// own as for newLock.
func (c *Client) exclusive(names []string, own bool) func(token string, o *options) (*Lock, error) {
	return func(token string, o *options) (*Lock, error) { return c.newLock(names, own, token, o) }
}

// callBuf is a call and room for its arguments, made in one allocation
// for an acquire attempt or a release on all of a lock's names (see take,
// sendRelease); a new one for each, since a call may still be read, or
// sent again, after the next is made.
type callBuf struct {
	call Call
	args [12]any // as many as an acquire takes (a write hold's with fences kept WithFenceRetention)
}

// argsIn returns buf, room for the arguments of a call, or when buf is nil
// a new slice with room for n.
func argsIn(buf []any, n int) []any {
	if buf == nil {
		return make([]any, 0, n)
	}
	return buf[:0]
}

// exclusiveName returns what obtain builds an exclusive lock on name with.
func (c *Client) exclusiveName(name string) func(token string, o *options) (*Lock, error) {
	return func(token string, o *options) (*Lock, error) { return c.newLockOn(name, token, o) }
}

// init readies a Lock built by one of the primitives: its lease, refreshed
// by the kind's script.
func (l *Lock) init(c *Client, o *options) {
	l.lease.init(c, l, o)
}

// refreshCalls builds the calls that extend the lock to ttl.
func (l *Lock) refreshCalls(ttl time.Duration) []*Call {
	l.mu.Lock()
	token := l.token
	l.mu.Unlock()
	units := l.units()
	calls := make([]*Call, len(units))
	// Its number, and whether it fences off the earlier ones (see
	// refreshNumber).
	n, fence := l.refreshNumber(ttl)
	args := append(l.heldArgs(token, ttl.Milliseconds()), int64(n), argNone)
	if fence {
		args[len(args)-1] = argOne
	}
	for i, p := range units {
		calls[i] = &Call{Script: l.kind.refresh, Keys: p.held, Args: args}
	}
	return calls
}

// refreshed reads the replies of the calls of refreshCalls.
func (l *Lock) refreshed(calls []*Call) error {
	var failed error
	for i, p := range l.units() {
		err := l.refreshedPart(p, calls[i])
		if errors.Is(err, ErrNotHeld) {
			return err // lost, whatever the other parts answered
		}
		failed = cmp.Or(failed, err)
	}
	return failed
}

// gone says what may have become of a hold the Lock found gone: one whose
// token other Locks may share (given WithToken, or attached) may have been
// released by one of them.
func (l *Lock) gone() string {
	if l.ownReq {
		return "had expired or was taken"
	}
	return "had expired, was taken, or was released by another Lock of its token"
}

// refreshedPart reads the reply of the refresh of one part.
func (l *Lock) refreshedPart(p part, call *Call) error {
	if call.Err != nil {
		return l.holdError(p, call.Err)
	}
	switch i, ok := call.Val.(int64); {
	case !ok:
		return l.badReply(call.Val)
	case i > 0:
		return fmt.Errorf("%w: %s %s", ErrNotHeld, l.describeName(p.name(l.names, i)), l.gone())
	case i < 0:
		return forceReleased(l.describeName(p.name(l.names, -i)))
	}
	return nil
}

// obtain makes attempts to acquire the Lock that build returns until one
// succeeds, or, when wait is false, once.
func (c *Client) obtain(ctx context.Context, opts []Option, wait bool, build func(token string, o *options) (*Lock, error)) (*Lock, error) {
	if ctx == nil {
		return nil, ErrNilContext
	}
	o := newOptions(opts)
	if o.err != nil {
		return nil, o.err
	}
	if c.isClosed() {
		return nil, ErrClosed
	}
	token, relID := o.token, ""
	if token == "" {
		token, relID = newTokenAndID()
	}
	l, err := build(token, o)
	if err != nil {
		return nil, err
	}
	l.relIDText = relID
	l.ownReq = !o.given()
	returned := false
	// The context of the acquisition: the hooks' once they began it, hctx
	// below. (Not ctx reassigned: o.onRetry keeps the hooks' context, and
	// ctx, reassigned, would then be allocated for every acquisition.)
	var hookCtx context.Context
	defer func() {
		if !returned {
			if hookCtx != nil {
				ctx = hookCtx
			}
			l.lostToPanic(ctx)
		}
	}()
	if len(c.hooks) == 0 {
		err = l.obtain(ctx, o, wait, l.acquire)
		returned = true
		if err != nil {
			return nil, err
		}
		return l, nil
	}
	// Followed by hooks: count the attempts, time the wait, report the
	// retries and the outcome.
	h := &hooked{c: c, info: HookInfo{Mode: l.kind.mode, Names: l.names, Wait: wait}, logged: o.logHooks}
	l.hook = h
	hctx := h.acquireStart(ctx)
	hookCtx = hctx
	start, attempts := time.Now(), 0
	onRetry := o.onRetry
	o.onRetry = func(failed int, err error) {
		if onRetry != nil {
			onRetry(failed, err)
		}
		h.retry(hctx, failed, err)
	}
	func() {
		// A hook that panics mid-acquisition (or a function that calls
		// runtime.Goexit) still sees it end.
		obtained := false
		defer func() {
			if obtained {
				return
			}
			p := recover()
			why := "runtime.Goexit"
			if p != nil {
				why = fmt.Sprintf("a panic (%v)", p)
			}
			h.acquireDone(hctx, AcquireResult{Outcome: OutcomeError, Wait: time.Since(start), Attempts: attempts,
				Err: fmt.Errorf("dlock: %s ended the acquisition", why)})
			if p != nil {
				panic(p)
			}
		}()
		err = l.obtain(hctx, o, wait, func(ctx context.Context, wa waitArgs) (time.Duration, error) {
			attempts++
			return l.acquire(ctx, wa)
		})
		obtained = true
	}()
	r := AcquireResult{Outcome: outcome(err), Wait: time.Since(start), Attempts: attempts, Err: err}
	if err == nil {
		r.Fence = l.Fence()
		func() {
			// The lock's End, when it ended as these hooks ran, comes
			// right after them, a panic of theirs included.
			defer l.told()
			h.acquireDone(hctx, r)
		}()
	} else {
		h.acquireDone(hctx, r)
	}
	returned = true
	if err != nil {
		return nil, err
	}
	return l, nil
}

// lostToPanic gives back the lock of an acquisition that a panic or
// runtime.Goexit ended after it was obtained (in a hook, or a logger): its
// caller never gets the Lock, so nothing else would release it or stop
// refreshing it. One obtained WithToken is not given back, only no longer
// refreshed: its hold may be another Lock's too. Its End hooks are called,
// with an error wrapping ErrLost, only when AcquireDone said obtained (a
// panic in a later set of hooks than one that counted the lock held). An
// acquisition ended before it obtained the lock has given back what its
// attempts may hold (see onRetry).
func (l *Lock) lostToPanic(ctx context.Context) {
	l.mu.Lock()
	started, told := l.started, l.hooksTold
	l.mu.Unlock()
	if !started {
		return
	}
	// Given back even when an End hook panics as the lease ends.
	defer func() {
		if l.ownReq {
			l.cleanup(ctx, true)
		}
		l.ended()
	}()
	if told {
		// Given back, unless obtained WithToken: its hold may be another
		// Lock's too, which the cleanup leaves it.
		how := "given back"
		if !l.ownReq {
			how = "left to its token's other holders"
		}
		l.end(fmt.Errorf("%w: %s: %s: a panic or runtime.Goexit ended its acquisition before its caller got it", ErrLost, l.describe(), how))
	} else {
		l.drop()
	}
}

// obtain makes the attempts of an acquisition: one, or, when wait is set,
// as many as Lock describes.
func (l *Lock) obtain(ctx context.Context, o *options, wait bool, try attempt) error {
	if !l.c.underway() {
		// Close came after Client.obtain's check, and does not wait for
		// this acquisition: it must send nothing.
		return ErrClosed
	}
	defer l.c.finished()
	if ctx.Err() != nil {
		// Nothing is sent, so nothing is left behind to clean up.
		return fmt.Errorf("dlock: %s: not attempted: its context had ended (%w)", l.describe(), endOf(ctx))
	}
	if !wait {
		if _, err := try(ctx, waitArgs{}); err != nil {
			refused, ranInPart := refusedForGood(err)
			return l.abandon(ctx, !errors.Is(err, ErrNotObtained) && !isFinal(err) && (!refused || ranInPart), l.reached(err), err)
		}
		return l.obtained(ctx, o)
	}
	// reached is set once an attempt may have reached the server: not
	// one that could not connect (see abandon).
	reached, tried := false, try
	try = func(ctx context.Context, wa waitArgs) (time.Duration, error) {
		d, err := tried(ctx, wa)
		reached = reached || l.reached(err)
		return d, err
	}
	if err := l.c.waitFor(ctx, l.nameKeys(), l.names, l.describe()+l.countNote(" (", ")"), o, l.eager(o), l.kind == exclusiveHold || l.kind == writeHold, try, grantee{req: l.req, claim: l.claim, permits: l.permits, lone: l.kind == exclusiveHold, exitBy: l.exitBy}, func(uncertain bool, err error) error {
		return l.abandon(ctx, uncertain, reached, err)
	}); err != nil {
		return err
	}
	return l.obtained(ctx, o)
}

// reached reports whether the attempt that failed with err may have
// reached the server: not one that could not connect, unless a split
// attempt took parts and could not give them back (its error is the
// give-back's, which may be a refused dial).
func (l *Lock) reached(err error) bool {
	return !refusedDial(err) || l.leftTaken
}

// exitBy returns the bound of the acquisition's last give-back when it
// began the acquisition's exit (see gaveBackLate), else the zero time.
// Read by the acquiring goroutine alone.
func (l *Lock) exitBy() time.Time {
	if !l.gaveBackLate {
		return time.Time{}
	}
	return l.gaveBackBy
}

// obtained ends an acquisition that obtained the lock.
func (l *Lock) obtained(ctx context.Context, o *options) error {
	if o.auto && l.c.isClosed() {
		// Close came while it was obtained: no lock that nothing
		// refreshes, and none its caller hears of. It is given back as a
		// failed acquire's would be (this acquisition only, with no
		// minimum hold), unless its token was given (WithToken): the hold
		// may be another Lock's too, and is left to its TTL.
		l.drop()
		if l.ownReq {
			l.cleanup(ctx, true)
		}
		l.ended()
		return fmt.Errorf("%s: %w", l.describe(), ErrClosed)
	}
	if l.c.log.Enabled(ctx, slog.LevelDebug) {
		l.c.log.DebugContext(ctx, "dlock: obtained", "names", l.lockNames(), "mode", l.kind.mode)
	}
	return nil
}

// eager reports whether a waiting acquisition's first attempt goes ahead of
// the callers of its client that wait for the lock (see waitFor): an
// owner's or a token's, which may re-enter a hold they wait for. Such an
// attempt records nothing in Redis (a read/write lock's pending writer or
// queue entry), which would keep the callers ahead of it out.
func (l *Lock) eager(o *options) bool {
	return l.owner != "" || o.given()
}

// acquire makes one attempt. When the lock is held by another, it returns
// ErrNotObtained and how long the holder's lock has left.
func (l *Lock) acquire(ctx context.Context, wa waitArgs) (time.Duration, error) {
	start := time.Now()
	ttl := l.currentTTL()
	if wa.channel != "" && l.asksGrant() {
		wa.attempt = l.nextAttempt(start, ttl)
		l.asked = wa.channel
	}
	token, fences, holderTTL, err := l.take(ctx, ttl, wa)
	if err != nil {
		if wa.attempt != "" && errors.Is(err, ErrNotObtained) {
			l.enqueued = true // its request must go if it gives up
		}
		return holderTTL, err
	}
	deadline := start.Add(ttl - drift(ttl))
	if !time.Now().Before(deadline) {
		// The reply came back too late to be of use: the lock may already
		// have expired and been taken by another. Not a refusal: the
		// request's outcome is of no use, as when its reply is lost.
		err := &ServerError{Key: l.keys[0], Err: errLateReply}
		if wa.waiting {
			// Not given back: the caller's next attempt, at once, takes
			// the lock again if it is still held with the request token,
			// and a release sent now could run after that attempt (on
			// another connection, or sent again by the client library) and
			// free the lock under it. A caller that gives up cleans up.
			return 0, fmt.Errorf("%w (%w)", errLate, err)
		}
		return 0, err // the caller cleans up, as after a lost reply
	}
	l.mu.Lock()
	l.token, l.fences = token, fences
	l.mu.Unlock()
	if l.givenToken && l.asksGrant() {
		l.c.tookGrantable(l.req, fences[0])
	}
	l.start(start, deadline)
	return 0, nil
}

// take runs the acquire script: once on all of the lock's names, or, for a
// lock split by slot, once for each part (see takeParts). It returns the
// token the names are held with and their fences.
func (l *Lock) take(ctx context.Context, ttl time.Duration, wa waitArgs) (token string, fences []uint64, holderTTL time.Duration, err error) {
	if l.parts == nil {
		b := new(callBuf)
		token, fences, _, holderTTL, err = l.takePart(ctx, part{keys: l.keys}, l.acquireArgs(ttl, wa, b.args[:0]), &b.call)
		if !l.splitIfRefused(err) {
			return token, fences, holderTTL, err
		}
	}
	return l.takeParts(ctx, ttl, wa)
}

// acquireArgs returns the arguments of the acquire script, in buf when it
// is not nil (see argsIn).
func (l *Lock) acquireArgs(ttl time.Duration, wa waitArgs, buf []any) []any {
	if l.reqArg == nil {
		l.reqArg = l.req
	}
	if wa.channel == "" && l.extra == nil && l.asked == "" && !l.givenToken {
		// Not waiting: the exclusive acquire needs no waiter arguments.
		if l.c.fenceKeep == nil {
			return append(argsIn(buf, 4), l.reqArg, l.c.ttlArg(ttl), l.meta, l.owner)
		}
		return l.c.fenceArg(append(argsIn(buf, 11), l.reqArg, l.c.ttlArg(ttl), l.meta, l.owner), 10)
	}
	args := append(argsIn(buf, 11), l.reqArg, l.c.ttlArg(ttl), l.meta, l.owner, wa.channel, cmp.Or(wa.more, "0"), waitLeaseArg)
	switch {
	case l.extra != nil:
		return append(args, l.extra(wa)...)
	case wa.attempt != "":
		args = append(args, wa.attempt)
	case wa.channel == "" && l.asked != "":
		// An earlier attempt asked for a grant with l.asked; this one
		// does not register, and takes the request back if it obtains.
		args = append(args, "", l.asked)
	}
	if l.givenToken {
		// The caller's token, which it may use again once this
		// acquisition ended: not refused for that (see acquire.lua).
		for len(args) < 9 {
			args = append(args, argNone)
		}
		args = append(args, argOne)
	}
	return l.c.fenceArg(args, 10) // how long the fence counter is kept
}

// takePart runs the acquire script on the names of p. When one is held by
// another, it returns ErrNotObtained and how long the holder's lock has
// left. joins is the script's report of the names it joined as repeats,
// when args ask for it (see takeParts), or else "".
func (l *Lock) takePart(ctx context.Context, p part, args []any, call *Call) (token string, fences []uint64, joins string, holderTTL time.Duration, err error) {
	if call == nil {
		call = new(Call)
	}
	call.Script, call.Keys, call.Args = l.kind.acquire, l.scriptKeys(p.keys), args
	l.c.evalWith(ctx, l.repl, call.one()...)
	v, err := call.Val, call.Err
	if err != nil {
		return "", nil, "", 0, l.replyError(p, err)
	}
	r, ok := v.([]any)
	if !ok || len(r) < 2 {
		return "", nil, "", 0, l.badReply(v)
	}
	if got, _ := r[0].(int64); got == 0 {
		// {0, pttl, i}, and for kinds that record waiters whether this
		// attempt did.
		if len(r) != 3 && len(r) != 4 {
			return "", nil, "", 0, l.badReply(v)
		}
		if len(r) == 4 {
			queued, _ := r[3].(int64)
			l.enqueued = l.enqueued || queued == 1
		}
		pttl, _ := r[1].(int64)
		i, _ := r[2].(int64)
		return "", nil, "", milliseconds(pttl + 1),
			&refusal{key: p.keys[p.at1(l.names, i)], name: p.name(l.names, i), why: l.kind.refused, note: l.countNote(" (", ")")}
	}
	token, _ = r[1].(string)
	rest := r[2:]
	if n := len(rest); n > 0 {
		if s, ok := rest[n-1].(string); ok {
			joins, rest = s, rest[:n-1]
		}
	}
	fences, ok = int64s(rest)
	if token == "" || !ok || len(fences) != p.size(l.names) || joins != "" && len(joins) != len(fences) {
		return "", nil, "", 0, l.badReply(v)
	}
	return token, fences, joins, 0, nil
}

// abandon ends a failed acquisition. If an attempt may have taken the lock
// unseen (its reply was lost) or recorded the caller as a waiter, it
// releases it so that nothing is left behind. reached says whether an
// attempt may have reached the server (see below).
func (l *Lock) abandon(ctx context.Context, uncertain, reached bool, err error) error {
	if uncertain || l.enqueued {
		by := time.Now().Add(cleanupTimeout)
		if errors.Is(err, errGiveBack) {
			// The give-back that failed had the same bound: both end
			// within it (a clean-up left no time is sent again in the
			// background, see cleanupWithin; not one of a given token,
			// which gets a try of its own).
			by = l.gaveBackBy
			if !l.ownReq {
				if least := time.Now().Add(lateCleanupTry); by.Before(least) {
					by = least
				}
			}
		}
		if exit := l.exitBy(); !errors.Is(err, errGiveBack) && !exit.IsZero() && exit.Before(by) {
			// A give-back that ran past the context's end, answered,
			// began the exit: the clean-up has what is left of its
			// bound (a clean-up left no time goes on in the background).
			by = exit
			if !l.ownReq {
				if least := time.Now().Add(lateCleanupTry); by.Before(least) {
					by = least
				}
			}
		}
		// An acquisition whose attempts could not connect ran nowhere,
		// most likely: its clean-up, which could not either, is not
		// dialed for a minute. One whose attempt reached the server (its
		// reply lost, or late), even if a later one could not connect,
		// may have taken the name there: its clean-up goes on past
		// refused dials (a server restarted with its data, or replaced in
		// a failover).
		l.cleanupBy(ctx, by, true, reached)
	}
	l.ended()
	return err
}

// ended tells the client's wait hub that a Lock that asked for grants
// ended (see waitHub.forget).
func (l *Lock) ended() {
	if l.asked != "" {
		l.c.hub().forget(l.req, l.Fence())
	}
}

// cleanup releases what this acquisition's request token may hold, and
// the waiter it may have recorded, on a context that outlives ctx's
// cancellation but is bounded in time. It only matches the request token,
// never the owner, so it cannot take away another acquisition's hold.
//
// It is the clean-up of a lock that was obtained: it dials later (see
// followUp).
func (l *Lock) cleanup(ctx context.Context, logFailure bool) {
	l.cleanupBy(ctx, time.Now().Add(cleanupTimeout), logFailure, true)
}

// cleanupBy is cleanup bounded by the time by; dialLater as for followUp.
func (l *Lock) cleanupBy(ctx context.Context, by time.Time, logFailure, dialLater bool) {
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), by)
	defer cancel()
	l.cleanupWithin(ctx, logFailure, dialLater, nil)
}

// cleanupWithin is cleanup within ctx as it is. done, unless nil, is
// given the clean-up's calls once they have their outcomes (in the
// background when they went on there), none when it sent nothing;
// dialLater as for followUp.
func (l *Lock) cleanupWithin(ctx context.Context, logFailure, dialLater bool, done func(calls []*Call)) {
	answered := func(calls []*Call) {
		if done != nil {
			done(calls)
		}
	}
	var args []any
	if l.kind.modeArg {
		// The request token, no owner, the mode, no release id (only a
		// Release is ever sent twice), and: take back what the acquisition
		// of that request token added (see holds), and its pending
		// acquire; and whether it ends there.
		args = append(l.kind.args(l.req, ""), "", "1", l.endsArg())
	} else {
		// The acquisition, by its request token; no id; the client
		// channel whose request the acquisition may have left for a grant;
		// any fence, no minimum hold; and whether it ends there.
		// And how long a fence counter is kept, for a grant.
		args = l.c.fenceArg([]any{l.req, "", l.asked, "", "", l.endsArg()}, 7)
	}
	units := l.ownUnits()
	if len(units) == 0 {
		answered(nil)
		return // every name is another Lock's of its token
	}
	calls := l.send(ctx, replication{}, units, func(p part) *Call {
		return &Call{Script: l.kind.release, Keys: p.rel, Args: args}
	})
	l.followUp(ctx, calls, dialLater, func(ctx context.Context, calls []*Call) {
		l.cleanedUp(ctx, calls, logFailure)
		answered(calls)
	})
}

// followUp sends the calls of a clean-up or a give-back again at once
// where they failed (see sendAgain), and then has done take them, with a
// context. Refused by a moving slot's split keys, or a cluster down for a
// failover, or not answered in time (a server that stalls, or that the
// network cuts off), they are sent again in the background, so that the
// caller does not wait for them, until the server answers (see
// cleanUpLate), and done comes after; with dialLater, so are those that
// could not connect (a give-back of a lock that was held, or the clean-up
// of an acquire that reached the server: a server restarted with its
// data, or replaced in a failover, frees the name once reached, rather
// than at its TTL; not the clean-up of an acquire that could not connect
// itself, and ran nowhere, most likely: one for each acquire tried while a
// server is down would dial it for a minute). Only for a request token
// of dlock's own, which no later acquisition uses: a late clean-up of a
// given token could take the hold of its next acquire.
func (l *Lock) followUp(ctx context.Context, calls []*Call, dialLater bool, done func(ctx context.Context, calls []*Call)) {
	l.sendAgain(ctx, calls)
	l.wakeAlone()
	if l.ownReq && slices.ContainsFunc(calls, func(c *Call) bool { return tryLaterDialing(c.Err, dialLater) }) &&
		l.c.inBackground(lateCleanup, func(ctx context.Context) {
			l.cleanUpLate(ctx, calls, dialLater)
			l.wakeAlone()
			done(ctx, calls)
		}) {
		return
	}
	done(ctx, calls)
}

// wakeAlone wakes the client's callers first in line for the names of a
// lock split by slot, which it may have freed (see Client.wakeAlone): the
// attempts that took them slot by slot took the client out of their waiter
// sets (see takeParts), so the release in Redis does not tell it.
func (l *Lock) wakeAlone() {
	if l.parts != nil {
		l.c.wakeAlone(l.keys[:len(l.names)])
	}
}

// cleanUpLate sends the calls of a clean-up again, a little later, and
// again, while the server refused them unrun (see waitOutRefused) or did
// not answer them in time (or, with dialLater, could not be reached),
// within ctx. An acquire that got no answer may
// still be on its way, or wait in a stalled server's buffers, and run
// later, taking the lock for nobody: the clean-up that the server answers,
// run before it or after, leaves nothing (it records the acquisition's
// end, which such a late copy finds). One that cannot be sent (no
// connection to a server that stalls) would leave it held until its TTL.
// Each try has lateCleanupTry, twice as long after one that timed out, up
// to lateCleanupTryMost: a slow server, whose answers take longer than a
// try, answers one then (a driver that drops the connection of a request
// that timed out needs a handshake as well), which a Close under way
// cuts to its bound.
func (l *Lock) cleanUpLate(ctx context.Context, calls []*Call, dialLater bool) {
	var again []*Call
	try := lateCleanupTry
	for wait := refusedBackoff; ; {
		again = again[:0:0]
		most := refusedMaxBackoff // while refused unrun only: a slot's move ends soon
		for _, call := range calls {
			if tryLaterDialing(call.Err, dialLater) {
				again = append(again, call)
			}
			if call.Err != nil && (isTimeout(call.Err) || unsent(call.Err) || refusedDial(call.Err)) {
				most = lateCleanupBackoff // a stalled server, a full pool, or one down: no hurry
			}
		}
		if len(again) == 0 || !sleep(ctx, wait) {
			return
		}
		wait = min(2*wait, most)
		for _, call := range again {
			call.Val, call.Err = nil, nil
		}
		// A try of its own bound: Close's end of ctx does not end a
		// request of give-backs already sent (see batcher.send).
		bound := try
		if by := l.c.closeBy(); !by.IsZero() {
			bound = min(bound, time.Until(by))
		}
		actx, cancel := context.WithTimeout(ctx, bound)
		l.c.evalWith(actx, replication{}, again...)
		cancel()
		if slices.ContainsFunc(again, func(c *Call) bool { return c.Err != nil && isTimeout(c.Err) }) {
			try = min(2*try, lateCleanupTryMost)
		}
	}
}

// cleanedUp logs the failure of a clean-up's calls, with logFailure.
func (l *Lock) cleanedUp(ctx context.Context, calls []*Call, logFailure bool) {
	for _, call := range calls {
		if call.Err != nil && logFailure {
			l.c.log.WarnContext(ctx, "dlock: could not clean up after a failed acquire; the lock expires with its TTL", "names", l.lockNames(), "err", call.Err)
			return
		}
	}
}

// sendAgain sends once more, at once, the calls of a release or a clean-up
// that failed for a reason a retry may change, while ctx lasts: for a
// connection the server closed under them (a client library that does not
// retry, or that took a connection the server had closed). Both may run
// twice: a release is known by its id, and a clean-up finds nothing of its
// acquisition left the second time and records its end again. A server
// that is down fails them as fast. A call that timed out is not sent
// again: the server stalled, and a copy would wait as long (with a ctx
// that has no deadline, for the client library's read timeout once more).
// A Release then sends the calls that the server refused before running
// them again a little later, for a while (see waitOutRefused); a clean-up
// does that in the background (see cleanupWithin): its caller (an acquire
// that failed) would wait up to 2s more while a slot moves, and in
// TestALockHeldWhileItsSlotMigrates that made each attempt of the other
// client so slow that the migration outlasted the held lock's TTL.
func (l *Lock) sendAgain(ctx context.Context, calls []*Call) {
	var again []*Call
	for _, call := range calls {
		if call.Err != nil && ctx.Err() == nil && !isTimeout(call.Err) {
			if refused, _ := refusedMessage(call.Err); !refused {
				call.Val, call.Err = nil, nil
				again = append(again, call)
			}
		}
	}
	if len(again) > 0 {
		l.c.evalWith(ctx, replication{}, again...)
	}
}

// waitOutRefused sends again, a little later, the calls that the server
// refused before running them. A slot whose keys are split between two
// nodes while it moves (TRYAGAIN, or an ASK to no avail), or a cluster
// that is down for a failover, refuses a release until that is over: a
// little later it runs (rueidis does not send a TRYAGAIN again itself, and
// go-redis gives up after its few retries), within ctx and refusedRetries.
func (l *Lock) waitOutRefused(ctx context.Context, calls []*Call) {
	var again []*Call
	start := time.Now()
	for wait := refusedBackoff; ; wait = min(2*wait, refusedMaxBackoff) {
		again = again[:0:0]
		for _, call := range calls {
			if call.Err != nil && sendLater(call.Err) {
				again = append(again, call)
			}
		}
		if len(again) == 0 || time.Since(start)+wait > refusedRetries || !sleep(ctx, wait) {
			return
		}
		for _, call := range again {
			call.Val, call.Err = nil, nil
		}
		l.c.evalWith(ctx, replication{}, again...)
	}
}

// sleep waits d, and reports whether ctx is still alive after it.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

const (
	// lateCleanup bounds how long a clean-up is sent again in the
	// background (see cleanUpLate), lateCleanupTry its first try, up to
	// lateCleanupTryMost a later one, and lateCleanupBackoff the wait
	// between tries.
	lateCleanup        = time.Minute
	lateCleanupTry     = 500 * time.Millisecond
	lateCleanupTryMost = 4 * time.Second
	lateCleanupBackoff = time.Second
	// refusedRetries bounds how long a release that the server refused
	// before running it (see refusedUnrun) is sent again.
	refusedRetries = cleanupTimeout
	// refusedBackoff is the first wait before it goes again, doubled up to
	// refusedMaxBackoff.
	refusedBackoff    = 10 * time.Millisecond
	refusedMaxBackoff = 200 * time.Millisecond
)

// giveBackNode releases l as Release does. When Redis does not answer in
// time, or refuses the release before running it for longer than ctx
// allows (BUSY, NOREPLICAS; see sendLater), or cannot be reached (a
// refused dial: a node restarting with its data, or failing over; see
// followUp), and the request token is
// dlock's own, the acquisition's clean-up
// is sent in the background, again until Redis answers it (see
// cleanupWithin), so that the hold does not stay until its TTL: the
// release may not have run.
// Whether it runs before the clean-up or after, the clean-up takes only
// what the acquisition holds, if anything. Once the clean-up has freed
// every name it held (not found them gone), a give-back called again (a
// Redlock Release called again, as its error says to) succeeds at once:
// the lock was given back. See friend.GiveBack.
func (l *Lock) giveBackNode(ctx context.Context) error {
	l.mu.Lock()
	back, giving := l.givenBack, l.givingBack
	l.mu.Unlock()
	if back {
		return nil
	}
	// What the node's server did, not what its Lock's clock says: a lock
	// whose deadline passed here while the node still had it counts as
	// freed there (see redlock).
	err := l.releaseReporting(ctx, false)
	if giving != nil && errors.Is(err, ErrNotHeld) {
		// The clean-up of the last give-back may have freed it, and be
		// answered any moment: its outcome, within ctx, decides, and
		// none within ctx leaves the outcome unknown.
		select {
		case <-giving:
		case <-ctx.Done():
			return fmt.Errorf("dlock: %s: its give-back is under way: %w", l.describe(), context.Cause(ctx))
		}
		l.mu.Lock()
		back = l.givenBack
		l.mu.Unlock()
		if back {
			return nil
		}
	}
	if giving != nil {
		select {
		case <-giving:
		default:
			return err // its clean-up is under way still
		}
	}
	l.mu.Lock()
	back = l.givenBack // by a clean-up answered meanwhile
	l.mu.Unlock()
	if back {
		return nil
	}
	if tryLaterDialing(err, true) && l.ownReq {
		giving := make(chan struct{})
		l.mu.Lock()
		l.givingBack = giving
		l.mu.Unlock()
		if !l.cleanUpInBackground(func(calls []*Call) {
			l.mu.Lock()
			l.givenBack = l.givenBack || freedAll(calls)
			l.mu.Unlock()
			close(giving)
		}) {
			close(giving)
		}
	}
	return err
}

// cleanUpInBackground sends the clean-up of the acquisition on a goroutine
// of the client's own, bounded by cleanupTimeout and then going on as
// cleanupWithin does; done as for cleanupWithin. It reports whether it
// did: not once Close is done with the clean-ups under way.
// A give-back of a lock that was held, it dials later (see followUp).
func (l *Lock) cleanUpInBackground(done func(calls []*Call)) bool {
	return l.c.inBackground(cleanupTimeout, func(ctx context.Context) { l.cleanupWithin(ctx, false, true, done) })
}

// giveBackLater gives the lock back in the background after a release
// that failed with err before a server answered it (a timeout, a refusal
// that passes, such as BUSY, or no connection) when nobody can call Release again
// (Do's): that release is sent again, the same request, until a server
// answers it, for up to a minute, as a failed acquire's clean-up is (see
// cleanupWithin). A release that ran, its reply lost, is found done by its
// id (see release.lua), and the lock ends released. Being the release, it
// keeps a hold WithMinHold until its minimum hold has passed. Not for a
// lock whose token was given (WithToken), whose next acquisition the
// release could take: that one runs out with its TTL. Until its outcome, a
// refresh that finds the lock gone does not end it as lost (see
// setGivingBack): the release it crossed may be found done. It reports
// whether the release went on.
func (l *Lock) giveBackLater(err error) bool {
	if !tryLaterDialing(err, true) || !l.ownReq {
		return false
	}
	l.mu.Lock()
	token, id := l.token, l.relID
	l.mu.Unlock()
	if id == nil {
		return false // no release was sent
	}
	units := l.units()
	return l.c.inBackground(cleanupTimeout, func(ctx context.Context) {
		l.followUp(ctx, l.sendRelease(ctx, units, token, id), true, func(_ context.Context, calls []*Call) {
			if freedAll(calls) && time.Now().Before(l.Deadline()) {
				// Given back in time: released, not lost. On the client's
				// own goroutine: an End hook's panic is logged.
				l.endBy(nil, true)
			}
			l.setGivingBack(false, true)
		})
	})
}

// freedAll reports whether the calls of a release or a clean-up freed
// every name they were sent for: each answered that it missed none.
func freedAll(calls []*Call) bool {
	for _, c := range calls {
		if n, ok := c.Val.(int64); c.Err != nil || !ok || n != 0 {
			return false
		}
	}
	return len(calls) > 0
}

// giveBackRest releases, within ctx, the names of a lock on several that
// a request found lost: one name gone (expired, force-released) leaves
// the others held, by nobody, for up to a TTL (the refresh of a split
// lock extended the parts still held). It releases by the request token,
// as cleanup does: only this acquisition's own. A lock on one name is
// lost whole. Not a lock whose token was given (WithToken), which another
// Lock may share, nor one kept for a minimum hold, which a release would
// keep until then: those run out with their TTL.
func (l *Lock) giveBackRest(ctx context.Context) {
	if len(l.names) > 1 && l.ownReq && l.minHold == 0 {
		l.cleanupWithin(ctx, false, true, nil)
	}
}

// cleanupTimeout bounds the release that follows a failed acquisition, or
// the end of Do's function, or that a Release called with an ended context
// makes.
const cleanupTimeout = 2 * time.Second

// releaseAfter releases the lock once ctx may have ended: on a context that
// outlives ctx's cancellation, bounded by cleanupTimeout.
func (l *Lock) releaseAfter(ctx context.Context) error { return l.releaseAfterReporting(ctx, true) }

// releaseAfterReporting is releaseAfter, reporting a loss as
// releaseReporting does.
func (l *Lock) releaseAfterReporting(ctx context.Context, reportLoss bool) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return l.releaseReporting(ctx, reportLoss)
}

// Release gives the lock up. It returns ErrNotHeld if Redis no longer had it:
// expired, taken over, force-released, or released by another Lock of its
// token (one attached to it); with several names, the names still held are
// released all the same. Such a Release ends the lock as lost, and its error
// matches ErrLost too, as Err then does. A Release called after one of its
// own freed the Lock returns ErrNotHeld alone, without asking Redis, and Err
// stays nil. It also returns ErrNotHeld, with the loss Err reports (ErrLost),
// for a Lock that had ended as lost before Release was called: one ended by
// its local deadline (Done closed: a refresh that did not come in time,
// WithMaxHold) may still be on the server for the drift allowance (1% of the
// TTL, and 2ms), which Release frees all the same, but the work done under it
// may have outlived the time it was safe (its End hooks and log see the loss,
// not a release); when the request fails, its error is joined to the loss
// (the server may then keep the name until its TTL). So does a Release whose
// reply comes after the lock's deadline, as a Refresh does, even though it
// freed the name: Done closes at the deadline whatever is under way, the lock
// ending as lost then, and Release, Err and the End hooks say so alike. A
// lock re-entered by its owner (WithOwner) is freed when every acquisition
// has been released. One obtained WithMinHold stays taken, by nobody, until
// its minimum hold has passed, when the Release that frees it comes sooner (a
// Release sent again after that time reports ErrNotHeld, and ErrLost, the
// kept hold having run out and taken the record of the first with it). Done
// is closed once Release returns without a Redis error (unless End hooks run
// on another goroutine as the lock ends there: see Hooks.End). Release stops
// the automatic refreshing first, so a lock whose Release failed runs out
// with its TTL, as a crashed holder's would; calling Release again frees it
// sooner. A request that fails (a connection the server closed under it) is
// sent once more at once before Release gives up; one that timed out (a
// server that stalled) is not. Every Release of one Lock is the same request:
// one whose first call ran on the server but whose reply was lost counts as
// done (while the name keeps its record: an exclusive lock's last eight
// releases or more, a read/write lock's or semaphore's last 64 or two
// seconds'; after more releases of others came between, it reports
// ErrNotHeld, and ErrLost, as dlock cannot tell it from a lock that expired,
// the lock freed all the same), and so do Releases called at once from
// several goroutines (each returns nil when the lock was freed); only a
// Release called after one has returned reports ErrNotHeld for a lock already
// released. A ctx that has already ended when Release is called (that of a
// request a deferred Release belongs to, say) does not stop it: Release then
// keeps ctx's values and gives itself up to 2 seconds, since a lock given
// back is never wrong and one left behind blocks others for its TTL.
//
// Release panics if l is nil: check the error of the call that obtained it.
func (l *Lock) Release(ctx context.Context) error {
	if l == nil {
		panic("dlock: Release of a nil *Lock")
	}
	l.made()
	return l.releaseReporting(ctx, true)
}

// releaseReporting is Release; with reportLoss unset, a lock lost here
// before but still on the server, which it frees, returns nil, and one
// found gone returns ErrNotHeld alone (not ErrLost).
func (l *Lock) releaseReporting(ctx context.Context, reportLoss bool) error {
	if ctx == nil {
		return ErrNilContext
	}
	if l.hook == nil {
		return l.release(ctx, reportLoss)
	}
	// No longer refreshed from here on, as release would mark it: a
	// ReleaseStart hook that panics (in Do, say, whose deferred release is
	// for fn's panic only) must not leave the lock refreshed for good.
	l.mu.Lock()
	if !l.released {
		l.letGo = true
	}
	l.mu.Unlock()
	ctx = l.hook.releaseStart(ctx)
	returned := false
	defer func() {
		if !returned {
			// An End hook panicked as the release ended the lock.
			l.hook.releaseDone(ctx, l.heldFor(), errors.New("dlock: a panic in a hook cut the release short"))
		}
	}()
	err := l.release(ctx, reportLoss)
	returned = true
	l.hook.releaseDone(ctx, l.heldFor(), err)
	return err
}

func (l *Lock) release(ctx context.Context, reportLoss bool) error {
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
	}
	// A lock already lost here (its deadline passed, say) may still be on
	// the server, which the release frees: it returns the loss all the
	// same, as work done under the lock may have outlived its safety.
	var lost error
	if reportLoss {
		lost = l.Err()
	}
	l.mu.Lock()
	released, token, relOut := l.released, l.token, l.relOut
	if released && !l.relReturned {
		// Called before the Release that succeeded returned: the same
		// request, the same outcome.
		out := l.relOut
		l.mu.Unlock()
		return out
	}
	l.letGo = true // the watchdog stops: if this request fails, the lock runs out with its TTL
	l.relFailed = nil
	if l.relID == nil {
		if l.relIDText != "" {
			l.relID = l.relIDText
		} else {
			l.relID = newReleaseID()
		}
	}
	id := l.relID
	l.mu.Unlock()
	if released {
		if errors.Is(relOut, ErrLost) {
			return relOut // the first reported the loss: it says so again
		}
		if lost != nil {
			return lostNotHeld(lost)
		}
		return fmt.Errorf("%w: %s was already released", ErrNotHeld, l.describe())
	}
	l.ended()
	units := l.units()
	calls := l.sendRelease(ctx, units, token, id)
	l.sendAgain(ctx, calls)
	l.waitOutRefused(ctx, calls)
	l.wakeAlone()
	var err, failed error // not held; the outcome unknown
	var gone int64        // names not held
	forced := false       // some of them force-released
	for i, call := range calls {
		missing, ok := call.Val.(int64)
		switch {
		case call.Err != nil:
			if e := l.holdError(units[i], call.Err); errors.Is(e, ErrNotHeld) {
				err = cmp.Or(err, e)
			} else {
				failed = cmp.Or(failed, e)
			}
		case !ok:
			failed = cmp.Or(failed, l.badReply(call.Val))
		case missing > 0:
			gone += missing
		case missing < 0:
			gone, forced = gone-missing, true
		}
	}
	if gone > 0 {
		var some string // how many of several names, when not all
		if n := int64(len(l.names)); n > 1 && gone < n {
			some = fmt.Sprintf(" (%d of its %d names gone)", gone, n)
		}
		if forced {
			e := forceReleased(l.describe())
			e.Msg += some
			err = e
		} else {
			err = cmp.Or(err, fmt.Errorf("%w: %s %s%s", ErrNotHeld, l.describe(), l.gone(), some))
		}
	}
	if lost == nil && reportLoss {
		// Ended as lost while it ran: its deadline passed before the
		// reply came (Done closed then, whatever was under way; Err ends
		// it now if no timer did). Release says so too, as Err does,
		// though the server freed the name, as a Refresh whose reply
		// comes too late does.
		lost = l.Err()
	}
	if failed != nil {
		l.releaseFailed(failed)
		if lost != nil {
			// The loss is the answer; the failure says the server may
			// still have the name, until its TTL.
			loss := lostNotHeld(lost)
			return &causes.Error{Msg: loss.Error() + " (and Release failed: " + unprefixed(failed) + ")", Errs: []error{loss, failed}}
		}
		return failed
	}
	switch {
	case lost == nil:
		if err != nil && reportLoss && !errors.Is(err, ErrLost) {
			// Found gone: this Release ends the lock as lost, as Err
			// then says, and says so too (not a Redlock node's give-back:
			// Redlock says what the nodes' answers mean).
			err = &causes.Error{Msg: err.Error(), Errs: []error{err, ErrLost}}
		}
	case err == nil:
		// Freed: the loss says why it came too late.
		err = lostNotHeld(lost)
	case errors.Is(err, ErrForceReleased), errors.Is(err, ErrModeMismatch), errors.Is(lost, ErrModeMismatch):
		// What the server found says what is so now (a loss to the other
		// mode's hold of the token is over once the name is not held).
		if !errors.Is(err, ErrLost) {
			err = causes.Also(ErrLost, err)
		}
	default:
		// Let go of since: the loss says why.
		err = lostNotHeld(lost)
	}
	l.mu.Lock()
	l.released, l.relOut = true, err
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.relReturned = true
		l.mu.Unlock()
	}()
	if err != nil {
		l.end(lostBy(err))
		return err
	}
	l.end(nil)
	if l.c.log.Enabled(ctx, slog.LevelDebug) {
		l.c.log.DebugContext(ctx, "dlock: released", "names", l.lockNames())
	}
	return nil
}

// Refresh resets the lock's TTL to ttl, if it is still held. It returns
// ErrNotHeld once the lock has been lost, and then closes Done, unless
// Release was called meanwhile: the refresh may have run after the release,
// so Release's outcome decides whether the lock was released or lost. The
// automatic refresh goes on with ttl, so a lock that is refreshed
// automatically refuses a ttl whose deadline (ttl less 1% and 2ms for clock
// drift) does not come after its refresh interval (ErrInvalidTTL), as
// WithRefreshInterval and AutoRefresh refuse such an interval. An exclusive
// lock held more than once (WithOwner), or shared with another Lock (one
// attached to it, or one that acquired it again with its token), is only
// extended: a ttl shorter than what it has left leaves it as it is. So is
// a lock whose acquire reached the server twice (sent again by the client
// library after a lost reply): the server cannot tell it from another
// Lock of the same token. Either way the Deadline follows ttl, and the
// automatic refresh comes as the new deadline calls for it (sooner, for a
// shorter ttl). A refresh whose reply comes after the lock's deadline has
// passed, or after the deadline the refresh itself sets (Done closed then,
// the lock counted as lost), returns that loss, an error that matches
// ErrNotHeld and ErrLost, though the server may have run it: Release then
// frees the name sooner than its TTL would. A ctx that has already ended
// when Refresh is called, or when its turn comes, sends nothing and leaves
// the deadline as it is: the error is ctx.Err().
//
// Refreshes of one lock go one at a time: a Refresh called while another,
// or the automatic refresh, is under way waits for it (or for ctx to end),
// so that Deadline follows the refresh the server ran last.
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	l.made()
	if ctx == nil {
		return ErrNilContext
	}
	if err := checkTTL(ttl); err != nil {
		return err
	}
	// A deadline that passed with no timer to see it ends the lock now,
	// as Err would: nothing is sent for a lock counted as lost.
	l.expireIfDue()
	if err := l.takeTurn(ctx, ttl); err != nil {
		return err
	}
	start := time.Now()
	// The server may run the refresh, and so cut a longer TTL short, well
	// before its reply comes: until then the deadline is the sooner of the
	// two.
	l.unsure(start, ttl)
	calls := l.refreshCalls(ttl)
	l.c.evalWith(ctx, l.repl, calls...)
	err := l.refreshed(calls)
	notHeld := errors.Is(err, ErrNotHeld)
	l.refreshAnswered(err == nil || notHeld)
	due := false
	switch {
	case err == nil:
		due, err = l.extend(start, ttl)
	case !notHeld:
		l.unsure(start, ttl)
	}
	l.endTurn()
	if err == nil && (due || lateReply(start, ttl)) {
		// Its deadline passed before the reply came: lost, whether or not
		// a deadline timer has ended the lock yet (none runs when nothing
		// waits for the deadline).
		l.expireIfDue()
		err = l.aliveErr()
	}
	// The watchdog comes back as soon as the new deadline needs it: a
	// shorter TTL brings its next refresh forward.
	l.rescheduled()
	// Hooks, and the end of a lost lock with its End hook, come after the
	// turn: a hook may refresh the lock. The end comes even when a Refresh
	// hook panics.
	if notHeld {
		defer l.foundLost(ctx, err)
	}
	if l.hook != nil {
		l.hook.refresh(ctx, err)
	}
	if err == nil && l.c.log.Enabled(ctx, slog.LevelDebug) {
		l.c.log.DebugContext(ctx, "dlock: refreshed", "names", l.lockNames(), "ttl", ttl)
	}
	return err
}

// foundLost ends the lock as lost after a request found it not held (err),
// unless Release was called meanwhile (see lease.lose), and gives back
// what is left of it.
func (l *Lock) foundLost(ctx context.Context, err error) {
	if l.lose(err, false) {
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		l.giveBackRest(gctx)
		cancel()
	}
}

// AutoRefresh starts refreshing a lock obtained without WithAutoRefresh (an
// attached one, say), as WithAutoRefresh would have: opts may hold
// WithRefreshInterval and WithMaxHold. It returns ErrNotHeld if the lock was
// released or lost, or Release was called (even if it failed: such a lock
// is left to run out), ErrClosed after Client.Close, and ErrInvalidOption if
// the options do not fit the lock's TTL: the one it was obtained or last
// refreshed with by Refresh (a refresh a max hold cut short leaves it), and
// that of a Refresh under way. The first refresh comes
// one interval after the lock was obtained, or sooner when its deadline is
// nearer (an attached lock may have little of its TTL left), at once if
// need be. Called again on a lock it already refreshes, it changes the
// interval (a shorter one brings the next refresh forward to one new
// interval after the last), and the max hold when opts hold WithMaxHold; the max hold
// counts from when the lock was obtained: refreshing that a max hold
// stopped resumes if the new one allows more, while the lock is still
// held. Without WithMaxHold, the max hold stays the one the lock was
// obtained with or last given, if any. Other options are not used (one
// that is invalid still fails the call): the TTL is the lock's (Refresh
// changes it).
func (l *Lock) AutoRefresh(opts ...Option) error {
	l.made()
	o := newOptions(append(append([]Option{WithAutoRefresh()}, opts...), WithTTL(l.currentTTL())))
	if o.err != nil {
		return o.err
	}
	if l.c.isClosed() {
		return ErrClosed
	}
	return l.autoRefresh(o)
}

// TTL returns how long the lock has left on the server (the least of its
// names' that have an expiry; 0 when none has, as after an operator's
// PERSIST; the longest Duration when the server keeps it longer, as after
// an operator's PEXPIRE of more than some 292 years), or ErrNotHeld if it
// is no longer held: then, as for Refresh, the lock ends as lost (Done
// closes) unless Release was called.
func (l *Lock) TTL(ctx context.Context) (time.Duration, error) {
	l.made()
	if ctx == nil {
		return 0, ErrNilContext
	}
	d, err := l.inspect(ctx, false)
	if errors.Is(err, ErrNotHeld) {
		l.foundLost(ctx, err)
	}
	return max(d, 0), err
}

// heldArgs returns the arguments of the refresh and ttl scripts for token,
// followed by more: the token and the request token of this acquisition,
// and for the kinds that take it, after more, the mode.
func (l *Lock) heldArgs(token string, more ...any) []any {
	return l.kind.args(append([]any{token, l.req}, more...)...)
}

// inspect asks the server what it knows of the lock: its TTL (-1ms when
// it has no expiry), metadata and fences. Attaching, an exclusive lock with an owner is found by its owner
// id too, and takes the token it is held with.
func (l *Lock) inspect(ctx context.Context, attaching bool) (time.Duration, error) {
	l.mu.Lock()
	token := l.token
	l.mu.Unlock()
	var args []any
	if l.kind.modeArg {
		args = l.heldArgs(token)
	} else {
		owner, attach := "", ""
		if attaching {
			// An attached Lock shares the hold with the Lock it was
			// handed by: from now on the hold is only ever extended.
			owner, attach = l.owner, "1"
		}
		args = l.heldArgs(token, owner, attach)
	}
	units := l.units()
	calls := l.send(ctx, replication{}, units, func(p part) *Call {
		return &Call{Script: l.kind.ttl, Keys: p.held, Args: args}
	})
	heldWith := "" // the token the first name is held with
	var tokens []string
	least, meta, fences := int64(-1), "", make([]uint64, len(l.names))
	for i, call := range calls {
		p := units[i]
		if call.Err != nil {
			err := l.holdError(p, call.Err)
			if attaching && errors.Is(err, ErrWrongType) {
				// Not a lock to attach to.
				err = because(ErrNotHeld, err)
			}
			return 0, err
		}
		r, _ := call.Val.([]any)
		if len(r) == 0 {
			return 0, l.badReply(call.Val)
		}
		pttl, _ := r[0].(int64)
		if pttl == -2 {
			if attaching {
				return 0, fmt.Errorf("%w: %s is not held with that token", ErrNotHeld, l.describe())
			}
			return 0, fmt.Errorf("%w: %s", ErrNotHeld, l.describe())
		}
		if pttl == -3 {
			return 0, forceReleased(l.describe())
		}
		if !l.kind.modeArg {
			// The exclusive lock's reply ends with the token it is held with.
			t, ok := r[len(r)-1].(string)
			if !ok {
				return 0, l.badReply(call.Val)
			}
			if p.at == nil || slices.Contains(p.at, 0) {
				heldWith = t
			}
			tokens = append(tokens, t)
			r = r[:len(r)-1]
		}
		if len(r) != 2+p.size(l.names) {
			return 0, l.badReply(call.Val)
		}
		f, ok := int64s(r[2:])
		if !ok {
			return 0, l.badReply(call.Val)
		}
		if pttl >= 0 && (least < 0 || pttl < least) {
			least = pttl // as the script takes the least of its names'
		}
		if m, _ := r[1].(string); p.at == nil || slices.Contains(p.at, 0) {
			meta = m // the first name's
		}
		for j, fence := range f {
			fences[p.index(j)] = fence
		}
	}
	if attaching && l.owner != "" && slices.ContainsFunc(tokens, func(t string) bool { return t != heldWith }) {
		// Found by owner on several slots, in holds of different tokens:
		// no one Lock stands for them.
		return 0, fmt.Errorf("%w: %s is held by %s in holds of different tokens", ErrNotHeld, l.describe(), causes.Quote(l.owner))
	}
	// -1ms for no expiry: only an operator can have done that (PERSIST).
	left := milliseconds(max(least, -1))
	l.mu.Lock()
	l.meta, l.fences = meta, fences
	if attaching && heldWith != "" {
		// Found by owner: it acts with the hold's token from now on, as
		// the acquisition that made the hold.
		l.token, l.req = heldWith, heldWith
	}
	l.mu.Unlock()
	return left, nil
}

// Mode returns what the lock holds: ModeExclusive, ModeRead, ModeWrite or
// ModePermit.
func (l *Lock) Mode() string {
	l.made()
	return l.kind.mode
}

// Name returns the name the lock was obtained on (the first, for a lock on
// several names).
func (l *Lock) Name() string {
	l.made()
	return l.names[0]
}

// Names returns every name the lock was obtained on.
func (l *Lock) Names() []string {
	l.made()
	return append([]string(nil), l.names...)
}

// Token returns the lock's token: whoever knows it can refresh or release
// the lock (see Client.Attach). An owner's lock on several names that
// re-entered holds on some of them (WithOwner) holds each of those with
// its hold's token, and the names it took anew with one of those tokens,
// which Token returns. Such a lock cannot be handed over: Attach finds a
// name only where the acquisition that made its hold had the token as its
// own, which is not so of the names taken anew. The Lock itself refreshes
// and releases every name.
func (l *Lock) Token() string {
	l.made()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.token
}

// Metadata returns the string stored with the lock (see WithMetadata). A
// Lock that re-entered its owner's hold (WithOwner) or joined one
// (WithToken) returns the metadata it was given until TTL or Attach reads
// the stored one: the server keeps the metadata of the hold's first
// acquisition.
func (l *Lock) Metadata() string {
	l.made()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.meta
}

// Fence returns the lock's fencing token: a number that is larger for every
// new acquisition of the same name than for any before it, so a resource
// that remembers the largest fence it has seen can refuse a writer whose
// lock has since passed to another. For a lock on several names it is the
// first name's fence; see Fences. A re-entry or repeated acquire keeps the
// fence of the hold it joins. A read hold and a semaphore's permit have no
// fence: 0. Fences do not count from 1: each is at least the server's clock
// in microseconds (over 10^15), so a resource keeps them in 64 bits.
func (l *Lock) Fence() uint64 {
	l.made()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.fences) == 0 {
		return 0
	}
	return l.fences[0]
}

// Fences returns the fencing token of each name, in the order of Keys.
func (l *Lock) Fences() []uint64 {
	l.made()
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]uint64(nil), l.fences...)
}

// currentTTL is the TTL the lock was last obtained or refreshed with.
func (l *Lock) currentTTL() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// nameKeys are the Redis keys of the lock's names, the keys its waiters
// register at and its notices name.
func (l *Lock) nameKeys() []string {
	return l.keys[:len(l.names):len(l.names)] // every kind's acquire keys start with them
}

// releaseArgs returns the arguments of a release with token and id: for an
// exclusive lock the request token that names this acquisition and the id;
// for the other kinds the token, that request token, the mode and the id.
// The id is the Lock's, the same for every Release call: a client library
// may send the request again after a lost reply, and so may the caller; the
// id lets the script tell the repeat from a second release.
func (l *Lock) releaseArgs(token string, id any, buf []any) []any {
	req := l.reqValue()
	if !l.kind.modeArg {
		return append(argsIn(buf, 8), req, id) // room for what Release adds
	}
	tok := req
	if token != l.req {
		tok = token // boxed only then
	}
	return append(l.kind.args(append(argsIn(buf, 6), tok, req)...), id) // room for the mode, the id and what Release adds
}

// sendRelease sends the release of the lock's units, held with token, as
// the release with id, and returns its calls.
func (l *Lock) sendRelease(ctx context.Context, units []part, token string, id any) []*Call {
	var b *callBuf // the call and its arguments on a lock's one unit
	var buf []any
	if len(units) == 1 {
		b = new(callBuf)
		buf = b.args[:0]
	}
	args := l.releaseArgs(token, id, buf)
	if l.kind.modeArg {
		// Not a clean-up; whether the acquisition ends there.
		args = append(args, argNone, l.endsArg())
	} else if l.minHold > 0 || l.ownReq || token != l.req {
		// No grant request to take back, any fence, the minimum hold (see
		// release.lua: only a Release keeps the hold, not a clean-up),
		// whether the acquisition ends there.
		minHold := argNone
		if l.minHold > 0 {
			minHold = l.minHold
		}
		// And the hold's token, by which a re-entry learns of a force
		// release (none when it is the request token).
		tok := argNone
		if token != l.req {
			tok = token // boxed only then
		}
		args = append(args, argNone, argNone, minHold, l.endsArg(), tok)
	}
	if !l.kind.modeArg {
		args = l.c.fenceArg(args, 7) // how long a fence counter is kept, for a grant
	}
	return l.send(ctx, replication{}, units, func(p part) *Call {
		var call *Call
		if b != nil {
			call = &b.call
		} else {
			call = new(Call)
		}
		call.Script, call.Keys, call.Args = l.kind.release, l.scriptKeys(p.rel), args
		return call
	})
}

// endsArg returns the release script's argument that says the acquisition
// ends with the release: "1" when its request token is its own, so that
// the release records it; "" otherwise.
func (l *Lock) endsArg() any {
	if l.ownReq {
		return argOne
	}
	return argNone
}

// argOne and argNone are "1" and "" as script arguments, boxed once.
var argOne, argNone any = "1", ""

// reqValue returns the request token as a script argument: boxed once when
// an acquire has boxed it.
func (l *Lock) reqValue() any {
	if l.reqArg != nil {
		return l.reqArg
	}
	return l.req
}

// lockNames returns the lock's names, for log records: each longer than
// causes.QuoteMax bytes cut short.
func (l *Lock) lockNames() []string { return causes.Shorts(l.names) }

// describeNames is how many names of a multi-name lock its errors list.
const describeNames = 8

// describe names the lock in errors: its name, or its first names and how
// many more it has.
func (l *Lock) describe() string {
	var s string
	switch {
	case len(l.names) == 1:
		s = causes.Quote(l.names[0])
	case len(l.names) > describeNames:
		s = fmt.Sprintf("%s and %d more", causes.QuoteAll(l.names[:describeNames]), len(l.names)-describeNames)
	default:
		s = causes.QuoteAll(l.names)
	}
	return s + l.modeSuffix()
}

// describeName names one of the lock's names in messages, as describe
// names the lock.
func (l *Lock) describeName(name string) string { return causes.Quote(name) + l.modeSuffix() }

// countNote is what a semaphore's refusals add to their words, between
// open and shut: the count its acquire was judged against, which callers
// that disagree on it (a Semaphore made with another count) cannot see
// otherwise. It is empty for the other kinds.
func (l *Lock) countNote(open, shut string) string {
	if l.permits == nil {
		return ""
	}
	return fmt.Sprintf("%sthis Semaphore's count: %d%s", open, l.permits.Load(), shut)
}

// modeSuffix is what messages add to the names of a hold that is not an
// exclusive lock's: its mode.
func (l *Lock) modeSuffix() string {
	if l.kind != exclusiveHold {
		return " (" + l.kind.mode + ")"
	}
	return ""
}

// replyError turns a failed script call on part p of the lock into a dlock
// error.
func (l *Lock) replyError(p part, err error) error {
	return scriptError(err, p.keys[0], func(i int64) string { return p.name(l.names, i) }, l.c.RedisKey)
}

// holdError is replyError for the scripts that act on the hold: a token
// that holds the name in another mode means this lock is not held.
func (l *Lock) holdError(p part, err error) error {
	err = l.replyError(p, err)
	if errors.Is(err, ErrModeMismatch) || errors.Is(err, ErrKindMismatch) {
		return because(ErrNotHeld, err)
	}
	return err
}

func (l *Lock) badReply(v any) error {
	return &ServerError{Key: l.keys[0], Err: fmt.Errorf("unexpected reply %#v", v)}
}

// isFinal reports whether an attempt's error will not change by retrying.
func isFinal(err error) bool {
	return errors.Is(err, ErrWrongType) || errors.Is(err, ErrKindMismatch) || errors.Is(err, ErrModeMismatch) ||
		errors.Is(err, ErrInvalidArgument)
}

// drift is the allowance for clock drift between client and server: 1% of
// the TTL plus 2ms.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// newReleaseID returns the id a Lock's releases carry: 64 random bits,
// enough to tell the releases of one name within a minute apart, in 11
// base64url characters (the scripts keep the last ones in short fields).
func newReleaseID() any {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// newToken returns 128 random bits from crypto/rand, base64url-encoded.
func newToken() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// newTokenAndID returns a token, as newToken does, and a release id, as
// newReleaseID does, made in one string.
func newTokenAndID() (token, id string) {
	var b [16 + 8]byte
	_, _ = crand.Read(b[:16])
	binary.LittleEndian.PutUint64(b[16:], rand.Uint64())
	enc := base64.RawURLEncoding
	var text [22 + 11]byte
	enc.Encode(text[:22], b[:16])
	enc.Encode(text[22:], b[16:])
	both := string(text[:])
	return both[:22], both[22:]
}

// int64s converts a script's array of integers.
func int64s(vs []any) ([]uint64, bool) {
	out := make([]uint64, len(vs))
	for i, v := range vs {
		n, ok := v.(int64)
		if !ok {
			return nil, false
		}
		out[i] = uint64(n)
	}
	return out, true
}
