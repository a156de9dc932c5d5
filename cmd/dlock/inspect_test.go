//go:build unix

package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// status --json and ls --json describe a lock held by run: its holder's
// metadata, age, TTL and fence; the text forms say the same for people.
func TestStatusAndList(t *testing.T) {
	t.Parallel()
	name, file := lockName(t)+":nightly", filepath.Join(t.TempDir(), "child")
	p := startDlock(t, nil, runArgs([]string{"--ttl", "5s", "--metadata", "job=nightly"}, name, "signals", file, "0")...)
	fence, _ := strconv.ParseUint(waitForLine(t, file, "ready ")[2], 10, 64)
	pid := strconv.Itoa(p.cmd.Process.Pid)

	r := dlockRun(t, nil, "status", "--json", name)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("status --json: code %d, stderr %q", r.code, r.stderr)
	}
	var info infoJSON
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil {
		t.Fatalf("status --json output %q: %v", r.stdout, err)
	}
	checkInfo(t, info, name, fence, pid)

	r = dlockRun(t, nil, "status", name)
	for _, want := range []string{"name:", name, "kind:", "lock", "held by:", "pid " + pid + " (running ", "expires in ",
		"command:", " signals " + file + " 0", "metadata:", "job=nightly", "fence:", strconv.FormatUint(fence, 10)} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status does not say %q:\n%s", want, r.stdout)
		}
	}

	pattern := lockName(t) + ":*"
	r = dlockRun(t, nil, "ls", "--json", pattern)
	var infos []infoJSON
	if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || r.code != 0 {
		t.Fatalf("ls --json: code %d, output %q: %v", r.code, r.stdout, err)
	}
	if len(infos) != 1 {
		t.Fatalf("ls --json %s listed %d locks, want 1: %s", pattern, len(infos), r.stdout)
	}
	checkInfo(t, infos[0], name, fence, pid)

	r = dlockRun(t, nil, "ls", pattern)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "NAME ") || !strings.HasPrefix(lines[1], name+" ") ||
		!strings.Contains(lines[1], "pid "+pid) || !strings.Contains(lines[1], " "+strconv.FormatUint(fence, 10)+" ") ||
		!strings.HasPrefix(lines[0], "NAME") || !strings.HasSuffix(lines[0], "WAITERS") {
		t.Errorf("ls:\n%s", r.stdout)
	}

	p.signal(t, syscall.SIGTERM)
	p.wait(t)

	r = dlockRun(t, nil, "status", "--json", name)
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil || r.code != 0 {
		t.Fatalf("status --json of a free name: code %d, %q: %v", r.code, r.stdout, err)
	}
	if info.Kind != "free" || info.Held || len(info.Holders) != 0 || info.Fence != fence || !strings.Contains(r.stdout, `"holders": []`) {
		t.Errorf("status --json of a free name: %s", r.stdout)
	}
	r = dlockRun(t, nil, "ls", pattern)
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "no locks matching") {
		t.Errorf("ls of nothing: code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func checkInfo(t *testing.T, info infoJSON, name string, fence uint64, pid string) {
	t.Helper()
	if info.Name != name || info.Kind != "lock" || !info.Held || info.Fence != fence || len(info.Holders) != 1 {
		t.Fatalf("record %+v", info)
	}
	h := info.Holders[0]
	host, _ := os.Hostname()
	if h.Mode != "exclusive" || h.Count != 1 || h.Fence != fence || h.Meta["pid"] != pid || h.Meta["host"] != host ||
		h.Meta["job"] != "nightly" || h.Meta["user"] == "" || !strings.Contains(h.Meta["cmd"], "signals") {
		t.Errorf("holder %+v", h)
	}
	if h.TTLMS <= 0 || h.TTLMS > 5000 || h.AgeMS < 0 || h.AgeMS > 60_000 || time.Since(h.Since) > time.Minute {
		t.Errorf("holder times: since %v, age %dms, ttl %dms", h.Since, h.AgeMS, h.TTLMS)
	}
}

// ls --watch --json prints one listing per line each interval until
// interrupted, which is a normal end.
func TestListWatch(t *testing.T) {
	t.Parallel()
	p := startDlock(t, nil, "ls", "--watch", "--json", "--interval", "100ms", lockName(t)+"*")
	waitFor(t, "three listings", func() bool { return strings.Count(p.stdout.String(), "\n") >= 3 })
	p.signal(t, syscall.SIGINT)
	r := p.wait(t)
	if r.code != 0 || r.stderr != "" {
		t.Errorf("code %d, stderr %q", r.code, r.stderr)
	}
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var infos []infoJSON
		if err := json.Unmarshal([]byte(line), &infos); err != nil || len(infos) != 0 {
			t.Errorf("line %q: %v", line, err)
		}
	}
}

