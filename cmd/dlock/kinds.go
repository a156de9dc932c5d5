package main

// This file holds every use of the primitives besides the exclusive lock:
// which one run takes (--shared, --write, --fair, --semaphore), and the
// fields of an Info
// that only read/write locks and semaphores fill in.

import (
	"context"
	"fmt"

	"github.com/dlockio/dlock"
)

// kind is the primitive run takes on a name.
type kind struct {
	shared  bool // a read lock of a read/write lock
	write   bool // the write lock of a read/write lock
	fair    bool // with shared or write: the read/write lock is Fair
	permits int  // a permit of a semaphore of this many permits; 0 for none
}

// acquireFunc obtains the lock run holds.
type acquireFunc func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error)

// acquirers returns the functions that obtain k on name: at once or not at
// all (try), and waiting (wait).
func (k kind) acquirers(c *dlock.Client, name string) (try, wait acquireFunc, err error) {
	var rwOpts []dlock.RWOption
	if k.fair {
		rwOpts = append(rwOpts, dlock.Fair())
	}
	switch {
	case k.shared:
		rw := c.RWMutex(name, rwOpts...)
		return rw.TryRLock, rw.RLock, nil
	case k.write:
		rw := c.RWMutex(name, rwOpts...)
		return rw.TryLock, rw.Lock, nil
	case k.permits > 0:
		s := c.Semaphore(name, k.permits)
		return s.TryAcquire, s.Acquire, nil
	}
	try = func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
		return c.TryLock(ctx, name, opts...)
	}
	wait = func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
		return c.Lock(ctx, name, opts...)
	}
	return try, wait, nil
}

// holderMode is how h holds its name: "exclusive", "write", "read" or
// "permit".
func holderMode(_ *dlock.Info, h dlock.Holder) string {
	if h.Mode == "" {
		return dlock.ModeExclusive
	}
	return h.Mode
}

// waiters returns how many clients (processes, or dlock runs) are waiting
// for the name, of whatever kind, and whether that is known.
func waiters(info *dlock.Info) (n int, known bool) {
	return info.WaitingClients, true
}

// writerWaiting reports whether a writer waits for a read/write lock, and
// whether the name is one.
func writerWaiting(info *dlock.Info) (waiting, known bool) {
	return info.WriterWaiting, info.Kind == dlock.KindRWMutex
}

// permits returns the number of permits of a semaphore, and whether the
// name is one.
func permits(info *dlock.Info) (n int, ok bool) {
	return info.Permits, info.Kind == dlock.KindSemaphore
}

// fair reports whether a read/write lock serves readers and writers in
// arrival order, and whether the name is one.
func fair(info *dlock.Info) (ok, known bool) {
	return info.Fair, info.Kind == dlock.KindRWMutex
}

// writerFirst reports whether a read hold (k.shared) is kept out of the
// name whose record is info by a writer waiting for it, not by its
// holders: only readers hold it, whom a read hold would join. A writer
// that waits goes before new readers by default, and in a fair lock before
// those that come after it.
func (k kind) writerFirst(info *dlock.Info) bool {
	waiting, ok := writerWaiting(info)
	return k.shared && ok && waiting && countReaders(info) == len(info.Holders)
}

// writerFirstText says that a writer waiting for what (the name, or "it
// too") goes first (see writerFirst).
func (k kind) writerFirstText(what string) string {
	if k.fair {
		return fmt.Sprintf("a writer is waiting for %s and goes first (it came first: --fair serves in arrival order)", what)
	}
	return fmt.Sprintf("a writer is waiting for %s and goes first (see --fair)", what)
}

// permitRule says by which count a --semaphore N run (k.permits) is let
// in, when the semaphore whose record is info was last given another: its
// holders counted against that other count do not say why the run is
// kept out. "" otherwise.
func (k kind) permitRule(info *dlock.Info) string {
	n, ok := permits(info)
	if k.permits == 0 || !ok || n == k.permits {
		return ""
	}
	return fmt.Sprintf("this run's --semaphore %d lets it in only while fewer than %d are held", k.permits, k.permits)
}
