package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
)

var evalTests = []test{
	{name: "Replies", run: testReplies},
	{name: "Arguments", run: testArguments},
	{name: "ErrorReplies", run: testErrorReplies},
	{name: "Refusals", run: testRefusals},
	{name: "UsesEVALSHA", run: testUsesEvalsha},
	{name: "FallbackAfterScriptFlush", run: testFallback},
	{name: "FallbackAfterScriptFlushInBatch", run: testFallbackBatch},
	{name: "ScriptSentOncePerServer", run: testScriptSentOnce},
	{name: "Pipeline", run: testPipeline},
	{name: "Concurrent", run: testConcurrentEval},
	{name: "EndedContext", run: testEndedContext},
	{name: "FailedConnection", run: testFailedConnection, only: onStandalone},
	{name: "KilledConnections", run: testKilledConnections},
	{name: "DeadlineDuringCall", run: testDeadlineDuringCall, only: onStandalone},
	{name: "DeadlineDuringCallOnAPrimary", run: testDeadlineDuringCallOnAPrimary, only: onCluster},
	{name: "CrossSlot", run: testCrossSlot, only: onCluster},
}

// evalCase is a script and the reply a driver must make of it.
type evalCase struct {
	name string
	src  string
	keys int // how many keys the script gets (all in one slot)
	want any
}

// replyCases cover every shape a script's reply can take.
var replyCases = []evalCase{
	{name: "integer", src: "return 42", want: int64(42)},
	{name: "negative integer", src: "return -7", want: int64(-7)},
	{name: "large integer", src: "return 1000000000000000", want: int64(1e15)},
	{name: "number truncated", src: "return 3.99", want: int64(3)},
	{name: "true", src: "return true", want: int64(1)},
	{name: "false", src: "return false", want: nil},
	{name: "nil", src: "return nil", want: nil},
	{name: "string", src: "return 'hello'", want: "hello"},
	{name: "empty string", src: "return ''", want: ""},
	{name: "binary string", src: `return '\0\255\r\n x'`, want: "\x00\xff\r\n x"},
	{name: "status reply", src: "return redis.status_reply('DONE')", want: "DONE"},
	{name: "status from a command", src: "return redis.call('PING')", want: "PONG"},
	{name: "empty array", src: "return {}", want: []any{}},
	{name: "array", src: "return {1, 'two', 3}", want: []any{int64(1), "two", int64(3)}},
	{name: "nested arrays", src: "return {1, {2, {'three', {}}}, 'four'}",
		want: []any{int64(1), []any{int64(2), []any{"three", []any{}}}, "four"}},
	{name: "nil in an array", src: "return {1, false, 'x'}", want: []any{int64(1), nil, "x"}},
	{name: "missing key", src: "return redis.call('GET', KEYS[1])", keys: 1, want: nil},
	{name: "integer from a command", src: "return redis.call('INCRBY', KEYS[1], 5)", keys: 1, want: int64(5)},
	{name: "array from a command",
		src:  "redis.call('HSET', KEYS[1], 'f', 'v'); return redis.call('HGETALL', KEYS[1])",
		keys: 1, want: []any{"f", "v"}},
}

// call builds a call of the case's script on fresh keys of the test.
func (c evalCase) call(t testing.TB, i int) *dlock.Call {
	call := &dlock.Call{Script: dlock.NewScript(c.name, c.src)}
	for k := range c.keys {
		call.Keys = append(call.Keys, fmt.Sprintf("%s{%d}:%d", prefix(t), i, k))
	}
	return call
}

func testReplies(t *testing.T, e *env) {
	drv := e.driver(t)
	ctx := timeout(t)
	var batch []*dlock.Call
	for i, c := range replyCases {
		call := c.call(t, i)
		drv.Eval(ctx, call)
		checkReply(t, "alone: "+c.name, call, c.want)
		batch = append(batch, c.call(t, len(replyCases)+i))
	}
	drv.Eval(ctx, batch...)
	for i, c := range replyCases {
		checkReply(t, "in a batch: "+c.name, batch[i], c.want)
	}
}

