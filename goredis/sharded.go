package goredis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/keyslot"
	"github.com/redis/go-redis/v9"
)

var _ dlock.ShardedSubscriber = (*Driver)(nil)

// SubscribeSharded subscribes to shard channels on a Redis Cluster, with
// one connection and one goroutine for each primary that serves a slot of
// its channels: SSUBSCRIBE works only on the slot's primary, and one
// connection carries the channels of all of a primary's slots. When a
// primary stops serving a slot (a failover or a slot move: the server then
// unsubscribes its shard channels, or answers MOVED) or its connection
// fails (one silent for 3s is sent a PING, and one that answers nothing
// within 3s more counts as failed), the channels concerned are subscribed anew, after go-redis has
// read the cluster's slots again, on the primaries that serve them now;
// the server's confirmation of each is passed to notify as an empty
// channel and payload (see dlock.Subscription).
// (This does not rely on go-redis's own reconnection of a ClusterClient's
// SSubscribe, which before v9.18 picks a random node.) notify is called
// one message at a time. A primary's connection is closed when its last
// channel is unsubscribed. A cluster without shard channels (before Redis
// 7), and any client other than a ClusterClient or a wrapper of one (see
// New), return dlock.ErrUnsupported; dlock then uses PUBLISH.
//
// With go-redis v9.7 (as this module's go.mod allows), the race detector
// may report a data race inside go-redis's PubSub when a primary's
// connection fails as a channel is subscribed on it while its receiving
// goroutine starts: go-redis sets a field of the PubSub on its first
// receive without its lock, and reads it, for a log line, when it
// connects anew. go-redis v9.23 no longer reads it there.
func (d *Driver) SubscribeSharded(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	c := d.clu
	if c == nil {
		return nil, dlock.ErrUnsupported
	}
	s := &shardedSubscription{c: c, notify: notify,
		nodes: map[string]*nodeSubscription{}, where: map[string]*nodeSubscription{}, moving: map[string]bool{}, resumed: map[string]bool{}}
	// Shard channels came with Redis 7: an older server knows no SPUBLISH.
	// The questions still under way when one primary answered are the
	// subscription's, and Close waits for them.
	has, err := hasShardChannels(ctx, c, &s.running)
	if err != nil {
		return nil, err // every question asked has answered
	}
	if !has {
		s.running.Wait() // the other questions, within probeTimeout
		return nil, fmt.Errorf("%w: the cluster has no shard channels (Redis 7 needed)", dlock.ErrUnsupported)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// probeHedge is how long hasShardChannels waits for a primary's answer
// before it asks the next primary too, and probeTimeout bounds each
// question (a primary's stall then keeps a Close of the subscription
// waiting for its question at most that long).
var (
	probeHedge   = 50 * time.Millisecond
	probeTimeout = time.Second
	probeMost    = 8 // primaries asked at most
)

// hasShardChannels reports whether the cluster knows SPUBLISH. It asks one
// primary, then another each probeHedge (or at once when a question
// fails) while none has answered, so that a primary that stalls does not
// hold up the answer, and with it every wait of a new client. It returns
// with the first answer, or with the first error once every primary
// asked failed; the questions still under way are counted in running, and end
// within probeTimeout (with ContextTimeoutEnabled; go-redis's read
// timeout else).
func hasShardChannels(ctx context.Context, c clusterClient, running *sync.WaitGroup) (bool, error) {
	// The primaries of the keys "0" to "63" by the client's slot map (not
	// ForEachMaster's: it reads the map anew first, from a node taken at
	// random, which may be the one that stalls).
	var primaries []*redis.Client
	seen := map[string]bool{}
	for i := 0; i < 64 && len(primaries) < probeMost; i++ {
		node, err := c.MasterForKey(ctx, strconv.Itoa(i))
		if err != nil {
			return false, err // no slot map, and none could be read
		}
		if addr := node.Options().Addr; !seen[addr] {
			seen[addr] = true
			primaries = append(primaries, node)
		}
	}
	type answer struct {
		has bool
		err error
	}
	answers := make(chan answer, len(primaries)) // never blocks a question
	ask := func(node *redis.Client) {
		defer running.Done()
		ctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		info, err := node.Do(ctx, "COMMAND", "INFO", "SPUBLISH").Slice()
		answers <- answer{err == nil && len(info) == 1 && info[0] != nil, err}
	}
	var firstErr error
	asked, failed := 0, 0
	next := func() {
		running.Add(1)
		go ask(primaries[asked])
		asked++
	}
	next()
	hedge := time.NewTicker(probeHedge)
	defer hedge.Stop()
	for {
		select {
		case a := <-answers:
			if a.err == nil {
				return a.has, nil
			}
			if firstErr == nil {
				firstErr = a.err
			}
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

// shardedSubscription is the shard channels of one subscriber, by the
// primary they are subscribed on.
type shardedSubscription struct {
	c      clusterClient
	notify func(channel, payload string)

	deliver sync.Mutex      // notify is called one message at a time
	running sync.WaitGroup  // the nodes' goroutines, and the questions of hasShardChannels
	ctx     context.Context // ends at Close: stops subscribing anew
	cancel  context.CancelFunc

	mu     sync.Mutex
	nodes  map[string]*nodeSubscription // by the primary's address
	where  map[string]*nodeSubscription // by channel
	moving map[string]bool              // channels to subscribe anew (see run); Unsubscribe takes them out
	// resumed holds the channels subscribed anew after their connection
	// failed or their slot moved, until the server confirms them: that
	// confirmation is passed to notify as an empty channel and payload
	// (see dlock.Subscription), the notices sent meanwhile being lost.
	resumed map[string]bool
	closed  bool
}

// nodeSubscription is the channels subscribed on one primary, and the
// goroutine that delivers their messages.
type nodeSubscription struct {
	s        *shardedSubscription
	ps       *redis.PubSub
	channels map[string]bool // guarded by s.mu
	// unsubs, guarded by s.mu, counts by channel the replies still due to
	// the client's own SUNSUBSCRIBEs: only a sunsubscribe beyond them is
	// the server letting the channel go (its slot moved), and not one read
	// after the channel was subscribed again.
	unsubs  map[string]int
	closing bool // guarded by s.mu: closed on purpose
	// retry, guarded by s.mu, is the wait before subscribing its channels
	// anew should the connection fail: set by the pass of resubscribe that
	// made it (the next step of that pass's backoff), so that a primary
	// that is down costs one chain of attempts whose backoff grows; 0
	// (shardRetryMin) once the primary confirmed a channel.
	retry time.Duration
}

const (
	// shardRetryMin and shardRetryMax bound the wait before subscribing
	// channels again after their primary's connection failed: the wait
	// doubles while the primary stays out of reach, and stays short, as
	// the channels come back only at the first attempt after a failover.
	shardRetryMin = 50 * time.Millisecond
	shardRetryMax = 250 * time.Millisecond
	// shardTimeout bounds the requests that subscribe channels anew.
	shardTimeout = 5 * time.Second
)

// resubscribed, when set (by tests, before the subscription opens), is
// called as each pass of resubscribe ends.
var resubscribed func()

// shardSilence is how long a primary's connection may go without a
// message before it is sent a PING; one that answers nothing, not even
// that, within as long again is taken for failed, as a connection cut off
// without a reset (a host that vanished) is, and its channels are
// subscribed anew.
var shardSilence = 3 * time.Second

var errClosed = errors.New("goredis: subscription closed")

// Subscribe sends SSUBSCRIBE for every channel, on its slot's primary (on a
// new connection for a primary it had none to), before it returns. The
// requests are sent without holding the subscription's lock, so that a
// slow or unreachable primary holds up only the channels it serves.
func (s *shardedSubscription) Subscribe(ctx context.Context, channels ...string) error {
	var errs []error
	for _, ch := range channels {
		if err := s.subscribe(ctx, ch, false, 0); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// subscribe subscribes one channel on the primary of its slot; when moving
// is set, only if it is still to be subscribed anew (see run), not
// unsubscribed since. A new connection it makes waits retry before its
// channels are subscribed anew, should it fail (see nodeSubscription).
func (s *shardedSubscription) subscribe(ctx context.Context, ch string, moving bool, retry time.Duration) error {
	s.mu.Lock()
	_, already := s.where[ch]
	closed, unwanted := s.closed, moving && !s.moving[ch]
	s.mu.Unlock()
	switch {
	case closed:
		return errClosed
	case already, unwanted:
		return nil
	}
	node, err := s.c.MasterForKey(ctx, ch)
	if err != nil {
		return err
	}
	addr := node.Options().Addr
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosed
	}
	if _, ok := s.where[ch]; ok || moving && !s.moving[ch] {
		s.mu.Unlock()
		return nil // subscribed or unsubscribed meanwhile
	}
	delete(s.moving, ch)
	ns := s.nodes[addr]
	fresh := ns == nil
	if fresh {
		// No request yet: the connection is made by the SSubscribe below.
		ns = &nodeSubscription{s: s, ps: node.SSubscribe(ctx), channels: map[string]bool{}, unsubs: map[string]int{}, retry: retry}
		s.nodes[addr] = ns
		s.running.Add(1)
	}
	ns.channels[ch] = true
	s.where[ch] = ns
	s.mu.Unlock()

	err = ns.ps.SSubscribe(ctx, ch)
	if fresh && err == nil {
		// The first answer on a new connection is read here, before its
		// goroutine starts: a refusal is the caller's to know (see
		// confirm).
		if err = ns.confirm(ctx, ch); errors.Is(err, errMoved) {
			err = nil // the goroutine subscribes ch anew (see run)
		}
	}
	if fresh {
		go ns.run(addr)
	}
	failed := err != nil && !isReply(err)
	if failed {
		// go-redis may have connected anew inside SSubscribe, and then
		// subscribed the connection's other channels but not ch (it adds
		// a channel to its own once the request succeeds). Closed, the
		// connection fails for certain: its goroutine subscribes every
		// one of its channels anew, ch too, as run says.
		_ = ns.ps.Close()
	}
	s.mu.Lock()
	gone := s.where[ch] != ns && !ns.closing // unsubscribed meanwhile
	if gone && err == nil {
		ns.unsubs[ch]++
	}
	s.mu.Unlock()
	if gone && err == nil {
		ns.unsubscribe(ctx, ch)
	}
	if failed && moving {
		// Left to the connection's goroutine: a second attempt from
		// here would make two, and each failure two more.
		return nil
	}
	return err
}

// Unsubscribe sends SUNSUBSCRIBE, one for each slot of the channels (the
// server refuses one across slots, CROSSSLOT, and the connection would be
// taken for failed), or closes the connection of a primary whose last
// channels it removes; as Subscribe, without holding the lock.
func (s *shardedSubscription) Unsubscribe(ctx context.Context, channels ...string) error {
	var idle []*nodeSubscription
	byNode := map[*nodeSubscription][]string{}
	s.mu.Lock()
	for _, ch := range channels {
		delete(s.moving, ch)
		delete(s.resumed, ch)
		ns := s.where[ch]
		if ns == nil {
			continue
		}
		delete(s.where, ch)
		delete(ns.channels, ch)
		if len(ns.channels) == 0 {
			s.drop(ns)
			idle = append(idle, ns)
			delete(byNode, ns) // closed instead
		} else {
			byNode[ns] = append(byNode[ns], ch)
			ns.unsubs[ch]++
		}
	}
	s.mu.Unlock()
	var errs []error
	for ns, chs := range byNode {
		bySlot := map[int][]string{}
		for _, ch := range chs {
			slot := keyslot.Of(ch)
			bySlot[slot] = append(bySlot[slot], ch)
		}
		for _, chs := range bySlot {
			errs = append(errs, ns.unsubscribe(ctx, chs...))
		}
	}
	for _, ns := range idle {
		_ = ns.ps.Close() // its goroutine sees closing and returns
	}
	return errors.Join(errs...)
}

func (s *shardedSubscription) Close() error {
	s.cancel()
	s.mu.Lock()
	s.closed = true
	var all []*nodeSubscription
	for _, ns := range s.nodes {
		s.drop(ns)
		all = append(all, ns)
	}
	s.where = map[string]*nodeSubscription{}
	s.mu.Unlock()
	for _, ns := range all {
		_ = ns.ps.Close()
	}
	s.running.Wait()
	return nil
}

// unsubscribe sends SUNSUBSCRIBE for channels of one slot, whose replies
// ns.unsubs counts. A request that failed may have been answered by none:
// go-redis may have connected anew inside it. The connection is closed
// then, and fails for certain, so that a count left over never hides the
// server letting a channel go (see run).
func (ns *nodeSubscription) unsubscribe(ctx context.Context, channels ...string) error {
	err := ns.ps.SUnsubscribe(ctx, channels...)
	if err != nil && !isReply(err) {
		_ = ns.ps.Close()
	}
	return err
}

// drop takes a node subscription out of the maps and marks it closing;
// s.mu must be held.
func (s *shardedSubscription) drop(ns *nodeSubscription) {
	ns.closing = true
	for addr, x := range s.nodes {
		if x == ns {
			delete(s.nodes, addr)
		}
	}
}

// run delivers the primary's messages until its connection is closed on
// purpose, or fails, or the primary stops serving a channel's slot; then
// it subscribes the channels concerned anew, wherever they are served now.
func (ns *nodeSubscription) run(addr string) {
	s := ns.s
	defer s.running.Done()
	moved := ns.receive()
	s.mu.Lock()
	if ns.closing {
		s.mu.Unlock()
		return
	}
	// The connection failed: every channel on it moves. Or the primary let
	// go of some channels: only they move, and the rest stay.
	var again []string
	retry, done := ns.retry, moved == nil
	if moved == nil {
		s.drop(ns)
		for ch := range ns.channels {
			again = append(again, ch)
			delete(s.where, ch)
			s.moving[ch], s.resumed[ch] = true, true
		}
	} else {
		for _, ch := range moved {
			if ns.channels[ch] {
				again = append(again, ch)
				delete(ns.channels, ch)
				delete(s.where, ch)
				s.moving[ch], s.resumed[ch] = true, true
			}
		}
		if len(ns.channels) == 0 {
			// None left: the connection closes, as when Unsubscribe
			// removes the last.
			s.drop(ns)
			done = true
		} else {
			// This goroutine goes on serving the rest.
			s.running.Add(1)
			go ns.run(addr)
		}
	}
	s.mu.Unlock()
	if done {
		_ = ns.ps.Close()
	}
	s.resubscribe(again, retry)
}

// errMoved is confirm's word that the connection's first answer was an
// error reply other than a refusal (MOVED: the slot moved as the
// connection was made); the connection is closed, and its goroutine
// subscribes its channels anew.
var errMoved = errors.New("goredis: the primary answered with another error")

// confirm reads the first answer on ns's new connection, to the SSUBSCRIBE
// of ch just sent, before ns's goroutine starts: on a connection that no
// channel was subscribed on before, nothing can be waiting for notify
// there. The server's refusal (NOPERM: a user who may not listen on the
// channel, or run SSUBSCRIBE) is returned, and ch is forgotten (with the
// connection, when ch was its only channel), so that dlock logs it and its
// waiters fall back to their timers, rather than have the goroutine
// subscribe ch anew for as long as it is wanted. Any other answer is
// handled as the goroutine would have (another channel's, subscribed on
// the connection meanwhile, may come first).
func (ns *nodeSubscription) confirm(ctx context.Context, ch string) error {
	msg, err := ns.ps.ReceiveTimeout(ctx, shardTimeout)
	if err == nil {
		if _, done := ns.handle(msg); done {
			_ = ns.ps.Close()
		}
		return nil
	}
	if !isReply(err) {
		_ = ns.ps.Close() // its goroutine subscribes its channels anew
		return err
	}
	if !refusal(err) {
		_ = ns.ps.Close()
		return errMoved
	}
	s := ns.s
	s.mu.Lock()
	idle := false
	if s.where[ch] == ns {
		delete(s.where, ch)
		delete(ns.channels, ch)
		if idle = len(ns.channels) == 0; idle {
			s.drop(ns)
		}
	}
	s.mu.Unlock()
	if idle {
		_ = ns.ps.Close() // its goroutine sees closing and returns
	}
	return err
}

// refusal reports whether err is the server's refusal of a channel, or of
// the command that subscribes it (NOPERM: "no permissions to access one of
// the channels", or to run 'ssubscribe'), which leaves the connection as
// it was; not that of a command the connection's set-up sends (CLIENT
// SETNAME), which leaves none.
func refusal(err error) bool {
	msg := err.Error()
	return isReply(err) && strings.HasPrefix(msg, "NOPERM") && (strings.Contains(msg, "channel") || strings.Contains(msg, "subscribe'"))
}

// receive delivers messages until the connection fails (nil), or the
// server unsubscribes channels still wanted: their slot moved (those
// channels).
func (ns *nodeSubscription) receive() (moved []string) {
	pinged := false
	for {
		msg, err := ns.ps.ReceiveTimeout(context.Background(), shardSilence)
		if err != nil && refusal(err) {
			// A channel subscribed on the open connection that the server
			// refused (a user who may listen on some channels only): the
			// connection goes on, the others' notices with it, and the
			// refused channel's waiters use their timers. The reply does
			// not name the channel, which stays with the others.
			pinged = false
			continue
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged {
				// Silent for a while: a PING tells a quiet connection
				// from a dead one.
				pinged = true
				if ns.ps.Ping(context.Background()) == nil {
					continue
				}
			}
			return nil // a failed or silent connection, an error reply such as MOVED, or Close
		}
		pinged = false
		if moved, done := ns.handle(msg); done {
			return moved
		}
	}
}

// handle acts on one message of ns's connection: it passes a notice to
// notify, and a confirmation of a channel subscribed anew as an empty
// channel and payload (see dlock.Subscription). done is set when the
// server unsubscribed a channel still wanted (moved): its slot moved.
func (ns *nodeSubscription) handle(msg any) (moved []string, done bool) {
	s := ns.s
	switch m := msg.(type) {
	case *redis.Message:
		s.deliver.Lock()
		s.notify(m.Channel, m.Payload)
		s.deliver.Unlock()
	case *redis.Subscription:
		if m.Kind == "ssubscribe" {
			s.mu.Lock()
			resumed := s.resumed[m.Channel] && !ns.closing
			delete(s.resumed, m.Channel)
			ns.retry = 0 // the primary answers
			s.mu.Unlock()
			if resumed {
				s.deliver.Lock()
				s.notify("", "")
				s.deliver.Unlock()
			}
		}
		if m.Kind != "sunsubscribe" {
			return nil, false
		}
		s.mu.Lock()
		mine := ns.unsubs[m.Channel] > 0 // the reply to the client's own
		if mine {
			ns.unsubs[m.Channel]--
			if ns.unsubs[m.Channel] == 0 {
				delete(ns.unsubs, m.Channel)
			}
		}
		wanted := !mine && ns.channels[m.Channel] && !ns.closing
		s.mu.Unlock()
		if wanted {
			return []string{m.Channel}, true
		}
	}
	return nil, false
}

// resubscribe subscribes channels anew, once go-redis has read the
// cluster's slots again, retrying with a backoff, starting at wait (0 for
// shardRetryMin), until every one is subscribed or the subscription is
// closed. A new connection that fails takes its channels over with the
// backoff's next step (see nodeSubscription.retry).
func (s *shardedSubscription) resubscribe(channels []string, wait time.Duration) {
	if resubscribed != nil {
		defer resubscribed()
	}
	wait = max(wait, shardRetryMin)
	for len(channels) > 0 {
		s.c.ReloadState(s.ctx) // in the background
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, shardRetryMax)
		ctx, cancel := context.WithTimeout(s.ctx, shardTimeout)
		var failed []string
		for _, ch := range channels {
			if err := s.subscribe(ctx, ch, true, wait); errors.Is(err, errClosed) {
				cancel()
				return
			} else if err != nil {
				failed = append(failed, ch)
			}
		}
		cancel()
		channels = failed
	}
}
