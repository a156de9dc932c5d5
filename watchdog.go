package dlock

import (
	"container/heap"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock/internal/keyslot"
)

// watchdog refreshes the leases of one client that asked for it
// (WithAutoRefresh). One goroutine serves every lease: it sleeps until the
// earliest refresh falls due, then refreshes every lease due by then or
// soon after, in pipelined batches, so that holding many locks costs a few
// round trips per interval, not one goroutine and one round trip per lock.
// On a Partitioned driver each server's locks go in a pipeline of their
// own, sent from a goroutine of its own (see refreshBatch). On a Pooled
// driver the pipelines leave some of each server's pool to other calls,
// those of the locks nearest their deadlines going first (see claim and
// take).
type watchdog struct {
	c      *Client
	cancel context.CancelFunc // cancels the refreshes under way

	mu     sync.Mutex
	leases leaseHeap
	wake   chan struct{} // a lease was added
	stop   chan struct{} // closed by Client.Close
	done   chan struct{} // closed when the goroutine returns

	// gate is held by the goroutine while it works; tests hold it to stand
	// for a process pause. The goroutines that send the refreshes run on
	// without it, once started.
	gate sync.Mutex

	sending sync.WaitGroup // the goroutines that send a pipeline of refreshes (see refreshBatch)
	givers  sync.WaitGroup // the goroutines that give back what is left of lost locks
	stopped bool           // under mu: close has begun, no give-back starts

	// share is how many pipelines of refreshes the watchdog has out on one
	// server's connection pool at once before the next waits for one of
	// them to return (see take); 0 when the driver's pool is unbounded or
	// unknown (see Pooled).
	share    int
	poolMu   sync.Mutex
	pools    map[string]*poolShare // by server ("" off a Partitioned driver), under poolMu
	swept    time.Time             // when forget last looked at pools, under poolMu
	heldBack atomic.Int64          // how many pipelines waited for another (tests)
}

// poolShare is the watchdog's part of one server's connection pool.
type poolShare struct {
	sent    []time.Time // when each pipeline out went, from claim or take to give
	waiting []*place    // the pipelines held back, earliest deadline first
	// trip is the longest time a pipeline of refreshes took lately on
	// this server (see give, sendBy and slowAt): its own, not the other
	// servers', so that a server steadily slower than the others does not
	// look as if it had just slowed down beside them.
	trip     time.Duration
	returned time.Time // when its last pipeline came back (see forget)
}

// forgetShare is how long a server's share with no pipeline out or held
// back is kept, with its round trips, before it is forgotten (a server
// gone from a cluster, say): longer than the usual refresh interval, so
// that a server's next pass still finds the round trips of its last (see
// slowAt).
const forgetShare = 10 * time.Minute

// place is a pipeline's place in the watchdog's share of a server's pool
// (see claim).
type place struct {
	pool     *poolShare
	deadline time.Time     // its locks' earliest
	claimed  time.Time     // when it claimed its place
	turn     chan struct{} // closed at its turn; nil when it went at once
	sent     time.Time     // when it went: set with its turn, under poolMu
}

const (
	// refreshBatch is the most leases refreshed in one pipeline (a lock
	// split by cluster slot sends a call for each slot).
	refreshBatch = 1000
	// earlyFraction of its interval is how early a lease may be refreshed
	// to join a batch that is going out anyway.
	earlyFraction = 10
	// maxRetryDelay bounds the wait before retrying a refresh that failed
	// for a transient reason.
	maxRetryDelay = 250 * time.Millisecond
)