func testArguments(t *testing.T, e *env) {
	drv := e.driver(t)
	ctx := timeout(t)
	echo := dlock.NewScript("echo", `
local out = {#KEYS, #ARGV}
for _, k in ipairs(KEYS) do out[#out + 1] = k end
for _, a in ipairs(ARGV) do out[#out + 1] = a end
return out`)
	k1, k2 := prefix(t)+"{args}:1", prefix(t)+"{args}:2"
	call := &dlock.Call{Script: echo, Keys: []string{k1, k2},
		Args: []any{"s", []byte("b\x00\xff"), 42, int64(-9), uint64(18446744073709551615), "", "two words"}}
	none := &dlock.Call{Script: echo, Keys: []string{k1}}
	for _, batch := range [][]*dlock.Call{{call}, {call, none}} {
		drv.Eval(ctx, batch...)
		checkReply(t, "keys and arguments", call, []any{int64(2), int64(7), k1, k2,
			"s", "b\x00\xff", "42", "-9", "18446744073709551615", "", "two words"})
	}
	checkReply(t, "no arguments", none, []any{int64(1), int64(0), k1})
}

// errorCases are scripts that fail, and the text of the error.
var errorCases = []struct {
	name, src string
	exact     string // the whole error text, if set
	prefix    string
	contains  string
}{
	{name: "dlock code", src: "return redis.error_reply('DLOCK_WRONGTYPE 2')", exact: "DLOCK_WRONGTYPE 2"},
	{name: "error table", src: "return {err = 'DLOCK_KIND 1'}", exact: "DLOCK_KIND 1"},
	{name: "ERR prefix kept", src: "return redis.error_reply('ERR custom failure')", exact: "ERR custom failure"},
	{name: "command error", src: "redis.call('SET', KEYS[1], 'x'); return redis.call('INCR', KEYS[1])",
		prefix: "ERR ", contains: "not an integer"},
	{name: "Lua error", src: "error('boom')", prefix: "ERR ", contains: "boom"},
	{name: "unknown command", src: "return redis.call('NOSUCHCOMMAND')", prefix: "ERR ", contains: "command"},
}

func testErrorReplies(t *testing.T, e *env) {
	drv := e.driver(t)
	ctx := timeout(t)
	key := prefix(t) + "{err}"
	good := func() *dlock.Call { return &dlock.Call{Script: dlock.NewScript("good", "return 'fine'")} }
	var batch []*dlock.Call
	for _, c := range errorCases {
		s := dlock.NewScript(c.name, c.src)
		call := &dlock.Call{Script: s, Keys: []string{key}}
		drv.Eval(ctx, call)
		checkError(t, "alone: "+c.name, call, c.exact, c.prefix, c.contains)
		batch = append(batch, &dlock.Call{Script: s, Keys: []string{key}}, good())
	}
	drv.Eval(ctx, batch...)
	for i, c := range errorCases {
		checkError(t, "in a batch: "+c.name, batch[2*i], c.exact, c.prefix, c.contains)
		checkReply(t, "the call after "+c.name, batch[2*i+1], "fine")
	}

	// An error inside an array reply is an element of the array: an error
	// value with the server's text.
	call := &dlock.Call{Script: dlock.NewScript("inner", "return {1, redis.error_reply('DLOCK_INNER 3'), 'x'}")}
	drv.Eval(ctx, call)
	if call.Err != nil {
		t.Fatalf("error inside an array: Err = %v", call.Err)
	}
	r, ok := call.Val.([]any)
	if !ok || len(r) != 3 || r[0] != int64(1) || r[2] != "x" {
		t.Fatalf("error inside an array: Val = %#v", call.Val)
	}
	if err, ok := r[1].(error); !ok || err.Error() != "DLOCK_INNER 3" {
		t.Errorf("error inside an array: element %#v, want an error %q", r[1], "DLOCK_INNER 3")
	}
}

