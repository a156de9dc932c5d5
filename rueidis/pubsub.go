package dlockrueidis

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/dlockio/dlock"
	"github.com/redis/rueidis"
)

// The backoff between attempts to connect a subscription again: it starts
// at minBackoff and doubles up to maxBackoff, and starts over once a
// connection has lasted maxBackoff.
const (
	minBackoff = 10 * time.Millisecond
	maxBackoff = time.Second
)

// errClosed is returned by a closed subscription.
var errClosed = errors.New("dlockrueidis: subscription closed")

// Subscribe opens a dedicated connection (rueidis's Dedicate) with pub/sub
// hooks, and checks that it works (PING) before it returns. The hooks
// queue the messages; a goroutine of the subscription, which Close ends
// and waits for, calls notify with them in order. When the connection
// breaks, that goroutine connects again, with a backoff from 10ms to 1s,
// subscribes again to the subscription's channels, and once the server
// confirmed them calls notify with an empty channel and payload (see
// dlock.Subscription). Over a Sentinel client, it does the same when the
// client has switched to a new primary, within 200ms, the old one being
// alive or not (not with SentinelOption's SendToReplicas, whose client does
// not tell which of its two nodes is the primary: the subscription then
// moves only once the old primary drops it). Subscribe and Unsubscribe never wait for notify.
// Close does not wait for a connection being made (whose handshake rueidis
// bounds by its dial timeout only): it is closed once made.
func (d *Driver) Subscribe(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	s := newSubscription(d.client, notify)
	c, err := s.connect(ctx, nil)
	if err != nil {
		s.cancel()
		return nil, err
	}
	s.conn = c
	close(s.started)
	go s.run(c)
	return s, nil
}

// subscription is a dlock.Subscription over a rueidis dedicated client: to
// plain channels, or to the shard channels that one primary of a cluster
// serves.
type subscription struct {
	client rueidis.Client
	notify func(channel, payload string)
	// reroute is nil for plain channels. For shard channels, it takes back
	// the channels that the primary let go of (their slot moved), or with
	// all every channel once the connection is lost or cannot be opened:
	// the subscription then ends instead of connecting again.
	reroute func(channels []string, all bool)
	ctx     context.Context // ends when Close is called
	cancel  context.CancelFunc
	done    chan struct{} // closed when run has returned
	// started is closed once start has connected a new primary's
	// subscription, or failed to (see shardedSubscription.subscribe).
	started chan struct{}

	// sending orders the requests that change what the connection is
	// subscribed to, and is held across them; mu guards the fields below
	// and is never held across a request, so that a primary slow to
	// answer holds up only the callers that write to it. sending comes
	// first when both are taken.
	sending  sync.Mutex
	mu       sync.Mutex
	conn     *conn // nil while connecting again, and once closed
	channels map[string]bool

	qmu     sync.Mutex
	queue   []rueidis.PubSubMessage
	dropped []string      // shard channels that the server unsubscribed
	ready   chan struct{} // a message was queued
}