// ls lists the locks held: not a semaphore whose permits all ran out while
// its keys live on, which List still reports as in use.
func TestListLeavesOutNamesHeldByNobody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, name := libClient(t), lockName(t)
	if _, err := c.Semaphore(name, 2).TryAcquire(ctx, dlock.WithTTL(time.Second)); err != nil {
		t.Fatal(err)
	}
	// The keys outlive the permit, as a longer hold released since leaves
	// them.
	rdb := rawClient(t)
	for _, k := range []string{c.RedisKey(name), c.RedisKey(name) + ":holds"} {
		if err := rdb.PExpire(ctx, k, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the permit to run out", func() bool {
		infos, err := c.List(ctx, name)
		return err == nil && len(infos) == 1 && len(infos[0].Holders) == 0
	})
	r := dlockRun(t, nil, "ls", "--json", name)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("ls --json: code %d, stdout %q, stderr %q; want []", r.code, r.stdout, r.stderr)
	}
}

// A stopping signal ends status, release and ls with its exit code
// (128+N) while Redis has not answered, and Ctrl-\ never with Go's dump of
// its goroutines; it ends ls --watch, which has no other end, with 0.
func TestInspectionStoppedBySignals(t *testing.T) {
	t.Parallel()
	// A server that takes connections and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	defer func() {
		ln.Close()
		for c := range accepted {
			c.Close()
		}
	}()
	silent := "redis://" + ln.Addr().String()
	for _, tc := range []struct {
		args []string
		sig  syscall.Signal
	}{
		{[]string{"status", "--redis", silent, "x"}, syscall.SIGQUIT},
		{[]string{"release", "--force", "--redis", silent, "x"}, syscall.SIGINT},
		{[]string{"ls", "--redis", silent}, syscall.SIGTERM},
	} {
		p := startDlock(t, nil, tc.args...)
		select {
		case <-accepted:
		case <-time.After(procTimeout):
			t.Fatalf("%s never connected", tc.args[0])
		}
		p.signal(t, tc.sig)
		r := p.wait(t)
		if r.code != 128+int(tc.sig) || !strings.Contains(r.stderr, "interrupted by "+sigName(tc.sig)) || strings.Contains(r.stderr, "goroutine ") {
			t.Errorf("%s, %v: exit code %d, stderr %q; want %d, interrupted", tc.args[0], sigName(tc.sig), r.code, r.stderr, 128+int(tc.sig))
		}
	}
	p := startDlock(t, nil, "ls", "--watch", "--interval", "100ms", lockName(t)+"*")
	waitFor(t, "a listing", func() bool { return p.stderr.String() != "" || p.stdout.String() != "" })
	p.signal(t, syscall.SIGQUIT)
	if r := p.wait(t); r.code != 0 || strings.Contains(r.stderr, "goroutine ") {
		t.Errorf("ls --watch, SIGQUIT: exit code %d, stderr %q; want 0", r.code, r.stderr)
	}
}

