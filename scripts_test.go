package dlock

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestNextFenceBeforeRedis7 runs next_fence (fence.lua, after replies.lua
// as in dlock's scripts) on a server that refuses SET with both NX and GET,
// as servers before Redis 7 do: a stand-in for redis.pcall answers that
// command with a syntax error, and everything else goes to the server. The
// fallback reads the counter with GET. Before Redis 6.2 SET refuses GET
// alone too, and a fence after a released lock's (last) is written by a
// plain SET.
func TestNextFenceBeforeRedis7(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	var src []byte
	for _, f := range []string{"replies", "fence"} {
		b, err := scriptFiles.ReadFile("scripts/" + f + ".lua")
		if err != nil {
			t.Fatal(err)
		}
		src = append(src, b...)
	}
	shim := `local refused = 0
local before62 = ARGV[2] == '1'
local redis = setmetatable({pcall = function(cmd, ...)
  local n = select('#', ...)
  if cmd == 'SET' and select(n, ...) == 'GET' and (before62 or select(5, ...) == 'NX') then
    refused = refused + 1
    return {err = 'ERR syntax error'}
  end
  return redis.pcall(cmd, ...)
end}, {__index = redis})
`
	script := redis.NewScript(shim + string(src) + `
local f, s = next_fence(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[3] or ''))
if not f then return 'nil' end
return {s, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), refused}
`)
	ctx := context.Background()
	next := func(now int64) any {
		v, err := script.Run(ctx, rdb, []string{"fence"}, now).Result()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	check := func(what string, got any, want int64) {
		t.Helper()
		r, ok := got.([]any)
		w := strconv.FormatInt(want, 10)
		if !ok || len(r) != 4 || r[0] != w || r[1] != w || r[2].(int64) < 86_000_000 {
			t.Errorf("%s: next_fence = %v, want %s stored for a day", what, got, w)
		} else if r[3] != int64(1) {
			t.Errorf("%s: SET NX GET refused %v times, want once", what, r[3])
		}
	}
	check("no counter", next(1000), 1000)
	check("counter behind the clock", next(5000), 5000)
	check("counter ahead of the clock", next(10), 5001)
	after := func(now, last int64) any { // before Redis 6.2, after a released lock's fence
		v, err := script.Run(ctx, rdb, []string{"fence"}, now, "1", last).Result()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	check("before Redis 6.2, after a released lock's fence", after(6000, 7000), 7001)
	check("before Redis 6.2, after a released lock's fence behind the clock", after(8000, 7001), 8000)

	rdb.Set(ctx, "fence", "not a number", 0)
	if got := next(9000); got != "nil" {
		t.Errorf("counter holding other text: next_fence = %v, want nil", got)
	}
	if got := rdb.Get(ctx, "fence").Val(); got != "not a number" {
		t.Errorf("counter holding other text changed to %q", got)
	}
	rdb.Del(ctx, "fence")
	rdb.RPush(ctx, "fence", "x")
	if got := next(9000); got != "nil" {
		t.Errorf("counter of another type: next_fence = %v, want nil", got)
	}
}

// TestTheLibraryStartsEachCallAfresh: the function library defines the
// helper files once, so that a helper's top-level local lives from call to
// call (see scripts/library.lua). Every such local that a script assigns
// after its definition must be set again by begin, or be wake's helpers
// (functions made once, which keep no call's data); the others are
// constants. A new helper that keeps state fails here until begin resets it.
func TestTheLibraryStartsEachCallAfresh(t *testing.T) {
	begin := scriptFile("library")
	var all strings.Builder
	for _, f := range []string{"acquire", "release", "refresh", "ttl", "rw_acquire", "sem_acquire", "holds_release",
		"holds_refresh", "holds_ttl", "fenced_set", "fenced_get", "inspect", "force_release", "unwait"} {
		all.WriteString(scriptFile(f))
	}
	for _, f := range helperFiles {
		all.WriteString(scriptFile(f))
	}
	code := regexp.MustCompile(`(?m)--.*$`).ReplaceAllString(all.String(), "")
	declared := regexp.MustCompile(`(?m)^local ([a-z_]+(?:, *[a-z_]+)*)(?: *=|$)`)
	seen := 0
	for _, f := range helperFiles {
		for _, m := range declared.FindAllStringSubmatch(scriptFile(f), -1) {
			for _, name := range strings.Split(m[1], ",") {
				name = strings.TrimSpace(name)
				seen++
				// An assignment other than its declaration: name = …, or
				// name[…] = …, or a list of names assigned at once.
				assigned := regexp.MustCompile(`(?m)(^|[^.\w])` + name + `(\[(?:[^][]|\[[^]]*\])*\])?( *, *[a-z_.\[\]]+)* *=[^=]`)
				n := 0
				for _, loc := range assigned.FindAllStringIndex(code, -1) {
					if !strings.HasPrefix(strings.TrimLeft(code[strings.LastIndex(code[:loc[0]+1], "\n")+1:loc[1]], " "), "local ") {
						n++
					}
				}
				if n > 0 && name != "helpers" && !regexp.MustCompile(`\b`+name+`\b`).MatchString(begin) {
					t.Errorf("%s.lua: %s is assigned after its definition (%d times), and scripts/library.lua's begin does not set it again", f, name, n)
				}
			}
		}
	}
	if seen < 8 {
		t.Fatalf("found %d top-level locals in the helper files, want the 8 or more there are", seen)
	}
}
