package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/dlockio/dlock"
)

const (
	// defaultGrace is how long run waits after SIGTERM before SIGKILL when
	// the lock is lost.
	defaultGrace = 10 * time.Second
	// minTTL is the shortest --ttl: the lease is refreshed every third of it.
	minTTL = 100 * time.Millisecond
	// forever bounds the wait when --wait is not given.
	forever = 100 * 365 * 24 * time.Hour
	// releaseTimeout bounds the release after the command exits.
	releaseTimeout = 5 * time.Second
	// unreachableWait is how long run keeps waiting while Redis cannot be
	// reached (since an attempt last found the lock held, or the wait
	// began) before it gives up.
	unreachableWait = 30 * time.Second
	// holderLookup bounds the look-up of the holder of a lock not
	// obtained, for the message.
	holderLookup = time.Second
	// maxCmdMeta bounds the command line stored in the metadata.
	maxCmdMeta = 200
	// defaultReplicasTimeout is how long the replicas have to confirm an
	// acquire or a refresh (--replicas-timeout), unless a third of --ttl
	// is shorter.
	defaultReplicasTimeout = time.Second
)

var runCommand = new(command)

func init() {
	*runCommand = command{
		name:    "run",
		summary: "run a command while holding a lock",
		usage:   "run [FLAGS] NAME -- COMMAND [ARGS...]",
		conn:    true,
		help: `Obtains the lock called NAME, runs COMMAND while holding it, releases it when
the command exits, and exits with the command's exit code.

While waiting for the lock on a terminal, one status line says who holds it;
without a terminal, dlock logs plain lines on stderr when it starts waiting and
when the holder changes. dlock writes nothing to stdout: that is the command's.

The lock is refreshed every third of --ttl while the command runs, and
released when the command exits: background work the command leaves running
(sh -c 'job &') runs on without the lock (unlike flock, whose lock a
descriptor inherited by that work keeps). The command gets DLOCK_NAME,
DLOCK_TOKEN and DLOCK_FENCE in its environment (DLOCK_FENCE is 0 for --shared
and --semaphore holds, which have no fence); pass the fence to the resource you
protect so that it can refuse a holder whose lock has passed to another. The
connection flags given to dlock reach the command as the variables that stand
for them (--redis as DLOCK_REDIS, as written: a password in its URL stays
there, for that Redis alone; --prefix as DLOCK_PREFIX, or DLOCK_NO_PREFIX=1
for an empty one, --cluster as DLOCK_CLUSTER=1, and so on), and the rest of
dlock's environment passes on as it is,
DLOCK_REDIS and DLOCK_PASSWORD included, so that a dlock the command runs
reaches the same Redis and the same locks. The command is executed directly,
not by a shell: a script needs its #! line (without one it fails with code
126, exec format error).

SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to dlock are passed
on to the command; a SIGHUP or SIGINT ignored when dlock starts (under nohup,
say) stays ignored, by dlock and by the command. Without a controlling
terminal (cron, systemd, CI) the command runs in a process group of its own
and signals go to the whole group; at a terminal it shares dlock's group, so
that Ctrl-C reaches it directly from the terminal, once, and the signals dlock
passes on go to the command and every process it started (on Linux;
elsewhere to the command alone).

A suspended dlock refreshes nothing: one stopped (Ctrl-Z at a terminal, which
stops the command too; SIGSTOP or SIGTSTP sent to dlock alone, which does not)
for a good part of --ttl (its refresh comes every third of it) loses the lock,
and another run may obtain it while this
command goes on, or goes on once resumed, until dlock, resumed, sees the loss
(see below). Check DLOCK_FENCE where two holders must never act at once.

If the lock is lost while the command runs (it was force-released, or Redis
could not be reached to refresh it before its TTL ran out), dlock sends the
command SIGTERM, then SIGKILL after --grace, and exits with code 74. Both go
to the command's process group, or at a terminal to the command, and on
Linux to every process the command started that still runs, even one that
left its group or session (setsid, timeout) or whose parent exited: dlock
adopts those orphans. dlock exits only once all of them are gone or, after
--grace, killed: a process that ignores SIGTERM does not outlive dlock by
outliving the command. The command gets SIGTERM only once the lock is gone
(a refresh failed, or found it taken: a force release is seen at the next
refresh), so another run may obtain it and start while this command is still
in its --grace: check DLOCK_FENCE where two holders must never act at once.
A loss seen only after the command exited by itself (dlock was suspended, say)
stops nothing (on Linux; elsewhere dlock may not see that it exited), and is
code 74 too.

If dlock itself is killed (SIGKILL, the OOM killer), on Linux the command gets
SIGTERM, but nothing else does: the processes it started keep running, and
once the TTL runs out another run may obtain the lock while they still run.
Run a command whose children end with it (exec the last one, or trap TERM and
stop them), or check DLOCK_FENCE. Elsewhere the command keeps running too.

Redis copies a lock to its replicas only after granting it: a failover
(Sentinel, Redis Cluster) to a replica that had not received it yet frees
the lock, and another run may start beside this one, neither told. On
Sentinel or a Cluster, give --replicas N, N the number of the primary's
replicas: the lock then counts only once they all have it, so it survives a
failover to any of them. While fewer are up and in sync (after a failover,
until the old primary rejoins as a replica), no run obtains the lock (code
69, or, waiting, "not confirmed by replicas" until the wait ends), and a run
that holds it loses it at its deadline (code 74).

Flags:
  --wait DURATION      give up with code 73 if the lock is not obtained within
                       DURATION (default: wait as long as it takes); the first
                       attempt gets up to 10s to answer, so a free lock is
                       obtained however short DURATION is; a wait that ends
                       while Redis fails is code 69 (on a Redis that stalls,
                       dlock exits within about 5s of DURATION's end)
  --no-wait            give up at once with code 73 if the lock is held, as flock -n
  --ttl DURATION       the lease: how long the lock outlives dlock if it dies
                       (default 10s, at least 100ms)
  --grace DURATION     after losing the lock, how long to wait between SIGTERM and
                       SIGKILL (default 10s)
  --min-hold DURATION  keep the lock after the command exits until DURATION after
                       it was obtained, so that runs started meanwhile are
                       refused: with --no-wait, a job runs once per cron tick
                       across hosts. Pick DURATION longer than the hosts'
                       clocks differ and no longer than the period less that
                       (or runs are skipped); needs --no-wait, or a --wait
                       shorter than DURATION less that spread
  --metadata KEY=VALUE add to the metadata stored with the lock (repeatable); the
                       defaults are host, pid, user and cmd
  --shared             take a read lock of a read/write lock: shared with other
                       --shared runs, exclusive of --write runs
  --write              take the write lock of a read/write lock: exclusive of
                       --shared and --write runs
  --fair               with --shared or --write: the read/write lock serves readers
                       and writers in arrival order (by default writers go first);
                       every user of the name must agree
  --semaphore N        take one of N permits (N > 0): up to N runs at once; each
                       run is let in while fewer than its own N are held, so every
                       user of the name should give the same N
  --replicas N         confirm the lock on N of the primary's replicas (N > 0), as
                       dlock.WithReplicas: a lock that fewer confirm is given back
                       and the command not run (code 69; a wait retries it), a
                       refresh that fewer confirm does not count (the lock is
                       lost at its deadline, code 74). Give it on Sentinel or a
                       Redis Cluster, N the number of the primary's replicas
  --replicas-timeout D how long the replicas have to confirm each acquire and
                       refresh (default 1s, or a third of --ttl if shorter; at
                       most a third of --ttl)
  --quiet, -q          do not report waiting; errors are still reported

A plain run takes an exclusive lock, which is another kind: a name is used by
one kind at a time, and a run of another kind on it fails with code 64.

Examples:
  dlock run nightly -- ./nightly-report.sh
  dlock run --no-wait --ttl 30s backup -- pg_dump -f /backups/db.sql mydb
  dlock run --wait 5m --metadata ticket=OPS-42 migrate -- ./migrate up
  dlock run deploy -- sh -c 'echo "deploying with fence $DLOCK_FENCE"; ./deploy'
  dlock run --no-wait sync -- ./sync; [ $? -eq 73 ] && echo "sync already running"
  dlock run --no-wait --min-hold 2m cleanup -- ./cleanup.sh  # cron, every 5 minutes
  dlock --redis redis-sentinel://s1,s2,s3/locks run --replicas 2 deploy -- ./deploy
`,
		flags: func(fs *flag.FlagSet) func(*app, []string) error {
			o := runOptions{ttl: dlock.DefaultTTL, grace: defaultGrace}
			fs.Func("wait", "", func(s string) error {
				d, err := time.ParseDuration(s)
				switch {
				case err != nil:
					return badDuration(s, "30s or 5m")
				case d <= 0:
					return fmt.Errorf("%v is not positive; to not wait at all, write --no-wait", d)
				}
				o.wait = d
				return nil
			})
			fs.BoolVar(&o.noWait, "no-wait", false, "")
			durationFlag(fs, &o.ttl, "ttl")
			durationFlag(fs, &o.grace, "grace")
			durationFlag(fs, &o.minHold, "min-hold")
			fs.Func("metadata", "", func(s string) error {
				// The flag package names the flag and quotes s.
				k, v, ok := strings.Cut(s, "=")
				switch {
				case !ok:
					return errors.New("write KEY=VALUE")
				case k == "":
					return errors.New("the KEY is empty; write KEY=VALUE")
				}
				o.meta = append(o.meta, [2]string{k, v})
				return nil
			})
			fs.BoolVar(&o.kind.shared, "shared", false, "")
			fs.BoolVar(&o.kind.write, "write", false, "")
			fs.BoolVar(&o.kind.fair, "fair", false, "")
			fs.Func("semaphore", "", func(s string) error {
				n, err := strconv.Atoi(s)
				switch {
				case errors.Is(err, strconv.ErrRange) && strings.HasPrefix(s, "-"):
					return errors.New("must be a positive number of permits")
				case errors.Is(err, strconv.ErrRange):
					return fmt.Errorf("out of range (at most %d permits)", math.MaxInt)
				case err != nil:
					return errors.New("not a whole number of permits")
				}
				o.kind.permits, o.semaphore = n, true
				return nil
			})
			fs.Func("replicas", "", func(s string) error {
				n, err := strconv.Atoi(s)
				switch {
				case errors.Is(err, strconv.ErrRange) && strings.HasPrefix(s, "-"):
					return errors.New("must be at least 1")
				case errors.Is(err, strconv.ErrRange):
					return fmt.Errorf("out of range (at most %d replicas)", math.MaxInt)
				case err != nil:
					return errors.New("not a whole number of replicas")
				}
				o.replicas, o.replicated = n, true
				return nil
			})
			fs.Func("replicas-timeout", "", func(s string) error {
				d, err := time.ParseDuration(s)
				if err != nil {
					return badDuration(s, "100ms or 1s")
				}
				o.replicasTimeout, o.replicasTimeoutSet = d, true
				return nil
			})
			fs.BoolVar(&o.quiet, "quiet", false, "")
			fs.BoolVar(&o.quiet, "q", false, "")
			return func(a *app, args []string) error { return a.run(args, &o) }
		},
	}
}

