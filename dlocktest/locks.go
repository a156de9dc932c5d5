package dlocktest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

var lockTests = []test{
	{name: "TryLockAndRelease", run: testTryLockAndRelease},
	{name: "Multi", run: testMulti},
	{name: "MultiAcrossSlots", run: testMultiAcrossSlots},
	{name: "WrongType", run: testWrongType},
	{name: "WokenByRelease", run: testWokenByRelease},
	{name: "TakesOverAtExpiry", run: testTakesOverAtExpiry},
	{name: "AutoRefreshAndLoss", run: testAutoRefreshAndLoss},
	{name: "Do", run: testDo},
	{name: "InspectListForceRelease", run: testInspectListForceRelease},
	{name: "SetFenced", run: testSetFenced},
	{name: "EndedContext", run: testLockEndedContext},
	{name: "SharedHolds", run: testSharedHolds},
	{name: "Partitioned", run: testPartitioned},
	{name: "PartitionedRefreshes", run: testPartitionedRefreshes, only: onCluster},
}

func testTryLockAndRelease(t *testing.T, e *env) {
	ctx := timeout(t)
	a, b := e.client(t), e.client(t)
	l, err := a.TryLock(ctx, "job", dlock.WithTTL(10*time.Second), dlock.WithMetadata("host=a"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() == "" || l.Fence() == 0 || l.Metadata() != "host=a" {
		t.Errorf("token %q, fence %d, metadata %q", l.Token(), l.Fence(), l.Metadata())
	}
	if _, err := b.TryLock(ctx, "job"); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock of a held lock: err = %v, want ErrNotObtained", err)
	}
	checkTTL(t, l, 10*time.Second)
	if err := l.Refresh(ctx, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	checkTTL(t, l, 20*time.Second)
	heir, err := b.Attach(ctx, "job", l.Token())
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if heir.Metadata() != "host=a" {
		t.Errorf("attached lock's metadata %q", heir.Metadata())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
		if l.Err() != nil {
			t.Errorf("Err after Release = %v", l.Err())
		}
	default:
		t.Error("Done not closed by Release")
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("second Release: err = %v, want ErrNotHeld", err)
	}
	if err := heir.Refresh(ctx, time.Second); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh of a released lock: err = %v, want ErrNotHeld", err)
	}
	if _, err := heir.TTL(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("TTL of a released lock: err = %v, want ErrNotHeld", err)
	}
	key := a.RedisKey("job")
	// A released lock keeps its hash for a while, with an empty token.
	if got := e.do(t, key, "HGET", key, "token"); got != "" && got != "(nil)" {
		t.Error("lock left held by Release")
	}
	next, err := b.TryLock(ctx, "job")
	if err != nil {
		t.Fatalf("TryLock after Release: %v", err)
	}
	if next.Fence() <= l.Fence() {
		t.Errorf("fence %d after %d", next.Fence(), l.Fence())
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkTTL fails t unless the server gives l between ttl-1s and ttl.
func checkTTL(t *testing.T, l *dlock.Lock, ttl time.Duration) {
	t.Helper()
	left, err := l.TTL(timeout(t))
	if err != nil {
		t.Fatal(err)
	}
	if left > ttl || left < ttl-time.Second {
		t.Errorf("TTL = %v, want just under %v", left, ttl)
	}
}

// testMulti locks names that share a hash tag, as they must on a cluster.
func testMulti(t *testing.T, e *env) {
	ctx := timeout(t)
	a, b := e.client(t), e.client(t)
	names := []string{"{acct}:1", "{acct}:2"}
	l, err := a.TryLockMulti(ctx, names, dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if f := l.Fences(); len(f) != 2 || f[0] == 0 || f[1] == 0 {
		t.Errorf("fences %v", f)
	}
	if _, err := b.TryLock(ctx, "{acct}:2"); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("TryLock of one of the names: err = %v, want ErrNotObtained", err)
	}
	if _, err := b.TryLockMulti(ctx, []string{"{acct}:3", "{acct}:1"}); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("TryLockMulti over a held name: err = %v, want ErrNotObtained", err)
	}
	// All or nothing: the free name was not taken.
	third, err := b.TryLock(ctx, "{acct}:3")
	if err != nil {
		t.Fatalf("the free name of a refused TryLockMulti: %v", err)
	}
	if err := third.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	checkTTL(t, l, 20*time.Second)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := b.TryLockMulti(ctx, names)
	if err != nil {
		t.Fatalf("TryLockMulti after Release: %v", err)
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// testMultiAcrossSlots locks names in different hash slots (on a cluster,
// on different primaries): all or nothing on every topology, atomically
// where one server holds them all, slot by slot on a cluster.
func testMultiAcrossSlots(t *testing.T, e *env) {
	ctx := timeout(t)
	a, b := e.client(t), e.client(t)
	names := []string{"x", "y", "z"}
	if onCluster(e) {
		for i, p := range e.primaries {
			names[i] = e.tagOn(t, p)
		}
	}
	blocker, err := b.TryLock(ctx, names[1])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.TryLockMulti(ctx, names); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLockMulti over a held name: err = %v, want ErrNotObtained", err)
	}
	checkFree(t, b, names[0], names[2])
	if err := blocker.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := a.TryLockMulti(ctx, names, dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if f := l.Fences(); len(f) != 3 || slices.Contains(f, 0) {
		t.Errorf("fences %v", f)
	}
	for _, name := range names {
		if _, err := b.TryLock(ctx, name); !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("TryLock(%q) of a held name: err = %v, want ErrNotObtained", name, err)
		}
	}
	if err := l.Refresh(ctx, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	checkTTL(t, l, 20*time.Second)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkFree(t, b, names...)
}

// checkFree fails t unless every one of names is free.
func checkFree(t *testing.T, c *dlock.Client, names ...string) {
	t.Helper()
	for _, name := range names {
		if info, err := c.Inspect(timeout(t), name); err != nil || info.Kind != dlock.KindNone {
			t.Errorf("%q: %+v, %v; want it free", name, info, err)
		}
	}
}

// testWrongType: a key that holds data dlock did not write is refused and
// left alone by every operation.
func testWrongType(t *testing.T, e *env) {
	ctx := timeout(t)
	c := e.client(t)
	data := "{w}:data"
	key := c.RedisKey(data)
	e.do(t, key, "SET", key, "precious")
	if _, err := c.TryLock(ctx, data); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("TryLock: err = %v, want ErrWrongType", err)
	}
	_, err := c.TryLockMulti(ctx, []string{"{w}:free", data})
	if !errors.Is(err, dlock.ErrWrongType) || !strings.Contains(err.Error(), data) {
		t.Errorf("TryLockMulti: err = %v, want ErrWrongType naming %q", err, data)
	}
	if info, err := c.Inspect(ctx, "{w}:free"); err != nil || info.Kind != dlock.KindNone {
		t.Errorf("the other name of a refused TryLockMulti: %+v, %v", info, err)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := c.Lock(short, data); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("Lock: err = %v, want ErrWrongType at once", err)
	}
	if _, err := c.Inspect(ctx, data); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("Inspect: err = %v, want ErrWrongType", err)
	}
	if _, err := c.ForceRelease(ctx, data); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("ForceRelease: err = %v, want ErrWrongType", err)
	}
	if err := c.SetFenced(ctx, key, 1, "v"); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("SetFenced: err = %v, want ErrWrongType", err)
	}
	if got := e.do(t, key, "GET", key); got != "precious" {
		t.Errorf("the data became %q", got)
	}
}

