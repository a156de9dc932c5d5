package dlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock/internal/causes"
	"github.com/dlockio/dlock/internal/keyslot"
)

// Waiting is woken by Redis, not by polling. A client that waits for a
// lock registers, in the same script as the refused attempt, in the lock's
// waiter set (a sorted set of client channels, scored by expiry); the
// script that frees the lock publishes a message naming it on the channel
// of the client that registered first, so a release wakes one client, not
// all of them. Inside a client, the callers waiting for one lock queue in
// arrival order and only the first of them makes attempts; the others take
// their turn as it leaves. A lock on several names queues by its first
// name, and a notice about any of its names wakes it: the attempt it
// refused registers at the name that was held. It does not hold up the
// callers behind it (the name may be free while it waits for another):
// the first of them attempts too. The first attempt of an owner's or a
// token's caller does not wait its turn (see waitFor). A release may grant the
// lock to the first waiter instead of telling it to try (see grant.go).
// Notices can be lost and holders can die, so a waiter also wakes at the
// holder's expiry and at least every waitBeat.

const (
	// waitBeat bounds how long a waiter sleeps without trying again. It
	// keeps its registration fresh and bounds the delay if the client it
	// was registered behind died.
	waitBeat = 500 * time.Millisecond
	// waitLease is how long a registration lasts unless renewed.
	waitLease = 3 * waitBeat
)

// waitLeaseArg is waitLease as the scripts take it, boxed once.
var waitLeaseArg any = waitLease.Milliseconds()

// waitHub delivers a client's notices to its waiting callers.
//
// On a driver that subscribes to shard channels (ShardedSubscriber, on a
// Redis Cluster), the client registers in waiter sets as "s|" and its id,
// and listens, for each lock it waits for, on the channel key + ":w:" + id
// in the lock's own slot, where the release script sends its notice by
// SPUBLISH. Channels stay subscribed after their last waiter leaves, up to
// maxIdleShardChannels of them, so that a lock waited for again and again
// costs no SSUBSCRIBE each time. Past that, a sweep lets go of the idle
// channels that have been idle longest, and keeps the newest half: a
// primary whose channels all went would lose its connection (goredis and
// rueidis close a primary's connection left with none), and the next wait
// there would open another, at a churn of names that each wait once.
type waitHub struct {
	c           *Client
	id          string
	shardMember string // the client's name in waiter sets when sharded
	channel     string // the client's own channel, its name in waiter sets

	mu       sync.Mutex
	sub      Subscription  // nil until the first wait, or when unsupported
	sharded  bool          // sub is a ShardedSubscriber's
	opening  chan struct{} // closed when a Subscribe under way ends
	failed   bool          // no notices for good (unsupported, or closed)
	retryAt  time.Time     // after a failed Subscribe, when the next may be tried
	queues   map[string][]*waiter
	others   map[string][]*waiter     // waiters for a lock on several names, by their other names' keys
	enrolled map[string]bool          // keys whose waiter set a caller's attempt may have registered the client in since they were last idle
	unwaits  map[string]*unwaiting    // keys whose waiter set an unwait under way takes the client out of (see enroll)
	shards   map[string]int           // sharded: subscribed channels, by how many waiters listen on them
	unsent   map[string]bool          // sharded: channels in shards not subscribed yet, or whose Subscribe failed; the next listen sends them
	pending  map[string]chan struct{} // sharded: channels with a Subscribe or Unsubscribe under way, closed when it returns
	idle     map[string]uint64        // sharded: channels subscribed that no waiter listens on, by when they became idle (idleSeq)
	idleSeq  uint64                   // sharded: counts channels becoming idle, oldest first
	ended    map[string]uint64        // request tokens of Locks that asked for grants and ended, and the fence each obtained (see forget)
	endedAt  []endedReq               // the same, oldest first
	givers   sync.WaitGroup           // the goroutines that give back grants to ended Locks
	openers  sync.WaitGroup           // the goroutine opening the subscription
	letGo    sync.WaitGroup           // sharded: the goroutines unsubscribing idle channels (see unlisten)
	life     context.Context          // ends at close: an opening subscription gives up
	end      context.CancelFunc       // ends life
	maxIdle  int                      // sharded: idle channels kept subscribed, maxIdleShardChannels; a sweep keeps half
	beat     time.Duration            // waitBeat (tests set it longer, to see that notices suffice)
	refusals uint64                   // outcomes recorded by refusedAt (see rewake)
	multis   int                      // the callers in line for a lock on several names (see rewake)
	noticed  func()                   // tests: called after each notice is handled, nil otherwise
}

// maxIdleShardChannels bounds the shard channels a client stays subscribed
// to while no caller waits for their locks; one more starts a sweep, which
// keeps the half that became idle last.
const maxIdleShardChannels = 256

// waiter is one caller waiting for a lock.
type waiter struct {
	wake       chan struct{} // a notice came, or it became first in line
	listening  bool          // sharded: counted in the hub's shards
	late       []string      // sharded: channels its listen left to its next attempt (see listen)
	req        string        // the caller's request token
	multi      bool          // it waits for a lock on several names
	permits    *atomic.Int64 // a semaphore's count, which the caller's attempts use; nil for a lock
	grant      grantNotice   // a grant the caller was told of, when hasGrant
	hasGrant   bool
	found      keyFound        // what its attempts, and those of the callers ahead of it while it waited, found (see saw)
	refused    string          // a caller on several names: the lock key that refused its last attempt, "" when none did or it is not known, refusedWoken once woken; under the hub's mu
	refusedSeq uint64          // the hub's refusals when refused was set
	inflight   bool            // a caller on several names: an attempt of it is under way; under the hub's mu
	heard      map[string]bool // a caller on several names: the keys notices named while its attempt was under way (see noticeLocked), true, or only a sibling's attempt (see unregisteredLocked), false; under the hub's mu
	unheard    bool            // its last attempt went on without the subscription being opened (see subscribed); under the hub's mu
}

func newWaitHub(c *Client) *waitHub {
	id := newToken()
	h := &waitHub{c: c, id: id, channel: c.prefix + "client:" + id, shardMember: "s|" + id,
		queues: map[string][]*waiter{}, others: map[string][]*waiter{}, enrolled: map[string]bool{}, unwaits: map[string]*unwaiting{}, shards: map[string]int{}, unsent: map[string]bool{},
		idle: map[string]uint64{}, pending: map[string]chan struct{}{}, maxIdle: maxIdleShardChannels, ended: map[string]uint64{}, beat: waitBeat}
	h.life, h.end = context.WithCancel(context.Background())
	return h
}

// member is the client's name in waiter sets.
func (h *waitHub) member() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sharded {
		return h.shardMember
	}
	return h.channel
}

// shardChannel is the shard channel on which the release of lock key is
// told to this client, in the lock's slot (see tell in wake.lua).
func (h *waitHub) shardChannel(key string) string { return key + ":w:" + h.id }

