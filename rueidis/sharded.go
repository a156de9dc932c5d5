package dlockrueidis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/keyslot"
	"github.com/redis/rueidis"
)

var _ dlock.ShardedSubscriber = (*Driver)(nil)

// SubscribeSharded subscribes to shard channels on a Redis Cluster, with
// one connection for each primary that serves a slot of its channels:
// SSUBSCRIBE works only on the slot's primary, and one connection carries
// the channels of all of a primary's slots. Each is a subscription like
// Subscribe's (a dedicated connection of rueidis's client for that node,
// pub/sub hooks, a goroutine), and the primaries are found with the slot
// map that EvalWait reads too (CLUSTER SLOTS). When a primary lets go of a
// channel (a slot move or a failover: the server then unsubscribes it by
// itself), that channel alone is subscribed anew on the primary that
// serves its slot now, and the connection goes on with the others; when a
// connection fails, or an SSUBSCRIBE is refused (MOVED), its channels are.
// They are subscribed anew after the slot map is read again, with a
// backoff from 10ms to 1s, until Close (a primary the client has no
// connection to yet, such as a replica that took over in a failover, is
// waited for: a request routed to its slot makes rueidis read the
// cluster's topology again, see unconnected); once an attempt has subscribed
// any of its channels, notify is called with an empty channel and payload
// (see dlock.Subscription). A primary's connection is closed
// when its last channel is unsubscribed. notify is called one message at a
// time. A client that is not a cluster client, or a cluster without shard
// channels (before Redis 7), returns dlock.ErrUnsupported, and dlock then
// uses PUBLISH; that is asked of the primaries (see hasShardChannels), and
// Close waits for the questions still under way, up to 1s.
func (d *Driver) SubscribeSharded(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	if d.client.Mode() != rueidis.ClientModeCluster {
		return nil, dlock.ErrUnsupported
	}
	s := &shardedSubscription{d: d, backoff: minBackoff,
		nodes: map[string]*subscription{}, where: map[string]*subscription{}, pending: map[string]bool{}}
	// Shard channels came with Redis 7: an older server knows no SPUBLISH.
	has, err := d.hasShardChannels(ctx, &s.running)
	if err != nil || !has {
		s.running.Wait() // the other questions, within probeTimeout
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: the cluster has no shard channels (Redis 7 needed)", dlock.ErrUnsupported)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.notify = func(channel, payload string) {
		s.deliver.Lock()
		defer s.deliver.Unlock()
		notify(channel, payload)
	}
	return s, nil
}

// probeHedge is how long hasShardChannels waits for a primary's answer
// before it asks the next primary too, and probeTimeout bounds each
// question (a primary's stall then keeps a Close of the subscription
// waiting for its question at most that long).
const (
	probeHedge   = 50 * time.Millisecond
	probeTimeout = time.Second
)

// hasShardChannels reports whether the cluster knows SPUBLISH. It asks one
// primary of the slot map, then another each probeHedge (or at once when a
// question fails) while none has answered, so that a primary that stalls
// does not hold up the answer, and with it every wait of a new client
// (rueidis sends a request without a key to a node of its choosing). It
// returns with the first answer, or with the first error once every
// primary asked failed; the questions still under way are counted in
// running, and end within probeTimeout.
func (d *Driver) hasShardChannels(ctx context.Context, running *sync.WaitGroup) (bool, error) {
	m, err := d.currentSlots(ctx)
	if err != nil {
		return false, err
	}
	var primaries []rueidis.Client
	seen := map[string]bool{}
	for _, r := range m.ranges {
		if node, ok := m.nodes[r.addr]; ok && !seen[r.addr] {
			seen[r.addr] = true
			primaries = append(primaries, node)
		}
	}
	if len(primaries) == 0 {
		return false, fmt.Errorf("dlockrueidis: the slot map names no primary the client is connected to")
	}
	type answer struct {
		has bool
		err error
	}
	answers := make(chan answer, len(primaries)) // never blocks a question
	asked, failed := 0, 0
	next := func() {
		node := primaries[asked]
		asked++
		running.Add(1)
		go func() {
			defer running.Done()
			// Not ended by ctx's cancellation once an answer came: a
			// request that dials a node's first connection would fail
			// the dial, and the requests that wait for it (see
			// readSlots); ctx's deadline, or probeTimeout, ends it.
			qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
			defer cancel()
			if deadline, ok := ctx.Deadline(); ok {
				var cancelAt context.CancelFunc
				qctx, cancelAt = context.WithDeadline(qctx, deadline)
				defer cancelAt()
			}
			info, err := node.Do(qctx, node.B().CommandInfo().CommandName("SPUBLISH").Build()).ToArray()
			answers <- answer{err == nil && len(info) == 1 && !info[0].IsNil(), err}
		}()
	}
	next()
	hedge := time.NewTicker(probeHedge)
	defer hedge.Stop()
	var firstErr error
	for {
		select {
		case a := <-answers:
			if a.err == nil {
				return a.has, nil
			}
			firstErr = cmp.Or(firstErr, a.err)
			failed++
			if asked < len(primaries) && ctx.Err() == nil {
				next()
			} else if failed == asked {
				return false, firstErr
			}
		case <-hedge.C:
			if asked < len(primaries) && ctx.Err() == nil {
				next()
			}
		}
	}
}