func newWatchdog(c *Client) *watchdog {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watchdog{c: c, cancel: cancel, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if p, ok := c.driver.(Pooled); ok {
		w.share = watchdogShare(p.PoolSize())
	}
	go w.run(ctx)
	return w
}

// add schedules a lease's first refresh one interval after it was
// obtained, or sooner when its deadline is nearer than a fresh lease's: an
// attached lock may have little of its TTL left. The refresh then comes as
// long before the deadline as it would for a fresh lease (see nextAt), or
// at once if that is past.
func (w *watchdog) add(s *lease) {
	s.mu.Lock()
	next := s.acquired.Add(s.every())
	if byDeadline := s.nextAt(); byDeadline.Before(next) {
		next = byDeadline
	}
	s.mu.Unlock()
	w.mu.Lock()
	s.next, s.moved = next, false
	heap.Push(&w.leases, s)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// remove takes a lease that ended out of the heap, so that it and its
// Lock are not kept until it falls due.
func (w *watchdog) remove(s *lease) {
	w.mu.Lock()
	if s.index >= 0 {
		heap.Remove(&w.leases, s.index)
	}
	w.mu.Unlock()
}

// close stops the goroutine, abandoning the refreshes under way, and waits
// for it and for them to return.
func (w *watchdog) close() {
	close(w.stop) // before the cancel, so that the refreshes it ends see it
	w.cancel()
	<-w.done
	w.sending.Wait()
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.givers.Wait() // bounded: each give-back has cleanupTimeout
}

// giveBack gives back what is left of leases that ended lost (see
// leaseHolder.giveBackRest), on a goroutine of its own, so that a slow
// node does not hold up the caller (the watchdog's other refreshes, a
// deadline's timer); close waits for it. Nothing is given back once the
// watchdog's goroutine has stopped for close.
func (w *watchdog) giveBack(lost []*lease) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || len(lost) == 0 {
		return
	}
	w.givers.Add(1)
	go func() {
		defer w.givers.Done()
		// All within one cleanupTimeout, which bounds Close's wait.
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		for _, s := range lost {
			s.holder.giveBackRest(ctx)
		}
	}()
}

func (w *watchdog) run(ctx context.Context) {
	defer close(w.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Reset(w.untilNext())
		select {
		case <-w.stop:
			return
		case <-w.wake:
			continue
		case <-timer.C:
		}
		w.gate.Lock()
		w.refresh(ctx, w.takeDue(time.Now()))
		w.gate.Unlock()
	}
}

// untilNext returns how long until the earliest lease is due.
func (w *watchdog) untilNext() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.leases) == 0 {
		return time.Hour
	}
	return max(time.Until(w.leases[0].next), 0)
}

// takeDue removes from the heap every lease due by now, or due within a
// tenth of its interval from now: refreshing it a little early lets it join
// this batch instead of costing a round trip of its own.
func (w *watchdog) takeDue(now time.Time) []*lease {
	w.mu.Lock()
	defer w.mu.Unlock()
	var due []*lease
	for len(w.leases) > 0 {
		s := w.leases[0]
		if s.next.After(now.Add(s.every() / earlyFraction)) {
			break
		}
		due = append(due, heap.Pop(&w.leases).(*lease))
	}
	return due
}

// refresh refreshes the leases in pipelined batches and schedules each one's
// next refresh, or drops it once it has ended. The leases go nearest
// deadline first, so that the first pipelines, which take the watchdog's
// share of a pool (see claim), are those of the locks with the least time
// left: in the order they fell due, a lock with a long TTL refreshed
// often would go before one near its deadline.
func (w *watchdog) refresh(ctx context.Context, due []*lease) {
	if len(due) > 1 {
		type dueBy struct {
			s        *lease
			deadline time.Time
		}
		sorted := make([]dueBy, len(due))
		for i, s := range due {
			sorted[i] = dueBy{s, s.Deadline()} // read once: it takes the lease's lock
		}
		slices.SortStableFunc(sorted, func(a, b dueBy) int { return a.deadline.Compare(b.deadline) })
		for i, d := range sorted {
			due[i] = d.s
		}
	}
	for len(due) > 0 {
		n := min(len(due), refreshBatch)
		w.refreshBatch(ctx, due[:n])
		due = due[n:]
	}
}

