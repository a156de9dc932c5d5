package dlock_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

// Re-entrant holds (WithOwner) share one key. These tests check that each
// acquisition of such a hold acts only for itself: it cannot cut the
// others' TTL short, and its release, repeated or late, takes away its own
// count and no one else's.

// pttl returns the remaining TTL of the lock called name, from the server.
func (e *env) pttl(t *testing.T, name string) time.Duration {
	t.Helper()
	ms, err := strconv.Atoi(e.srv.Do(t, "PTTL", "dlock:{"+name+"}"))
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(ms) * time.Millisecond
}

// expectHeld fails t unless another client is refused the lock called name
// and l still reports it held.
func (e *env) expectHeld(t *testing.T, name string, l *dlock.Lock) {
	t.Helper()
	ctx := context.Background()
	if got, err := e.newClient(t).TryLock(ctx, name); !errors.Is(err, dlock.ErrNotObtained) {
		if got != nil {
			_ = got.Release(ctx)
		}
		t.Fatalf("another client: err = %v, want ErrNotObtained while %s holds", err, l.Token())
	}
	if _, err := l.TTL(ctx); err != nil {
		t.Fatalf("TTL of the hold that should still be there: %v", err)
	}
}

func TestAReentryNeverShortensTheHold(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	own := dlock.WithOwner("job")
	long, err := e.c.TryLock(ctx, "nest", own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	short, err := e.c.TryLock(ctx, "nest", own, dlock.WithTTL(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if left := e.pttl(t, "nest"); left < 50*time.Second {
		t.Errorf("TTL after a re-entry with 50ms: %v, want the first hold's minute", left)
	}
	// A refresh by either acquisition does not shorten the shared hold.
	if err := short.Refresh(ctx, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if left := e.pttl(t, "nest"); left < 50*time.Second {
		t.Errorf("TTL after a refresh to 50ms of a hold held twice: %v, want the minute", left)
	}
	// It extends it.
	if err := short.Refresh(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if left := e.pttl(t, "nest"); left < 110*time.Second {
		t.Errorf("TTL after a refresh to 2 minutes: %v", left)
	}
	// Held once again, its holder may shorten it.
	if err := short.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := long.Refresh(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if left := e.pttl(t, "nest"); left > 10*time.Second {
		t.Errorf("TTL after the only hold's refresh to 10s: %v", left)
	}
	e.expectHeld(t, "nest", long)
}

func TestAnAcquireRepeatedWithItsTokenNeverShortensTheHold(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, err := e.c.TryLock(ctx, "again", dlock.WithToken("t-1"), dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.TryLock(ctx, "again", dlock.WithToken("t-1"), dlock.WithTTL(50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if left := e.pttl(t, "again"); left < 50*time.Second {
		t.Errorf("TTL after the same token's acquire with 50ms: %v, want the minute", left)
	}
	e.expectHeld(t, "again", a)
}

func TestALockOfAnEarlierHoldCannotTouchTheNext(t *testing.T) {
	// The owner's first hold is released; the owner then takes the name
	// again, with a new token. A Lock value of the first hold that missed
	// the release (here attached with its token) must not refresh or
	// release the second.
	e := newEnv(t)
	ctx := context.Background()
	own := dlock.WithOwner("job")
	first, err := e.c.TryLock(ctx, "gen", own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	stale, err := e.newClient(t).Attach(ctx, "gen", first.Token(), own)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := e.newClient(t).TryLock(ctx, "gen", own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := stale.Refresh(ctx, 50*time.Millisecond); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("the earlier hold's Refresh: err = %v, want ErrNotHeld", err)
	}
	if left := e.pttl(t, "gen"); left < 50*time.Second {
		t.Errorf("TTL of the second hold after the earlier hold's refresh: %v", left)
	}
	if err := stale.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("the earlier hold's Release: err = %v, want ErrNotHeld", err)
	}
	e.expectHeld(t, "gen", second)
}

func TestReleaseCalledAgainAfterALostReplyCountsOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	own := dlock.WithOwner("job")
	var holds [3]*dlock.Lock
	for i := range holds {
		l, err := e.c.TryLock(ctx, "twice", own, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		holds[i] = l
	}
	// The first release runs, and so does the one Release sends again at
	// once; both replies are lost: the caller calls Release again, which is
	// the same release and counts as done.
	e.drv.loseReplies(2)
	if err := holds[0].Release(ctx); err == nil {
		t.Fatal("Release with its reply lost returned nil")
	}
	if err := holds[0].Release(ctx); err != nil {
		t.Fatalf("Release called again: %v, want nil: the first one ran", err)
	}
	if err := holds[0].Err(); err != nil {
		t.Errorf("Err after the release: %v", err)
	}
	if got := e.srv.Do(t, "HGET", "dlock:{twice}", "count"); got != "2" {
		t.Errorf("count %s after one release of three holds, want 2", got)
	}
	// Again, with another hold's release between the two calls: the
	// repeated call must not take the third hold's count.
	e.drv.loseReplies(2)
	if err := holds[1].Release(ctx); err == nil {
		t.Fatal("Release with its reply lost returned nil")
	}
	extra, err := e.c.TryLock(ctx, "twice", own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := extra.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := holds[1].Release(ctx); err != nil {
		t.Errorf("Release called again after another hold's release: %v, want nil: the first one ran", err)
	}
	if got := e.srv.Do(t, "HGET", "dlock:{twice}", "count"); got != "1" {
		t.Errorf("count %s with one hold left, want 1", got)
	}
	e.expectHeld(t, "twice", holds[2])
	if err := holds[2].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{twice}") {
		t.Error("the last hold's release did not free the lock")
	}
}

func TestALostReentryIsTakenBackThoughAnotherCameBetween(t *testing.T) {
	// The owner's second acquisition runs but its reply is lost; before the
	// cleanup runs, a third acquisition re-enters. The cleanup takes back
	// the second's count, not the third's, and the lock is free once the
	// first and third are released.
	e := newEnv(t)
	ctx := context.Background()
	own := dlock.WithOwner("job")
	first, err := e.c.TryLock(ctx, "between", own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var third *dlock.Lock
	var thirdErr error
	e.drv.loseReplyThen(func() {
		third, thirdErr = e.newClient(t).TryLock(ctx, "between", own, dlock.WithTTL(time.Minute))
	})
	if _, err := e.c.TryLock(ctx, "between", own); err == nil || errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("err = %v, want the transport error", err)
	}
	if thirdErr != nil {
		t.Fatal(thirdErr)
	}
	if got := e.srv.Do(t, "HGET", "dlock:{between}", "count"); got != "2" {
		t.Errorf("count %s after the lost re-entry was cleaned up, want 2 (first and third)", got)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	e.expectHeld(t, "between", third)
	if err := third.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{between}") {
		t.Error("the lock is still held after every acquisition was released")
	}
}

func TestAttachByOwnerActsWithTheHoldsToken(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	own := dlock.WithOwner("job")
	l, err := e.c.TryLock(ctx, "heir", own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	heir, err := e.newClient(t).Attach(ctx, "heir", "unknown", own)
	if err != nil {
		t.Fatal(err)
	}
	if heir.Token() != l.Token() {
		t.Errorf("attached by owner with token %q, want the hold's %q", heir.Token(), l.Token())
	}
	if err := heir.Refresh(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := heir.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.locked(t, "dlock:{heir}") {
		t.Error("the heir's release did not free the lock")
	}
	if _, err := e.newClient(t).Attach(ctx, "heir", "unknown", own); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Attach by owner to a free name: err = %v, want ErrNotHeld", err)
	}
}

// releaseRecordFields are the fields of a lock hash that keep the records
// of its last releases, newest first (see rel_fields in scripts/held.lua).
var releaseRecordFields = []string{"rel", "rel1", "rel2", "rel3", "rel4"}

// A lock's hash keeps the ids of its last releases, each followed by the
// request token of the acquisition it ended (its first 11 characters), in
// five fields of at most 64 bytes, newest first: the last eight to ten
// releases, and no more. So the hash stays in Redis's compact encoding,
// where one field of all of them took it past that at its second release.
func TestAHashKeepsTheIdsOfItsLastReleasesOnly(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var tokens []string
	for i := range 20 {
		l, err := e.c.TryLock(ctx, "churn")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, l.Token())
		if enc := e.srv.Do(t, "OBJECT", "ENCODING", "dlock:{churn}"); enc != "listpack" {
			t.Fatalf("after %d releases, the hash's encoding is %s, want listpack", i+1, enc)
		}
	}
	var words []string
	for _, f := range slices.Backward(releaseRecordFields) { // oldest first
		v := e.srv.Do(t, "HGET", "dlock:{churn}", f)
		if len(v) > 64 {
			t.Errorf("%s holds %d bytes, past a compact hash's 64", f, len(v))
		}
		if v != "(nil)" {
			words = append(words, strings.Fields(v)...)
		}
	}
	if len(words) < 16 || len(words) > 20 || len(words)%2 != 0 {
		t.Fatalf("words kept after 20 releases: %d (%q), want the ids and tokens of the last 8 to 10", len(words), words)
	}
	first := len(tokens) - len(words)/2
	for i := 0; i < len(words); i += 2 {
		if len(words[i]) != 11 {
			t.Errorf("word %d of %q: want an id of 11 characters", i, words)
		}
		if want := tokens[first+i/2][:11]; words[i+1] != want {
			t.Errorf("word %d is %q, want the token of release %d, %q", i+1, words[i+1], first+i/2+1, want)
		}
	}
}

// A clean-up sent again (the client library's resend after a lost reply)
// records the acquisition's end once: each copy added its request token
// anew, pushing older records out of the few the hash keeps.
func TestACleanupSentAgainRecordsItsEndOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := dlock.New(repeatDriver{e.drv})
	t.Cleanup(func() { _ = c.Close() })
	e.drv.loseReplies(1)
	if _, err := c.TryLock(ctx, "lost"); err == nil {
		t.Fatal("TryLock whose reply was lost: err = nil")
	}
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "HGET", "dlock:{lost}", "token") == "" })
	for _, f := range []string{"rel", "late"} {
		words := strings.Fields(e.srv.Do(t, "HGET", "dlock:{lost}", f))
		if f == "late" && len(words) > 0 {
			words = words[1:] // the lapse
		}
		if len(words) != 1 {
			t.Errorf("%s after a clean-up sent twice: %q, want the request token's word once", f, words)
		}
	}
}

// During a rolling upgrade, clients of an older dlock keep every release
// record in the field 'rel' alone (ids of up to 20 digits, whole request
// tokens), and read that field alone. A release by this dlock adds its own
// records to that field while it holds such words, so the older clients
// still find theirs (a release sent again counts once, a late copy of an
// acquire takes nothing); once their words went, the records move to the
// short fields again.
func TestAnOlderDlocksReleaseRecordsStayWhereItReadsThem(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	churn(ctx, t, e.c, "mixed", 1)
	const older = "12345678901234567890 AAAAAAAAAAAAAAAAAAAAAA"
	e.srv.Do(t, "HSET", "dlock:{mixed}", "rel", older)
	for i := range 3 {
		churn(ctx, t, e.c, "mixed", 1)
		if rel := e.srv.Do(t, "HGET", "dlock:{mixed}", "rel"); !strings.HasPrefix(rel, older+" ") {
			t.Fatalf("after %d releases, 'rel' is %q, want the older dlock's words first", i+1, rel)
		}
	}
	churn(ctx, t, e.c, "mixed", 30)
	for _, f := range releaseRecordFields {
		v := e.srv.Do(t, "HGET", "dlock:{mixed}", f)
		if len(v) > 64 || strings.Contains(v, "AAAA") {
			t.Errorf("after 33 releases, %s is %q, want the short records of this dlock only", f, v)
		}
	}
}

// The acquisitions of one owner share the hold's token, but a released one
// no longer acts on the hold with it: its refresh, sent before its release
// and run after it, neither cuts the others' TTL short nor extends it. The
// refresh script runs here as the client sends it.
func TestAReleasedAcquisitionsLateRefreshLeavesTheOthersHold(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	own := dlock.WithOwner("job")
	first, err := e.c.TryLock(ctx, "late-refresh", own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	second, err := e.c.TryLock(ctx, "late-refresh", own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var refresh *dlock.Script
	for _, s := range dlock.Scripts() {
		if s.Name == "refresh" {
			refresh = s
		}
	}
	// The first acquisition's request token is its token: it made the hold.
	call := &dlock.Call{Script: refresh, Keys: []string{"dlock:{late-refresh}"}, Args: []any{first.Token(), first.Token(), "50"}}
	e.drv.Eval(ctx, call)
	if call.Err != nil || call.Val != int64(1) {
		t.Errorf("late refresh of the released acquisition: %v, %v; want 1 (not held)", call.Val, call.Err)
	}
	if left := e.pttl(t, "late-refresh"); left < 50*time.Second {
		t.Fatalf("TTL after the released acquisition's late refresh: %v, want the remaining one's minute", left)
	}
	e.expectHeld(t, "late-refresh", second)
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The holds of a read/write lock and of a semaphore re-entered by their
// owner share one token too: an acquisition released while the others keep
// the hold no longer acts on it with that token. Its release sent again
// once the release marker forgot it, its late refresh and its acquire sent
// again are each refused and leave the others' hold as it was, so that no
// second writer, and no permit beyond the count, gets in. The scripts run
// as the client sends them.
func TestAReleasedAcquisitionOfASharedHoldCannotTouchIt(t *testing.T) {
	scripts := map[string]*dlock.Script{}
	for _, s := range dlock.Scripts() {
		scripts[s.Name] = s
	}
	for _, kind := range []string{"write", "permit"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			name := "shared-" + kind
			key := "dlock:{" + name + "}"
			take := func(c *dlock.Client, opts ...dlock.Option) (*dlock.Lock, error) {
				opts = append(opts, dlock.WithTTL(time.Minute))
				if kind == "write" {
					return c.RWMutex(name).TryLock(ctx, opts...)
				}
				return c.Semaphore(name, 1).TryAcquire(ctx, opts...)
			}
			own := dlock.WithOwner("job")
			first, err := take(e.c, own)
			if err != nil {
				t.Fatal(err)
			}
			second, err := take(e.c, own)
			if err != nil || second.Token() != first.Token() {
				t.Fatalf("re-entry: %v, token %q, want the first's %q", err, second.Token(), first.Token())
			}
			if err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
			tok, req := first.Token(), first.Token() // the first acquisition made the hold
			expiry := func() string { return e.srv.Do(t, "ZSCORE", key+":holds", tok) }
			before := expiry()

			var release, acquire *dlock.Call
			refresh := &dlock.Call{Script: scripts["holds_refresh"], Keys: []string{key, key + ":holds"}, Args: []any{tok, req, "50", kind}}
			if kind == "write" {
				release = &dlock.Call{Script: scripts["holds_release"], Args: []any{tok, req, kind, "another-id", ""},
					Keys: []string{key, key + ":holds", key + ":waiters", key + ":pending", key + ":queue", key + ":released"}}
				acquire = &dlock.Call{Script: scripts["rw_acquire"], Args: []any{req, "50", "", "job", "", "", "1500", kind, "0", "0"},
					Keys: []string{key, key + ":holds", key + ":waiters", key + ":pending", key + ":queue", key + ":fence"}}
			} else {
				release = &dlock.Call{Script: scripts["holds_release"], Args: []any{tok, req, kind, "another-id", ""},
					Keys: []string{key, key + ":holds", key + ":waiters", key + ":released"}}
				acquire = &dlock.Call{Script: scripts["sem_acquire"], Args: []any{req, "50", "", "job", "", "", "1500", kind, "1"},
					Keys: []string{key, key + ":holds", key + ":waiters"}}
			}
			for _, c := range []struct {
				what string
				call *dlock.Call
				ok   func(v any) bool
			}{
				{"release sent again", release, func(v any) bool { return v == int64(1) }},
				{"late refresh", refresh, func(v any) bool { return v == int64(1) }},
				{"acquire sent again", acquire, func(v any) bool { r, _ := v.([]any); return len(r) > 0 && r[0] == int64(0) }},
			} {
				e.drv.Eval(ctx, c.call)
				if c.call.Err != nil || !c.ok(c.call.Val) {
					t.Errorf("%s by the released acquisition: %v, %v; want refused", c.what, c.call.Val, c.call.Err)
				}
				if got := expiry(); got != before {
					t.Errorf("%s by the released acquisition moved the hold's expiry from %s to %s", c.what, before, got)
				}
			}
			if l, err := take(e.newClient(t)); !errors.Is(err, dlock.ErrNotObtained) {
				if l != nil {
					_ = l.Release(ctx)
				}
				t.Fatalf("another client: err = %v, want ErrNotObtained while the re-entry holds", err)
			}
			if _, err := second.TTL(ctx); err != nil {
				t.Fatalf("the re-entry's TTL: %v", err)
			}
			if err := second.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A Lock attached to a re-entered hold stands for the acquisition that made
// it: once that one was released, with later acquisitions keeping the hold,
// neither its token nor its owner attaches a Lock that could then not act.
func TestAttachToAHoldWhoseFirstAcquisitionWasReleasedIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	own := dlock.WithOwner("job")
	first, err := e.c.TryLock(ctx, "kept", own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	second, err := e.c.TryLock(ctx, "kept", own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c := e.newClient(t)
	if _, err := c.Attach(ctx, "kept", first.Token()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Attach by the token: err = %v, want ErrNotHeld", err)
	}
	if _, err := c.Attach(ctx, "kept", "unknown", own); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Attach by the owner: err = %v, want ErrNotHeld", err)
	}
	e.expectHeld(t, "kept", second)
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A Lock attached to a held lock, or one that acquired it again with its
// token, shares it with the Lock it came from: a refresh by either only
// extends it from then on, so that neither cuts the other's TTL short (a
// command run under `dlock run` attaching with DLOCK_TOKEN, say). A new
// hold of the name is not shared.
func TestASharedHoldIsOnlyExtended(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, how := range []string{"attached", "acquired again with its token"} {
		t.Run(how, func(t *testing.T) {
			name := "shared-" + strings.ReplaceAll(how, " ", "-")
			first, err := e.c.TryLock(ctx, name, dlock.WithToken("tok-"+name), dlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			var second *dlock.Lock
			if how == "attached" {
				second, err = e.newClient(t).Attach(ctx, name, first.Token(), dlock.WithTTL(time.Second))
			} else {
				second, err = e.newClient(t).TryLock(ctx, name, dlock.WithToken(first.Token()), dlock.WithTTL(time.Second))
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := second.Refresh(ctx, time.Second); err != nil {
				t.Fatal(err)
			}
			if left := e.pttl(t, name); left < 50*time.Second {
				t.Fatalf("TTL after the second Lock's 1s refresh: %v, want the first's minute", left)
			}
			if err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
			// A new hold of the name may be shortened by its holder.
			l, err := e.c.TryLock(ctx, name, dlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Refresh(ctx, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if left := e.pttl(t, name); left > 5*time.Second {
				t.Errorf("TTL of a new hold after its 5s refresh: %v", left)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Attach by owner to several names finds one hold of the owner on each:
// held with different tokens (separate acquisitions), no one Lock stands
// for them, and Attach refuses.
func TestAttachMultiByOwnerToSeparateHoldsIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	own := dlock.WithOwner("job")
	for _, name := range []string{"{pair}a", "{pair}b"} {
		if _, err := e.c.TryLock(ctx, name, own, dlock.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.newClient(t).AttachMulti(ctx, []string{"{pair}a", "{pair}b"}, "unknown", own); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("AttachMulti by owner over two holds: err = %v, want ErrNotHeld", err)
	}
}

// An owner's lock on several names that re-entered one and took the other
// anew holds the new one with the joined hold's token, by an acquisition
// of its own: Attach with that token, or by owner, does not find it (see
// Lock.Token), and the lock itself still releases both.
func TestTheNamesAPartialReentryTookAnewCannotBeAttached(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	own := dlock.WithOwner("O")
	o, err := e.c.TryLock(ctx, "{part}1", own)
	if err != nil {
		t.Fatal(err)
	}
	l, err := e.c.TryLockMulti(ctx, []string{"{part}1", "{part}2"}, own)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() != o.Token() {
		t.Errorf("token %q, want the joined hold's %q", l.Token(), o.Token())
	}
	other := e.newClient(t)
	if _, err := other.Attach(ctx, "{part}2", l.Token()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Attach to the name taken anew: err = %v, want ErrNotHeld", err)
	}
	if _, err := other.Attach(ctx, "{part}2", "any", own); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Attach by owner to the name taken anew: err = %v, want ErrNotHeld", err)
	}
	for _, x := range []*dlock.Lock{l, o} {
		if err := x.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"{part}1", "{part}2"} {
		if e.locked(t, e.c.RedisKey(name)) {
			t.Errorf("%s still held after both releases", name)
		}
	}
}

// TestAnOwnersLockOnSeveralNamesReentersHoldsOfDifferentTokens: an owner
// holds two names by two acquisitions, so with two tokens, then takes a
// lock on both. That lock can be refreshed and released on each name, and
// once every acquisition is released both names are free.
func TestAnOwnersLockOnSeveralNamesReentersHoldsOfDifferentTokens(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	own := dlock.WithOwner("w1")
	var single []*dlock.Lock
	for _, name := range []string{"two-a", "two-b"} {
		l, err := e.c.TryLock(ctx, name, own, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		single = append(single, l)
	}
	m, err := e.c.TryLockMulti(ctx, []string{"two-a", "two-b"}, own, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TTL(ctx); err != nil {
		t.Errorf("TTL of the lock on both names: %v", err)
	}
	if err := m.Refresh(ctx, 2*time.Minute); err != nil {
		t.Errorf("Refresh of the lock on both names: %v", err)
	}
	for _, l := range single {
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release of one name's acquisition: %v", err)
		}
	}
	other := e.newClient(t)
	if _, err := other.TryLock(ctx, "two-a"); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("another client's TryLock while the lock on both names is held: %v, want ErrNotObtained", err)
	}
	if err := m.Release(ctx); err != nil {
		t.Errorf("Release of the lock on both names: %v", err)
	}
	for _, name := range []string{"two-a", "two-b"} {
		l, err := other.TryLock(ctx, name)
		if err != nil {
			t.Fatalf("%s after every acquisition was released: %v", name, err)
		}
		_ = l.Release(ctx)
	}
}

// loseOwnersAcquire runs every call, but loses the reply of the first
// acquire (of any kind) that carries owner id owner, and then closes lost.
type loseOwnersAcquire struct {
	dlock.Driver
	owner string
	done  atomic.Bool
	lost  chan struct{}
}

func (d *loseOwnersAcquire) Eval(ctx context.Context, calls ...*dlock.Call) {
	d.Driver.Eval(ctx, calls...)
	for _, c := range calls {
		if strings.HasSuffix(c.Script.Name, "acquire") && len(c.Args) > 3 && c.Args[3] == d.owner && d.done.CompareAndSwap(false, true) {
			c.Val, c.Err = nil, errLostReply
			close(d.lost)
		}
	}
}

// An owner's re-entry goes ahead of the callers of its client that wait
// for the name (the owner holds it). When its reply is lost, the re-entry
// may hold the name: the next attempt goes ahead as well, and finds it.
// It waited in line behind those callers instead, who waited for the hold
// that it had: nobody got the name until one of them gave up.
func TestALostReentryTriesAgainAheadOfItsClientsWaiters(t *testing.T) {
	for _, kind := range []string{"lock", "write", "fair write", "read", "permit"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			d := &loseOwnersAcquire{Driver: e.newDriver(t), owner: "O", lost: make(chan struct{})}
			c := dlock.New(d)
			defer c.Close()
			// take obtains the name for an owner's hold (S's kind), wait
			// for a caller that waits for it (X's: a writer for a read).
			take := func(c *dlock.Client, ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
				switch kind {
				case "lock":
					return c.Lock(ctx, "n", opts...)
				case "write":
					return c.RWMutex("n").Lock(ctx, opts...)
				case "fair write":
					return c.RWMutex("n", dlock.Fair()).Lock(ctx, opts...)
				case "read":
					return c.RWMutex("n").RLock(ctx, opts...)
				}
				return c.Semaphore("n", 1).Acquire(ctx, opts...)
			}
			wait := take
			if kind == "read" {
				wait = func(c *dlock.Client, ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
					return c.RWMutex("n").Lock(ctx, opts...)
				}
			}
			owner := dlock.WithOwner("O")
			first, err := take(e.newClient(t), ctx, owner) // another process
			if err != nil {
				t.Fatal(err)
			}
			// X, a caller of c, waits for the name.
			xctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			xDone := make(chan error, 1)
			go func() {
				l, err := wait(c, xctx)
				if err == nil {
					err = l.Release(ctx)
				}
				xDone <- err
			}()
			awaitCond(t, 5*time.Second, func() bool {
				return e.srv.Do(t, "ZSCORE", "dlock:{n}:waiters", dlock.Member(c)) != "(nil)"
			})
			// S, the owner's re-entry through c, whose reply is lost.
			sDone := make(chan error, 1)
			go func() {
				l, err := take(c, xctx, owner)
				if err == nil {
					err = l.Release(ctx)
				}
				sDone <- err
			}()
			<-d.lost
			if err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-sDone; err != nil {
				t.Errorf("the re-entry whose reply was lost: %v", err)
			}
			if err := <-xDone; err != nil {
				t.Errorf("the caller that waited for the name: %v", err)
			}
		})
	}
}