// listen subscribes, with a sharded subscription, to the channels on which
// the release of keys is told to w's client; unlisten lets them go. The
// Subscribe and Unsubscribe calls for one channel never overlap: a listen
// that finds one under way for its channels waits for it to return first,
// so that a channel let go while idle and wanted again at once is
// subscribed after its Unsubscribe, not before (the driver would then take
// the Subscribe for the channel it still has, and drop it). It waits at
// most subscribeWait: a call that a stalled server holds up (a lock on
// several names, one of them on a stalled cluster primary) must not hold
// up the waits for the other names; the channels still under way then
// wait for w's next attempt, whose listen sends those that those calls
// left unsent (see late). A listen whose ctx ends meanwhile returns; its
// wait falls back to timers, and the next listen sends what it could not.
func (h *waitHub) listen(ctx context.Context, keys []string, w *waiter) {
	h.mu.Lock()
	if !h.sharded || h.sub == nil || w.listening && len(w.late) == 0 {
		h.mu.Unlock()
		return
	}
	var chans []string
	if w.listening {
		chans, w.late = w.late, nil
		for _, ch := range chans {
			if h.pending[ch] != nil {
				w.late = append(w.late, ch) // at the next attempt
			}
		}
	} else {
		w.listening = true
		chans = make([]string, len(keys))
		for i, k := range keys {
			ch := h.shardChannel(k)
			chans[i] = ch
			n, ok := h.shards[ch]
			if !ok {
				h.unsent[ch] = true
			} else if n == 0 {
				delete(h.idle, ch)
			}
			h.shards[ch] = n + 1
		}
		var late <-chan time.Time
	wait:
		for {
			busy := h.busy(chans)
			if busy == nil {
				break
			}
			if late == nil {
				t := time.NewTimer(subscribeWait)
				defer t.Stop()
				late = t.C
			}
			h.mu.Unlock()
			select {
			case <-busy:
			case <-late:
				h.mu.Lock()
				for _, ch := range chans {
					if h.pending[ch] != nil {
						w.late = append(w.late, ch)
					}
				}
				break wait
			case <-ctx.Done():
				return
			}
			h.mu.Lock()
		}
	}
	var add []string
	for _, ch := range chans {
		if h.unsent[ch] && h.pending[ch] == nil {
			add = append(add, ch)
			delete(h.unsent, ch)
		}
	}
	sub := h.sub
	if len(add) == 0 || sub == nil {
		h.mu.Unlock()
		return
	}
	done := h.start(add)
	h.mu.Unlock()
	err := sub.Subscribe(ctx, add...)
	h.mu.Lock()
	if err != nil {
		// This wait falls back to timers; the next one for these locks
		// subscribes again.
		for _, ch := range add {
			if _, ok := h.shards[ch]; ok {
				h.unsent[ch] = true
			}
		}
	}
	h.finish(add, done)
	h.mu.Unlock()
	if err != nil {
		h.c.log.WarnContext(ctx, "dlock: cannot subscribe to shard channels; waiting falls back to timers", "err", err)
	}
}

func (h *waitHub) unlisten(ctx context.Context, keys []string, w *waiter) {
	h.mu.Lock()
	if !w.listening {
		h.mu.Unlock()
		return
	}
	w.listening, w.late = false, nil
	for _, k := range keys {
		ch := h.shardChannel(k)
		if h.shards[ch]--; h.shards[ch] == 0 {
			h.idleSeq++
			h.idle[ch] = h.idleSeq
		}
	}
	drop := h.sweep()
	sub := h.sub
	if len(drop) == 0 || sub == nil {
		h.mu.Unlock()
		return
	}
	// In the background, within unsubscribeTimeout: the caller, whose wait
	// is over, does not wait for a primary slow to answer; the listens
	// that want a channel back meanwhile wait for it (see listen).
	done := h.start(drop)
	h.letGo.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.letGo.Done()
		uctx, cancel := context.WithTimeout(h.life, unsubscribeTimeout)
		defer cancel()
		err := sub.Unsubscribe(uctx, drop...)
		h.mu.Lock()
		h.finish(drop, done)
		h.mu.Unlock()
		if err != nil && h.life.Err() == nil { // not Close ending it
			h.c.log.WarnContext(ctx, "dlock: cannot unsubscribe from shard channels", "err", err)
		}
	}()
}

// sweep, once more than maxIdle channels are idle, takes out of the hub
// those idle longest, until half of maxIdle remain, and returns them to be
// unsubscribed; h.mu must be held. The newest stay: among them, a lock
// waited for again and again, and, at a churn of names, some channels of
// each primary, whose connection they keep open.
func (h *waitHub) sweep() (drop []string) {
	if len(h.idle) <= h.maxIdle {
		return nil
	}
	chans := make([]string, 0, len(h.idle))
	for ch := range h.idle {
		chans = append(chans, ch)
	}
	slices.SortFunc(chans, func(a, b string) int { return cmp.Compare(h.idle[a], h.idle[b]) })
	for _, ch := range chans {
		if len(h.idle) <= h.maxIdle/2 {
			break
		}
		if h.pending[ch] != nil {
			// A call under way for it, which a listen gave up waiting
			// for: let go of it at a later sweep, after.
			continue
		}
		// Also when unsent: a Subscribe that failed may be one that the
		// driver goes on with in the background.
		delete(h.idle, ch)
		delete(h.shards, ch)
		delete(h.unsent, ch)
		drop = append(drop, ch)
	}
	return drop
}

// unsubscribeTimeout bounds the Unsubscribe of idle shard channels.
const unsubscribeTimeout = time.Second

// busy returns the done channel of a Subscribe or Unsubscribe under way
// for one of chans, or nil; h.mu must be held.
func (h *waitHub) busy(chans []string) chan struct{} {
	for _, ch := range chans {
		if done := h.pending[ch]; done != nil {
			return done
		}
	}
	return nil
}

// start marks a Subscribe or Unsubscribe of chans under way, and finish
// marks it returned; h.mu must be held for both.
func (h *waitHub) start(chans []string) (done chan struct{}) {
	done = make(chan struct{})
	for _, ch := range chans {
		h.pending[ch] = done
	}
	return done
}

func (h *waitHub) finish(chans []string, done chan struct{}) {
	for _, ch := range chans {
		delete(h.pending, ch)
	}
	close(done)
}

// subscribed opens the client's subscription on first use and reports
// whether notices can be had. The subscription is opened by a goroutine of
// the hub, without holding h.mu, so that notices and other waiters are not
// held up by the dial. Callers wait for it at most subscribeWait, and only
// while their contexts last: a driver may dial, or ask a server, for its
// own timeout whatever the context says, and on a cluster the server it
// asks may be a stalled primary, which must not hold up the attempts on
// the others. A caller w that goes on without it (opening is then set)
// makes its attempt without registering, and tries again when the
// subscription opens (see openSubscription), or after a beat, as a
// registered caller would; the opening goes on, for the callers that come
// later.
func (h *waitHub) subscribed(ctx context.Context, w *waiter) (notices, opening bool) {
	h.mu.Lock()
	// Whether it went on without the subscription last time, which only
	// that opening's end may wake it for.
	unheard := w.unheard
	w.unheard = false
	if h.opening == nil && h.sub == nil && !h.failed && !time.Now().Before(h.retryAt) {
		opening := make(chan struct{})
		h.opening = opening
		h.openers.Add(1)
		go h.openSubscription(opening)
	}
	if opening := h.opening; opening != nil {
		if unheard {
			// It waited for the subscription before: on at once, woken
			// when it opens.
			w.unheard = true
			h.mu.Unlock()
			return false, true
		}
		h.mu.Unlock()
		t := time.NewTimer(subscribeWait)
		defer t.Stop()
		select {
		case <-opening:
		case <-t.C:
		case <-ctx.Done():
			return false, false
		}
		h.mu.Lock()
		if h.opening == opening {
			w.unheard = true
			h.mu.Unlock()
			return false, true
		}
	}
	defer h.mu.Unlock()
	return h.sub != nil, false
}