func (w *watchdog) refreshBatch(ctx context.Context, batch []*lease) {
	now := time.Now()
	out := make([]refreshing, 0, len(batch))
	for _, s := range batch {
		if !s.refreshing() {
			continue
		}
		d := s.Deadline()
		if !now.Before(d) {
			// Too late to refresh: never extend a lock that may have
			// expired. A Refresh may have moved the deadline meanwhile.
			if !s.expireAt(true) {
				w.schedule(s, s.refreshAt())
			}
			continue
		}
		if !s.tryTurn() {
			// A Refresh is under way: its reply settles the deadline. Try
			// again soon, in case it fails.
			w.schedule(s, now.Add(retryDelay(s)))
			continue
		}
		ttl, ok := s.nextRefresh(now)
		if !ok {
			s.endTurn()
			continue // the max hold allows no more: the deadline timer ends it
		}
		// As Refresh does: the server may run it, and set its TTL, well
		// before its reply comes; until then the deadline is the sooner.
		// The refresh's wait is bounded by that deadline, not the one
		// before: a reply after it is of no use (see refreshGroup).
		s.unsure(now, ttl)
		out = append(out, refreshing{s: s, calls: s.holder.refreshCalls(ttl), ttl: ttl, deadline: s.Deadline()})
	}
	// The refreshes confirmed on replicas (WithReplicas) go apart, one
	// pipeline for each setting, each on a goroutine of its own: their
	// WAIT holds the reply up to its timeout, while the other leases'
	// deadlines come.
	plain := out[:0:0]
	var replicated [][]refreshing
	index := map[replication]int{}
	for _, r := range out {
		if r.s.repl.replicas == 0 {
			plain = append(plain, r)
			continue
		}
		i, ok := index[r.s.repl]
		if !ok {
			i = len(replicated)
			index[r.s.repl] = i
			replicated = append(replicated, nil)
		}
		replicated[i] = append(replicated[i], r)
	}
	// Apart on one server too: a pipeline waited for here would hold up
	// the next ones of this pass (more locks than refreshBatch) and the
	// next passes, each as long as a round trip takes, until their locks'
	// deadlines had passed unsent, on a server that answers every refresh
	// in time but slowly.
	w.refreshApart(ctx, now, append(replicated, plain))
}

// refreshApart sends the refreshes of groups on goroutines of their own
// that close waits for, so that the watchdog does not wait for their
// replies before it sends the next: a pipeline for each group, and on a
// Partitioned driver for each server, so that a server that stalls holds
// up only the refreshes of its own locks (the others' replies are taken
// as they come, and the next refreshes go out while it stalls).
//
// On a Pooled driver, each pipeline first claims its place in the
// watchdog's share of its server's pool, here on the watchdog's goroutine,
// nearest deadline first (see claim); one beyond the share then waits for
// one of the watchdog's own to return, for a tenth of the time its locks
// have left at most, and no longer than until the server has slowed down
// (see take).
func (w *watchdog) refreshApart(ctx context.Context, now time.Time, groups [][]refreshing) {
	type pipeline struct {
		server   string
		group    []refreshing
		deadline time.Time // its locks' earliest
	}
	var pipelines []pipeline
	for _, group := range groups {
		if len(group) == 0 {
			continue
		}
		gs, servers := [][]refreshing{group}, []string{""}
		if w.c.lanes != nil {
			gs, servers = w.byServer(ctx, group)
		}
		for i, g := range gs {
			if len(g) > 0 {
				pipelines = append(pipelines, pipeline{servers[i], g, earliest(g)})
			}
		}
	}
	slices.SortStableFunc(pipelines, func(a, b pipeline) int { return a.deadline.Compare(b.deadline) })
	for _, p := range pipelines {
		var at *place
		if w.share > 0 {
			at = w.claim(p.server, p.deadline)
		}
		w.sending.Add(1)
		go func() {
			defer w.sending.Done()
			w.refreshGroup(ctx, now, p.deadline, at, p.group)
		}()
	}
}

