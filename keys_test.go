package dlock_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/redis/go-redis/v9"
)

var updateKeys = flag.Bool("update-keys", false, "rewrite testdata/keys.golden from what the scripts write")

// TestKeyFormatsStayAsRecorded takes every kind of lock through its
// states (held, refreshed after a lost reply, waited for and granted,
// cleaned up after a failed acquire, released) and compares the shape of
// what the scripts leave in Redis (each key's type, whether it expires, the
// names of its fields and the shape of their values) with
// testdata/keys.golden. Versions that lock the same names run side by side
// (docs/keys.md, "Formats across versions"): a change here is a change of
// format that an older version will read, and must follow that section's
// rule before its golden file is rewritten with -update-keys.
func TestKeyFormatsStayAsRecorded(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	var out strings.Builder
	dump := func(state string) {
		t.Helper()
		fmt.Fprintf(&out, "## %s\n", state)
		out.WriteString(keyShapes(t, ctx, rdb))
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	ttl := dlock.WithTTL(time.Minute)

	l, err := e.c.TryLock(ctx, "a", ttl, dlock.WithMetadata("meta"), dlock.WithOwner("owner"))
	must(err)
	dump("lock held, with metadata and an owner")
	e.drv.loseReplies(1)
	if err := l.Refresh(ctx, time.Minute); err == nil {
		t.Fatal("a refresh whose reply timed out succeeded")
	}
	must(l.Refresh(ctx, time.Minute))
	dump("lock refreshed after a refresh that got no answer")
	must(l.Release(ctx))
	dump("lock released")
	must(rdb.FlushAll(ctx).Err())

	l, err = e.c.TryLock(ctx, "b", ttl)
	must(err)
	waiting := lockAndRelease(e.newClient(t), "b", time.Minute, ttl)
	awaitCond(t, 10*time.Second, func() bool { return e.exists(t, "dlock:{b}:waiters") })
	dump("lock waited for")
	must(l.Release(ctx))
	must(<-waiting)
	must(rdb.FlushAll(ctx).Err())

	e.drv.timeOutReplies(1)
	if _, err := e.c.TryLock(ctx, "c", ttl); err == nil {
		t.Fatal("an acquire whose reply timed out succeeded")
	}
	awaitCond(t, 10*time.Second, func() bool { return e.exists(t, "dlock:{c}:late") })
	dump("acquire cleaned up after its reply timed out")
	must(rdb.FlushAll(ctx).Err())

	l, err = e.c.TryLockMulti(ctx, []string{"m1", "m2"}, ttl)
	must(err)
	dump("lock on two names held")
	must(l.Release(ctx))
	must(rdb.FlushAll(ctx).Err())

	rw := e.c.RWMutex("rw", dlock.Fair())
	r1, err := rw.RLock(ctx, ttl)
	must(err)
	r2, err := rw.RLock(ctx, ttl)
	must(err)
	writer := make(chan error, 1)
	go func() {
		w, err := e.newClient(t).RWMutex("rw", dlock.Fair()).Lock(ctx, ttl)
		if err == nil {
			err = w.Release(ctx)
		}
		writer <- err
	}()
	awaitCond(t, 10*time.Second, func() bool { return e.exists(t, "dlock:{rw}:queue") })
	dump("fair read/write lock read twice, a writer queued")
	must(r1.Release(ctx))
	must(r2.Release(ctx))
	must(<-writer)
	dump("read/write lock released")
	must(rdb.FlushAll(ctx).Err())

	s := e.c.Semaphore("sem", 3)
	p1, err := s.Acquire(ctx, ttl)
	must(err)
	p2, err := s.Acquire(ctx, ttl)
	must(err)
	e.drv.loseReplies(1)
	if err := p1.Refresh(ctx, time.Minute); err == nil {
		t.Fatal("a refresh whose reply timed out succeeded")
	}
	must(p1.Refresh(ctx, time.Minute))
	dump("semaphore with two permits held, one refreshed after a refresh that got no answer")
	must(p1.Release(ctx))
	must(p2.Release(ctx))
	dump("semaphore released")

	golden := "testdata/keys.golden"
	if *updateKeys {
		must(os.WriteFile(golden, []byte(out.String()), 0o644))
		return
	}
	want, err := os.ReadFile(golden)
	must(err)
	if got := out.String(); got != string(want) {
		t.Errorf("what the scripts write changed shape: read docs/keys.md, \"Formats across versions\", then rerun with -update-keys\n--- got\n%s\n--- want\n%s", got, want)
	}
}

var (
	// randomPart is an id, a token or a request: long runs of letters and
	// digits that change from run to run.
	randomPart = regexp.MustCompile(`[A-Za-z0-9_-]{10,}`)
	// longNumber is a time, a TTL or a count of milliseconds.
	longNumber = regexp.MustCompile(`\d{4,}(\.\d+)?`)
)

// shape replaces what changes from run to run in s by placeholders, and
// writes a JSON object's fields in order (Lua's cjson writes them in any).
func shape(s string) string {
	var obj map[string]any
	if strings.HasPrefix(s, "{") && json.Unmarshal([]byte(s), &obj) == nil {
		b, _ := json.Marshal(obj)
		s = string(b)
	}
	s = randomPart.ReplaceAllStringFunc(s, func(m string) string {
		if strings.Trim(m, "0123456789.") == "" {
			return m // a number: longNumber's
		}
		return "<id>"
	})
	return longNumber.ReplaceAllString(s, "<n>")
}

// keyShapes describes every key on rdb's server by its shape, sorted.
func keyShapes(t *testing.T, ctx context.Context, rdb *redis.Client) string {
	t.Helper()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		typ, err := rdb.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		life := "expires"
		if rdb.PTTL(ctx, k).Val() < 0 {
			life = "kept"
		}
		fmt.Fprintf(&b, "%s %s, %s\n", shape(k), typ, life)
		var lines []string
		switch typ {
		case "string":
			lines = append(lines, shape(rdb.Get(ctx, k).Val()))
		case "hash":
			for f, v := range rdb.HGetAll(ctx, k).Val() {
				lines = append(lines, shape(f)+" = "+shape(v))
			}
		case "zset":
			for _, z := range rdb.ZRangeWithScores(ctx, k, 0, -1).Val() {
				lines = append(lines, shape(fmt.Sprint(z.Member))+" @ "+shape(fmt.Sprint(int64(z.Score))))
			}
		case "set":
			for _, m := range rdb.SMembers(ctx, k).Val() {
				lines = append(lines, shape(m))
			}
		case "list":
			for _, m := range rdb.LRange(ctx, k, 0, -1).Val() {
				lines = append(lines, shape(m))
			}
		}
		sort.Strings(lines)
		for i, line := range lines {
			if i > 0 && line == lines[i-1] {
				continue
			}
			n := 1
			for j := i + 1; j < len(lines) && lines[j] == line; j++ {
				n++
			}
			if n > 1 {
				line = fmt.Sprintf("%s (×%d)", line, n)
			}
			fmt.Fprintf(&b, "\t%s\n", line)
		}
	}
	return b.String()
}

