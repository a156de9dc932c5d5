package dlock_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestFunctionsShowLockTrafficByName(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.functionsClient(t)
	lib := dlock.FunctionLibrary()
	if got := e.srv.Do(t, "FUNCTION", "LIST", "LIBRARYNAME", lib.Name); !strings.Contains(got, lib.Name+"_acquire") {
		t.Fatalf("Open did not load the library %s: FUNCTION LIST says %q", lib.Name, got)
	}

	e.srv.Do(t, "CONFIG", "SET", "slowlog-log-slower-than", "0")
	e.srv.Do(t, "SLOWLOG", "RESET")
	e.srv.Do(t, "CONFIG", "RESETSTAT")
	l, err := c.TryLock(ctx, "named", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RWMutex("named-rw").TryRLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	e.srv.Do(t, "CONFIG", "SET", "slowlog-log-slower-than", "10000")
	slow := e.srv.Do(t, "SLOWLOG", "GET", "100")
	for _, fn := range []string{"_acquire", "_release", "_rw_acquire"} {
		if !strings.Contains(slow, lib.Name+fn) {
			t.Errorf("SLOWLOG does not name %s%s: %q", lib.Name, fn, slow)
		}
	}
	stats := e.srv.Do(t, "INFO", "commandstats")
	if !strings.Contains(stats, "cmdstat_fcall:calls=3") || strings.Contains(stats, "cmdstat_evalsha") {
		t.Errorf("INFO commandstats: want 3 fcall and no evalsha:\n%s", stats)
	}
}

func TestFunctionsReloadWhereMissing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.newClient(t, dlock.WithFunctions())
	// Loaded on first use, and again after the server lost its functions.
	for range 2 {
		l, err := c.TryLock(ctx, "reloaded")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		e.srv.Do(t, "FUNCTION", "FLUSH")
	}
	// Waiting and inspecting go by FCALL too.
	holder, err := c.TryLock(ctx, "reloaded", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := lockAndRelease(c, "reloaded", 5*time.Second)
	if info, err := c.Inspect(ctx, "reloaded"); err != nil || info == nil {
		t.Fatalf("Inspect: %v, %v", info, err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if calls := e.srv.Do(t, "INFO", "commandstats"); strings.Contains(calls, "cmdstat_evalsha") {
		t.Errorf("a script went by EVALSHA:\n%s", calls)
	}
}

func TestFunctionsOnAServerWithoutThem(t *testing.T) {
	// A server without FCALL and FUNCTION answers as Redis 6 does.
	e := newEnv(t, redistest.WithArgs("--rename-command", "FCALL", "", "--rename-command", "FUNCTION", ""))
	ctx := context.Background()
	// A setting to fix, as Open finds it and as an acquire does: ErrDenied.
	var se *dlock.ServerError
	if _, err := dlock.Open(ctx, e.newDriver(t), dlock.WithFunctions()); !errors.Is(err, dlock.ErrNoFunctions) ||
		!errors.Is(err, dlock.ErrDenied) || !errors.As(err, &se) {
		t.Fatalf("Open: err = %v, want ErrNoFunctions in a *ServerError that matches ErrDenied", err)
	}
	c := e.newClient(t, dlock.WithFunctions())
	if _, err := c.TryLock(ctx, "old"); !errors.Is(err, dlock.ErrNoFunctions) || !errors.Is(err, dlock.ErrDenied) {
		t.Fatalf("TryLock: err = %v, want ErrNoFunctions, matching ErrDenied", err)
	}
	if e.exists(t, "dlock:{old}") {
		t.Error("a failed acquire left the lock behind")
	}
	// A waiting acquire ends at once: no wait gives the server FCALL.
	retried := false
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	_, err := c.Lock(wctx, "old", dlock.WithOnRetry(func(int, error) { retried = true; cancel() }))
	cancel()
	if !errors.Is(err, dlock.ErrNoFunctions) || retried {
		t.Errorf("Lock: retried %v, err = %v; want no retry, and ErrNoFunctions", retried, err)
	}
	// Without the option, the same server serves locks by EVALSHA.
	c, err = dlock.Open(ctx, e.newDriver(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryLock(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// An ACL user that may not run functions gets ErrNoFunctions from Open,
// in a *ServerError that matches ErrDenied, as every refusal for good that
// Open meets does (a wrong password, say): a setting to fix.
func TestFunctionsRefusedToTheACLUser(t *testing.T) {
	srv := redistest.Start(t)
	rules := append(append([]string(nil), aclRules...), "-fcall", "-function")
	srv.Do(t, append([]string{"ACL", "SETUSER", "nofunctions"}, rules...)...)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nofunctions", Password: "s3cret"})
	t.Cleanup(func() { _ = rdb.Close() })
	var se *dlock.ServerError
	if _, err := dlock.Open(context.Background(), goredis.New(rdb), dlock.WithFunctions()); !errors.Is(err, dlock.ErrNoFunctions) ||
		!errors.Is(err, dlock.ErrDenied) || !errors.As(err, &se) {
		t.Fatalf("Open: err = %v, want ErrNoFunctions in a *ServerError that matches ErrDenied", err)
	}
	wrong := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "nofunctions", Password: "wrong"})
	t.Cleanup(func() { _ = wrong.Close() })
	if _, err := dlock.Open(context.Background(), goredis.New(wrong), dlock.WithFunctions()); !errors.Is(err, dlock.ErrDenied) || !errors.As(err, &se) {
		t.Fatalf("Open with a wrong password: err = %v, want a *ServerError that matches ErrDenied", err)
	}
}

func TestFunctionLibraryNamesEveryScript(t *testing.T) {
	lib := dlock.FunctionLibrary()
	if !strings.HasPrefix(lib.Name, "dlock_") || !strings.HasPrefix(lib.Src, "#!lua name="+lib.Name+"\n") {
		t.Fatalf("library %q: %.40q", lib.Name, lib.Src)
	}
	for _, s := range dlock.Scripts() {
		if s.Function != lib.Name+"_"+s.Name || !strings.Contains(lib.Src, "'"+s.Function+"'") {
			t.Errorf("script %s: function %q not in the library", s.Name, s.Function)
		}
	}
}

func TestFunctionsUnderTheACLUser(t *testing.T) {
	// The README's ACL user, with the two rules it adds for WithFunctions.
	rules := append(append([]string(nil), aclRules...), functionRules...)
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Join(functionRules, " "); !strings.Contains(string(readme), want) {
		t.Errorf("the README does not show the rules %q", want)
	}
	srv := redistest.Start(t)
	srv.Do(t, append([]string{"ACL", "SETUSER", "locker"}, rules...)...)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "locker", Password: "s3cret"})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	c, err := dlock.Open(ctx, goredis.New(rdb), dlock.WithFunctions())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryLock(ctx, "acl")
	if err != nil {
		t.Fatal(err)
	}
	got := lockAndRelease(c, "acl", 10*time.Second)
	awaitWaiting(t, c, "acl", 1)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// functionRules are what the ACL user needs besides aclRules to run
// dlock's scripts as functions.
var functionRules = []string{"+fcall", "+function|load"}

// Open against a server that cannot be reached reports a *ServerError, as
// every other request does, without naming the key of dlock's own request,
// which the caller never chose.
func TestOpenReportsAnUnreachableServerAsAServerError(t *testing.T) {
	srv := redistest.Start(t)
	addr := srv.Addr()
	srv.Kill(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	_, err := dlock.Open(context.Background(), goredis.New(rdb))
	var se *dlock.ServerError
	if !errors.As(err, &se) || strings.Contains(err.Error(), "prepare") || !strings.HasPrefix(err.Error(), "dlock: redis request failed: ") {
		t.Errorf("Open: err = %v (%T), want a *ServerError that names no key", err, err)
	}
}

// functionsClient returns a client over a driver of its own that runs its
// scripts as Redis Functions, opened (the library loaded) and closed with
// the test.
func (e *env) functionsClient(t *testing.T) *dlock.Client {
	t.Helper()
	c, err := dlock.Open(context.Background(), e.newDriver(t), dlock.WithFunctions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestResendKeepsTheErrorsOfCallsNotSent: a second round whose run sends
// nothing more (an earlier pass failed) leaves each call an error, never
// an empty reply, also for the calls it was to run by EVAL.
func TestResendKeepsTheErrorsOfCallsNotSent(t *testing.T) {
	lib := &dlock.Library{}
	script := &dlock.Call{Err: errors.New("NOSCRIPT No matching script")}
	function := &dlock.Call{Lib: lib, Err: errors.New("ERR Function not found")}
	failed := errors.New("i/o timeout")
	sent := false
	dlock.Resend([]*dlock.Call{script, function}, lib, func(lib *dlock.Library, calls []*dlock.Call) ([]*dlock.Call, []*dlock.Call) {
		return dlock.Loaded(calls, errors.New("OOM command not allowed when used memory > 'maxmemory'."))
	}, func(calls []*dlock.Call) {
		if sent {
			return // as evalWait's does once a pass failed
		}
		sent = true
		for _, c := range calls {
			c.Val, c.Err = nil, failed
		}
	})
	if script.Err != failed {
		t.Errorf("the call sent: Err = %v, want %v", script.Err, failed)
	}
	if function.Err == nil {
		t.Error("the call not sent ended with no error and no reply")
	}
}

// TestTheLibraryNameCoversTheFunctionsFlags: a build whose functions have
// other flags (allow-oom, no-writes) has a library of another name, which
// it loads beside an older build's: it took the name from the scripts
// alone, so a newer build ran an older build's functions for good, and a
// release refused on a full server (no allow-oom) kept the lock.
func TestTheLibraryNameCoversTheFunctionsFlags(t *testing.T) {
	lib := dlock.FunctionLibrary()
	if same := dlock.LibraryWithFlags(dlock.FunctionFlags()); same.Name != lib.Name || same.Src != lib.Src {
		t.Errorf("the library built again is %s, want %s as it was", same.Name, lib.Name)
	}
	noFlags := dlock.LibraryWithFlags(nil)
	if noFlags.Name == lib.Name {
		t.Errorf("a library without the functions' flags has the same name, %s", lib.Name)
	}
	if strings.Contains(lib.Src, "\x00") {
		t.Error("the library's code holds a NUL byte")
	}
}

// TestFunctionsOfAUserThatMayNotLoadThemGiveLocksUpByEVAL: an ACL user
// that may FCALL (and EVAL) but not FUNCTION LOAD, whose library an
// operator loaded and someone deleted since, releases by EVAL, as on a
// full server: its Release failed with ErrNoFunctions and left the lock
// held for its TTL. Its acquires, and Open where the library is missing,
// report ErrNoFunctions: the library must be loaded.
func TestFunctionsOfAUserThatMayNotLoadThemGiveLocksUpByEVAL(t *testing.T) {
	srv := redistest.Start(t)
	rules := append(append([]string(nil), aclRules...), "+fcall")
	srv.Do(t, append([]string{"ACL", "SETUSER", "noload"}, rules...)...)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "noload", Password: "s3cret"})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	if _, err := dlock.Open(ctx, goredis.New(rdb), dlock.WithFunctions()); !errors.Is(err, dlock.ErrNoFunctions) || !strings.Contains(err.Error(), "function|load") {
		t.Errorf("Open without the library: %v, want ErrNoFunctions naming function|load", err)
	}
	lib := dlock.FunctionLibrary()
	srv.Do(t, "FUNCTION", "LOAD", lib.Src)
	c, err := dlock.Open(ctx, goredis.New(rdb), dlock.WithFunctions())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryLock(ctx, "noload", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	srv.Do(t, "FUNCTION", "DELETE", lib.Name)
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release once the library was deleted: %v", err)
	}
	if _, err := c.TryLock(ctx, "noload"); !errors.Is(err, dlock.ErrNoFunctions) {
		t.Errorf("TryLock once the library was deleted: %v, want ErrNoFunctions", err)
	}
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	other := dlock.New(goredis.New(admin))
	defer other.Close()
	if _, err := other.TryLock(ctx, "noload"); err != nil {
		t.Errorf("the name after the Release: %v", err)
	}
}

// Loaded sorts a call by its script, dlock's own: one of another script
// of the same name, or of none, gets the refusal to load the library.
func TestLoadedKnowsDlocksOwnScripts(t *testing.T) {
	noLoad := errors.New("NOPERM User u has no permissions to run the 'function|load' command")
	var release *dlock.Script
	for _, s := range dlock.Scripts() {
		if s.Name == "release" {
			release = s
		}
	}
	lib := dlock.FunctionLibrary()
	own := &dlock.Call{Script: release, Lib: lib}
	other := &dlock.Call{Script: dlock.NewScript("release", "return 1"), Lib: lib}
	none := &dlock.Call{Lib: lib}
	again, scripts := dlock.Loaded([]*dlock.Call{own, other, none}, noLoad)
	if len(again) != 0 || len(scripts) != 1 || scripts[0] != own {
		t.Errorf("Loaded: again %d, scripts %v; want dlock's release alone to run as a script", len(again), scripts)
	}
	if other.Err != noLoad || none.Err != noLoad {
		t.Errorf("the others: %v, %v; want the refusal", other.Err, none.Err)
	}
}

// TestFunctionsLoadedMeanwhileAreNotLoadedAgain: after a restart without
// persistence or a FUNCTION FLUSH, every client with a call on the way
// finds the library missing; the first load makes it, and a client whose
// load comes after takes the library it finds as loaded, and calls it.
// Each load was a FUNCTION LOAD REPLACE, which compiled the whole library
// again (400 kB of Lua, 7 to 25 ms of the server's time, during which it
// answers nobody): 32 clients with two calls on the way each made 64 loads
// of one FLUSH, 0.5 to 0.8 s of the server's time.
func TestFunctionsLoadedMeanwhileAreNotLoadedAgain(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	second := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = second.Close() })
	other := dlock.New(goredis.New(second), dlock.WithFunctions())
	defer other.Close()
	first := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = first.Close() })
	// The other client finds the library missing too, and loads it, while
	// the first is about to load it.
	first.AddHook(&beforeLoad{do: func() {
		l, err := other.TryLock(ctx, "meanwhile")
		if err != nil {
			t.Errorf("the other client: %v", err)
			return
		}
		if err := l.Release(ctx); err != nil {
			t.Error(err)
		}
	}})
	c := dlock.New(goredis.New(first), dlock.WithFunctions())
	defer c.Close()
	l, err := c.TryLock(ctx, "first")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	stats := srv.Do(t, "INFO", "commandstats")
	t.Logf("FUNCTION LOAD: %d calls, %dµs of the server's time in all", srv.CommandStat(t, "function|load", "calls"), srv.CommandStat(t, "function|load", "usec"))
	if loads := srv.CommandStat(t, "function|load", "calls") - srv.CommandStat(t, "function|load", "failed_calls"); loads != 1 {
		t.Errorf("the library was loaded %d times, want once:\n%s", loads, stats)
	}
	if strings.Contains(stats, "cmdstat_eval:") {
		t.Errorf("a call went by EVAL:\n%s", stats)
	}
}

// beforeLoad is a go-redis hook that runs do once, before the client's
// first FUNCTION LOAD.
type beforeLoad struct {
	once sync.Once
	do   func()
}

func (h *beforeLoad) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *beforeLoad) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); cmd.Name() == "function" && len(args) > 1 {
			if sub, _ := args[1].(string); strings.EqualFold(sub, "load") {
				h.once.Do(h.do)
			}
		}
		return next(ctx, cmd)
	}
}

