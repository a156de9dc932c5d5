package goredis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/keyslot"
	"github.com/redis/go-redis/v9"
)

var _ dlock.ShardedSubscriber = (*Driver)(nil)

// SubscribeSharded subscribes to shard channels on a Redis Cluster. Each
// slot whose channels it listens to gets a goroutine and a connection of
// its own, to the primary that serves the slot: SSUBSCRIBE works only
// there. When that connection fails, or the node stops serving the slot
// (a failover or a slot move: the server then unsubscribes its shard
// channels, or answers MOVED), the goroutine has go-redis read the
// cluster's slots again and subscribes anew on the slot's primary.
// A cluster without shard channels (before Redis 7) returns
// dlock.ErrUnsupported, and dlock then uses PUBLISH. (It does
// not rely on go-redis's own reconnection of a ClusterClient's SSubscribe,
// which before v9.18 picks a random node.) notify is called one message at
// a time. A slot's connection is closed when its last channel is
// unsubscribed. Other clients than a ClusterClient return
// dlock.ErrUnsupported.
func (d *Driver) SubscribeSharded(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	c, ok := d.rdb.(*redis.ClusterClient)
	if !ok {
		return nil, dlock.ErrUnsupported
	}
	// Shard channels came with Redis 7: an older server knows no SPUBLISH.
	info, err := c.Do(ctx, "COMMAND", "INFO", "SPUBLISH").Slice()
	if err != nil {
		return nil, err
	}
	if len(info) != 1 || info[0] == nil {
		return nil, fmt.Errorf("%w: the cluster has no shard channels (Redis 7 needed)", dlock.ErrUnsupported)
	}
	return &shardedSubscription{c: c, notify: notify, slots: map[int]*slotSubscription{}}, nil
}

// shardedSubscription is the shard channels of one subscriber, by slot.
type shardedSubscription struct {
	c      *redis.ClusterClient
	notify func(channel, payload string)

	deliver sync.Mutex // notify is called one message at a time

	mu     sync.Mutex
	slots  map[int]*slotSubscription
	closed bool
}

// slotSubscription is one slot's channels and the goroutine that keeps them
// subscribed on the slot's primary.
type slotSubscription struct {
	s        *shardedSubscription
	channels map[string]bool // guarded by s.mu
	ps       *redis.PubSub   // guarded by s.mu; nil while connecting
	stop     chan struct{}   // closed when the slot is given up
	done     chan struct{}   // closed when the goroutine returns
}

const (
	// shardRetryMin and shardRetryMax bound the wait before subscribing a
	// slot again after its connection failed.
	shardRetryMin = 50 * time.Millisecond
	shardRetryMax = time.Second
	// shardTimeout bounds each request that subscribes a slot.
	shardTimeout = 5 * time.Second
)

var errClosed = errors.New("goredis: subscription closed")

// Subscribe sends SSUBSCRIBE for every channel before it returns; for a
// slot new to the subscription, on a connection it opens to the slot's
// primary.
func (s *shardedSubscription) Subscribe(ctx context.Context, channels ...string) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosed
	}
	var errs []error
	var added []*slotSubscription
	for _, ch := range channels {
		slot := keyslot.Of(ch)
		sub := s.slots[slot]
		if sub == nil {
			sub = &slotSubscription{s: s, channels: map[string]bool{ch: true},
				stop: make(chan struct{}), done: make(chan struct{})}
			s.slots[slot] = sub
			added = append(added, sub)
			continue
		}
		if sub.channels[ch] {
			continue
		}
		sub.channels[ch] = true
		if sub.ps != nil {
			if err := sub.ps.SSubscribe(ctx, ch); err != nil {
				errs = append(errs, err) // the goroutine subscribes it again if the connection failed
			}
		}
	}
	s.mu.Unlock()
	// New slots connect now, so that a notice sent once Subscribe returned
	// finds them subscribed, and then keep going on their own.
	for _, sub := range added {
		ps := sub.connect(ctx)
		if ps == nil {
			errs = append(errs, fmt.Errorf("goredis: no connection to the primary of slot %d yet; retrying in the background", keyslot.Of(firstChannel(sub))))
		}
		go sub.run(ps)
	}
	return errors.Join(errs...)
}

