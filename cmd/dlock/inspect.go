package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/dlockio/dlock"
)

var statusCommand = new(command)

func init() {
	*statusCommand = command{
		name:    "status",
		summary: "show who holds a lock, since when, and until when",
		usage:   "status [FLAGS] NAME",
		conn:    true,
		help: `Shows the inspection record of the lock called NAME: its kind, its holders
with their metadata (host, pid, user and command for locks taken by dlock run),
how long each has held it and how long it has left unless refreshed, readers
where the kind has them, how many clients wait for it (processes, or dlock
runs), and the newest fence issued (or that the name's fence counter holds
data dlock did not write, which refuses plain and --write runs of the name;
--json then shows fence 0 and fence_foreign true). A lock released before its minimum hold
had passed (run --min-hold) shows its holder as released, kept until it
expires. A free name is reported as kind "free" with no holders; that is not
an error.

Flags:
  --json    print the record as JSON, for scripts (the schema is in docs/cli.md)

Examples:
  dlock status nightly
  dlock status --json nightly | jq -r '.holders[0].meta.host'
`,
		flags: func(fs *flag.FlagSet) func(*app, []string) error {
			asJSON := fs.Bool("json", false, "")
			return func(a *app, args []string) error {
				if err := wantName(statusCommand, args); err != nil {
					return err
				}
				ctx, stopped := stoppable()
				return stopped(a.status(ctx, args[0], *asJSON))
			}
		},
	}
}

// status is the status command on the lock called name.
func (a *app) status(ctx context.Context, name string, asJSON bool) error {
	c, err := a.connect(ctx, name)
	if err != nil {
		return err
	}
	defer c.close()
	info, err := c.locks.Inspect(ctx, name)
	if err != nil {
		return a.redisError(c, err)
	}
	// Inspect reads a fence counter that holds data dlock did not write as
	// no fence: say which it is.
	badFence := ""
	if k := fenceKey(c.locks.RedisKey(info.Name)); (info.Fence == 0 || info.Fence >= 1<<53) && info.Kind != dlock.KindSemaphore && foreignFence(ctx, c.rdb, k) {
		badFence = k
	}
	if asJSON {
		out := toJSON(info, time.Now())
		if badFence != "" {
			out.Fence, out.FenceForeign = 0, true
		}
		return writeJSON(a.stdout, out)
	}
	// Written at once, so that a failed write (a full disk) fails the
	// command, as the JSON does.
	var b strings.Builder
	writeStatus(&b, info, time.Now(), badFence)
	_, err = io.WriteString(a.stdout, b.String())
	return err
}

var lsCommand = new(command)

func init() {
	*lsCommand = command{
		name:    "ls",
		summary: "list the locks held",
		usage:   "ls [FLAGS] [PATTERN]",
		conn:    true,
		help: `Lists every lock that is held, and whose name matches PATTERN (Redis glob
syntax: * ? [abc]; all names when left out), as a table sorted by name (a
name wider than 80 columns is shown whole, and does not widen the others'
lines: the rest of its own line no longer lines up). It walks the keys with
SCAN (on every primary of a cluster), never KEYS.

Flags:
  --json              print a JSON array of inspection records (as status --json)
  --watch             list again --interval after each listing ends (as
                      watch(1) does); on a terminal the table is
                      redrawn in place, cut to the terminal's size (the last
                      line then says how many lines it left out), otherwise
                      each listing follows the last (with --json, one array
                      per line); stop it with Ctrl-C.
                      A failure to reach Redis (or its sentinels), also at
                      the start, is shown and tried again each interval;
                      until Redis first answers, a refusal (a wrong password,
                      a missing permission, a TLS mismatch) or a usage error
                      ends it, and so does a listing that cannot be written
                      (a full disk: code 70)
  --interval DURATION how long --watch waits between listings (default 1s, at
                      least 100ms; only with --watch)

Examples:
  dlock ls
  dlock ls 'billing:*'
  dlock ls --watch
  dlock ls --json | jq -r '.[] | select(.holders[0].ttl_ms < 5000) | .name'
`,
		flags: func(fs *flag.FlagSet) func(*app, []string) error {
			asJSON := fs.Bool("json", false, "")
			watch := fs.Bool("watch", false, "")
			interval := time.Second
			durationFlag(fs, &interval, "interval")
			return func(a *app, args []string) error {
				if err := wantArgs(lsCommand, args, 0, 1, "pattern"); err != nil {
					return err
				}
				if !*watch && isSet(fs, "interval") {
					return usage(lsCommand, "--interval goes with --watch: it says how often --watch lists")
				}
				if interval < minWatchInterval {
					// Each listing walks the keys with SCAN: a tight loop
					// would load Redis for nothing a reader could see.
					return usage(lsCommand, "--interval %v is below the least, %v", interval, minWatchInterval)
				}
				pattern := ""
				if len(args) == 1 {
					pattern = args[0]
				}
				ctx, stopped := stoppable()
				return stopped(a.list(ctx, pattern, *asJSON, *watch, interval))
			}
		},
	}
}

