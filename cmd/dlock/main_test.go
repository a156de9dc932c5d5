//go:build unix

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The tests build the dlock binary once and run it as a child process
// against real Redis servers. The commands it runs are this test binary
// again, in one of the helper modes of childMain.

const (
	// childEnv marks a run of this test binary as a helper command.
	childEnv = "DLOCK_TEST_CHILD"
	// procTimeout bounds every dlock process a test runs.
	procTimeout = 20 * time.Second
	// pollEvery is how often a test looks at a file or output it waits for.
	pollEvery = 10 * time.Millisecond
)

var (
	dlockBin  string // the binary under test
	helperBin string // this test binary, run as a child command
	redisURL  string // the server most tests share, on names of their own
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain(os.Args[1:]))
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "dlock-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	dlockBin = filepath.Join(dir, "dlock")
	args := []string{"build", "-o", dlockBin}
	if raceEnabled {
		args = append(args, "-race") // the binary's goroutines are checked too
	}
	if out, err := exec.Command(goTool(), append(args, ".")...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building dlock: %v\n%s", err, out)
		return 1
	}
	if helperBin, err = os.Executable(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv, stop, err := redistest.StartForMain()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	redisURL = "redis://" + srv.Addr()
	return redistest.RunWithoutLeaks(m)
}

// goTool returns the go command of the toolchain running the tests.
func goTool() string {
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return "go"
}

// childMain is a helper command:
//
//	job FILE MS          append "start PID FENCE", sleep MS, append "end PID FENCE"
//	exit N               exit with code N
//	selfkill             die of SIGKILL
//	env                  print DLOCK_NAME, DLOCK_TOKEN and DLOCK_FENCE
//	printenv NAME...     print NAME=VALUE for each variable NAME, set or not
//	signals FILE CODE    append "ready PID FENCE TOKEN"; on SIGINT, SIGTERM or
//	                     SIGHUP append "got SIGNAL" and exit with CODE
//	stubborn FILE        as signals, but never exit: record each signal
func childMain(args []string) int {
	if len(args) == 0 {
		return 2
	}
	switch args[0] {
	case "job":
		ms, _ := strconv.Atoi(args[2])
		appendLine(args[1], fmt.Sprintf("start %d %s", os.Getpid(), os.Getenv("DLOCK_FENCE")))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		appendLine(args[1], fmt.Sprintf("end %d %s", os.Getpid(), os.Getenv("DLOCK_FENCE")))
		return 0
	case "exit":
		n, _ := strconv.Atoi(args[1])
		return n
	case "selfkill":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	case "env":
		fmt.Printf("DLOCK_NAME=%s\nDLOCK_TOKEN=%s\nDLOCK_FENCE=%s\n", os.Getenv("DLOCK_NAME"), os.Getenv("DLOCK_TOKEN"), os.Getenv("DLOCK_FENCE"))
		return 0
	case "printenv":
		for _, name := range args[1:] {
			fmt.Printf("%s=%s\n", name, os.Getenv(name))
		}
		return 0
	case "signals", "stubborn":
		c := make(chan os.Signal, 8)
		signal.Notify(c, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		appendLine(args[1], fmt.Sprintf("ready %d %s %s", os.Getpid(), os.Getenv("DLOCK_FENCE"), os.Getenv("DLOCK_TOKEN")))
		for sig := range c {
			appendLine(args[1], "got "+sigName(sig))
			if args[0] == "signals" {
				code, _ := strconv.Atoi(args[2])
				return code
			}
		}
	}
	return 2
}

// appendLine appends one line to a file in a single write, so that lines
// of concurrent writers never interleave.
func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		panic(err)
	}
}

// proc is a dlock process started by a test.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr redistest.Buffer
	done           chan struct{}
	started        time.Time
	took           time.Duration // set when done closes
}

// result is how a dlock process ended.
type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

// baseEnv is the test's environment without DLOCK_ settings, with the
// shared server as DLOCK_REDIS and the helper mode on for the commands.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DLOCK_") {
			env = append(env, kv)
		}
	}
	// Race-enabled binaries sleep a second before exiting 0, unless told not to.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	return append(env, "DLOCK_REDIS="+redisURL, childEnv+"=1", "GORACE="+gorace)
}

// startDlock starts dlock with args and extra environment. It runs in a
// session of its own, with no controlling terminal, as under cron.
func startDlock(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startProc(t, env, dlockBin, args...)
}

// startProc starts a program as startDlock starts dlock: one that execs
// dlock in the end, such as a shell that sets dispositions first.
func startProc(t *testing.T, env []string, name string, args ...string) *proc {
	t.Helper()
	return startProcWith(t, env, &syscall.SysProcAttr{Setsid: true}, nil, name, args...)
}

