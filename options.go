package dlock

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"

	"github.com/dlockio/dlock/internal/causes"
	"github.com/dlockio/dlock/internal/friend"
	"github.com/dlockio/dlock/internal/nilretry"
)

// Defaults of the lock options.
const (
	// DefaultTTL is how long a lock lives unless refreshed, when WithTTL is
	// not given.
	DefaultTTL = 10 * time.Second
	// DefaultMaxWait bounds how long Lock waits when WithMaxWait is not
	// given and its context has no deadline.
	DefaultMaxWait = time.Minute
)

// DefaultRetry returns the retry strategy of Lock when WithRetry is not
// given: it never stops (the context or WithMaxWait bound the wait), and
// backs off after Redis errors exponentially from 1 ms to 100 ms, with 50%
// jitter.
func DefaultRetry() RetryStrategy { return defaultRetry }

var defaultRetry = Jitter(ExponentialBackoff(time.Millisecond, 100*time.Millisecond), 0.5)

// Option configures one acquisition (TryLock, Lock and their multi-key
// forms; the RLock, TryRLock, Lock and TryLock of an RWMutex; the Acquire
// and TryAcquire of a Semaphore) or Attach.
type Option func(*options)

type options struct {
	ttl      time.Duration
	retry    RetryStrategy
	onRetry  func(failed int, err error)
	maxWait  time.Duration // WithMaxWait; zero when not given
	metadata string
	token    string
	oneUse   bool // the token is used for this acquisition only (see friend.OneUseToken)
	logHooks bool // the hooks' panics are logged, not raised (see friend.LogHookPanics)
	part     bool // one node's part of a Redlock lock: its loss is no warning (see friend.QuorumPart)
	owner    string
	auto     bool          // refresh automatically
	interval time.Duration // WithRefreshInterval; zero for the default
	maxHold  time.Duration
	minHold  time.Duration // WithMinHold; zero when not given
	repl     replication
	err      error // the first invalid option
}

func newOptions(opts []Option) *options {
	o := &options{ttl: DefaultTTL, retry: defaultRetry}
	for _, f := range opts {
		if f != nil {
			f(o)
		}
	}
	if o.err == nil {
		o.err = o.checkLease(o.ttl)
	}
	return o
}

func (o *options) fail(err error) {
	if o.err == nil {
		o.err = err
	}
}

// WithTTL sets how long the lock lives unless refreshed; the default is
// DefaultTTL (10s). It must be at least 3ms, more than its allowance for
// clock drift (1% and 2ms, see Lock.Deadline); Redis keeps it with
// millisecond precision, so it is truncated to whole milliseconds.
func WithTTL(ttl time.Duration) Option {
	return func(o *options) {
		if err := checkTTL(ttl); err != nil {
			o.fail(err)
		}
		o.ttl = ttl
	}
}

// WithRetry sets how many attempts Lock makes and how long it backs off
// after an attempt fails with a Redis error; the default is DefaultRetry().
// A refusal by Redis that no retry changes (ErrDenied: a missing or wrong
// password, a missing ACL permission, a TLS certificate refused, …) ends
// the wait at once, whatever the strategy.
// While the lock is held, Lock sleeps until Redis says it is free (see
// Client.Lock), not for the strategy's wait, unless the driver cannot
// subscribe, in which case the strategy's waits are the polling interval.
// TryLock never waits, whatever the strategy. A nil s (or a nil RetryFunc)
// makes the call fail with ErrInvalidOption.
func WithRetry(s RetryStrategy) Option {
	return func(o *options) {
		if what := nilretry.Refused(s); what != "" {
			o.fail(fmt.Errorf("%w: %s (NoRetry() retries nothing; without WithRetry, DefaultRetry)", ErrInvalidOption, what))
		}
		o.retry = s
	}
}

// WithOnRetry sets a function that Lock calls after each failed attempt
// with the number of attempts failed so far and why the last one failed
// (ErrNotObtained, or the Redis error). It is called on the goroutine that
// called Lock (a Client.Close called from it waits out its bound for that
// caller's wait).
func WithOnRetry(f func(failed int, err error)) Option {
	return func(o *options) { o.onRetry = f }
}

// WithMaxWait bounds how long Lock waits: it gives up after d, or when its
// context ends if that is sooner. Without it, Lock waits as long as its
// context allows, and at most DefaultMaxWait (1m) when the context has no
// deadline.
func WithMaxWait(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.fail(fmt.Errorf("%w: WithMaxWait(%v) must be positive", ErrInvalidOption, d))
		}
		o.maxWait = d
	}
}

// WithMetadata stores a string with the lock, such as who holds it (host,
// process, job), for inspection and for Lock.Metadata.
func WithMetadata(meta string) Option {
	return func(o *options) { o.metadata = meta }
}

