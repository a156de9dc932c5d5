package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/redis/go-redis/v9"
)

func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
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

	fmt.Println("running the report under", l.Name())
	// Output: running the report under nightly-report
}

func ExampleClient_TryLock() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
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
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	// A holder that crashed: its lock expires after 50ms.
	_, _ = locks.TryLock(ctx, "migration", dlock.WithTTL(50*time.Millisecond))

	// Lock waits, woken when Redis says the lock is free or when the
	// holder's lock expires.
	l, err := locks.Lock(ctx, "migration")
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
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
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
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
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
	fmt.Println(l.Names())
	// Output: [account:1 account:2]
}

func ExampleClient_Attach() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
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
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
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

func ExampleWithMinHold() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	// Each host runs this when its schedule fires, once an hour.
	cleanup := func(host string) {
		err := locks.TryDo(ctx, "hourly-cleanup", func(ctx context.Context) error {
			fmt.Println(host, "cleans up")
			return nil
		}, dlock.WithMinHold(50*time.Minute))
		if errors.Is(err, dlock.ErrNotObtained) {
			fmt.Println(host, "skips: done this hour")
		}
	}
	cleanup("host-a")
	cleanup("host-b") // fires after host-a's run has ended

	info, _ := locks.Inspect(ctx, "hourly-cleanup")
	fmt.Println("kept, released:", info.Holders[0].Count == 0)
	_, _ = locks.ForceRelease(ctx, "hourly-cleanup") // the example's own clean-up
	// Output:
	// host-a cleans up
	// host-b skips: done this hour
	// kept, released: true
}

func ExampleClient_RWMutex() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	config := locks.RWMutex("config")
	r1, _ := config.TryRLock(ctx)
	r2, _ := config.TryRLock(ctx)
	_, err := config.TryLock(ctx)
	fmt.Println("two readers in, writer refused:", errors.Is(err, dlock.ErrNotObtained))

	_ = r1.Release(ctx)
	_ = r2.Release(ctx)
	w, err := config.TryLock(ctx)
	fmt.Println("writer in:", err == nil, "with a fence:", w.Fence() > 0)
	_ = w.Release(ctx)
	// Output:
	// two readers in, writer refused: true
	// writer in: true with a fence: true
}

func ExampleRWMutex_Lock() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	catalog := locks.RWMutex("catalog")
	// A reader that crashed: its hold expires after half a second.
	_, _ = catalog.TryRLock(ctx, dlock.WithTTL(500*time.Millisecond))

	// The writer waits, and no new reader gets in while it does.
	var once sync.Once
	w, err := catalog.Lock(ctx, dlock.WithOnRetry(func(int, error) {
		once.Do(func() {
			_, err := catalog.TryRLock(ctx)
			fmt.Println("new reader refused while the writer waits:", errors.Is(err, dlock.ErrNotObtained))
		})
	}))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("writer in")
	_ = w.Release(ctx)
	// Output:
	// new reader refused while the writer waits: true
	// writer in
}

// ExampleRWMutex_Do rebuilds a cache that many readers use: readers hold the
// read lock together (RDo), and the rebuild takes the write lock (Do), which
// waits for the readers in to leave and keeps new ones out until it is done.
func ExampleRWMutex_Do() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	cache := locks.RWMutex("cache:products")
	var readersIn atomic.Int32 // the cache's readers, across the fleet
	var version atomic.Int32   // the cache, as a shared store would hold it

	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := cache.RDo(ctx, func(ctx context.Context) error {
				readersIn.Add(1)
				defer readersIn.Add(-1)
				_ = version.Load() // read the cache
				return nil
			})
			if err != nil {
				fmt.Println("read:", err)
			}
		}()
	}
	err := cache.Do(ctx, func(ctx context.Context) error {
		fmt.Println("readers in during the rebuild:", readersIn.Load())
		version.Add(1) // rebuild the cache
		return nil
	})
	wg.Wait()
	fmt.Println("rebuilt:", err == nil, "version", version.Load())
	// Output:
	// readers in during the rebuild: 0
	// rebuilt: true version 1
}

func ExampleClient_Semaphore() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	downloads := locks.Semaphore("downloads", 2)
	a, _ := downloads.TryAcquire(ctx)
	b, _ := downloads.TryAcquire(ctx)
	_, err := downloads.TryAcquire(ctx)
	fmt.Println("third of two permits:", errors.Is(err, dlock.ErrNotObtained))

	_ = downloads.SetPermits(3)
	c, err := downloads.TryAcquire(ctx)
	fmt.Println("third of three permits:", err == nil)
	for _, l := range []*dlock.Lock{a, b, c} {
		_ = l.Release(ctx)
	}
	// Output:
	// third of two permits: true
	// third of three permits: true
}

// ExampleSemaphore_Do limits the calls to a partner's API to 3 at once
// across processes: here two clients, as two processes would each have,
// make 8 calls from goroutines of their own.
func ExampleSemaphore_Do() {
	ctx := context.Background()
	var (
		mu             sync.Mutex
		inFlight, most int
	)
	callAPI := func(ctx context.Context) error { // ctx is cancelled if the permit is lost
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		time.Sleep(10 * time.Millisecond) // the call
		mu.Lock()
		inFlight--
		mu.Unlock()
		return nil
	}

	var wg sync.WaitGroup
	for range 2 { // two processes
		rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
		defer rdb.Close()
		locks := dlock.New(goredis.New(rdb))
		defer locks.Close()
		partner := locks.Semaphore("partner-api", 3) // every caller gives the same count
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Waits for a permit, 10 seconds at most.
				if err := partner.Do(ctx, callAPI, dlock.WithMaxWait(10*time.Second)); err != nil {
					fmt.Println("err:", err)
				}
			}()
		}
	}
	wg.Wait()
	fmt.Println("at most 3 calls at once:", most <= 3)
	// Output: at most 3 calls at once: true
}