// subscribeTimeout bounds an attempt to open the client's subscription;
// subscribeRetry is how long after a failed one the next may be made;
// subscribeWait is how long an attempt waits for one being opened (a dial
// takes a round trip or two).
const (
	subscribeTimeout = 10 * time.Second
	subscribeRetry   = time.Second
	subscribeWait    = 250 * time.Millisecond
)

// openSubscription opens the client's subscription and closes opening.
func (h *waitHub) openSubscription(opening chan struct{}) {
	defer h.openers.Done()
	ctx, cancel := context.WithTimeout(h.life, subscribeTimeout)
	defer cancel()
	sub, sharded, err := h.open(ctx)

	h.mu.Lock()
	h.opening = nil
	close(opening)
	closed := h.failed // the client closed meanwhile
	if err == nil && !closed {
		h.sub, h.sharded = sub, sharded
		h.wakeUnheardLocked()
	}
	if err != nil && errors.Is(err, ErrUnsupported) {
		h.failed = true // for good: waits poll by the retry strategy
	} else if err != nil {
		// Waits poll by the retry strategy until the next try, so that a
		// server that refuses the subscription is not asked, and the
		// failure not logged, by every waiting attempt.
		h.retryAt = time.Now().Add(subscribeRetry)
	}
	h.mu.Unlock()
	switch {
	case err != nil && !closed && errors.Is(err, ErrUnsupported):
		h.c.log.Info("dlock: the driver cannot subscribe for lock notices; waiting polls", "err", err)
	case err != nil && !closed:
		h.c.log.Warn("dlock: cannot subscribe for lock notices; waiting polls instead", "err", err)
	case err == nil && closed:
		_ = sub.Close()
	}
}

// open opens the client's subscription: to shard channels where the
// driver can, else to the client's own channel.
func (h *waitHub) open(ctx context.Context) (sub Subscription, sharded bool, err error) {
	if ss, ok := h.c.driver.(ShardedSubscriber); ok {
		sub, err := ss.SubscribeSharded(ctx, h.notify)
		if err == nil {
			return sub, true, nil
		}
		if !errors.Is(err, ErrUnsupported) {
			return nil, false, err
		}
	}
	sub, err = h.c.driver.Subscribe(ctx, h.notify)
	if err == nil {
		if err = sub.Subscribe(ctx, h.channel); err != nil {
			_ = sub.Close()
		}
	}
	return sub, false, err
}

// notify passes a notice that lock key may be free to the first caller
// waiting for it, and to the callers waiting for locks on several names of
// which key is one. (Only the first in line of those acts on it; the others
// look whether they are first and sleep again.) The notice of a grant goes
// to the caller it was granted to, if it still waits; one that gave up
// has given the grant back (see Lock.cleanup), or will. An empty channel
// and payload is the driver's word that it subscribed again after losing
// its connection (see Subscription): the notices sent meanwhile are lost,
// so the first callers waiting for every lock try again at once.
func (h *waitHub) notify(channel, payload string) {
	h.mu.Lock()
	if h.noticed != nil {
		defer h.noticed() // after the unlock below
	}
	defer h.mu.Unlock()
	if channel == "" && payload == "" {
		h.wakeFrontsLocked()
		return
	}
	n, key, isGrant, ok := parseGrant(payload)
	if isGrant && (!ok || h.queues[key] == nil && h.others[key] == nil) {
		if _, waited := h.queues[payload]; waited || h.others[payload] != nil {
			// Not a grant: the plain notice of a key that starts with a
			// NUL byte (a name or prefix that does).
			isGrant = false
			key = payload
		}
	}
	if isGrant {
		if !ok {
			return // not from a dlock script: the waiter's timers cover it
		}
		n.arrived = time.Now()
		for _, w := range h.queues[key] {
			if w.req == n.req {
				w.grant, w.hasGrant = n, true
				w.signal()
				// The grant took the client out of the waiter set: the
				// callers waiting for locks on several names of which
				// key is one register again by trying.
				for _, o := range h.others[key] {
					o.signal()
				}
				return
			}
		}
		// A grant of the hold the Lock obtained (its own attempt found
		// the grant before the notice came) is not given back: the Lock
		// releases it, or did.
		if fence, ended := h.ended[n.req]; ended && n.fence > fence && !h.failed {
			h.returnGrant(key, n.req, n.fence)
		}
		return
	}
	h.wakeLocked(key)
}

// wakeFrontsLocked wakes the first caller waiting for every lock, and the
// callers waiting for locks on several names, so that they try again at
// once; h.mu must be held.
func (h *waitHub) wakeFrontsLocked() {
	for _, q := range h.queues {
		signalFront(q)
	}
	for _, ws := range h.others {
		for _, w := range ws {
			w.signal()
		}
	}
}

// wakeUnheardLocked wakes the callers that went on without the
// subscription while it was being opened, so that they try again at once,
// registering; h.mu must be held.
func (h *waitHub) wakeUnheardLocked() {
	for _, qs := range []map[string][]*waiter{h.queues, h.others} {
		for _, q := range qs {
			for _, w := range q {
				if w.unheard {
					w.unheard = false
					w.signal()
				}
			}
		}
	}
}

// wakeWaiters wakes the callers of c waiting for the lock at key, as a
// notice of its release would, if any wait.
func (c *Client) wakeWaiters(key string) {
	h := c.hubIfAny()
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wakeLocked(key)
}

// wakeAlone wakes, as a notice would, the caller of c first in line for
// the lock at each of keys among those waiting for it alone (not on several
// names), and the callers on several names whose last attempt that key
// refused: a lock of c split by slot took those names, which took c out of
// their waiter sets although these callers waited there (see takeParts),
// and has given them back or released them, which tells the next waiter in
// Redis, not c. Other callers on several names are not woken: refused
// elsewhere, they wait for that other name, and a split lock among them
// would take and give back again, and wake them, over and over, while the
// other name stays held.
func (c *Client) wakeAlone(keys []string) {
	h := c.hubIfAny()
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		alone := false
		for _, ws := range [][]*waiter{h.queues[k], h.others[k]} {
			for _, w := range ws {
				switch {
				case w.multi:
					if w.inflight || w.refused == k {
						h.noticeLocked(w, k)
					}
				case !alone:
					alone = true
					w.signal()
				}
			}
		}
	}
}

// wakeLocked wakes the callers first in line for the lock at key and those
// waiting for a lock on several names of which key is one; h.mu must be
// held.
func (h *waitHub) wakeLocked(key string) {
	eachFront(h.queues[key], func(w *waiter) { h.noticeLocked(w, key) })
	for _, w := range h.others[key] {
		h.noticeLocked(w, key)
	}
}

// noticeLocked passes to w the notice that lock key may be free. A caller
// on several names that another name refused waits for that name's
// notice, not this one: woken, its attempt would take key (on a cluster,
// for as long as the attempt takes its other slots) and refuse the other
// callers waiting for it, whose notice would wake it again, over and over.
// A caller whose attempt is under way takes the notice only if that
// attempt is refused at key, or its outcome is unknown (see refusedAt).
// h.mu must be held.
func (h *waitHub) noticeLocked(w *waiter, key string) {
	switch {
	case !w.multi:
		w.signal()
	case w.inflight:
		if w.heard == nil {
			w.heard = map[string]bool{}
		}
		w.heard[key] = true
	case w.refused == "" || w.refused == refusedWoken || w.refused == key:
		w.signal()
	}
}