type runOptions struct {
	wait, ttl, grace time.Duration
	minHold          time.Duration
	noWait, quiet    bool
	meta             [][2]string
	kind             kind
	semaphore        bool // --semaphore was given, whatever its number
	// replicas is --replicas: how many replicas must confirm each acquire
	// and refresh (dlock.WithReplicas); replicated is set when it was
	// given, whatever its number.
	replicas           int
	replicated         bool
	replicasTimeout    time.Duration // --replicas-timeout, if replicasTimeoutSet
	replicasTimeoutSet bool
}

// confirmTimeout is how long the replicas have to confirm an acquire or a
// refresh: --replicas-timeout, else defaultReplicasTimeout or a third of
// --ttl, the shorter. A refresh comes every third of --ttl: one that waits
// for the replicas no longer than that leaves time for the next before
// the lock's deadline.
func (o *runOptions) confirmTimeout() time.Duration {
	if o.replicasTimeoutSet {
		return o.replicasTimeout
	}
	return min(defaultReplicasTimeout, (o.ttl / 3).Truncate(time.Millisecond)) // WAIT counts milliseconds
}

// check validates the options that flag parsing could not.
func (o *runOptions) check() error {
	switch {
	case o.noWait && o.wait > 0:
		return usage(runCommand, "--no-wait and --wait exclude each other")
	case o.ttl < minTTL:
		return usage(runCommand, "--ttl %v is too short; it must be at least %v", o.ttl, minTTL)
	case o.grace < 0:
		return usage(runCommand, "--grace %v must not be negative", o.grace)
	case o.minHold < 0:
		return usage(runCommand, "--min-hold %v must not be negative", o.minHold)
	case o.minHold > 0 && (o.kind.shared || o.kind.write || o.semaphore):
		return usage(runCommand, "--min-hold is for a plain (exclusive) lock, not --shared, --write or --semaphore")
	case o.minHold > 0 && !o.noWait && (o.wait == 0 || o.wait >= o.minHold):
		// Every run would wait for the kept hold to run out, then run.
		return usage(runCommand, "--min-hold keeps runs out only if they do not wait for it to run out: add --no-wait, or a --wait shorter than --min-hold less the hosts' clock spread")
	case o.semaphore && o.kind.permits < 1:
		// 0 would be no semaphore at all: an exclusive lock.
		return usage(runCommand, "--semaphore %d must be a positive number of permits; for an exclusive lock, leave --semaphore out", o.kind.permits)
	case o.kind.shared && o.kind.write:
		return usage(runCommand, "--shared and --write exclude each other")
	case o.kind.shared && o.semaphore:
		return usage(runCommand, "--shared and --semaphore exclude each other")
	case o.kind.write && o.semaphore:
		return usage(runCommand, "--write and --semaphore exclude each other")
	case o.kind.fair && !o.kind.shared && !o.kind.write:
		return usage(runCommand, "--fair is for a read/write lock: give it with --shared or --write")
	case o.replicated && o.replicas < 1:
		return usage(runCommand, "--replicas %d must be at least 1: the number of the primary's replicas that must confirm the lock (leave --replicas out for none)", o.replicas)
	case o.replicasTimeoutSet && !o.replicated:
		return usage(runCommand, "--replicas-timeout is for --replicas: give both")
	case o.replicasTimeoutSet && o.replicasTimeout < time.Millisecond:
		return usage(runCommand, "--replicas-timeout %v is too short; it must be at least 1ms", o.replicasTimeout)
	case o.replicasTimeoutSet && o.replicasTimeout > o.ttl/3:
		// Every refresh would wait up to its next, and one not confirmed
		// would leave no time for another before the deadline.
		return usage(runCommand, "--replicas-timeout %v is more than a third of --ttl (%v), which is how often the lock is refreshed: give a longer --ttl, or a shorter --replicas-timeout", o.replicasTimeout, o.ttl)
	}
	return nil
}

