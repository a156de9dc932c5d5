package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

func TestRWMutexReadersShareAWriterExcludes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m := e.c.RWMutex("doc")
	other := e.newClient(t).RWMutex("doc")
	r1, err := m.TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := other.TryRLock(ctx)
	if err != nil {
		t.Fatalf("second reader: %v", err)
	}
	if r1.Mode() != dlock.ModeRead || r1.Fence() != 0 || r1.Token() == r2.Token() || r1.Name() != "doc" {
		t.Errorf("read hold: mode %q fence %d key %q", r1.Mode(), r1.Fence(), r1.Name())
	}
	if _, err := other.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("writer with readers in: err = %v, want ErrNotObtained", err)
	}
	for _, r := range []*dlock.Lock{r1, r2} {
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := other.TryLock(ctx)
	if err != nil {
		t.Fatalf("writer after the readers left: %v", err)
	}
	if w.Mode() != dlock.ModeWrite || w.Fence() == 0 {
		t.Errorf("write hold: mode %q fence %d", w.Mode(), w.Fence())
	}
	if _, err := m.TryRLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("reader with a writer in: err = %v", err)
	}
	if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("second writer: err = %v", err)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w2, err := m.TryLock(ctx)
	if err != nil || w2.Fence() <= w.Fence() {
		t.Fatalf("next writer: %v, fence %d after %d", err, w2.Fence(), w.Fence())
	}
	if err := w2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The release marker stays for a minute (a repeated release finds it).
	if keys := e.srv.Do(t, "KEYS", "*"); strings.TrimSpace(strings.ReplaceAll(keys, "dlock:{doc}:released", "")) != "dlock:{doc}:fence" {
		t.Errorf("keys left after the last release: %q, want only the fence counter and the release marker", keys)
	}
}

// TestUncontendedHoldsCostTwoRoundTrips: a read hold, a write hold and a
// permit each cost one round trip to obtain and one to release, and the
// scripts stay lean on the server.
func TestUncontendedHoldsCostTwoRoundTrips(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		acquire  func() (*dlock.Lock, error)
		commands int // redis.calls of both scripts, at most (up to 6 of them keep the release marker and its bound, 2 read it)
	}{
		{"read", func() (*dlock.Lock, error) { return e.c.RWMutex("rw").TryRLock(ctx) }, 27},
		{"write", func() (*dlock.Lock, error) { return e.c.RWMutex("rw").TryLock(ctx) }, 27},
		{"write waiting", func() (*dlock.Lock, error) { return e.c.RWMutex("rw").Lock(ctx) }, 27},
		{"fair read", func() (*dlock.Lock, error) { return e.c.RWMutex("fair", dlock.Fair()).TryRLock(ctx) }, 27},
		{"permit", func() (*dlock.Lock, error) { return e.c.Semaphore("sem", 2).TryAcquire(ctx) }, 27},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Once on a free name, once beside another holder.
			for _, beside := range []bool{false, true} {
				var other *dlock.Lock
				if beside && tc.name != "write" && tc.name != "write waiting" {
					var err error
					if other, err = tc.acquire(); err != nil {
						t.Fatal(err)
					}
				}
				e.srv.Do(t, "CONFIG", "RESETSTAT")
				before := e.drv.trips.Load()
				l, err := tc.acquire()
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
				if n := e.drv.trips.Load() - before; n != 2 {
					t.Errorf("round trips = %d, want 2", n)
				}
				if n := scriptCommands(t, e.srv.Do(t, "INFO", "commandstats")); n > tc.commands {
					t.Errorf("the scripts ran %d commands, want at most %d", n, tc.commands)
				} else {
					t.Logf("beside another holder %v: %d commands", beside, n)
				}
				if other != nil {
					_ = other.Release(ctx)
				}
			}
		})
	}
}

// scriptCommands counts the commands of INFO commandstats that scripts ran:
// all but EVAL, EVALSHA, the INFO and CONFIG of the test, and those that
// open a connection for notices.
func scriptCommands(t *testing.T, stats string) int {
	n := 0
	for _, m := range regexp.MustCompile(`cmdstat_(\w+):calls=(\d+)`).FindAllStringSubmatch(stats, -1) {
		switch m[1] {
		case "eval", "evalsha", "info", "config", "hello", "subscribe", "ping", "client", "select":
		default:
			c, _ := strconv.Atoi(m[2])
			n += c
		}
	}
	return n
}

