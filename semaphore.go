package dlock

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Semaphore lets a limited number of holders hold one name at once: each
// holds a permit. Client.Semaphore returns one; it is a handle that keeps
// no state but its permit count, cheap to make and safe for concurrent
// use. The zero Semaphore is not usable: its acquires panic.
//
// Every permit is a *Lock with its own token, TTL and lease, so that a
// holder that crashed frees its permit after its TTL while the others go
// on refreshing theirs. Release, Refresh, TTL, Done, Context,
// WithAutoRefresh, WithMaxHold and the rest work as they do for exclusive
// locks; Client.Attach is for exclusive locks only: another process shares
// a permit by acquiring it again with its token (WithToken). Such an
// acquire that fails (its reply lost, its context ended) is cleaned up as
// any failed acquire, which ends the hold for every Lock of the token, as
// a Release by one of them would: the holder learns it at its next
// refresh. Share a permit WithOwner instead when each process's
// acquisition must count, and be given back, on its own. Permits have
// no fencing token (Fence is 0): several hold at once.
//
// The permit count is the caller's: every acquire is granted while fewer
// permits than its semaphore's count are held, its own count, whatever other
// callers use. Callers that agree on the count get exactly that bound.
// Changing it (SetPermits, or another handle with another count) takes
// effect at the next acquire: a larger count lets more in at once
// (SetPermits wakes the callers of its client that wait), a smaller one lets
// nobody in until enough holders have left; no held permit is ever revoked.
// The callers of one client waiting for a name take turns, as a lock's do,
// except that one whose count is higher than those of every caller ahead of
// it makes attempts of its own: it may get in where they cannot. Across
// clients, a freed permit wakes the first registered client alone: while
// counts differ, one behind it whose count would let it in tries at its
// next beat (within half a second). Inspect reports the count of the last
// acquire that took a permit.
//
// WithOwner makes permits re-entrant per owner: an owner that holds a
// permit and acquires again gets the same permit with its count raised,
// not a second permit. A permit counted more than once lives until the
// latest expiry any of its acquisitions and refreshes asked for: a
// re-entry or Refresh with a shorter TTL never cuts it short (once counted
// once again, a Refresh may).
type Semaphore struct {
	c       *Client
	name    string
	permits atomic.Int64
}

// Semaphore returns the semaphore called name that lets permits holders
// in at once. Nothing is sent to Redis until a permit is asked for; a
// count below one makes every acquire fail with ErrInvalidPermits.
func (c *Client) Semaphore(name string, permits int) *Semaphore {
	c.made()
	s := &Semaphore{c: c, name: name}
	s.permits.Store(int64(permits))
	return s
}

// client returns the Client that made s; it panics for a Semaphore that
// Client.Semaphore did not make.
func (s *Semaphore) client() *Client {
	if s == nil || s.c == nil {
		panic("dlock: Semaphore used without Client.Semaphore")
	}
	return s.c
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Permits returns how many holders the semaphore lets in at once.
func (s *Semaphore) Permits() int { return int(s.permits.Load()) }

// SetPermits changes how many holders the semaphore lets in at once, from
// its next acquire on. A change wakes the callers of its client waiting for
// the name that are first in line (after a raise, or a cut that leaves a
// caller of another handle with a higher count first), which try again at
// once. It returns ErrInvalidPermits, changing nothing, if n is below one.
// It sends nothing to Redis.
func (s *Semaphore) SetPermits(n int) error {
	if n < 1 {
		return fmt.Errorf("%w: %d (a semaphore needs at least 1)", ErrInvalidPermits, n)
	}
	if old := s.permits.Swap(int64(n)); int64(n) != old && s.c != nil {
		s.c.wakeWaiters(s.c.RedisKey(s.name))
	}
	return nil
}

// Acquire obtains a permit, waiting while every permit is held. It waits
// and gives up as Client.Lock does, waking when the first permit held
// expires if that comes sooner.
func (s *Semaphore) Acquire(ctx context.Context, opts ...Option) (*Lock, error) {
	return s.client().obtain(ctx, opts, true, s.hold)
}

// TryAcquire obtains a permit if one is free, in one round trip, and
// returns ErrNotObtained if not.
func (s *Semaphore) TryAcquire(ctx context.Context, opts ...Option) (*Lock, error) {
	return s.client().obtain(ctx, opts, false, s.hold)
}

var permitHold = &holdKind{mode: ModePermit, modeArg: true, refused: "has every permit held",
	acquire: scriptSemAcquire, release: scriptHoldsRelease, refresh: scriptHoldsRefresh, ttl: scriptHoldsTTL}

// hold builds the Lock an acquire fills in.
func (s *Semaphore) hold(token string, o *options) (*Lock, error) {
	if err := s.c.checkName(s.name); err != nil {
		return nil, err
	}
	if o.minHold > 0 {
		return nil, errMinHoldKind
	}
	if n := s.permits.Load(); n < 1 {
		return nil, fmt.Errorf("%w: %d (a semaphore needs at least 1)", ErrInvalidPermits, n)
	}
	key := s.c.RedisKey(s.name)
	l := &Lock{kind: permitHold, names: []string{s.name}, req: token, token: token, owner: o.owner, meta: o.metadata,
		keys: []string{key, key + ":holds", key + ":waiters", key + ":released"}}
	l.rel = l.keys
	l.held = []string{key, key + ":holds", l.keys[3]}
	given := flag(o.given())
	l.extra = func(waitArgs) []any { return []any{ModePermit, s.permits.Load(), given} }
	l.permits = &s.permits
	l.init(s.c, o)
	return l, nil
}