// status says that a fence counter holding data dlock did not write is
// not a fence, rather than "none recorded"; a read hold, which needs no
// fence, is still taken.
func TestStatusForeignFenceCounter(t *testing.T) {
	t.Parallel()
	rdb := rawClient(t)
	ctx := context.Background()
	name := lockName(t)
	key := "dlock:{" + name + "}:fence"
	if err := rdb.Set(ctx, key, "notanumber", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	defer rdb.Del(ctx, key)
	want := "fence:    unknown: its counter \"" + key + "\" holds data dlock did not write (a plain or --write run of the name is refused)\n"
	r := dlockRun(t, nil, "status", name)
	if r.code != 0 || !strings.Contains(r.stdout, want) || strings.Contains(r.stdout, "none recorded") {
		t.Errorf("status: code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// statusJSON returns the fence and fence_foreign of status --json.
	statusJSON := func() (uint64, bool) {
		t.Helper()
		r := dlockRun(t, nil, "status", "--json", name)
		var info infoJSON
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &info) != nil {
			t.Fatalf("status --json: code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		return info.Fence, info.FenceForeign
	}
	if fence, foreign := statusJSON(); fence != 0 || !foreign {
		t.Errorf("status --json: fence %d, fence_foreign %v; want 0, true", fence, foreign)
	}
	if r := dlockRun(t, nil, runArgs([]string{"--shared"}, name, "exit", "0")...); r.code != 0 {
		t.Errorf("run --shared: code %d, stderr %q", r.code, r.stderr)
	}
	if r := dlockRun(t, nil, "status", name); !strings.Contains(r.stdout, want) {
		t.Errorf("status after a read hold: %q", r.stdout)
	}
	// A number at 2^53 or past it is not a fence dlock issues either: its
	// scripts refuse it.
	if err := rdb.Set(ctx, key, "9007199254740993", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if r := dlockRun(t, nil, "status", name); !strings.Contains(r.stdout, want) {
		t.Errorf("status with a counter past 2^53: %q", r.stdout)
	}
	if fence, foreign := statusJSON(); fence != 0 || !foreign {
		t.Errorf("status --json with a counter past 2^53: fence %d, fence_foreign %v; want 0, true", fence, foreign)
	}
	if r := dlockRun(t, nil, runArgs(nil, name, "exit", "0")...); r.code != exitUsage {
		t.Errorf("run with a counter past 2^53: code %d, stderr %q", r.code, r.stderr)
	}
	// A counter dlock wrote is a fence, and a name without one has none.
	if err := rdb.Set(ctx, key, "17", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if r := dlockRun(t, nil, "status", name); !strings.Contains(r.stdout, "fence:    17 (the newest issued)\n") {
		t.Errorf("status with fence 17: %q", r.stdout)
	}
	if fence, foreign := statusJSON(); fence != 17 || foreign {
		t.Errorf("status --json with fence 17: fence %d, fence_foreign %v; want 17, false", fence, foreign)
	}
	if r := dlockRun(t, nil, "status", name+":other"); !strings.Contains(r.stdout, "fence:    0 (none recorded)\n") {
		t.Errorf("status of a name never locked: %q", r.stdout)
	}
}

// ls --interval without --watch, which it would not change, is code 64.
func TestListIntervalWithoutWatch(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"ls", "--interval", "5s"}, {"ls", "--json", lockName(t) + "*", "--interval=1s"}} {
		r := dlockRun(t, nil, args...)
		checkOneLine(t, r, exitUsage, "dlock ls: --interval goes with --watch: it says how often --watch lists (see 'dlock ls --help')")
	}
	// Each listing walks the keys: a tight loop would load Redis for
	// nothing a reader could see.
	for _, interval := range []string{"0s", "1ns", "99ms", "-1s"} {
		r := dlockRun(t, nil, "ls", "--watch", "--interval", interval)
		checkOneLine(t, r, exitUsage, "--interval "+interval+" is below the least, 100ms")
	}
}

// ls --watch started while Redis cannot be reached shows why and tries
// again each interval, as it does once it has listed, and lists once Redis
// answers; a refusal at the start ends it, as it ends a single ls.
func TestListWatchWaitsForRedisToBeReachable(t *testing.T) {
	t.Parallel()
	addr := closedAddr(t)
	p := startDlock(t, []string{"DLOCK_REDIS=redis://" + addr}, "ls", "--watch", "--json", "--interval", "100ms", lockName(t)+"*")
	waitFor(t, "two failed listings", func() bool {
		return strings.Count(p.stderr.String(), "connection refused; check --redis or DLOCK_REDIS, and that Redis is running (retrying)\n") >= 2
	})
	// Redis comes up at the address: a proxy to the shared server.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the address was taken meanwhile: %v", err)
	}
	redistest.ServeCutProxy(t, ln, strings.TrimPrefix(redisURL, "redis://"))
	waitFor(t, "a listing", func() bool { return strings.Contains(p.stdout.String(), "[]\n") })
	p.signal(t, syscall.SIGINT)
	if r := p.wait(t); r.code != 0 || !strings.HasPrefix(r.stdout, "[]\n") {
		t.Errorf("code %d, stdout %q; want 0, listings", r.code, r.stdout)
	}
	r := dlockRun(t, []string{"DLOCK_REDIS=redis://nobody:wrong@" + strings.TrimPrefix(redisURL, "redis://")}, "ls", "--watch", "--interval", "100ms")
	checkOneLine(t, r, exitDenied, "check the user and password in the URL, or DLOCK_PASSWORD")
	// So do sentinels that cannot be reached.
	p = startDlock(t, []string{"DLOCK_REDIS=redis-sentinel://" + closedAddr(t) + "/mymaster"}, "ls", "--watch", "--interval", "100ms")
	waitFor(t, "two failed listings", func() bool {
		return strings.Count(p.stdout.String(), "all sentinels specified in configuration are unreachable") >= 2
	})
	p.signal(t, syscall.SIGINT)
	if r := p.wait(t); r.code != 0 {
		t.Errorf("sentinels: code %d, stderr %q; want 0", r.code, r.stderr)
	}
}

// release --force of a free name removes nothing and is not an error.
func TestReleaseFree(t *testing.T) {
	t.Parallel()
	r := dlockRun(t, nil, "release", "--force", lockName(t))
	if r.code != 0 || !strings.Contains(r.stdout, "was not held; nothing was removed") {
		t.Errorf("code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = dlockRun(t, nil, "release", "--force", "--json", lockName(t))
	var info infoJSON
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil || r.code != 0 || info.Held {
		t.Errorf("--json: code %d, %q: %v", r.code, r.stdout, err)
	}
}

// status and ls fail (70) when their report cannot be written (a full
// disk), as their --json forms do: they exited 0 with nothing written,
// which a script took for "no locks".
func TestAReportThatCannotBeWrittenFails(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	c := libClient(t)
	for _, args := range [][]string{{"status", name}, {"ls", name}, {"status", "--json", name}, {"ls", "--json", name}} {
		if _, err := c.TryLock(context.Background(), name, dlock.WithTTL(time.Minute)); err != nil && !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatal(err)
		}
		var stderr strings.Builder
		a := &app{stdout: fullWriter{}, stderr: &stderr, lookupEnv: func(k string) (string, bool) {
			if k == "DLOCK_REDIS" {
				return redisURL, true
			}
			return "", false
		}}
		if code := a.main(args); code != exitInternal || !strings.Contains(stderr.String(), "no space left on device") {
			t.Errorf("%s: code %d, stderr %q; want %d and the write's error", args[0], code, stderr.String(), exitInternal)
		}
	}
}

// ls --watch ends (70) when a listing cannot be written (a full disk), as
// a single ls does: it listed on and on, every interval, writing nothing
// and saying nothing.
func TestAWatchThatCannotWriteFails(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	if _, err := libClient(t).TryLock(context.Background(), name, dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"ls", "--watch", "--interval", "100ms", name}, {"ls", "--watch", "--json", "--interval", "100ms", name}} {
		var stderr strings.Builder
		a := &app{stdout: fullWriter{}, stderr: &stderr, lookupEnv: env("DLOCK_REDIS", redisURL)}
		done := make(chan int, 1)
		go func() { done <- a.main(args) }()
		select {
		case code := <-done:
			if code != exitInternal || !strings.Contains(stderr.String(), "no space left on device") {
				t.Errorf("%q: code %d, stderr %q; want %d and the write's error", args, code, stderr.String(), exitInternal)
			}
		case <-time.After(procTimeout):
			t.Fatalf("%q: still listing %v after its first listing could not be written", args, procTimeout)
		}
	}
}

// release --force that freed the lock exits 0 when what it removed cannot
// be printed, saying so on stderr: it exited 70, and a script took the
// release for failed.
func TestAReleaseThatCannotBePrintedSucceeds(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	c := libClient(t)
	for _, args := range [][]string{{"release", "--force", name}, {"release", "--force", "--json", name}} {
		if _, err := c.TryLock(context.Background(), name, dlock.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		a := &app{stdout: fullWriter{}, stderr: &stderr, lookupEnv: env("DLOCK_REDIS", redisURL)}
		code := a.main(args)
		if want := "dlock release: '" + name + "' is free, but what was removed could not be printed: no space left on device\n"; code != 0 || stderr.String() != want {
			t.Errorf("%q: code %d, stderr %q; want 0 and %q", args, code, stderr.String(), want)
		}
		if !isFree(t, c, name) {
			t.Errorf("%q: the lock is still held", args)
		}
	}
}

// Help that cannot be written fails (70), as version does: it exited 0.
func TestHelpThatCannotBeWrittenFails(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}, {"help", "run"}, {"--help", "run"}, {"run", "--help"}, {"status", "-h"}, {"--redis", "redis://x", "ls", "--help"}, {"version"}} {
		var stderr strings.Builder
		a := &app{stdout: fullWriter{}, stderr: &stderr, lookupEnv: env()}
		if code := a.main(args); code != exitInternal || !strings.Contains(stderr.String(), "no space left on device") {
			t.Errorf("%q: code %d, stderr %q; want %d and the write's error", args, code, stderr.String(), exitInternal)
		}
	}
}

// fullWriter fails every write, as a full disk does.
type fullWriter struct{}

func (fullWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// Every command has --help with its flags and examples, on stdout.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, c := range commands {
		r := dlockRun(t, nil, c.name, "--help")
		if r.code != 0 || r.stderr != "" || !strings.HasPrefix(r.stdout, "Usage: dlock "+c.name) {
			t.Errorf("%s --help: code %d, stderr %q, stdout %q", c.name, r.code, r.stderr, r.stdout)
		}
		if c.name != "version" && !strings.Contains(r.stdout, "Examples:") {
			t.Errorf("%s --help has no examples", c.name)
		}
		// Every flag the command takes is in its help.
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		var conn connFlags
		if c.conn {
			conn.register(fs)
		}
		c.flags(fs)
		fs.VisitAll(func(f *flag.Flag) {
			dashes := "--"
			if len(f.Name) == 1 {
				dashes = "-"
			}
			if !strings.Contains(r.stdout, dashes+f.Name) {
				t.Errorf("%s --help does not mention %s%s", c.name, dashes, f.Name)
			}
		})
	}
	r := dlockRun(t, nil, "run", "--help")
	for _, code := range []int{exitUsage, exitUnavailable, exitNotObtained, exitLost, exitDenied, exitCannotExec, exitNotFound} {
		if !strings.Contains(r.stdout, "\n  "+strconv.Itoa(code)+" ") {
			t.Errorf("run --help does not document exit code %d", code)
		}
	}
	// The exit codes say what docs/cli.md's table says.
	for _, want := range []string{"holds other data", "another kind of lock", "a database or\n           cluster the server does not have",
		"--wait ran out", "a wrong or missing password", "a missing permission (NOPERM)", "a TLS certificate refused"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("run --help's exit codes do not say %q", want)
		}
	}
	// The other commands that use Redis list the codes they can exit with,
	// not run's own (they listed none).
	for _, name := range []string{"status", "ls", "release"} {
		r := dlockRun(t, nil, name, "--help")
		for _, code := range []string{"0", "128+N", "64", "69", "70", "78"} {
			if !strings.Contains(r.stdout, "\nExit codes:\n") || !strings.Contains(r.stdout, "\n  "+code+" ") {
				t.Errorf("%s --help does not document exit code %s", name, code)
			}
		}
		for _, code := range []string{"1-255", "73", "74", "126", "127"} {
			if strings.Contains(r.stdout, "\n  "+code+" ") {
				t.Errorf("%s --help documents run's exit code %s", name, code)
			}
		}
	}
	for _, name := range []string{"version", "help"} {
		if r := dlockRun(t, nil, name, "--help"); strings.Contains(r.stdout, "Exit codes:") {
			t.Errorf("%s --help lists the exit codes of the commands that use Redis", name)
		}
	}
	for _, args := range [][]string{{"--help"}, {"help"}, {"-h"}} {
		r := dlockRun(t, nil, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "Commands:") || !strings.Contains(r.stdout, "Exit codes:") {
			t.Errorf("%v: code %d, stdout %q", args, r.code, r.stdout)
		}
	}
	if r := dlockRun(t, nil, "help", "ls"); r.code != 0 || !strings.HasPrefix(r.stdout, "Usage: dlock ls") {
		t.Errorf("help ls: code %d, stdout %q", r.code, r.stdout)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		r := dlockRun(t, nil, args...)
		if r.code != 0 || !strings.HasPrefix(r.stdout, "dlock ") || !strings.Contains(r.stdout, "go1.") {
			t.Errorf("%v: code %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
}

// --version with anything after it is bad usage (64), as version with an
// argument is: `dlock --version run x -- true` printed the version and
// exited 0, and `dlock version extra` exited 64. Connection flags before
// it, or before version, are global and ignored (an alias may put them
// there).
func TestVersionFlagTakesNoArguments(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--version", "run", "x", "--", "true"}, `dlock: unexpected argument "run" after --version (see 'dlock version --help')`},
		{[]string{"--version", "extra"}, `unexpected argument "extra" after --version`},
		{[]string{"--redis", redisURL, "--version", "ls"}, `unexpected argument "ls" after --version`},
		{[]string{"version", "extra"}, `dlock version: unexpected argument "extra"`},
	} {
		r := dlockRun(t, nil, tc.args...)
		checkOneLine(t, r, exitUsage, tc.want)
	}
	for _, args := range [][]string{{"--redis", redisURL, "--version"}, {"--version", "--redis", redisURL}, {"--redis", redisURL, "version"}, {"-version", "--"}} {
		r := dlockRun(t, nil, args...)
		if r.code != 0 || !strings.HasPrefix(r.stdout, "dlock ") || r.stderr != "" {
			t.Errorf("%q: code %d, stdout %q, stderr %q; want 0 and the version", args, r.code, r.stdout, r.stderr)
		}
	}
}

// `dlock --help COMMAND` (or -h) shows COMMAND's help, as `dlock help
// COMMAND` and `dlock COMMAND --help` do; it showed the overview. An
// unknown COMMAND is bad usage, as it is for help. A help flag shows help
// beside a flag dlock does not know, wherever each stands before the
// command's `--` (`--help --bogus run` showed the overview, `--bogus
// --help` and `run --bogus --help NAME -- COMMAND` were bad usage); a
// --help after `--` is the command's.
func TestHelpFlagBeforeACommand(t *testing.T) {
	t.Parallel()
	for _, c := range commands {
		want := dlockRun(t, nil, "help", c.name)
		if want.code != 0 || !strings.HasPrefix(want.stdout, "Usage: dlock "+c.name) {
			t.Fatalf("help %s: code %d, stdout %q", c.name, want.code, want.stdout)
		}
		for _, args := range [][]string{
			{"--help", c.name},
			{"-h", c.name},
			{"-help", c.name, "x"},
			{"--redis", redisURL, "--help", c.name},
			{"--help", "--redis", redisURL, c.name},
			{c.name, "--help"},
			{"--help", "--bogus", c.name},
			{"--bogus", "--help", c.name},
			{"--bogus", c.name, "--help"},
			{c.name, "--bogus", "--help"},
			{c.name, "--help", "--bogus"},
		} {
			r := dlockRun(t, nil, args...)
			if r.code != 0 || r.stderr != "" || r.stdout != want.stdout {
				t.Errorf("%q: code %d, stderr %q, stdout %.60q…; want 0 and the help of %s", args, r.code, r.stderr, r.stdout, c.name)
			}
		}
	}
	r := dlockRun(t, nil, "--help", "run", "job", "--", "true")
	if want := dlockRun(t, nil, "run", "--help", "job", "--", "true"); r.code != 0 || r.stdout != want.stdout {
		t.Errorf("--help run job -- true: code %d, stdout %.60q…; want 0 and run's help", r.code, r.stdout)
	}
	r = dlockRun(t, nil, "run", "--bogus", "--help", "job", "--", "true")
	if want := dlockRun(t, nil, "run", "--help"); r.code != 0 || r.stdout != want.stdout {
		t.Errorf("run --bogus --help job -- true: code %d, stdout %.60q…; want 0 and run's help", r.code, r.stdout)
	}
	overview := dlockRun(t, nil, "--help")
	for _, args := range [][]string{{"--bogus", "--help"}, {"--help", "--bogus"}, {"-h", "--bogus=1", "--also"}} {
		if r := dlockRun(t, nil, args...); r.code != 0 || r.stdout != overview.stdout {
			t.Errorf("%q: code %d, stdout %.60q…; want 0 and the overview", args, r.code, r.stdout)
		}
	}
	// After `--`, --help is the command's: beside a flag dlock does not
	// know, run is bad usage, not help.
	checkOneLine(t, dlockRun(t, nil, "run", "--bogus", "job", "--", "sh", "--help"), exitUsage, "flag provided but not defined: --bogus")
	checkOneLine(t, dlockRun(t, nil, "--help", "frobnicate"), exitUsage, `unknown command "frobnicate"`)
	checkOneLine(t, dlockRun(t, nil, "help", "frobnicate"), exitUsage, `unknown command "frobnicate"`)
}

// Names and metadata are anyone's text: status and ls write the
// characters a terminal would act on (ESC, tabs, newlines) as escapes, so
// that a lock cannot redraw the screen or shift a table's columns.
func TestStatusAndListEscapeControlCharacters(t *testing.T) {
	t.Parallel()
	name := lockName(t) + "\tx"
	l, err := libClient(t).TryLock(context.Background(), name, dlock.WithTTL(time.Minute),
		dlock.WithMetadata(`{"host":"h\u001b[31m","cmd":"rm\u001b[2J","k":"v\u0007"}`), dlock.WithOwner("o\u001bwn"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	for _, args := range [][]string{{"status", name}, {"ls", lockName(t) + "*"}} {
		r := dlockRun(t, nil, args...)
		if r.code != 0 {
			t.Fatalf("%v: code %d, stderr %q", args, r.code, r.stderr)
		}
		if strings.ContainsAny(r.stdout, "\x1b\x07") {
			t.Errorf("%v wrote control characters: %q", args, r.stdout)
		}
		if !strings.Contains(r.stdout, `\x1b`) {
			t.Errorf("%v does not show the escapes: %q", args, r.stdout)
		}
		if !strings.Contains(r.stdout, lockName(t)+`\tx`) {
			t.Errorf("%v does not show the name's tab as an escape: %q", args, r.stdout)
		}
	}
}

// A name of wide characters keeps ls's columns: they line up by the cells a
// terminal draws, two for each of its characters.
func TestNamesOfWideCharactersKeepTheColumns(t *testing.T) {
	t.Parallel()
	name := lockName(t) + ":日本語"
	c := libClient(t)
	if _, err := c.TryLock(context.Background(), name, dlock.WithTTL(time.Minute), dlock.WithMetadata(`{"host":"h","pid":"1"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryLock(context.Background(), lockName(t)+":a", dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	r := dlockRun(t, nil, "ls", lockName(t)+"*")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 3 {
		t.Fatalf("ls: code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// kindAt returns the cell at which line's second column starts.
	kindAt := func(line, first string) int {
		rest := strings.TrimLeft(strings.TrimPrefix(line, first), " ")
		return displayWidth(line[:len(line)-len(rest)])
	}
	want := kindAt(lines[0], "NAME")
	for i, n := range []string{lockName(t) + ":a", name} {
		if !strings.HasPrefix(lines[i+1], n+" ") || kindAt(lines[i+1], n) != want {
			t.Errorf("ls: the kind of %q does not start under KIND, at cell %d:\n%s", n, want, r.stdout)
		}
	}
}

// A name that is not UTF-8 keeps ls's columns, shows its bytes as escapes, and its JSON record carries its
// bytes in name_base64, which release --force takes back.
func TestNamesThatAreNotUTF8(t *testing.T) {
	t.Parallel()
	name := lockName(t) + "\xff\xfe"
	c := libClient(t)
	if _, err := c.TryLock(context.Background(), name, dlock.WithTTL(time.Minute), dlock.WithMetadata(`{"host":"h","pid":"1"}`)); err != nil {
		t.Fatal(err)
	}
	r := dlockRun(t, nil, "ls", lockName(t)+"*")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[1], lockName(t)+`\xff\xfe  lock  h pid 1  `) ||
		strings.Index(lines[0], "KIND") != strings.Index(lines[1], "lock") || !utf8.ValidString(r.stdout) {
		t.Errorf("ls: code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = dlockRun(t, nil, "status", "--json", name)
	var info infoJSON
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil || r.code != 0 {
		t.Fatalf("status --json: code %d, %q: %v", r.code, r.stdout, err)
	}
	raw, err := base64.StdEncoding.DecodeString(info.NameBase64)
	if err != nil || string(raw) != name || info.Name != lockName(t)+"\ufffd\ufffd" {
		t.Fatalf("status --json: name %q, name_base64 %q", info.Name, info.NameBase64)
	}
	r = dlockRun(t, nil, "release", "--force", string(raw))
	if r.code != 0 || !isFree(t, c, name) {
		t.Errorf("release --force of the name from name_base64: code %d, stderr %q", r.code, r.stderr)
	}
	if r := dlockRun(t, nil, "status", "--json", lockName(t)); r.code != 0 || strings.Contains(r.stdout, "name_base64") {
		t.Errorf("a UTF-8 name has name_base64: %s", r.stdout)
	}
}

// ls on a server that has not run the inspection script yet (a fresh
// server, a restarted one, a replica just promoted) sends the script's
// text once, not once per name: the first pipeline, by EVALSHA, is
// answered NOSCRIPT for every name, and a second that sent the whole
// script (some 35 KB) for each of them wrote about 1.9 GB for 54,000
// locks, which ran past go-redis's write timeout: ls failed with code 69,
// blaming the first name and telling to check that Redis runs.
func TestListOnAServerThatDoesNotKnowTheScriptSendsItOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	locks := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = locks.Close() })
	const n = 200
	for i := range n {
		if _, err := locks.TryLock(context.Background(), "job:"+strconv.Itoa(i), dlock.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	srv.Do(t, "SCRIPT", "FLUSH")
	srv.Do(t, "CONFIG", "RESETSTAT")
	r := dlockRun(t, []string{"DLOCK_REDIS=redis://" + srv.Addr()}, "ls", "--json")
	var infos []infoJSON
	if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || r.code != 0 || len(infos) != n {
		t.Fatalf("ls --json: code %d, %d records, stderr %q: %v", r.code, len(infos), r.stderr, err)
	}
	if evals := srv.CommandStat(t, "eval", "calls"); evals > 1 {
		t.Errorf("ls of %d locks sent EVAL, with the script's text, %d times; want it once", n, evals)
	}
}

// A very long name (a kilobyte, say) is shown whole on its own line of ls,
// and does not widen the NAME column of every other line: each was padded
// to its width, so that 54,000 locks beside one such name made 60 MB of
// table, every line wrapped on a terminal, and ls --watch, which cuts its
// lines to the terminal's width, showed the names alone, without their
// kind, holder or expiry, whichever lines the terminal had room for.
func TestALongNameDoesNotWidenEveryLineOfLs(t *testing.T) {
	t.Parallel()
	c := libClient(t)
	short, long := lockName(t)+":a", lockName(t)+":"+strings.Repeat("x", 1000)
	for _, name := range []string{short, long} {
		if _, err := c.TryLock(context.Background(), name, dlock.WithTTL(time.Minute), dlock.WithMetadata(`{"host":"h","pid":"1"}`)); err != nil {
			t.Fatal(err)
		}
	}
	r := dlockRun(t, nil, "ls", lockName(t)+":*")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 3 {
		t.Fatalf("ls: code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if !strings.HasPrefix(lines[1], short+" ") || len(lines[1]) > 200 || len(lines[0]) > 200 {
		t.Errorf("ls: the lines of the header and of %q are %d and %d bytes wide, padded to the long name's width", short, len(lines[0]), len(lines[1]))
	}
	if !strings.HasPrefix(lines[2], long+" ") || !strings.Contains(lines[2], " lock ") || !strings.Contains(lines[2], "h pid 1") {
		t.Errorf("ls: the long name's line does not show it whole, with its kind and holder: %q", lines[2])
	}
}