// TestRWMutexUnderContention has 16 workers, each with its own client,
// take the lock 12 times each, one time in four as a writer. Detectors
// count who is inside: a writer must be alone, and fences must grow from
// writer to writer. The waiters poll every few milliseconds: in a fair
// lock every hand-over waits for the next waiter's next attempt.
func TestRWMutexUnderContention(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			const workers, rounds = 16, 12
			retry := dlock.WithRetry(dlock.Jitter(dlock.ExponentialBackoff(time.Millisecond, 8*time.Millisecond), 0.5))
			var readers, writers, mostReaders atomic.Int32
			var mu sync.Mutex
			var fences []uint64
			var wg sync.WaitGroup
			for i := range workers {
				m := e.newClient(t).RWMutex("contended")
				if fair {
					m = e.newClient(t).RWMutex("contended", dlock.Fair())
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := range rounds {
						write := (i+j)%4 == 0
						var l *dlock.Lock
						var err error
						if write {
							l, err = m.Lock(ctx, dlock.WithTTL(5*time.Second), retry)
						} else {
							l, err = m.RLock(ctx, dlock.WithTTL(5*time.Second), retry)
						}
						if err != nil {
							t.Error(err)
							return
						}
						if write {
							if writers.Add(1) != 1 || readers.Load() != 0 {
								t.Errorf("a writer is in with %d writers and %d readers", writers.Load(), readers.Load())
							}
							mu.Lock()
							fences = append(fences, l.Fence())
							mu.Unlock()
							time.Sleep(100 * time.Microsecond)
							writers.Add(-1)
						} else {
							n := readers.Add(1)
							if writers.Load() != 0 {
								t.Errorf("a reader is in with a writer")
							}
							for most := mostReaders.Load(); n > most && !mostReaders.CompareAndSwap(most, n); most = mostReaders.Load() {
							}
							time.Sleep(100 * time.Microsecond)
							readers.Add(-1)
						}
						if err := l.Release(ctx); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if len(fences) != workers*rounds/4 {
				t.Errorf("%d writes, want %d", len(fences), workers*rounds/4)
			}
			for i := 1; i < len(fences); i++ {
				if fences[i] <= fences[i-1] {
					t.Errorf("write %d: fence %d after %d", i, fences[i], fences[i-1])
				}
			}
			t.Logf("at most %d readers at once", mostReaders.Load())
		})
	}
}