// firstChannel returns a channel of the slot, for messages.
func firstChannel(sub *slotSubscription) string {
	sub.s.mu.Lock()
	defer sub.s.mu.Unlock()
	for ch := range sub.channels {
		return ch
	}
	return ""
}

func (s *shardedSubscription) Unsubscribe(ctx context.Context, channels ...string) error {
	s.mu.Lock()
	var idle []*slotSubscription
	var errs []error
	for _, ch := range channels {
		slot := keyslot.Of(ch)
		sub := s.slots[slot]
		if sub == nil || !sub.channels[ch] {
			continue
		}
		delete(sub.channels, ch)
		switch {
		case len(sub.channels) == 0:
			delete(s.slots, slot)
			idle = append(idle, sub)
		case sub.ps != nil:
			if err := sub.ps.SUnsubscribe(ctx, ch); err != nil {
				errs = append(errs, err)
			}
		}
	}
	s.mu.Unlock()
	for _, sub := range idle {
		sub.close()
	}
	return errors.Join(errs...)
}

func (s *shardedSubscription) Close() error {
	s.mu.Lock()
	subs := s.slots
	s.slots, s.closed = map[int]*slotSubscription{}, true
	s.mu.Unlock()
	for _, sub := range subs {
		sub.close()
	}
	return nil
}

// close stops the slot's goroutine and waits for it. The slot is already
// out of s.slots.
func (sub *slotSubscription) close() {
	sub.s.mu.Lock()
	close(sub.stop)
	ps := sub.ps
	sub.s.mu.Unlock()
	if ps != nil {
		_ = ps.Close() // ends a Receive under way
	}
	<-sub.done
}

// run keeps the slot's channels subscribed on the slot's primary until the
// slot is given up, on ps (nil if none could be had yet) and then,
// after every failure, on a new connection.
func (sub *slotSubscription) run(ps *redis.PubSub) {
	defer close(sub.done)
	wait := shardRetryMin
	for {
		if ps == nil {
			ps = sub.connect(context.Background())
		}
		if ps != nil {
			if sub.receive(ps) {
				wait = shardRetryMin // it worked for a while: retry at once
			}
			sub.s.mu.Lock()
			sub.ps = nil
			sub.s.mu.Unlock()
			_ = ps.Close()
			ps = nil
		}
		select {
		case <-sub.stop:
			return
		default:
		}
		sub.s.c.ReloadState(context.Background()) // in the background
		select {
		case <-sub.stop:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, shardRetryMax)
	}
}

// connect subscribes the slot's channels on the primary that serves it,
// as far as the cluster client knows; nil when it could not, or the slot
// was given up.
func (sub *slotSubscription) connect(ctx context.Context) *redis.PubSub {
	s := sub.s
	s.mu.Lock()
	var channels []string
	for ch := range sub.channels {
		channels = append(channels, ch)
	}
	s.mu.Unlock()
	if len(channels) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shardTimeout)
	defer cancel()
	node, err := s.c.MasterForKey(ctx, channels[0])
	if err != nil {
		return nil
	}
	ps := node.SSubscribe(ctx, channels...)
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-sub.stop:
		_ = ps.Close()
		return nil
	default:
	}
	sub.ps = ps
	// Channels added while it connected.
	var more []string
	for ch := range sub.channels {
		if !slices.Contains(channels, ch) {
			more = append(more, ch)
		}
	}
	if len(more) > 0 {
		_ = ps.SSubscribe(ctx, more...)
	}
	return ps
}

// receive delivers the slot's messages until the connection fails or the
// node stops serving the slot; it reports whether any reply came.
func (sub *slotSubscription) receive(ps *redis.PubSub) (answered bool) {
	s := sub.s
	for {
		msg, err := ps.Receive(context.Background())
		if err != nil {
			return answered // a failed connection, an error reply such as MOVED, or Close
		}
		answered = true
		switch m := msg.(type) {
		case *redis.Message:
			s.deliver.Lock()
			s.notify(m.Channel, m.Payload)
			s.deliver.Unlock()
		case *redis.Subscription:
			if m.Kind != "sunsubscribe" {
				continue
			}
			s.mu.Lock()
			moved := sub.channels[m.Channel]
			s.mu.Unlock()
			if moved {
				return true // the server let go of a channel still wanted: the slot moved
			}
		}
	}
}