// unregisteredLocked tells w, a caller on several names, that another
// caller's attempt may have taken the client out of key's waiter set,
// where w's last attempt registered it (see rewake): w tries again if that
// attempt was refused at key, or its outcome is not known, as a notice
// would have it; but, unlike a notice's, this wake says nothing of key
// being free, so w goes on counting at the name that refused it (see
// moreAt). Woken as by a notice, it would count nowhere, and the next
// attempt of a sibling refused at another of its names (whose own attempt
// takes the client out of w's name for the same reason) would wake it
// again, and it the sibling, over and over while both names stay held.
// h.mu must be held.
func (h *waitHub) unregisteredLocked(w *waiter, key string) {
	switch {
	case w.inflight:
		if w.heard == nil {
			w.heard = map[string]bool{}
		}
		if _, ok := w.heard[key]; !ok {
			w.heard[key] = false // a notice's true stays
		}
	case w.refused == key || w.refused == "":
		w.wakeKeeping()
	}
}

// signalFront wakes the callers first in line in queue q (see eachFront).
func signalFront(q []*waiter) { eachFront(q, (*waiter).signal) }

// eachFront calls f with each caller first in line in queue q: the first,
// and while it waits for a lock on several names, the next too; in a
// semaphore's line, each caller whose count is larger than those of every
// caller ahead of it (see first).
func eachFront(q []*waiter, f func(w *waiter)) {
	seen, most := false, int64(0) // the largest count ahead
	for _, w := range q {
		n := w.count()
		if !seen || n > most {
			f(w)
		}
		if !w.multi {
			if w.permits == nil {
				return // a lock's line: it holds up everyone behind it
			}
			seen, most = true, max(most, n)
		}
	}
}

// count is the semaphore count w's next attempt uses, 0 for a lock.
func (w *waiter) count() int64 {
	if w.permits == nil {
		return 0
	}
	return w.permits.Load()
}

// blocks reports whether x, ahead of w in line for one name, holds w up:
// x waits for that name alone, and whenever w would be let in, x would be
// too (a lock; a semaphore's caller whose count is no smaller than w's).
func (x *waiter) blocks(w *waiter) bool {
	return !x.multi && x.count() >= w.count()
}

// join puts a caller in line for the lock whose keys are keys: in the
// queue of the first, and told of notices about the others. req is its
// request token, by which the notice of a grant names it.
func (h *waitHub) join(keys []string, req string, permits *atomic.Int64) *waiter {
	w := &waiter{wake: make(chan struct{}, 1), req: req, multi: len(keys) > 1, permits: permits}
	if w.multi {
		// Registered nowhere yet: its first attempt registers it where it
		// is refused, and until then it counts at no name (see moreAt). One
		// in line behind a caller waiting for its first name alone makes
		// no attempt until that one leaves: counted at its other names, it
		// would keep the client first at a free one, whose notice it
		// cannot use.
		w.refused = refusedWoken
	}
	h.mu.Lock()
	if w.multi {
		h.multis++
	}
	for _, x := range h.queues[keys[0]] {
		if x.blocks(w) {
			// What the caller first in line knows of the name is where
			// this one starts: it waits on that caller's attempts.
			w.found = x.found
			break
		}
	}
	h.queues[keys[0]] = append(h.queues[keys[0]], w)
	if isFirst(h.queues[keys[0]], w) {
		w.signal()
	}
	for _, k := range keys[1:] {
		h.others[k] = append(h.others[k], w)
	}
	h.mu.Unlock()
	return w
}

// endedKeep is how long a client remembers the request token of a Lock
// that ended (see forget), and endedMax how many it remembers at most.
const (
	endedKeep = time.Minute
	endedMax  = 1024
)

// forget records that the Lock with request token req, which asked for
// grants, ended (released, or gave up): no caller will act on req again.
// fence is the fence of the hold it obtained, 0 if none. An attempt of it
// that ran late (sent again by the client library, or held up on a slow
// connection) can still leave its request with a lock and be granted it;
// the notice of such a grant (with a larger fence) then comes to no
// waiter, and the hub gives the lock back instead of leaving it held by
// nobody for its TTL. The notice of the grant the Lock obtained itself,
// late, is not such a one.
func (h *waitHub) forget(req string, fence uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if f, ok := h.ended[req]; ok {
		h.ended[req] = max(f, fence) // another Lock of the same token
		return
	}
	now := time.Now()
	for len(h.endedAt) > 0 && (len(h.endedAt) >= endedMax || now.Sub(h.endedAt[0].at) > endedKeep) {
		delete(h.ended, h.endedAt[0].req)
		h.endedAt = h.endedAt[1:]
	}
	if len(h.endedAt) == 0 {
		h.endedAt = nil // let the array go
	}
	h.ended[req] = fence
	h.endedAt = append(h.endedAt, endedReq{req, now})
}

// tookGrantable tells the client's wait hub, if it has one, that a Lock
// obtained with request token req a name with fence: a grant notice for
// req with that fence (or an earlier one) is of a hold that a Lock took,
// not one to give back. Locks of one token (WithToken) share their
// request token, and one may take a hold granted to another that ended.
func (c *Client) tookGrantable(req string, fence uint64) {
	h := c.hubIfAny()
	if h == nil {
		return
	}
	h.mu.Lock()
	if f, ok := h.ended[req]; ok && fence > f {
		h.ended[req] = fence
	}
	h.mu.Unlock()
}

// endedReq is a request token forget recorded, and when.
type endedReq struct {
	req string
	at  time.Time
}

// returnGrant releases, in the background, the lock key granted to the ended
// request token req with fence, as its Lock's clean-up would, if that
// grant's hold is still there (a Lock of the same token, WithToken, may
// hold the name with a later one); h.mu must be held, and the hub not
// closed (close waits for it).
func (h *waitHub) returnGrant(key, req string, fence uint64) {
	member := h.channel
	if h.sharded {
		member = h.shardMember
	}
	h.givers.Add(1)
	go func() {
		defer h.givers.Done()
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		call := &Call{Script: scriptRelease, Keys: []string{key, key + ":waiters", key + ":fence", key + ":late"},
			Args: h.c.fenceArg([]any{req, "", member, strconv.FormatUint(fence, 10)}, 7)}
		h.c.evalWith(ctx, replication{}, call)
		if call.Err != nil {
			h.c.log.WarnContext(ctx, "dlock: could not give back a lock granted to a caller that was gone; it expires with its TTL", "names", []string{causes.Short(h.c.nameOf(key))}, "err", call.Err)
		}
	}()
}

// granted returns the grant w was told of, if any, and forgets it.
func (h *waitHub) granted(w *waiter) (grantNotice, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, ok := w.grant, w.hasGrant
	w.grant, w.hasGrant = grantNotice{}, false
	return n, ok
}

// first reports whether w is first in line for key. Callers waiting for a
// lock on several names do not hold up those behind them: such a caller may
// wait for another name while key is free, so the caller after it counts as
// first too. Nor does a semaphore's caller whose count is smaller than w's
// (another handle, or an older count): it may be refused while w would
// get in.
func (h *waitHub) first(key string, w *waiter) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return isFirst(h.queues[key], w)
}

// isFirst reports whether w is first in line in queue q (see first).
func isFirst(q []*waiter, w *waiter) bool {
	for _, x := range q {
		if x == w {
			return true
		}
		if x.blocks(w) {
			return false
		}
	}
	return false
}