// watchdogShare returns the watchdog's share of a pool of size
// connections (see Pooled): all but a quarter of it, and two connections
// at least, kept for other calls, but one at least.
func watchdogShare(size int) int {
	if size <= 0 {
		return 0
	}
	return max(size-max(size/4, 2), 1)
}

// claim claims a place in the watchdog's share of server's pool for a
// pipeline whose locks' earliest deadline is deadline, without waiting:
// while the watchdog has fewer than its share of pipelines out there, the
// pipeline is counted as sent now, and take returns at once; otherwise it
// is held back, in line with those held before it by their deadlines,
// earliest first, and take waits for its turn. The watchdog's goroutine
// claims the places of a pass's pipelines before it starts theirs, nearest
// deadline first (see refreshApart): so the pipelines that take the share
// are those whose locks have the least time left, not those whose
// goroutines happen to run first.
func (w *watchdog) claim(server string, deadline time.Time) *place {
	w.poolMu.Lock()
	defer w.poolMu.Unlock()
	p := w.pools[server]
	if p == nil {
		if w.pools == nil {
			w.pools = map[string]*poolShare{}
		}
		p = &poolShare{}
		w.pools[server] = p
	}
	now := time.Now()
	at := &place{pool: p, deadline: deadline, claimed: now}
	if len(p.sent) < w.share {
		at.sent = now
		p.sent = append(p.sent, now)
		return at
	}
	at.turn = make(chan struct{})
	// After those of the same deadline: first come first among them.
	i, _ := slices.BinarySearchFunc(p.waiting, deadline, func(h *place, d time.Time) int {
		if h.deadline.After(d) {
			return 1
		}
		return -1
	})
	p.waiting = slices.Insert(p.waiting, i, at)
	w.heldBack.Add(1)
	return at
}

// take returns when the pipeline that claimed at may go: at once if it
// was counted then; else it waits for its turn, given by give to the
// pipeline held back with the earliest deadline once the watchdog has
// fewer than its share of pipelines out on the server's pool; or, at the
// latest, until the pipeline must go to be answered before its locks'
// earliest deadline (see sendBy), until the server has slowed down (see
// slowAt), or until the end of ctx (Close, or that deadline): it then
// goes regardless, counted too. So a pass of many locks (a pipeline for
// each 1,000) does not take every connection of a small pool while the
// replies are slow, which would make the client's other calls (a
// Release, an acquire) and the application's wait for the pass, but its
// locks are not left to run out for the sake of those: it waits a tenth
// of the time they have left at most, and no longer than the pipelines
// out take as long as they have lately. Each place is given back by give,
// once the pipeline's request has returned.
func (w *watchdog) take(ctx context.Context, at *place) {
	if at.turn == nil {
		return
	}
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		w.poolMu.Lock()
		p := at.pool
		i := slices.Index(p.waiting, at)
		if i < 0 {
			w.poolMu.Unlock()
			return // given its turn
		}
		now := time.Now()
		until := sendBy(at.deadline, at.claimed, p.trip)
		if slow, ok := w.slowAt(p); ok && slow.Before(until) {
			until = slow
		}
		if !now.Before(until) || ctx.Err() != nil {
			p.waiting = slices.Delete(p.waiting, i, i+1)
			at.sent = now
			p.sent = append(p.sent, now)
			w.poolMu.Unlock()
			return
		}
		w.poolMu.Unlock()
		// The oldest pipeline out may return meanwhile and another take
		// its place: slowAt is then later, and the wait goes on (sendBy
		// too moves with the round trips seen meanwhile).
		t.Reset(until.Sub(now))
		select {
		case <-at.turn:
			return // counted by give, which gave it its turn
		case <-t.C:
		case <-ctx.Done():
		}
	}
}

