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
// call (see scripts/library.lua), and so do the locals of wake.lua's
// waking, whose functions the library keeps (helpers): those of waking
// must be functions or constants. Every such local that a script changes
// after its definition (name = …, name[…] = …, name.field = …, or its
// table changed by table.insert, table.remove, table.sort or rawset) must
// be set again by begin's code, or be helpers itself (functions made once,
// which keep no call's data); the others are constants. A new helper that
// keeps state fails here until begin resets it. Not seen: a change through
// another name for the same table, and one in a file that has a local or
// parameter of the same name of its own.
func TestTheLibraryStartsEachCallAfresh(t *testing.T) {
	// strip leaves the code of src: no comments, and strings empty.
	comments := regexp.MustCompile(`(?m)--.*$`)
	strs := regexp.MustCompile(`'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"`)
	strip := func(src string) string {
		return strs.ReplaceAllString(comments.ReplaceAllString(src, ""), "''")
	}
	begin := strip(scriptFile("library"))
	// The code of each script's body and of each helper file, by name.
	code := map[string]string{}
	for _, s := range Scripts() {
		code[s.Name] = strip(s.body)
	}
	for _, f := range helperFiles {
		code[f] = strip(scriptFile(f))
	}
	// The locals that live from call to call: those at a helper file's top
	// level, and those of waking's body, indented once.
	const names = `([A-Za-z_]\w*(?:, *[A-Za-z_]\w*)*)`
	top := regexp.MustCompile(`(?m)^local (?:function )?` + names)
	inWaking := regexp.MustCompile(`(?m)^  local (?:function )?` + names)
	wakingBody := regexp.MustCompile(`(?ms)^local function waking\(\)$.*?^end$`)
	wakingValue := regexp.MustCompile(`(?m)^  local ` + names + ` *= *(.*?) *$`)
	constant := regexp.MustCompile(`^(?:-?\d+(?:\.\d+)?|''|true|false|nil)(?: *, *(?:-?\d+(?:\.\d+)?|''|true|false|nil))*$`)
	seen, seenWaking := 0, 0
	for _, f := range helperFiles {
		found := top.FindAllStringSubmatch(code[f], -1)
		n := len(found)
		for _, body := range wakingBody.FindAllString(code[f], -1) {
			found = append(found, inWaking.FindAllStringSubmatch(body, -1)...)
			// waking's locals are made at the first call that needs them,
			// and kept: functions, or constants, never that call's data.
			for _, m := range wakingValue.FindAllStringSubmatch(body, -1) {
				if !constant.MatchString(m[2]) {
					t.Errorf("%s.lua: waking's %s is %s, which the library keeps from the call that made it to the next; want a constant", f, m[1], m[2])
				}
			}
		}
		seenWaking += len(found) - n
		for _, m := range found {
			for _, name := range strings.Split(m[1], ",") {
				name = strings.TrimSpace(name)
				seen++
				// An assignment other than its declaration: name = …, or
				// name[…] = …, or name.field = …, or a list of names
				// assigned at once; or a call that changes its table.
				assigned := regexp.MustCompile(`(?m)(^|[^.\w])` + name + `(\[(?:[^][]|\[[^]]*\])*\]|\.\w+)*( *, *[\w.\[\]]+)* *=[^=]` +
					`|\b(?:table\.(?:insert|remove|sort)|rawset) *\( *` + name + `\b`)
				// A local, parameter or loop variable of the same name.
				declared := regexp.MustCompile(`\blocal +(?:function +)?[\w, ]*\b` + name + `\b|\bfunction *[\w.:]*\([\w, ]*\b` + name +
					`\b|\bfor +[\w, ]*\b` + name + `\b[\w, ]*(?:=|in\b)`)
				n := 0
				for file, src := range code {
					// A file that declares a name of its own besides f's
					// changes that one: it is not counted.
					own := 0
					if file == f {
						own = 1
					}
					if len(declared.FindAllString(src, -1)) > own {
						continue
					}
					for _, loc := range assigned.FindAllStringIndex(src, -1) {
						// A key in a table constructor ({name = …}) is none.
						if strings.Count(src[:loc[0]+1], "{") > strings.Count(src[:loc[0]+1], "}") {
							continue
						}
						if !strings.HasPrefix(strings.TrimLeft(src[strings.LastIndex(src[:loc[0]+1], "\n")+1:loc[1]], " "), "local ") {
							n++
						}
					}
				}
				if n > 0 && name != "helpers" && !regexp.MustCompile(`\b`+name+`\b`).MatchString(begin) {
					t.Errorf("%s.lua: %s is changed after its definition (%d times), and scripts/library.lua's begin does not set it again", f, name, n)
				}
			}
		}
	}
	if seen-seenWaking < 60 || seenWaking < 17 {
		t.Fatalf("found %d top-level locals in the helper files and %d of waking's, want the 60 and 17 or more there are", seen-seenWaking, seenWaking)
	}
}
