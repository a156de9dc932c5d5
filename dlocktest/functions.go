package dlocktest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
)

// functionTests run every primitive again with dlock.WithFunctions, after a
// test of the driver's side: FCALL, and the library loaded where missing.
var functionTests = append([]test{
	{name: "FCALL", run: testFCall},
	{name: "FCALLAtMaxmemory", run: testFCallAtMaxmemory},
	{name: "FCALLOfAFunctionStillMissing", run: testFCallStillMissing},
	{name: "FCALLAgainstAStalledPrimary", run: testFCallStalledPrimary, only: onCluster},
}, append(append([]test(nil), lockTests...), replicaTests...)...)

// testFCall: calls with a Lib go by FCALL, never by EVALSHA; a server
// without the library gets it (each primary of a cluster where a call
// found it missing), and gets it again after FUNCTION FLUSH; pipelined
// calls spread over every primary all get their replies.
func testFCall(t *testing.T, e *env) {
	ctx := timeout(t)
	d := e.driver(t)
	lib := dlock.FunctionLibrary()
	e.onPrimaries(t, "FUNCTION", "FLUSH")
	e.onPrimaries(t, "CONFIG", "RESETSTAT")
	c := dlock.New(d, dlock.WithPrefix(prefix(t)), dlock.WithFunctions())
	defer c.Close()
	if err := c.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	if e.calls(t, "fcall") == 0 && e.calls(t, "evalsha")+e.calls(t, "eval") > 0 {
		t.Skip("the driver ignores Call.Lib, as dlock.Call allows: it runs every script by EVALSHA (the other tests of WithFunctions run so)")
	}
	if p := e.primaryOf(t, c.RedisKey("dlock:prepare")); !e.hasLibrary(t, p, lib) {
		t.Fatalf("%s: library %s not loaded by Prepare", p.Addr(), lib.Name)
	}
	for round := range 2 {
		// One name per primary, in one pipeline.
		var calls []*dlock.Call
		for _, p := range e.primaries {
			calls = append(calls, &dlock.Call{Script: scriptTTL(), Keys: []string{c.RedisKey(e.tagOn(t, p))},
				Args: []any{"token", ""}, Lib: lib})
		}
		d.Eval(ctx, calls...)
		for _, call := range calls {
			checkReply(t, "FCALL ttl", call, []any{int64(-2)})
		}
		for _, p := range e.primaries {
			if !e.hasLibrary(t, p, lib) {
				t.Fatalf("%s: library %s not loaded", p.Addr(), lib.Name)
			}
		}
		if round == 0 {
			e.onPrimaries(t, "FUNCTION", "FLUSH")
		}
	}
	if n := e.calls(t, "evalsha") + e.calls(t, "eval"); n != 0 {
		t.Errorf("%d calls went by EVALSHA or EVAL", n)
	}
	if n := e.calls(t, "fcall"); n < 2*len(e.primaries) {
		t.Errorf("%d FCALLs, want at least %d", n, 2*len(e.primaries))
	}
}

// hasLibrary reports whether p has lib loaded.
func (e *env) hasLibrary(t testing.TB, p *redistest.Server, lib *dlock.Library) bool {
	t.Helper()
	return strings.Contains(p.Do(t, "FUNCTION", "LIST", "LIBRARYNAME", lib.Name), lib.Name+"_acquire")
}

// testFCallAtMaxmemory: a server at its maxmemory without the library
// refuses FUNCTION LOAD; the calls then run by EVAL, so that a lock's
// holder still reads its TTL and releases it there, as by EVALSHA.
// So do the calls of EvalWait.
func testFCallAtMaxmemory(t *testing.T, e *env) {
	ctx := timeout(t)
	d := e.driver(t)
	lib := dlock.FunctionLibrary()
	e.onPrimaries(t, "CONFIG", "SET", "maxmemory", "1")
	t.Cleanup(func() { e.onPrimaries(t, "CONFIG", "SET", "maxmemory", "0") })
	ttls := func() []*dlock.Call {
		e.onPrimaries(t, "FUNCTION", "FLUSH")
		calls := e.callPerPrimary(t, scriptTTL())
		for _, call := range calls {
			call.Args, call.Lib = []any{"token", ""}, lib
		}
		return calls
	}
	calls := ttls()
	d.Eval(ctx, calls...)
	for _, call := range calls {
		checkReply(t, "FCALL ttl at maxmemory, without the library", call, []any{int64(-2)})
	}
	rep, ok := d.(dlock.Replicator)
	if !ok {
		return
	}
	calls = ttls()
	if _, err := rep.EvalWait(ctx, 0, time.Second, calls...); err != nil { // WAIT 0 returns at once
		t.Fatalf("EvalWait at maxmemory, without the library: %v", err)
	}
	for _, call := range calls {
		checkReply(t, "FCALL ttl through EvalWait at maxmemory, without the library", call, []any{int64(-2)})
	}
}

// testFCallStillMissing: a call whose function is missing once more after
// the library was loaded (deleted again meanwhile; here, one the library
// never had) runs by EVAL. The load finds the library there (as a client
// does whose call found it missing before another loaded it), and takes it
// for loaded: it does not have Redis compile it again.
func testFCallStillMissing(t *testing.T, e *env) {
	ctx := timeout(t)
	d := e.driver(t)
	e.onPrimaries(t, "FUNCTION", "FLUSH")
	e.onPrimaries(t, "FUNCTION", "LOAD", dlock.FunctionLibrary().Src)
	e.onPrimaries(t, "CONFIG", "RESETSTAT")
	missing := *scriptTTL()
	missing.Function = "dlock_never_loaded_ttl"
	calls := e.callPerPrimary(t, &missing)
	for _, call := range calls {
		call.Args, call.Lib = []any{"token", ""}, dlock.FunctionLibrary()
	}
	d.Eval(ctx, calls...)
	for _, call := range calls {
		checkReply(t, "FCALL of a function missing after the load", call, []any{int64(-2)})
	}
	if n := e.cmdstat(t, "function|load", "calls") - e.cmdstat(t, "function|load", "failed_calls"); n != 0 {
		t.Errorf("%d loads of the library where it was loaded already compiled it again", n)
	}
}

// testFCallStalledPrimary: a primary without the library gets it while
// another primary stalls: the load goes where the calls went, not to
// every primary first.
func testFCallStalledPrimary(t *testing.T, e *env) {
	ctx := timeout(t)
	d := e.driver(t)
	lib := dlock.FunctionLibrary()
	healthy, stalled := e.primaries[0], e.primaries[1]
	key := prefix(t) + "{" + e.tagOn(t, healthy) + "}"
	ttl := func(ctx context.Context) *dlock.Call {
		call := &dlock.Call{Script: scriptTTL(), Keys: []string{key}, Args: []any{"token", ""}, Lib: lib}
		d.Eval(ctx, call)
		return call
	}
	checkReply(t, "FCALL ttl", ttl(ctx), []any{int64(-2)}) // connections and slot map in place
	healthy.Do(t, "FUNCTION", "FLUSH")
	resume := stalled.PauseAWhile(t)
	// Within the cluster's node timeout, so that no replica takes over.
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	call := ttl(sctx)
	resume()
	checkReply(t, "FCALL ttl on a primary without the library while another stalls", call, []any{int64(-2)})
}

// scriptTTL returns dlock's ttl script.
func scriptTTL() *dlock.Script {
	for _, s := range dlock.Scripts() {
		if s.Name == "ttl" {
			return s
		}
	}
	panic("dlocktest: dlock has no ttl script")
}