// signalled is the cause of a wait that a signal ended.
type signalled struct{ sig os.Signal }

func (s signalled) Error() string { return "interrupted by " + sigName(s.sig) }

func sigName(sig os.Signal) string {
	if s, ok := sig.(syscall.Signal); ok {
		switch s {
		case syscall.SIGINT:
			return "SIGINT"
		case syscall.SIGTERM:
			return "SIGTERM"
		case syscall.SIGHUP:
			return "SIGHUP"
		case syscall.SIGQUIT:
			return "SIGQUIT"
		case syscall.SIGKILL:
			return "SIGKILL"
		}
	}
	return sig.String()
}

func sigCode(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return exitSignal + int(s)
	}
	return exitSignal + 2
}

var errWaitedOut = errors.New("--wait ran out")

func (a *app) run(names []string, o *runOptions) error {
	argv := a.argv
	switch {
	case len(names) == 0:
		return usage(runCommand, "missing the lock's NAME: write dlock run NAME -- COMMAND [ARGS...]")
	case len(names) > 1:
		return usage(runCommand, "unexpected argument %q before `--`: the lock's NAME comes first, the command after `--`", names[1])
	case len(argv) == 0:
		return usage(runCommand, "missing the COMMAND after `--`")
	case names[0] == "":
		return usage(runCommand, "the lock's NAME is empty")
	}
	if err := o.check(); err != nil {
		return err
	}
	name := names[0]
	path, err := exec.LookPath(argv[0])
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return fail(exitNotFound, "command %q not found: check its name, or give its path", argv[0])
		}
		return fail(exitCannotExec, "command %q cannot be run: %v", argv[0], err)
	}

	sigs := make(chan os.Signal, 8)
	if caught := notIgnored(forwarded); len(caught) > 0 {
		signal.Notify(sigs, caught...)
		defer signal.Stop(sigs)
	}
	// A stderr whose reader is gone (dlock run … 2>&1 | head -1) must not
	// kill dlock by SIGPIPE while it waits, holds the lock or runs the
	// command: caught, a write there fails instead, to the end of the
	// process. The command starts with SIGPIPE's default all the same, as
	// every Go program's children do (Go handles SIGPIPE itself, even one
	// ignored when it started).
	if len(brokenPipe) > 0 {
		signal.Notify(make(chan os.Signal, 1), brokenPipe...)
	}

	l, c, err := a.obtain(name, argv, o, sigs)
	if err != nil {
		return err
	}
	defer c.close()
	// A stopping signal that came once the lock was obtained, before the
	// command started, stops it from starting: one from a terminal would
	// otherwise be taken for one the command got too. Others wait for it.
	var later []os.Signal
	for pending := true; pending; {
		select {
		case sig := <-sigs:
			if stopsWait(sig) {
				a.release(l, name, false)
				return fail(sigCode(sig), "%v before the command started; the command was not run", signalled{sig})
			}
			later = append(later, sig)
		default:
			pending = false
		}
	}
	for _, sig := range later {
		sigs <- sig // room for them: they came from it
	}
	return a.runHolding(l, name, path, argv, o, sigs)
}

