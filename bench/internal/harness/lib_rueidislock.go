package harness

import (
	"context"
	"errors"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
)

var rueidislockLibrary = Library{
	Name:  "rueidislock",
	Setup: "rueidis/rueidislock, KeyMajority 1, NoLoopTracking; waits woken by client-side-caching invalidations; every lock auto-refreshes every TTL/2",
	New:   newRueidislock,
}

type rueidislockLocker struct {
	l rueidislock.Locker
}

func newRueidislock(cfg ClientConfig) (Locker, error) {
	l, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption:   rueidis.ClientOption{InitAddress: []string{cfg.Addr}},
		KeyMajority:    1,
		KeyValidity:    cfg.TTL,
		NoLoopTracking: true,
		ClientBuilder: func(o rueidis.ClientOption) (rueidis.Client, error) {
			return newRueidis(o, cfg.Counters)
		},
	})
	if err != nil {
		return nil, err
	}
	return &rueidislockLocker{l: l}, nil
}

// newRueidis returns a rueidis client whose requests c counts.
func newRueidis(o rueidis.ClientOption, c *Counters) (rueidis.Client, error) {
	client, err := rueidis.NewClient(o)
	if err != nil {
		return nil, err
	}
	return countingRueidis{Client: client, c: c}, nil
}

// countingRueidis counts the commands sent by Do and DoMulti, all that
// rueidislock and dlock's driver send but for the latter's pub/sub (on a
// dedicated connection, as go-redis sends a PubSub's commands past its
// hooks). rueidis pipelines concurrent Do calls on one connection by itself, so a
// round trip here is one the caller waits for, not one write on the wire.
type countingRueidis struct {
	rueidis.Client
	c *Counters
}

func (c countingRueidis) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.c.Commands.Add(1)
	c.c.RoundTrips.Add(1)
	return c.Client.Do(ctx, cmd)
}

func (c countingRueidis) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	c.c.Commands.Add(int64(len(cmds)))
	c.c.RoundTrips.Add(1)
	return c.Client.DoMulti(ctx, cmds...)
}

// rueidisHeld releases by cancelling the lock's context; the cancel
// function waits until the key is deleted.
type rueidisHeld struct{ cancel context.CancelFunc }

func (h rueidisHeld) Release(context.Context) error {
	h.cancel()
	return nil
}

func (r *rueidislockLocker) TryLock(ctx context.Context, key string) (Held, error) {
	_, cancel, err := r.l.TryWithContext(ctx, key)
	if errors.Is(err, rueidislock.ErrNotLocked) {
		return nil, ErrBusy
	}
	if err != nil {
		return nil, err
	}
	return rueidisHeld{cancel}, nil
}

func (r *rueidislockLocker) Lock(ctx context.Context, key string) (Held, error) {
	_, cancel, err := r.l.WithContext(ctx, key)
	if err != nil {
		return nil, err
	}
	return rueidisHeld{cancel}, nil
}

// TryLockAutoRefresh is TryLock: every rueidislock lock refreshes itself.
func (r *rueidislockLocker) TryLockAutoRefresh(ctx context.Context, key string) (Held, error) {
	return r.TryLock(ctx, key)
}

func (r *rueidislockLocker) Close() error {
	r.l.Close()
	return nil
}