// WithToken sets the lock's token instead of a random one. Whoever knows the
// token can release or refresh the lock (see Client.Attach), so it must be
// unique and hard to guess; it may not be empty or hold white space
// (ErrInvalidToken). An acquire with the token of a lock already held
// succeeds again, so a caller that lost a reply may safely retry. Locks
// acquired with one token are one holder: the hold is then only ever
// extended, and a Release (or the clean-up after a failed acquire) by any
// of them ends it for all. On a Redis Cluster, a lock on names in several
// slots gives back between its attempts what they took (not a name an
// attempt found held with the token already): a name that another Lock of
// the token joined while the attempt lasted, or whose reply was lost, goes
// back with it, and one that an earlier attempt found held with the token
// stays held, when a later attempt's reply for it is lost, until its TTL.
// So do not give one token to Locks that may be acquiring at the same time
// for different work. This holds after a hold
// expired too: a Lock whose hold expired, and whose token a later acquire
// took again, sees that new hold as its own (TTL, Fence, Release), though
// a refresh (or Done) has reported it lost.
func WithToken(token string) Option {
	return func(o *options) {
		if why := badToken(token); why != "" {
			o.fail(fmt.Errorf("%w: WithToken(%s) %s", ErrInvalidToken, causes.Quote(token), why))
		}
		o.token = token
	}
}

// badToken says why token cannot be a lock's token, or "" when it can.
func badToken(token string) string {
	switch {
	case token == "":
		return "is empty"
	case strings.IndexFunc(token, unicode.IsSpace) >= 0:
		// Redis keeps the tokens of ended holds in space-separated lists
		// (see force_release.lua).
		return "holds white space"
	}
	return ""
}

func init() {
	friend.GiveBack = func(ctx context.Context, l any) error { return l.(*Lock).giveBackNode(ctx) }
	friend.OneUseToken = func(token string) any {
		return Option(func(o *options) {
			WithToken(token)(o)
			o.oneUse = true
		})
	}
	friend.LostNotHeld = lostNotHeld
	friend.LogHookPanics = func() any { return Option(func(o *options) { o.logHooks = true }) }
	friend.QuorumPart = func() any { return Option(func(o *options) { o.part = true }) }
	friend.Logger = func(c any) *slog.Logger { return c.(*Client).log }
	friend.Made = func(c any) bool { return c.(*Client).driver != nil }
	friend.ScriptArg = func(s any, function bool) any { return s.(*Script).arg(function) }
	friend.RefusedForGood = func(err error) bool {
		refused, _ := refusedForGood(err)
		return refused
	}
}

// given reports whether the caller gave the token, and may give it again:
// not when dlock made it, nor when it is used once (see friend.OneUseToken).
func (o *options) given() bool { return o.token != "" && !o.oneUse }

// WithOwner makes the lock re-entrant for an owner: an acquire by the same
// owner id of a lock it holds succeeds at once, with the token it is held
// with, and adds one to its hold count; each Lock's release takes away its
// own acquisition (once, however often it is called), and the lock is freed
// when the count reaches zero. A re-entry or a refresh of a lock held more
// than once only ever extends its TTL, so that no acquisition cuts another's
// short. A Lock of an earlier hold of the same owner, since released,
// cannot act on the next one. Owner ids are explicit strings, such as the
// id of one request or one run of a job. All callers with one owner id hold
// the lock together, and whoever knows the id can join the hold, and take
// an exclusive lock's hold over with Client.Attach and release it: an id
// must name one logical holder (never a name that several processes share,
// such as the job's name), and be hard to guess where that matters.
func WithOwner(id string) Option {
	return func(o *options) {
		if id == "" {
			o.fail(fmt.Errorf("%w: WithOwner(\"\") is empty: give an owner id, or leave the option out", ErrInvalidOption))
		}
		o.owner = id
	}
}

// WithAutoRefresh keeps the lock alive until it is released: the client's
// watchdog refreshes it every third of its TTL (see WithRefreshInterval),
// retrying transient errors until the lock's deadline. If the lock is lost
// all the same, its Done channel closes and Err says why.
func WithAutoRefresh() Option {
	return func(o *options) { o.auto = true }
}

// WithRefreshInterval refreshes the lock automatically (it implies
// WithAutoRefresh: the lock no longer runs out by itself, but lives until
// released or lost) every d instead of every third of its TTL. d must be at least 1ms, and
// shorter than the TTL less the drift allowance (1% of it and 2ms), the
// lock's deadline; whatever d, each refresh is sent at least a tenth of
// that before the deadline, so that it has time to be answered.
func WithRefreshInterval(d time.Duration) Option {
	return func(o *options) {
		if d < minRefreshInterval {
			o.fail(fmt.Errorf("%w: WithRefreshInterval(%v) is under the minimum of %v", ErrInvalidOption, d, minRefreshInterval))
		}
		o.auto, o.interval = true, d
	}
}

