package dlock_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
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
