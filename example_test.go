package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/redis/go-redis/v9"
)

func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	l, err := locks.TryLock(ctx, "nightly-report", dlock.WithTTL(30*time.Second))
	if errors.Is(err, dlock.ErrNotObtained) {
		fmt.Println("another process is running the report")
		return
	} else if err != nil {
		fmt.Println("redis:", err)
		return
	}
	defer l.Release(ctx)

	fmt.Println("running the report under", l.Key())
	// Output: running the report under nightly-report
}

func ExampleClient_TryLock() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	first, _ := locks.TryLock(ctx, "orders:42")
	_, err := locks.TryLock(ctx, "orders:42")
	fmt.Println("second try:", errors.Is(err, dlock.ErrNotObtained))

	_ = first.Release(ctx)
	again, err := locks.TryLock(ctx, "orders:42")
	fmt.Println("after release:", err == nil)
	_ = again.Release(ctx)
	// Output:
	// second try: true
	// after release: true
}

func ExampleClient_Lock() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	// A holder that crashed: its lock expires after 50ms.
	_, _ = locks.TryLock(ctx, "migration", dlock.WithTTL(50*time.Millisecond))

	// Lock waits, waking up when the holder's lock expires.
	l, err := locks.Lock(ctx, "migration",
		dlock.WithRetry(dlock.Jitter(dlock.ExponentialBackoff(2*time.Millisecond, 500*time.Millisecond), 0.5)))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Release(ctx)
	fmt.Println("obtained")
	// Output: obtained
}

func ExampleLock_Refresh() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	l, _ := locks.TryLock(ctx, "rebuild-cache", dlock.WithTTL(time.Second))
	if err := l.Refresh(ctx, time.Minute); err != nil {
		fmt.Println(err)
		return
	}
	left, _ := l.TTL(ctx)
	fmt.Println("more than a second left:", left > time.Second)
	_ = l.Release(ctx)

	err := l.Refresh(ctx, time.Minute)
	fmt.Println("refresh after release:", errors.Is(err, dlock.ErrNotHeld))
	// Output:
	// more than a second left: true
	// refresh after release: true
}

func ExampleClient_TryLockMulti() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	// A transfer locks both accounts, or neither.
	l, err := locks.TryLockMulti(ctx, []string{"account:1", "account:2"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Release(ctx)
	fmt.Println(l.Keys())
	// Output: [account:1 account:2]
}

func ExampleClient_Attach() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	l, _ := locks.TryLock(ctx, "deploy", dlock.WithMetadata("pipeline 812"))
	// Another process, handed the name and the token, takes over.
	heir, err := locks.Attach(ctx, "deploy", l.Token())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(heir.Metadata())
	_ = heir.Release(ctx)
	// Output: pipeline 812
}

func ExampleWithOwner() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	outer, _ := locks.TryLock(ctx, "invoice:9", dlock.WithOwner("request-31"))
	inner, err := locks.TryLock(ctx, "invoice:9", dlock.WithOwner("request-31"))
	fmt.Println("re-entered:", err == nil, "same fence:", inner.Fence() == outer.Fence())
	_ = inner.Release(ctx)
	_ = outer.Release(ctx) // the second release frees it
	// Output: re-entered: true same fence: true
}