// slowAt returns when the server of pool p has slowed down, as far as
// the watchdog can tell: when the oldest of its pipelines out there has
// been out for two of the longest recent round trips there (see give).
// Replies may become slow at once, none that slow seen yet: then the
// pipelines out are late too, and one held back for them protects no
// other call's connection for long, while it costs its locks time they
// may need for their own slow replies. ok is false while no pipeline is
// out there, or before any round trip has been seen there. So the share
// protects the other calls before the first round trip, or while the
// replies are steadily slow, on a server slower than the others too;
// after a sudden slowdown it gives way almost at once.
func (w *watchdog) slowAt(p *poolShare) (at time.Time, ok bool) {
	if p.trip <= 0 || len(p.sent) == 0 {
		return time.Time{}, false
	}
	return slices.MinFunc(p.sent, time.Time.Compare).Add(2 * p.trip), true
}

// give gives back the place at of a pipeline sent, now returned, and gives
// the turn to the pipelines held back on its server's pool, earliest
// deadline first, as far as the share allows.
func (w *watchdog) give(at *place) {
	now, sent := time.Now(), at.sent
	w.poolMu.Lock()
	defer w.poolMu.Unlock()
	p := at.pool
	// The longest lately on this server: each pipeline lets the last
	// one's fade by an eighth, so that one slow reply long ago does not
	// have pipelines go early for good.
	p.trip = max(now.Sub(sent), p.trip-p.trip/8)
	p.returned = now
	i := slices.Index(p.sent, sent)
	p.sent = slices.Delete(p.sent, i, i+1)
	for len(p.waiting) > 0 && len(p.sent) < w.share {
		h := p.waiting[0]
		p.waiting = slices.Delete(p.waiting, 0, 1)
		h.sent = now
		p.sent = append(p.sent, now)
		close(h.turn)
	}
	if len(p.sent) == 0 {
		w.forget(now) // nothing waits either
	}
}

// forget forgets the shares of the servers that have had no pipeline out
// or held back for forgetShare, with their round trips: a server gone is
// not kept for good. Not at once: a server's next pass would then hold
// its pipelines back as if no round trip had been seen there (see
// slowAt). It looks once in forgetShare at most: there may be a share
// for each slot of a cluster whose slot map is not at hand (see
// byServer). Called with poolMu held.
func (w *watchdog) forget(now time.Time) {
	if now.Sub(w.swept) < forgetShare {
		return
	}
	w.swept = now
	for server, p := range w.pools {
		if server != "" && len(p.sent) == 0 && len(p.waiting) == 0 && now.Sub(p.returned) > forgetShare {
			delete(w.pools, server)
		}
	}
}

// sendBy returns the latest time a pipeline held back at now may go and
// still be answered before deadline, its locks' earliest, as far as the
// watchdog can tell: two of the longest recent round trips on its server
// (trip) before it. And it waits no more than a tenth of the time its
// locks have left, whatever the round trips seen say: replies may become
// slower at once (none that slow seen yet), and a pipeline held back longer
// would lose its locks to replies that, sent at once, would have come in
// time. So a pipeline held back is answered in time whenever its reply
// takes less than nine tenths of what its locks had left, where one sent
// at once needs it to take less than all of that. Once a round trip has
// been seen, a sudden slowdown sends it sooner still: when the oldest
// pipeline out has taken two of the longest recent round trips (see
// slowAt).
func sendBy(deadline, now time.Time, trip time.Duration) time.Time {
	by := deadline.Add(-2 * trip)
	if most := now.Add(deadline.Sub(now) / 10); most.Before(by) {
		by = most
	}
	return by
}

// earliest returns the earliest deadline of a group of leases being
// refreshed.
func earliest(group []refreshing) time.Time {
	deadline := group[0].deadline
	for _, r := range group[1:] {
		if r.deadline.Before(deadline) {
			deadline = r.deadline
		}
	}
	return deadline
}

// refreshing is a lease being refreshed, with its calls.
type refreshing struct {
	s        *lease
	calls    []*Call
	ttl      time.Duration
	deadline time.Time // the lease's deadline when the refresh was sent
}

