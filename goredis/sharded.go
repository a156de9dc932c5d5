package goredis

import (
	"context"
	"errors"
	"sync"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/keyslot"
	"github.com/redis/go-redis/v9"
)

var _ dlock.ShardedSubscriber = (*Driver)(nil)

// SubscribeSharded subscribes to shard channels on a Redis Cluster, with
// one go-redis PubSub, and so one connection, for each slot whose channels
// it listens to: go-redis sends a PubSub's SSUBSCRIBE to the owner of its
// first channel's slot, and after a failover or a slot move reconnects to
// the new owner. notify is called one message at a time, from the slots'
// goroutines. A slot's PubSub is closed when its last channel is
// unsubscribed. Other clients than a ClusterClient return
// dlock.ErrUnsupported.
func (d *Driver) SubscribeSharded(ctx context.Context, notify func(channel, payload string)) (dlock.Subscription, error) {
	c, ok := d.rdb.(*redis.ClusterClient)
	if !ok {
		return nil, dlock.ErrUnsupported
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

// slotSubscription is the PubSub of one slot's channels.
type slotSubscription struct {
	ps       *redis.PubSub
	channels map[string]bool
	done     chan struct{} // closed when its delivering goroutine returns
}

var errClosed = errors.New("goredis: subscription closed")

func (s *shardedSubscription) Subscribe(ctx context.Context, channels ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	var errs []error
	for _, ch := range channels {
		slot := keyslot.Of(ch)
		sub := s.slots[slot]
		if sub == nil {
			sub = &slotSubscription{ps: s.c.SSubscribe(ctx), channels: map[string]bool{}, done: make(chan struct{})}
			s.slots[slot] = sub
			msgs := sub.ps.Channel()
			go func() {
				defer close(sub.done)
				for msg := range msgs {
					s.deliver.Lock()
					s.notify(msg.Channel, msg.Payload)
					s.deliver.Unlock()
				}
			}()
		}
		if sub.channels[ch] {
			continue
		}
		if err := sub.ps.SSubscribe(ctx, ch); err != nil {
			errs = append(errs, err)
			continue
		}
		sub.channels[ch] = true
	}
	return errors.Join(errs...)
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
		if len(sub.channels) == 0 {
			delete(s.slots, slot)
			idle = append(idle, sub)
		} else if err := sub.ps.SUnsubscribe(ctx, ch); err != nil {
			errs = append(errs, err)
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

// close closes the slot's PubSub and waits for its goroutine.
func (sub *slotSubscription) close() {
	_ = sub.ps.Close()
	<-sub.done
}
