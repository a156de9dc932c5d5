package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/redlock"
	"github.com/redis/go-redis/v9"
)

func Example() {
	ctx := context.Background()

	// One client per independent master.
	var nodes []redlock.Node
	for _, addr := range exampleAddrs {
		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer rdb.Close()
		locks := dlock.New(goredis.New(rdb))
		defer locks.Close()
		nodes = append(nodes, redlock.Node{Addr: addr, Client: locks})
	}
	// WithLogger: a warning when a lock is lost (fewer than a quorum hold
	// it), with each node's cause; the default is the nodes' clients'
	// logger when they all have the same one.
	locker, err := redlock.New(nodes, redlock.WithLogger(slog.Default()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()

	// Lock tries again after a random delay while the lock is held or too
	// few nodes answer; TryLock would make one attempt.
	l, err := locker.Lock(ctx, "nightly-report", redlock.WithTTL(30*time.Second), redlock.WithAutoRefresh())
	switch {
	case errors.Is(err, dlock.ErrNotObtained):
		fmt.Println("another process is running the report")
		return
	case err != nil: // nodes failing (redlock.ErrNoQuorum), other data under the key, or ctx ended
		fmt.Println("redis:", err)
		return
	}
	defer l.Release(ctx)

	// Held on a quorum at least; l.Nodes() names the nodes that hold it.
	fmt.Println("held on a quorum:", len(l.Nodes()) >= locker.Quorum())
	work := l.Context(ctx) // cancelled if fewer than a quorum keep the lock
	_ = work
	// Output: held on a quorum: true
}

func ExampleLocker_Do() {
	ctx := context.Background()
	var nodes []redlock.Node
	for _, addr := range exampleAddrs {
		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer rdb.Close()
		locks := dlock.New(goredis.New(rdb))
		defer locks.Close()
		nodes = append(nodes, redlock.Node{Addr: addr, Client: locks})
	}
	locker, err := redlock.New(nodes)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()

	// Obtain, keep refreshed, run, release.
	err = locker.Do(ctx, "migration", func(ctx context.Context) error {
		fmt.Println("migrating") // stop when ctx is cancelled: the lock was lost
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// migrating
	// done: <nil>
}