// testRefusals: a refusal the server makes instead of running a script
// (here NOPERM: the user may not run scripts) is stored with the server's
// text, by which dlock tells the refusals that retrying does not mend.
func testRefusals(t *testing.T, e *env) {
	drv := e.driver(t)
	e.onPrimaries(t, "ACL", "SETUSER", "default", "-@scripting")
	defer e.onPrimaries(t, "ACL", "SETUSER", "default", "+@all")
	call := &dlock.Call{Script: dlock.NewScript("refused", "return 1"), Keys: []string{prefix(t) + "{refused}"}}
	drv.Eval(timeout(t), call)
	checkError(t, "a script the user may not run", call, "", "NOPERM ", "")
}

// testUsesEvalsha: scripts go by EVALSHA, and by EVAL only when the server
// does not know them.
func testUsesEvalsha(t *testing.T, e *env) {
	drv := e.driver(t)
	ctx := timeout(t)
	key := prefix(t) + "{sha}"
	s := dlock.NewScript("count", "return redis.call('INCR', KEYS[1])")
	e.onPrimaries(t, "SCRIPT", "FLUSH")
	e.onPrimaries(t, "CONFIG", "RESETSTAT")
	n := int64(0)
	for range 5 {
		call := &dlock.Call{Script: s, Keys: []string{key}}
		drv.Eval(ctx, call)
		n++
		checkReply(t, "alone", call, n)
	}
	batch := make([]*dlock.Call, 5)
	for i := range batch {
		batch[i] = &dlock.Call{Script: s, Keys: []string{key}}
	}
	drv.Eval(ctx, batch...)
	for _, call := range batch {
		n++
		checkReply(t, "in a batch", call, n)
	}
	// Ten EVALSHA; the first is answered NOSCRIPT and followed by one EVAL.
	if sha, ev := e.calls(t, "evalsha"), e.calls(t, "eval"); sha != 10 || ev != 1 {
		t.Errorf("the servers ran EVALSHA %d times and EVAL %d times, want 10 and 1", sha, ev)
	}
}

func testFallback(t *testing.T, e *env) {
	drv := e.driver(t)
	ctx := timeout(t)
	s := dlock.NewScript("fallback", "return {KEYS[1], ARGV[1]}")
	key := prefix(t) + "{fallback}"
	for round := range 3 {
		call := &dlock.Call{Script: s, Keys: []string{key}, Args: []any{round}}
		drv.Eval(ctx, call)
		checkReply(t, fmt.Sprintf("round %d", round), call, []any{key, strconv.Itoa(round)})
		e.onPrimaries(t, "SCRIPT", "FLUSH")
	}
}

// testFallbackBatch: in a batch, only the calls the server answered
// NOSCRIPT run again by EVAL: the others ran already, and run once, those
// that changed data and those that answered an error alike. The first
// round knows none of the scripts, the next ones know b and the erring d.
func testFallbackBatch(t *testing.T, e *env) {
	drv := e.driver(t)
	ctx := timeout(t)
	scripts := []*dlock.Script{
		dlock.NewScript("a", "return 'a' .. ARGV[1]"),
		dlock.NewScript("b", "return redis.call('INCRBY', KEYS[1], ARGV[1])"),
		dlock.NewScript("c", "if ARGV[1] == '8' then return redis.error_reply('DLOCK_EIGHT 8') end return {ARGV[1]}"),
	}
	erring := dlock.NewScript("d", "redis.call('INCR', KEYS[1]) return redis.error_reply('DLOCK_COUNTED 1')")
	counted := prefix(t) + "{counted}"
	batch := func() []*dlock.Call {
		calls := make([]*dlock.Call, 31)
		for i := range 30 {
			// Keys in many slots: on a cluster the batch spans every primary.
			calls[i] = &dlock.Call{Script: scripts[i%3], Keys: []string{fmt.Sprintf("%s{%d}", prefix(t), i)}, Args: []any{i}}
		}
		calls[30] = &dlock.Call{Script: erring, Keys: []string{counted}}
		return calls
	}
	for round := range 3 {
		if round > 0 {
			e.onPrimaries(t, "SCRIPT", "LOAD", scripts[1].Src)
			e.onPrimaries(t, "SCRIPT", "LOAD", erring.Src)
		}
		calls := batch()
		drv.Eval(ctx, calls...)
		checkError(t, fmt.Sprintf("round %d, erring call", round), calls[30], "DLOCK_COUNTED 1", "", "")
		if got := e.do(t, counted, "GET", counted); got != strconv.Itoa(round+1) {
			t.Errorf("round %d: the erring script ran %s times in all, want %d", round, got, round+1)
		}
		calls = calls[:30]
		for i, call := range calls {
			what := fmt.Sprintf("round %d, call %d", round, i)
			switch {
			case i == 8:
				checkError(t, what, call, "DLOCK_EIGHT 8", "", "")
			case i%3 == 0:
				checkReply(t, what, call, "a"+strconv.Itoa(i))
			case i%3 == 1:
				checkReply(t, what, call, int64(i*(round+1)))
			default:
				checkReply(t, what, call, []any{strconv.Itoa(i)})
			}
		}
		e.onPrimaries(t, "SCRIPT", "FLUSH")
	}
}

