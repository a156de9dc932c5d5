package dlock

import "context"

// RWMutex is a read/write lock on one name: any number of readers hold it
// at once, or one writer alone. Client.RWMutex returns one; it is a handle
// that keeps no state of its own, cheap to make and safe for concurrent
// use. The zero RWMutex is not usable: its holds panic.
//
// Every hold is a *Lock with its own token, TTL and lease, so that each
// reader's hold expires on its own: a crashed reader frees its share after
// its TTL while the others go on refreshing theirs. Release, Refresh, TTL,
// Done, Context, WithAutoRefresh, WithMaxHold and the rest work as they do
// for exclusive locks, and the client's watchdog refreshes read and write
// holds in the same batches as exclusive locks. Client.Attach is for
// exclusive locks only: another process shares a hold by acquiring it
// again with its token (WithToken); if that acquire fails, its clean-up
// ends the hold for every Lock of the token, as a Release would (the
// holder learns it at its next refresh). WithOwner shares a hold with
// each acquisition counted, and given back, on its own.
//
// By default writers go first: a writer that waits (Lock, not TryLock)
// records itself, and while it does no new reader gets in; the readers in
// keep their holds, and the writer enters when the last has left. The
// writer renews its record at every attempt, and the record expires after
// the writer's TTL, so that a writer that died stops keeping readers out.
// Writers race among themselves.
//
// A fair lock (see Fair) serves in arrival order instead: every waiter
// records itself in a queue (the callers of one client one at a time: a
// client's caller queues there once the client's earlier callers of the
// lock are served, so arrival order holds between clients); a reader enters when no writer holds the lock
// or is queued ahead of it, so that readers queued together enter
// together, and a writer when nobody holds the lock or is queued ahead of
// it. Queue entries expire after their waiter's TTL too, so that a waiter
// that died stalls the queue for one TTL at most. Callers that do not wait
// (TryRLock, TryLock) count every queued waiter as ahead of them.
//
// Fairness belongs to a name while it is in use: a fair and a
// writer-preferring RWMutex on one name at the same time refuse each
// other with ErrKindMismatch, as a read/write lock and an exclusive lock
// or a semaphore on one name do.
//
// Every write hold gets a fencing token (Lock.Fence), larger than any given
// to a writer of the name before; read holds have none (0).
//
// WithOwner makes holds re-entrant per owner and mode: an owner that holds
// a read hold and asks for a read hold again gets the same hold with its
// count raised, and likewise for the write hold. A hold counted more than
// once lives until the latest expiry any of its acquisitions and refreshes
// asked for: a re-entry or Refresh with a shorter TTL never cuts it short
// (once counted once again, a Refresh may). An owner that holds one mode
// and asks for the other waits like anyone else; so does a reader without
// an owner that asks for a second read hold while a writer waits for its
// first. Both wait until they give up: use WithOwner for nested reads, and
// release a read hold before asking for the write hold.
type RWMutex struct {
	c    *Client
	name string
	fair bool
}

// RWOption configures an RWMutex.
type RWOption func(*RWMutex)

// Fair makes an RWMutex serve readers and writers in the order they
// arrive instead of letting writers go first.
func Fair() RWOption { return func(m *RWMutex) { m.fair = true } }

// RWMutex returns the read/write lock called name. It prefers writers
// unless opts hold Fair. Nothing is sent to Redis until a hold is asked
// for.
func (c *Client) RWMutex(name string, opts ...RWOption) *RWMutex {
	c.made()
	m := &RWMutex{c: c, name: name}
	for _, o := range opts {
		if o != nil {
			o(m)
		}
	}
	return m
}

// client returns the Client that made m; it panics for an RWMutex that
// Client.RWMutex did not make.
func (m *RWMutex) client() *Client {
	if m == nil || m.c == nil {
		panic("dlock: RWMutex used without Client.RWMutex")
	}
	return m.c
}

// Name returns the lock's name.
func (m *RWMutex) Name() string { return m.name }

// RLock obtains a read hold, waiting while a writer holds the lock or
// waits for it (in a fair lock: while a writer holds it or is queued
// ahead). It waits and gives up as Client.Lock does, waking when the
// blocking hold or waiter expires if that comes sooner.
func (m *RWMutex) RLock(ctx context.Context, opts ...Option) (*Lock, error) {
	return m.client().obtain(ctx, opts, true, m.hold(readHold, true))
}

// TryRLock obtains a read hold if it can at once, in one round trip, and
// returns ErrNotObtained if not.
func (m *RWMutex) TryRLock(ctx context.Context, opts ...Option) (*Lock, error) {
	return m.client().obtain(ctx, opts, false, m.hold(readHold, false))
}

// Lock obtains the write hold, waiting while anyone holds the lock (in a
// fair lock: also while anyone is queued ahead). While it waits, no new
// reader gets in. It waits and gives up as Client.Lock does; when it gives
// up, it takes its record as a waiter back.
func (m *RWMutex) Lock(ctx context.Context, opts ...Option) (*Lock, error) {
	return m.client().obtain(ctx, opts, true, m.hold(writeHold, true))
}

// TryLock obtains the write hold if it can at once, in one round trip, and
// returns ErrNotObtained if not. It leaves no record as a waiter.
func (m *RWMutex) TryLock(ctx context.Context, opts ...Option) (*Lock, error) {
	return m.client().obtain(ctx, opts, false, m.hold(writeHold, false))
}

var (
	readHold = &holdKind{mode: ModeRead, modeArg: true, refused: "is held for writing, or a writer waits for it",
		acquire: scriptRWAcquire, release: scriptHoldsRelease, refresh: scriptHoldsRefresh, ttl: scriptHoldsTTL}
	writeHold = &holdKind{mode: ModeWrite, modeArg: true, refused: "is held (or, for a fair lock, others wait for it first)",
		acquire: scriptRWAcquire, release: scriptHoldsRelease, refresh: scriptHoldsRefresh, ttl: scriptHoldsTTL}
)

// hold returns what obtain builds a hold of kind with.
func (m *RWMutex) hold(kind *holdKind, wait bool) func(token string, o *options) (*Lock, error) {
	return func(token string, o *options) (*Lock, error) {
		if err := m.c.checkName(m.name); err != nil {
			return nil, err
		}
		if o.minHold > 0 {
			return nil, errMinHoldKind
		}
		key := m.c.RedisKey(m.name)
		l := &Lock{kind: kind, names: []string{m.name}, req: token, token: token, owner: o.owner, meta: o.metadata,
			keys: []string{key, key + ":holds", key + ":waiters", key + ":pending", key + ":queue", key + ":fence", key + ":released"}}
		l.rel = append(l.keys[:5:5], l.keys[6])
		l.held = []string{key, key + ":holds", l.keys[6]}
		given := flag(o.given())
		args := []any{kind.mode, flag(wait), flag(m.fair), given}
		ahead := []any{kind.mode, flag(false), flag(m.fair), given}
		if kind == writeHold {
			// How long the writers' fence counter is kept (ARGV[12]).
			args, ahead = m.c.fenceArg(args, 4), m.c.fenceArg(ahead, 4)
		}
		l.extra = func(wa waitArgs) []any {
			if wa.ahead {
				return ahead // a waiting caller's attempt that records nothing
			}
			return args
		}
		l.init(m.c, o)
		return l, nil
	}
}

// flag is a boolean script argument.
func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