// byServer groups leases by the server their calls go to, on a
// Partitioned driver; a lease whose calls go to several (a lock split by
// cluster slot) goes with the others of the same servers. A call whose
// server the driver cannot tell (a Ring, a slot map not at hand) counts
// its hash slot instead, as lanes do.
func (w *watchdog) byServer(ctx context.Context, out []refreshing) (groups [][]refreshing, servers []string) {
	p := w.c.lanes.p
	index := map[string]int{}
	var key strings.Builder
	for _, r := range out {
		key.Reset()
		last := ""
		for i, c := range r.calls {
			var srv string
			if len(c.Keys) > 0 {
				if srv = p.Server(ctx, c.Keys[0]); srv == "" {
					srv = "slot " + strconv.Itoa(keyslot.Of(c.Keys[0]))
				}
			}
			if i == 0 || srv != last {
				key.WriteString(srv)
				key.WriteByte(0)
			}
			last = srv
		}
		i, ok := index[key.String()]
		if !ok {
			i = len(groups)
			index[key.String()] = i
			groups = append(groups, nil)
			servers = append(servers, key.String())
		}
		groups[i] = append(groups[i], r)
	}
	return groups, servers
}

// refreshGroup sends the refreshes of a group of leases, whose earliest
// deadline is deadline, in one pipeline (to one server: see byServer), and
// schedules each one's next refresh, or ends it. On a Pooled driver the
// pipeline counts against the watchdog's share of its server's pool, at
// its place at, while its request is out, not while the replies are read
// and the Refresh hooks run (see take).
func (w *watchdog) refreshGroup(ctx context.Context, now, deadline time.Time, at *place, group []refreshing) {
	// A refresh that cannot answer before the earliest deadline is useless.
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if at != nil {
		w.take(ctx, at)
		w.send(ctx, group)
		w.give(at)
	} else {
		w.send(ctx, group)
	}
	debug := w.c.log.Enabled(ctx, slog.LevelDebug)
	var lost []*lease // found lost by this batch
	defer func() { w.giveBack(lost) }()
	// The leases to refresh again, and when, put back together once the
	// group's replies are all read: put back one by one, each would wake
	// the goroutine, whose pass would take those put back so far, and
	// a pipeline's locks would go out again in several, more at each
	// round, until their pipelines took every connection of the pool.
	back := make([]*lease, 0, len(group))
	later := make([]time.Time, 0, len(group))
	defer func() { w.scheduleAll(back, later) }()
	// Close abandons the refreshes under way: their failures are not
	// reported as failed refreshes.
	abandoned := w.closing()
	for _, r := range group {
		s := r.s
		err := s.holder.refreshed(r.calls)
		notHeld := errors.Is(err, ErrNotHeld)
		s.refreshAnswered(err == nil || notHeld)
		quiet := abandoned && !notHeld && err != nil
		var next time.Time
		again, late := false, false
		switch {
		case err == nil:
			// The Refresh hook hears of a loss told before the reply.
			next, again, err = s.extendAuto(now, r.ttl)
			late = err == nil && lateReply(now, r.ttl)
			if debug && err == nil && !late {
				w.c.log.Debug("dlock: refreshed", "names", s.holder.lockNames(), "ttl", r.ttl)
			}
		case !notHeld:
			// Not once the lease ended (its deadline passed while the
			// refresh was under way): nothing is retried then.
			switch {
			case !s.unsure(now, r.ttl) || quiet:
			case errors.Is(err, ErrDenied):
				// A setting to fix, or the lock is lost at its deadline.
				w.c.log.Error("dlock: refresh denied by Redis; retrying until the lock's deadline", "names", s.holder.lockNames(), "err", err)
			default:
				w.c.log.Warn("dlock: refresh failed; retrying until the lock's deadline", "names", s.holder.lockNames(), "err", err)
			}
			if !quiet {
				s.refreshFailed(err)
			}
			next, again = time.Now().Add(retryDelay(s)), true
		}
		s.endTurn()
		if late {
			// The reply came after the deadline it set: the lock counts
			// as lost, as the deadline timer counts it, and the Refresh
			// hook hears so. Not under the turn: an End hook may refresh.
			s.expireAt(true)
			if err = s.aliveErr(); err != nil {
				again = false
			}
		}
		// Hooks, and the end of a lost lock with its End hook, come after
		// the turn: a hook may refresh the lock. The next refresh is
		// scheduled after the hook, so that the watchdog never runs two
		// Refresh hooks of one lock at once (its refreshes may end on
		// several goroutines, see refreshBatch; a Refresh the caller
		// makes meanwhile runs its own).
		if s.hook != nil && !quiet {
			if p := s.hook.refreshed(ctx, err); p != nil {
				w.c.logHookPanic("Refresh", p) // nobody could recover it here
			}
		}
		if again {
			later = append(later, next)
			back = append(back, s)
		}
		if notHeld && s.lose(err, true) {
			lost = append(lost, s)
		}
	}
}

