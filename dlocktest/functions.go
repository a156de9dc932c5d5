package dlocktest

import (
	"strings"
	"testing"

	"github.com/dlockio/dlock"
)

// functionTests run every primitive again with dlock.WithFunctions, after a
// test of the driver's side: FCALL, and the library loaded where missing.
var functionTests = append([]test{
	{name: "FCALL", run: testFCall},
}, append(append([]test(nil), lockTests...), replicaTests...)...)

// testFCall: calls with a Lib go by FCALL, never by EVALSHA; a server
// without the library gets it (every primary of a cluster at once), and
// gets it again after FUNCTION FLUSH; pipelined calls spread over every
// primary all get their replies.
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
	for _, p := range e.primaries {
		if got := p.Do(t, "FUNCTION", "LIST", "LIBRARYNAME", lib.Name); !strings.Contains(got, lib.Name+"_acquire") {
			t.Fatalf("%s: library %s not loaded: %q", p.Addr(), lib.Name, got)
		}
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

// scriptTTL returns dlock's ttl script.
func scriptTTL() *dlock.Script {
	for _, s := range dlock.Scripts() {
		if s.Name == "ttl" {
			return s
		}
	}
	panic("dlocktest: dlock has no ttl script")
}