// moreAt returns, for each of keys, '1' when callers of the client other
// than w wait for it, else '0': an attempt that obtains the lock registers
// the client again at those names, for them, and one refused elsewhere
// stays registered at those that are free (see acquire.lua's
// leave_others). With lone (w is an exclusive lock on one name), the
// callers waiting behind w for that name alone do not count: they wait
// for w to leave the line, which it does as soon as it obtains the lock,
// and the first of them then tries at once, registering the client if it
// is refused, as when a release grants w the lock and takes the client
// out of the waiter set. Registered again for them, the client would be
// told at w's release that the lock may be free, while that caller's
// attempt is already under way. A caller on several names counts at the name that refused
// its last attempt, or at every name when that is not known, and at none
// once woken since, before its first attempt, or after one that registered
// nowhere (its next attempt registers it where it is refused):
// refused elsewhere, it is registered where it was refused, and a client
// kept first at a free name for it would keep that name's notice from the
// other clients waiting for it, while that caller cannot take it.
//
// seen is the count of outcomes refusedAt recorded when moreAt looked,
// for rewake.
func (h *waitHub) moreAt(keys []string, w *waiter, lone bool) (more string, seen uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := make([]byte, len(keys))
	for i, k := range keys {
		b[i] = '0'
		for _, ws := range [][]*waiter{h.queues[k], h.others[k]} {
			if slices.ContainsFunc(ws, func(x *waiter) bool {
				if x == w || lone && !x.multi {
					return false
				}
				return !x.multi || x.refused == "" || x.refused == k
			}) {
				b[i] = '1'
			}
		}
	}
	return string(b), h.refusals
}

// rewake wakes the callers on several names, other than w, whose attempt
// came back refused at one of keys (but kept, the key that refused w), or
// with its outcome unknown, since moreAt looked for w's attempt (seen):
// that attempt may have registered the client there while w's, which did
// not count it, took the client out (obtaining the lock, or refused
// elsewhere at a free name; a lock split by slot always does), and no
// release there would tell it. Woken, it tries again, and registers where
// it is refused. A caller whose attempt is still under way may have
// registered so too, before w's ran: it is woken if its attempt comes
// back refused at one of those keys, or with its outcome unknown. Keys at
// which w's attempt counted more callers (more) are not among them: it
// left no waiter set there. The callers woken go on counting where they
// were refused (see unregisteredLocked).
func (h *waitHub) rewake(keys []string, more string, seen uint64, w *waiter, kept string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.multis == 0 || h.multis == 1 && w.multi {
		return // no other caller on several names: none to wake
	}
	for i, k := range keys {
		if k == kept || i < len(more) && more[i] == '1' {
			// Refused there, it stayed registered; told that more callers
			// wait there, it stayed registered, or registered again.
			continue
		}
		for _, ws := range [][]*waiter{h.queues[k], h.others[k]} {
			for _, x := range ws {
				switch {
				case x == w || !x.multi:
				case x.inflight || x.refusedSeq > seen:
					h.unregisteredLocked(x, k)
				}
			}
		}
	}
}

// refusedWoken is waiter.refused for a caller on several names that was
// woken since its last attempt, has yet to make one, or made one that
// registered nowhere: its next attempt registers it where it is refused,
// and it counts at no name (see moreAt).
const refusedWoken = "\x00woken"

// refusedAt records key as the lock key that refused w's last attempt, ""
// for none or not known (see moreAt).
//
// A notice of that key that came while the attempt was under way (or of
// any key, when the outcome is not known) wakes w: the name may have been
// freed since it was refused there.
func (h *waitHub) refusedAt(w *waiter, key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refusals++
	w.refused, w.refusedSeq = key, h.refusals
	notice, heard := w.heard[key]
	if key == "" || key == refusedWoken {
		heard = len(w.heard) > 0
		for _, n := range w.heard {
			notice = notice || n
		}
	}
	w.inflight, w.heard = false, nil
	switch {
	case notice:
		w.signal()
	case heard:
		// Only a sibling's attempt that may have taken the client out
		// of the waiter set (see unregisteredLocked).
		w.wakeKeeping()
	}
}

// attempting forgets a pending signal of w, which the attempt it is about
// to make answers, and, for a caller on several names, marks the attempt
// under way (see noticeLocked) until refusedAt.
func (h *waitHub) attempting(w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w.drain()
	if w.multi {
		w.inflight, w.heard = true, nil
	}
}

// enroll records that an attempt for the lock whose keys are keys may
// register the client in their waiter sets: it asks to, and whether it did
// is known only from a reply that may be lost. It first waits, until ctx
// ends, for the unwaits under way at those keys: one that ran after the
// attempt (on another connection, say) would take the new registration
// out, and the next release would tell nobody.
func (h *waitHub) enroll(ctx context.Context, keys []string) {
	for {
		h.mu.Lock()
		var pending chan struct{}
		for _, k := range keys {
			if u := h.unwaits[k]; u != nil {
				pending = u.done
				break
			}
		}
		if pending == nil || ctx.Err() != nil {
			for _, k := range keys {
				h.enrolled[k] = true
			}
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		select {
		case <-pending:
		case <-ctx.Done():
		}
	}
}

// unwaiting counts the unwaits under way at one key; done is closed when
// the last returns.
type unwaiting struct {
	n    int
	done chan struct{}
}

// unwaited records that the unwait of keys that leave announced returned.
func (h *waitHub) unwaited(keys []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		if u := h.unwaits[k]; u != nil {
			if u.n--; u.n == 0 {
				close(u.done)
				delete(h.unwaits, k)
			}
		}
	}
}

// leave takes w out of line for the lock whose keys are keys and lets the
// next caller try at once. It returns those of keys that no other caller
// of the client waits for, first in line or not, and in whose waiter sets
// an attempt of any of its callers registered the client (see enroll):
// that registration serves nobody now. With unwait, the caller takes the
// client out of those sets (Client.unwait, which calls unwaited when it
// returns), and the attempts that enroll meanwhile wait for it.
func (h *waitHub) leave(keys []string, w *waiter, unwait bool) (idle []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.multi {
		h.multis--
	}
	for _, k := range keys[1:] {
		if o := without(h.others[k], w); len(o) > 0 {
			h.others[k] = o
		} else {
			delete(h.others, k)
		}
	}
	if q := without(h.queues[keys[0]], w); len(q) > 0 {
		h.queues[keys[0]] = q
		signalFront(q)
	} else {
		delete(h.queues, keys[0])
	}
	for _, k := range keys {
		if len(h.queues[k]) == 0 && len(h.others[k]) == 0 {
			if h.enrolled[k] {
				idle = append(idle, k)
				if unwait {
					u := h.unwaits[k]
					if u == nil {
						u = &unwaiting{done: make(chan struct{})}
						h.unwaits[k] = u
					}
					u.n++
				}
			}
			delete(h.enrolled, k)
		}
	}
	return idle
}

// keyFound is what the last answered attempt at a lock's key found: the
// lock held (refused), or a failure (see waitEnded); neither before one.
type keyFound struct {
	refused bool
	failing error
}

// add records what an attempt found: the lock held (err nil), or a failure.
func (f *keyFound) add(err error) {
	*f = keyFound{refused: err == nil, failing: err}
}

// saw records what an attempt of w at key found, which the attempt's end
// did not cut short (the lock held, err nil, or a failure), and, when w is
// first in line for key alone, hands it to the callers waiting behind it:
// they make no attempts of their own meanwhile, and what w finds is their
// answer too (a lock on several names may be refused for another of its
// names, and hands nothing).
func (h *waitHub) saw(key string, w *waiter, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w.found.add(err)
	h.eachBehindLocked(key, w, func(x *waiter) { x.found.add(err) })
}

