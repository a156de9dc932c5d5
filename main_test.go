package dlock_test

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// exampleAddr is the address of the Redis server the Example functions use.
var exampleAddr string

func TestMain(m *testing.M) { redistest.RunMain(m, &exampleAddr) }

// untilRefused returns a context and an option for a wait that gives up
// after its first failed attempt (or after 10s), rather than at a short
// deadline that a loaded machine's first round trip, with its dial, can
// outlast. After a refusal its error matches ErrNotObtained and
// context.Canceled. cancel releases the context's resources.
func untilRefused(ctx context.Context) (_ context.Context, giveUp dlock.Option, cancel context.CancelFunc) {
	ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
	return ctx, dlock.WithOnRetry(func(int, error) { cancel() }), cancel
}

// env is one test's Redis server and the clients on it.
type env struct {
	srv *redistest.Server
	drv *tapDriver
	c   *dlock.Client
}

// newEnv starts a Redis server for the test and a client on it that counts
// its round trips.
func newEnv(t testing.TB, opts ...redistest.Option) *env {
	t.Helper()
	srv := redistest.Start(t, opts...)
	e := &env{srv: srv}
	e.drv = e.newDriver(t)
	e.c = dlock.New(e.drv)
	t.Cleanup(func() { _ = e.c.Close() })
	return e
}

// newDriver returns a driver on its own go-redis client, closed with the test.
func (e *env) newDriver(t testing.TB) *tapDriver {
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	return &tapDriver{Driver: goredis.New(rdb)}
}

