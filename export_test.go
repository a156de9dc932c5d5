package dlock

import "time"

// PauseWatchdog stops c's watchdog from refreshing anything until resume is
// called, as a stopped process (GC pause, SIGSTOP) would: tests use it to
// let a lock run out under its holder. Refreshes already sent still take
// their replies.
func PauseWatchdog(c *Client) (resume func()) {
	w := c.watchdog()
	w.gate.Lock()
	return w.gate.Unlock
}

// SettleWatchdog returns once c's watchdog is between passes and has read
// the replies of every refresh it sent.
func SettleWatchdog(c *Client) {
	w := c.watchdog()
	w.gate.Lock() // no pipeline starts while it is held
	defer w.gate.Unlock()
	w.sending.Wait()
}

// Waiting returns how many callers of c wait in line for the lock called
// name.
func Waiting(c *Client, name string) int {
	h := c.hub()
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.queues[c.RedisKey(name)])
}

// WaitBeat is how long a registered waiter sleeps at most between attempts.
const WaitBeat = waitBeat

// SetWaitBeat sets how long c's registered waiters sleep at most between
// attempts, before any of them waits: a long one shows that notices alone
// wake them.
func SetWaitBeat(c *Client, d time.Duration) {
	h := c.hub()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.beat = d
}

// OnNotice has f called after c handles each notice it receives (before
// any grant it gives back is done: see GivenBack).
func OnNotice(c *Client, f func()) {
	h := c.hub()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.noticed = f
}

// GivenBack waits until the grants c is giving back have been given back.
func GivenBack(c *Client) { c.hub().givers.Wait() }

// WatchedLeases returns how many leases c's watchdog has, 0 when it has
// none.
func WatchedLeases(c *Client) int {
	w := c.watchdogIfAny()
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.leases)
}

// Member returns c's name in waiter sets.
func Member(c *Client) string { return c.hub().member() }

// KeepIdleShardChannels sets how many shard channels no caller listens on
// c stays subscribed to (256 by default).
func KeepIdleShardChannels(c *Client, n int) {
	h := c.hub()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.maxIdle = n
}

// ShardListeners returns how many callers of c listen on the shard channel
// of the lock called name; ok is false when c keeps no such channel.
func ShardListeners(c *Client, name string) (n int, ok bool) {
	h := c.hub()
	h.mu.Lock()
	defer h.mu.Unlock()
	n, ok = h.shards[h.shardChannel(c.RedisKey(name))]
	return n, ok
}

// RefreshWaiting reports whether a Refresh of l waits for another refresh
// of it under way.
func RefreshWaiting(l *Lock) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.turn != nil
}

// LeaseDropped reports whether c's watchdog let l go because its max hold
// allowed no more refreshing.
func LeaseDropped(l *Lock) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped
}

// RefreshEvery returns how often l is refreshed automatically, 0 when not.
func RefreshEvery(l *Lock) time.Duration { return l.every() }

// Pipelines returns how many pipelines c has out, and how many calls wait
// for one.
func Pipelines(c *Client) (inflight, queued int) {
	c.batch.mu.Lock()
	defer c.batch.mu.Unlock()
	return c.batch.inflight, len(c.batch.queue)
}

// NextRefresh returns when c's watchdog refreshes l next; ok is false
// while l is not in its heap (being refreshed, or not refreshed
// automatically).
func NextRefresh(c *Client, l *Lock) (next time.Time, ok bool) {
	w := c.watchdogIfAny()
	if w == nil {
		return time.Time{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return l.next, l.index >= 0
}

// LibraryWithFlags builds the function library as FunctionLibrary does,
// over copies of the scripts, with these flags for their functions.
func LibraryWithFlags(flags map[string]string) *Library {
	var scripts []*Script
	for _, s := range Scripts() {
		c := *s
		scripts = append(scripts, &c)
	}
	return newLibrary(scripts, flags)
}

// FunctionFlags returns the flags of the functions of FunctionLibrary.
func FunctionFlags() map[string]string { return functionFlags }

// Lanes returns how many lanes c keeps: the batchers of its servers, on a
// Partitioned driver, and those of lone calls confirmed on replicas.
func Lanes(c *Client) int {
	n := c.confirmed.len()
	if c.lanes != nil {
		n += c.lanes.set.len()
	}
	return n
}

// PruneLanes drops c's lanes that nobody used since the last time, as the
// first call of a new lane does once their idle time has passed since.
func PruneLanes(c *Client) {
	c.confirmed.prune()
	if c.lanes != nil {
		c.lanes.set.prune()
	}
}

// SetLaneIdle sets how long after the last time c's lanes were pruned the
// first call of a new lane prunes them again (laneIdle by default).
func SetLaneIdle(c *Client, d time.Duration) {
	c.confirmed.setIdle(d)
	if c.lanes != nil {
		c.lanes.set.setIdle(d)
	}
}

// LanePipelines returns how many pipelines the lane of server (on a
// Partitioned driver) has out, and how many calls wait for one; ok is
// false when c keeps no such lane.
func LanePipelines(c *Client, server string) (inflight, queued int, ok bool) {
	b := c.lanes.set.get(laneKey{server: server, slot: -1})
	if b == nil {
		return 0, 0, false
	}
	defer b.done()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inflight, len(b.queue), true
}

// HeldBack returns how many pipelines of refreshes c's watchdog held back
// for its share of the driver's pool (see watchdog.take).
func HeldBack(c *Client) int64 {
	w := c.watchdogIfAny()
	if w == nil {
		return 0
	}
	return w.heldBack.Load()
}

// EndedMax is how many request tokens of ended Locks a client remembers
// at most.
const EndedMax = endedMax

// StateSizes returns how many entries each of c's maps and slices that
// keep state by name, request or server holds, by their field's name:
// a client that locks many distinct names keeps them bounded.
func StateSizes(c *Client) map[string]int {
	sizes := map[string]int{}
	c.mu.Lock()
	sizes["waiting"] = len(c.waiting)
	sizes["busy"] = c.busy
	h, w := c.waits, c.wd
	c.mu.Unlock()
	if h != nil {
		h.mu.Lock()
		sizes["queues"] = len(h.queues)
		sizes["others"] = len(h.others)
		sizes["enrolled"] = len(h.enrolled)
		sizes["unwaits"] = len(h.unwaits)
		sizes["shards"] = len(h.shards)
		sizes["unsent"] = len(h.unsent)
		sizes["pending"] = len(h.pending)
		sizes["idle"] = len(h.idle)
		sizes["ended"] = len(h.ended)
		sizes["endedAt"] = len(h.endedAt)
		sizes["multis"] = h.multis
		h.mu.Unlock()
	}
	if w != nil {
		w.mu.Lock()
		sizes["leases"] = len(w.leases)
		w.mu.Unlock()
		w.poolMu.Lock()
		sizes["pools"] = len(w.pools)
		for _, p := range w.pools {
			sizes["pools.sent"] += len(p.sent)
			sizes["pools.waiting"] += len(p.waiting)
		}
		w.poolMu.Unlock()
	}
	sizes["lanes"] = Lanes(c)
	return sizes
}

// ContextsKept returns how many contexts made by l's Context the lock
// keeps, to cancel them when it ends.
func ContextsKept(l *Lock) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.onEnd)
}

// HoldDeadlineTimer stops l's deadline timer, as a process paused past the
// deadline would find it not yet run.
func HoldDeadlineTimer(l *Lock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.timer != nil {
		l.timer.Stop()
	}
}