// minWatchInterval is the least --interval of ls --watch.
const minWatchInterval = 100 * time.Millisecond

// list is the ls command. A signal ends a --watch with no error.
func (a *app) list(ctx context.Context, pattern string, asJSON, watch bool, interval time.Duration) error {
	if watch {
		return a.watchList(ctx, pattern, asJSON, interval)
	}
	c, err := a.connect(ctx, "")
	if err != nil {
		return err
	}
	defer c.close()
	infos, err := listHeld(ctx, c, pattern)
	if err != nil {
		return a.redisError(c, err)
	}
	if asJSON {
		return writeJSON(a.stdout, listJSON(infos, time.Now()))
	}
	if len(infos) == 0 {
		fmt.Fprintln(a.stderr, noLocks(pattern))
		return nil
	}
	_, err = fmt.Fprintln(a.stdout, strings.Join(tableLines(infos, time.Now()), "\n"))
	return err
}

// listHeld lists the locks held whose names match pattern: a read/write
// lock or semaphore whose holds all ran out, while its keys live on, is in
// use but held by nobody, and left out.
func listHeld(ctx context.Context, c *conn, pattern string) ([]*dlock.Info, error) {
	infos, err := c.locks.List(ctx, pattern)
	held := infos[:0]
	for _, info := range infos {
		if len(info.Holders) > 0 {
			held = append(held, info)
		}
	}
	return held, err
}

// stoppable returns a context that the first stopping signal (SIGINT,
// SIGTERM, SIGHUP, SIGQUIT: see stopsWait) ends, for the commands that only
// talk to Redis, and the function to pass their error through when they
// return: an error after such a signal becomes its exit code (128+N), as
// for a wait that run gives up, and Ctrl-\ never ends dlock with Go's dump
// of its goroutines. A command that completes all the same succeeds.
func stoppable() (context.Context, func(error) error) {
	var stops []os.Signal
	for _, sig := range notIgnored(forwarded) {
		if stopsWait(sig) {
			stops = append(stops, sig)
		}
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs, done, watched := make(chan os.Signal, 1), make(chan struct{}), make(chan struct{})
	if len(stops) > 0 {
		signal.Notify(sigs, stops...)
	}
	go func() {
		defer close(watched)
		select {
		case sig := <-sigs:
			cancel(signalled{sig})
		case <-done:
		}
	}()
	return ctx, func(err error) error {
		signal.Stop(sigs)
		close(done)
		<-watched
		defer cancel(nil)
		var s signalled
		if err != nil && errors.As(context.Cause(ctx), &s) {
			return fail(sigCode(s.sig), "%v: %v", s, err)
		}
		return err
	}
}

// isSet reports whether the flag called name was given.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func noLocks(pattern string) string {
	if pattern == "" {
		return "no locks are held"
	}
	return fmt.Sprintf("no locks matching %q are held", pattern)
}

func listJSON(infos []*dlock.Info, now time.Time) []infoJSON {
	out := make([]infoJSON, 0, len(infos))
	for _, info := range infos {
		out = append(out, toJSON(info, now))
	}
	return out
}

// watchList lists, and again interval after each listing ends, until ctx
// ends (Ctrl-C), which is a normal end. Failures to use Redis are shown and retried; until Redis
// first answers, only those to reach it: a refusal (a wrong password, a TLS
// mismatch) or a usage error (a bad URL, a cluster node given as one
// server) ends it then, as it ends a single ls.
func (a *app) watchList(ctx context.Context, pattern string, asJSON bool, interval time.Duration) error {
	tty := !asJSON && isTerminal(a.stdout)
	drawn := 0 // lines of the last frame, on a terminal
	// The next listing starts interval after the last one ended, as
	// watch(1) does: one that takes longer (tens of thousands of locks)
	// does not follow the last at once, keeping Redis busy.
	next := time.NewTimer(interval)
	defer next.Stop()
	var c *conn
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	for {
		var infos []*dlock.Info
		var err error
		if c == nil {
			c, err = a.connect(ctx, "")
			var ee *exitError
			if err != nil && ctx.Err() == nil && (!errors.As(err, &ee) || !ee.down) {
				return err
			}
		}
		if c != nil {
			infos, err = listHeld(ctx, c, pattern)
			if err != nil {
				err = a.redisError(c, err)
			}
		}
		now := time.Now()
		if ctx.Err() != nil {
			return nil
		}
		// A listing that cannot be written (a full disk) ends the watch,
		// as it fails a single ls: listing on would write nothing.
		var werr error
		switch {
		case asJSON && err == nil:
			b, _ := marshal(listJSON(infos, now))
			_, werr = fmt.Fprintf(a.stdout, "%s\n", b)
		case asJSON:
			fmt.Fprintf(a.stderr, "dlock ls: %s (retrying)\n", oneLine(err.Error()))
		default:
			title := "dlock ls"
			if pattern != "" {
				title += " " + pattern
			}
			lines := []string{fmt.Sprintf("every %v: %s    %s", interval, title, now.Format("15:04:05"))}
			switch {
			case err != nil:
				lines = append(lines, "", "error: "+oneLine(err.Error())+" (retrying)")
			case len(infos) == 0:
				lines = append(lines, "", noLocks(pattern))
			default:
				lines = append(lines, "")
				lines = append(lines, tableLines(infos, now)...)
			}
			if tty {
				drawn, werr = redraw(a.stdout, drawn, fitFrame(a.stdout, lines))
			} else {
				_, werr = fmt.Fprintln(a.stdout, strings.Join(lines, "\n")+"\n")
			}
		}
		if werr != nil {
			return werr
		}
		next.Reset(interval)
		select {
		case <-ctx.Done():
			return nil
		case <-next.C:
		}
	}
}

