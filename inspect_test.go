package dlock_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

func TestInspect(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	info, err := e.c.Inspect(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if info.Kind != dlock.KindNone || len(info.Holders) != 0 {
		t.Errorf("free name: %+v", info)
	}
	before := time.Now().Add(-time.Second)
	l, err := e.c.TryLock(ctx, "report", dlock.WithTTL(time.Minute), dlock.WithMetadata("host=a pid=7"), dlock.WithOwner("job-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.TryLock(ctx, "report", dlock.WithOwner("job-1"), dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	info, err = e.c.Inspect(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if info.Kind != dlock.KindLock || info.Name != "report" || len(info.Holders) != 1 || info.Fence != l.Fence() {
		t.Fatalf("info = %+v", info)
	}
	h := info.Holders[0]
	if h.Owner != "job-1" || h.Metadata != "host=a pid=7" || h.Count != 2 || h.Fence != l.Fence() ||
		h.TTL <= 50*time.Second || h.Since.Before(before) || h.Since.After(time.Now().Add(time.Second)) {
		t.Errorf("holder = %+v", h)
	}
	e.srv.Do(t, "SET", "dlock:{data}", "x")
	if _, err := e.c.Inspect(ctx, "data"); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("Inspect of other data: err = %v, want ErrWrongType", err)
	}
	if _, err := e.c.Inspect(ctx, ""); !errors.Is(err, dlock.ErrEmptyName) {
		t.Errorf("empty name: err = %v", err)
	}
}

// TestInspectGivesAWritersFenceWithoutACounter: a writer's fence is the
// newest issued for its name, also where no counter is kept (or it
// expired before the hold ended).
func TestInspectGivesAWritersFenceWithoutACounter(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.newClient(t, dlock.WithFenceRetention(0))
	w, err := c.RWMutex("cfg").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release(ctx)
	info, err := c.Inspect(ctx, "cfg")
	if err != nil {
		t.Fatal(err)
	}
	if w.Fence() == 0 || info.Fence != w.Fence() || len(info.Holders) != 1 || info.Holders[0].Fence != w.Fence() {
		t.Errorf("writer's fence %d; info = %+v", w.Fence(), info)
	}
}

// A hold that lives longer than the longest time.Duration (made so by an
// operator's PEXPIRE, or kept by WithMinHold(math.MaxInt64), which Redis
// keeps in milliseconds rounded up) has the longest Duration as its TTL,
// in Inspect and in Lock.TTL: its milliseconds times a million overflowed
// into 0 or a negative time.
func TestATTLPastTheLongestDurationReadsAsTheLongest(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "long", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "PEXPIRE", "dlock:{long}", "10000000000000") // some 317 years
	info, err := e.c.Inspect(ctx, "long")
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) != 1 || info.Holders[0].TTL != math.MaxInt64 {
		t.Errorf("Inspect: holders %+v, want one with the longest TTL", info.Holders)
	}
	if left, err := l.TTL(ctx); err != nil || left != math.MaxInt64 {
		t.Errorf("TTL = %v, %v; want the longest", left, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestForceRelease(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := e.c.TryLock(ctx, "stuck", dlock.WithTTL(time.Minute), dlock.WithMetadata("who"),
		dlock.WithRefreshInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	admin := e.newClient(t)
	was, err := admin.ForceRelease(ctx, "stuck")
	if err != nil {
		t.Fatal(err)
	}
	if was.Kind != dlock.KindLock || len(was.Holders) != 1 || was.Holders[0].Metadata != "who" {
		t.Errorf("removed = %+v", was)
	}
	waitDone(t, l, 5*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLost) || !errors.Is(l.Err(), dlock.ErrForceReleased) {
		t.Errorf("holder's Err = %v, want ErrLost and ErrForceReleased", l.Err())
	}
	next, err := admin.TryLock(ctx, "stuck")
	if err != nil {
		t.Fatal(err)
	}
	if next.Fence() <= l.Fence() {
		t.Errorf("fence after a force release: %d, before %d", next.Fence(), l.Fence())
	}
	if was, err := admin.ForceRelease(ctx, "free-name"); err != nil || was.Kind != dlock.KindNone {
		t.Errorf("force release of a free name = %+v, %v", was, err)
	}
	e.srv.Do(t, "RPUSH", "dlock:{list}", "x")
	if _, err := admin.ForceRelease(ctx, "list"); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("force release of other data: err = %v, want ErrWrongType", err)
	}
	if e.srv.Do(t, "LLEN", "dlock:{list}") != "1" {
		t.Error("other data touched")
	}
}

// Every Lock of a hold that ForceRelease ended learns so, whichever call
// finds it (Refresh, TTL, Release), and so does every acquisition of a
// re-entered hold; a lock that expired does not say so, nor does a hold
// taken after the force release, whose own Locks know nothing of it.
func TestAForceReleasedLockSaysSo(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	own := dlock.WithOwner("job-9")
	first, err := e.c.TryLock(ctx, "ended", own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	second, err := e.c.TryLock(ctx, "ended", own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	third, err := e.c.TryLock(ctx, "ended", own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// A re-entry whose request token the caller gave.
	fourth, err := e.c.TryLock(ctx, "ended", own, dlock.WithToken("given-by-the-caller"), dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	attached, err := e.newClient(t).Attach(ctx, "ended", first.Token())
	if err != nil {
		t.Fatal(err)
	}
	expired, err := e.c.TryLock(ctx, "expired")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.newClient(t).ForceRelease(ctx, "ended"); err != nil {
		t.Fatal(err)
	}
	forced := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrForceReleased) || !strings.Contains(err.Error(), "force-released") {
			t.Errorf("%s: err = %v, want ErrNotHeld and ErrForceReleased", what, err)
		}
	}
	forced("Refresh", first.Refresh(ctx, time.Minute))
	if !errors.Is(first.Err(), dlock.ErrLost) || !errors.Is(first.Err(), dlock.ErrForceReleased) {
		t.Errorf("Err after the Refresh = %v, want ErrLost and ErrForceReleased", first.Err())
	}
	_, err = second.TTL(ctx)
	forced("TTL of a re-entry", err)
	forced("Release of a re-entry", third.Release(ctx))
	forced("Release of a re-entry WithToken", fourth.Release(ctx))
	forced("Release of the attached Lock", attached.Release(ctx))

	// The next holder is not told of it, and ends as its own Locks do.
	next, err := e.c.TryLock(ctx, "ended", own)
	if err != nil {
		t.Fatal(err)
	}
	if err := next.Release(ctx); err != nil {
		t.Errorf("the next holder's Release: %v", err)
	}
	if err := next.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrForceReleased) {
		t.Errorf("the next holder's second Release: err = %v, want ErrNotHeld alone", err)
	}
	e.srv.Do(t, "DEL", "dlock:{expired}") // as its expiry would
	err = expired.Release(ctx)
	if !errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrForceReleased) {
		t.Errorf("Release of an expired lock: err = %v, want ErrNotHeld alone", err)
	}
}

// A late copy of the acquire of a Lock that ForceRelease ended (a client
// library's resend, a slow connection) takes nothing, of every kind, also
// after another holder came and went: it took the name back for that
// Lock, whose next Refresh then succeeded, never telling it that the name
// was freed and maybe held by another meanwhile.
func TestALateCopyOfAForceReleasedLocksAcquireTakesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, k := range []struct {
		kind, name string
		acquire    func(c *dlock.Client) (*dlock.Lock, error)
	}{
		{"lock", "forced-lock", func(c *dlock.Client) (*dlock.Lock, error) {
			return c.TryLock(ctx, "forced-lock", dlock.WithTTL(time.Minute))
		}},
		{"write", "forced-write", func(c *dlock.Client) (*dlock.Lock, error) {
			return c.RWMutex("forced-write").TryLock(ctx, dlock.WithTTL(time.Minute))
		}},
		{"fair read", "forced-read", func(c *dlock.Client) (*dlock.Lock, error) {
			return c.RWMutex("forced-read", dlock.Fair()).TryRLock(ctx, dlock.WithTTL(time.Minute))
		}},
		{"permit", "forced-permit", func(c *dlock.Client) (*dlock.Lock, error) {
			return c.Semaphore("forced-permit", 1).TryAcquire(ctx, dlock.WithTTL(time.Minute))
		}},
	} {
		t.Run(k.kind, func(t *testing.T) {
			d := &copyingDriver{Driver: e.newDriver(t)}
			c := dlock.New(d)
			defer c.Close()
			l, err := k.acquire(c)
			if err != nil {
				t.Fatal(err)
			}
			name := k.name
			if _, err := e.c.ForceRelease(ctx, name); err != nil {
				t.Fatal(err)
			}
			if k.kind == "lock" { // another holder comes and goes
				other, err := e.c.TryLock(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				if err := other.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if r := d.sendCopies(t); !refusal(r[0]) {
				t.Errorf("the late copy replied %v, want a refusal", r[0])
			}
			info, err := e.c.Inspect(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if len(info.Holders) != 0 {
				t.Errorf("held after the late copy: %+v", info.Holders)
			}
			if err := l.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrForceReleased) {
				t.Errorf("the ended Lock's Refresh: err = %v, want ErrForceReleased", err)
			}
		})
	}
}

// A late copy of the acquire of a lock that ForceRelease ended takes
// nothing, also once a hold taken since has run out, its hash with the
// record: it took the name back with the ended Lock's token, whose next
// Refresh then succeeded, never telling it that another held the name.
func TestALateCopyOfAForceReleasedAcquireOutlivesAHoldTakenAfterIt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, after := range []string{"none", "holder died"} {
		t.Run(after, func(t *testing.T) {
			name := "forced-then-" + strings.ReplaceAll(after, " ", "-")
			key := "dlock:{" + name + "}"
			d := &copyingDriver{Driver: e.newDriver(t)} // keeps a copy of the acquire
			c := dlock.New(d)
			defer c.Close()
			l, err := c.TryLock(ctx, name, dlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.c.ForceRelease(ctx, name); err != nil {
				t.Fatal(err)
			}
			if after == "holder died" {
				if _, err := e.c.TryLock(ctx, name, dlock.WithTTL(100*time.Millisecond)); err != nil {
					t.Fatal(err)
				}
				awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "EXISTS", key) == "0" })
			}
			if r := d.sendCopies(t); !refusal(r[0]) {
				t.Errorf("a late copy of the force-released acquire replied %v, want a refusal", r[0])
			}
			if err := l.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
				t.Errorf("the force-released Lock's Refresh after the copy: %v, want ErrNotHeld", err)
			}
		})
	}
}