// TestRWMutexWriterGetsInWhileReadersKeepArriving: four readers take turns
// so that the lock is never free of readers; a writer that waits still
// gets in, because no new reader enters once it waits.
func TestRWMutexWriterGetsInWhileReadersKeepArriving(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var readers atomic.Int32
	stop := make(chan struct{})
	reading := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for range 4 {
		m := e.newClient(t).RWMutex("busy")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := m.RLock(ctx, dlock.WithRetry(dlock.ConstantBackoff(time.Millisecond)))
				if err != nil {
					t.Error(err)
					return
				}
				readers.Add(1)
				once.Do(func() { close(reading) })
				time.Sleep(3 * time.Millisecond)
				readers.Add(-1)
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	defer wg.Wait()
	defer close(stop)
	<-reading
	// One reader holds on until the writer has waited: the writer cannot
	// get in at once between two of the others' holds.
	first, err := e.newClient(t).RWMutex("busy").RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	var checked sync.Once
	w, err := e.c.RWMutex("busy").Lock(ctx, dlock.WithRetry(dlock.ConstantBackoff(time.Millisecond)),
		dlock.WithOnRetry(func(int, error) {
			checked.Do(func() {
				close(waiting)
				if _, err := e.newClient(t).RWMutex("busy").TryRLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
					t.Errorf("a new reader got in while a writer waits: err = %v", err)
				}
				info, err := e.c.Inspect(ctx, "busy")
				if err != nil || !info.WriterWaiting || info.Waiters != 1 {
					t.Errorf("Inspect while a writer waits = %+v, %v", info, err)
				}
				if err := first.Release(ctx); err != nil {
					t.Error(err)
				}
			})
		}))
	if err != nil {
		t.Fatalf("writer: %v", err)
	}
	select {
	case <-waiting:
	default:
		t.Error("the writer got in at once: the readers did not keep the lock")
	}
	if n := readers.Load(); n != 0 {
		t.Errorf("writer in with %d readers", n)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// frozenWaiter starts m.Lock on a goroutine; after its first refused
// attempt it stops, as a paused or dead process would, until the returned
// function is called, which makes it give up and waits for it to return.
func frozenWaiter(t *testing.T, m *dlock.RWMutex, write bool, opts ...dlock.Option) (recorded <-chan struct{}, giveUp func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rec, thaw, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	opts = append(opts, dlock.WithOnRetry(func(int, error) {
		once.Do(func() { close(rec) })
		<-thaw
	}))
	go func() {
		defer close(done)
		var l *dlock.Lock
		var err error
		if write {
			l, err = m.Lock(ctx, opts...)
		} else {
			l, err = m.RLock(ctx, opts...)
		}
		if err == nil {
			_ = l.Release(context.Background())
		}
	}()
	return rec, func() {
		cancel()
		close(thaw)
		<-done
	}
}

func TestRWMutexWaitingWriterThatDiesStopsBlockingReaders(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := e.c.RWMutex("paused")
	r0, err := m.TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recorded, giveUp := frozenWaiter(t, e.newClient(t).RWMutex("paused"), true, dlock.WithTTL(time.Second))
	defer giveUp()
	<-recorded
	if _, err := m.TryRLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("reader while a writer waits: err = %v", err)
	}
	// The writer's record expires with its TTL; a retry interval far longer
	// than the context proves the reader woke at that moment.
	r1, err := e.newClient(t).RWMutex("paused").RLock(ctx, dlock.WithRetry(dlock.ConstantBackoff(time.Hour)))
	if err != nil {
		t.Fatalf("reader after the writer's record expired: %v", err)
	}
	if info, err := e.c.Inspect(ctx, "paused"); err != nil || info.WriterWaiting || info.Waiters != 0 || len(info.Holders) != 2 {
		t.Errorf("Inspect = %+v, %v", info, err)
	}
	_ = r1.Release(ctx)
	_ = r0.Release(ctx)
}

func TestRWMutexCrashedReaderExpiresOnItsOwn(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := e.c.RWMutex("shared")
	kept, err := m.TryRLock(ctx, dlock.WithTTL(time.Second), dlock.WithRefreshInterval(50*time.Millisecond),
		dlock.WithMetadata("kept"))
	if err != nil {
		t.Fatal(err)
	}
	// The other reader crashes: it never refreshes or releases.
	if _, err := e.newClient(t).RWMutex("shared").TryRLock(ctx, dlock.WithTTL(100*time.Millisecond), dlock.WithMetadata("crashed")); err != nil {
		t.Fatal(err)
	}
	// There is no notice of an expiry to wait for: look until it shows.
	for {
		info, err := e.c.Inspect(ctx, "shared")
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Holders) == 1 {
			if info.Holders[0].Metadata != "kept" {
				t.Fatalf("holders = %+v, want the refreshed reader", info.Holders)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the crashed reader lingers: %+v", info.Holders)
		}
		time.Sleep(10 * time.Millisecond)
	}
	w := e.newClient(t).RWMutex("shared")
	if _, err := w.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("writer while the refreshed reader holds: err = %v", err)
	}
	if err := kept.Release(ctx); err != nil {
		t.Fatalf("the refreshed reader lost its hold: %v", err)
	}
	l, err := w.TryLock(ctx)
	if err != nil {
		t.Fatalf("writer after the last live reader left: %v", err)
	}
	_ = l.Release(ctx)
}

