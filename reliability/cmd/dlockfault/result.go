package main

import (
	"sort"
	"time"
)

// result is what one scenario measured.
type result struct {
	key      string // short name, for -only and messages
	title    string
	injected string // what was injected, for the report
	short    string // the same in a few words, for the summary
	setup    string // workers, names, TTL, duration
	took     time.Duration
	ops      opCounts
	faults   faultLog

	overlaps    []overlap
	stale       []string // writes accepted with a fence older than one accepted before
	leaks       []string // locks left behind after their TTL, or keys without a TTL
	unreported  []string // operations that returned no error although they failed
	early       []string // locks lost before their deadline with nothing to explain it
	misreported []string // operations that returned an error although they succeeded
	errors      []string // the kinds of errors returned, with counts
	figures     [][2]string
	notes       []string
	lin         *linResult
	err         error // the scenario could not run to the end
}

// explained counts the overlaps by explanation.
func (r *result) explained() map[string]int {
	m := map[string]int{}
	for _, o := range r.overlaps {
		if o.why != "" {
			m[o.why]++
		}
	}
	return m
}

func (r *result) unexplained() []overlap {
	var out []overlap
	for _, o := range r.overlaps {
		if o.why == "" {
			out = append(out, o)
		}
	}
	return out
}

// problems lists everything that breaks a guarantee.
func (r *result) problems() []string {
	var out []string
	if r.err != nil {
		out = append(out, "did not complete: "+r.err.Error())
	}
	for _, o := range r.unexplained() {
		out = append(out, "unexplained overlap: "+o.String())
	}
	for _, group := range [][]string{r.stale, r.leaks, r.unreported, r.early} {
		out = append(out, group...)
	}
	if r.lin != nil {
		out = append(out, r.lin.problems()...)
	}
	return out
}

func (r *result) figure(label, value string) { r.figures = append(r.figures, [2]string{label, value}) }

// finish analyses what the workers recorded: overlaps, the resource's
// writes, and leaks once every lock should have expired.
//
// record, when not nil, is the lock server's record of what it ran: a
// Release that answered ErrNotHeld before its deadline is an early loss
// unless the record shows that the release script deleted the lock with
// its token, that is, that the Release ran twice.
func (r *result) finish(rec *recorder, res *resource, restarts *restartLog, record *serverRecord, lockAddr, prefix string, wait time.Duration) {
	rec.mu.Lock()
	holds := append([]*hold(nil), rec.holds...)
	writes := append([]write(nil), rec.writes...)
	r.ops = rec.ops
	r.unreported = append(r.unreported, rec.unreported...)
	r.early = append(r.early, rec.early...)
	r.leaks = append(r.leaks, rec.kept...)
	for _, n := range rec.notHeld {
		if record != nil && record.deletedBy(n.token) {
			r.misreported = append(r.misreported, n.msg+", but the server's record shows that the Release itself had deleted it: "+
				"its request ran twice (go-redis sent it again after the reply was lost)")
			continue
		}
		r.early = append(r.early, n.msg)
	}
	rec.mu.Unlock()
	r.errors = rec.errorSummary()
	r.overlaps = overlaps(holds, restarts)
	sort.Slice(r.overlaps, func(i, j int) bool { return r.overlaps[i].b.Enter < r.overlaps[j].b.Enter })

	if err := res.mon.sync(res.rdb); err != nil && r.err == nil {
		r.err = err
	}
	a := audit(res.writes.list(), writes)
	r.stale = append(r.stale, a.stale...)
	r.unreported = append(r.unreported, a.unreported...)
	r.misreported = append(r.misreported, a.misreported...)
	r.figure("writes the resource applied (read from its MONITOR stream)", itoa(a.applied))

	leaks, err := leakCheck(lockAddr, prefix, wait)
	if err != nil && r.err == nil {
		r.err = err
	}
	r.leaks = append(r.leaks, leaks...)
}
