package dlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestWithReplicas(t *testing.T) {
	r := redistest.StartReplicated(t, 2, 0)
	rdb := redis.NewClient(&redis.Options{Addr: r.Primary.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()

	l, err := c.TryLock(ctx, "replicated", dlock.WithReplicas(2, time.Second), dlock.WithTTL(time.Second),
		dlock.WithRefreshInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for _, rep := range r.Replicas { // acknowledged: every replica has it now
		if rep.Do(t, "EXISTS", "dlock:{replicated}") != "1" {
			t.Errorf("replica %s lacks the lock", rep.Addr())
		}
	}
	if err := l.Refresh(ctx, time.Second); err != nil {
		t.Fatal(err)
	}

	// One replica stops: an acquire needing two acknowledgements fails, and
	// the lock it took is given back.
	r.Replicas[1].Pause(t)
	defer r.Replicas[1].Resume(t)
	_, err = c.TryLock(ctx, "unconfirmed", dlock.WithReplicas(2, 50*time.Millisecond))
	if !errors.Is(err, dlock.ErrNotReplicated) {
		t.Fatalf("err = %v, want ErrNotReplicated", err)
	}
	if tok := r.Primary.Do(t, "HGET", "dlock:{unconfirmed}", "token"); tok != "" && tok != "(nil)" {
		t.Error("an unconfirmed acquire was left behind")
	}
	// ...and the refreshes of the held lock no longer count: it runs out.
	waitDone(t, l, 5*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost", l.Err())
	}
	// One acknowledgement is still to be had.
	l1, err := c.TryLock(ctx, "one", dlock.WithReplicas(1, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_ = l1.Release(ctx)
	if _, err := c.TryLock(ctx, "bad", dlock.WithReplicas(0, time.Second)); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("WithReplicas(0): err = %v", err)
	}
}

// TestFailoverWithAndWithoutReplicas: the replica loses the primary's
// stream, locks are taken, the primary dies and Sentinel promotes
// the replica. Locks taken without WithReplicas are gone on the new primary
// (another client takes them while their holders still think they hold
// them); locks taken with it were refused at the time, so none is held
// twice.
func TestFailoverWithAndWithoutReplicas(t *testing.T) {
	r := redistest.StartReplicated(t, 1, 3)
	failover := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: r.MasterName, SentinelAddrs: r.SentinelAddrs(),
		MaxRetries: 20, MinRetryBackoff: 50 * time.Millisecond, MaxRetryBackoff: 200 * time.Millisecond})
	t.Cleanup(func() { _ = failover.Close() })
	first := dlock.New(goredis.New(failover))
	t.Cleanup(func() { _ = first.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The replica stops, and its link is cut: what the primary writes from
	// here on never reaches it.
	r.Replicas[0].Pause(t)
	r.Primary.Do(t, "CLIENT", "KILL", "TYPE", "replica")
	plain, confirmed := lockWithAndWithoutReplicas(ctx, t, first, "")
	old := r.Primary.Addr()
	r.Primary.Kill(t)
	r.Replicas[0].Resume(t)
	for deadline := time.Now().Add(30 * time.Second); r.CurrentPrimary(t) == old; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no failover within 30s")
		}
	}

	second := dlock.New(goredis.New(failover))
	t.Cleanup(func() { _ = second.Close() })
	checkLostInFailover(ctx, t, second, plain, confirmed)
}

// lockWithAndWithoutReplicas takes ten locks on names that start with
// prefix without WithReplicas, and tries ten with WithReplicas(1, 20ms),
// which the primary may refuse (ErrNotReplicated) while its replica lags.
func lockWithAndWithoutReplicas(ctx context.Context, t *testing.T, c *dlock.Client, prefix string) (plain, confirmed []*dlock.Lock) {
	t.Helper()
	for i := range 10 {
		l, err := c.TryLock(ctx, prefix+"plain:"+strconv.Itoa(i), dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		plain = append(plain, l)
		if l, err := c.TryLock(ctx, prefix+"confirmed:"+strconv.Itoa(i), dlock.WithTTL(time.Minute), dlock.WithReplicas(1, 20*time.Millisecond)); err == nil {
			confirmed = append(confirmed, l)
		} else if !errors.Is(err, dlock.ErrNotReplicated) {
			t.Fatal(err)
		}
	}
	return plain, confirmed
}

// checkLostInFailover has second, a client that starts after a failover
// that lost the unreplicated writes, try to take the locks still held: some
// taken without WithReplicas must be lost, none taken with it.
func checkLostInFailover(ctx context.Context, t *testing.T, second *dlock.Client, plain, confirmed []*dlock.Lock) {
	t.Helper()
	twice := func(locks []*dlock.Lock) int {
		n := 0
		for _, l := range locks {
			if _, err := second.TryLock(ctx, l.Name()); err == nil {
				n++
			} else if !errors.Is(err, dlock.ErrNotObtained) {
				t.Fatal(err)
			}
		}
		return n
	}
	lostPlain, lostConfirmed := twice(plain), twice(confirmed)
	t.Logf("after failover: %d of %d plain locks taken by a second client; %d confirmed locks held, %d taken twice",
		lostPlain, len(plain), len(confirmed), lostConfirmed)
	if lostPlain == 0 {
		t.Error("no plain lock was lost: the failover did not lose the unreplicated writes")
	}
	if lostConfirmed != 0 {
		t.Errorf("%d confirmed locks were taken by a second client while held", lostConfirmed)
	}
}

// TestFenceGrowsAcrossAFailoverThatLostTheLastIncrement: a fence the
// replica has, then one it never gets (its link is cut), then the primary
// dies and the replica is promoted by hand. The promoted replica's counter
// is behind, so counting alone would hand out a fence that was already
// used; the server clock in the fence keeps the next one above it.
func TestFenceGrowsAcrossAFailoverThatLostTheLastIncrement(t *testing.T) {
	r := redistest.StartReplicated(t, 1, 0)
	primary, replica := r.Primary, r.Replicas[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	takeAndRelease := func(c *dlock.Client, opts ...dlock.Option) uint64 {
		t.Helper()
		l, err := c.TryLock(ctx, "fenced", opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		return l.Fence()
	}
	first := clientOf(t, primary)
	fenceKey := first.RedisKey("fenced") + ":fence"
	counter := func(s *redistest.Server) uint64 {
		t.Helper()
		v := s.Do(t, "GET", fenceKey)
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s: GET %s = %q", s.Addr(), fenceKey, v)
		}
		return n
	}

	// F1 is acknowledged by the replica.
	f1 := takeAndRelease(first, dlock.WithReplicas(1, 5*time.Second))
	if got := counter(replica); got != f1 {
		t.Fatalf("the replica's counter is %d after an acknowledged fence %d", got, f1)
	}
	// The replica stops and its link is cut: F2 never reaches it.
	replica.Pause(t)
	primary.Do(t, "CLIENT", "KILL", "TYPE", "replica")
	f2 := takeAndRelease(first)
	if f2 <= f1 {
		t.Fatalf("F2 = %d after F1 = %d", f2, f1)
	}
	if got := counter(primary); got != f2 {
		t.Fatalf("the primary's counter is %d after F2 = %d", got, f2)
	}

	// The primary dies; the replica is resumed and promoted.
	primary.Kill(t)
	replica.Resume(t)
	replica.Do(t, "REPLICAOF", "NO", "ONE")
	if info := replica.Do(t, "INFO", "replication"); !strings.Contains(info, "role:master") {
		t.Fatalf("the replica was not promoted:\n%s", info)
	}
	// The failover lost F2's increment: the new primary's counter is
	// still at F1, and an INCR alone would answer F1+1, which is not above F2.
	if got := counter(replica); got != f1 {
		t.Fatalf("the promoted replica's counter is %d, want F1 = %d: the failover did not lose F2's increment", got, f1)
	}
	f3 := takeAndRelease(clientOf(t, replica))
	t.Logf("F1 = %d (replicated), F2 = %d (lost by the failover), counter on the promoted replica %d (INCR alone: %d), F3 = %d (F2 + %d)",
		f1, f2, f1, f1+1, f3, f3-f2)
	if f3 <= f2 {
		t.Errorf("fence went backwards across the failover: F2 = %d, then F3 = %d", f2, f3)
	}
}

// ackDriver is a Replicator on a single server: EvalWait runs the calls and
// reports as many replicas acknowledging them as the test says, without
// asking the server, or fails before sending anything while down is set.
// It counts the releases it runs.
type ackDriver struct {
	dlock.Driver
	acked    atomic.Int64
	down     atomic.Bool
	releases atomic.Int64
	timeout  atomic.Int64 // the last WAIT's timeout, a time.Duration
}

var errDown = errors.New("connection refused")

func (d *ackDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	for _, c := range calls {
		if c.Script.Name == "release" {
			d.releases.Add(1)
		}
	}
	d.Driver.Eval(ctx, calls...)
}

func (d *ackDriver) EvalWait(ctx context.Context, replicas int, timeout time.Duration, calls ...*dlock.Call) (int, error) {
	d.timeout.Store(int64(timeout))
	if d.down.Load() {
		return 0, errDown
	}
	d.Eval(ctx, calls...)
	return int(d.acked.Load()), nil
}

// TestARefusalIsNotMistakenForAnUnconfirmedWrite: when too few replicas
// acknowledge, only what the script did is in doubt. An acquire the server
// refused took nothing: TryLock returns ErrNotObtained, with no cleanup. A
// refresh that found the lock gone is a loss, not a transient error. A
// successful acquire or refresh still fails with ErrNotReplicated, and a
// call the driver could not send fails with its error.
// TestAnUnknownWaitEndsTheWaitAndGivesBackTheLock: a server (or proxy)
// that does not know WAIT refuses it after the acquire script, sent before
// it in one pipeline, took the lock: a waiting acquire ends at once, as no
// wait gives the server the command, and gives back what it took, as
// TryLock does. It took the refusal for one before anything ran, and left
// the name held, by nobody, for its TTL.
func TestAnUnknownWaitEndsTheWaitAndGivesBackTheLock(t *testing.T) {
	e := newEnv(t, redistest.WithArgs("--rename-command", "WAIT", ""))
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb)) // a Replicator
	t.Cleanup(func() { _ = c.Close() })
	// The scripts are loaded: the pipeline's EVALSHA runs (with WAIT
	// failing, the driver would not load a script it found missing).
	if l, err := c.TryLock(ctx, "load"); err != nil {
		t.Fatal(err)
	} else if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		acquire func(ctx context.Context, name string, opts ...dlock.Option) (*dlock.Lock, error)
	}{{"TryLock", c.TryLock}, {"Lock", c.Lock}} {
		t.Run(tc.name, func(t *testing.T) {
			name := "no-wait-command-" + tc.name
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			retried := false
			_, err := tc.acquire(wctx, name, dlock.WithTTL(time.Minute), dlock.WithReplicas(1, 50*time.Millisecond),
				dlock.WithOnRetry(func(int, error) { retried = true; cancel() }))
			cancel()
			if err == nil || retried || !strings.Contains(err.Error(), "unknown command") {
				t.Errorf("retried %v, err = %v; want no retry, and Redis's refusal", retried, err)
			}
			if e.locked(t, "dlock:{"+name+"}") {
				t.Errorf("the failed acquire left %q held", name)
			}
		})
	}
}

func TestARefusalIsNotMistakenForAnUnconfirmedWrite(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &ackDriver{Driver: e.newDriver(t)}
	c := dlock.New(d)
	defer c.Close()
	repl := dlock.WithReplicas(1, 10*time.Millisecond)

	if _, err := e.c.TryLock(ctx, "taken"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryLock(ctx, "taken", repl); !errors.Is(err, dlock.ErrNotObtained) || errors.Is(err, dlock.ErrNotReplicated) {
		t.Errorf("TryLock of a held lock, unacknowledged: err = %v, want ErrNotObtained", err)
	}
	if n := d.releases.Load(); n != 0 {
		t.Errorf("%d releases after an acquire that took nothing", n)
	}
	if _, err := c.TryLock(ctx, "free", repl); !errors.Is(err, dlock.ErrNotReplicated) {
		t.Errorf("TryLock of a free lock, unacknowledged: err = %v, want ErrNotReplicated", err)
	}
	d.down.Store(true)
	if _, err := c.TryLock(ctx, "free", repl); !errors.Is(err, errDown) {
		t.Errorf("TryLock through a driver that could not send: err = %v, want its error", err)
	}
	d.down.Store(false)

	d.acked.Store(1)
	l, err := c.TryLock(ctx, "gone", repl)
	if err != nil {
		t.Fatal(err)
	}
	d.acked.Store(0)
	if err := l.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotReplicated) {
		t.Errorf("Refresh of a held lock, unacknowledged: err = %v, want ErrNotReplicated", err)
	}
	e.srv.Do(t, "DEL", "dlock:{gone}")
	if err := l.Refresh(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh of a deleted lock, unacknowledged: err = %v, want ErrNotHeld", err)
	}
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost", err)
	}
}

