package main

// This file holds every use of the primitives besides the exclusive lock:
// which one run takes (--shared, --semaphore), and the fields of an Info
// that only read/write locks and semaphores fill in.

import (
	"context"

	"github.com/dlockio/dlock"
)

// kind is the primitive run takes on a name.
type kind struct {
	shared  bool // a read lock of a read/write lock
	permits int  // a permit of a semaphore of this many permits; 0 for none
}

// acquireFunc obtains the lock run holds.
type acquireFunc func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error)

// acquirers returns the functions that obtain k on name: at once or not at
// all (try), and waiting (wait).
func (k kind) acquirers(c *dlock.Client, name string) (try, wait acquireFunc, err error) {
	switch {
	case k.shared:
		return nil, nil, errNotInBuild("--shared", "read/write locks")
	case k.permits > 0:
		return nil, nil, errNotInBuild("--semaphore", "semaphores")
	}
	try = func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
		return c.TryLock(ctx, name, opts...)
	}
	wait = func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
		return c.Lock(ctx, name, opts...)
	}
	return try, wait, nil
}

func errNotInBuild(flag, what string) error {
	return usage(runCommand, "%s is not available in this build of dlock: its library has no %s yet; leave it out to take an exclusive lock", flag, what)
}

// holderMode is how h holds its name: "exclusive", "write", "read" or
// "permit".
func holderMode(info *dlock.Info, h dlock.Holder) string {
	return "exclusive"
}

// waiters returns how many are waiting for the name, and whether this
// build can tell.
func waiters(info *dlock.Info) (n int, known bool) {
	return 0, false
}

// writerWaiting reports whether a writer waits for a read/write lock, and
// whether this build can tell.
func writerWaiting(info *dlock.Info) (waiting, known bool) {
	return false, false
}

// permits returns the number of permits of a semaphore, and whether the
// name is one.
func permits(info *dlock.Info) (n int, ok bool) {
	return 0, false
}