// notIgnored returns the signals of sigs that were not ignored when dlock
// started. One that was (nohup's SIGHUP, say) must stay ignored: catching
// it would undo that for the command too, which starts with the default
// disposition of every signal dlock catches, and inherits those dlock
// ignores.
func notIgnored(sigs []os.Signal) []os.Signal {
	var out []os.Signal
	for _, sig := range sigs {
		if !signal.Ignored(sig) {
			out = append(out, sig)
		}
	}
	return out
}

// obtain connects and obtains the lock; a stopping signal received
// meanwhile gives up.
func (a *app) obtain(name string, argv []string, o *runOptions, sigs <-chan os.Signal) (*dlock.Lock, *conn, error) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stopWatch, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case sig := <-sigs:
				if stopsWait(sig) {
					cancel(signalled{sig})
					return
				}
			case <-stopWatch:
				return
			}
		}
	}()
	// stopWatching ends the watch: a signal from then on waits in sigs for
	// the command (see runHolding).
	watching := true
	stopWatching := func() {
		if watching {
			watching = false
			close(stopWatch)
			<-watched
		}
	}
	defer stopWatching()
	interrupted := func() error {
		var s signalled
		if errors.As(context.Cause(ctx), &s) {
			return fail(sigCode(s.sig), "%v while waiting for %s; the command was not run", s, quote(name))
		}
		return nil
	}

	c, begin, err := a.connectToWait(ctx, name, o)
	if err != nil {
		if ierr := interrupted(); ierr != nil {
			return nil, nil, ierr
		}
		return nil, nil, err
	}
	try, wait, err := o.kind.acquirers(c.locks, name)
	if err != nil {
		c.close()
		return nil, nil, err
	}
	meta := metadata(argv, o.meta)
	opts := []dlock.Option{dlock.WithTTL(o.ttl), dlock.WithMetadata(meta), dlock.WithAutoRefresh()}
	if o.minHold > 0 {
		opts = append(opts, dlock.WithMinHold(o.minHold))
	}
	if o.replicated {
		opts = append(opts, dlock.WithReplicas(o.replicas, o.confirmTimeout()))
	}
	var l *dlock.Lock
	var w *waiter
	if o.noWait {
		l, err = try(ctx, opts...)
	} else {
		wctx, wcancel := context.WithCancelCause(ctx)
		w = a.newWaiter(c, name, meta, o.kind, o.quiet, wcancel, begin)
		actx := context.Context(wctx) // the attempts'
		if o.wait > 0 {
			// The waiter ends the wait at --wait once the first attempt
			// has its answer; the deadline bounds an attempt under way:
			// the first one's, then --wait's end (see waitCtx).
			var tcancel context.CancelFunc
			wctx, tcancel = context.WithDeadlineCause(wctx, later(begin.Add(o.wait), time.Now().Add(firstTry)), errWaitedOut)
			defer tcancel()
			actx = w.giveUpAfter(wctx, o.wait)
		}
		l, err = wait(actx, append(opts, dlock.WithMaxWait(forever), dlock.WithOnRetry(w.onRetry))...)
		w.stop()
		if err != nil {
			err = a.waitError(c, name, o, w, context.Cause(wctx), err)
		}
		wcancel(nil)
	}
	// A signal that came while the lock was obtained gives it up; one that
	// comes later is the command's.
	stopWatching()
	if ierr := interrupted(); ierr != nil {
		if l != nil {
			a.release(l, name, false)
		}
		c.close()
		return nil, nil, ierr
	}
	if err != nil {
		defer c.close()
		if errors.Is(err, dlock.ErrNotObtained) {
			return nil, nil, a.notObtained(c, name, o.kind, "not waiting (--no-wait)")
		}
		return nil, nil, a.redisError(c, err)
	}
	if w != nil && w.waited() && !o.quiet {
		// A read hold or a permit has no fence (0): nothing to say.
		fence := ""
		if f := l.Fence(); f > 0 {
			fence = fmt.Sprintf(" (fence %d)", f)
		}
		fmt.Fprintf(a.stderr, "dlock: obtained %s after waiting %s%s\n", quote(name), fmtDur(w.since()), fence)
	}
	return l, c, nil
}

