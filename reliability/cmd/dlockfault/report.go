package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// runEnv describes the run, for the report's header.
type runEnv struct {
	took      time.Duration
	seed      uint64
	quick     bool
	functions bool // -functions: the scripts ran as Redis Functions
	goVersion string
	cpus      int
}

// writeReport writes the Markdown report of results to path.
func writeReport(path string, results []*result, env runEnv) error {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	mode := ""
	if env.quick {
		mode = " in `-quick` mode (short runs: the figures are small)"
	}
	if env.functions {
		mode += " with `-functions` (every client ran the scripts as Redis Functions, by `FCALL`)"
	}
	w("# Reliability\n\n")
	w("What dlock does when the network between its clients and Redis fails, when the processes that hold locks are\n")
	w("stopped, and when Redis crashes. This page is written by the fault suite, `make reliability` (the program\n")
	w("[`reliability/cmd/dlockfault`](../reliability/cmd/dlockfault), a module of its own), and its figures come from\n")
	w("its last run%s: Redis %s, %s, %d CPUs, %v in all, seed %d. The counts of operations change from run to run;\n",
		mode, redisVersion(), env.goVersion, env.cpus, env.took.Round(time.Second), env.seed)
	w("the columns of failures must stay at zero, and the suite exits with an error when one does not.\n\n")
	w("Every scenario runs real `redis-server` processes on 127.0.0.1. Workers obtain locks with `Lock`, keep them with\n")
	w("`WithAutoRefresh`, and while they hold one they *act* on a resource: a second Redis server that no fault touches.\n")
	w("A holder marks the start and the end of its acting there (numbers from one counter, so in the server's order),\n")
	w("and writes a value with its fence through `Client.SetFenced`. A holder stops acting when `Done` closes.\n")
	w("Workers reach Redis through the goredis driver on go-redis v9.7.3 clients with `ContextTimeoutEnabled` and\n")
	w("a pool of 8 connections, its other settings (three retries of a failed command among them) left as they are.\n\n")
	w("What the columns count:\n\n")
	w("- **overlaps**: two holders of one name acting at once on the resource. An overlap is *explained* when\n")
	w("  [the guarantees page](guarantees.md) says it can happen: a holder whose process was stopped past its TTL,\n")
	w("  a Redis restart without persistence, or a holder that went on acting after its deadline had passed\n")
	w("  (its deadline came before the other holder obtained the lock, by the server's record of when it did; only\n")
	w("  a delayed process does that). Anything else is *unexplained*: a lock held twice.\n")
	w("- **stale writes accepted**: writes the resource applied with a fence older than one it had applied before,\n")
	w("  read from the resource server's `MONITOR` stream, not from what the writers were told.\n")
	w("- **leaks**: after every client has stopped and the longest TTL has passed, any lock still held\n")
	w("  (`Client.List`), and any lock key or waiter set without a TTL (fence counters, kept for a day, are\n")
	w("  not counted); and, while the scenario runs, any lock still held with its token two TTLs after its holder's\n")
	w("  `Release` failed with an error: a holder that gave its lock up must see it run out like a crashed holder's.\n")
	w("- **unreported failures**: calls that returned no error although they failed, judged by an unfaulted\n")
	w("  connection to the lock's server: `Lock` returned a lock that the server showed free or held by another\n")
	w("  while the lease still had time; a `Release` that returned nil with the lock still held by its token;\n")
	w("  a `SetFenced` that returned nil for a write the resource never applied; and a lock found lost *before*\n")
	w("  its deadline with no restart to explain it (counted as an early loss, a broken promise of `Deadline`).\n")
	w("- **errors for calls that succeeded**: the other way round, and safe, but wrong all the same: a `Release` that\n")
	w("  answered `ErrNotHeld` although the lock server's own record (its `MONITOR` stream) shows that it deleted the\n")
	w("  lock. Not counted as a failure above; listed, with its cause, below.\n\n")

	w("## Summary\n\n")
	w("| scenario | injected | operations | overlaps explained / unexplained | stale writes accepted | leaks | unreported failures | errors for calls that succeeded |\n")
	w("|---|---|---|---|---:|---:|---:|---:|\n")
	for _, r := range results {
		if r.lin != nil {
			continue
		}
		w("| [%s](#%s) | %s | %s | %d / %d | %d | %d | %d | %d |\n", r.title, anchor(r.title), r.short, opsLine(r.ops),
			len(r.overlaps)-len(r.unexplained()), len(r.unexplained()), len(r.stale), len(r.leaks), len(r.unreported)+len(r.early),
			len(r.misreported))
	}
	for _, r := range results {
		if r.lin == nil {
			continue
		}
		ops, illegal, unknown := 0, 0, 0
		for _, rd := range r.lin.rounds {
			ops += rd.ops
			switch rd.verdict {
			case porcupine.Illegal:
				illegal++
			case porcupine.Unknown:
				unknown++
			}
		}
		w("\n[Linearizability](#linearizability): %d operations in %d rounds under network faults; %d rounds not linearizable",
			ops, len(r.lin.rounds), illegal)
		if unknown > 0 {
			w(", %d rounds not decided within the checker's time limit", unknown)
		}
		w(".\n")
	}

	w("\n## What the suite found\n\n")
	w("The tests in `reliability/cmd/dlockfault/core_test.go` reproduce each finding in isolation.\n\n")
	w("Open: none.\n\n")
	w("Fixed:\n\n")
	w("- go-redis sends a command again when its connection broke after it was sent (`MaxRetries`, 3 by default), so\n")
	w("  when the reply of a `Release` was lost, the release script ran twice: `Release` answered `ErrNotHeld` for a\n")
	w("  lock it had released (`TestReleaseRunTwiceReportsSuccess`), and a lock held twice by one owner\n")
	w("  (`WithOwner`) lost both holds (`TestReentrantReleaseRunTwiceKeepsTheOtherHold`). Each `Release` now\n")
	w("  carries an id that the release script keeps for a minute, so a repeat changes nothing; this holds for\n")
	w("  exclusive locks, read and write holds and permits (`TestARepeatedHoldReleaseCountsOnce` in the core).\n")
	w("- A `Release` that failed with a Redis error left the lock to the watchdog, which went on refreshing it for as\n")
	w("  long as the client lived: a lock its holder had given up, held for good. `Release` now stops the refreshing\n")
	w("  first, so the lock runs out with its TTL (`TestFailedReleaseStopsTheRefreshing`).\n")
	w("- A holder whose process was stopped past its deadline and then continued could find `Done` still open when\n")
	w("  it looked (3 of 20 pauses): its own goroutine ran before the deadline timer's. `Done` and `Err` now look at\n")
	w("  the deadline themselves (`TestStoppedHoldersFindDoneClosed`). The fence had refused every such late write.\n")
	w("- The repeat of a `Release` ran twice as above still answered `ErrNotHeld` (2 of 394 releases in one\n")
	w("  black-hole round) when another holder's release of the name came between the two runs: the lock hash kept\n")
	w("  only the last release's id. It now keeps the last eight (`TestReleaseCalledAgainAfterALostReplyCountsOnce`\n")
	w("  in the core).\n")
	w("- When releases began granting the lock to the next waiting `Lock` (the grant is held with the waiter's request\n")
	w("  token), the black-hole round found three overlaps in one run: a waiter whose grant notice or acquire reply\n")
	w("  came too late gave the lock back by its request token, and that release, run late, freed a later hold of\n")
	w("  the same request token, which the waiter then took as its own while another caller held the lock. A waiting\n")
	w("  caller now drops a notice it cannot use and never gives a lock back while it still waits; its next attempt\n")
	w("  takes the lock again if it is still held with its request token\n")
	w("  (`TestALateNoticeOfAnEarlierGrantLeavesTheNextOneAlone`,\n")
	w("  `TestAWaiterWhoseGrantCameLateTakesItAgainWithoutGivingItBack` in the core).\n")

	for _, r := range results {
		w("\n## %s\n\n", r.title)
		w("**Injected:** %s.\n\n**Workload:** %s. Took %v.\n\n", r.injected, r.setup, r.took.Round(100*time.Millisecond))
		if r.lin != nil {
			writeLin(&b, r.lin, filepath.Dir(path))
		} else {
			writeFigures(&b, r)
		}
		if ex := r.explained(); len(ex) > 0 {
			w("Explained overlaps, for example:\n\n")
			n := 0
			for _, o := range r.overlaps {
				if o.why != "" && n < 5 {
					w("- %s\n", o)
					n++
				}
			}
			w("\n")
		}
		for _, n := range r.notes {
			w("%s\n\n", n)
		}
		if len(r.misreported) > 0 {
			w("Calls that returned an error although they succeeded (safe, but worth knowing):\n\n")
			for _, m := range limit(r.misreported, 10) {
				w("- %s\n", m)
			}
			w("\n")
		}
		if ps := r.problems(); len(ps) > 0 {
			w("**Broken guarantees (%d):**\n\n", len(ps))
			for _, p := range limit(ps, 20) {
				w("- %s\n", p)
			}
			w("\n")
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func writeFigures(b *strings.Builder, r *result) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	o := r.ops
	w("| figure | value |\n|---|---:|\n")
	w("| acquires (`Lock` calls) | %d: %d granted, %d not obtained, %d errors |\n", o.Acquires, o.Granted, o.NotObtained, o.AcquireErrors)
	w("| releases | %d: %d released, %d `ErrNotHeld`, %d errors |\n", o.Releases, o.Released, o.ReleaseNotHeld, o.ReleaseErrors)
	w("| writes while holding | %d: %d accepted, %d refused as stale, %d errors |\n", o.Writes, o.WritesOK, o.WritesStale, o.WriteErrors)
	w("| holds whose `Done` closed while the holder acted | %d |\n", o.Losses)
	if o.LateWrites > 0 {
		w("| late writes (after `Done` closed) | %d: %d refused as stale, %d accepted before any newer holder wrote |\n", o.LateWrites, o.LateStale, o.LateOK)
	}
	for _, f := range r.figures {
		w("| %s | %s |\n", f[0], f[1])
	}
	ex := r.explained()
	w("| overlaps, explained | %d |\n", len(r.overlaps)-len(r.unexplained()))
	for _, why := range sortedKeys(ex) {
		w("| … %s | %d |\n", why, ex[why])
	}
	w("| **overlaps, unexplained** | **%d** |\n", len(r.unexplained()))
	w("| **stale writes accepted** | **%d** |\n", len(r.stale))
	w("| **leaks** | **%d** |\n", len(r.leaks))
	w("| **unreported failures** | **%d** |\n", len(r.unreported))
	w("| **early losses** | **%d** |\n\n", len(r.early))
	if len(r.errors) > 0 {
		w("Errors returned to the workers: %s.\n\n", strings.Join(r.errors, ", "))
	}
}

func writeLin(b *strings.Builder, l *linResult, reportDir string) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("| round | operations | outcomes | outcome unknown (settled from the server's record) | result | checked in | names held at the end |\n|---|---:|---|---:|---|---:|---:|\n")
	for _, r := range l.rounds {
		verdict := string(r.verdict)
		switch {
		case r.err != nil:
			verdict = "error: " + r.err.Error()
		case r.verdict == porcupine.Illegal:
			verdict = fmt.Sprintf("**not linearizable**: [history](%s)", relTo(reportDir, r.saved))
		case r.verdict == porcupine.Ok:
			verdict = "linearizable"
		case r.verdict == porcupine.Unknown:
			verdict = "not decided in time"
		}
		var outcomes []string
		for _, k := range sortedKeys(r.counts) {
			outcomes = append(outcomes, fmt.Sprintf("%s %d", k, r.counts[k]))
		}
		w("| %s | %d | %s | %d (%d) | %s | %v | %d |\n", r.fault, r.ops, strings.Join(outcomes, ", "), r.unknown, r.resolved, verdict,
			r.checked.Round(time.Millisecond), r.leftover)
	}
	w("\nAn operation whose outcome is unknown returned an error (a timeout, a cut connection). An acquire of unknown\n")
	w("outcome is followed by dlock's cleanup, a release with its token. The lock server's `MONITOR` stream records\n")
	w("which tokens the acquire script wrote a lock for (and with which fence) and which locks the release script\n")
	w("deleted; from it each unknown acquire is settled as taken (with its fence) or not, and each unknown release\n")
	w("as done or not. A settled operation keeps an uncertain time: it may take effect at any moment from its call\n")
	w("until the end of the round (its request may still have been on its way). The rest (refreshes, and releases\n")
	w("of a token released by more than one unknown call) the model lets take effect or not. Any answer that the\n")
	w("record contradicts (a lock granted or released that the server never wrote or deleted) is a failure of its\n")
	w("own. Names still held at the end (taken unseen, or whose release was lost) keep their TTL and are freed with\n")
	w("`ForceRelease` after the round. A history that is not linearizable is saved as porcupine's HTML visualisation\n")
	w("and as JSON under `reliability/out/` (not committed).\n\n")
}

func opsLine(o opCounts) string {
	return fmt.Sprintf("%d acquires, %d releases, %d writes", o.Acquires, o.Releases, o.Writes+o.LateWrites)
}

// anchor is GitHub's anchor for a heading.
func anchor(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

func relTo(dir, path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return path
	}
	if rel, err := filepath.Rel(absDir, abs); err == nil {
		return filepath.ToSlash(rel)
	}
	return path
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func limit(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(s[:n:n], fmt.Sprintf("… and %d more", len(s)-n))
}

// redisVersion asks redis-server for its version.
func redisVersion() string {
	out, err := exec.Command("redis-server", "--version").Output()
	if err != nil {
		return "?"
	}
	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			return v
		}
	}
	return strings.TrimSpace(string(out))
}