// testScriptSentOnce: a pipeline of many calls of a few scripts, on
// servers that know none of them (fresh, restarted, promoted, SCRIPT
// FLUSH), sends each script's text by EVAL once to each server, not once
// per call: ls of 54,000 locks after a restart wrote some 1.9 GB of the
// inspection script's text (35 KB a call) and failed at the client's write
// timeout. Every call still gets its own reply, and runs once.
func testScriptSentOnce(t *testing.T, e *env) {
	drv := e.driver(t)
	ctx := timeout(t)
	calls, check := manyCallsOfTwoScripts(t)
	e.onPrimaries(t, "SCRIPT", "FLUSH")
	e.onPrimaries(t, "CONFIG", "RESETSTAT")
	drv.Eval(ctx, calls...)
	check("Eval", calls)
	e.checkEvalsPerPrimary(t, "a pipeline of 300 calls of 2 scripts", 2)
}

// manyCallsOfTwoScripts returns 300 calls of two scripts, alternating, on
// keys in many slots (on a cluster, every primary's), and a function
// that checks their replies: each call ran once.
func manyCallsOfTwoScripts(t testing.TB) ([]*dlock.Call, func(what string, calls []*dlock.Call)) {
	t.Helper()
	incr := dlock.NewScript("incr", "return redis.call('INCR', KEYS[1])")
	echo := dlock.NewScript("echo", "return {KEYS[1], ARGV[1]}")
	calls := make([]*dlock.Call, 300)
	for i := range calls {
		key := fmt.Sprintf("%s{%d}", prefix(t), i)
		if i%2 == 0 {
			calls[i] = &dlock.Call{Script: incr, Keys: []string{key}}
		} else {
			calls[i] = &dlock.Call{Script: echo, Keys: []string{key}, Args: []any{i}}
		}
	}
	return calls, func(what string, calls []*dlock.Call) {
		t.Helper()
		for i, call := range calls {
			if i%2 == 0 {
				checkReply(t, fmt.Sprintf("%s: call %d", what, i), call, int64(1))
			} else {
				checkReply(t, fmt.Sprintf("%s: call %d", what, i), call, []any{call.Keys[0], strconv.Itoa(i)})
			}
		}
	}
}

// checkEvalsPerPrimary fails t when a primary ran EVAL more than scripts
// times since the last CONFIG RESETSTAT.
func (e *env) checkEvalsPerPrimary(t testing.TB, what string, scripts int) {
	t.Helper()
	for _, p := range e.primaries {
		if n := p.CommandStat(t, "eval", "calls"); n > scripts {
			t.Errorf("%s, on a server that knew neither: %s ran EVAL, with a script's text, %d times; want at most %d, once per script",
				what, p.Addr(), n, scripts)
		}
	}
}