// newClient returns another client, as another process would have.
func (e *env) newClient(t testing.TB, opts ...dlock.ClientOption) *dlock.Client {
	c := dlock.New(e.newDriver(t), opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// exists reports whether the Redis key exists.
func (e *env) exists(t testing.TB, key string) bool {
	return e.srv.Do(t, "EXISTS", key) == "1"
}

// locked reports whether the exclusive lock whose key is key is held. A
// released lock keeps its hash for a while, with an empty token.
func (e *env) locked(t testing.TB, key string) bool {
	tok := e.srv.Do(t, "HGET", key, "token")
	return tok != "" && tok != "(nil)"
}

// tapDriver counts round trips and can make a call's reply get lost.
type tapDriver struct {
	dlock.Driver
	trips atomic.Int64

	mu        sync.Mutex
	loseNext  int    // how many of the next calls run but lose their reply
	lostWith  error  // the error they get instead: errLostReply when nil
	meanwhile func() // run once a call whose reply is lost has run
	afterNext func() // run once the next call has run, before its caller has the reply
}

func (d *tapDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	d.trips.Add(1)
	d.Driver.Eval(ctx, calls...)
	d.mu.Lock()
	meanwhile := d.afterNext
	d.afterNext = nil
	for _, c := range calls {
		if d.loseNext > 0 {
			d.loseNext--
			c.Val, c.Err = nil, cmp.Or(d.lostWith, error(errLostReply))
			meanwhile, d.meanwhile = d.meanwhile, nil
		}
	}
	d.mu.Unlock()
	if meanwhile != nil {
		meanwhile()
	}
}

func (d *tapDriver) Scan(ctx context.Context, match, typ string, fn func(string) error) error {
	return d.Driver.(dlock.Scanner).Scan(ctx, match, typ, fn)
}

func (d *tapDriver) loseReplies(n int) {
	d.mu.Lock()
	d.loseNext, d.lostWith = n, nil
	d.mu.Unlock()
}

// timeOutReplies is loseReplies, the calls timing out as on a server that
// stalled (context.DeadlineExceeded): dlock does not send those again at
// once.
func (d *tapDriver) timeOutReplies(n int) {
	d.mu.Lock()
	d.loseNext, d.lostWith = n, context.DeadlineExceeded
	d.mu.Unlock()
}

// runAfterNext runs f once the next call has run on the server, before its
// caller has the reply.
func (d *tapDriver) runAfterNext(f func()) {
	d.mu.Lock()
	d.afterNext = f
	d.mu.Unlock()
}

// loseReplyThen makes the next call's reply get lost, and runs f once that
// call has run on the server, before its caller sees the lost reply.
func (d *tapDriver) loseReplyThen(f func()) {
	d.mu.Lock()
	d.loseNext, d.meanwhile = 1, f
	d.mu.Unlock()
}

var errLostReply = &lostReply{}

type lostReply struct{}

func (*lostReply) Error() string { return "i/o timeout (reply lost)" }

// lockAndRelease takes the lock called name in the background, waiting as
// Lock does for at most limit, and releases it; the channel gets the first
// error, or nil.
func lockAndRelease(c *dlock.Client, name string, limit time.Duration, opts ...dlock.Option) <-chan error {
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		l, err := c.Lock(ctx, name, opts...)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	return got
}

// keepsNoStateByName drives the clients through many distinct names, one
// call of f for each (32 at a time), as a service that locks one name per
// order or job does, and fails the test if, once f has returned for all of
// them, a client keeps state for any: each client's maps of names,
// requests and channels are back to where they were (the request tokens
// of ended Locks, which a client remembers, stay at most EndedMax), and
// the heap in use did not grow with the number of names (compared between
// 1,000 and 10,000 names; under the race detector, which slows each lock
// down, 200 and 2,000 names, and only the maps are compared: its own
// allocations make the heap's figures meaningless).
func keepsNoStateByName(t *testing.T, prefix string, f func(name string) error, clients ...*dlock.Client) {
	t.Helper()
	n := 1000
	if raceDetector {
		n = 200
	}
	churnNames(t, prefix, 0, n, f)
	before := make([]map[string]int, len(clients))
	for i, c := range clients {
		dlock.SettleWatchdog(c)
		dlock.GivenBack(c)
		before[i] = dlock.StateSizes(c)
	}
	heapBefore := heapInUse()
	churnNames(t, prefix, n, 10*n, f)
	for i, c := range clients {
		dlock.SettleWatchdog(c)
		dlock.GivenBack(c)
		for k, v := range dlock.StateSizes(c) {
			switch {
			case k == "ended" || k == "endedAt":
				if v > dlock.EndedMax {
					t.Errorf("client %d: %s has %d entries after %d names, more than %d", i, k, v, 10*n, dlock.EndedMax)
				}
			case k == "lanes" || k == "pools":
				if v != before[i][k] {
					t.Errorf("client %d: %s has %d entries after %d names, %d after %d", i, k, v, 10*n, before[i][k], n)
				}
			case v != 0:
				t.Errorf("client %d: %s has %d entries after %d names, none expected", i, k, v, 10*n)
			}
		}
	}
	if raceDetector {
		return
	}
	// A leak of anything kept by name (a map entry, a waiter) costs well
	// over 100 bytes a name; the heap's own wobble stays far under 64.
	grew := int64(heapInUse()) - int64(heapBefore)
	t.Logf("the heap grew by %d bytes over %d more names", grew, 9*n)
	if grew > int64(9*n*64) {
		t.Errorf("the heap grew by %d bytes over %d more names (%d a name)", grew, 9*n, grew/int64(9*n))
	}
}

// churnNames calls f with the names prefix:from … prefix:to-1, 32 at a time,
// and fails the test with the first error.
func churnNames(t *testing.T, prefix string, from, to int, f func(name string) error) {
	t.Helper()
	next := make(chan int)
	var wg sync.WaitGroup
	var first atomic.Pointer[error]
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(prefix + ":" + strconv.Itoa(i)); err != nil {
					err = fmt.Errorf("%s:%d: %w", prefix, i, err)
					first.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	for i := from; i < to && first.Load() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := first.Load(); err != nil {
		t.Fatal(*err)
	}
}

// heapInUse returns the bytes of the heap's live objects after a
// collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