// shardTimeout bounds the requests that subscribe channels anew.
const shardTimeout = 5 * time.Second

// shardedSubscription is the shard channels of one subscriber, by the
// primary they are subscribed on.
type shardedSubscription struct {
	d       *Driver
	notify  func(channel, payload string) // the caller's, one message at a time
	deliver sync.Mutex
	ctx     context.Context // ends at Close: stops subscribing anew
	cancel  context.CancelFunc
	running sync.WaitGroup // the goroutines that subscribe channels anew

	mu      sync.Mutex
	nodes   map[string]*subscription // by the primary's address
	where   map[string]*subscription // by channel
	pending map[string]bool          // channels waiting to be subscribed anew
	ended   []*subscription          // out of nodes after a failure; their goroutines may still run
	backoff time.Duration            // before the next attempt to subscribe anew
	closed  bool
}

// Subscribe sends SSUBSCRIBE for every channel, on the primary of its slot
// (on a new connection for a primary it had none to), before it returns,
// without holding the lock that the subscription's other calls take. A
// channel that it could not subscribe is subscribed anew in the
// background, and Subscribe returns the error.
func (s *shardedSubscription) Subscribe(ctx context.Context, channels ...string) error {
	_, err := s.subscribe(ctx, channels, false)
	return err
}

// subscribe subscribes channels on the primaries of their slots; again,
// only those still waiting to be subscribed anew. some reports whether a
// primary confirmed any of them.
func (s *shardedSubscription) subscribe(ctx context.Context, channels []string, again bool) (some bool, err error) {
	m, err := s.d.currentSlots(ctx)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	added := map[*subscription]string{} // new primaries, and their addresses
	byNode := map[*subscription][]string{}
	var failed []string
	var unknown, unknownAddr string // a channel whose primary the client has no connection to
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false, errClosed
	}
	for _, ch := range channels {
		if _, ok := s.where[ch]; ok || again && !s.pending[ch] {
			continue
		}
		delete(s.pending, ch)
		if m == nil {
			failed = append(failed, ch)
			continue
		}
		addr := m.owner(keyslot.Of(ch))
		node, ok := m.nodes[addr]
		if !ok {
			if unknown == "" {
				unknown, unknownAddr = ch, addr
			}
			failed = append(failed, ch)
			continue
		}
		n := s.nodes[addr]
		if n == nil {
			n = newSubscription(node, s.notify)
			n.reroute = func(channels []string, all bool) { s.rehome(addr, n, channels, all) }
			s.nodes[addr] = n
			added[n] = addr
		}
		s.where[ch] = n
		// Counted now, so that an Unsubscribe of n's other channels does
		// not take n for idle; subscribed by start on a new primary.
		n.mu.Lock()
		n.channels[ch] = true
		n.mu.Unlock()
		if _, ok := added[n]; !ok {
			byNode[n] = append(byNode[n], ch)
		}
	}
	s.retry(failed)
	s.running.Add(len(added)) // their starts: Close waits for them
	s.mu.Unlock()
	if unknown != "" {
		errs = append(errs, s.d.unconnected(ctx, unknownAddr, unknown, fmt.Sprintf("which serves the slot of %q", unknown)))
	}
	// New primaries connect now, unlocked, so that a notice sent once
	// Subscribe returned finds them subscribed; channels added to them
	// meanwhile are caught up with by install. If that fails, their
	// goroutine hands the channels back to be subscribed anew. They start
	// before this call waits for others' (below), which may wait for
	// these; each on its own, so that a primary slow to answer holds up
	// neither the others nor the primaries this call is connected to
	// (the calls that wait for those).
	// This call waits for them within ctx: rueidis dials a dedicated
	// connection whatever ctx says, and a stalled primary's handshake
	// lasts until its own timeout. A start that outlives the call goes
	// on, within shardTimeout or until Close, as Subscribe's doc says of
	// channels it could not subscribe.
	var outcome sync.Mutex // errs, subscribed and started
	subscribed, started := false, 0
	startedOne := make(chan struct{}, len(added))
	for n, addr := range added {
		go func() {
			defer s.running.Done()
			// Ended at shardTimeout, or at Close, by cancellation, not
			// a deadline: rueidis ends a request of a context with a
			// deadline only there.
			sctx, cancel := context.WithCancel(s.ctx)
			stop := time.AfterFunc(shardTimeout, cancel)
			err := n.start(sctx)
			stop.Stop()
			cancel()
			outcome.Lock()
			if err != nil {
				errs = append(errs, fmt.Errorf("dlockrueidis: SSUBSCRIBE on %s: %w; retrying in the background", addr, err))
			} else {
				subscribed = true
			}
			started++
			outcome.Unlock()
			startedOne <- struct{}{}
		}()
	}
	// The requests go unlocked, so that a primary that is slow to answer
	// holds up only its own channels. A primary that another call is
	// still connecting to is waited for: until then n only records the
	// channels, which its connection catches up with later, after the
	// notices this caller's waiter may need.
	for n, chs := range byNode {
		var err error
		select {
		case <-n.started:
			err = n.Subscribe(ctx, chs...)
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
		s.mu.Lock()
		var gone []string // unsubscribed meanwhile: undone below
		for _, ch := range chs {
			if s.where[ch] != n {
				gone = append(gone, ch)
			}
		}
		if err != nil {
			// Refused (MOVED: the slot map is out of date), or the
			// connection failed: these channels go elsewhere, if need be.
			s.retry(s.detach(n, chs))
		}
		s.mu.Unlock()
		outcome.Lock()
		if err != nil {
			errs = append(errs, err)
		} else if len(gone) < len(chs) {
			subscribed = true
		}
		outcome.Unlock()
		if len(gone) > 0 {
			_ = n.Unsubscribe(ctx, gone...)
		}
	}
	for range added {
		select {
		case <-startedOne:
		case <-ctx.Done():
		}
	}
	outcome.Lock()
	defer outcome.Unlock()
	if started < len(added) {
		errs = append(errs[:len(errs):len(errs)], context.Cause(ctx))
	}
	return subscribed, errors.Join(errs...)
}