func testPipeline(t *testing.T, e *env) {
	drv := e.driver(t)
	ctx := timeout(t)
	drv.Eval(ctx) // no calls: nothing to do
	s := dlock.NewScript("double", `
redis.call('SET', KEYS[1], ARGV[1])
if tonumber(ARGV[1]) % 10 == 0 then return redis.error_reply('DLOCK_TEST ' .. ARGV[1]) end
return tonumber(ARGV[1]) * 2`)
	calls := make([]*dlock.Call, 1000)
	for i := range calls {
		calls[i] = &dlock.Call{Script: s, Keys: []string{fmt.Sprintf("%s{%d}", prefix(t), i%50)}, Args: []any{i}}
	}
	drv.Eval(ctx, calls...)
	for i, call := range calls {
		if i%10 == 0 {
			checkError(t, fmt.Sprintf("call %d", i), call, "DLOCK_TEST "+strconv.Itoa(i), "", "")
		} else {
			checkReply(t, fmt.Sprintf("call %d", i), call, int64(2*i))
		}
	}
	// Each call ran on the node that holds its key, in order: the last
	// write to each key is the last call's.
	for k := range 50 {
		key := fmt.Sprintf("%s{%d}", prefix(t), k)
		if got := e.do(t, key, "GET", key); got != strconv.Itoa(950+k) {
			t.Errorf("%s = %s on its node, want %d", key, got, 950+k)
		}
	}
}

// testConcurrentEval: one driver serves many goroutines at once, each
// getting its own replies.
func testConcurrentEval(t *testing.T, e *env) {
	drv := e.driver(t)
	ctx := timeout(t)
	s := dlock.NewScript("echo1", "return {KEYS[1], ARGV[1]}")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				calls := make([]*dlock.Call, 1+i%5)
				for j := range calls {
					calls[j] = &dlock.Call{Script: s, Keys: []string{fmt.Sprintf("%s{%d}", prefix(t), j)},
						Args: []any{fmt.Sprintf("%d/%d/%d", g, i, j)}}
				}
				drv.Eval(ctx, calls...)
				for j, call := range calls {
					checkReply(t, "concurrent", call, []any{call.Keys[0], fmt.Sprintf("%d/%d/%d", g, i, j)})
				}
			}
		}()
	}
	wg.Wait()
}

// testEndedContext: a call on an ended context fails with the context's
// error, and the driver goes on working.
func testEndedContext(t *testing.T, e *env) {
	drv := e.driver(t)
	s := dlock.NewScript("ended", "return 1")
	ok := &dlock.Call{Script: s}
	drv.Eval(timeout(t), ok) // a connection is open and idle
	checkReply(t, "before", ok, int64(1))

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithTimeout(context.Background(), -1)
	defer cancel2()
	for _, c := range []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
		for _, n := range []int{1, 3} {
			calls := make([]*dlock.Call, n)
			for i := range calls {
				calls[i] = &dlock.Call{Script: s, Keys: []string{fmt.Sprintf("%s{%d}", prefix(t), i)}}
			}
			drv.Eval(c.ctx, calls...)
			for i, call := range calls {
				if !errors.Is(call.Err, c.want) || call.Val != nil {
					t.Errorf("%d calls on a context that ended with %v: call %d: Val %#v, Err %v", n, c.want, i, call.Val, call.Err)
				}
			}
		}
	}
	after := &dlock.Call{Script: s}
	drv.Eval(timeout(t), after)
	checkReply(t, "after", after, int64(1))
}

// testFailedConnection: a call that cannot reach its server (gone: its
// connections closed, new ones refused) fails with an error of its own in
// Call.Err, alone and in a pipeline, not with a nil reply, which would
// read as a script's answer.
func testFailedConnection(t *testing.T, e *env) {
	px := redistest.StartCutProxy(t, e.primaries[0].Addr())
	addr := px.Addr()
	drv := e.newDriver(t, Deployment{Topology: Standalone, Addrs: []string{addr}})
	s := dlock.NewScript("unreachable", "return 1")
	warm := &dlock.Call{Script: s}
	drv.Eval(timeout(t), warm)
	checkReply(t, "before the server went away", warm, int64(1))
	px.Close()
	for _, n := range []int{1, 3} {
		calls := make([]*dlock.Call, n)
		for i := range calls {
			calls[i] = &dlock.Call{Script: s, Keys: []string{fmt.Sprintf("%s{%d}", prefix(t), i)}}
		}
		drv.Eval(timeout(t), calls...)
		for i, call := range calls {
			if call.Err == nil || call.Val != nil {
				t.Errorf("%d calls to %s, where nothing listens: call %d: Val %#v, Err %v; want an error", n, addr, i, call.Val, call.Err)
			}
		}
	}
}