// waitError explains why a wait ended without the lock. One that --wait
// ended is a lock held only if the last attempt found it so.
func (a *app) waitError(c *conn, name string, o *runOptions, w *waiter, cause, err error) error {
	var down redisDown
	var refused redisRefused
	switch {
	case errors.As(cause, &refused) && redirected(refused.err):
		return a.clusterNodeError(c)
	case errors.As(cause, &refused):
		return unreachable(c.display, refused.err)
	case errors.As(cause, &down):
		return unreachable(c.display, &waitEnded{fmt.Sprintf("%s for %v while waiting for %s", downFor(down.err), unreachableWait, quote(name)), down.err})
	case errors.Is(cause, errWaitedOut):
		last, held := w.outcome()
		switch {
		case last != nil:
			return unreachable(c.display, &waitEnded{fmt.Sprintf("gave up after waiting %v (--wait) for %s, failing", o.wait, quote(name)), last})
		case !held:
			return unreachable(c.display, fmt.Errorf("no answer within %v while waiting for %s", max(o.wait, firstTry), quote(name)))
		}
		return a.notObtained(c, name, o.kind, fmt.Sprintf("gave up after waiting %v (--wait)", o.wait))
	}
	return err
}

// waitEnded is the error of a wait that ended on what Redis last
// answered, err, or did not: what says how it ended. unreachable gives it
// err's hint, without the words for a run that has yet to wait (see
// waitsForIt).
type waitEnded struct {
	what string
	err  error
}

func (e *waitEnded) Error() string { return e.what + ": " + e.err.Error() }

func (e *waitEnded) Unwrap() error { return e.err }