// TestARefusalOnAServerShortOfReplicasIsNotObtained: Redis answers a WAIT
// at the first tick of its clock after its timeout (ten a second by
// default), so up to 100ms late, and twice so for an acquire sent again
// to a server that lacked the scripts (a new primary, after a failover).
// An acquire of a held name is refused all the same: the caller must learn
// that the name is held, not that its write (it made none) was not
// confirmed, as it did when the lone call left at its timeout and 100ms.
func TestARefusalOnAServerShortOfReplicasIsNotObtained(t *testing.T) {
	r, _ := replicatedKnowingTheScripts(t)
	// ContextTimeoutEnabled: the reply is read only until the call's end.
	rdb := redis.NewClient(&redis.Options{Addr: r.Primary.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	if _, err := c.TryLock(ctx, "taken"); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if i%2 == 0 {
			r.Primary.Do(t, "SCRIPT", "FLUSH")
		}
		if _, err := c.TryLock(ctx, "taken", dlock.WithReplicas(2, 20*time.Millisecond)); !errors.Is(err, dlock.ErrNotObtained) || errors.Is(err, dlock.ErrNotReplicated) {
			t.Fatalf("TryLock %d of a held name on a server short of replicas: err = %v, want ErrNotObtained", i, err)
		}
	}
}

// TestAReplicaOrAFullServerIsNotTakenForOtherData sends acquisitions that
// must write to where they cannot: a replica (READONLY) and a primary at
// its maxmemory (OOM). They fail with the server's error, which a caller
// may retry, not with ErrWrongType, which says that the name holds other
// data and stops a waiting caller for good.
func TestAReplicaOrAFullServerIsNotTakenForOtherData(t *testing.T) {
	r := redistest.StartReplicated(t, 1, 0)
	ctx := context.Background()
	primary, replica := clientOf(t, r.Primary), clientOf(t, r.Replicas[0])
	if _, err := primary.TryLock(ctx, "held", dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := primary.Semaphore("full", 1).TryAcquire(ctx, dlock.WithTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	r.Primary.Do(t, "WAIT", "1", "5000")
	check := func(what string, err error, want string) {
		t.Helper()
		if errors.Is(err, dlock.ErrWrongType) || err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want the server's %s error, not ErrWrongType", what, err, want)
		}
	}
	// Each wait gives up after its first failed attempt.
	waitOnce := func(acquire func(context.Context, ...dlock.Option) (*dlock.Lock, error)) error {
		wctx, giveUp, cancel := untilRefused(ctx)
		defer cancel()
		_, err := acquire(wctx, giveUp)
		return err
	}
	err := waitOnce(func(ctx context.Context, opts ...dlock.Option) (*dlock.Lock, error) {
		return replica.Lock(ctx, "held", opts...)
	})
	check("Lock of a held name on a replica", err, "READONLY")
	_, err = replica.Semaphore("free", 2).TryAcquire(ctx)
	check("TryAcquire of a free semaphore on a replica", err, "READONLY")
	err = waitOnce(replica.Semaphore("full", 1).Acquire)
	t.Logf("Acquire of a full semaphore on a replica: %v", err)
	check("Acquire of a full semaphore on a replica", err, "") // refused, or READONLY once it registers
	_, err = replica.RWMutex("rw").TryLock(ctx)
	check("TryLock of a free read/write lock on a replica", err, "READONLY")

	r.Primary.Do(t, "CONFIG", "SET", "maxmemory", "1")
	defer r.Primary.Do(t, "CONFIG", "SET", "maxmemory", "0")
	_, err = primary.Semaphore("oom", 2).TryAcquire(ctx)
	check("TryAcquire of a free semaphore at maxmemory", err, "OOM")
	_, err = primary.TryLock(ctx, "oom")
	check("TryLock of a free name at maxmemory", err, "OOM")
}

// clientOf returns a client of server s alone, closed with the test; its
// go-redis client does not retry, so that a failure shows at once.
func clientOf(t *testing.T, s *redistest.Server) *dlock.Client {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// stallDriver is a Replicator on a single server whose WAIT after a
// refresh does not return until stall is closed (or the call's context
// ends), as one whose replica stopped acknowledging waits out its timeout.
// It says when one is waiting (waiting), and when it ran the refresh of a
// lock without replicas (others).
type stallDriver struct {
	dlock.Driver
	stall, waiting chan struct{}
	once           sync.Once
	others         chan struct{}
}

func (d *stallDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	d.Driver.Eval(ctx, calls...)
	if calls[0].Script.Name == "refresh" {
		select {
		case d.others <- struct{}{}:
		default:
		}
	}
}

func (d *stallDriver) EvalWait(ctx context.Context, replicas int, timeout time.Duration, calls ...*dlock.Call) (int, error) {
	d.Driver.Eval(ctx, calls...)
	if calls[0].Script.Name == "refresh" {
		d.once.Do(func() { close(d.waiting) })
		select {
		case <-d.stall:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return replicas, nil
}

// A refresh confirmed on replicas (WithReplicas) whose WAIT waits out its
// timeout holds up no other lock's refresh: they went in turn on the
// watchdog's goroutine, and a lock on a healthy server, with a TTL shorter
// than that timeout, was reported lost.
func TestAReplicatedRefreshThatWaitsHoldsUpNoOtherRefresh(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &stallDriver{Driver: e.newDriver(t), stall: make(chan struct{}), waiting: make(chan struct{}), others: make(chan struct{}, 1)}
	c := dlock.New(d)
	defer c.Close()
	defer close(d.stall)
	a, err := c.TryLock(ctx, "replicated", dlock.WithTTL(10*time.Second), dlock.WithRefreshInterval(50*time.Millisecond),
		dlock.WithReplicas(1, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	<-d.waiting // a's refresh waits for its replica
	b, err := c.TryLock(ctx, "plain", dlock.WithTTL(300*time.Millisecond), dlock.WithAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	for range 5 { // five refreshes of b: more than its TTL
		select {
		case <-b.Done():
			t.Fatalf("a lock on a healthy server was lost while another's refresh waited for its replica: %v", b.Err())
		case <-d.others:
		}
	}
}

// A WAIT lasts no longer than the context of its request: the server
// answers it only at its timeout, so a TryLock with a context of 300ms and
// WithReplicas(1, 5s) waited up to 5s on a driver that does not end a read
// at its context's deadline (go-redis without ContextTimeoutEnabled).
func TestAWaitForReplicasEndsWithItsContext(t *testing.T) {
	e := newEnv(t)
	d := &ackDriver{Driver: e.newDriver(t)}
	d.acked.Store(1)
	c := dlock.New(d)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	l, err := c.TryLock(ctx, "bounded", dlock.WithReplicas(1, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	if got := time.Duration(d.timeout.Load()); got > 300*time.Millisecond || got < time.Millisecond {
		t.Errorf("WAIT's timeout %v, want the 300ms context's rest", got)
	}
	// Without a deadline, the timeout given.
	l2, err := c.TryLock(context.Background(), "unbounded", dlock.WithReplicas(1, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release(context.Background())
	if got := time.Duration(d.timeout.Load()); got != 5*time.Second {
		t.Errorf("WAIT's timeout %v without a deadline, want 5s", got)
	}
}

// TestAcquiresWaitingForReplicasLeaveConnectionsToOtherCalls: while a
// replica lags, every acquire WithReplicas waits its whole WAIT timeout on a
// connection of the Redis client's pool. As many of them as the pool has
// connections, at once, held up every other request of the client (a
// TryLock without WithReplicas, which the server answers at once, failed
// at its deadline, waiting for a connection) until the WAITs ended: now
// they go out in at most WithPipelines pipelines at once, the later ones
// coalesced under one WAIT.
func TestAcquiresWaitingForReplicasLeaveConnectionsToOtherCalls(t *testing.T) {
	r := redistest.StartReplicated(t, 1, 0)
	const pool = 2 * dlock.DefaultPipelines
	rdb := redis.NewClient(&redis.Options{Addr: r.Primary.Addr(), PoolSize: pool})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()

	resume := r.Replicas[0].PauseAWhile(t)
	var wg sync.WaitGroup
	errs := make([]error, pool)
	for i := range pool {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.TryLock(ctx, "confirmed:"+strconv.Itoa(i), dlock.WithReplicas(1, 10*time.Second))
			if err == nil {
				err = l.Release(ctx)
			}
			errs[i] = err
		}()
	}
	// The primary holds their WAITs: all of them when nothing bounds them,
	// else as many as go out at once.
	blocked := func() int { return blockedClients(t, r.Primary) }
	for deadline := time.Now().Add(5 * time.Second); blocked() < dlock.DefaultPipelines; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d WAITs blocked after 5s, want %d", blocked(), dlock.DefaultPipelines)
		}
	}
	for settle := time.Now().Add(300 * time.Millisecond); blocked() < pool && time.Now().Before(settle); {
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("%d WAITs blocked on the primary", blocked())

	// A lock without WithReplicas does not wait for them.
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	l, err := c.TryLock(pctx, "plain")
	if err == nil {
		err = l.Release(pctx)
	}
	if err != nil {
		t.Errorf("a TryLock and Release without WithReplicas failed after %v: %v", time.Since(start), err)
	}

	resume()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("confirmed:%d: %v", i, err)
		}
	}
}

// TestAcquiresQueuedForReplicasFailAtTheirTimeout: the acquires WithReplicas
// beyond WithPipelines queue for a pipeline while a replica lags (see
// TestAcquiresWaitingForReplicasLeaveConnectionsToOtherCalls); their WAIT
// has what is left of their timeout, so they fail at it, not at twice it.
func TestAcquiresQueuedForReplicasFailAtTheirTimeout(t *testing.T) {
	r, c := replicatedKnowingTheScripts(t)
	r.Replicas[0].Pause(t)
	defer r.Replicas[0].Resume(t)

	const n, timeout = 3 * dlock.DefaultPipelines, time.Second
	took := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, errs[i] = c.TryLock(context.Background(), "queued:"+strconv.Itoa(i), dlock.WithReplicas(1, timeout))
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i := range n {
		if !errors.Is(errs[i], dlock.ErrNotReplicated) {
			t.Errorf("queued:%d: err = %v, want ErrNotReplicated", i, errs[i])
		}
		if took[i] > timeout*17/10 {
			t.Errorf("queued:%d failed after %v, want about its %v timeout", i, took[i], timeout)
		}
	}
}

// TestAnAcquireQueuedForReplicasFailsAtItsOwnTimeout: acquires WithReplicas
// queued behind WithPipelines others while a replica lags go out together
// under one WAIT. One queued early fails at its own timeout, not at that of
// a later one queued with it (the WAIT counted from the latest, so the
// early one waited up to twice its timeout).
func TestAnAcquireQueuedForReplicasFailsAtItsOwnTimeout(t *testing.T) {
	r, c := replicatedKnowingTheScripts(t)
	const timeout = time.Second
	resume := r.Replicas[0].PauseAWhile(t)

	var wg sync.WaitGroup
	defer wg.Wait()
	fillReplicaLane(t, &wg, r, c, timeout)
	var early, late error
	var took time.Duration
	wg.Add(2)
	go func() { // queued at once
		defer wg.Done()
		start := time.Now()
		_, early = c.TryLock(context.Background(), "early", dlock.WithReplicas(1, timeout))
		took = time.Since(start)
	}()
	go func() { // queued near the end of the WAITs in flight
		defer wg.Done()
		time.Sleep(timeout * 8 / 10)
		_, late = c.TryLock(context.Background(), "late", dlock.WithReplicas(1, timeout))
	}()
	wg.Wait()
	if !errors.Is(early, dlock.ErrNotReplicated) {
		t.Errorf("err = %v, want ErrNotReplicated", early)
	}
	// The late one waited its timeout from when it was made, part of it
	// queued, and its error says the timeout it was given.
	if !errors.Is(late, dlock.ErrNotReplicated) || !strings.Contains(late.Error(), "acknowledged within "+timeout.String()) {
		t.Errorf("the late acquire: err = %v, want ErrNotReplicated saying its %v timeout", late, timeout)
	}
	if took > timeout*16/10 { // with the late one's, up to twice it
		t.Errorf("the early acquire failed after %v, want about its %v timeout", took, timeout)
	}
	// It gave back what it took.
	resume()
	l, err := c.TryLock(context.Background(), "early", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("the name of the acquire that failed: %v", err)
	}
	_ = l.Release(context.Background())
}

// TestARefreshQueuedForReplicasEndsAtItsOwnTimeout: a Refresh WithReplicas
// queued behind WithPipelines acquires that wait for a lagging replica
// goes out with an acquire queued after it, under one WAIT. An acquire
// leaves such a pipeline at its own timeout, but a refresh stays in its
// pipeline (see TestARefreshStaysInItsPipeline): the WAIT had what was
// left of the later acquire's timeout, and the Refresh returned after up
// to twice its own.
func TestARefreshQueuedForReplicasEndsAtItsOwnTimeout(t *testing.T) {
	r, c := replicatedKnowingTheScripts(t)
	ctx := context.Background()
	const timeout = time.Second
	l, err := c.TryLock(ctx, "refreshed", dlock.WithTTL(time.Minute), dlock.WithReplicas(1, timeout))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Minute); err != nil { // the server knows the script
		t.Fatal(err)
	}
	resume := r.Replicas[0].PauseAWhile(t)

	var wg sync.WaitGroup
	defer wg.Wait()
	fillReplicaLane(t, &wg, r, c, timeout)
	var refreshed error
	var took time.Duration
	wg.Add(2)
	go func() { // queued at once
		defer wg.Done()
		start := time.Now()
		refreshed = l.Refresh(ctx, time.Minute)
		took = time.Since(start)
	}()
	go func() { // queued near the end of the WAITs in flight
		defer wg.Done()
		time.Sleep(timeout * 8 / 10)
		_, _ = c.TryLock(ctx, "late", dlock.WithReplicas(1, timeout))
	}()
	wg.Wait()
	if !errors.Is(refreshed, dlock.ErrNotReplicated) {
		t.Errorf("err = %v, want ErrNotReplicated", refreshed)
	}
	if took > timeout*16/10 { // with the late one's, up to twice it
		t.Errorf("the Refresh returned after %v, want about its %v timeout", took, timeout)
	}
	resume()
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Errorf("a Refresh once the replica is back: %v", err)
	}
	_ = l.Release(ctx)
}

// stalledReplicator is a Replicator on a single server that, once
// stalled, answers no EvalWait until its context ends, as a primary that
// stalls, with a driver that ends a request at its context's deadline;
// entered is closed when the first such call arrives.
type stalledReplicator struct {
	dlock.Driver
	stalled atomic.Bool
	once    sync.Once
	entered chan struct{}
}

func (d *stalledReplicator) EvalWait(ctx context.Context, replicas int, timeout time.Duration, calls ...*dlock.Call) (int, error) {
	if d.stalled.Load() {
		d.once.Do(func() { close(d.entered) })
		<-ctx.Done()
		return 0, ctx.Err()
	}
	d.Driver.Eval(ctx, calls...)
	return replicas, nil
}

// TestARefreshQueuedForReplicasOnAStalledServerEndsAtItsOwnTimeout: as
// TestARefreshQueuedForReplicasEndsAtItsOwnTimeout, on a server that
// stalls: the pipeline that the Refresh goes out in, under the deadline
// of an acquire queued after it, ends at the Refresh's own.
func TestARefreshQueuedForReplicasOnAStalledServerEndsAtItsOwnTimeout(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := &stalledReplicator{Driver: e.newDriver(t), entered: make(chan struct{})}
	c := dlock.New(d, dlock.WithPipelines(1))
	defer c.Close()
	const timeout = time.Second
	l, err := c.TryLock(ctx, "refreshed", dlock.WithTTL(time.Minute), dlock.WithReplicas(1, timeout))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	d.stalled.Store(true)
	defer d.stalled.Store(false)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() { // in flight until its own timeout, and the lane's 100ms past it
		defer wg.Done()
		_, _ = c.TryLock(ctx, "first", dlock.WithReplicas(1, timeout))
	}()
	<-d.entered
	var refreshed error
	var took time.Duration
	wg.Add(2)
	go func() { // queued a while after it: it goes out as it returns
		defer wg.Done()
		time.Sleep(timeout * 3 / 10)
		start := time.Now()
		refreshed = l.Refresh(ctx, time.Minute)
		took = time.Since(start)
	}()
	go func() { // queued near its end
		defer wg.Done()
		time.Sleep(timeout * 9 / 10)
		_, _ = c.TryLock(ctx, "late", dlock.WithReplicas(1, timeout))
	}()
	wg.Wait()
	if !errors.Is(refreshed, dlock.ErrNotReplicated) || !errors.Is(refreshed, context.DeadlineExceeded) {
		t.Errorf("err = %v, want ErrNotReplicated and context.DeadlineExceeded", refreshed)
	}
	// 1.1s, its own timeout and the lane's 100ms; 1.7s with the late one's.
	if took > timeout*14/10 {
		t.Errorf("the Refresh returned after %v, want about its %v timeout", took, timeout)
	}
}

// fillReplicaLane starts, in wg, as many acquires WithReplicas(1, timeout)
// as c sends at once, and returns once r's primary holds them all in their
// WAIT (its replica paused): whatever c sends so confirmed next is queued.
func fillReplicaLane(t *testing.T, wg *sync.WaitGroup, r *redistest.Replicated, c *dlock.Client, timeout time.Duration) {
	t.Helper()
	for i := range dlock.DefaultPipelines { // in flight, waiting their whole timeout
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = c.TryLock(context.Background(), "inflight:"+strconv.Itoa(i), dlock.WithReplicas(1, timeout))
		}()
	}
	awaitCond(t, 5*time.Second, func() bool { return blockedClients(t, r.Primary) >= dlock.DefaultPipelines })
}

// blockedClients returns how many clients s holds blocked (in a WAIT,
// here).
func blockedClients(t *testing.T, s *redistest.Server) int {
	for _, line := range strings.Split(s.Do(t, "INFO", "clients"), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "blocked_clients:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// replicatedKnowingTheScripts starts a primary with a replica, and a
// client over go-redis that has taken and released a lock WithReplicas on
// it: the server knows the scripts (a first pipeline by EVALSHA is sent
// again by EVAL: see TestAFirstAcquireWithReplicasWaitsItsTimeoutOnce).
func replicatedKnowingTheScripts(t *testing.T) (*redistest.Replicated, *dlock.Client) {
	r := redistest.StartReplicated(t, 1, 0)
	rdb := redis.NewClient(&redis.Options{Addr: r.Primary.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	t.Cleanup(func() { _ = c.Close() })
	l, err := c.TryLock(context.Background(), "known", dlock.WithReplicas(1, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r, c
}

// An acquire WithReplicas whose context ends during its WAIT, on a server
// that does not know the acquire script yet (a fresh server, one restarted,
// a replica just promoted), failed with the NOSCRIPT reply of the pipeline's
// first pass: the driver sends the calls answered so again by EVAL only once
// the WAIT behind them has answered, which it never did. The error matched
// neither context.DeadlineExceeded nor ErrNotReplicated, where the same
// acquire on a server that knew the script failed with the deadline.
func TestAWaitForReplicasCutShortWhereTheScriptWasUnknownEndsWithTheDeadline(t *testing.T) {
	r := redistest.StartReplicated(t, 1, 0)
	rdb := redis.NewClient(&redis.Options{Addr: r.Primary.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(goredis.New(rdb))
	defer c.Close()
	r.Replicas[0].PauseAWhile(t) // the WAIT lasts until the context ends
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	l, err := c.TryLock(ctx, "cut-short", dlock.WithReplicas(1, 5*time.Second))
	if err == nil {
		_ = l.Release(context.Background())
		t.Fatal("TryLock WithReplicas obtained the lock while the replica was paused")
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, dlock.ErrNotReplicated) {
		t.Errorf("err = %v, want one matching context.DeadlineExceeded (or ErrNotReplicated)", err)
	}
	if strings.Contains(err.Error(), "NOSCRIPT") {
		t.Errorf("err = %v: a reply the driver acts on, not the outcome", err)
	}
}