// obtained records that w obtained the lock at key: what w found before
// says nothing of the lock now. For the callers waiting behind it, the lock
// is held when w's hold excludes them (an exclusive lock, a write hold);
// otherwise (a read hold, a permit) they start again from no answer.
func (h *waitHub) obtained(key string, w *waiter, excludes bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := keyFound{refused: excludes}
	w.found = now // a caller joining before w leaves starts from it
	h.eachBehindLocked(key, w, func(x *waiter) { x.found = now })
}

// eachBehindLocked calls f with each caller waiting behind w at key that w
// holds up (see blocks), when w is first in line for key alone; h.mu must
// be held.
func (h *waitHub) eachBehindLocked(key string, w *waiter, f func(x *waiter)) {
	q := h.queues[key]
	if w.multi || !isFirst(q, w) {
		return
	}
	behind := false
	for _, x := range q {
		if behind && w.blocks(x) {
			f(x)
		}
		behind = behind || x == w
	}
}

// knows returns what w's attempts, and those of the callers ahead of it
// while it waited behind them, found (see saw).
func (h *waitHub) knows(w *waiter) keyFound {
	h.mu.Lock()
	defer h.mu.Unlock()
	return w.found
}

// without removes w from ws.
func without(ws []*waiter, w *waiter) []*waiter {
	for i, x := range ws {
		if x == w {
			return append(ws[:i], ws[i+1:]...)
		}
	}
	return ws
}

// deafen closes the subscription, for good: waits go on without notices
// (see Client.closedUnder).
func (h *waitHub) deafen() {
	if sub := h.unsubscribed(); sub != nil {
		_ = sub.Close()
	}
}

// unsubscribed takes the subscription away, for good (none is opened
// again), and returns it, or nil, for the caller to close.
func (h *waitHub) unsubscribed() Subscription {
	h.mu.Lock()
	defer h.mu.Unlock()
	sub := h.sub
	h.sub, h.failed = nil, true
	return sub
}

func (h *waitHub) close() {
	sub := h.unsubscribed()
	h.end()
	if sub != nil {
		_ = sub.Close()
	}
	h.openers.Wait()
	h.letGo.Wait()
	h.givers.Wait()
}

