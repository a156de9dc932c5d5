package dlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/dlockio/dlock/internal/causes"
)

// Do runs fn while holding the exclusive lock called name: it obtains the
// lock as Lock does (waiting as opts say), refreshes it automatically,
// runs fn with a context that is cancelled as soon as the lock is known
// lost (at its local deadline, or at the refresh that finds it gone; its
// context.Cause says why), and releases the lock when fn returns. It
// returns fn's error, with the loss (matching ErrLost) if the lock was lost
// while fn ran: an error that matches both, and reads as both on one line
// (once, when fn's error holds the loss, context.Cause of its context).
// If fn panics, Do releases the lock and lets the panic go on. A release
// that no server answered in time (a stalled server), that one refused
// for a while (BUSY), or that found no connection (a server down, or
// replaced in a failover), is sent again in the background, as the clean-up of a
// failed acquisition is, for up to a minute (not for a lock obtained
// WithToken, which runs out with its TTL; one WithMinHold is kept until
// its minimum hold has passed, as Release keeps it): Do returns its
// error, and nobody need call Release again. One that ran, its reply
// lost, is found done, and the lock ends released. A release sent after fn
// returned whose reply comes after the lock's deadline is no loss for Do,
// which returns fn's error, though the lock's End hooks (and metrics) may
// count it lost: they saw the deadline pass first.
//
// opts are those of Lock; WithAutoRefresh is implied. A Do inside fn on
// the same name waits for fn's own hold unless both have one owner
// (WithOwner): see Lock.
//
// fn finds the Lock with LockFromContext(ctx), to read its fence
// (Lock.Fence) for writes that must carry it.
func (c *Client) Do(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	return do(ctx, fn, opts, func(opts []Option) (*Lock, error) { return c.Lock(ctx, name, opts...) })
}

// TryDo is Do that does not wait: it obtains the lock as TryLock does, in
// one attempt, and returns an error matching ErrNotObtained, without
// running fn, when another holds it. This is the call for work that one
// instance of a fleet must do while the others skip it, such as a cron
// job (with WithMinHold, at most once per period; see the package doc).
func (c *Client) TryDo(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	return do(ctx, fn, opts, func(opts []Option) (*Lock, error) { return c.TryLock(ctx, name, opts...) })
}

// DoMulti is Do for a lock on several names at once, obtained as LockMulti
// obtains it.
func (c *Client) DoMulti(ctx context.Context, names []string, fn func(ctx context.Context) error, opts ...Option) error {
	return do(ctx, fn, opts, func(opts []Option) (*Lock, error) { return c.LockMulti(ctx, names, opts...) })
}

// TryDoMulti is TryDo for a lock on several names at once, obtained as
// TryLockMulti obtains it.
func (c *Client) TryDoMulti(ctx context.Context, names []string, fn func(ctx context.Context) error, opts ...Option) error {
	return do(ctx, fn, opts, func(opts []Option) (*Lock, error) { return c.TryLockMulti(ctx, names, opts...) })
}

// Do is Client.Do for the write hold: it runs fn while holding it,
// obtained as Lock obtains it.
func (m *RWMutex) Do(ctx context.Context, fn func(ctx context.Context) error, opts ...Option) error {
	return do(ctx, fn, opts, func(opts []Option) (*Lock, error) { return m.Lock(ctx, opts...) })
}

// TryDo is Client.TryDo for the write hold: it runs fn while holding it,
// obtained as TryLock obtains it, and returns an error matching
// ErrNotObtained, without running fn, when the name is held.
func (m *RWMutex) TryDo(ctx context.Context, fn func(ctx context.Context) error, opts ...Option) error {
	return do(ctx, fn, opts, func(opts []Option) (*Lock, error) { return m.TryLock(ctx, opts...) })
}

// RDo is Client.Do for a read hold: it runs fn while holding one,
// obtained as RLock obtains it.
func (m *RWMutex) RDo(ctx context.Context, fn func(ctx context.Context) error, opts ...Option) error {
	return do(ctx, fn, opts, func(opts []Option) (*Lock, error) { return m.RLock(ctx, opts...) })
}

