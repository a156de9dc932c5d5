package dlock

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Library is a Redis Functions library (Redis 7 and later) that holds every
// script dlock runs as a function of its own, so that lock traffic shows by
// name: FCALL dlock_…_acquire in SLOWLOG, MONITOR and client lists, and as
// fcall, apart from other scripts' evalsha, in INFO commandstats. See
// WithFunctions.
type Library struct {
	// Name is the library's name: "dlock_" and a version drawn from the
	// library's code (the scripts, and the flags of their functions), so
	// that dlock builds with different functions never replace, or use,
	// each other's on a shared server.
	Name string
	// Src is the library's code, for FUNCTION LOAD.
	Src string
}

// ErrNoFunctions means WithFunctions was asked for but the server has no
// Redis Functions (it is older than Redis 7, or FCALL and FUNCTION are
// disabled or not allowed to the client's ACL user).
var ErrNoFunctions = errors.New("dlock: server has no Redis Functions (FCALL needs Redis 7)")

// FunctionLibrary returns the library that WithFunctions loads: every
// script of Scripts as a function named Library.Name + "_" + Script.Name,
// which is the script's Function.
func FunctionLibrary() *Library { return library }

var library = newLibrary(Scripts(), functionFlags)

// functionFlags are the flags of the functions that need some: inspect
// and fenced_get only read, so it runs on a server at its maxmemory (and on a replica);
// the scripts that give locks up free memory, and the refreshes and TTL
// reads add none (an attach by TTL adds a field), so they run there too: a
// full server neither keeps a lock given up nor takes one from its holder.
// The others are write functions, refused at maxmemory before they run.
// (By EVALSHA, the same scripts make a first write that adds no memory,
// which lets their others run: see allow_oom.)
var functionFlags = map[string]string{
	"inspect":       "'no-writes'",
	"fenced_get":    "'no-writes'",
	"release":       "'allow-oom'",
	"holds_release": "'allow-oom'",
	"force_release": "'allow-oom'",
	"unwait":        "'allow-oom'",
	"refresh":       "'allow-oom'",
	"holds_refresh": "'allow-oom'",
	"ttl":           "'allow-oom'",
	"holds_ttl":     "'allow-oom'",
}

// givesUp holds the scripts whose functions give locks up or keep them
// (flagged allow-oom): those run by EVAL where the library cannot be
// loaded for want of memory or of the permission (see Loaded).
var givesUp = func() map[*Script]bool {
	m := map[*Script]bool{}
	for _, s := range Scripts() {
		if strings.Contains(functionFlags[s.Name], "allow-oom") {
			m[s] = true
		}
	}
	return m
}()

// newLibrary builds the library of scripts, their functions with flags,
// and names each script's function. The library defines every helper file
// once, in the order of helperFiles, when it is loaded, and then
// scripts/library.lua's begin, which each function calls first with its
// KEYS; a function's code is the rest of its script: a script run by
// EVALSHA defines its helpers each time (closures: about 15% of the
// instructions the server runs for an acquire and release of a free
// name), a function uses the library's. The
// name is drawn from the whole library but for the name itself: a build
// that changes only a function's flags has a library of its own too.
func newLibrary(scripts []*Script, flags map[string]string) *Library {
	const unnamed = "\x00name\x00" // where the name goes
	var b strings.Builder
	fmt.Fprintf(&b, "#!lua name=%s\n", unnamed)
	// KEYS is the running function's keys, for the helpers that read them.
	b.WriteString("local KEYS\n")
	for _, f := range helperFiles {
		b.WriteString(scriptFile(f))
	}
	b.WriteString(scriptFile("library"))
	for _, s := range scripts {
		// A script's body is the body of a function of KEYS and ARGV.
		fmt.Fprintf(&b, "redis.register_function{function_name='%s_%s', flags={%s}, callback=function(KEYS, ARGV)\nbegin(KEYS)\n%s\nend}\n",
			unnamed, s.Name, flags[s.Name], s.body)
	}
	sum := sha1.Sum([]byte(b.String()))
	name := "dlock_" + hex.EncodeToString(sum[:])[:10]
	for _, s := range scripts {
		s.Function = name + "_" + s.Name
		s.fnArg = s.Function
	}
	return &Library{Name: name, Src: strings.ReplaceAll(b.String(), unnamed, name)}
}

// WithFunctions makes the client run its scripts as Redis Functions, by
// FCALL, instead of by EVALSHA: the driver loads FunctionLibrary (FUNCTION
// LOAD) on a server (a primary of a cluster; every shard of a Ring
// that is up) the first time it answers that a function is missing, and Redis then
// persists and replicates it. A load that finds the library there (another
// client loaded it meanwhile) leaves it as it is, and the calls go again:
// Redis does not compile it again. A server that cannot load it for want of
// memory (at its maxmemory), or whose library is deleted again before the
// calls are sent again, has those calls run by EVAL instead; one that
// refuses the load to the client's ACL user, those that give locks up or
// keep them (releases, refreshes, TTL, ForceRelease; the others, acquires
// among them, get ErrNoFunctions). Lock traffic then shows by function name,
// and costs the server less: the library defines the helpers the scripts
// share once, when it is loaded, where a script run by EVALSHA defines
// them each time (an acquire and release of a free name take about 15%
// fewer instructions of the server). It needs Redis 7;
// on an older server every request fails with ErrNoFunctions. Open (or
// Prepare) finds that out at once.
func WithFunctions() ClientOption {
	return func(c *Client) { c.batch.lib = library }
}

// Open returns a Client as New does and makes sure it can work: it runs
// Prepare, so that an unreachable server, or WithFunctions on a server
// without Redis Functions (ErrNoFunctions), is reported now rather than by
// the first lock.
func Open(ctx context.Context, d Driver, opts ...ClientOption) (*Client, error) {
	c := New(d, opts...)
	if err := c.Prepare(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// Prepare makes one harmless read-only request, which checks that the
// server answers and, with WithFunctions, loads the function library on
// that request's server if it is missing there (the other primaries of a
// cluster get it with their first calls). Its error is a *ServerError,
// which matches ErrNoFunctions when WithFunctions was asked for and the
// server cannot run functions, and ErrDenied when Redis refuses the client
// for good (that among them).
func (c *Client) Prepare(ctx context.Context) error {
	c.made()
	if ctx == nil {
		return ErrNilContext
	}
	key := c.RedisKey("dlock:prepare")
	keys := []string{key, key + ":fence", key + ":waiters", key + ":holds", key + ":pending"}
	if _, err := c.eval(ctx, scriptInspect, keys); err != nil {
		// The key is dlock's own, which the caller never named. An
		// ErrNoFunctions comes so too, as an acquire's does: it matches
		// ErrDenied (a server without FCALL, an ACL user without it).
		return &ServerError{Err: err}
	}
	return nil
}

// functionsError turns the reply of a server without Redis Functions into
// ErrNoFunctions. Redis answers "unknown command 'FCALL'" (or 'FUNCTION',
// when the library was being loaded); Redis 6 quotes with backticks. An
// ACL user that may not run them is answered "NOPERM ... 'fcall' command"
// (or 'function|load').
func functionsError(err error) error {
	msg := strings.ToLower(err.Error())
	if strings.Contains(msg, "unknown command") && (strings.Contains(msg, "fcall") || strings.Contains(msg, "function")) ||
		strings.Contains(msg, "noperm") && (strings.Contains(msg, "'fcall'") || strings.Contains(msg, "'function|")) {
		return fmt.Errorf("%w: %w", ErrNoFunctions, err)
	}
	return err
}