// TestFairRWMutexServesInArrivalOrder queues R1 W2 R3 R4 W5 behind a
// writer: R1 goes first, W2 after it, R3 and R4 together (each waits inside
// until the other is in), W5 last.
func TestFairRWMutexServesInArrivalOrder(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m := e.c.RWMutex("queue", dlock.Fair())
	w0, err := m.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []string
	record := func(s string) {
		mu.Lock()
		events = append(events, s)
		mu.Unlock()
	}
	var pair sync.WaitGroup // R3 and R4 both in
	pair.Add(2)
	var wg sync.WaitGroup
	for i, write := range []bool{false, true, false, false, true} {
		name := fmt.Sprintf("R%d", i+1)
		if write {
			name = fmt.Sprintf("W%d", i+1)
		}
		queued := make(chan struct{})
		var once sync.Once
		wm := e.newClient(t).RWMutex("queue", dlock.Fair())
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := []dlock.Option{dlock.WithRetry(dlock.ConstantBackoff(2 * time.Millisecond)),
				dlock.WithOnRetry(func(int, error) { once.Do(func() { close(queued) }) })}
			var l *dlock.Lock
			var err error
			if write {
				l, err = wm.Lock(ctx, opts...)
			} else {
				l, err = wm.RLock(ctx, opts...)
			}
			if err != nil {
				t.Errorf("%s: %v", name, err)
				once.Do(func() { close(queued) })
				return
			}
			record(name + " in")
			if name == "R3" || name == "R4" {
				pair.Done()
				pair.Wait()
			} else {
				time.Sleep(5 * time.Millisecond)
			}
			record(name + " out")
			if err := l.Release(ctx); err != nil {
				t.Error(err)
			}
		}()
		<-queued // the next arrives once this one is queued
	}
	info, err := e.c.Inspect(ctx, "queue")
	if err != nil || info.Waiters != 5 || !info.WriterWaiting || !info.Fair {
		t.Errorf("Inspect of the queue = %+v, %v", info, err)
	}
	if _, err := e.c.RWMutex("queue", dlock.Fair()).TryRLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("a reader jumped the queue: err = %v", err)
	}
	if err := w0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	at := map[string]int{}
	for i, ev := range events {
		at[ev] = i
	}
	if len(events) != 10 ||
		at["R1 out"] > at["W2 in"] || at["W2 out"] > min(at["R3 in"], at["R4 in"]) ||
		max(at["R3 out"], at["R4 out"]) > at["W5 in"] {
		t.Errorf("served out of order: %v", events)
	}
}

func TestFairRWMutexDeadWaiterDoesNotStallTheQueue(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := e.c.RWMutex("stall", dlock.Fair())
	w0, err := m.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// First in the queue, a writer that stops as it waits.
	recorded, giveUp := frozenWaiter(t, e.newClient(t).RWMutex("stall", dlock.Fair()), true, dlock.WithTTL(200*time.Millisecond))
	defer giveUp()
	<-recorded
	if err := w0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Behind it, a reader: it gets in when the dead writer's entry expires,
	// waking at that moment (its own retry interval is an hour).
	l, err := e.newClient(t).RWMutex("stall", dlock.Fair()).RLock(ctx, dlock.WithRetry(dlock.ConstantBackoff(time.Hour)))
	if err != nil {
		t.Fatalf("reader behind a dead waiter: %v", err)
	}
	_ = l.Release(ctx)
}

func TestRWMutexReentrantOwner(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m := e.c.RWMutex("reent")
	other := e.newClient(t).RWMutex("reent")

	r1, err := m.TryRLock(ctx, dlock.WithOwner("req-1"))
	if err != nil {
		t.Fatal(err)
	}
	// A writer starts waiting: new readers are kept out, not the owner's
	// re-entry, which would otherwise wait for the writer that waits for it.
	recorded, giveUp := frozenWaiter(t, other, true)
	<-recorded
	if _, err := other.TryRLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("new reader while a writer waits: err = %v", err)
	}
	r2, err := other.TryRLock(ctx, dlock.WithOwner("req-1"))
	if err != nil || r2.Token() != r1.Token() {
		t.Fatalf("read re-entry while a writer waits: %v", err)
	}
	giveUp()
	info, err := e.c.Inspect(ctx, "reent")
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Count != 2 || info.Holders[0].Mode != dlock.ModeRead {
		t.Fatalf("Inspect = %+v, %v; want one read hold counted twice", info, err)
	}
	if _, err := m.TryLock(ctx, dlock.WithOwner("req-1")); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("the owner of a read hold asked for the write hold: err = %v, want ErrNotObtained", err)
	}
	if err := r2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Error("the read hold was freed while its owner held it once")
	}
	if err := r1.Release(ctx); err != nil {
		t.Fatal(err)
	}

	w1, err := m.TryLock(ctx, dlock.WithOwner("job-9"))
	if err != nil {
		t.Fatal(err)
	}
	w2, err := other.TryLock(ctx, dlock.WithOwner("job-9"))
	if err != nil || w2.Token() != w1.Token() || w2.Fence() != w1.Fence() {
		t.Fatalf("write re-entry: %v", err)
	}
	if _, err := m.TryRLock(ctx, dlock.WithOwner("job-9")); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("the owner of the write hold asked for a read hold: err = %v, want ErrNotObtained", err)
	}
	if info, _ := e.c.Inspect(ctx, "reent"); len(info.Holders) != 1 || info.Holders[0].Count != 2 || info.Holders[0].Owner != "job-9" {
		t.Errorf("Inspect = %+v; want the write hold counted twice", info)
	}
	_ = w2.Release(ctx)
	if err := w1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e.exists(t, "dlock:{reent}") {
		t.Error("not freed when the count reached zero")
	}
}

