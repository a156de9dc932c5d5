package dlock

import (
	"container/heap"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// watchdog refreshes the leases of one client that asked for it
// (WithAutoRefresh). One goroutine serves every lease: it sleeps until the
// earliest refresh falls due, then refreshes every lease due by then or
// soon after, in pipelined batches, so that holding many locks costs a few
// round trips per interval, not one goroutine and one round trip per lock.
type watchdog struct {
	c      *Client
	cancel context.CancelFunc // cancels the refreshes under way

	mu     sync.Mutex
	leases leaseHeap
	wake   chan struct{} // a lease was added
	stop   chan struct{} // closed by Client.Close
	done   chan struct{} // closed when the goroutine returns

	// gate is held by the goroutine while it works; tests hold it to stand
	// for a process pause.
	gate sync.Mutex

	givers  sync.WaitGroup // the goroutines that give back what is left of lost locks
	stopped bool           // under mu: close has begun, no give-back starts
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
	s.next = next
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

// close stops the goroutine, abandoning a refresh under way, and waits for
// it to return.
func (w *watchdog) close() {
	close(w.stop) // before the cancel, so that the refreshes it ends see it
	w.cancel()
	<-w.done
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
// next refresh, or drops it once it has ended.
func (w *watchdog) refresh(ctx context.Context, due []*lease) {
	for len(due) > 0 {
		n := min(len(due), refreshBatch)
		w.refreshBatch(ctx, due[:n])
		due = due[n:]
	}
}

func (w *watchdog) refreshBatch(ctx context.Context, batch []*lease) {
	now := time.Now()
	calls := make([][]*Call, 0, len(batch))
	sent := make([]*lease, 0, len(batch))
	ttls := make([]time.Duration, 0, len(batch))
	deadline := now.Add(time.Hour)
	for _, s := range batch {
		if !s.refreshing() {
			continue
		}
		d := s.Deadline()
		if !now.Before(d) {
			// Too late to refresh: never extend a lock that may have
			// expired. A Refresh may have moved the deadline meanwhile.
			if !s.expireAt() {
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
		if d.Before(deadline) {
			deadline = d
		}
		calls = append(calls, s.holder.refreshCalls(ttl))
		sent, ttls = append(sent, s), append(ttls, ttl)
	}
	if len(calls) == 0 {
		return
	}
	// A refresh that cannot answer before the earliest deadline is useless.
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	w.send(ctx, sent, calls)
	debug := w.c.log.Enabled(ctx, slog.LevelDebug)
	var lost []*lease // found lost by this batch
	defer func() { w.giveBack(lost) }()
	// Close abandons the refreshes under way: their failures are not
	// reported as failed refreshes.
	abandoned := w.closing()
	for i, s := range sent {
		err := s.holder.refreshed(calls[i])
		notHeld := errors.Is(err, ErrNotHeld)
		quiet := abandoned && !notHeld && err != nil
		switch {
		case err == nil:
			next, again := s.extendAuto(now, ttls[i])
			if debug {
				w.c.log.Debug("dlock: refreshed", "names", s.holder.lockNames(), "ttl", ttls[i])
			}
			if again {
				w.schedule(s, next)
			}
		case !notHeld:
			// Not once the lease ended (its deadline passed while the
			// refresh was under way): nothing is retried then.
			if s.unsure(now, ttls[i]) && !quiet {
				w.c.log.Warn("dlock: refresh failed; retrying until the lock's deadline", "names", s.holder.lockNames(), "err", err)
			}
			w.schedule(s, time.Now().Add(retryDelay(s)))
		}
		s.endTurn()
		// Hooks, and the end of a lost lock with its End hook, come after
		// the turn: a hook may refresh the lock.
		if s.hook != nil && !quiet {
			s.hook.refresh(ctx, err)
		}
		if notHeld && s.lose(err) {
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

// send sends the leases' refresh calls in one pipeline, but for the leases
// that confirm on replicas, which go in one pipeline for each setting.
func (w *watchdog) send(ctx context.Context, leases []*lease, calls [][]*Call) {
	groups := map[replication][]*Call{}
	for i, s := range leases {
		groups[s.repl] = append(groups[s.repl], calls[i]...)
	}
	for r, calls := range groups {
		w.c.evalWith(ctx, r, calls...)
	}
}

// schedule puts a lease back with its next refresh time.
func (w *watchdog) schedule(s *lease, next time.Time) {
	if !s.refreshing() {
		return // ended, or released, while it was out of the heap
	}
	w.mu.Lock()
	s.next = next
	heap.Push(&w.leases, s)
	w.mu.Unlock()
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
