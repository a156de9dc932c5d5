package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// TestAFullServerStillFreesAndKeepsLocks: on a server at its maxmemory,
// which refuses writes that may grow its memory, every way a hold ends
// still runs (a release, re-entered or not, of every kind, on several
// names, one that grants the lock to a waiter, one kept for its minimum
// hold, a force release), and so does every refresh (and TTL), so that no
// holder loses its lock to a full server, by EVALSHA and as functions alike.
// Acquisitions are refused there (TestAReplicaOrAFullServerIsNotTakenForOtherData).
func TestAFullServerStillFreesAndKeepsLocks(t *testing.T) {
	for _, mode := range []string{"EVALSHA", "functions"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			c, other := e.c, e.newClient(t)
			if mode == "functions" {
				c, other = e.functionsClient(t), e.functionsClient(t)
			}
			ttl := dlock.WithTTL(time.Minute)
			try := func(l *dlock.Lock, err error) *dlock.Lock {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
				return l
			}
			plain := try(c.TryLock(ctx, "plain", ttl))
			multi := try(c.TryLockMulti(ctx, []string{"multi-a", "multi-b"}, ttl))
			outer := try(c.TryLock(ctx, "again", ttl, dlock.WithOwner("o")))
			inner := try(c.TryLock(ctx, "again", ttl, dlock.WithOwner("o")))
			kept := try(c.TryLock(ctx, "kept", ttl, dlock.WithMinHold(time.Hour)))
			granting := try(c.TryLock(ctx, "granted", ttl))
			refreshed := try(c.TryLock(ctx, "refreshed", ttl))
			forced := try(c.TryLock(ctx, "forced", ttl))
			sem := c.Semaphore("sem", 3)
			permit := try(sem.TryAcquire(ctx, ttl))
			p1 := try(sem.TryAcquire(ctx, ttl, dlock.WithOwner("o")))
			p2 := try(sem.TryAcquire(ctx, ttl, dlock.WithOwner("o")))
			r1 := try(c.RWMutex("rw").TryRLock(ctx, ttl))
			r2 := try(c.RWMutex("rw").TryRLock(ctx, ttl))
			w := try(c.RWMutex("rw-w").TryLock(ctx, ttl))
			forcedPermit := try(c.Semaphore("sem-forced", 1).TryAcquire(ctx, ttl))
			forcedRead := try(c.RWMutex("rw-forced").TryRLock(ctx, ttl))
			// Bounded: a waiter that is not granted the lock could only
			// retry, refused, for its max wait.
			wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			waiter := lockWhenRefused(t, wctx, other, "granted")

			e.srv.Do(t, "CONFIG", "SET", "maxmemory", "1")
			full := true
			defer func() {
				if full {
					e.srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
				}
			}()
			// First, while the waiter's registration, which its attempts
			// cannot renew here, lasts (1.5s).
			if err := granting.Release(ctx); err != nil {
				t.Errorf("Release of a lock a client waits for: %v", err)
			}
			r := <-waiter
			if r.err != nil {
				t.Fatalf("the waiter for a lock released at maxmemory: %v", r.err)
			}
			if err := r.l.Release(ctx); err != nil {
				t.Errorf("Release of a lock granted at maxmemory: %v", err)
			}
			for _, h := range []struct {
				what string
				l    *dlock.Lock
			}{{"lock", refreshed}, {"permit", permit}, {"re-entered permit", p2}, {"read hold", r1}, {"write hold", w}, {"several names", multi}} {
				if err := h.l.Refresh(ctx, 2*time.Minute); err != nil {
					t.Errorf("Refresh of a %s: %v", h.what, err)
				}
				if ttl, err := h.l.TTL(ctx); err != nil || ttl <= time.Minute {
					t.Errorf("TTL of a %s refreshed: %v, %v", h.what, ttl, err)
				}
			}
			if err := c.Prepare(ctx); err != nil {
				t.Errorf("Prepare: %v", err)
			}
			if info, err := c.Inspect(ctx, "plain"); err != nil || len(info.Holders) != 1 {
				t.Errorf("Inspect of a held lock: %+v, %v", info, err)
			}
			if _, err := c.TryLock(ctx, "new"); err == nil {
				t.Error("TryLock of a new name at maxmemory: obtained")
			}
			for _, h := range []struct {
				what string
				l    *dlock.Lock
			}{
				{"lock", plain}, {"lock on several names", multi}, {"re-entered lock", inner}, {"re-entered lock's first hold", outer},
				{"lock kept for its minimum hold", kept},
				{"permit", permit}, {"re-entered permit", p1}, {"re-entered permit's last hold", p2},
				{"read hold", r1}, {"last read hold", r2}, {"write hold", w},
			} {
				if err := h.l.Release(ctx); err != nil {
					t.Errorf("Release of a %s: %v", h.what, err)
				}
			}
			for _, name := range []string{"forced", "sem-forced", "rw-forced"} {
				if _, err := c.ForceRelease(ctx, name); err != nil {
					t.Errorf("ForceRelease(%q): %v", name, err)
				}
			}
			for _, h := range []struct {
				what string
				l    *dlock.Lock
			}{{"lock", forced}, {"permit", forcedPermit}, {"read hold", forcedRead}} {
				if err := h.l.Release(ctx); !errors.Is(err, dlock.ErrForceReleased) {
					t.Errorf("Release of a force-released %s: %v, want ErrForceReleased", h.what, err)
				}
			}
			if err := refreshed.Release(ctx); err != nil {
				t.Errorf("Release of a refreshed lock: %v", err)
			}

			e.srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
			full = false
			// What was released is free for another client at once; the
			// hold kept for its minimum hold is not.
			for _, name := range []string{"plain", "multi-a", "multi-b", "again", "granted", "refreshed", "forced"} {
				l, err := other.TryLock(ctx, name)
				if err != nil {
					t.Errorf("TryLock(%q) after its release at maxmemory: %v", name, err)
					continue
				}
				_ = l.Release(ctx)
			}
			if _, err := other.TryLock(ctx, "kept"); !errors.Is(err, dlock.ErrNotObtained) {
				t.Errorf("TryLock of a lock kept for its minimum hold: %v, want ErrNotObtained", err)
			}
			for _, acquire := range []struct {
				what string
				f    func(context.Context, ...dlock.Option) (*dlock.Lock, error)
			}{
				{"the semaphore's 3 permits", other.Semaphore("sem", 3).TryAcquire},
				{"the semaphore's 3 permits", other.Semaphore("sem", 3).TryAcquire},
				{"the semaphore's 3 permits", other.Semaphore("sem", 3).TryAcquire},
				{"a force-released permit", other.Semaphore("sem-forced", 1).TryAcquire},
				{"a read/write lock read", other.RWMutex("rw").TryLock},
				{"a read/write lock written", other.RWMutex("rw-w").TryLock},
				{"a force-released read/write lock", other.RWMutex("rw-forced").TryLock},
			} {
				if _, err := acquire.f(ctx, ttl); err != nil {
					t.Errorf("%s after their release at maxmemory: %v", acquire.what, err)
				}
			}
		})
	}
}

// On a server at its maxmemory, the Release of a lock that expired still
// says ErrNotHeld: the record it would leave on the empty name is a write
// the server refuses, and it goes without.
func TestAReleaseOfAnExpiredLockAtMaxmemorySaysNotHeld(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "oom-expired")
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "DEL", "dlock:{oom-expired}") // as its expiry would
	e.srv.Do(t, "CONFIG", "SET", "maxmemory", "1")
	defer e.srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("err = %v, want ErrNotHeld", err)
	}
}