// Read and write holds and permits that ForceRelease ended say so too,
// whichever call finds them gone; a hold that expired does not.
func TestAForceReleasedHoldSaysSo(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	reader, err := e.c.RWMutex("rw-forced").TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.c.RWMutex("rw-forced").TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	writer, err := e.c.RWMutex("w-forced").TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	permit, err := e.c.Semaphore("sem-forced", 2).TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	expired, err := e.c.RWMutex("rw-expired").TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	admin := e.newClient(t)
	for _, name := range []string{"rw-forced", "w-forced", "sem-forced"} {
		if _, err := admin.ForceRelease(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	forced := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrForceReleased) || err != nil && !strings.Contains(err.Error(), ") was force-released") {
			// Its mode, in parentheses, before "was": a refresh left it out.
			t.Errorf("%s: err = %v, want ErrNotHeld and ErrForceReleased, naming its mode", what, err)
		}
	}
	forced("Refresh of a read hold", reader.Refresh(ctx, time.Minute))
	if !errors.Is(reader.Err(), dlock.ErrLost) || !errors.Is(reader.Err(), dlock.ErrForceReleased) {
		t.Errorf("Err after the Refresh = %v, want ErrLost and ErrForceReleased", reader.Err())
	}
	_, err = other.TTL(ctx)
	forced("TTL of another read hold", err)
	forced("Release of the write hold", writer.Release(ctx))
	forced("Refresh of a permit", permit.Refresh(ctx, time.Minute))

	e.srv.Do(t, "DEL", "dlock:{rw-expired}", "dlock:{rw-expired}:holds") // as their expiry would
	if err := expired.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrForceReleased) {
		t.Errorf("Refresh of an expired hold: err = %v, want ErrNotHeld alone", err)
	}
}