// downFor says how Redis failed the attempts of a wait that it ended, err
// the last one's error: refusing them for a while, or not answering.
func downFor(err error) string {
	switch {
	case notReplicated(err):
		return "not confirmed by replicas"
	case full(err), readOnly(err), cannotSave(err):
		return "refused"
	case clusterDown(err):
		return "cluster down"
	case passing(err):
		return "busy or not ready"
	}
	return "no answer"
}

// notObtained reports who holds the lock run could not obtain, and what
// else keeps a hold of k out: a writer that goes first, another count of
// permits.
func (a *app) notObtained(c *conn, name string, k kind, why string) error {
	// The holder only adds to the message: a server that stalls may not
	// keep the exit waiting long.
	ctx, cancel := context.WithTimeout(context.Background(), holderLookup)
	defer cancel()
	info, err := c.locks.Inspect(ctx, name)
	if err != nil {
		return fail(exitNotObtained, "%s is held by another holder; %s", quote(name), why)
	}
	held := fmt.Sprintf("%s is held by %s", quote(name), heldBy(info, time.Now()))
	switch {
	case k.writerFirst(info) && len(info.Holders) == 0:
		held = k.writerFirstText(quote(name))
	case k.writerFirst(info):
		held = fmt.Sprintf("%s; held by %s", k.writerFirstText(quote(name)), heldBy(info, time.Now()))
	case len(info.Holders) == 0:
		held = fmt.Sprintf("%s is held by another holder", quote(name))
	case k.permitRule(info) != "":
		held += ", and " + k.permitRule(info)
	}
	return fail(exitNotObtained, "%s; %s", held, why)
}

// quote writes a lock name as the messages show it: 'nightly'.
func quote(name string) string {
	if strings.ContainsAny(name, "' ") || strings.IndexFunc(name, notPrintable) >= 0 || !utf8.ValidString(name) {
		return strconv.Quote(name)
	}
	return "'" + name + "'"
}

// metadata is what run stores with the lock: a JSON object of the host,
// dlock's pid (the process to signal to stop the run), the user, the
// command line, and the --metadata pairs.
func metadata(argv []string, extra [][2]string) string {
	m := map[string]string{metaPID: strconv.Itoa(os.Getpid()), metaCmd: truncate(shellJoin(argv), maxCmdMeta)}
	if h, err := os.Hostname(); err == nil {
		m[metaHost] = h
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		m[metaUser] = u.Username
	} else if u := os.Getenv("USER"); u != "" {
		m[metaUser] = u
	}
	for _, kv := range extra {
		m[kv[0]] = kv[1]
	}
	b, _ := marshal(m) // a map of strings always marshals
	return string(b)
}

