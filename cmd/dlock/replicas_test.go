//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// replicated starts a primary with one replica, and returns them, the
// environment that points run at the primary, and a dlock client on it,
// which has run the scripts of every kind there, so that each run's
// acquire goes once.
func replicated(t *testing.T) (*redistest.Replicated, []string, *dlock.Client) {
	t.Helper()
	rs := redistest.StartReplicated(t, 1, 0)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Primary.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() }) // before the Redis client's
	ctx := context.Background()
	rw, sem := c.RWMutex("scripts:rw"), c.Semaphore("scripts:sem", 2)
	for _, acquire := range []func(context.Context, ...dlock.Option) (*dlock.Lock, error){
		func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
			return c.TryLock(ctx, "scripts", opts...)
		},
		rw.TryRLock, rw.TryLock, sem.TryAcquire,
	} {
		l, err := acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return rs, []string{"DLOCK_REDIS=redis://" + rs.Primary.Addr()}, c
}

// waits returns how many WAITs srv has run.
func waits(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^cmdstat_wait:calls=(\d+),`).FindStringSubmatch(srv.Do(t, "INFO", "commandstats"))
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// kinds are the flags of each kind of run.
var kinds = [][]string{nil, {"--shared"}, {"--write"}, {"--semaphore", "2"}}

// With --replicas 1 on a primary with one replica, every kind of run,
// waiting or not, has its lock confirmed by WAIT, runs its command and
// leaves the name free.
func TestRunReplicasConfirmsTheLock(t *testing.T) {
	t.Parallel()
	rs, env, c := replicated(t)
	for i, kind := range kinds {
		for _, wait := range [][]string{{"--no-wait"}, nil} {
			flags := append(append([]string{"--replicas", "1"}, wait...), kind...)
			name := lockName(t) + ":" + strconv.Itoa(i) + ":" + strconv.Itoa(len(wait))
			before := waits(t, rs.Primary)
			r := dlockRun(t, env, runArgs(flags, name, "env")...)
			if r.code != 0 || !strings.Contains(r.stdout, "DLOCK_NAME="+name+"\n") {
				t.Errorf("%v: code %d, stdout %q, stderr %q", flags, r.code, r.stdout, r.stderr)
			}
			if after := waits(t, rs.Primary); after <= before {
				t.Errorf("%v: the primary ran no WAIT (%d before the run, %d after)", flags, before, after)
			}
			if !isFree(t, c, name) {
				t.Errorf("%v: %q is still held after the run", flags, name)
			}
		}
	}
}

// A lock that fewer replicas confirm than --replicas asks for is not run
// on: run gives back what it took and exits 69 saying why, of every kind,
// whether the replicas are fewer than asked for or one of them does not
// answer (paused), with --no-wait at once, and waiting once --wait runs
// out, having said on its waiting line what it waits for.
func TestRunReplicasNotConfirmedRunsNothing(t *testing.T) {
	t.Parallel()
	rs, env, c := replicated(t)
	ran := filepath.Join(t.TempDir(), "ran")
	notRun := func(t *testing.T, what string, name string) {
		t.Helper()
		if _, err := os.Stat(ran); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: the command ran without its lock confirmed", what)
		}
		if !isFree(t, c, name) {
			t.Errorf("%s: %q is left held", what, name)
		}
	}

	for i, kind := range kinds {
		flags := append([]string{"--no-wait", "--replicas", "2", "--replicas-timeout", "100ms"}, kind...)
		name := lockName(t) + ":beyond:" + strconv.Itoa(i)
		r := dlockRun(t, env, runArgs(flags, name, "job", ran, "0")...)
		checkOneLine(t, r, exitUnavailable, "1 of 2 replicas acknowledged within 100ms")
		if !strings.Contains(r.stderr, "--replicas") {
			t.Errorf("%v: the message %q does not name --replicas", flags, r.stderr)
		}
		notRun(t, strings.Join(flags, " "), name)
	}

	resume := rs.Replicas[0].PauseAWhile(t)
	defer resume()
	for i, kind := range kinds {
		flags := append([]string{"--no-wait", "--replicas", "1", "--replicas-timeout", "100ms"}, kind...)
		name := lockName(t) + ":paused:" + strconv.Itoa(i)
		r := dlockRun(t, env, runArgs(flags, name, "job", ran, "0")...)
		checkOneLine(t, r, exitUnavailable, "0 of 1 replicas acknowledged within 100ms")
		notRun(t, strings.Join(flags, " "), name)
	}
	flags := []string{"--wait", "1s", "--replicas", "1", "--replicas-timeout", "100ms"}
	name := lockName(t) + ":waiting"
	r := dlockRun(t, env, runArgs(flags, name, "job", ran, "0")...)
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	if r.code != exitUnavailable || r.stdout != "" || len(lines) != 2 ||
		!strings.HasPrefix(lines[0], "dlock: waiting for '"+name+"' — not confirmed by replicas (") ||
		!strings.Contains(lines[1], "gave up after waiting 1s (--wait)") || !strings.Contains(lines[1], "0 of 1 replicas acknowledged") ||
		!strings.Contains(lines[1], "--replicas") {
		t.Errorf("%v: code %d, stdout %q, stderr:\n%s\nwant %d, a waiting line and a reason that say that the replicas did not confirm the lock", flags, r.code, r.stdout, r.stderr, exitUnavailable)
	}
	notRun(t, strings.Join(flags, " "), name)
}

// A refresh that the replicas do not confirm does not extend the lock: it
// ends at its deadline, as one that Redis could not be reached to refresh,
// and run stops the command, exits 74 and frees the name that the
// unconfirmed refreshes kept taken on the primary. (The last refresh's failure,
// which the message gives, may be the lock's deadline that cut its WAIT
// short.)
func TestRunReplicasRefreshNotConfirmedIsALoss(t *testing.T) {
	t.Parallel()
	rs, env, c := replicated(t)
	name, file := lockName(t), filepath.Join(t.TempDir(), "child")
	p := startDlock(t, env, runArgs([]string{"--replicas", "1", "--ttl", "1s"}, name, "signals", file, "0")...)
	waitForLine(t, file, "ready ")
	resume := rs.Replicas[0].PauseAWhile(t)
	defer resume()
	r := p.wait(t)
	waitForLine(t, file, "got SIGTERM")
	if r.code != exitLost || !strings.Contains(r.stderr, "lost while the command ran") || !strings.Contains(r.stderr, "its deadline passed without a refresh") {
		t.Errorf("exit code %d (want %d), stderr:\n%s", r.code, exitLost, r.stderr)
	}
	// What the unconfirmed refreshes kept on the primary is given back.
	if !isFree(t, c, name) {
		t.Errorf("%q is left held after the loss", name)
	}
}

// The README's least-privileged ACL user may not run WAIT, which --replicas
// sends after each acquire and refresh: run exits 78 at once, waiting or
// not, with a hint that names WAIT (not "the keys and channels under the
// prefix, and the scripting commands", which the user has), and leaves the
// name free; the README says to grant WAIT for it.
func TestRunReplicasUserWithoutWait(t *testing.T) {
	t.Parallel()
	rs, _, c := replicated(t)
	rs.Primary.Do(t, append([]string{"ACL", "SETUSER", "locker"}, readmeACL(t)...)...)
	env := []string{"DLOCK_REDIS=redis://locker:s3cret@" + rs.Primary.Addr()}
	for i, flags := range [][]string{{"--no-wait"}, nil} {
		name := lockName(t) + ":" + strconv.Itoa(i)
		r := dlockRun(t, env, runArgs(append([]string{"--replicas", "1"}, flags...), name, "exit", "0")...)
		checkOneLine(t, r, exitDenied, "NOPERM")
		if !strings.Contains(r.stderr, "grant it WAIT (+wait)") {
			t.Errorf("%v: %s; want a hint that names WAIT", flags, r.stderr)
		}
		if !isFree(t, c, name) {
			t.Errorf("%v: %q is left held", flags, name)
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "with `WithReplicas` (`dlock run --replicas`), add `+wait`") {
		t.Error("the README does not say to grant the ACL user WAIT for WithReplicas")
	}
	// With it, the user runs with its lock confirmed.
	rs.Primary.Do(t, "ACL", "SETUSER", "locker", "+wait")
	for i, flags := range [][]string{{"--no-wait"}, nil} {
		name := lockName(t) + ":wait:" + strconv.Itoa(i)
		if r := dlockRun(t, env, runArgs(append([]string{"--replicas", "1"}, flags...), name, "exit", "0")...); r.code != 0 {
			t.Errorf("%v, granted WAIT: code %d, stderr %s", flags, r.code, r.stderr)
		}
	}
}

// Bad values of --replicas and --replicas-timeout are usage errors.
func TestRunReplicasUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--replicas", "0"}, "--replicas 0 must be at least 1"},
		{[]string{"--replicas", "-1"}, "--replicas -1 must be at least 1"},
		{[]string{"--replicas", "two"}, `invalid value "two" for flag --replicas: not a whole number of replicas (see`},
		{[]string{"--replicas", "99999999999999999999"}, `invalid value "99999999999999999999" for flag --replicas: out of range (at most`},
		{[]string{"--replicas", "-99999999999999999999"}, `invalid value "-99999999999999999999" for flag --replicas: must be at least 1`},
		{[]string{"--replicas-timeout", "1s"}, "--replicas-timeout is for --replicas"},
		{[]string{"--replicas", "1", "--replicas-timeout", "1"}, `invalid value "1" for flag --replicas-timeout: not a duration`},
		{[]string{"--replicas", "1", "--replicas-timeout", "0s"}, "--replicas-timeout 0s is too short; it must be at least 1ms"},
		{[]string{"--replicas", "1", "--replicas-timeout", "-1s"}, "--replicas-timeout -1s is too short"},
		{[]string{"--replicas", "1", "--replicas-timeout", "4s"}, "--replicas-timeout 4s is more than a third of --ttl (10s)"},
		{[]string{"--replicas", "1", "--ttl", "300ms", "--replicas-timeout", "101ms"}, "--replicas-timeout 101ms is more than a third of --ttl (300ms)"},
	} {
		r := dlockRun(t, nil, runArgs(tc.flags, lockName(t), "exit", "0")...)
		checkOneLine(t, r, exitUsage, tc.want)
	}
}

// Through Sentinel, a lock confirmed on the replica (--replicas 1) is
// still held once the primary is killed and Sentinel promotes the replica:
// a run started then waits, and gives up at the end of its --wait (73),
// never let in beside the first. The first run's command, stopped by a
// signal, exits with its own code.
func TestRunReplicasKeepsTheLockThroughAFailover(t *testing.T) {
	t.Parallel()
	rs := redistest.StartReplicated(t, 1, 3)
	env := []string{"DLOCK_REDIS=redis-sentinel://" + strings.Join(rs.SentinelAddrs(), ",") + "/" + rs.MasterName}
	name, file, ran := lockName(t), filepath.Join(t.TempDir(), "child"), filepath.Join(t.TempDir(), "ran")
	flags := []string{"--replicas", "1", "--ttl", "1m"}
	first := startDlock(t, env, runArgs(flags, name, "signals", file, "7")...)
	waitForLine(t, file, "ready ")

	rs.Primary.Kill(t)
	// Every sentinel names the new primary: the run asks any of them.
	waitFor(t, "every sentinel to name the promoted replica", func() bool {
		for _, s := range rs.Sentinels {
			if strings.HasSuffix(s.Do(t, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", rs.MasterName), "\n"+strconv.Itoa(rs.Primary.Port())) {
				return false
			}
		}
		return true
	})
	// The new primary has no replica: each attempt waits out its WAIT.
	// The first may fail (the new primary has not the scripts, see
	// replicated): the wait goes on, and ends as the lock held.
	r := dlockRun(t, env, runArgs(append([]string{"--wait", "3s"}, flags...), name, "job", ran, "0")...)
	if r.code != exitNotObtained || !strings.Contains(r.stderr, "gave up after waiting 3s (--wait)") {
		t.Errorf("a run after the failover: code %d, stderr:\n%s\nwant %d, the lock held", r.code, r.stderr, exitNotObtained)
	}
	if _, err := os.Stat(ran); !errors.Is(err, os.ErrNotExist) {
		t.Error("a second run ran beside the first after the failover")
	}

	first.signal(t, os.Interrupt)
	if r := first.wait(t); r.code != 7 {
		t.Errorf("the first run: exit code %d, want the command's 7; stderr:\n%s", r.code, r.stderr)
	}
}

// An attempt that the replicas did not confirm counts as Redis failing,
// also one whose reply did not come by its WAIT's timeout, which matches
// context.DeadlineExceeded as an attempt that the wait's end cut short
// does: once that has lasted unreachableWait, the wait ends with 69,
// saying that the replicas did not confirm the lock, and what to check;
// the waiting line says so meanwhile.
func TestRunReplicasNotConfirmedForLongEndsTheWait(t *testing.T) {
	unconfirmed := fmt.Errorf("%w: no reply within the 1s WAIT timeout: %w", dlock.ErrNotReplicated, context.DeadlineExceeded)
	var cause error
	w := &waiter{name: "job", begun: make(chan struct{}), answered: time.Now().Add(-unreachableWait),
		cancel: func(err error) { cause = err }}
	w.onRetry(1, unconfirmed)
	var down redisDown
	if !errors.As(cause, &down) {
		t.Fatalf("an attempt not confirmed %v after the last answer: the wait goes on (cause %v)", unreachableWait, cause)
	}
	if line, _ := w.status(context.Background()); !strings.Contains(line, "— not confirmed by replicas (") {
		t.Errorf("the waiting line %q does not say that the replicas did not confirm the lock", line)
	}
	err := (&app{cmd: runCommand}).waitError(&conn{display: "redis://h:1"}, "job", &runOptions{}, w, cause, unconfirmed)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != exitUnavailable ||
		!strings.Contains(ee.msg, "not confirmed by replicas for 30s while waiting for 'job'") || !strings.Contains(ee.msg, "--replicas") {
		t.Errorf("the wait ended with %v, want %d, saying that the replicas did not confirm the lock", err, exitUnavailable)
	}
}

// On a Redis Cluster, --replicas asks the replicas of the primary that
// serves the name: with one replica each, --replicas 1 runs the command,
// --replicas 2 gives up (69), saying how many confirmed, and leaves the
// name free.
func TestRunReplicasOnACluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 1)
	env := []string{"DLOCK_REDIS=redis://" + strings.Join(c.Addrs(), ",")}
	name, ran := lockName(t), filepath.Join(t.TempDir(), "ran")
	// The first run also has the primary load the script (see replicated).
	if r := dlockRun(t, env, runArgs([]string{"--replicas", "1"}, name, "env")...); r.code != 0 || !strings.Contains(r.stdout, "DLOCK_NAME="+name+"\n") {
		t.Errorf("--replicas 1: code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r := dlockRun(t, env, runArgs([]string{"--no-wait", "--replicas", "2", "--replicas-timeout", "100ms"}, name, "job", ran, "0")...)
	checkOneLine(t, r, exitUnavailable, "1 of 2 replicas acknowledged within 100ms")
	if _, err := os.Stat(ran); !errors.Is(err, os.ErrNotExist) {
		t.Error("--replicas 2: the command ran without its lock confirmed")
	}
	if r := dlockRun(t, env, "status", name); r.code != 0 || !strings.Contains(r.stdout, "held by:  nobody\n") {
		t.Errorf("status after the runs: code %d, stdout %q, stderr %q; want the name free", r.code, r.stdout, r.stderr)
	}
}