// closing reports whether Client.Close has stopped the watchdog.
func (w *watchdog) closing() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// retryDelay is how long the watchdog waits before it tries again to
// refresh a lease it could not refresh.
func retryDelay(s *lease) time.Duration { return min(s.every()/4, maxRetryDelay) }

// send sends the leases' refresh calls in one pipeline; they all confirm
// on replicas alike (see refreshBatch).
func (w *watchdog) send(ctx context.Context, group []refreshing) {
	calls := make([]*Call, 0, len(group))
	for _, r := range group {
		calls = append(calls, r.calls...)
	}
	w.c.evalWith(ctx, group[0].s.repl, calls...)
}

// reschedule moves the next refresh of a lease in the heap forward to
// nextAt when that is sooner, and wakes the goroutine when it is the first
// due. A lease out of the heap (being refreshed, its next refresh not yet
// scheduled) is marked, and schedule does the same when it puts it back.
func (w *watchdog) reschedule(s *lease) {
	w.mu.Lock()
	if s.index < 0 {
		s.moved = true
		w.mu.Unlock()
		return
	}
	s.mu.Lock()
	at := s.nextAt()
	s.mu.Unlock()
	first := false
	if at.Before(s.next) {
		s.next = at
		heap.Fix(&w.leases, s.index)
		first = s.index == 0
	}
	w.mu.Unlock()
	if first {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// scheduleAll puts leases back, each with its next refresh time, and wakes
// the goroutine when one of them is the first due.
func (w *watchdog) scheduleAll(leases []*lease, next []time.Time) {
	first := false
	w.mu.Lock()
	for i, s := range leases {
		// Under mu (which the lease's mu nests in), so that a lease that
		// ends meanwhile is either not put back or taken out by remove.
		if !s.refreshing() {
			continue // ended, or released, while it was out of the heap
		}
		at := next[i]
		if s.moved {
			s.moved = false
			s.mu.Lock()
			if by := s.nextAt(); by.Before(at) {
				at = by
			}
			s.mu.Unlock()
		}
		s.next = at
		heap.Push(&w.leases, s)
		first = first || s.index == 0
	}
	w.mu.Unlock()
	if first {
		// The earliest now: the goroutine may be asleep until a later one
		// (a server's refreshes are scheduled from their own goroutine).
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// schedule puts a lease back with its next refresh time (see
// scheduleAll).
func (w *watchdog) schedule(s *lease, next time.Time) {
	w.scheduleAll([]*lease{s}, []time.Time{next})
}

// leaseHeap orders leases by their next refresh.
type leaseHeap []*lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].next.Before(h[j].next) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *leaseHeap) Push(x any) {
	s := x.(*lease)
	s.index = len(*h)
	*h = append(*h, s)
}
func (h *leaseHeap) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	s.index = -1
	*h = old[:len(old)-1]
	return s
}