// The record of the holds a force release ended is of the live ones only:
// a hold that had expired before says ErrNotHeld alone, and so does a later
// hold of a token given again, once it ends. A release marker that holds
// data dlock did not write gets no record. A name with thousands of holds
// is force-released all the same.
func TestAForceReleaseRecordsOnlyTheHoldsItEnded(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	admin := e.newClient(t)
	holders := func(name string) int {
		info, err := admin.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return len(info.Holders)
	}
	awaitHolders := func(name string, n int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); holders(name) != n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d holders, want %d", name, holders(name), n)
			}
		}
	}
	notHeldAlone := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrForceReleased) {
			t.Errorf("%s: err = %v, want ErrNotHeld alone", what, err)
		}
	}

	s := e.c.Semaphore("expired-before", 2)
	dead, err := s.TryAcquire(ctx, dlock.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquire(ctx, dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	awaitHolders("expired-before", 1)
	if _, err := admin.ForceRelease(ctx, "expired-before"); err != nil {
		t.Fatal(err)
	}
	notHeldAlone("Release of a permit that expired before", dead.Release(ctx))

	for _, name := range []string{"reused-rw", "reused-sem"} {
		take := func(opts ...dlock.Option) (*dlock.Lock, error) {
			opts = append(opts, dlock.WithToken("job-42"))
			if name == "reused-rw" {
				return e.c.RWMutex(name).TryRLock(ctx, opts...)
			}
			return e.c.Semaphore(name, 2).TryAcquire(ctx, opts...)
		}
		if _, err := take(); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.ForceRelease(ctx, name); err != nil {
			t.Fatal(err)
		}
		again, err := take(dlock.WithTTL(200 * time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		awaitHolders(name, 0)
		notHeldAlone(name+": Refresh of a later hold of the token", again.Refresh(ctx, time.Minute))
	}

	// Foreign data at the marker (written while the permit was held: an
	// acquire refuses it) is left alone.
	if _, err := e.c.Semaphore("foreign-marker", 2).TryAcquire(ctx); err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "ZADD", "dlock:{foreign-marker}:released", "1", "user-a")
	if _, err := admin.ForceRelease(ctx, "foreign-marker"); err != nil {
		t.Fatal(err)
	}
	if got := e.srv.Do(t, "PTTL", "dlock:{foreign-marker}:released"); got != "-1" {
		t.Errorf("PTTL of the foreign sorted set = %s, want -1", got)
	}
	if got := e.srv.Do(t, "ZCARD", "dlock:{foreign-marker}:released"); got != "1" {
		t.Errorf("the foreign sorted set has %s members, want its 1", got)
	}

	many := e.c.Semaphore("many", 4100)
	var wg sync.WaitGroup
	errs := make(chan error, 4100)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 205 {
				if _, err := many.TryAcquire(ctx); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	was, err := admin.ForceRelease(ctx, "many")
	if err != nil {
		t.Fatalf("ForceRelease of 4100 permits: %v", err)
	}
	if len(was.Holders) != 4100 {
		t.Errorf("removed %d holders, want 4100", len(was.Holders))
	}
}

// The record a force release leaves is for the Locks of the hold it ended:
// a later hold of the same token given again, taken by an acquire or by a
// grant to a waiter, ends without saying it was force-released.
func TestAForceReleaseRecordIsNotForTheNextHoldOfItsToken(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	admin := e.newClient(t)
	for _, granted := range []bool{false, true} {
		name := "reused-" + strconv.FormatBool(granted)
		tok := dlock.WithToken("job-token-" + name)
		if _, err := e.c.TryLock(ctx, name, tok); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.ForceRelease(ctx, name); err != nil {
			t.Fatal(err)
		}
		var next *dlock.Lock
		if granted {
			other, err := admin.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			obtained := make(chan error, 1)
			go func() {
				var err error
				next, err = e.c.Lock(ctx, name, tok)
				obtained <- err
			}()
			// The waiter's refused attempt leaves its request for a grant
			// (and marks the hash as waited for).
			for deadline := time.Now().Add(5 * time.Second); e.srv.Do(t, "HGET", "dlock:{"+name+"}", "w") != "1"; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the waiter left no request")
				}
			}
			if err := other.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-obtained; err != nil {
				t.Fatal(err)
			}
		} else {
			var err error
			if next, err = e.c.TryLock(ctx, name, tok); err != nil {
				t.Fatal(err)
			}
		}
		attached, err := admin.Attach(ctx, name, "job-token-"+name)
		if err != nil {
			t.Fatal(err)
		}
		if err := next.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := attached.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrForceReleased) {
			t.Errorf("granted %v: Refresh of a later hold of the token: err = %v, want ErrNotHeld alone", granted, err)
		}
	}
}