// testKilledConnections: calls sent after the servers closed every
// connection of the driver's (CLIENT KILL, or their idle timeout) succeed,
// the driver sending them again on a new connection, round after round:
// a Release there must not fail for a connection that had long gone.
func testKilledConnections(t *testing.T, e *env) {
	drv := e.driver(t)
	s := dlock.NewScript("incr", "return redis.call('INCR', KEYS[1])")
	calls := e.callPerPrimary(t, s)
	for round := 1; round <= 5; round++ {
		drv.Eval(timeout(t), calls...)
		for i, call := range calls {
			checkReply(t, fmt.Sprintf("round %d, call %d", round, i), call, int64(round))
			call.Val, call.Err = nil, nil
		}
		e.killClients(t)
	}
}

// callPerPrimary returns a call of s on a key of its own on each primary.
func (e *env) callPerPrimary(t testing.TB, s *dlock.Script) []*dlock.Call {
	t.Helper()
	var calls []*dlock.Call
	for _, p := range e.primaries {
		calls = append(calls, &dlock.Call{Script: s, Keys: []string{prefix(t) + "{" + e.tagOn(t, p) + "}"}})
	}
	return calls
}

// killClients closes every connection of the clients of every node
// (CLIENT KILL TYPE normal): not subscriptions, replication links or the
// cluster bus.
func (e *env) killClients(t testing.TB) {
	t.Helper()
	for _, n := range e.nodes {
		n.Do(t, "CLIENT", "KILL", "TYPE", "normal")
	}
}

// testDeadlineDuringCall: a call whose server stops answering while it
// waits for the reply (a connection cut off without a reset) fails with
// context.DeadlineExceeded when its context's deadline passes, not at the
// client's own read timeout: dlock bounds its refreshes, clean-ups and
// waits by deadlines. (go-redis needs ContextTimeoutEnabled for this.)
func testDeadlineDuringCall(t *testing.T, e *env) {
	px := redistest.StartCutProxy(t, e.primaries[0].Addr())
	drv := e.newDriver(t, Deployment{Topology: Standalone, Addrs: []string{px.Addr()}})
	s := dlock.NewScript("silent", "return 1")
	warm := &dlock.Call{Script: s}
	drv.Eval(timeout(t), warm) // a connection is open and idle
	checkReply(t, "before the cut", warm, int64(1))
	px.Cut()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	call := &dlock.Call{Script: s}
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		drv.Eval(ctx, call)
	}()
	receive(t, done, "return of a call whose deadline passed")
	if !errors.Is(call.Err, context.DeadlineExceeded) || call.Val != nil {
		t.Errorf("a call on a silent connection, 300ms deadline: Val %#v, Err %v; want context.DeadlineExceeded", call.Val, call.Err)
	}
	// The error alone does not tell the two apart: go-redis without
	// ContextTimeoutEnabled waits for its read timeout (3s by default), and
	// then reports context.DeadlineExceeded, the context having ended by
	// then. 2.5s leaves a loaded machine 2.2s of slack past the deadline,
	// and is short of that read timeout, which such a client always waits.
	if took := time.Since(start); took > 2500*time.Millisecond {
		t.Errorf("a call with a 300ms deadline returned after %v", took.Round(time.Millisecond))
	}
}