// snapshot is the state of a name's keys, to check that a refused request
// changed nothing.
func snapshot(t *testing.T, e *env, name string) string {
	k := "dlock:{" + name + "}"
	return e.srv.Do(t, "HGETALL", k) + "|" + e.srv.Do(t, "ZRANGE", k+":holds", "0", "-1") + "|" +
		e.srv.Do(t, "ZRANGE", k+":pending", "0", "-1") + "|" + e.srv.Do(t, "ZRANGE", k+":queue", "0", "-1") + "|" +
		e.srv.Do(t, "GET", k+":fence")
}

// TestRWMutexTokenOfTheOtherMode: a read hold's token that has since come
// to hold the write hold (WithToken) cannot release, refresh or re-acquire
// it as a read hold; each refusal is ErrModeMismatch and changes nothing.
func TestRWMutexTokenOfTheOtherMode(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m := e.c.RWMutex("modes")
	r, err := m.TryRLock(ctx, dlock.WithToken("token-7"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.ForceRelease(ctx, "modes"); err != nil {
		t.Fatal(err)
	}
	w, err := e.newClient(t).RWMutex("modes").TryLock(ctx, dlock.WithToken("token-7"))
	if err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, e, "modes")
	if _, err := m.TryRLock(ctx, dlock.WithToken("token-7")); !errors.Is(err, dlock.ErrModeMismatch) {
		t.Errorf("read acquire with a write token: err = %v, want ErrModeMismatch", err)
	}
	if _, err := r.TTL(ctx); !errors.Is(err, dlock.ErrModeMismatch) {
		t.Errorf("TTL: err = %v, want ErrModeMismatch", err)
	}
	if err := r.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrModeMismatch) || !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh: err = %v, want ErrModeMismatch and ErrNotHeld", err)
	}
	if !errors.Is(r.Err(), dlock.ErrLost) {
		t.Errorf("the read hold's Err = %v, want ErrLost", r.Err())
	}
	checkLossMessage(t, r.Err())
	if err := r.Release(ctx); !errors.Is(err, dlock.ErrModeMismatch) || !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release: err = %v, want ErrModeMismatch and ErrNotHeld", err)
	}
	if after := snapshot(t, e, "modes"); after != before {
		t.Errorf("state changed:\n%s\n%s", before, after)
	}
	if err := w.Release(ctx); err != nil {
		t.Errorf("the writer lost its hold: %v", err)
	}
}

