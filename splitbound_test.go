package dlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/redis/go-redis/v9"
)

// TestAFailedSplitAttemptGivesBackAndCleansUpWithinOneBound: a TryLockMulti
// over two primaries whose second part its deadline cuts short gives its
// parts back, and then cleans up after the part whose reply it lost; the
// give-back and the clean-up share the 2s that an acquire may take past its
// context (see the README), as they do when the give-back fails. Here the
// give-back is answered after 1s (the second primary was stopped), and the
// clean-up then meets the first primary paused for writes: it used to get
// 2s of its own, and the TryLockMulti returned 3.2s past its context.
func TestAFailedSplitAttemptGivesBackAndCleansUpWithinOneBound(t *testing.T) {
	t.Run("TryLockMulti", func(t *testing.T) {
		testSplitExitBound(t, func(c *dlock.Client, ctx context.Context, names []string) error {
			_, err := c.TryLockMulti(ctx, names)
			return err
		})
	})
	t.Run("LockMulti", func(t *testing.T) {
		testSplitExitBound(t, func(c *dlock.Client, ctx context.Context, names []string) error {
			_, err := c.LockMulti(ctx, names)
			return err
		})
	})
}

func testSplitExitBound(t *testing.T, acquire func(c *dlock.Client, ctx context.Context, names []string) error) {
	e := newClusterEnv(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: e.cluster.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	names := e.names[:2]              // on two primaries, in the order of their slots
	l, err := c.LockMulti(ctx, names) // learns the cluster; connections to both, and the subscriptions
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := e.cluster.PrimaryOf(t, c.RedisKey(names[0]))
	second := e.cluster.PrimaryOf(t, c.RedisKey(names[1]))
	resume := second.PauseAWhile(t)
	const wait = 300 * time.Millisecond
	done := make(chan time.Duration, 1)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		start := time.Now()
		if err := acquire(c, ctx, names); err == nil {
			t.Error("obtained a lock from a stopped primary")
		}
		done <- time.Since(start)
	}()
	second.AwaitUnread(t, 5*time.Second)    // the second part reached it
	time.Sleep(wait + 800*time.Millisecond) // the give-back waits for it
	first.Do(t, "CLIENT", "PAUSE", "4000", "WRITE")
	defer first.Do(t, "CLIENT", "UNPAUSE")
	resume() // the give-back is answered; the clean-up meets the first paused
	took := <-done
	if bound := wait + 2*time.Second + 300*time.Millisecond; took > bound {
		t.Errorf("returned %v after it began, %v past its context (the bound is 2s)", took.Round(time.Millisecond), (took - wait).Round(time.Millisecond))
	}
}