// testWokenByRelease: the holder keeps its lock for a minute and the
// waiter's retry strategy would not try again for an hour; the waiter's
// context ends before dlock's periodic wake, so only the notice that the
// release publishes can let it in.
func testWokenByRelease(t *testing.T, e *env) {
	sub, err := e.driver(t).Subscribe(timeout(t), func(string, string) {})
	if errors.Is(err, dlock.ErrUnsupported) {
		t.Skip("the driver cannot subscribe: waiters are not woken")
	}
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	_ = sub.Close()
	wokenByRelease(t, e.client(t), e.client(t), "wake", nil)
}

// wokenByRelease has holder take the lock called name and waiter wait for
// it, with no retry before an hour, and fails t unless the release of the
// holder's lock lets the waiter in within 0.8 of dlock's periodic wake:
// only a notice can have woken it. registered, if not nil, runs once the
// waiter was refused, before the release.
func wokenByRelease(t *testing.T, holder, waiter *dlock.Client, name string, registered func()) {
	t.Helper()
	ctx := timeout(t)
	held, err := holder.TryLock(ctx, name, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		// The wait ends 0.8 of the beat after its last refusal (the
		// first may come late on a loaded machine: a new client dials).
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		end := time.AfterFunc(time.Hour, cancel)
		defer end.Stop()
		var once sync.Once
		l, err := waiter.Lock(wctx, name, dlock.WithRetry(dlock.ConstantBackoff(time.Hour)),
			dlock.WithOnRetry(func(int, error) {
				end.Reset(wakeBeat * 8 / 10)
				once.Do(func() { close(refused) })
			}))
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	receive(t, refused, "first refused attempt of the waiter")
	if registered != nil {
		registered()
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, got, "end of the waiter"); err != nil {
		t.Fatalf("waiter not woken by the release: %v", err)
	}
}

// testTakesOverAtExpiry: a holder that never releases; the waiter gets in
// when its lock expires, not at its retry strategy's hour.
func testTakesOverAtExpiry(t *testing.T, e *env) {
	ctx := timeout(t)
	holder, waiter := e.client(t), e.client(t)
	if _, err := holder.TryLock(ctx, "crashed", dlock.WithTTL(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	l, err := waiter.Lock(ctx, "crashed", dlock.WithRetry(dlock.ConstantBackoff(time.Hour)))
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// testAutoRefreshAndLoss: an auto-refreshed lock outlives its TTL many
// times over; deleted on the server, its holder learns of the loss.
func testAutoRefreshAndLoss(t *testing.T, e *env) {
	ctx := timeout(t)
	c := e.client(t)
	const ttl = 500 * time.Millisecond
	l, err := c.TryLock(ctx, "lease", dlock.WithTTL(ttl), dlock.WithRefreshInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
		t.Fatalf("lost while refreshed: %v", l.Err())
	case <-time.After(3 * ttl):
	}
	if _, err := l.TTL(ctx); err != nil {
		t.Fatalf("TTL after %v: %v", 3*ttl, err)
	}
	key := c.RedisKey("lease")
	e.do(t, key, "DEL", key)
	receive(t, l.Done(), "close of Done after the lock was deleted")
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost", l.Err())
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release of a lost lock: err = %v, want ErrNotHeld", err)
	}
}

func testDo(t *testing.T, e *env) {
	ctx := timeout(t)
	c, other := e.client(t), e.client(t)
	ran := false
	err := c.Do(ctx, "report", func(ctx context.Context) error {
		ran = true
		if _, err := other.TryLock(ctx, "report"); !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("TryLock while Do runs: err = %v, want ErrNotObtained", err)
		}
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("Do: ran %v, err %v", ran, err)
	}
	l, err := other.TryLock(ctx, "report")
	if err != nil {
		t.Fatalf("TryLock after Do: %v", err)
	}
	_ = l.Release(ctx)
}

func testInspectListForceRelease(t *testing.T, e *env) {
	ctx := timeout(t)
	c := e.client(t)
	adminDriver := e.driver(t)
	_, scans := adminDriver.(dlock.Scanner)
	admin := dlock.New(adminDriver, dlock.WithPrefix(prefix(t)))
	defer admin.Close()
	l, err := c.TryLock(ctx, "report", dlock.WithTTL(time.Minute), dlock.WithMetadata("host=a"),
		dlock.WithOwner("job-1"), dlock.WithRefreshInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	info, err := admin.Inspect(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if info.Kind != dlock.KindLock || info.Name != "report" || len(info.Holders) != 1 || info.Fence != l.Fence() {
		t.Fatalf("Inspect = %+v", info)
	}
	if h := info.Holders[0]; h.Owner != "job-1" || h.Metadata != "host=a" || h.Count != 1 ||
		h.TTL < 50*time.Second || h.Fence != l.Fence() {
		t.Errorf("holder = %+v", h)
	}
	// Names in different slots: on a cluster, on different primaries.
	for _, name := range []string{"jobs:a", "jobs:b", "jobs:c", "jobs:d"} {
		if _, err := c.TryLock(ctx, name, dlock.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	for pattern, want := range map[string][]string{
		"jobs:*": {"jobs:a", "jobs:b", "jobs:c", "jobs:d"},
		"":       {"jobs:a", "jobs:b", "jobs:c", "jobs:d", "report"},
		"none*":  nil,
	} {
		infos, err := admin.List(ctx, pattern)
		if !scans {
			if !errors.Is(err, dlock.ErrUnsupported) {
				t.Errorf("List with a driver that cannot SCAN: err = %v, want ErrUnsupported", err)
			}
			break
		}
		if err != nil {
			t.Fatalf("List(%q): %v", pattern, err)
		}
		var got []string
		for _, info := range infos {
			got = append(got, info.Name)
		}
		if !slices.Equal(got, want) {
			t.Errorf("List(%q) = %v, want %v", pattern, got, want)
		}
	}
	was, err := admin.ForceRelease(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if was.Kind != dlock.KindLock || len(was.Holders) != 1 || was.Holders[0].Metadata != "host=a" {
		t.Errorf("ForceRelease removed %+v", was)
	}
	receive(t, l.Done(), "close of the holder's Done after ForceRelease")
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("holder's Err = %v, want ErrLost", l.Err())
	}
	if info, err := admin.Inspect(ctx, "report"); err != nil || info.Kind != dlock.KindNone {
		t.Errorf("Inspect after ForceRelease = %+v, %v", info, err)
	}
}

func testSetFenced(t *testing.T, e *env) {
	ctx := timeout(t)
	c := e.client(t)
	first, err := c.TryLock(ctx, "fenced")
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := c.TryLock(ctx, "fenced")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(ctx)
	if second.Fence() <= first.Fence() {
		t.Fatalf("fence %d after %d", second.Fence(), first.Fence())
	}
	key := prefix(t) + "resource"
	if err := c.SetFenced(ctx, key, second.Fence(), "new"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetFenced(ctx, key, first.Fence(), "stale"); !errors.Is(err, dlock.ErrStaleFence) {
		t.Errorf("SetFenced with an older fence: err = %v, want ErrStaleFence", err)
	}
	if err := c.SetFenced(ctx, key, second.Fence(), "same"); err != nil {
		t.Errorf("SetFenced with the same fence: %v", err)
	}
	if got := e.do(t, key, "HGET", key, "value"); got != "same" {
		t.Errorf("value = %q", got)
	}
}

// testLockEndedContext: an ended context fails an acquisition with the
// context's error, not as a refusal, and the name stays free.
func testLockEndedContext(t *testing.T, e *env) {
	c := e.client(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.TryLock(ctx, "ended")
	if !errors.Is(err, context.Canceled) || errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("TryLock on a cancelled context: err = %v, want one matching context.Canceled, not ErrNotObtained", err)
	}
	l, err := c.TryLock(timeout(t), "ended")
	if err != nil {
		t.Fatalf("TryLock after: %v", err)
	}
	_ = l.Release(timeout(t))
}

// testSharedHolds runs the read/write lock and the semaphore, whose scripts
// keep several keys per name: readers share, a waiting writer is woken when
// the last leaves, a waiting permit when one is freed, and Inspect and
// ForceRelease read and remove every key. With a driver that can
// subscribe, the waiters must be woken by notices, well before their beat;
// one that cannot (ErrUnsupported) has them poll every 50ms.
func testSharedHolds(t *testing.T, e *env) {
	ctx := timeout(t)
	limit, retry := 10*time.Second, dlock.ConstantBackoff(50*time.Millisecond)
	if sub, err := e.driver(t).Subscribe(ctx, func(string, string) {}); err == nil {
		_ = sub.Close()
		limit, retry = wakeBeat*8/10, dlock.ConstantBackoff(time.Hour)
	}
	a, b, c := e.client(t), e.client(t), e.client(t)
	// waitFor obtains a hold on a goroutine, reporting its first refused
	// attempt, and releases it.
	waitFor := func(acquire func(context.Context, ...dlock.Option) (*dlock.Lock, error)) (refused <-chan struct{}, got <-chan error) {
		ref, res := make(chan struct{}), make(chan error, 1)
		go func() {
			// The wait ends limit after its last refusal.
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			end := time.AfterFunc(time.Hour, cancel)
			defer end.Stop()
			var once sync.Once
			l, err := acquire(wctx, dlock.WithRetry(retry),
				dlock.WithOnRetry(func(int, error) {
					end.Reset(limit)
					once.Do(func() { close(ref) })
				}))
			if err == nil && l.Fence() == 0 && l.Mode() == dlock.ModeWrite {
				err = errors.New("a write hold without a fence")
			}
			if err == nil {
				err = l.Release(ctx)
			}
			res <- err
		}()
		return ref, res
	}

	r1, err := a.RWMutex("doc").TryRLock(ctx, dlock.WithTTL(time.Minute), dlock.WithMetadata("reader a"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.RWMutex("doc").TryRLock(ctx, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("second reader: %v", err)
	}
	refused, got := waitFor(c.RWMutex("doc").Lock)
	receive(t, refused, "first refused attempt of the writer")
	info, err := a.Inspect(ctx, "doc")
	if err != nil || info.Kind != dlock.KindRWMutex || len(info.Holders) != 2 || !info.WriterWaiting {
		t.Errorf("Inspect = %+v, %v", info, err)
	}
	for _, r := range []*dlock.Lock{r1, r2} {
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := receive(t, got, "end of the writer"); err != nil {
		t.Fatalf("writer not woken when the readers left: %v", err)
	}

	p, err := a.Semaphore("pool", 1).TryAcquire(ctx, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	refused, got = waitFor(b.Semaphore("pool", 1).Acquire)
	receive(t, refused, "first refused attempt of the permit's waiter")
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, got, "end of the permit's waiter"); err != nil {
		t.Fatalf("permit's waiter not woken by the release: %v", err)
	}

	r, err := a.RWMutex("doc").TryRLock(ctx, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if was, err := b.ForceRelease(ctx, "doc"); err != nil || len(was.Holders) != 1 {
		t.Fatalf("ForceRelease = %+v, %v", was, err)
	}
	if err := r.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh after a force release: err = %v, want ErrNotHeld", err)
	}
	key := a.RedisKey("doc")
	for _, k := range []string{key, key + ":holds", key + ":pending"} {
		if got := e.do(t, key, "EXISTS", k); got != "0" {
			t.Errorf("%s left behind", k)
		}
	}
}