// TestOneNameOneKind: a name in use as one kind refuses every other, and a
// read/write lock of the other fairness, with ErrKindMismatch at once
// (without waiting), changing nothing; the error names the kind found.
func TestOneNameOneKind(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.newClient(t)
	var opts []dlock.Option // those of the uses of a name held as another kind
	uses := map[string]func(name string) (*dlock.Lock, error){
		"exclusive":  func(name string) (*dlock.Lock, error) { return c.Lock(ctx, name, opts...) },
		"read":       func(name string) (*dlock.Lock, error) { return c.RWMutex(name).RLock(ctx, opts...) },
		"write":      func(name string) (*dlock.Lock, error) { return c.RWMutex(name).Lock(ctx, opts...) },
		"fair read":  func(name string) (*dlock.Lock, error) { return c.RWMutex(name, dlock.Fair()).RLock(ctx, opts...) },
		"fair write": func(name string) (*dlock.Lock, error) { return c.RWMutex(name, dlock.Fair()).Lock(ctx, opts...) },
		"permit":     func(name string) (*dlock.Lock, error) { return c.Semaphore(name, 5).Acquire(ctx, opts...) },
	}
	group := map[string]string{"exclusive": "x", "read": "rw", "write": "rw", "fair read": "fair",
		"fair write": "fair", "permit": "sem"}
	kinds := map[string]string{"x": "an exclusive lock", "rw": "a writer-preferring read/write lock",
		"fair": "a fair read/write lock", "sem": "a semaphore"}
	for held, take := range uses {
		name := "name-" + group[held]
		opts = nil
		l, err := take(name)
		if err != nil {
			t.Fatalf("%s: %v", held, err)
		}
		before := snapshot(t, e, name)
		for other, use := range uses {
			if group[other] == group[held] {
				continue
			}
			// At once: the first attempt's answer is final, never retried
			// (the max wait only bounds a wait, should there be one).
			retries := 0
			opts = []dlock.Option{dlock.WithMaxWait(10 * time.Second), dlock.WithOnRetry(func(int, error) { retries++ })}
			if _, err := use(name); !errors.Is(err, dlock.ErrKindMismatch) {
				t.Errorf("%s on a name held as %s: err = %v, want ErrKindMismatch", other, held, err)
			} else if want := fmt.Sprintf("%q is %s", name, kinds[group[held]]); !strings.HasSuffix(err.Error(), want) {
				t.Errorf("%s on a name held as %s: err = %v, want it to end with %s", other, held, err, want)
			} else if retries != 0 {
				t.Errorf("%s on a name held as %s was retried %d times", other, held, retries)
			}
		}
		if after := snapshot(t, e, name); after != before {
			t.Errorf("held as %s, state changed:\n%s\n%s", held, before, after)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPrimitivesRefuseDataTheyDidNotWrite(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Do(t, "SET", "dlock:{str}", "user data")
	e.srv.Do(t, "HSET", "dlock:{hash}", "field", "v")
	e.srv.Do(t, "SET", "dlock:{aux}:holds", "user data")
	for _, name := range []string{"str", "hash", "aux"} {
		if _, err := e.c.RWMutex(name).TryRLock(ctx); !errors.Is(err, dlock.ErrWrongType) {
			t.Errorf("read of %s: err = %v, want ErrWrongType", name, err)
		}
		if _, err := e.c.RWMutex(name).Lock(ctx); !errors.Is(err, dlock.ErrWrongType) {
			t.Errorf("write of %s: err = %v, want ErrWrongType", name, err)
		}
		if _, err := e.c.Semaphore(name, 2).Acquire(ctx); !errors.Is(err, dlock.ErrWrongType) {
			t.Errorf("permit of %s: err = %v, want ErrWrongType", name, err)
		}
	}
	if e.exists(t, "dlock:{aux}") {
		t.Error("a refused acquire created the base key")
	}
	for k, want := range map[string]string{"dlock:{str}": "user data", "dlock:{aux}:holds": "user data"} {
		if got := e.srv.Do(t, "GET", k); got != want {
			t.Errorf("%s changed to %q", k, got)
		}
	}
	// Waiting writers of a held lock refuse a waiters key that holds
	// other data, without recording anything.
	r, err := e.c.RWMutex("held").TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "SET", "dlock:{held}:pending", "user data")
	if _, err := e.c.RWMutex("held").Lock(ctx); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("waiting writer: err = %v, want ErrWrongType", err)
	}
	if _, err := e.c.RWMutex("held").TryRLock(ctx); !errors.Is(err, dlock.ErrWrongType) {
		t.Errorf("reader: err = %v, want ErrWrongType", err)
	}
	_ = r.Release(ctx)
}

// A read/write lock that is not fair never reads its arrival queue, so
// data there that dlock did not write is not refused: it is left alone by
// the last release, by a waiting writer's clean-up and by ForceRelease.
func TestAReadWriteLockLeavesAQueueKeyItDidNotWrite(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Do(t, "SET", "dlock:{q}:queue", "user data")
	m := e.c.RWMutex("q")
	r, err := m.TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, giveUp, cancel := untilRefused(ctx)
	defer cancel()
	if _, err := e.newClient(t).RWMutex("q").Lock(wctx, giveUp); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("waiting writer: err = %v, want ErrNotObtained", err)
	}
	if got := e.srv.Do(t, "ZCARD", "dlock:{q}:pending"); got != "0" {
		t.Errorf("the writer that gave up left %s pending acquires", got)
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryRLock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.ForceRelease(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if e.exists(t, "dlock:{q}") {
		t.Error("ForceRelease left the lock")
	}
	if got := e.srv.Do(t, "GET", "dlock:{q}:queue"); got != "user data" {
		t.Errorf("the queue key is now %q", got)
	}
}

func TestPrimitivesRefuseBadInputBeforeAnyRoundTrip(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var nilCtx context.Context
	m := e.c.RWMutex("k")
	s := e.c.Semaphore("k", 2)
	cases := []struct {
		name string
		do   func() (*dlock.Lock, error)
		want error
	}{
		{"nil context RLock", func() (*dlock.Lock, error) { return m.RLock(nilCtx) }, dlock.ErrNilContext},
		{"nil context TryLock", func() (*dlock.Lock, error) { return m.TryLock(nilCtx) }, dlock.ErrNilContext},
		{"nil context Acquire", func() (*dlock.Lock, error) { return s.Acquire(nilCtx) }, dlock.ErrNilContext},
		{"empty name read", func() (*dlock.Lock, error) { return e.c.RWMutex("").TryRLock(ctx) }, dlock.ErrEmptyName},
		{"empty name write", func() (*dlock.Lock, error) { return e.c.RWMutex("").Lock(ctx) }, dlock.ErrEmptyName},
		{"empty name permit", func() (*dlock.Lock, error) { return e.c.Semaphore("", 1).TryAcquire(ctx) }, dlock.ErrEmptyName},
		{"empty owner read", func() (*dlock.Lock, error) { return m.RLock(ctx, dlock.WithOwner("")) }, dlock.ErrInvalidOption},
		{"empty owner write", func() (*dlock.Lock, error) { return m.TryLock(ctx, dlock.WithOwner("")) }, dlock.ErrInvalidOption},
		{"empty owner permit", func() (*dlock.Lock, error) { return s.Acquire(ctx, dlock.WithOwner("")) }, dlock.ErrInvalidOption},
		{"zero TTL", func() (*dlock.Lock, error) { return m.TryRLock(ctx, dlock.WithTTL(0)) }, dlock.ErrInvalidTTL},
		{"empty token", func() (*dlock.Lock, error) { return s.TryAcquire(ctx, dlock.WithToken("")) }, dlock.ErrInvalidToken},
		{"zero permits", func() (*dlock.Lock, error) { return e.c.Semaphore("k", 0).TryAcquire(ctx) }, dlock.ErrInvalidPermits},
		{"negative permits", func() (*dlock.Lock, error) { return e.c.Semaphore("k", -2).Acquire(ctx) }, dlock.ErrInvalidPermits},
	}
	before := e.drv.trips.Load()
	for _, tc := range cases {
		if _, err := tc.do(); !errors.Is(err, tc.want) || !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if n := e.drv.trips.Load() - before; n != 0 {
		t.Errorf("bad input made %d round trips", n)
	}
	if keys := e.srv.Do(t, "DBSIZE"); keys != "0" {
		t.Errorf("bad input left %s keys", keys)
	}
}

// A writer with an owner queues behind the callers of its client that
// came first, as every read/write waiter does: an attempt of its own ahead
// of them would record it as a waiting writer in Redis, and keep them out
// until that record expired with its TTL.
func TestAnOwnersWriterWaitsInLineBehindItsClientsReaders(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := e.newClient(t)
	held, err := d.RWMutex("doc").TryLock(ctx, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	rw := e.c.RWMutex("doc")
	reader := whenRefused(t, "RLock", func(opts ...dlock.Option) (*dlock.Lock, error) { return rw.RLock(wctx, opts...) },
		dlock.WithTTL(time.Minute))
	writer := make(chan lockResult, 1)
	go func() {
		l, err := rw.Lock(wctx, dlock.WithTTL(time.Minute), dlock.WithOwner("o"))
		writer <- lockResult{l, err}
	}()
	awaitWaiting(t, e.c, "doc", 2)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	select {
	case r := <-reader:
		if r.err != nil {
			t.Fatalf("the reader: %v", r.err)
		}
		_ = r.l.Release(ctx)
	case <-rctx.Done():
		t.Fatal("the reader first in line is still kept out after the writer's release")
	}
	if r := <-writer; r.err != nil {
		t.Fatalf("the writer: %v", r.err)
	} else {
		_ = r.l.Release(ctx)
	}
}

// TestANestedOwnerReadDoesNotWaitBehindItsClientsWriter: an owner holds a
// read hold, and a writer of the same client waits for it to go. The
// owner's nested RLock (as the RWMutex doc advises for nested reads)
// re-enters its hold at once: it does not wait in line behind that writer,
// which waits for it, until one of the waits ends.
func TestANestedOwnerReadDoesNotWaitBehindItsClientsWriter(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			var opts []dlock.RWOption
			if fair {
				opts = append(opts, dlock.Fair())
			}
			rw := e.c.RWMutex("nested", opts...)
			own := dlock.WithOwner("request-1")
			outer, err := rw.TryRLock(ctx, own, dlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			writer := whenRefused(t, "Lock", func(opts ...dlock.Option) (*dlock.Lock, error) { return rw.Lock(wctx, opts...) },
				dlock.WithTTL(time.Minute))
			nctx, ncancel := context.WithTimeout(ctx, 10*time.Second)
			defer ncancel()
			inner, err := rw.RLock(nctx, own, dlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatalf("the nested RLock of the owner: %v", err)
			}
			for _, l := range []*dlock.Lock{inner, outer} {
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if r := <-writer; r.err != nil {
				t.Fatalf("the writer: %v", r.err)
			} else {
				_ = r.l.Release(ctx)
			}
		})
	}
}

// TestAFairWaiterThatGivesUpLastLeavesNoKeys: a fair read/write lock whose
// holder released while a writer waited keeps its keys for the writer's
// queue entry; when that writer gives up, its clean-up deletes them, as
// the last release would have, instead of leaving the base hash, which
// refused the other fairness (ErrKindMismatch) until it expired.
func TestAFairWaiterThatGivesUpLastLeavesNoKeys(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const name = "fair-last"
	held, err := e.c.RWMutex(name, dlock.Fair()).TryRLock(ctx, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// Without pub/sub and with an hour between attempts, the writer makes
	// no attempt after the release: it only gives up.
	waiter := dlock.New(noSubscribe{e.newDriver(t)})
	defer waiter.Close()
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := waiter.RWMutex(name, dlock.Fair()).Lock(wctx, dlock.WithRetry(dlock.ConstantBackoff(time.Hour)))
		done <- err
	}()
	awaitCond(t, 5*time.Second, func() bool { return e.srv.Do(t, "ZCARD", "dlock:{"+name+"}:pending") == "1" })
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !e.exists(t, "dlock:{"+name+"}") {
		t.Fatal("the release deleted the keys while a writer waited")
	}
	stop()
	if err := <-done; !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("the writer that gave up: err = %v, want ErrNotObtained", err)
	}
	for _, suffix := range []string{"", ":holds", ":pending", ":queue"} {
		if e.exists(t, "dlock:{"+name+"}"+suffix) {
			t.Errorf("dlock:{%s}%s left after the last waiter gave up", name, suffix)
		}
	}
	if _, err := e.c.RWMutex(name).TryLock(ctx); err != nil {
		t.Errorf("the name with the other fairness: %v", err)
	}
}

// TestReadWriteLockingManyNamesKeepsNoState: a client that holds one
// read/write lock after another, to read or to write, or waits for one
// until a writer releases it, keeps nothing in memory for the names it is
// done with.
func TestReadWriteLockingManyNamesKeepsNoState(t *testing.T) {
	e := newEnv(t)
	writer := e.newClient(t)
	ctx := context.Background()
	ttl := dlock.WithTTL(time.Minute)
	t.Run("read", func(t *testing.T) {
		keepsNoStateByName(t, "read", func(name string) error {
			l, err := e.c.RWMutex(name).RLock(ctx, ttl)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}, e.c)
	})
	t.Run("write", func(t *testing.T) {
		keepsNoStateByName(t, "write", func(name string) error {
			l, err := e.c.RWMutex(name).Lock(ctx, ttl)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}, e.c)
	})
	t.Run("woken", func(t *testing.T) {
		keepsNoStateByName(t, "woken", func(name string) error {
			return wokenAfterRefusal(ctx, func() (*dlock.Lock, error) { return writer.RWMutex(name, dlock.Fair()).Lock(ctx, ttl) },
				func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
					return e.c.RWMutex(name, dlock.Fair()).RLock(ctx, append(opts, ttl)...)
				})
		}, e.c, writer)
	})
}