// WithMaxHold bounds how long automatic refreshing may keep the lock: d
// after it was obtained the automatic refreshing stops, the lock runs out,
// its Done channel closes and Err matches ErrMaxHold. d must be at least the
// TTL. Given to an acquisition without WithAutoRefresh, it bounds the
// refreshing that Lock.AutoRefresh starts later. It does not bound the
// holder's own calls to Lock.Refresh, which extend the lock as asked, past
// d too: a holder that refreshes by hand is not stuck. Once such a Refresh
// has set a deadline past d, the automatic refreshing stops, and the lock
// runs out at that deadline (Err matches ErrMaxHold).
func WithMaxHold(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.fail(fmt.Errorf("%w: WithMaxHold(%v) must be positive", ErrInvalidOption, d))
		}
		o.maxHold = d
	}
}

// WithMinHold keeps an exclusive lock held after its Release until d has
// passed since the hold began (by the server's clock): a job that ends
// sooner leaves the name taken for the rest of d, so that others who try it
// meanwhile are refused. It makes a job run at most once per period across
// hosts whose schedules fire at slightly different times (as ShedLock's
// lockAtLeastFor does): the first host's run keeps the others out of that
// tick even when it ends at once. Pick d longer than the spread of the
// hosts' clocks and schedules, and no longer than the period less that
// spread: the hold counts from whichever host obtained it, and the
// earliest host's next tick must find it gone, or the hosts that come
// early in that tick skip it. Give it to callers that do not wait (TryLock,
// or TryDo): a waiting caller takes the lock once the kept hold
// runs out, and runs the job again. The hold kept is nobody's: the
// Lock is released, nothing refreshes the hold, Inspect shows its holder
// with Count 0, it runs out at d, and only ForceRelease ends it sooner.
// A lock that is lost, or whose holder dies without releasing it, is
// not kept: it runs out with its TTL, which may be sooner than d (make the
// TTL longer than the spread for a crashed run's tick to stay closed; a
// lock on several names keeps those it still held). The
// release of one acquisition of a lock held more than once (WithOwner)
// keeps nothing, since the others still hold it; the Release that frees the
// hold keeps it with its own WithMinHold. d must be positive; Redis keeps
// it in whole milliseconds, rounded up. Read/write locks and semaphores
// refuse it (ErrInvalidOption).
func WithMinHold(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.fail(fmt.Errorf("%w: WithMinHold(%v) must be positive", ErrInvalidOption, d))
		}
		o.minHold = d
	}
}

// errMinHoldKind refuses WithMinHold to the primitives that do not keep it.
var errMinHoldKind = fmt.Errorf("%w: WithMinHold is for exclusive locks, not read/write locks or semaphores", ErrInvalidOption)

// refreshInterval is the automatic refresh period, or zero when off.
func (o *options) refreshInterval() time.Duration {
	switch {
	case !o.auto:
		return 0
	case o.interval > 0:
		return o.interval
	default:
		return o.ttl / 3
	}
}

// refreshesInTime reports whether refreshes every interval keep a lock of
// ttl alive: each must come before its deadline, the TTL less the drift
// allowance.
func refreshesInTime(interval, ttl time.Duration) bool { return interval < ttl-drift(ttl) }

// defaultNote says, after a TTL in checkLease's errors, that it is the
// default, which a caller who gave no WithTTL may not have in mind.
func defaultNote(ttl time.Duration) string {
	if ttl == DefaultTTL {
		return " (the default: see WithTTL)"
	}
	return ""
}

// checkLease validates the lease options against a TTL.
func (o *options) checkLease(ttl time.Duration) error {
	if o.auto && !refreshesInTime(o.refreshInterval(), ttl) {
		return fmt.Errorf("%w: refresh interval %v does not come before the lock's deadline: its TTL %v%s less %v for clock drift",
			ErrInvalidOption, o.refreshInterval(), ttl, defaultNote(ttl), drift(ttl))
	}
	if o.maxHold > 0 && o.maxHold < ttl {
		return fmt.Errorf("%w: max hold %v is shorter than the TTL %v%s", ErrInvalidOption, o.maxHold, ttl, defaultNote(ttl))
	}
	return nil
}

// minRefreshInterval is the shortest interval WithRefreshInterval takes:
// one refresh of one lock a millisecond is already more than any lock
// needs, and shorter ones would only load Redis.
const minRefreshInterval = time.Millisecond

// MinTTL is the shortest TTL a lock may have (WithTTL, Refresh). A lock's
// deadline is its TTL less the drift allowance (1% of it and 2ms), from
// when the request that obtains it is sent, and Redis keeps TTLs in whole
// milliseconds: 3ms is the least that leaves the deadline after the request.
const MinTTL = 3 * time.Millisecond

// checkTTL validates a TTL given to WithTTL or Refresh.
func checkTTL(ttl time.Duration) error {
	if ttl < MinTTL {
		return fmt.Errorf("%w: %v is under the minimum of %v (a lock's deadline is its TTL less 1%% and 2ms for clock drift)", ErrInvalidTTL, ttl, MinTTL)
	}
	return nil
}