// start connects a new subscription to a primary and starts its
// goroutine, which hands the channels back if this attempt failed.
func (s *subscription) start(ctx context.Context) error {
	defer close(s.started)
	s.mu.Lock()
	want := s.list()
	s.mu.Unlock()
	c, err := s.connect(ctx, want)
	if err == nil {
		if err = s.install(c, want); err != nil {
			s.drop(c)
		}
	}
	if err != nil {
		c = nil
	}
	go s.run(c)
	return err
}

// rehome is called by the goroutine of n, the subscription on the primary
// at addr, with the channels that the primary let go of, or with all once
// its connection failed: then n ends, and every channel moves.
func (s *shardedSubscription) rehome(addr string, n *subscription, channels []string, all bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if all {
		if s.nodes[addr] == n {
			delete(s.nodes, addr)
		}
		s.ended = append(running(s.ended), n)
		n.cancel()
		n.mu.Lock()
		channels = n.list()
		n.mu.Unlock()
	}
	s.retry(s.detach(n, channels))
	if !all && n.onlyAmong(nil) && s.nodes[addr] == n {
		// No channels left (onlyAmong none), its last ones moved away: the
		// connection closes, as when Unsubscribe removes the last.
		delete(s.nodes, addr)
		s.ended = append(running(s.ended), n)
		n.cancel()
	}
}

