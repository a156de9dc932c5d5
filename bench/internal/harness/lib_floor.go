package harness

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The floor is the least a correct lock on one Redis costs with go-redis:
// SET key token PX ttl NX to take it, a compare-and-delete script to give
// it back, polling every millisecond to wait. Every other library is
// measured against it.
var floorLibrary = Library{
	Name:  "floor",
	Setup: "raw go-redis: SET NX PX, compare-and-delete script, polls every 1 ms; auto-refresh: one pipelined compare-and-pexpire per lock every TTL/2",
	New:   newFloor,
}

var (
	floorRelease = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)
	floorRefresh = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pexpire", KEYS[1], ARGV[2]) else return 0 end`)
)

// floorPoll is how long the floor sleeps between attempts while it waits.
const floorPoll = time.Millisecond

// floorRefreshBatch is how many refreshes the floor sends per pipeline.
const floorRefreshBatch = 1000

type floor struct {
	rdb   *redis.Client
	ttl   time.Duration
	ttlMs int64

	// Auto-refresh: the locks to keep alive, and the goroutine that does.
	mu      sync.Mutex
	auto    map[string]string // key → token
	started bool
	stop    chan struct{}
	done    chan struct{}
}

func newFloor(cfg ClientConfig) (Locker, error) {
	return &floor{
		rdb: newGoRedis(cfg), ttl: cfg.TTL, ttlMs: cfg.TTL.Milliseconds(),
		auto: map[string]string{}, stop: make(chan struct{}), done: make(chan struct{}),
	}, nil
}

type floorLock struct {
	f          *floor
	key, token string
	auto       bool
}

func newFloorToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func (f *floor) TryLock(ctx context.Context, key string) (Held, error) {
	token := newFloorToken()
	cmd := redis.NewStatusCmd(ctx, "set", key, token, "px", f.ttlMs, "nx")
	if err := f.rdb.Process(ctx, cmd); err != nil {
		if errors.Is(err, redis.Nil) {
			return nil, ErrBusy
		}
		return nil, err
	}
	return &floorLock{f: f, key: key, token: token}, nil
}

func (f *floor) Lock(ctx context.Context, key string) (Held, error) {
	var t *time.Timer
	for {
		l, err := f.TryLock(ctx, key)
		if !errors.Is(err, ErrBusy) {
			return l, err
		}
		if t == nil {
			t = time.NewTimer(floorPoll)
			t.Stop()
		}
		if err := sleepCtx(ctx, t, floorPoll); err != nil {
			return nil, err
		}
	}
}

func (f *floor) TryLockAutoRefresh(ctx context.Context, key string) (Held, error) {
	h, err := f.TryLock(ctx, key)
	if err != nil {
		return nil, err
	}
	l := h.(*floorLock)
	l.auto = true
	f.mu.Lock()
	f.auto[key] = l.token
	if !f.started {
		f.started = true
		go f.refresher()
	}
	f.mu.Unlock()
	return l, nil
}

// refresher refreshes every auto-refreshed lock every TTL/2, in pipelines
// of floorRefreshBatch.
func (f *floor) refresher() {
	defer close(f.done)
	ctx := context.Background()
	_ = floorRefresh.Load(ctx, f.rdb).Err()
	tick := time.NewTicker(f.ttl / 2)
	defer tick.Stop()
	var keys, tokens []string
	for {
		select {
		case <-f.stop:
			return
		case <-tick.C:
		}
		keys, tokens = keys[:0], tokens[:0]
		f.mu.Lock()
		for k, t := range f.auto {
			keys, tokens = append(keys, k), append(tokens, t)
		}
		f.mu.Unlock()
		for len(keys) > 0 {
			n := min(len(keys), floorRefreshBatch)
			_, _ = f.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := range n {
					floorRefresh.EvalSha(ctx, p, keys[i:i+1], tokens[i], f.ttlMs)
				}
				return nil
			})
			keys, tokens = keys[n:], tokens[n:]
		}
	}
}

func (l *floorLock) Release(ctx context.Context) error {
	if l.auto {
		l.f.mu.Lock()
		delete(l.f.auto, l.key)
		l.f.mu.Unlock()
	}
	n, err := floorRelease.Run(ctx, l.f.rdb, []string{l.key}, l.token).Int64()
	if err != nil {
		return err
	}
	if n != 1 {
		return errNotHeld
	}
	return nil
}

// errNotHeld is what Release returns for a lock that had been lost.
var errNotHeld = errors.New("lock was not held at release")

func (f *floor) Close() error {
	f.mu.Lock()
	started := f.started
	f.mu.Unlock()
	if started {
		close(f.stop)
		<-f.done
	}
	return f.rdb.Close()
}