// shellJoin writes argv as a shell would need it typed.
func shellJoin(argv []string) string {
	out := make([]string, len(argv))
	for i, s := range argv {
		if s != "" && strings.IndexFunc(s, func(r rune) bool {
			return !(r == '-' || r == '_' || r == '.' || r == '/' || r == '=' || r == ':' || r == ',' || r == '+' || r == '@' ||
				'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9')
		}) < 0 {
			out[i] = s
			continue
		}
		out[i] = "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}

// runHolding runs the command while l is held, and returns how run ends.
func (a *app) runHolding(l *dlock.Lock, name, path string, argv []string, o *runOptions, sigs <-chan os.Signal) error {
	ownGroup := !hasControllingTerminal()
	cmd := &exec.Cmd{
		Path: path, Args: argv,
		Env: append(a.conn.childEnv(os.Environ()),
			"DLOCK_NAME="+name, "DLOCK_TOKEN="+l.Token(), "DLOCK_FENCE="+strconv.FormatUint(l.Fence(), 10)),
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		SysProcAttr: childAttr(ownGroup),
	}
	// The processes of the command's tree that its processes leave behind
	// become dlock's (on Linux), so that a lost lock stops them too.
	orphans, stopAdopting := adoptOrphans()
	defer stopAdopting()
	var strays tree
	if orphans != nil {
		strays.exclude(os.Getpid())
	}
	if err := cmd.Start(); err != nil {
		a.release(l, name, false)
		return fail(exitCannotExec, "command %q cannot be run: %v", argv[0], err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()

	// Once the lock is lost, the command's group is stopped as a whole: a
	// process of it that ignores SIGTERM may outlive the command itself,
	// so its end does not end the grace, unless the group is gone. The
	// processes of its tree that a signal to the group (or, at a terminal,
	// where the command shares dlock's group, to the command) does not
	// reach are stopped alike (see tree).
	pid := cmd.Process.Pid
	root := pid // where the tree grows from: the command, or dlock once it adopts orphans
	if orphans != nil {
		root = os.Getpid()
	}
	strays.cmd, strays.group = pid, ownGroup
	if orphans != nil {
		// Orphans become dlock's children: see tree.adopted.
		strays.self, strays.selfGroup = os.Getpid(), ownProcessGroup()
		if p, ok := procStat(pid); ok {
			strays.since = p.start
		}
	}
	var lost error
	var kill, poll <-chan time.Time
	killed := false // SIGKILL was sent
	othersAlive := func() bool {
		strays.grow(root)
		return ownGroup && groupAlive(pid) || strays.alive()
	}
	done, leader := l.Done(), (<-chan struct{})(exited)
	for running := true; running; {
		select {
		case <-leader:
			leader = nil
			if lost == nil || killed || !othersAlive() {
				running = false
				continue
			}
			// Nothing says when the rest ends: look now and then.
			ticker := time.NewTicker(groupPoll)
			defer ticker.Stop()
			poll = ticker.C
		case <-poll:
			running = othersAlive()
		case <-orphans:
			reapOrphans(pid)
		case sig := <-sigs:
			if !ownGroup && fromTerminal(sig) && inForeground() {
				continue // the terminal sent it to the command as well
			}
			_ = signalChild(cmd.Process, ownGroup, sig)
			if !ownGroup {
				// As a group would: what the command started gets it too.
				strays.grow(root)
				strays.signal(sig)
			}
		case <-done:
			done = nil
			if lost = l.Err(); lost == nil {
				continue
			}
			if hasExited(leader, pid) {
				// The command exited by itself before the loss was seen
				// (dlock was suspended, say): there is nothing to stop,
				// and what it left running runs on, as after an exit with
				// the lock held.
				<-leader
				lost, running = nil, false
				continue
			}
			strays.grow(root)
			fmt.Fprintf(a.stderr, "dlock: lock %s lost while the command ran (%s); sending SIGTERM to %s, SIGKILL in %v\n",
				quote(name), lossReason(lost), whom(pid, ownGroup), o.grace)
			_ = signalChild(cmd.Process, ownGroup, termSignal)
			strays.signal(termSignal)
			t := time.NewTimer(o.grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill, killed = nil, true
			switch {
			case leader != nil:
				fmt.Fprintf(a.stderr, "dlock: the command (pid %d) is still running %v after SIGTERM; sending SIGKILL\n", pid, o.grace)
			default:
				fmt.Fprintf(a.stderr, "dlock: the command exited, but processes it started are still running %v after SIGTERM; sending SIGKILL\n", o.grace)
			}
			strays.grow(root)
			_ = signalChild(cmd.Process, ownGroup, killSignal)
			strays.signal(killSignal)
			running = leader != nil // once the command is gone, the rest is killed
		}
	}
	code := exitStatus(cmd.ProcessState)
	if lost != nil {
		_ = a.release(l, name, true) // frees it if Redis still has it; a failure is no news
		return fail(exitLost, "lock %s was lost while the command ran (%s); the command was stopped (%s)", quote(name), lossReason(lost), describeStatus(cmd.ProcessState))
	}
	if lost = l.Err(); lost != nil {
		// Lost as the command ended: by its local deadline, say, which
		// Redis cannot confirm if it cannot be reached; or seen only once
		// it had exited.
		_ = a.release(l, name, true)
		return fail(exitLost, "lock %s was found lost after the command exited (%s), and may have been lost while it ran; the command's status was %s", quote(name), lossReason(lost), describeStatus(cmd.ProcessState))
	}
	// Held when the command exited, until heldUntil at least.
	heldUntil := l.Deadline()
	if err := a.release(l, name, false); errors.Is(err, dlock.ErrNotHeld) {
		if errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, dlock.ErrForceReleased) && !time.Now().Before(heldUntil) {
			// The release had no answer, and the lock's deadline passed
			// meanwhile, after the command exited (Redis stalled): the
			// lock was held while the command ran, and only its release
			// failed, as one that runs out of releaseTimeout first. (One
			// that Redis answered, late, saying the lock was gone may
			// have found it gone before the command exited: 74.)
			fmt.Fprintf(a.stderr, "dlock: could not release %s before its TTL ran out, after the command exited (%s); it expires on its own\n", quote(name), lossReason(err))
			if code == 0 {
				return nil
			}
			return exitCode(code)
		}
		return fail(exitLost, "lock %s was found lost after the command exited (%s), and may have been lost while it ran; the command's status was %s", quote(name), lossReason(err), describeStatus(cmd.ProcessState))
	}
	if code == 0 {
		return nil
	}
	return exitCode(code)
}

// hasExited reports whether the command, pid, has exited: exited is
// closed once its Wait returns; before, the command may be a zombie not
// reaped yet (seen on Linux), or reaped by a Wait that has not returned.
func hasExited(exited <-chan struct{}, pid int) bool {
	select {
	case <-exited:
		return true
	default:
	}
	if p, ok := procStat(pid); ok && p.zombie {
		return true
	}
	return processGone(pid)
}

// groupPoll is how often run looks whether the command's process group
// has emptied, after the command exited with the lock lost.
const groupPoll = 50 * time.Millisecond

// whom names what run signals: the command's process group, or the
// command, and the processes it started.
func whom(pid int, ownGroup bool) string {
	if ownGroup {
		return fmt.Sprintf("the command's process group (%d) and every process it started", pid)
	}
	return fmt.Sprintf("the command (pid %d) and every process it started", pid)
}

// release gives the lock up after the command; unless quiet, a failure
// other than the loss of the lock is reported, and otherwise ignored: the
// lock expires after its TTL.
func (a *app) release(l *dlock.Lock, name string, quiet bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	err := l.Release(ctx)
	if err != nil && !errors.Is(err, dlock.ErrNotHeld) && !quiet {
		fmt.Fprintf(a.stderr, "dlock: could not release %s (%s); it expires on its own within its TTL\n", quote(name), libMsg(err))
	}
	return err
}

// exitStatus turns the command's end into run's exit code: its own code,
// or 128+N when signal N killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitSignal + int(ws.Signal())
	}
	return ps.ExitCode()
}

// connectToWait connects as connect does; a run that waits (not
// --no-wait) retries a Redis it cannot reach, as its wait does once under
// way, every second until unreachableWait has passed, or --wait has,
// saying so on stderr unless --quiet. It returns when it began: the wait
// counts both from there.
func (a *app) connectToWait(ctx context.Context, name string, o *runOptions) (*conn, time.Time, error) {
	begin := time.Now()
	limit := unreachableWait
	if o.wait > 0 {
		limit = min(limit, o.wait)
	}
	var last error // the last try's failure, once one failed
	for said := false; ; said = true {
		// A try after the first ends with the time left: its ping's own
		// timeout would outlast --wait, or the 30s.
		tctx, cancel := ctx, context.CancelFunc(func() {})
		if last != nil {
			tctx, cancel = context.WithDeadline(ctx, begin.Add(limit))
		}
		c, err := a.connect(tctx, name)
		cut := tctx.Err() != nil && ctx.Err() == nil
		cancel()
		if err != nil && cut {
			return nil, begin, last
		}
		var ee *exitError
		if err == nil || o.noWait || ctx.Err() != nil || !errors.As(err, &ee) || !ee.down {
			return c, begin, err
		}
		last = err
		left := limit - time.Since(begin)
		if left <= 0 {
			return nil, begin, err
		}
		if !said && !o.quiet {
			why := "Redis unreachable"
			if ee.busy && ee.words != "" {
				why = ee.words // Redis busy or not ready, or unable to save
			}
			fmt.Fprintf(a.stderr, "dlock: waiting for %s — %s; retrying for up to %s\n", quote(name), why, fmtDur(limit))
		}
		t := time.NewTimer(min(connectRetry, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, begin, err
		case <-t.C:
		}
	}
}

// connectRetry is how often a run that waits tries again to reach a Redis
// it could not (see connectToWait).
const connectRetry = time.Second

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// libMsg is the message of a library error without the "dlock: " of each
// error it wraps: dlock's own line already says who speaks; and without
// the arguments that Redis quotes when it does not know a command (see
// withoutArgs).
func libMsg(err error) string {
	return withoutArgs(strings.ReplaceAll(err.Error(), "dlock: ", ""))
}

// withoutArgs cuts the arguments that Redis quotes after a command it does
// not know ("ERR unknown command 'evalsha', with args beginning with:
// 'HASH' '3' 'KEY' … 'TOKEN' …"), to the end of msg, where Redis's reply
// ends: a script's hash, its keys and the request's token, or (EVAL's) the
// script's text. Those quoted may hold any characters, quotes included,
// so nothing after them can be told from them.
func withoutArgs(msg string) string {
	if i := strings.Index(msg, argsQuoted); i >= 0 {
		return msg[:i]
	}
	return msg
}

// argsQuoted is what Redis writes between a command it does not know and
// its arguments.
const argsQuoted = ", with args beginning with:"

// lossReason says why a lock was lost, without the sentinels' prefixes.
func lossReason(err error) string {
	msg := libMsg(err)
	// In either order: a Release of a lock lost before it says "not held:
	// lock lost: …".
	for _, p := range []string{"lock lost: ", "not held: ", "lock lost: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	if strings.HasSuffix(msg, " had expired or was taken") {
		// The library knows nothing of the token run gave the command.
		msg += ", or was released with its DLOCK_TOKEN"
	}
	return msg
}

// describeStatus says how the command ended: killed by a signal, or with
// its exit code (128+N included, which a signal did not cause).
func describeStatus(ps *os.ProcessState) string {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("killed by %s", sigName(ws.Signal()))
	}
	return fmt.Sprintf("exit code %d", ps.ExitCode())
}