// TestWhatANameLeavesBehindExpires takes names through every way a hold
// or a wait ends (released, woken, given up, found lost, run out, released
// by force, a lost reply cleaned up after) and checks what they leave in
// Redis against docs/keys.md: every key expires, none outlives what the
// document says (a released hash a minute, a fence counter its
// retention, a clean-up's record two seconds, a read/write lock's or
// semaphore's releases a minute), and nothing else is left (no waiter set,
// holds, pending acquires or queue once the last hold and wait ended).
func TestWhatANameLeavesBehindExpires(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	holder := e.newClient(t)
	hourly := e.newClient(t, dlock.WithFenceRetention(time.Hour))
	ttl := dlock.WithTTL(time.Minute)
	const minute, day = 60 * time.Second, 24 * time.Hour
	lockLeaves := map[string]time.Duration{"": minute, ":fence": day}
	cleanedUpLeaves := map[string]time.Duration{"": minute, ":fence": day, ":late": 2 * time.Second}
	for _, tc := range []struct {
		name   string
		leaves map[string]time.Duration // the longest TTL of the keys left, by suffix
		alone  bool                     // one name at a time: it loses the driver's next reply
		run    func(name string) error
	}{
		{"released", lockLeaves, false, func(name string) error {
			l, err := e.c.TryLock(ctx, name, ttl)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"fence kept an hour", map[string]time.Duration{"": minute, ":fence": time.Hour}, false, func(name string) error {
			l, err := hourly.TryLock(ctx, name, ttl)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"woken", lockLeaves, false, func(name string) error {
			return wokenAfterRefusal(ctx, func() (*dlock.Lock, error) { return holder.TryLock(ctx, name, ttl) },
				func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
					return e.c.Lock(ctx, name, append(opts, ttl)...)
				})
		}},
		{"wait given up", cleanedUpLeaves, false, func(name string) error {
			held, err := holder.TryLock(ctx, name, ttl)
			if err != nil {
				return err
			}
			wctx, giveUp, cancel := untilRefused(ctx)
			defer cancel()
			if _, err := e.c.Lock(wctx, name, ttl, giveUp); !errors.Is(err, dlock.ErrNotObtained) {
				return fmt.Errorf("a wait given up: %v", err)
			}
			return held.Release(ctx)
		}},
		{"acquire's reply lost", cleanedUpLeaves, true, func(name string) error {
			e.drv.timeOutReplies(1)
			if _, err := e.c.TryLock(ctx, name, ttl); err == nil {
				return errors.New("an acquire whose reply timed out succeeded")
			}
			return nil
		}},
		{"refreshed after a lost reply", lockLeaves, true, func(name string) error {
			l, err := e.c.TryLock(ctx, name, ttl)
			if err != nil {
				return err
			}
			e.drv.loseReplies(1)
			if err := l.Refresh(ctx, time.Minute); err == nil {
				return errors.New("a refresh whose reply was lost succeeded")
			}
			if err := l.Refresh(ctx, time.Minute); err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"lost", map[string]time.Duration{":fence": day}, false, func(name string) error {
			l, err := e.c.TryLock(ctx, name, ttl, dlock.WithRefreshInterval(time.Millisecond))
			if err != nil {
				return err
			}
			if err := rdb.Del(ctx, e.c.RedisKey(name)).Err(); err != nil {
				return err
			}
			<-l.Done()
			return nil
		}},
		{"run out", map[string]time.Duration{":fence": day}, false, func(name string) error {
			// Long enough for the reply to come before it runs out, under
			// the race detector too.
			l, err := e.c.TryLock(ctx, name, dlock.WithTTL(200*time.Millisecond))
			if err != nil {
				return err
			}
			<-l.Done() // at its deadline, a little before its TTL runs out
			for rdb.Exists(ctx, e.c.RedisKey(name)).Val() == 1 {
				<-time.After(time.Millisecond)
			}
			return nil
		}},
		{"released by force", cleanedUpLeaves, false, func(name string) error {
			if _, err := holder.TryLock(ctx, name, ttl); err != nil {
				return err
			}
			_, err := e.c.ForceRelease(ctx, name)
			return err
		}},
		{"on several names", lockLeaves, false, func(name string) error {
			l, err := e.c.LockMulti(ctx, []string{name + ":a", name + ":b"}, ttl)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"read", map[string]time.Duration{":released": minute}, false, func(name string) error {
			l, err := e.c.RWMutex(name).RLock(ctx, ttl)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"written, readers woken", map[string]time.Duration{":released": minute, ":fence": day}, false, func(name string) error {
			return wokenAfterRefusal(ctx, func() (*dlock.Lock, error) { return holder.RWMutex(name, dlock.Fair()).Lock(ctx, ttl) },
				func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
					return e.c.RWMutex(name, dlock.Fair()).RLock(ctx, append(opts, ttl)...)
				})
		}},
		{"writer's wait given up", map[string]time.Duration{":released": minute}, false, func(name string) error {
			held, err := holder.RWMutex(name, dlock.Fair()).RLock(ctx, ttl)
			if err != nil {
				return err
			}
			wctx, giveUp, cancel := untilRefused(ctx)
			defer cancel()
			if _, err := e.c.RWMutex(name, dlock.Fair()).Lock(wctx, ttl, giveUp); !errors.Is(err, dlock.ErrNotObtained) {
				return fmt.Errorf("a wait given up: %v", err)
			}
			return held.Release(ctx)
		}},
		{"read lock released by force", map[string]time.Duration{":released": minute}, false, func(name string) error {
			if _, err := holder.RWMutex(name).RLock(ctx, ttl); err != nil {
				return err
			}
			_, err := e.c.ForceRelease(ctx, name)
			return err
		}},
		{"permit", map[string]time.Duration{":released": minute}, false, func(name string) error {
			return wokenAfterRefusal(ctx, func() (*dlock.Lock, error) { return holder.Semaphore(name, 1).Acquire(ctx, ttl) },
				func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
					return e.c.Semaphore(name, 1).Acquire(ctx, append(opts, ttl)...)
				})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			const names = 20
			if tc.alone {
				for i := range names {
					if err := tc.run("n:" + strconv.Itoa(i)); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				churnNames(t, "n", 0, names, tc.run)
			}
			dlock.GivenBack(e.c)
			left := map[string]int{}
			iter := rdb.Scan(ctx, 0, "*", 100).Iterator()
			for iter.Next(ctx) {
				k := iter.Val()
				suffix := k[strings.LastIndex(k, "}")+1:]
				left[suffix]++
				longest, ok := tc.leaves[suffix]
				pttl := rdb.PTTL(ctx, k).Val()
				switch {
				case !ok:
					t.Errorf("%s is left", k)
				case pttl == -2:
					// Expired since the scan.
				case pttl < 0:
					t.Errorf("%s is left without a TTL", k)
				case pttl > longest:
					t.Errorf("%s is left for %v, more than %v", k, pttl, longest)
				}
			}
			if err := iter.Err(); err != nil {
				t.Fatal(err)
			}
			t.Logf("keys left by %d names: %v", names, left)
		})
	}
}
