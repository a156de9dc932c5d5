package dlockrueidis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/keyslot"
	"github.com/redis/rueidis"
)

var _ dlock.ShardedSubscriber = (*Driver)(nil)

// SubscribeSharded subscribes to shard channels on a Redis Cluster. Each
// slot whose channels it listens to gets a subscription of its own, like
// Subscribe's: a dedicated connection (Dedicate, pub/sub hooks, a
// goroutine) that rueidis opens to the primary serving the slot, where
// SSUBSCRIBE works. When that connection breaks, or the node lets go of
// the slot's channels (a slot move: the server unsubscribes them by
// itself), it connects again with the same backoff, and SSUBSCRIBE reaches
// the slot's primary as rueidis knows it then: rueidis reads the cluster's
// slots again after a failed connection or a MOVED reply. A slot's
// connection is closed when its last channel is unsubscribed. notify is
// called one message at a time. A client that is not a cluster client, or
// a cluster without shard channels (before Redis 7), returns
// dlock.ErrUnsupported, and dlock then uses PUBLISH.
func (d *Driver) SubscribeSharded(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	if d.client.Mode() != rueidis.ClientModeCluster {
		return nil, dlock.ErrUnsupported
	}
	// Shard channels came with Redis 7: an older server knows no SPUBLISH.
	info, err := d.client.Do(ctx, d.client.B().CommandInfo().CommandName("SPUBLISH").Build()).ToArray()
	if err != nil {
		return nil, err
	}
	if len(info) != 1 || info[0].IsNil() {
		return nil, fmt.Errorf("%w: the cluster has no shard channels (Redis 7 needed)", dlock.ErrUnsupported)
	}
	s := &shardedSubscription{client: d.client, slots: map[int]*subscription{}}
	s.notify = func(channel, payload string) {
		s.deliver.Lock()
		defer s.deliver.Unlock()
		notify(channel, payload)
	}
	return s, nil
}

// shardedSubscription is the subscriptions of one subscriber to shard
// channels, by slot.
type shardedSubscription struct {
	client  rueidis.Client
	notify  func(channel, payload string) // the caller's, one message at a time
	deliver sync.Mutex

	mu     sync.Mutex
	slots  map[int]*subscription
	closed bool
}

// Subscribe sends SSUBSCRIBE for every channel before it returns; for a
// slot new to the subscription, on a connection it opens to the slot's
// primary. If that fails, the slot's goroutine keeps trying.
func (s *shardedSubscription) Subscribe(ctx context.Context, channels ...string) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosed
	}
	var errs []error
	var added []*subscription
	for slot, chs := range bySlot(channels) {
		if sub := s.slots[slot]; sub != nil {
			errs = append(errs, sub.Subscribe(ctx, chs...))
			continue
		}
		sub := newSubscription(s.client, s.notify, chs[0])
		for _, ch := range chs {
			sub.channels[ch] = true
		}
		s.slots[slot] = sub
		added = append(added, sub)
	}
	s.mu.Unlock()
	// New slots connect now, unlocked, so that a notice sent once
	// Subscribe returned finds them subscribed; channels of their slots
	// added meanwhile are caught up with by install.
	for _, sub := range added {
		errs = append(errs, sub.start(ctx))
	}
	return errors.Join(errs...)
}

// start connects a new subscription to shard channels and starts its
// goroutine, which connects again if this attempt failed.
func (s *subscription) start(ctx context.Context) error {
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
		err = fmt.Errorf("dlockrueidis: SSUBSCRIBE in the slot of %q: %w; retrying in the background", s.shard, err)
	}
	go s.run(c)
	return err
}

// Unsubscribe sends SUNSUBSCRIBE, or closes the connection of a slot whose
// last channels it removes.
func (s *shardedSubscription) Unsubscribe(ctx context.Context, channels ...string) error {
	s.mu.Lock()
	var errs []error
	var idle []*subscription
	for slot, chs := range bySlot(channels) {
		sub := s.slots[slot]
		switch {
		case sub == nil:
		case sub.onlyAmong(chs):
			delete(s.slots, slot)
			idle = append(idle, sub)
		default:
			errs = append(errs, sub.Unsubscribe(ctx, chs...))
		}
	}
	s.mu.Unlock()
	for _, sub := range idle {
		_ = sub.Close()
	}
	return errors.Join(errs...)
}

// Close closes every slot's connection and waits for their goroutines. It
// always returns nil.
func (s *shardedSubscription) Close() error {
	s.mu.Lock()
	subs := s.slots
	s.slots, s.closed = nil, true
	s.mu.Unlock()
	for _, sub := range subs {
		sub.cancel()
	}
	for _, sub := range subs {
		<-sub.done
	}
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