func ExampleClient_Inspect() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	index := locks.RWMutex("search-index")
	r, _ := index.TryRLock(ctx, dlock.WithOwner("query-7"), dlock.WithMetadata("host=web-3"))
	defer r.Release(ctx)

	info, err := locks.Inspect(ctx, "search-index")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(info.Kind, len(info.Holders), "holder")
	for _, h := range info.Holders {
		fmt.Println(h.Mode, h.Owner, h.Metadata, h.Count, h.TTL > 0)
	}
	// Output:
	// rwlock 1 holder
	// read query-7 host=web-3 1 true
}

func ExampleClient_List() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	_, _ = locks.TryLock(ctx, "jobs:nightly")
	_, _ = locks.Semaphore("jobs:uploads", 4).TryAcquire(ctx)
	infos, err := locks.List(ctx, "jobs:*")
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, info := range infos {
		fmt.Println(info.Name, info.Kind, len(info.Holders))
		// An operator frees them whoever holds them.
		_, _ = locks.ForceRelease(ctx, info.Name)
	}
	// Output:
	// jobs:nightly lock 1
	// jobs:uploads semaphore 1
}

func ExampleWithHooks() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb), dlock.WithHooks(dlock.Hooks{
		AcquireDone: func(ctx context.Context, h dlock.HookInfo, r dlock.AcquireResult) {
			fmt.Println(h.Mode, h.Names, r.Outcome, "after", r.Attempts, "attempt(s)")
		},
		ReleaseDone: func(ctx context.Context, h dlock.HookInfo, held time.Duration, err error) {
			fmt.Println("released", h.Names, err == nil)
		},
	}))
	defer locks.Close()

	l, _ := locks.TryLock(ctx, "hooks:example")
	_, _ = locks.TryLock(ctx, "hooks:example")
	_ = l.Release(ctx)
	// Output:
	// exclusive [hooks:example] obtained after 1 attempt(s)
	// exclusive [hooks:example] not_obtained after 1 attempt(s)
	// released [hooks:example] true
}

// ExampleHooks counts acquisitions by outcome and logs the locks that are
// lost, as a service would feed its own metrics and logs. The End hook is
// called once for every lock obtained: with a nil error when it is
// released, with one matching ErrLost when it is lost.
func ExampleHooks() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	// Hooks run on several goroutines at once (the watchdog's among
	// them): counters they update must be safe for concurrent use.
	var obtained, refused atomic.Int64
	log := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{} // no time, for the example's output
			}
			return a
		},
	}))
	locks := dlock.New(goredis.New(rdb), dlock.WithHooks(dlock.Hooks{
		AcquireDone: func(ctx context.Context, h dlock.HookInfo, r dlock.AcquireResult) {
			switch r.Outcome {
			case dlock.OutcomeObtained:
				obtained.Add(1)
			case dlock.OutcomeNotObtained:
				refused.Add(1)
			}
		},
		End: func(h dlock.HookInfo, held time.Duration, err error) {
			if errors.Is(err, dlock.ErrLost) {
				log.Warn("lock lost", "names", h.Names, "force_released", errors.Is(err, dlock.ErrForceReleased))
			}
		},
	}))
	defer locks.Close()

	a, _ := locks.TryLock(ctx, "hooks:report")
	_, _ = locks.TryLock(ctx, "hooks:report")      // held: not obtained
	_, _ = locks.ForceRelease(ctx, "hooks:report") // an operator frees it
	err := a.Refresh(ctx, time.Minute)             // the holder finds it gone: End logs the loss
	<-a.Done()                                     // closed once the End hooks have returned
	b, _ := locks.TryLock(ctx, "hooks:report")
	_ = b.Release(ctx) // End with a nil error: not logged
	fmt.Println("refresh:", errors.Is(err, dlock.ErrNotHeld))
	fmt.Println("obtained:", obtained.Load(), "refused:", refused.Load())
	// Output:
	// level=WARN msg="lock lost" names=[hooks:report] force_released=true
	// refresh: true
	// obtained: 2 refused: 1
}

func ExampleWithFunctions() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	// Open loads dlock's scripts as a Redis Functions library now, and
	// says at once if the server cannot run functions (before Redis 7).
	locks, err := dlock.Open(ctx, goredis.New(rdb), dlock.WithFunctions())
	if errors.Is(err, dlock.ErrNoFunctions) {
		fmt.Println("no Redis Functions here; use dlock.New without WithFunctions")
		return
	} else if err != nil {
		fmt.Println("redis:", err)
		return
	}
	defer locks.Close()

	l, err := locks.TryLock(ctx, "functions:example") // FCALL dlock_…_acquire
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("held by FCALL:", l.Name())
	_ = l.Release(ctx)
	// Output: held by FCALL: functions:example
}