var releaseCommand = new(command)

func init() {
	*releaseCommand = command{
		name:    "release",
		summary: "free a lock whoever holds it (--force)",
		usage:   "release --force [FLAGS] NAME",
		conn:    true,
		help: `Frees the lock called NAME whoever holds it, wakes those waiting for it, and
prints what it removed. It is meant for operators clearing a lock whose holder
is stuck: the holder is not asked, and learns of the loss at its next refresh,
told that it was force-released (a dlock run then stops its command and exits
with code 74). The name is free
at once: a waiting run may obtain it and start its command while the old
command still runs, until that refresh and its --grace; a resource that
checks DLOCK_FENCE refuses the old holder. The fence counter stays, so later
holders still get larger fences. Releasing a free name removes nothing and is
not an error.

A process releases its own lock by ending: dlock run releases when its
command exits. --force is required to say that this is the other kind.

Once Redis has freed the name, release exits 0 even if what it removed cannot
be printed (a full disk): it says so on stderr.

Flags:
  --force   required: free the lock whoever holds it
  --json    print what was removed as JSON (as status --json)

Examples:
  dlock release --force nightly
`,
		flags: func(fs *flag.FlagSet) func(*app, []string) error {
			force := fs.Bool("force", false, "")
			asJSON := fs.Bool("json", false, "")
			return func(a *app, args []string) error {
				if err := wantName(releaseCommand, args); err != nil {
					return err
				}
				if !*force {
					return usage(releaseCommand, "release frees a lock whoever holds it and needs --force to say so; a holder releases its own lock by ending its dlock run")
				}
				ctx, stopped := stoppable()
				return stopped(a.forceRelease(ctx, args[0], *asJSON))
			}
		},
	}
}

// forceRelease is the release --force command on the lock called name.
func (a *app) forceRelease(ctx context.Context, name string, asJSON bool) error {
	c, err := a.connect(ctx, name)
	if err != nil {
		return err
	}
	defer c.close()
	info, err := c.locks.ForceRelease(ctx, name)
	if err != nil {
		return a.redisError(c, err)
	}
	if err := a.printReleased(info, asJSON); err != nil {
		// The name is free all the same: a script that checks the code
		// must not take the release for failed, and try it again.
		fmt.Fprintf(a.stderr, "dlock release: %s is free, but what was removed could not be printed: %v\n", quote(info.Name), oneLine(err.Error()))
	}
	return nil
}

// printReleased prints what a force release removed.
func (a *app) printReleased(info *dlock.Info, asJSON bool) error {
	now := time.Now()
	if asJSON {
		return writeJSON(a.stdout, toJSON(info, now))
	}
	var b strings.Builder // written at once, as in status
	if len(info.Holders) == 0 {
		fmt.Fprintf(&b, "%s was not held; nothing was removed\n", quote(info.Name))
	} else {
		fmt.Fprintf(&b, "released %s (%s, newest fence %d)\n", quote(info.Name), kindName(info), info.Fence)
	}
	for _, h := range info.Holders {
		if released(info, h) {
			fmt.Fprintf(&b, "  removed the hold kept for its minimum hold after %s's run: started %s ago with %s left, fence %d, metadata %s\n",
				whoHolds(h), fmtDur(age(h, now)), fmtDur(h.TTL), h.Fence, orDash(oneLine(h.Metadata)))
			continue
		}
		fmt.Fprintf(&b, "  removed holder: %s, held for %s with %s left, fence %d, metadata %s\n",
			whoHolds(h), fmtDur(age(h, now)), fmtDur(h.TTL), h.Fence, orDash(oneLine(h.Metadata)))
	}
	_, err := io.WriteString(a.stdout, b.String())
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// isTerminal reports whether w is a terminal that understands cursor
// movement.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	return os.Getenv("TERM") != "dumb"
}

// redraw replaces the last frame of drawn lines with lines, in place, and
// returns how many it drew, and the write's error.
func redraw(w interface{ Write([]byte) (int, error) }, drawn int, lines []string) (int, error) {
	var b strings.Builder
	if drawn > 0 {
		fmt.Fprintf(&b, "\r\x1b[%dA", drawn) // to the first line of the last frame
	}
	for _, l := range lines {
		b.WriteString(l)
		b.WriteString("\x1b[K\n") // clear what was left of the old line
	}
	b.WriteString("\x1b[J") // and any lines below
	_, err := w.Write([]byte(b.String()))
	return len(lines), err
}