// newSubscription returns a subscription that is not connected yet: to
// plain channels, or once given a reroute to shard channels on the node
// that client connects to.
func newSubscription(client rueidis.Client, notify func(channel, payload string)) *subscription {
	s := &subscription{client: client, notify: notify, channels: map[string]bool{},
		ready: make(chan struct{}, 1), done: make(chan struct{}), started: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// conn is one connection of a subscription.
type conn struct {
	dc      rueidis.DedicatedClient
	release func()
	lost    <-chan error // yields or closes once the hooks are no longer called
	since   time.Time
	primary string // Sentinel: the primary the client sent commands to when c was opened
	// unsubs, guarded by the subscription's qmu, counts by shard channel
	// the replies still due to the SUNSUBSCRIBEs sent on c: only a
	// sunsubscribe beyond them is the server letting the channel go (its
	// slot moved), and not one handled after the channel was subscribed
	// again.
	unsubs map[string]int
}

// followEvery is how often a subscription over a Sentinel client checks
// that the client still sends its commands to the primary the
// subscription's connection went to.
const followEvery = 200 * time.Millisecond

// connect opens a connection subscribed to channels, or gives up when ctx
// ends or Close is called. rueidis's handshake on a new connection heeds no
// context, only its dial timeout (5s by default): a server that does not
// answer would hold up Close that long. The connection, if it comes after
// connect gave up, is closed.
func (s *subscription) connect(ctx context.Context, channels []string) (*conn, error) {
	type result struct {
		c   *conn
		err error
	}
	got, gaveUp := make(chan result), make(chan struct{})
	go func() {
		c, err := s.open(ctx, channels)
		select {
		case got <- result{c, err}:
		case <-gaveUp:
			if err == nil {
				c.close()
			}
		}
	}()
	select {
	case r := <-got:
		return r.c, r.err
	case <-ctx.Done():
	case <-s.ctx.Done():
	}
	close(gaveUp)
	return nil, cmp.Or(ctx.Err(), errClosed)
}

// open opens a connection subscribed to channels (see connect).
func (s *subscription) open(ctx context.Context, channels []string) (*conn, error) {
	primary := s.primary() // before Dedicate: a switch between is seen at the next check
	dc, release := s.client.Dedicate()
	c := &conn{dc: dc, release: release, since: time.Now(), primary: primary, unsubs: map[string]int{}}
	hooks := rueidis.PubSubHooks{OnMessage: s.push}
	if s.reroute != nil {
		hooks.OnSubscription = func(sub rueidis.PubSubSubscription) { s.unsubscribed(c, sub) }
	}
	c.lost = dc.SetPubSubHooks(hooks)
	err := s.send(ctx, c, true, channels)
	if len(channels) == 0 {
		err = dc.Do(ctx, dc.B().Ping().Build()).Error()
	}
	if err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// primary returns the address the client sends its commands to when it
// is a Sentinel client that sends them to one server, "" otherwise.
// rueidis moves those to the new primary when Sentinel switches, but
// leaves dedicated connections where they are: on an old primary that
// lives on, a subscription hears nothing of the new one's notices until
// Sentinel makes it a replica, seconds later.
func (s *subscription) primary() string {
	if s.reroute != nil || s.client.Mode() != rueidis.ClientModeSentinel {
		return ""
	}
	nodes := s.client.Nodes()
	if len(nodes) != 1 {
		return ""
	}
	for addr := range nodes {
		return addr
	}
	return ""
}

func (c *conn) close() {
	c.dc.Close()
	c.release()
}

// push queues a message; it is called by rueidis and never blocks.
func (s *subscription) push(m rueidis.PubSubMessage) {
	s.qmu.Lock()
	s.queue = append(s.queue, m)
	s.qmu.Unlock()
	s.signal()
}

// unsubscribed queues a shard channel that the server unsubscribed on c
// by itself, when its node stopped serving the slot (a slot move, or a
// primary turned replica); the replies to c's own SUNSUBSCRIBEs, which
// c.unsubs counts, are not. It is called by rueidis, which waits for it,
// possibly inside a send: it must not take s.sending.
func (s *subscription) unsubscribed(c *conn, sub rueidis.PubSubSubscription) {
	if sub.Kind != "sunsubscribe" {
		return
	}
	s.qmu.Lock()
	if n := c.unsubs[sub.Channel]; n > 0 { // the reply to c's own
		if n == 1 {
			delete(c.unsubs, sub.Channel)
		} else {
			c.unsubs[sub.Channel] = n - 1
		}
		s.qmu.Unlock()
		return
	}
	s.dropped = append(s.dropped, sub.Channel)
	s.qmu.Unlock()
	s.signal()
}

func (s *subscription) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// run delivers the messages and keeps the subscription connected until
// Close, on c and then on a new connection whenever c breaks; c nil
// connects first. For shard channels, it hands the channels that the node
// lets go of to reroute, and when c breaks (or is nil) all of them, and
// returns.
func (s *subscription) run(c *conn) {
	defer close(s.done)
	delay := minBackoff
	var follow <-chan time.Time
	if s.primary() != "" {
		t := time.NewTicker(followEvery)
		defer t.Stop()
		follow = t.C
	}
	for {
		if c == nil && s.reroute != nil {
			s.deliver()
			if s.ctx.Err() == nil {
				s.reroute(nil, true)
			}
			return
		}
		if c == nil {
			if c = s.reconnect(&delay); c == nil {
				return
			}
			// Subscribed again: notices sent meanwhile were lost, and
			// dlock's waiters try again (see dlock.Subscription).
			if s.ctx.Err() == nil {
				s.notify("", "")
			}
		}
		select {
		case <-s.ready:
			if moved := s.deliver(); len(moved) > 0 {
				s.reroute(moved, false)
			}
			continue
		case <-c.lost:
		case <-follow:
			if p := s.primary(); p == "" || p == c.primary {
				continue
			}
			// Sentinel switched to another primary: the connection goes
			// there.
		case <-s.ctx.Done():
			s.drop(c)
			return
		}
		if time.Since(c.since) >= maxBackoff {
			delay = minBackoff
		}
		s.drop(c)
		c = nil
	}
}

// deliver passes the queued messages to notify, unless Close was called.
// It returns the shard channels that the server unsubscribed by itself
// while they are still wanted, which means that the node no longer serves
// their slot.
func (s *subscription) deliver() (moved []string) {
	s.qmu.Lock()
	msgs, dropped := s.queue, s.dropped
	s.queue, s.dropped = nil, nil
	s.qmu.Unlock()
	for _, m := range msgs {
		if s.ctx.Err() != nil {
			return nil
		}
		s.notify(m.Channel, m.Message)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range dropped {
		if s.channels[ch] && !slices.Contains(moved, ch) {
			moved = append(moved, ch)
		}
	}
	return moved
}

// drop closes a connection that broke, or at Close.
func (s *subscription) drop(c *conn) {
	s.mu.Lock()
	if s.conn == c {
		s.conn = nil
	}
	s.mu.Unlock()
	c.close()
}

// reconnect connects again after *delay, and again with a longer delay
// after each failure, until it succeeds or Close is called (it then
// returns nil).
func (s *subscription) reconnect(delay *time.Duration) *conn {
	for {
		if !sleep(s.ctx, *delay) {
			return nil
		}
		*delay = min(2**delay, maxBackoff)
		s.mu.Lock()
		want := s.list()
		s.mu.Unlock()
		c, err := s.connect(s.ctx, want)
		if err != nil {
			continue
		}
		if s.install(c, want) == nil {
			return c
		}
		s.drop(c)
	}
}

// install makes c the subscription's connection, and catches it up with
// the channels subscribed or unsubscribed while it connected to want; if
// that fails, the caller drops c.
func (s *subscription) install(c *conn, want []string) error {
	s.sending.Lock()
	defer s.sending.Unlock()
	s.mu.Lock()
	now := s.list()
	var add, remove []string
	for _, ch := range now {
		if !slices.Contains(want, ch) {
			add = append(add, ch)
		}
	}
	for _, ch := range want {
		if !s.channels[ch] {
			remove = append(remove, ch)
		}
	}
	s.conn = c
	s.mu.Unlock()
	if err := s.send(s.ctx, c, true, add); err != nil {
		return err
	}
	return s.send(s.ctx, c, false, remove)
}

// list returns the subscription's channels. s.mu is held.
func (s *subscription) list() []string {
	out := make([]string, 0, len(s.channels))
	for ch := range s.channels {
		out = append(out, ch)
	}
	return out
}

// send subscribes (or unsubscribes) c to channels. The replies that a
// SUNSUBSCRIBE is due are counted in c.unsubs first; if it fails, some may
// never come (a request not sent, or refused), and c is closed, so that a
// count left over never hides the server letting a channel go: c's
// goroutine then hands all its channels back.
func (s *subscription) send(ctx context.Context, c *conn, subscribe bool, channels []string) error {
	if len(channels) == 0 {
		return nil
	}
	unsub := !subscribe && s.reroute != nil
	if unsub {
		s.qmu.Lock()
		for _, ch := range channels {
			c.unsubs[ch]++
		}
		s.qmu.Unlock()
	}
	var errs []error
	for _, r := range c.dc.DoMulti(ctx, s.commands(c.dc, subscribe, channels)...) {
		errs = append(errs, r.Error())
	}
	err := errors.Join(errs...)
	if err != nil && unsub {
		c.dc.Close()
	}
	return err
}

// commands builds the SUBSCRIBE or UNSUBSCRIBE of channels, or for shard
// channels an SSUBSCRIBE or SUNSUBSCRIBE for each slot (the server takes
// the channels of one slot at a time).
func (s *subscription) commands(dc rueidis.DedicatedClient, subscribe bool, channels []string) []rueidis.Completed {
	switch {
	case s.reroute == nil && subscribe:
		return []rueidis.Completed{dc.B().Subscribe().Channel(channels...).Build()}
	case s.reroute == nil:
		return []rueidis.Completed{dc.B().Unsubscribe().Channel(channels...).Build()}
	}
	var cmds []rueidis.Completed
	for _, chs := range bySlot(channels) {
		if subscribe {
			cmds = append(cmds, dc.B().Ssubscribe().Channel(chs...).Build())
		} else {
			cmds = append(cmds, dc.B().Sunsubscribe().Channel(chs...).Build())
		}
	}
	return cmds
}

// Subscribe adds channels. While the subscription connects again, it only
// records them: they are subscribed to once it is connected.
func (s *subscription) Subscribe(ctx context.Context, channels ...string) error {
	return s.change(ctx, true, channels)
}

// Unsubscribe removes channels.
func (s *subscription) Unsubscribe(ctx context.Context, channels ...string) error {
	return s.change(ctx, false, channels)
}

func (s *subscription) change(ctx context.Context, subscribe bool, channels []string) error {
	s.sending.Lock()
	defer s.sending.Unlock()
	s.mu.Lock()
	if s.ctx.Err() != nil {
		s.mu.Unlock()
		return errClosed
	}
	for _, ch := range channels {
		if subscribe {
			s.channels[ch] = true
		} else {
			delete(s.channels, ch)
		}
	}
	c := s.conn
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	return s.send(ctx, c, subscribe, channels)
}

// Close closes the connection and waits for the goroutine that calls
// notify to end. It always returns nil.
func (s *subscription) Close() error {
	s.cancel()
	<-s.done
	return nil
}