// TryRDo is Client.TryDo for a read hold: it runs fn while holding one,
// obtained as TryRLock obtains it, and returns an error matching
// ErrNotObtained, without running fn, when a writer holds the name or
// waits for it.
func (m *RWMutex) TryRDo(ctx context.Context, fn func(ctx context.Context) error, opts ...Option) error {
	return do(ctx, fn, opts, func(opts []Option) (*Lock, error) { return m.TryRLock(ctx, opts...) })
}

// Do is Client.Do for a permit: it runs fn while holding one, obtained as
// Acquire obtains it.
func (s *Semaphore) Do(ctx context.Context, fn func(ctx context.Context) error, opts ...Option) error {
	return do(ctx, fn, opts, func(opts []Option) (*Lock, error) { return s.Acquire(ctx, opts...) })
}

// TryDo is Client.TryDo for a permit: it runs fn while holding one,
// obtained as TryAcquire obtains it, and returns an error matching
// ErrNotObtained, without running fn, when every permit is held.
func (s *Semaphore) TryDo(ctx context.Context, fn func(ctx context.Context) error, opts ...Option) error {
	return do(ctx, fn, opts, func(opts []Option) (*Lock, error) { return s.TryAcquire(ctx, opts...) })
}

// do obtains a hold with acquire, refreshed automatically, runs fn under
// it and releases it (see Client.Do).
func do(ctx context.Context, fn func(ctx context.Context) error, opts []Option, acquire func([]Option) (*Lock, error)) error {
	if fn == nil {
		return fmt.Errorf("%w: Do with a nil function", ErrInvalidArgument)
	}
	l, err := acquire(append([]Option{WithAutoRefresh()}, opts...))
	if err != nil {
		return err
	}
	returned := false
	defer func() {
		if !returned {
			// fn panicked (or called runtime.Goexit): release now, or a
			// caller that recovers the panic (net/http does) would leave
			// the lock held and refreshed for good.
			later, err := l.doRelease(ctx, true)
			if err != nil && !errors.Is(err, ErrNotHeld) {
				then := "the lock expires with its TTL"
				if later {
					then = "it is given back in the background"
				}
				l.c.log.WarnContext(ctx, "dlock: could not release after the function panicked; "+then, "names", l.lockNames(), "err", err)
			}
		}
	}()
	err = fn(l.Context(ctx))
	returned = true
	lost := l.Err()
	// Not reporting a loss that came after fn returned (a reply that came
	// after the deadline, of a release sent before it): fn's work was
	// done in time. A refresh that finds the lock gone while the release
	// is under way waits for the give-back, if any, which may find the
	// release done.
	_, rerr := l.doRelease(ctx, false)
	if rerr != nil && lost == nil {
		// A release that finds the lock gone ends it as lost, which
		// says so (ErrLost); a failed one says why.
		lost = cmp.Or(l.Err(), rerr)
	}
	switch {
	case lost == nil:
		return err
	case err == nil:
		return lost
	case errors.Is(err, lost):
		// fn returned the loss (context.Cause of its context), in its
		// own words.
		return err
	}
	// Both, on one line (errors.Join's message takes two).
	return &causes.Error{Msg: err.Error() + "; " + lost.Error(), Errs: []error{err, lost}}
}

// doRelease releases Do's lock (reporting a loss as releaseAfterReporting
// does) and, as nobody can call Release again, gives it back in the
// background after a release that no server answered (see giveBackLater):
// later says it did. Until then a refresh that finds the lock gone waits
// for the give-back's outcome (see setGivingBack); the wait ends however
// the release ends, a hook's panic included, so that such a refresh's loss
// is not kept from the lock for good.
func (l *Lock) doRelease(ctx context.Context, reportLoss bool) (later bool, err error) {
	l.setGivingBack(l.ownReq, false)
	finished := false
	defer func() {
		switch {
		case !finished:
			// A hook panicked: nothing goes on in the background. On a
			// panicking goroutine, an End hook's own panic is logged.
			l.setGivingBack(false, true)
		case !later:
			l.setGivingBack(false, false)
		}
	}()
	err = l.releaseAfterReporting(ctx, reportLoss)
	later = l.giveBackLater(err)
	finished = true
	return later, err
}