// running returns those of subs whose goroutines still run, in subs's
// own storage.
func running(subs []*subscription) []*subscription {
	return slices.DeleteFunc(subs, func(x *subscription) bool {
		select {
		case <-x.done:
			return true
		default:
			return false
		}
	})
}

// detach takes those of channels that are on n off it, and returns them;
// s.mu is held.
func (s *shardedSubscription) detach(n *subscription, channels []string) []string {
	var out []string
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ch := range channels {
		if s.where[ch] == n {
			delete(s.where, ch)
			delete(n.channels, ch)
			out = append(out, ch)
		}
	}
	return out
}

// retry subscribes channels anew in a goroutine, after the backoff and
// once the slot map is read again; s.mu is held. The backoff doubles up to
// maxBackoff, and starts over once an attempt subscribed every channel.
func (s *shardedSubscription) retry(channels []string) {
	if len(channels) == 0 || s.closed {
		return
	}
	for _, ch := range channels {
		s.pending[ch] = true
	}
	wait := s.backoff
	s.backoff = min(2*s.backoff, maxBackoff)
	s.running.Add(1)
	go func() {
		defer s.running.Done()
		if !sleep(s.ctx, wait) {
			return
		}
		s.d.slots.Store(nil) // it may be out of date
		ctx, cancel := context.WithTimeout(s.ctx, shardTimeout)
		defer cancel()
		some, err := s.subscribe(ctx, channels, true)
		if err == nil {
			s.mu.Lock()
			s.backoff = minBackoff
			s.mu.Unlock()
		}
		// Notices sent while the channels were not subscribed were lost:
		// dlock's waiters try again (see dlock.Subscription). Those that
		// failed are tried again later (see subscribe).
		if some && s.ctx.Err() == nil {
			s.notify("", "")
		}
	}()
}

// Unsubscribe sends SUNSUBSCRIBE, or has the connection of a primary whose
// last channels it removes closed (by its goroutine, which Close waits
// for), without holding the lock.
func (s *shardedSubscription) Unsubscribe(ctx context.Context, channels ...string) error {
	s.mu.Lock()
	byNode := map[*subscription][]string{}
	for _, ch := range channels {
		delete(s.pending, ch)
		if n := s.where[ch]; n != nil {
			delete(s.where, ch)
			byNode[n] = append(byNode[n], ch)
		}
	}
	var idle []*subscription
	for n, chs := range byNode {
		if !n.onlyAmong(chs) {
			continue
		}
		for addr, x := range s.nodes {
			if x == n {
				delete(s.nodes, addr)
			}
		}
		idle = append(idle, n)
		delete(byNode, n) // closed instead
	}
	if len(idle) > 0 {
		// Close waits for them too: it may come before they are closed.
		s.ended = append(running(s.ended), idle...)
	}
	s.mu.Unlock()
	// As Subscribe, unlocked.
	var errs []error
	for n, chs := range byNode {
		errs = append(errs, n.Unsubscribe(ctx, chs...))
	}
	for _, n := range idle {
		// Not waited for: one still opening (see start) closes once it is
		// open; Close waits for it (s.ended).
		n.cancel()
	}
	return errors.Join(errs...)
}

// Close closes every primary's connection and waits for every goroutine.
// It always returns nil.
func (s *shardedSubscription) Close() error {
	s.mu.Lock()
	nodes := s.ended
	for _, n := range s.nodes {
		nodes = append(nodes, n)
	}
	s.nodes, s.where, s.pending, s.ended, s.closed = nil, nil, nil, nil, true
	s.mu.Unlock()
	s.cancel()
	for _, n := range nodes {
		n.cancel()
	}
	for _, n := range nodes {
		<-n.done
	}
	s.running.Wait()
	return nil
}

// onlyAmong reports whether all of the subscription's channels are among
// channels.
func (s *subscription) onlyAmong(channels []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.channels {
		if !slices.Contains(channels, ch) {
			return false
		}
	}
	return true
}

// bySlot groups channels by their cluster slot.
func bySlot(channels []string) map[int][]string {
	out := map[int][]string{}
	for _, ch := range channels {
		slot := keyslot.Of(ch)
		out[slot] = append(out[slot], ch)
	}
	return out
}