// testDeadlineDuringCallOnAPrimary: as testDeadlineDuringCall, on a cluster,
// whose client the suite cannot put behind a proxy: a call to a primary
// that stops answering (paused, for less than the cluster's node timeout)
// fails with context.DeadlineExceeded once its deadline has passed, while
// the primary is still paused, not once the primary answers again.
func testDeadlineDuringCallOnAPrimary(t *testing.T, e *env) {
	drv := e.driver(t)
	s := dlock.NewScript("silent", "return 1")
	key := prefix(t) + "{silent}"
	warm := &dlock.Call{Script: s, Keys: []string{key}}
	drv.Eval(timeout(t), warm) // a connection is open and idle
	checkReply(t, "before the pause", warm, int64(1))
	resume := e.primaryOf(t, key).PauseAWhile(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	call := &dlock.Call{Script: s, Keys: []string{key}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		drv.Eval(ctx, call)
	}()
	// 1.5s: a loaded machine's slack past the deadline, and short of the
	// node timeout (2s), after which the cluster would fail the primary
	// over.
	select {
	case <-done:
	case <-time.After(1800 * time.Millisecond):
		resume()
		<-done
		t.Fatalf("a call with a 300ms deadline to a paused primary returned only once it answered again: Val %#v, Err %v", call.Val, call.Err)
	}
	resume()
	if !errors.Is(call.Err, context.DeadlineExceeded) || call.Val != nil {
		t.Errorf("a call to a paused primary, 300ms deadline: Val %#v, Err %v; want context.DeadlineExceeded", call.Val, call.Err)
	}
}

// testCrossSlot: a call whose keys lie in different slots is refused by
// the server (CROSSSLOT), not by a panic, and the others go through.
func testCrossSlot(t *testing.T, e *env) {
	drv := e.driver(t)
	ctx := timeout(t)
	s := dlock.NewScript("two", "return #KEYS")
	cross := &dlock.Call{Script: s, Keys: []string{prefix(t) + "{a}", prefix(t) + "{b}"}}
	same := &dlock.Call{Script: s, Keys: []string{prefix(t) + "{a}:1", prefix(t) + "{a}:2"}}
	drv.Eval(ctx, cross)
	checkError(t, "alone", cross, "", "CROSSSLOT", "")
	cross.Err = nil
	drv.Eval(ctx, cross, same)
	checkError(t, "in a batch", cross, "", "CROSSSLOT", "")
	checkReply(t, "the call after it", same, int64(2))
}

// checkReply fails t unless call succeeded with the reply want.
func checkReply(t testing.TB, what string, call *dlock.Call, want any) {
	t.Helper()
	if call.Err != nil {
		t.Errorf("%s: Err = %v, want the reply %#v", what, call.Err, want)
		return
	}
	if !sameReply(call.Val, want) {
		t.Errorf("%s: Val = %#v, want %#v", what, call.Val, want)
	}
}

// checkError fails t unless call failed with an error whose text is exact
// (if set), starts with prefix and contains contains, and has no reply.
func checkError(t testing.TB, what string, call *dlock.Call, exact, prefix, contains string) {
	t.Helper()
	if call.Err == nil {
		t.Errorf("%s: no error, Val = %#v", what, call.Val)
		return
	}
	msg := call.Err.Error()
	if (exact != "" && msg != exact) || !strings.HasPrefix(msg, prefix) || !strings.Contains(msg, contains) {
		t.Errorf("%s: Err = %q, want %s", what, msg, describeWant(exact, prefix, contains))
	}
	if call.Val != nil {
		t.Errorf("%s: Val = %#v beside the error, want nil", what, call.Val)
	}
}

func describeWant(exact, prefix, contains string) string {
	if exact != "" {
		return strconv.Quote(exact)
	}
	return fmt.Sprintf("a text starting %q and containing %q", prefix, contains)
}

// sameReply compares replies of the documented types: nil, int64, string,
// []any (an empty array may be nil or empty, but must be a []any) and
// errors by their text.
func sameReply(got, want any) bool {
	switch w := want.(type) {
	case nil:
		return got == nil
	case int64, string:
		return got == want
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !sameReply(g[i], w[i]) {
				return false
			}
		}
		return true
	case error:
		g, ok := got.(error)
		return ok && g.Error() == w.Error()
	}
	return false
}