func (w *waiter) signal() {
	if w.multi {
		// Under the hub's mu, as every signal is: woken, it tries again,
		// and registers where it is refused then (see moreAt).
		w.refused = refusedWoken
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// wakeKeeping wakes w as signal does, but a caller on several names goes
// on counting where it did (see unregisteredLocked); under the hub's mu.
func (w *waiter) wakeKeeping() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// drain forgets a pending signal.
func (w *waiter) drain() {
	select {
	case <-w.wake:
	default:
	}
}

// sleep waits for a signal, d, or the end of ctx; an ended ctx wins.
func (w *waiter) sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.wake:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitArgs tells an attempt how its caller waits.
type waitArgs struct {
	channel string // the client's channel; "" when not registering
	more    string // for each of the lock's names, '1' when more callers of this client wait for it, else '0'; "" when not registering
	attempt string // set by an exclusive Lock's attempt that asks for a grant: its number
	waiting bool   // set for every attempt of a waiting caller
	ahead   bool   // the attempt goes ahead of its turn in the client (see waitFor): it records nothing in Redis
}

// errGiveBack is the error of an attempt across cluster slots that could
// not tell whether it gave back the names it took: that release may still
// run, late, after the caller's next attempt took those names again with
// the same request token, and free them under it. So a waiting caller stops
// waiting then, and cleans up.
var errGiveBack = errors.New("dlock: giving back the names an attempt took failed")

// gaveBackError is errGiveBack with the bound of the give-back that failed,
// which the wait's exit shares (see waitFor).
type gaveBackError struct{ by time.Time }

func (e *gaveBackError) Error() string        { return errGiveBack.Error() }
func (e *gaveBackError) Is(target error) bool { return target == errGiveBack }

// errLateReply is why an acquire whose reply came back after the lock's
// validity (its TTL less the drift allowance) failed.
var errLateReply = errors.New("the reply came back after the lock's TTL, less the drift allowance, had run out")

// errLate is the error of an attempt whose grant came back after its
// validity while its caller waits: the caller tries again at once, and
// gives back whatever the attempt may hold only if it gives up.
var errLate = errors.New("dlock: late grant")

// attempt is one try at obtaining a primitive: nil when obtained, an error
// matching ErrNotObtained (with how long the holder's lock has left) when
// held, any other error when the outcome is unknown or final.
type attempt func(ctx context.Context, wa waitArgs) (holderTTL time.Duration, err error)

// grantee is a waiting caller as a release may grant it the lock (see
// grant.go): its request token, and what takes a grant; and, for a
// semaphore, the count its attempts use, by which it takes its place in
// line (see first).
type grantee struct {
	req     string
	claim   func(ctx context.Context, n grantNotice) bool
	permits *atomic.Int64
	// lone is set for an exclusive lock: the callers of the client
	// waiting behind it for its one name try as soon as it leaves the
	// line (see moreAt).
	lone bool
	// exitBy, unless nil, returns the bound of a give-back of the last
	// attempt that began once the wait's context had ended, or ran past
	// its end, or the zero time: the wait's exit began with it (see
	// Lock.exitBy).
	exitBy func() time.Time
}

// waitFor makes attempts until one obtains the lock whose keys (one a
// name) are keys, as Lock describes: woken by notices when the driver can
// subscribe, while its subscription is being opened by its opening or a
// beat, by the retry strategy's waits otherwise, and always at the
// holder's expiry; or until g claims a lock a release granted it. giveUp
// is called with the last error when it gives up; uncertain tells it
// whether an attempt may have taken the lock unseen.
//
// names are the lock's names, for log records, and what names the lock in
// the error of a wait that ended first. eager makes
// the first attempt before the caller gets in line behind the callers of
// this client that came first. excludes is set when the hold keeps out
// every other (an exclusive lock, a write hold).
func (c *Client) waitFor(ctx context.Context, keys, names []string, what string, o *options, eager, excludes bool, try attempt, g grantee, giveUp func(uncertain bool, err error) error) error {
	key := keys[0]
	// A wait that gives up has cleanupTimeout for all of its exit: the
	// clean-up of its last attempt, and then leaving the waiter sets, so
	// that it ends within Close's bound (an unwait it has no time left for
	// lapses with the registration, within 1.5s).
	var gaveUp time.Time
	abandoned := false
	abandon := func(uncertain bool, err error) error {
		abandoned = true
		gaveUp = time.Now()
		if gb := (*gaveBackError)(nil); errors.As(err, &gb) {
			// Given up when that give-back began: it used that time.
			gaveUp = gb.by.Add(-cleanupTimeout)
		} else if g.exitBy != nil {
			// So too when that give-back was answered.
			if by := g.exitBy(); !by.IsZero() && by.Add(-cleanupTimeout).Before(gaveUp) {
				gaveUp = by.Add(-cleanupTimeout)
			}
		}
		return giveUp(uncertain, err)
	}
	ctx, unwatch := c.endsAtClose(ctx)
	defer unwatch()
	if errors.Is(context.Cause(ctx), ErrClosed) {
		return fmt.Errorf("%s: %w", what, ErrClosed) // Close came first: nothing sent
	}
	if bound := maxWait(ctx, o.maxWait); bound > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, bound, maxWaitPassed(bound, o.maxWait > 0))
		defer cancel()
	}
	hub := c.hub()
	w := hub.join(keys, g.req, g.permits)
	obtained := false
	rejoined := false // the attempt that obtained it registered the client again, for its other callers
	defer func() {
		// The attempt that obtains the lock also leaves the waiter sets.
		// The last caller of the client to give up leaves them for every
		// caller that registered, itself or one before it; and so does one
		// that obtained it registering again for callers that have all
		// given up since.
		unwait := !obtained || rejoined
		if idle := hub.leave(keys, w, unwait); len(idle) > 0 && unwait {
			c.unwait(ctx, idle, gaveUp)
		}
		hub.unlisten(context.WithoutCancel(ctx), keys, w)
	}()
	uncertain := false // an attempt may have taken the lock without our knowing
	retriedLate := false
	aheadUnknown := false // the last attempt went ahead of its turn, and its outcome is unknown
	defer func() {
		// Every return but the lock's is by abandon: anything else is a
		// panic or runtime.Goexit (of the retry strategy, the logger, a
		// WithOnRetry function or hook), which abandons the acquisition
		// first, so that no attempt leaves anything behind (a waiting
		// writer's pending acquire, a registration), and goes on.
		if !obtained && !abandoned {
			_ = abandon(uncertain, nil)
		}
	}()
	for failed := 0; ; {
		// An owner's re-entry, or an acquire with its token, may succeed
		// while the lock is held: its first attempt does not wait behind
		// the callers of this client that wait for the holder (it may be
		// the holder). That attempt does not register, so as not to
		// replace the grant request the first of them left, and records
		// nothing (a read/write lock's pending writer or queue entry),
		// so as not to keep out the callers ahead of it. So does the next
		// attempt while that one's outcome is unknown (its reply was
		// lost): it may hold the lock, which the callers ahead of it wait
		// for, and sent again it finds that hold and counts once.
		ahead := eager && (failed == 0 || aheadUnknown)
		// Wait for our turn behind the callers of this client that came
		// first; an attempt ahead of its turn does not register.
		first := hub.first(key, w)
		for ; !first && !ahead; first = hub.first(key, w) {
			if w.sleep(ctx, time.Hour) != nil {
				return abandon(uncertain, waitEnded(ctx, what, hub.knows(w), nil))
			}
		}
		if n, ok := hub.granted(w); ok && g.claim(ctx, n) {
			obtained = true
			hub.obtained(key, w, excludes)
			return nil
		}
		hub.attempting(w) // a signal from before this attempt is answered by it
		notices, opening := hub.subscribed(ctx, w)
		wa := waitArgs{waiting: true, ahead: !first}
		var seen uint64 // see rewake
		if notices && first {
			hub.listen(ctx, keys, w)
			// The attempt may register the client even if its reply is
			// lost or the wait ends first: the last caller to give up
			// then leaves the sets all the same. (Before moreAt: a caller
			// that joins while enroll waits is counted.)
			hub.enroll(ctx, keys)
			wa.more, seen = hub.moreAt(keys, w, g.lone && !w.multi)
			wa.channel = hub.member()
		}
		holderTTL, err := try(ctx, wa)
		refusedBy := refusedKey(err)
		if w.multi {
			if wa.channel == "" {
				// Registered nowhere (ahead of its turn, or without
				// notices yet): it counts at no name (see moreAt).
				hub.refusedAt(w, refusedWoken)
			} else {
				hub.refusedAt(w, refusedBy)
			}
		}
		if wa.channel != "" {
			hub.rewake(keys, wa.more, seen, w, refusedBy)
		}
		if err == nil {
			obtained, rejoined = true, strings.Contains(wa.more, "1")
			hub.obtained(key, w, excludes)
			return nil
		}
		if isFinal(err) {
			return abandon(uncertain, err)
		}
		if errors.Is(err, errGiveBack) {
			// Names may be left taken, whatever the refusal behind it.
			return abandon(true, err)
		}
		if refused, ranInPart := refusedForGood(err); refused {
			// A missing password or permission: waiting would only hide
			// it behind the wait's end.
			return abandon(uncertain || ranInPart, err)
		}
		late := errors.Is(err, errLate)
		notHeld := errors.Is(err, ErrNotObtained) && !late
		aheadUnknown = wa.ahead && !notHeld
		uncertain = uncertain || !notHeld
		// Cut short by the wait's end: no answer (decided once, as the
		// clock moves on).
		short := !notHeld && cutShort(ctx, err)
		switch {
		case notHeld:
			hub.saw(key, w, nil)
		case !short:
			hub.saw(key, w, err)
		}
		failed++
		if o.onRetry != nil {
			onRetry(o.onRetry, failed, err, func() { _ = abandon(uncertain, err) })
		}
		c.log.DebugContext(ctx, "dlock: attempt failed", "names", causes.Shorts(names), "attempt", failed, "err", err)
		d, ok := o.retry.NextBackoff(failed)
		d = max(d, minBackoff)
		if !ok {
			if short {
				// The wait ended with the attempt: what Redis said last
				// decides, as when the wait ends between attempts.
				return abandon(uncertain, waitEnded(ctx, what, hub.knows(w), err))
			}
			return abandon(uncertain, err)
		}
		switch {
		case late && !retriedLate:
			// The lock may still be held with the request token: take it
			// again at once, once; replies that keep coming late follow
			// the retry strategy.
			d, retriedLate = 0, true
		case notHeld && wa.channel != "":
			// Registered: the release will say when to try again.
			d = hub.beat
		case notHeld && opening:
			// Not registered, as the subscription is still being opened:
			// its opening, or a beat, says when to try again.
			d = hub.beat
		case notHeld && notices:
			d = 0 // refused before registering: try again at once, registering
		}
		if holderTTL > 0 && holderTTL < d {
			d = holderTTL
		}
		if w.sleep(ctx, d) != nil {
			return abandon(uncertain, waitEnded(ctx, what, hub.knows(w), err))
		}
	}
}

// endsAtClose returns ctx, ended also by Close with the cause ErrClosed
// (at once if the client is closed already): a wait that Close ends ends
// as one whose context ended, and cleans up alike. stop lets the returned
// context go. Every wait runs within an acquisition that underway counts,
// whose end, after the wait's clean-up, Close waits for.
func (c *Client) endsAtClose(ctx context.Context) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		cancel(ErrClosed)
		return ctx, func() {}
	}
	if c.waiting == nil {
		c.waiting = map[*context.CancelCauseFunc]bool{}
	}
	end := &cancel
	c.waiting[end] = true
	return ctx, func() {
		c.mu.Lock()
		delete(c.waiting, end)
		c.mu.Unlock()
		cancel(nil)
	}
}

// underway counts an acquisition under way, which Close waits for
// without ending it (its wait, if any, Close ends through endsAtClose),
// so that what it does after Close (cleaning up after a wait that Close
// ended, giving back a lock obtained WithAutoRefresh) is done before the
// caller of Close closes the Redis client; false, with nothing counted,
// once the client is closed. finished ends the count.
func (c *Client) underway() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.busy++
	return true
}

// finished ends what underway counted, and lets Close go on after the
// last acquisition it waits for.
func (c *Client) finished() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.busy--
	if c.busy == 0 && c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
}

// onRetry calls f, the caller's WithOnRetry and the hooks' Retry; should
// it panic or call runtime.Goexit, the acquisition is abandoned first
// (what an attempt may have left is cleaned up), and the panic goes on.
func onRetry(f func(int, error), failed int, err error, abandon func()) {
	returned := false
	defer func() {
		if !returned {
			abandon() // a panic goes on; so does runtime.Goexit
		}
	}()
	f(failed, err)
	returned = true
}

