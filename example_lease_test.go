package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/redis/go-redis/v9"
)

func ExampleClient_TryDo() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	// Obtain, keep refreshed, run, release. ctx is cancelled if the lock is
	// lost while the function runs. TryDo skips the function when another
	// holds the lock; Do would wait for it, then run the function too.
	err := locks.TryDo(ctx, "nightly-report", func(ctx context.Context) error {
		fmt.Println("building the report")
		return nil
	}, dlock.WithTTL(5*time.Second))
	if errors.Is(err, dlock.ErrNotObtained) {
		err = nil // another process is building it
	}
	fmt.Println("err:", err)
	// Output:
	// building the report
	// err: <nil>
}

func ExampleClient_Do() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	// Every caller runs the function, one at a time: one that finds the
	// lock held waits for it (a minute at most by default). Checked under
	// the lock, work a caller ahead did is not done twice.
	var wg sync.WaitGroup
	var fresh atomic.Bool // the cache, shared by the callers
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := locks.Do(ctx, "rebuild:products", func(ctx context.Context) error {
				if !fresh.Load() {
					fmt.Println("rebuilding the cache")
					fresh.Store(true)
				}
				return nil
			})
			if err != nil {
				fmt.Println("err:", err)
			}
		}()
	}
	wg.Wait()
	// Output:
	// rebuilding the cache
}

func ExampleLock_Done() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	l, err := locks.TryLock(ctx, "leader", dlock.WithTTL(time.Minute), dlock.WithRefreshInterval(20*time.Millisecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	// An operator frees the lock; the holder hears of it at its next refresh.
	_, _ = locks.ForceRelease(ctx, "leader")
	<-l.Done()
	fmt.Println("lost:", errors.Is(l.Err(), dlock.ErrLost))
	// Output: lost: true
}

// ExampleLock_Context runs a scheduled job on one instance of a fleet at a
// time: the instance that obtains the lock keeps it refreshed and hands the
// job a context that ends the moment the lock is known lost; the others skip
// the run. (TryDo does the same in one call.)
func ExampleLock_Context() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	// Refreshed every third of the TTL: a loss is known within that.
	opts := []dlock.Option{dlock.WithTTL(time.Second), dlock.WithAutoRefresh()}
	l, err := locks.TryLock(ctx, "cron:reindex", opts...)
	if err != nil {
		fmt.Println(err) // ErrNotObtained: another instance runs it
		return
	}
	defer l.Release(ctx)

	_, err = locks.TryLock(ctx, "cron:reindex", opts...) // another instance's tick
	fmt.Println("second instance skips:", errors.Is(err, dlock.ErrNotObtained))

	job := func(ctx context.Context) error {
		// An operator frees the lock while the job runs...
		_, _ = locks.ForceRelease(context.Background(), "cron:reindex")
		<-ctx.Done() // ...and the job's context ends at the next refresh.
		return context.Cause(ctx)
	}
	err = job(l.Context(ctx))
	fmt.Println("job stopped, lock lost:", errors.Is(err, dlock.ErrLost))
	// Output:
	// second instance skips: true
	// job stopped, lock lost: true
}

func ExampleClient_SetFenced() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	old, err := locks.TryLock(ctx, "report", dlock.WithTTL(200*time.Millisecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	<-old.Done() // the holder stalls past its TTL...
	cur, _ := locks.Lock(ctx, "report")
	defer cur.Release(ctx)

	// ...and a newer holder writes first.
	fmt.Println(locks.SetFenced(ctx, "report:body", cur.Fence(), "new"))
	err = locks.SetFenced(ctx, "report:body", old.Fence(), "stale")
	fmt.Println(errors.Is(err, dlock.ErrStaleFence))

	// GetFenced reads it back, with the fence it was written with.
	body, fence, err := locks.GetFenced(ctx, "report:body")
	fmt.Println(body, fence == cur.Fence(), err)
	// Output:
	// <nil>
	// true
	// new true <nil>
}

func ExampleLockFromContext() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	// Do's function finds its Lock in its context: its writes carry the
	// fence, which a holder that lost the lock could not pass off as new.
	err := locks.Do(ctx, "report", func(ctx context.Context) error {
		l := dlock.LockFromContext(ctx)
		fmt.Println("fenced:", l.Fence() > 0)
		return locks.SetFenced(ctx, "report:body", l.Fence(), "new")
	})
	fmt.Println("err:", err, "outside Do:", dlock.LockFromContext(ctx) == nil)
	// Output:
	// fenced: true
	// err: <nil> outside Do: true
}

// Example_fencedHTTP shows a service that protects a resource with fencing
// tokens: each write carries the writer's fence in a header, and the
// service refuses one older than the newest it accepted.
func Example_fencedHTTP() {
	var (
		mu     sync.Mutex
		newest uint64
	)
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fence, err := strconv.ParseUint(r.Header.Get("Fence"), 10, 64)
		if err != nil {
			http.Error(w, "missing fence", http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if fence < newest {
			http.Error(w, "stale fence", http.StatusConflict)
			return
		}
		newest = fence
		w.WriteHeader(http.StatusNoContent)
	}))
	defer svc.Close()

	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: exampleAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()

	write := func(l *dlock.Lock) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, svc.URL, nil)
		req.Header.Set("Fence", strconv.FormatUint(l.Fence(), 10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	old, err := locks.TryLock(ctx, "inventory", dlock.WithTTL(200*time.Millisecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	<-old.Done()
	cur, _ := locks.Lock(ctx, "inventory")
	defer cur.Release(ctx)
	fmt.Println("new holder:", write(cur))
	fmt.Println("old holder:", write(old))
	// Output:
	// new holder: 204
	// old holder: 409
}