func TestList(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, name := range []string{"jobs:nightly", "jobs:hourly", "orders:1", "{acct:9}:pay"} {
		if _, err := e.c.TryLock(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	e.srv.Do(t, "HSET", "dlock:{foreign}", "a", "b")         // a hash dlock did not write
	e.srv.Do(t, "HSET", "dlock:{foreign2}", "kind", "weird") // one with a field of the name dlock uses
	l, _ := e.c.TryLock(ctx, "released")
	_ = l.Release(ctx) // leaves only its fence counter
	for pattern, want := range map[string][]string{
		"":       {"jobs:hourly", "jobs:nightly", "orders:1", "{acct:9}:pay"},
		"jobs:*": {"jobs:hourly", "jobs:nightly"},
		"*:?":    {"orders:1"},
		"{acct*": {"{acct:9}:pay"},
		"none*":  nil,
	} {
		infos, err := e.c.List(ctx, pattern)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, info := range infos {
			if info.Kind != dlock.KindLock || len(info.Holders) != 1 {
				t.Errorf("%s: %+v", info.Name, info)
			}
			got = append(got, info.Name)
		}
		if len(got) != len(want) || (len(got) > 0 && !slices.Equal(got, want)) {
			t.Errorf("List(%q) = %v, want %v", pattern, got, want)
		}
	}
	// p}q and {p}q} are one lock, whose key is dlock:{p}q}: List gives the
	// name its key spells (docs/keys.md).
	if _, err := e.c.TryLock(ctx, "p}q"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.TryLock(ctx, "{p}q}"); !errors.Is(err, dlock.ErrNotObtained) || e.c.RedisKey("p}q") != "dlock:{p}q}" {
		t.Errorf("{p}q} while p}q is held: err = %v, key of p}q %q", err, e.c.RedisKey("p}q"))
	}
	if infos, err := e.c.List(ctx, "{p}*"); err != nil || len(infos) != 1 || infos[0].Name != "{p}q}" {
		t.Errorf("List({p}*) = %+v, %v; want {p}q}", infos, err)
	}
}

// TestListMatchesAsRedisDoes: List's pattern matches the names that
// Redis's own glob (KEYS) matches, classes' corner cases included.
func TestListMatchesAsRedisDoes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	names := []string{"a", "b", "z", "]", "-", "[", "\\", "ab", "a]", "^", "~", "é", "ÿ"}
	for _, name := range names {
		if _, err := e.c.TryLock(ctx, name); err != nil {
			t.Fatal(err)
		}
		e.srv.Do(t, "SET", "plain:"+name, "x") // the same name as a key of its own, for KEYS
	}
	for _, pattern := range []string{"[z-a]", "[a-c]", "[\\]]", "[\\-]", "[a", "[a-]", "[]]", "[]a]", "[^a]", "[^]", "\\", "\\]",
		"[\\\\]", "a[]]", "?", "*", "[-a]", "[a-z-]", "[!a]", "[[]", "[a-\xc3]*", "[^a-\xc3]*"} {
		infos, err := e.c.List(ctx, pattern)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, info := range infos {
			got = append(got, info.Name)
		}
		var want []string
		for _, key := range strings.Fields(e.srv.Do(t, "KEYS", "plain:"+pattern)) {
			want = append(want, strings.TrimPrefix(key, "plain:"))
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("List(%q) = %q, Redis matches %q", pattern, got, want)
		}
	}
}

func TestInspectRWMutexAndSemaphore(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	before := time.Now().Add(-time.Second)
	m := e.c.RWMutex("doc")
	r1, err := m.TryRLock(ctx, dlock.WithOwner("job-1"), dlock.WithMetadata("host=a"), dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	again, err := m.TryRLock(ctx, dlock.WithOwner("job-1"), dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := m.TryRLock(ctx, dlock.WithMetadata("host=b"), dlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	recorded, giveUp := frozenWaiter(t, e.newClient(t).RWMutex("doc"), true)
	<-recorded
	info, err := e.c.Inspect(ctx, "doc")
	giveUp()
	if err != nil {
		t.Fatal(err)
	}
	if info.Kind != dlock.KindRWMutex || info.Name != "doc" || info.Fair || info.Waiters != 1 || !info.WriterWaiting ||
		info.Fence != 0 || info.Permits != 0 || len(info.Holders) != 2 {
		t.Fatalf("info = %+v", info)
	}
	h1, h2 := info.Holders[0], info.Holders[1]
	if h1.Metadata != "host=a" { // taken in the same millisecond, their order is open
		h1, h2 = h2, h1
	}
	if h1.Mode != dlock.ModeRead || h1.Owner != "job-1" || h1.Metadata != "host=a" || h1.Count != 2 || h1.Fence != 0 ||
		h1.TTL <= 50*time.Second || h1.Since.Before(before) || h1.Since.After(time.Now().Add(time.Second)) {
		t.Errorf("first reader = %+v", h1)
	}
	if h2.Mode != dlock.ModeRead || h2.Owner != "" || h2.Metadata != "host=b" || h2.Count != 1 ||
		h2.TTL <= 20*time.Second || h2.TTL > 30*time.Second || h2.Since.Before(before) {
		t.Errorf("second reader = %+v", h2)
	}
	for _, l := range []*dlock.Lock{r1, again, r2} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := m.TryLock(ctx, dlock.WithMetadata("writer"))
	if err != nil {
		t.Fatal(err)
	}
	info, err = e.c.Inspect(ctx, "doc")
	if err != nil || len(info.Holders) != 1 || info.Waiters != 0 || info.WriterWaiting || info.Fence != w.Fence() {
		t.Fatalf("info = %+v, %v", info, err)
	}
	if h := info.Holders[0]; h.Mode != dlock.ModeWrite || h.Fence != w.Fence() || h.Metadata != "writer" {
		t.Errorf("writer = %+v", h)
	}

	s := e.c.Semaphore("pool", 3)
	for i := range 2 {
		if _, err := s.TryAcquire(ctx, dlock.WithMetadata("worker "+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	info, err = e.c.Inspect(ctx, "pool")
	if err != nil || info.Kind != dlock.KindSemaphore || info.Permits != 3 || len(info.Holders) != 2 || info.Fence != 0 {
		t.Fatalf("info = %+v, %v", info, err)
	}
	for i, h := range info.Holders {
		if h.Mode != dlock.ModePermit || h.Count != 1 || h.Fence != 0 || h.TTL <= 5*time.Second {
			t.Errorf("permit %d = %+v", i, h)
		}
	}
	if info, err := e.c.Inspect(ctx, "free"); err != nil || info.Kind != dlock.KindNone || len(info.Holders) != 0 {
		t.Errorf("free name: %+v, %v", info, err)
	}
	if info, err := e.c.Inspect(ctx, "report"); err != nil || len(info.Holders) != 0 {
		t.Errorf("never used: %+v, %v", info, err)
	}
}

// TestListAllKinds: List finds every kind, and only base keys: the other
// keys of a name (holds, waiters, queue, fence) are not names.
func TestListAllKinds(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.c.TryLock(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.RWMutex("b").TryRLock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Semaphore("c", 4).TryAcquire(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.RWMutex("d", dlock.Fair()).TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"b", "d"} {
		m := e.newClient(t).RWMutex(name) // b is not fair
		if name == "d" {
			m = e.newClient(t).RWMutex(name, dlock.Fair())
		}
		recorded, giveUp := frozenWaiter(t, m, true)
		<-recorded
		defer giveUp()
	}
	for _, k := range []string{"dlock:{b}:holds", "dlock:{b}:pending", "dlock:{d}:queue", "dlock:{d}:fence"} {
		if !e.exists(t, k) {
			t.Fatalf("%s missing: the test does not cover it", k)
		}
	}
	infos, err := e.c.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, info := range infos {
		got = append(got, info.Name+"="+string(info.Kind))
	}
	if want := []string{"a=lock", "b=rwlock", "c=semaphore", "d=rwlock"}; !slices.Equal(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
}

func TestForceReleaseRWMutexAndSemaphore(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m := e.c.RWMutex("stuck")
	var readers []*dlock.Lock
	for i := range 2 {
		l, err := m.TryRLock(ctx, dlock.WithTTL(time.Minute), dlock.WithRefreshInterval(20*time.Millisecond),
			dlock.WithMetadata("reader "+strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, l)
	}
	// A writer waits for them, retrying often.
	waiting := make(chan struct{})
	var once sync.Once
	got := make(chan error, 1)
	go func() {
		l, err := e.newClient(t).RWMutex("stuck").Lock(ctx, dlock.WithRetry(dlock.ConstantBackoff(5*time.Millisecond)),
			dlock.WithOnRetry(func(int, error) { once.Do(func() { close(waiting) }) }))
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	<-waiting
	admin := e.newClient(t)
	was, err := admin.ForceRelease(ctx, "stuck")
	if err != nil {
		t.Fatal(err)
	}
	if was.Kind != dlock.KindRWMutex || len(was.Holders) != 2 || !was.WriterWaiting ||
		was.Holders[0].Metadata+was.Holders[1].Metadata != "reader 0reader 1" &&
			was.Holders[0].Metadata+was.Holders[1].Metadata != "reader 1reader 0" {
		t.Errorf("removed = %+v", was)
	}
	for _, l := range readers {
		waitDone(t, l, 5*time.Second)
		if !errors.Is(l.Err(), dlock.ErrLost) {
			t.Errorf("reader's Err = %v, want ErrLost", l.Err())
		}
	}
	if err := <-got; err != nil {
		t.Errorf("the waiting writer after a force release: %v", err)
	}

	s := e.c.Semaphore("permits", 2)
	p, err := s.TryAcquire(ctx, dlock.WithRefreshInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	was, err = admin.ForceRelease(ctx, "permits")
	if err != nil || was.Kind != dlock.KindSemaphore || was.Permits != 2 || len(was.Holders) != 1 {
		t.Errorf("removed = %+v, %v", was, err)
	}
	waitDone(t, p, 5*time.Second)
	if !errors.Is(p.Err(), dlock.ErrLost) || !errors.Is(p.Err(), dlock.ErrForceReleased) {
		t.Errorf("permit's Err = %v, want ErrLost and ErrForceReleased", p.Err())
	}
	// The fence counter stays, the waiter set until its registrations
	// expire, and the release markers (which record the holds ended) for a
	// minute.
	left := strings.NewReplacer("dlock:{stuck}:waiters", "", "dlock:{stuck}:released", "", "dlock:{permits}:released", "").Replace(e.srv.Do(t, "KEYS", "*"))
	if strings.TrimSpace(left) != "dlock:{stuck}:fence" {
		t.Errorf("keys left: %q, want only the fence counter, the waiter set and the release marker", left)
	}
}

// Inspect counts the clients waiting for a name, of every kind, and stops
// counting them once their callers give up.
func TestInspectCountsWaitingClients(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, kind := range []string{"lock", "semaphore"} {
		t.Run(kind, func(t *testing.T) {
			name := "waited-" + kind
			take := func(ctx context.Context, c *dlock.Client) (*dlock.Lock, error) {
				if kind == "lock" {
					return c.Lock(ctx, name)
				}
				return c.Semaphore(name, 1).Acquire(ctx)
			}
			held, err := take(ctx, e.c)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release(ctx)
			wctx, cancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			for range 2 {
				c := e.newClient(t)
				for range 2 { // two callers of one client count as one client
					wg.Add(1)
					go func() {
						defer wg.Done()
						if l, err := take(wctx, c); err == nil {
							_ = l.Release(ctx)
						}
					}()
				}
			}
			clients := func() int {
				info, err := e.c.Inspect(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				return info.WaitingClients
			}
			awaitCond(t, 5*time.Second, func() bool { return clients() == 2 })
			// The last caller of each client to give up takes it out of the
			// waiter set before it returns, though the first one registered.
			cancel()
			wg.Wait()
			if n := clients(); n != 0 {
				t.Errorf("%d clients still counted as waiting after their callers gave up", n)
			}
		})
	}
}

// A hash dlock did not write is refused, and left alone, even with a kind
// field of its own.
func TestForceReleaseLeavesAForeignHashWithAKindAlone(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Do(t, "HSET", "dlock:{foreign}", "kind", "weird")
	if _, err := e.c.Inspect(ctx, "foreign"); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("Inspect: err = %v, want ErrWrongType", err)
	}
	if _, err := e.c.ForceRelease(ctx, "foreign"); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("ForceRelease: err = %v, want ErrWrongType", err)
	}
	if got := e.srv.Do(t, "HGET", "dlock:{foreign}", "kind"); got != "weird" {
		t.Errorf("the hash was changed: kind %q", got)
	}
}

// TestListUnderAPrefixThatIsNotUTF8: List finds the locks of a client
// whose prefix (or a name's glob-free part) is not valid UTF-8: its
// pattern keeps the prefix's bytes.
func TestListUnderAPrefixThatIsNotUTF8(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, prefix := range []string{"caf\xe9:", "\xff:"} {
		c := e.newClient(t, dlock.WithPrefix(prefix))
		if _, err := c.TryLock(ctx, "x\xfe"); err != nil {
			t.Fatal(err)
		}
		for _, pattern := range []string{"", "x\xfe", "x*"} {
			infos, err := c.List(ctx, pattern)
			if err != nil {
				t.Fatal(err)
			}
			if len(infos) != 1 || infos[0].Name != "x\xfe" {
				t.Errorf("prefix %q, List(%q) = %+v, want the lock %q", prefix, pattern, infos, "x\xfe")
			}
		}
	}
}