// startProcWith starts a program as startProc does, with attr and stdin
// (nil for none) of the caller's choosing.
func startProcWith(t *testing.T, env []string, attr *syscall.SysProcAttr, stdin *os.File, name string, args ...string) *proc {
	t.Helper()
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command(name, args...)
	p.cmd.Env = append(baseEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.SysProcAttr = attr
	if stdin != nil {
		p.cmd.Stdin = stdin
	}
	p.cmd.WaitDelay = 5 * time.Second // a leftover child must not hold the pipes forever
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.took = time.Since(p.started)
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits for the process to exit, at most procTimeout.
func (p *proc) wait(t *testing.T) result {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(procTimeout):
		t.Fatalf("dlock %q still running after %v\nstderr: %s", p.cmd.Args[1:], procTimeout, p.stderr.String())
	}
	return result{code: p.cmd.ProcessState.ExitCode(), stdout: p.stdout.String(), stderr: p.stderr.String(), took: p.took}
}

func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// dlockRun runs dlock to its end.
func dlockRun(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return startDlock(t, env, args...).wait(t)
}

// helper returns the argv of a helper command.
func helper(args ...string) []string {
	return append([]string{helperBin}, args...)
}

// runArgs builds `run FLAGS... NAME -- HELPER ARGS...`.
func runArgs(flags []string, name string, helperArgs ...string) []string {
	args := append([]string{"run"}, flags...)
	args = append(args, name, "--")
	return append(args, helper(helperArgs...)...)
}

// closedAddr returns a loopback address where nothing listens, for now.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// waitFor polls until cond holds, at most procTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(procTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", procTimeout, what)
		}
		time.Sleep(pollEvery)
	}
}

// waitForLine waits until file holds a line that starts with prefix, and
// returns its fields.
func waitForLine(t *testing.T, file, prefix string) []string {
	t.Helper()
	var fields []string
	waitFor(t, fmt.Sprintf("%q in %s", prefix, file), func() bool {
		data, _ := os.ReadFile(file)
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, prefix) {
				fields = strings.Fields(line)
				return true
			}
		}
		return false
	})
	return fields
}

// checkOneLine checks that a dlock failure said why in exactly one line
// on stderr, mentioning want, and printed nothing on stdout.
func checkOneLine(t *testing.T, r result, code int, want string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d; stderr: %s", r.code, code, r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "dlock") {
		t.Errorf("stderr is not one dlock line: %q", r.stderr)
	}
	if !strings.Contains(r.stderr, want) {
		t.Errorf("stderr %q does not say %q", r.stderr, want)
	}
	if r.stdout != "" {
		t.Errorf("stdout: %q, want nothing", r.stdout)
	}
}

// libClient returns a dlock client on the shared server, for a test to
// hold and inspect locks beside the command.
func libClient(t *testing.T) *dlock.Client {
	t.Helper()
	c := dlock.New(goredis.New(rawClient(t)))
	t.Cleanup(func() { _ = c.Close() }) // before the Redis client's
	return c
}

// rawClient returns a go-redis client on the shared server, closed with
// the test, for a test to write keys beside the command.
func rawClient(t *testing.T) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(redisURL, "redis://")})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// lockName returns a lock name of the test's own.
func lockName(t *testing.T) string {
	return strings.ReplaceAll(t.Name(), "/", ":")
}

// isFree reports whether nobody holds name.
func isFree(t *testing.T, c *dlock.Client, name string) bool {
	t.Helper()
	info, err := c.Inspect(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return len(info.Holders) == 0
}

// A flag the command does not know is reported as typed; typed with one
// dash it may be a name, which the message shows how to pass.
func TestUnknownFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "-x"}, "flag provided but not defined: -x; a NAME that starts with '-' goes after a `--`: dlock status -- -x (see 'dlock status --help')"},
		{[]string{"status", "--json", "-x=1"}, "flag provided but not defined: -x; a NAME that starts with '-' goes after a `--`: dlock status -- -x=1 "},
		{[]string{"release", "--force", "-x"}, "flag provided but not defined: -x; a NAME that starts with '-' goes after a `--`: dlock release --force -- -x "},
		{[]string{"ls", "-x*"}, "flag provided but not defined: -x*; a PATTERN that starts with '-' goes after a `--`: dlock ls -- '-x*' "},
		{runArgs([]string{"-x"}, "job", "exit", "0"), "flag provided but not defined: -x; a NAME that starts with '-' goes after a `--`: dlock run -- -x -- COMMAND "},
		{[]string{"status", "--bogus", "job"}, "flag provided but not defined: --bogus (see 'dlock status --help')"},
		{[]string{"-x", "status", "job"}, "dlock: flag provided but not defined: -x (see 'dlock --help')"},
	} {
		r := dlockRun(t, nil, tc.args...)
		checkOneLine(t, r, exitUsage, tc.want)
	}
	// The commands the hints give work.
	name := "-" + lockName(t)
	if r := dlockRun(t, nil, "status", "--", name); r.code != 0 || !strings.Contains(r.stdout, "name:     "+name+"\n") {
		t.Errorf("status -- %s: code %d, stdout %q, stderr %q", name, r.code, r.stdout, r.stderr)
	}
	if r := dlockRun(t, nil, append([]string{"run", "--", name, "--"}, helper("env")...)...); r.code != 0 || !strings.Contains(r.stdout, "DLOCK_NAME="+name+"\n") {
		t.Errorf("run -- %s -- COMMAND: code %d, stdout %q, stderr %q", name, r.code, r.stdout, r.stderr)
	}
	if r := dlockRun(t, nil, "ls", "--", name); r.code != 0 || !strings.Contains(r.stderr, "no locks matching") {
		t.Errorf("ls -- %s: code %d, stdout %q, stderr %q", name, r.code, r.stdout, r.stderr)
	}
	if r := dlockRun(t, nil, "release", "--force", "--", name); r.code != 0 || !strings.Contains(r.stdout, "was not held") {
		t.Errorf("release --force -- %s: code %d, stdout %q, stderr %q", name, r.code, r.stdout, r.stderr)
	}
}