// maxWait returns the bound of a wait under ctx: the WithMaxWait given
// (zero when not), or DefaultMaxWait when ctx has no deadline; zero for
// none but ctx's.
func maxWait(ctx context.Context, given time.Duration) time.Duration {
	if given > 0 {
		return given
	}
	if _, ok := ctx.Deadline(); !ok {
		return DefaultMaxWait
	}
	return 0
}

// maxWaitPassed is the cause of a wait's end at its max wait, bound: given
// (WithMaxWait), or DefaultMaxWait for a context without a deadline,
// which the message says how to lengthen (made once: every wait without
// a deadline has it).
func maxWaitPassed(bound time.Duration, given bool) error {
	if given {
		return fmt.Errorf("%w (the max wait, %v)", context.DeadlineExceeded, bound)
	}
	if bound == DefaultMaxWait {
		return errDefaultMaxWait
	}
	return defaultMaxWaitPassed(bound)
}

// errDefaultMaxWait is maxWaitPassed(DefaultMaxWait, false).
var errDefaultMaxWait = defaultMaxWaitPassed(DefaultMaxWait)

func defaultMaxWaitPassed(bound time.Duration) error {
	return fmt.Errorf("%w (the max wait, %v by default for a context without a deadline: WithMaxWait or a deadline waits longer)", context.DeadlineExceeded, bound)
}

// waitEnded is the error of a wait for the lock what that ended (ctx did)
// before the lock was obtained, on one line. found is what the last
// answered attempt, the caller's or one of a caller of its client ahead of
// it (see saw), found; last is the caller's last attempt's error. It
// matches ctx's error and its cause (the max wait, say), and ErrNotObtained
// when that attempt found the lock held.
//
// A wait whose last answer from Redis was a failure, or that got none,
// does not match ErrNotObtained: a caller that skips its work when the
// lock is held must not take a Redis that does not work for a lock held by
// another.
func waitEnded(ctx context.Context, what string, found keyFound, last error) error {
	if dl, ok := ctx.Deadline(); ok && ctx.Err() == nil && !time.Now().Before(dl) {
		// Past its deadline (see cutShort): ctx ends at once, with its
		// cause.
		t := time.NewTimer(10 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	if cause := context.Cause(ctx); errors.Is(cause, ErrClosed) {
		// Not the caller's context, which did not end, nor a lock found
		// held: the client closed.
		return &causes.Error{Msg: "dlock: " + what + ": the wait ended: " + causes.Unprefixed(cause), Errs: []error{cause}}
	}
	why := endOf(ctx)
	switch {
	case found.failing != nil:
		return &causes.Error{Msg: "dlock: " + what + ": the wait ended (" + why.Error() + ") with Redis failing: " + causes.Unprefixed(found.failing),
			Errs: []error{why, found.failing}}
	case !found.refused && last != nil:
		return &causes.Error{Msg: "dlock: " + what + ": the wait ended (" + why.Error() + ") before Redis answered: " + causes.Unprefixed(last),
			Errs: []error{why, last}}
	case !found.refused:
		return fmt.Errorf("dlock: %s: the wait ended (%w) before an attempt of this caller, or of the one ahead of it in this client, was answered", what, why)
	case last != nil && !errors.Is(last, ErrNotObtained):
		return fmt.Errorf("%w: %s: the wait ended: %w", ErrNotObtained, what, why) // the attempt ended with it
	}
	return fmt.Errorf("%w: %s still held when the wait ended: %w", ErrNotObtained, what, why)
}

// endOf returns why ctx ended (DeadlineExceeded when it has not yet, past
// its deadline): its error, with its cause when that says more.
func endOf(ctx context.Context) error {
	why := ctx.Err()
	if why == nil {
		why = context.DeadlineExceeded
	}
	switch cause := context.Cause(ctx); {
	case cause == nil || cause == why:
		return why
	case errors.Is(cause, why):
		return cause
	default:
		return fmt.Errorf("%w: %w", why, cause)
	}
}

// cutShort reports whether err is that of an attempt that the end of ctx
// cut short: it got no answer.
func cutShort(ctx context.Context, err error) bool {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return true
	}
	return timedOut(ctx, err)
}

// timedOut reports whether err is a network timeout by which a driver
// reports that ctx's deadline came, maybe before ctx says so: go-redis with
// ContextTimeoutEnabled sets the socket's deadline from ctx's, and a dial
// under ctx ends with net's "i/o timeout" (which matches
// context.DeadlineExceeded) as the deadline passes, while ctx's own timer
// may not have fired yet. One well after ctx's deadline is the driver's own
// timeout: a failure.
func timedOut(ctx context.Context, err error) bool {
	dl, ok := ctx.Deadline()
	if !ok || !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	past := time.Since(dl)
	return past >= 0 && past < cutShortSlack
}

// cutShortSlack is how long after its context's deadline a network
// timeout still counts as that deadline's (see timedOut).
const cutShortSlack = 50 * time.Millisecond

// hubIfAny returns the client's waitHub, nil when no caller has waited.
func (c *Client) hubIfAny() *waitHub {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waits
}

// hub returns the client's waitHub, creating it on first use.
func (c *Client) hub() *waitHub {
	c.made()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waits == nil {
		c.waits = newWaitHub(c)
		if c.closed {
			c.waits.failed = true
		}
	}
	return c.waits
}

// unwait takes the client out of the waiter sets of locks keys, which none
// of its callers waits for since the last of them gave up, passing on any
// notice it received and did not use. A lock on several names was
// registered at whichever name refused it, so every such name's set is
// left: in one pipeline, or on a cluster in one for each slot, at once,
// so that the attempts that wait for a key's unwait (see enroll) do not
// wait for one on a node that may be stalled. It has until cleanupTimeout
// after gaveUp, when the wait gave up then, else from now.
func (c *Client) unwait(ctx context.Context, keys []string, gaveUp time.Time) {
	if gaveUp.IsZero() {
		gaveUp = time.Now()
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), gaveUp.Add(cleanupTimeout))
	defer cancel()
	if len(keys) == 1 || !c.cluster.Load() {
		c.unwaitKeys(ctx, keys)
		return
	}
	bySlot := map[int][]string{}
	for _, k := range keys {
		bySlot[keyslot.Of(k)] = append(bySlot[keyslot.Of(k)], k)
	}
	var wg sync.WaitGroup
	for _, group := range bySlot {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.unwaitKeys(ctx, group)
		}()
	}
	wg.Wait()
}

// unwaitKeys is unwait for keys, in one request or pipeline, within ctx.
func (c *Client) unwaitKeys(ctx context.Context, keys []string) {
	// The attempts that enroll at keys go on once this returns: within
	// cleanupTimeout, whether or not the unwait was answered (one cut short
	// in a pipeline that another caller sent may still run after them).
	defer c.hub().unwaited(keys)
	calls := make([]*Call, len(keys))
	for i, k := range keys {
		calls[i] = &Call{Script: scriptUnwait, Keys: []string{k, k + ":waiters"}, Args: []any{c.hub().member()}}
	}
	c.evalWith(ctx, replication{}, calls...)
	for i, call := range calls {
		// A node that redirects a client that follows no redirection
		// serves no waiter set of the name: the client's attempts were
		// redirected too.
		if call.Err != nil && !(errors.Is(call.Err, ErrUnsupported) && redirection(call.Err)) {
			c.log.WarnContext(ctx, "dlock: could not leave a waiter set; the registration expires by itself", "names", []string{causes.Short(c.nameOf(keys[i]))}, "err", call.Err)
		}
	}
}