func (h *beforeLoad) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Loaded takes a refusal to load a library that is there already, this
// one (its name is drawn from its code), for a load: the calls go again.
// A refusal of another library's name is an error, as any other.
func TestLoadedTakesTheLibraryThereForLoaded(t *testing.T) {
	lib := dlock.FunctionLibrary()
	call := &dlock.Call{Script: dlock.Scripts()[0], Lib: lib}
	// As Redis answers, and as rueidis's errors have it, without "ERR ".
	for _, exists := range []string{"ERR Library '" + lib.Name + "' already exists", "Library '" + lib.Name + "' already exists"} {
		if again, scripts := dlock.Loaded([]*dlock.Call{call}, errors.New(exists)); len(again) != 1 || len(scripts) != 0 || call.Err != nil {
			t.Errorf("Loaded(%q): again %d, scripts %d, err %v; want the call to go again", exists, len(again), len(scripts), call.Err)
		}
	}
	other := errors.New("ERR Library 'dlock_0000000000' already exists")
	if again, scripts := dlock.Loaded([]*dlock.Call{call}, other); len(again) != 0 || len(scripts) != 0 || call.Err != other {
		t.Errorf("Loaded of another library's name: again %d, scripts %d, err %v; want the refusal", len(again), len(scripts), call.Err)
	}
}
