package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/goredis"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/dlockio/dlock/redlock"
	"github.com/redis/go-redis/v9"
)

func TestBadInputIsRefusedBeforeAnyRoundTrip(t *testing.T) {
	drivers := make([]*countingDriver, 3)
	nodes := make([]redlock.Node, 3)
	for i := range drivers {
		drivers[i] = &countingDriver{}
		nodes[i] = redlock.Node{Addr: fmt.Sprintf("10.0.0.%d:6379", i+1), Client: dlock.New(drivers[i])}
	}
	for _, tc := range []struct {
		name  string
		nodes []redlock.Node
		opts  []redlock.LockerOption
		want  error
	}{
		{"no nodes", nil, nil, redlock.ErrNoNodes},
		{"empty nodes", []redlock.Node{}, nil, redlock.ErrNoNodes},
		{"same address twice", []redlock.Node{nodes[0], nodes[1], {Addr: nodes[0].Addr, Client: nodes[2].Client}}, nil, redlock.ErrDuplicateNode},
		{"same address in other case and spacing", []redlock.Node{nodes[0], {Addr: " " + strings.ToUpper("redis-a:6379"), Client: nodes[1].Client}, {Addr: "redis-A:6379", Client: nodes[2].Client}}, nil, redlock.ErrDuplicateNode},
		{"same client twice", []redlock.Node{nodes[0], nodes[1], {Addr: "10.0.0.9:6379", Client: nodes[0].Client}}, nil, redlock.ErrDuplicateNode},
		{"no address", []redlock.Node{nodes[0], {Client: nodes[1].Client}}, nil, redlock.ErrInvalidNode},
		{"no client", []redlock.Node{nodes[0], {Addr: "10.0.0.9:6379"}}, nil, redlock.ErrInvalidNode},
		// Its methods panic: on the Locker's goroutines, that crashed the
		// process at the first lock.
		{"a client New did not make", []redlock.Node{nodes[0], {Addr: "10.0.0.9:6379", Client: &dlock.Client{}}}, nil, redlock.ErrInvalidNode},
		{"zero node timeout", nodes, []redlock.LockerOption{redlock.WithNodeTimeout(0)}, dlock.ErrInvalidOption},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := redlock.New(tc.nodes, tc.opts...)
			if !errors.Is(err, tc.want) || !errors.Is(err, dlock.ErrInvalidArgument) {
				t.Errorf("New: err = %v, want %v (an invalid argument)", err, tc.want)
			}
			if r != nil {
				t.Error("New returned a Locker with an error")
			}
		})
	}

	r, err := redlock.New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fast, err := redlock.New(nodes, redlock.WithNodeTimeout(500*time.Microsecond))
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"nil context", func() error { _, err := r.TryLock(nil, "x"); return err }, dlock.ErrNilContext}, //nolint:staticcheck // on purpose
		{"empty name", func() error { _, err := r.TryLock(ctx, ""); return err }, dlock.ErrEmptyName},
		{"empty name, waiting", func() error { _, err := r.Lock(ctx, ""); return err }, dlock.ErrEmptyName},
		{"TTL 0", func() error { _, err := r.TryLock(ctx, "x", redlock.WithTTL(0)); return err }, dlock.ErrInvalidTTL},
		{"TTL under dlock's minimum", func() error {
			_, err := fast.TryLock(ctx, "x", redlock.WithTTL(dlock.MinTTL-time.Microsecond))
			return err
		}, dlock.ErrInvalidTTL},
		{"TTL within the node timeout", func() error {
			_, err := r.TryLock(ctx, "x", redlock.WithTTL(redlock.DefaultNodeTimeout))
			return err
		}, dlock.ErrInvalidTTL},
		{"TTL past the node timeout only by less than the drift allowance", func() error {
			_, err := r.TryLock(ctx, "x", redlock.WithTTL(redlock.DefaultNodeTimeout+time.Millisecond))
			return err
		}, dlock.ErrInvalidTTL},
		{"nil retry", func() error { _, err := r.Lock(ctx, "x", redlock.WithRetry(nil)); return err }, dlock.ErrInvalidOption},
		{"nil retry function", func() error {
			_, err := r.Lock(ctx, "x", redlock.WithRetry(dlock.RetryFunc(nil)))
			return err
		}, dlock.ErrInvalidOption},
		{"retry built from nil", func() error {
			_, err := r.TryLock(ctx, "x", redlock.WithRetry(dlock.Jitter(nil, 0.5)))
			return err
		}, dlock.ErrInvalidOption},
		{"max wait 0", func() error { _, err := r.Lock(ctx, "x", redlock.WithMaxWait(0)); return err }, dlock.ErrInvalidOption},
		{"refresh interval not before the deadline", func() error {
			// A second less 12ms for clock drift.
			_, err := r.TryLock(ctx, "x", redlock.WithTTL(time.Second), redlock.WithRefreshInterval(990*time.Millisecond))
			return err
		}, dlock.ErrInvalidOption},
		{"refresh interval under 1ms", func() error {
			_, err := r.TryLock(ctx, "x", redlock.WithRefreshInterval(time.Microsecond))
			return err
		}, dlock.ErrInvalidOption},
		{"max hold below the TTL", func() error {
			_, err := r.TryLock(ctx, "x", redlock.WithTTL(time.Second), redlock.WithMaxHold(time.Millisecond))
			return err
		}, dlock.ErrInvalidOption},
		{"Do with a nil function", func() error { return r.Do(ctx, "x", nil) }, dlock.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.want) || !errors.Is(err, dlock.ErrInvalidArgument) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
	for i, d := range drivers {
		if n := d.calls.Load(); n != 0 {
			t.Errorf("node %d was sent %d requests", i, n)
		}
	}
}

func TestObtainRefreshReleaseOnFiveNodes(t *testing.T) {
	srvs := redistest.StartMasters(t, 5)
	r := newLocker(t, srvs)
	other := newLocker(t, srvs)
	ctx := context.Background()
	if r.Quorum() != 3 || len(r.Nodes()) != 5 {
		t.Fatalf("Quorum() = %d, Nodes() = %v", r.Quorum(), r.Nodes())
	}

	ttl := 2 * time.Second
	start := time.Now()
	l, err := r.TryLock(ctx, "orders:42", redlock.WithTTL(ttl), redlock.WithMetadata("worker 7"))
	end := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if l.Name() != "orders:42" || l.Metadata() != "worker 7" || len(l.Token()) != 22 {
		t.Errorf("Key %q, Metadata %q, Token %q", l.Name(), l.Metadata(), l.Token())
	}
	if got := l.Nodes(); len(got) != 5 {
		t.Errorf("Nodes() = %v, want all 5", got)
	}
	for i, srv := range srvs {
		if got := tokenOn(t, srv, "orders:42"); got != l.Token() {
			t.Errorf("node %d holds token %q, want the lock's %q", i, got, l.Token())
		}
	}
	drift := ttl/100 + 2*time.Millisecond
	if d := l.Deadline(); d.Before(start.Add(ttl-drift)) || d.After(end.Add(ttl-drift)) {
		t.Errorf("Deadline %v after the start, want within [%v, %v]", d.Sub(start), ttl-drift, end.Sub(start)+ttl-drift)
	}
	if _, err = other.TryLock(ctx, "orders:42"); !errors.Is(err, dlock.ErrNotObtained) || errors.Is(err, redlock.ErrNoQuorum) {
		t.Errorf("TryLock of a held lock: err = %v, want ErrNotObtained and not ErrNoQuorum", err)
	}
	var ne *redlock.NodeError
	if !errors.As(err, &ne) || !errors.Is(ne, dlock.ErrNotObtained) || ne.Addr != srvs[ne.Node].Addr() {
		t.Errorf("node error = %#v, want one saying the node refused", ne)
	}
	if heldOn(t, srvs, "orders:42") != 5 {
		t.Error("a refused attempt changed the holder's keys")
	}

	refreshed := time.Now()
	if err := l.Refresh(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := l.Deadline(); d.Before(refreshed.Add(5*time.Second - 5*time.Second/100 - 2*time.Millisecond)) {
		t.Errorf("Deadline after Refresh is %v from it, want about 5s", d.Sub(refreshed))
	}
	if pttl, _ := strconv.Atoi(srvs[0].Do(t, "PTTL", "dlock:{orders:42}")); pttl < 4000 {
		t.Errorf("PTTL after Refresh(5s) = %dms", pttl)
	}

	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, time.Second)
	if l.Err() != nil {
		t.Errorf("Err after Release = %v, want nil", l.Err())
	}
	if n := heldOn(t, srvs, "orders:42"); n != 0 {
		t.Errorf("%d nodes still hold the lock after Release", n)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("second Release: err = %v, want ErrNotHeld", err)
	}
	if err := l.Refresh(ctx, time.Second); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh after Release: err = %v, want ErrNotHeld", err)
	}
	l2, err := other.TryLock(ctx, "orders:42")
	if err != nil {
		t.Fatalf("TryLock after release: %v", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMinorityOfNodesDown kills one, then two of five nodes: locks are
// still obtained, refreshed, refused to others and released.
func TestMinorityOfNodesDown(t *testing.T) {
	for _, killed := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d killed", killed), func(t *testing.T) {
			srvs := redistest.StartMasters(t, 5)
			r := newLocker(t, srvs)
			other := newLocker(t, srvs)
			ctx := context.Background()
			for _, srv := range srvs[:killed] {
				srv.Kill(t)
			}
			up := srvs[killed:]

			l, err := r.TryLock(ctx, "job", redlock.WithTTL(time.Second))
			if err != nil {
				t.Fatalf("TryLock with %d of 5 nodes down: %v", killed, err)
			}
			if got := len(l.Nodes()); got != 5-killed {
				t.Errorf("held on %d nodes, want %d", got, 5-killed)
			}
			_, err = other.TryLock(ctx, "job")
			if !errors.Is(err, dlock.ErrNotObtained) || errors.Is(err, redlock.ErrNoQuorum) {
				t.Errorf("another locker: err = %v, want ErrNotObtained (held), not ErrNoQuorum", err)
			}
			if err := l.Refresh(ctx, 2*time.Second); err != nil {
				t.Errorf("Refresh: %v", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release: %v", err)
			}
			if n := heldOn(t, up, "job"); n != 0 {
				t.Errorf("%d live nodes still hold the lock after Release", n)
			}
			if l.Err() != nil {
				t.Errorf("Err after Release = %v", l.Err())
			}
		})
	}
}

// TestAnAcquisitionsErrorSaysWhatDecidedIt: an attempt matches
// ErrNotObtained only when the nodes that refused rule out a quorum on
// their own; when they and nodes holding other data do, ErrWrongType; when
// a node that failed could have made one, ErrNoQuorum (the lock may be
// free, and the nodes are failing).
func TestAnAcquisitionsErrorSaysWhatDecidedIt(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		heldOn    []int // nodes where another holds the name
		otherData []int // nodes where the name's key holds a string
		killed    int   // the node killed, or -1
		want      error // the one of ErrNotObtained, ErrNoQuorum and ErrWrongType the error matches
	}{
		{"refused on 1, failed on 1", []int{0}, nil, 1, redlock.ErrNoQuorum},
		{"refused on 2, failed on 1", []int{0, 1}, nil, 2, dlock.ErrNotObtained},
		{"refused on 1, other data on 1", []int{0}, []int{1}, -1, dlock.ErrWrongType},
		{"other data on 2, failed on 1", nil, []int{0, 1}, 2, dlock.ErrWrongType},
		{"other data on 1, failed on 1", nil, []int{0}, 1, redlock.ErrNoQuorum},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srvs := redistest.StartMasters(t, 3)
			for _, i := range tc.heldOn {
				if _, err := newClient(t, srvs[i]).TryLock(ctx, "job", dlock.WithTTL(time.Minute)); err != nil {
					t.Fatal(err)
				}
			}
			for _, i := range tc.otherData {
				srvs[i].Do(t, "SET", "dlock:{job}", "app data")
			}
			if tc.killed >= 0 {
				srvs[tc.killed].Kill(t)
			}
			_, err := newLocker(t, srvs).TryLock(ctx, "job")
			for _, e := range []error{dlock.ErrNotObtained, redlock.ErrNoQuorum, dlock.ErrWrongType} {
				got := errors.Is(err, e)
				if e == dlock.ErrWrongType && tc.otherData != nil && !got {
					// The nodes' own errors carry it whatever decided.
					t.Errorf("err = %v; want ErrWrongType from the nodes holding other data", err)
				} else if got != (e == tc.want) && !(e == dlock.ErrWrongType && tc.otherData != nil) {
					t.Errorf("err = %v; matches %v: %v, want %v", err, e, got, e == tc.want)
				}
			}
			var se *dlock.ServerError
			if tc.killed >= 0 && !errors.As(err, &se) {
				t.Errorf("err = %v, want the killed node's *dlock.ServerError in it", err)
			}
		})
	}
}

// TestALockCutShortEndsWithTheLastAnswer: a Lock whose wait ends during an
// attempt, before enough nodes answered, says what the attempt before
// found: the lock held.
func TestALockCutShortEndsWithTheLastAnswer(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	ctx := context.Background()
	for _, srv := range srvs {
		if _, err := newClient(t, srv).TryLock(ctx, "held", dlock.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	// Each attempt takes 30ms, refused: the wait ends during one (a
	// dozen or so in; the first, with its dial, may take longer on a
	// loaded machine), and an attempt has the node timeout (250ms) to
	// spare.
	r := newSlowLocker(t, srvs, "acquire", 30*time.Millisecond, true)
	_, err := r.Lock(ctx, "held", redlock.WithRetry(dlock.ConstantBackoff(0)), redlock.WithMaxWait(500*time.Millisecond))
	if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redlock.ErrNoQuorum) {
		t.Errorf("err = %v, want ErrNotObtained (the last answer) and DeadlineExceeded, not ErrNoQuorum", err)
	}
}

// TestMajorityOfNodesDownFailsCleanly kills three of five nodes: every
// acquisition fails with ErrNoQuorum and the nodes' own errors, not
// ErrNotObtained (nobody holds the lock: code that skips its work when it
// is held must not skip silently), and leaves nothing on the two that are
// up.
func TestMajorityOfNodesDownFailsCleanly(t *testing.T) {
	srvs := redistest.StartMasters(t, 5)
	r := newLocker(t, srvs)
	ctx := context.Background()
	for _, srv := range srvs[:3] {
		srv.Kill(t)
	}
	start := time.Now()
	l, err := r.TryLock(ctx, "job")
	// TryLock returns within the node timeout (documented); the margin is
	// for a loaded machine.
	if took, limit := time.Since(start), testNodeTimeout+750*time.Millisecond; took > limit {
		t.Errorf("TryLock took %v, more than the node timeout %v and a margin", took, testNodeTimeout)
	}
	if l != nil || errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("TryLock = %v, %v; want no lock, ErrNoQuorum and not ErrNotObtained", l, err)
	}
	var failed []int
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ne *redlock.NodeError
		var se *dlock.ServerError
		if errors.As(e, &ne) {
			failed = append(failed, ne.Node)
			if !errors.As(ne, &se) {
				t.Errorf("node %d: %v, want a *dlock.ServerError", ne.Node, ne.Err)
			}
		}
	}
	if len(failed) != 3 || failed[0] != 0 || failed[1] != 1 || failed[2] != 2 {
		t.Errorf("node errors for %v, want 0, 1, 2\n%v", failed, err)
	}
	// A request still under way when the call returns gives back what it
	// gets; under load that can come a moment later.
	eventually(t, 2*time.Second, "nothing left on the live nodes", func() bool { return heldOn(t, srvs[3:], "job") == 0 })

	wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	l, err = r.Lock(wctx, "job")
	if l != nil || errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, redlock.ErrNoQuorum) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Lock = %v, %v; want no lock, ErrNoQuorum and DeadlineExceeded, not ErrNotObtained", l, err)
	}
	eventually(t, 2*time.Second, "nothing left after Lock gave up", func() bool { return heldOn(t, srvs[3:], "job") == 0 })
}

// TestMaxWaitBoundsAWaitUnderALaterDeadline: WithMaxWait ends the wait
// even when the context allows a longer one.
func TestMaxWaitBoundsAWaitUnderALaterDeadline(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs)
	ctx := context.Background()
	held, err := r.TryLock(ctx, "busy", redlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	other := newLocker(t, srvs)
	got := make(chan error, 1)
	go func() {
		_, err := other.Lock(wctx, "busy", redlock.WithMaxWait(100*time.Millisecond))
		got <- err
	}()
	select {
	case err := <-got:
		if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Lock: err = %v, want ErrNotObtained and DeadlineExceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Lock waited past its max wait")
	}
}

func TestEvenNodeCount(t *testing.T) {
	srvs := redistest.StartMasters(t, 4)
	r := newLocker(t, srvs)
	ctx := context.Background()
	if r.Quorum() != 3 {
		t.Fatalf("Quorum() = %d with 4 nodes, want 3", r.Quorum())
	}
	l, err := r.TryLock(ctx, "even")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	srvs[0].Kill(t)
	l, err = r.TryLock(ctx, "even")
	if err != nil {
		t.Fatalf("TryLock with 1 of 4 down: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	srvs[1].Kill(t)
	if _, err := r.TryLock(ctx, "even"); !errors.Is(err, redlock.ErrNoQuorum) {
		t.Errorf("TryLock with 2 of 4 down: err = %v, want ErrNoQuorum: four nodes tolerate one failure, as three do", err)
	}
}

// TestReleaseAfterAFailedAttemptLeavesNothing has three nodes held by
// another (single-instance locks on the same name): the attempt gets the
// other two, fails, and gives them back.
func TestReleaseAfterAFailedAttemptLeavesNothing(t *testing.T) {
	srvs := redistest.StartMasters(t, 5)
	r := newLocker(t, srvs)
	ctx := context.Background()
	for _, srv := range srvs[:3] {
		if _, err := newClient(t, srv).TryLock(ctx, "split", dlock.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := r.TryLock(ctx, "split")
	if !errors.Is(err, dlock.ErrNotObtained) || errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("err = %v, want ErrNotObtained, and not ErrNoQuorum: every node answered", err)
	}
	if !strings.Contains(err.Error(), "obtained on 2 of 5 nodes") {
		t.Errorf("err = %v, want it to say 2 of 5", err)
	}
	eventually(t, 2*time.Second, "the failed attempt's locks given back", func() bool { return heldOn(t, srvs[3:], "split") == 0 })
	if n := heldOn(t, srvs[:3], "split"); n != 3 {
		t.Errorf("the other holder's lock is gone from %d nodes", 3-n)
	}
}

// TestFailedAttemptReleasesOnSlowNodes: the nodes do not answer the
// releases until the test lets them, and their clients honour the context.
// A failed attempt returns all the same, and its grants are released in
// the background, which Close waits for.
func TestFailedAttemptReleasesOnSlowNodes(t *testing.T) {
	srvs := redistest.StartMasters(t, 5)
	gate, entered := make(chan struct{}), make(chan struct{}, 5)
	var gates []*gateDriver
	r := newWrappedLocker(t, srvs, func(_ int, d dlock.Driver) dlock.Driver {
		g := &gateDriver{Driver: d, script: "release", honour: true, gate: gate, entered: entered}
		gates = append(gates, g)
		return g
	})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open) // also when the test fails with the gate shut
	ctx := context.Background()
	for _, srv := range srvs[:3] {
		if _, err := newClient(t, srv).TryLock(ctx, "split", dlock.WithTTL(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan error, 1)
	go func() {
		_, err := r.TryLock(ctx, "split", redlock.WithTTL(time.Minute))
		got <- err
	}()
	var err error
	select {
	case err = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the failed TryLock did not return while the releases were held back: it waits for them")
	}
	if !errors.Is(err, dlock.ErrNotObtained) || !strings.Contains(err.Error(), "obtained on 2 of 5 nodes") {
		t.Fatalf("err = %v, want ErrNotObtained, obtained on 2 of 5", err)
	}
	for i := range 2 { // the releases of the two grants are under way, held back
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of the 2 releases were sent", i)
		}
	}
	open()
	if err := r.Close(); err != nil { // waits for the releases under way
		t.Fatal(err)
	}
	if slices.ContainsFunc(gates, func(g *gateDriver) bool { return g.ended.Load() }) {
		// The releases run on the library's clean-up timeout (2s), from
		// when they were sent: the test took longer to open the gate.
		t.Fatal("a release held back outlived its clean-up timeout: the machine stalled for seconds")
	}
	if n := heldOn(t, srvs[3:], "split"); n != 0 {
		t.Errorf("%d of the 2 nodes that granted the failed attempt still hold it after Close", n)
	}
	if n := heldOn(t, srvs[:3], "split"); n != 3 {
		t.Errorf("the other holder's lock is gone from %d nodes", 3-n)
	}
}

// TestALockKeepsOneContextOfBackground: Context called again and again
// from context.Background() or context.TODO() returns one context, which
// the lock keeps once, and which ends with the lock; a context made from a
// parent that ends is forgotten when the parent ends.
func TestALockKeepsOneContextOfBackground(t *testing.T) {
	r := newLocker(t, redistest.StartMasters(t, 3))
	l, err := r.TryLock(context.Background(), "onecontext")
	if err != nil {
		t.Fatal(err)
	}
	first := l.Context(context.Background())
	for range 1000 {
		if l.Context(context.Background()) != first || l.Context(context.TODO()) != first {
			t.Fatal("Context(Background) made another context")
		}
	}
	if n := redlock.ContextsKept(l); n != 1 {
		t.Errorf("the lock keeps %d contexts, want 1", n)
	}
	parent, cancel := context.WithCancel(context.Background())
	child := l.Context(parent)
	if n := redlock.ContextsKept(l); n != 2 {
		t.Errorf("with a child of a parent that ends, the lock keeps %d contexts, want 2", n)
	}
	cancel()
	<-child.Done()
	// AfterFunc forgets it on a goroutine of its own: no signal tells when.
	eventually(t, 10*time.Second, "the child's context forgotten", func() bool { return redlock.ContextsKept(l) == 1 })
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.Done():
	default:
		t.Fatal("the context of Background did not end with the lock")
	}
	if !errors.Is(context.Cause(first), context.Canceled) {
		t.Errorf("Cause = %v, want context.Canceled after a release", context.Cause(first))
	}
}

// TestCancelledAttemptBlamesTheContext: an attempt whose context ends
// before the node timeout says so, and blames no node for answering late,
// whether the nodes' clients honour the context or not.
func TestCancelledAttemptBlamesTheContext(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	for _, honour := range []bool{true, false} {
		t.Run(fmt.Sprintf("honour=%v", honour), func(t *testing.T) {
			r := newSlowLocker(t, srvs, "acquire", 2*testNodeTimeout, honour)
			ctx, cancel := context.WithTimeout(context.Background(), testNodeTimeout/5)
			defer cancel()
			_, err := r.TryLock(ctx, t.Name())
			if errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want the context's error, not ErrNotObtained: no node answered", err)
			}
			if errors.Is(err, redlock.ErrNodeTimeout) || errors.Is(err, redlock.ErrNoQuorum) {
				t.Errorf("err = %v: it blames the nodes, though the context ended first", err)
			}
			if !strings.Contains(err.Error(), "the caller's context ended before 3 of them answered") {
				t.Errorf("err = %v, want it to say the caller's context ended", err)
			}
			if err := r.Close(); err != nil { // waits for late grants to be given back
				t.Fatal(err)
			}
			if n := heldOn(t, srvs, t.Name()); n != 0 {
				t.Errorf("%d nodes hold the cancelled attempt's lock", n)
			}
		})
	}
}

// TestHeldLockBelowQuorum takes nodes away from a lock that is refreshed
// automatically: Done closes at the next refresh when the nodes say the
// lock is another's (its TTL of a minute is far off), and at the nodes'
// deadlines when they are unreachable.
func TestHeldLockBelowQuorum(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		take     func(t *testing.T, srvs []*redistest.Server)
		ttl      time.Duration
		deadline bool // Done closes at the deadline, not at a refresh
	}{
		{"3 nodes killed", func(t *testing.T, srvs []*redistest.Server) {
			for _, srv := range srvs[:3] {
				srv.Kill(t)
			}
		}, 1500 * time.Millisecond, true},
		{"3 nodes paused", func(t *testing.T, srvs []*redistest.Server) {
			for _, srv := range srvs[:3] {
				srv.Pause(t)
				t.Cleanup(func() { srv.Resume(t) })
			}
		}, 1500 * time.Millisecond, true},
		// Another holder's token on 3 nodes, as when the lock expired there
		// and was taken. (A deleted key would not do: a refresh takes a
		// free node again, so a round between two of the deletions could
		// keep a quorum for good.)
		{"lock taken over on 3 nodes", func(t *testing.T, srvs []*redistest.Server) {
			for _, srv := range srvs[:3] {
				srv.Do(t, "HSET", "dlock:{held}", "token", "another-holder", "req", "another-holder")
			}
		}, time.Minute, false}, // Done well within it: at a refresh
	} {
		t.Run(tc.name, func(t *testing.T) {
			srvs := redistest.StartMasters(t, 5)
			r := newLocker(t, srvs)
			ttl := tc.ttl
			l, err := r.TryLock(ctx, "held", redlock.WithTTL(ttl), redlock.WithRefreshInterval(50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			lctx := l.Context(ctx)
			first := l.Deadline()
			eventually(t, 10*time.Second, "a refresh moved the deadline", func() bool { return l.Deadline().After(first) })
			select {
			case <-l.Done():
				t.Fatalf("lost while all nodes were up: %v", l.Err())
			default:
			}
			taken := time.Now()
			tc.take(t, srvs)
			waitDone(t, l, 10*time.Second)
			took := time.Since(taken)
			t.Logf("Done closed %v after the nodes went (TTL %v, refreshed every 50ms)", took, ttl)
			err = l.Err()
			var ne *redlock.NodeError
			if !errors.Is(err, dlock.ErrLost) || !errors.As(err, &ne) || ne.Node > 2 {
				t.Errorf("Err = %v, want ErrLost with the errors of nodes 0-2", err)
			}
			if tc.deadline && took < ttl/2 {
				t.Errorf("Done closed %v after the nodes went, before their deadlines could pass", took)
			}
			<-lctx.Done()
			if !errors.Is(context.Cause(lctx), dlock.ErrLost) {
				t.Errorf("context cause = %v", context.Cause(lctx))
			}
			if d := l.Deadline(); time.Now().Before(d) {
				t.Errorf("Deadline %v is ahead after the loss", time.Until(d))
			}
			if err := l.Refresh(ctx, ttl); !errors.Is(err, dlock.ErrNotHeld) {
				t.Errorf("Refresh after the loss: err = %v, want ErrNotHeld", err)
			}
			if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
				t.Errorf("Release after the loss: err = %v, want ErrNotHeld", err)
			}
			if n := heldOn(t, srvs[3:], "held"); n != 0 {
				t.Errorf("Release left the lock on %d live nodes", n)
			}
		})
	}
}

// TestRefreshWithoutAQuorumIsNotALoss deletes the lock on two of five
// nodes and pauses a third: the refresh reaches two nodes, fewer than a
// quorum, but three still hold the lock, so it is not lost, and the error
// says so. Once the node resumes, a refresh takes the lock back on the two
// nodes that lost it.
func TestRefreshWithoutAQuorumIsNotALoss(t *testing.T) {
	srvs := redistest.StartMasters(t, 5)
	r := newLocker(t, srvs)
	ctx := context.Background()
	l, err := r.TryLock(ctx, "dented", redlock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srvs[0].Do(t, "DEL", "dlock:{dented}")
	srvs[1].Do(t, "DEL", "dlock:{dented}")
	srvs[2].Pause(t)
	err = l.Refresh(ctx, 5*time.Second)
	srvs[2].Resume(t)
	if !errors.Is(err, redlock.ErrNoQuorum) || errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Refresh: err = %v, want ErrNoQuorum and not ErrNotHeld: three nodes still hold it", err)
	}
	select {
	case <-l.Done():
		t.Fatalf("lost: %v", l.Err())
	default:
	}
	if got := l.Nodes(); len(got) != 3 {
		t.Errorf("Nodes() = %v, want the three that still hold it", got)
	}
	eventually(t, 5*time.Second, "refreshed on all five again", func() bool {
		return l.Refresh(ctx, 5*time.Second) == nil && len(l.Nodes()) == 5
	})
	for i, srv := range srvs {
		if !holds(t, srv, "dented") {
			t.Errorf("node %d does not hold the lock", i)
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestALockLostForRefreshesRefusedSaysWhy: the ACL user of two of three
// nodes loses EVALSHA while it holds a lock refreshed automatically, so
// that every refresh there is refused (NOPERM) until the lock runs out on
// them and the quorum is lost. Err says why in words, as a dlock lock's
// does when its watchdog's refreshes failed: it said only that each
// node's deadline passed without a refresh, which reads as an outage, not
// a permission to fix.
func TestALockLostForRefreshesRefusedSaysWhy(t *testing.T) {
	r, srvs := lockerAsUser(t)
	ctx := context.Background()
	l, err := r.TryLock(ctx, "revoked", redlock.WithTTL(time.Second), redlock.WithAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	revokeScripts(t, srvs[:2])
	waitDone(t, l, 5*time.Second)
	err = l.Err()
	if !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", err)
	}
	for i, srv := range srvs[:2] {
		var ne *redlock.NodeError
		found := false
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			if errors.As(e, &ne) && ne.Addr == srv.Addr() {
				found = true
				if !strings.Contains(ne.Error(), "NOPERM") {
					t.Errorf("node %d's loss: %v, want it to say that its refreshes were refused (NOPERM)", i, ne)
				}
			}
		}
		if !found {
			t.Errorf("Err = %v, want a *NodeError for node %d", err, i)
		}
	}
	_ = l.Release(ctx)
}

// TestARefreshCutShortByItsCallerDoesNotHideWhyTheLastFailed: a manual
// Refresh whose caller's context had ended fails on every node, which says
// nothing of them: the loss that follows still names the refusal that
// failed the refreshes before it (NOPERM), not the caller's cancellation.
func TestARefreshCutShortByItsCallerDoesNotHideWhyTheLastFailed(t *testing.T) {
	r, srvs := lockerAsUser(t)
	ctx := context.Background()
	l, err := r.TryLock(ctx, "revoked", redlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	revokeScripts(t, srvs[:2])
	if err := l.Refresh(ctx, time.Second); !errors.Is(err, dlock.ErrDenied) {
		t.Fatalf("Refresh: %v, want the nodes' refusal (ErrDenied)", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.Refresh(cancelled, time.Second); err == nil {
		t.Fatal("a Refresh whose context had ended succeeded")
	}
	waitDone(t, l, 5*time.Second)
	err = l.Err()
	if !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", err)
	}
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ne *redlock.NodeError
		if errors.As(e, &ne) && (ne.Addr == srvs[0].Addr() || ne.Addr == srvs[1].Addr()) && !strings.Contains(ne.Error(), "NOPERM") {
			t.Errorf("a refused node's loss: %v, want it to say NOPERM", ne)
		}
	}
	_ = l.Release(ctx)
}

// TestALockLostOnANodeKeepsWhyWhenALateRefreshFindsItGone: node 0 gets
// its refreshes late, so that its lock runs out by the local clock while
// the refresh is on its way, and the refresh, run there once the key has
// expired, finds it gone (dlock.ErrNotHeld). When nodes 1 and 2 run out
// too, the lock is lost, and Err names node 0 as one that lost it: the
// late refresh cleared the loss that the local clock had recorded there,
// so that Err named only nodes 1 and 2.
func TestALockLostOnANodeKeepsWhyWhenALateRefreshFindsItGone(t *testing.T) {
	r, srvs := lockerWithNode0Late(t, map[string]time.Duration{"refresh": 1500 * time.Millisecond})
	ctx := context.Background()
	l, err := r.TryLock(ctx, "gone", redlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// Nodes 1 and 2 hold it for 3s; node 0's refresh reaches it after its
	// lock there ran out (1s), and finds the key gone.
	if err := l.Refresh(ctx, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Second, "node 0's lock runs out here", func() bool { return !slices.Contains(l.Nodes(), srvs[0].Addr()) })
	waitDone(t, l, 6*time.Second)
	err = l.Err()
	if !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", err)
	}
	found := false
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ne *redlock.NodeError
		if errors.As(e, &ne) && ne.Addr == srvs[0].Addr() {
			found = true
		}
	}
	if !found {
		t.Errorf("Err = %v, want a *NodeError for node 0, whose lock ran out first", err)
	}
}

// TestNodeRestartedWithoutPersistenceWhileHeld restarts one of five nodes
// (it comes back empty) under a lock refreshed automatically: the lock
// stays held on the quorum, nobody else can take it, and the refresh takes
// it again on the restarted node.
func TestNodeRestartedWithoutPersistenceWhileHeld(t *testing.T) {
	srvs := redistest.StartMasters(t, 5)
	r := newLocker(t, srvs)
	other := newLocker(t, srvs)
	ctx := context.Background()
	l, err := r.TryLock(ctx, "survivor", redlock.WithTTL(time.Second), redlock.WithRefreshInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	since := srvs[0].Do(t, "HGET", "dlock:{survivor}", "since")
	srvs[0].Restart(t)
	// A refresh may have taken it again there already: with the same
	// token, but a later "since".
	if holds(t, srvs[0], "survivor") && srvs[0].Do(t, "HGET", "dlock:{survivor}", "since") == since {
		t.Fatal("the restarted node kept the lock: it should have come back empty")
	}
	if _, err := other.TryLock(ctx, "survivor"); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("another locker after the restart: err = %v, want ErrNotObtained", err)
	}
	eventually(t, 3*time.Second, "lock taken again on the restarted node", func() bool {
		return holds(t, srvs[0], "survivor") && len(l.Nodes()) == 5
	})
	select {
	case <-l.Done():
		t.Fatalf("lost: %v", l.Err())
	default:
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := heldOn(t, srvs, "survivor"); n != 0 {
		t.Errorf("%d nodes hold the lock after Release", n)
	}
}

// TestPausedNodesCostTheNodeTimeout stops nodes with SIGSTOP: go-redis
// (without ContextTimeoutEnabled) would wait for them for its read timeout
// of 3s, but an acquisition waits for each node at most the node timeout.
// The requests that were still under way finish once the nodes resume, and
// give back what they took for a failed attempt.
func TestPausedNodesCostTheNodeTimeout(t *testing.T) {
	srvs := redistest.StartMasters(t, 5)
	timeout := testNodeTimeout
	r := newLocker(t, srvs, redlock.WithNodeTimeout(timeout))
	ctx := context.Background()
	// Open a connection to every node first, as a running process has: a
	// request on an open connection waits for the reply whatever its
	// context says.
	warm, err := r.TryLock(ctx, "warm-up")
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A generous bound, far above the node timeout, against a hang.
	hctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	srvs[0].Pause(t)
	start := time.Now()
	l, err := r.TryLock(hctx, "one-paused")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("TryLock with 1 of 5 paused: %v", err)
	}
	t.Logf("TryLock with 1 of 5 nodes paused returned in %v (node timeout %v)", took, timeout)
	// It returned while node 0 cannot answer: without it, with a quorum
	// of the others, and the rest of them as their answers come (one
	// slower than the node timeout joins late).
	if got := l.Nodes(); len(got) < 3 || slices.Contains(got, srvs[0].Addr()) {
		t.Errorf("Nodes() = %v, want a quorum of the 4 nodes not paused", got)
	}
	eventually(t, 5*time.Second, "the 4 nodes not paused hold it", func() bool {
		got := l.Nodes()
		return len(got) == 4 && !slices.Contains(got, srvs[0].Addr())
	})
	t.Logf("the 4 nodes not paused held it %v after TryLock began", time.Since(start))

	srvs[1].Pause(t)
	srvs[2].Pause(t)
	start = time.Now()
	_, err = r.TryLock(hctx, "three-paused")
	if errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, redlock.ErrNoQuorum) || !errors.Is(err, redlock.ErrNodeTimeout) {
		t.Fatalf("TryLock with 3 of 5 paused: err = %v, want ErrNoQuorum and ErrNodeTimeout, not ErrNotObtained", err)
	}
	t.Logf("TryLock with 3 of 5 nodes paused failed in %v", time.Since(start))

	for _, srv := range srvs[:3] {
		srv.Resume(t)
	}
	// The late grants of the paused nodes: "one-paused" adopts node 0's,
	// "three-paused" gives back those of nodes 0-2.
	eventually(t, 5*time.Second, "late grants adopted", func() bool { return len(l.Nodes()) == 5 })
	eventually(t, 5*time.Second, "late grants of the failed attempt given back", func() bool {
		return heldOn(t, srvs, "three-paused") == 0
	})
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := heldOn(t, srvs, "one-paused"); n != 0 {
		t.Errorf("%d nodes hold the lock after Release", n)
	}
}

// TestMutualExclusionUnderContention has 8 lockers, each with clients of
// its own (as 8 processes would), take one lock 10 times each and do a
// read-modify-write under it.
func TestMutualExclusionUnderContention(t *testing.T) {
	srvs := redistest.StartMasters(t, 5)
	const lockers, rounds = 8, 10
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		inside, overlaps atomic.Int32
		retries          atomic.Int64
		counter          int // written only under the lock
		wg               sync.WaitGroup
		errs             = make(chan error, lockers)
	)
	retry := dlock.RetryFunc(func(failed int) (time.Duration, bool) {
		retries.Add(1)
		return dlock.Jitter(dlock.ConstantBackoff(20*time.Millisecond), 0.9).NextBackoff(failed)
	})
	start := time.Now()
	for range lockers {
		r := newLocker(t, srvs)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				l, err := r.Lock(ctx, "counter", redlock.WithTTL(2*time.Second), redlock.WithRetry(retry))
				if err != nil {
					errs <- err
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				v := counter
				time.Sleep(time.Millisecond)
				counter = v + 1
				inside.Add(-1)
				if err := l.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if overlaps.Load() != 0 || counter != lockers*rounds {
		t.Errorf("%d overlaps, counter %d, want 0 and %d", overlaps.Load(), counter, lockers*rounds)
	}
	t.Logf("%d lockers, %d acquisitions, %d failed attempts, %d overlaps, %v",
		lockers, lockers*rounds, retries.Load(), overlaps.Load(), time.Since(start))
}

func TestDoReleasesAfterTheFunction(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs)
	ctx := context.Background()
	want := errors.New("report failed")
	err := r.Do(ctx, "report", func(ctx context.Context) error {
		if n := heldOn(t, srvs, "report"); n != 3 {
			t.Errorf("held on %d nodes inside Do", n)
		}
		if ctx.Err() != nil {
			t.Errorf("ctx ended inside Do: %v", ctx.Err())
		}
		return want
	}, redlock.WithTTL(time.Second))
	if !errors.Is(err, want) || errors.Is(err, dlock.ErrLost) {
		t.Errorf("Do: err = %v, want the function's error alone", err)
	}
	if n := heldOn(t, srvs, "report"); n != 0 {
		t.Errorf("held on %d nodes after Do", n)
	}
}

func TestMaxHoldEndsTheRefreshing(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs)
	start := time.Now()
	l := cappedLock(t, r, "capped", 400*time.Millisecond, 50*time.Millisecond, time.Second)
	waitDone(t, l, 10*time.Second) // not refreshed forever
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("Done closed after %v, before the max hold of 1s", took)
	}
	checkMaxHoldBlamed(t, l, true)
}

// cappedLock takes name on r, refreshed every interval with the TTL ttl
// until the max hold.
func cappedLock(t *testing.T, r *redlock.Locker, name string, ttl, interval, maxHold time.Duration) *redlock.Lock {
	t.Helper()
	l, err := r.TryLock(context.Background(), name, redlock.WithTTL(ttl),
		redlock.WithRefreshInterval(interval), redlock.WithMaxHold(maxHold))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// checkMaxHoldBlamed checks that the lost lock l blames its max hold, or
// not.
func checkMaxHoldBlamed(t *testing.T, l *redlock.Lock, want bool) {
	t.Helper()
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) || errors.Is(err, dlock.ErrMaxHold) != want {
		t.Errorf("Err = %v, want ErrLost, and ErrMaxHold %v", err, want)
	}
	// A Refresh of the lost lock says why, with "dlock: " once.
	err := l.Refresh(context.Background(), time.Second)
	first, _, _ := strings.Cut(fmt.Sprint(err), "\n")
	if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) || strings.Count(first, "dlock: ") != 1 {
		t.Errorf("Refresh after the loss: %v; want ErrNotHeld and ErrLost, its first line saying \"dlock: \" once", err)
	}
	// So does a Release.
	err = l.Release(context.Background())
	if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) || errors.Is(err, dlock.ErrMaxHold) != want {
		t.Errorf("Release after the loss: %v; want ErrNotHeld, ErrLost, and ErrMaxHold %v", err, want)
	}
}

// TestAMaxHoldThatAllowsNoLastRefreshIsBlamed: the refresh due at 200ms
// renews the whole TTL (440ms of the max hold are left); at the one due at
// 400ms, 240ms are left, too little for the node timeout (250ms): no last
// refresh is sent, the lock runs out at the deadline of the one before
// (about 594ms), and the max hold is why. (Each refresh has about 190ms to
// spare before the deadline, for a loaded machine.)
func TestAMaxHoldThatAllowsNoLastRefreshIsBlamed(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs)
	l := cappedLock(t, r, "capped", 400*time.Millisecond, 200*time.Millisecond, 640*time.Millisecond)
	waitDone(t, l, 3*time.Second)
	checkMaxHoldBlamed(t, l, true)
}

// TestAnOutageAtTheLastRefreshIsNotBlamedOnTheMaxHold: the refreshes from
// 990ms on are capped by the max hold; the one due at 1000ms fails with
// every node down (they go at 900ms), and its retries, every 50ms, come to
// too little time left for another (at about 1735ms, with the node timeout
// of 250ms); the lock runs out at the deadline of the refresh before
// (about 1788ms), well before the max hold (1990ms), for the outage. A
// refresh due at 800ms that runs late, up to the kill, renews the whole
// TTL: none can be the last the max hold allows and succeed.
func TestAnOutageAtTheLastRefreshIsNotBlamedOnTheMaxHold(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs)
	start := time.Now()
	l := cappedLock(t, r, "out", time.Second, 200*time.Millisecond, 1990*time.Millisecond)
	// Between the refresh at 800ms and the last one, at 1000ms.
	time.Sleep(time.Until(start.Add(900 * time.Millisecond)))
	for _, srv := range srvs {
		srv.Kill(t)
	}
	if late := time.Since(start); late > 980*time.Millisecond {
		t.Skipf("the nodes went down at %v, after the last refresh may have run (a loaded machine)", late)
	}
	waitDone(t, l, 5*time.Second)
	checkMaxHoldBlamed(t, l, false)
}

// TestALossBeforeTheMaxHoldIsNotBlamedOnIt: the last refresh the max hold
// allows finds the lock gone from a quorum (deleted there); the loss is
// the deletion's, not the max hold's.
func TestALossBeforeTheMaxHoldIsNotBlamedOnIt(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs)
	// Refreshes at 300ms (not capped: 650ms left) and at 600ms (capped:
	// 350ms left, the last).
	l := cappedLock(t, r, "cut", 400*time.Millisecond, 300*time.Millisecond, 950*time.Millisecond)
	// The first refresh raises the key's PTTL again; delete it after that.
	pttl := func() int {
		n, err := strconv.Atoi(srvs[0].Do(t, "PTTL", "dlock:{cut}"))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	low := false
	for deadline := time.Now().Add(5 * time.Second); ; {
		if time.Now().After(deadline) {
			t.Fatal("no refresh seen")
		}
		p := pttl()
		if p < 250 {
			low = true
		} else if low && p > 300 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	srvs[0].Do(t, "DEL", "dlock:{cut}")
	srvs[1].Do(t, "DEL", "dlock:{cut}")
	waitDone(t, l, 3*time.Second)
	checkMaxHoldBlamed(t, l, false)
}

func TestCloseStopsRefreshing(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs)
	ctx := context.Background()
	l, err := r.TryLock(ctx, "closing", redlock.WithTTL(400*time.Millisecond), redlock.WithAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 2*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost at the deadline", l.Err())
	}
	if _, err := r.TryLock(ctx, "closing-2", redlock.WithAutoRefresh()); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("auto-refresh after Close: err = %v, want ErrClosed", err)
	}
	// Plain acquisitions still work, each waiting for all of its requests.
	l2, err := r.TryLock(ctx, "closing-3")
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatal(err)
	}
}

// TestRestartOfANodeInTheQuorum measures the assumption Redlock rests on:
// a node that restarts must keep its data or stay down longer than the
// TTL. Ten locks are held without refreshing on exactly a quorum (nodes
// 0-2; nodes 3 and 4 were down and come back empty), then node 2 restarts,
// and a second locker tries to take the ten locks.
func TestRestartOfANodeInTheQuorum(t *testing.T) {
	const locks = 10
	ttl := time.Second
	aof := []redistest.Option{redistest.WithArgs("--appendonly", "yes", "--appendfsync", "always")}
	for _, tc := range []struct {
		name       string
		opts       []redistest.Option
		delay      time.Duration // node 2 stays down this long
		wantDouble bool          // the second locker gets locks the first still holds
	}{
		{"no persistence, restarted at once", nil, 0, true},
		{"appendfsync always, restarted at once", aof, 0, false},
		{"no persistence, restarted after the TTL", nil, ttl + 200*time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srvs := make([]*redistest.Server, 5)
			for i := range srvs {
				srvs[i] = redistest.Start(t, tc.opts...)
			}
			first, second := newLocker(t, srvs), newLocker(t, srvs)
			ctx := context.Background()
			srvs[3].Kill(t)
			srvs[4].Kill(t)
			// Restarted at once, the locks must outlast the test's steps
			// (three restarts, a kill) on a loaded machine too; and Lock
			// retries an fsync slower than the node timeout.
			lockTTL := ttl
			if tc.delay == 0 {
				lockTTL = 10 * time.Second
			}
			held := make([]*redlock.Lock, locks)
			for i := range held {
				l, err := first.Lock(ctx, fmt.Sprint("q", i), redlock.WithTTL(lockTTL), redlock.WithMaxWait(10*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				held[i] = l
			}
			srvs[3].Restart(t)
			srvs[4].Restart(t)
			srvs[2].Kill(t)
			time.Sleep(tc.delay)
			srvs[2].Restart(t)

			double, taken := 0, 0
			for i, l := range held {
				l2, err := second.TryLock(ctx, fmt.Sprint("q", i))
				if err != nil {
					if !errors.Is(err, dlock.ErrNotObtained) {
						t.Fatal(err)
					}
					continue
				}
				taken++
				select {
				case <-l.Done():
				default:
					double++ // the first holder has not been told: two holders
				}
				_ = l2.Release(ctx)
			}
			t.Logf("%d of %d locks taken by a second locker, %d of them while the first still held them", taken, locks, double)
			if tc.wantDouble && double != locks {
				t.Errorf("%d double holders, want all %d: the hazard this test measures did not show", double, locks)
			}
			if !tc.wantDouble && double != 0 {
				t.Errorf("%d double holders, want none", double)
			}
			if tc.delay > 0 && taken != locks {
				t.Errorf("%d of %d taken after the first holder's locks ran out", taken, locks)
			}
		})
	}
}

// refreshLoser runs every call, and once on is set, loses the replies of
// refreshes that ran: their outcome is unknown to the caller.
type refreshLoser struct {
	dlock.Driver
	on atomic.Bool
}

func (d *refreshLoser) Eval(ctx context.Context, calls ...*dlock.Call) {
	d.Driver.Eval(ctx, calls...)
	if d.on.Load() {
		for _, c := range calls {
			if c.Script.Name == "refresh" {
				c.Val, c.Err = nil, errors.New("i/o timeout (reply lost)")
			}
		}
	}
}

// A refresh to a shorter TTL that answered on fewer than a quorum, the
// others having run it unseen, leaves the lock's deadline at the shorter
// TTL: by then another may take the lock on the quorum.
func TestARefreshOfUnknownOutcomeCountsOnTheShorterTTL(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	var losers []*refreshLoser
	r := newWrappedLocker(t, srvs, func(i int, d dlock.Driver) dlock.Driver {
		if i == 0 {
			return d
		}
		l := &refreshLoser{Driver: d}
		losers = append(losers, l)
		return l
	})
	ctx := context.Background()
	l, err := r.TryLock(ctx, "unsure", redlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range losers {
		d.on.Store(true)
	}
	start := time.Now()
	if err := l.Refresh(ctx, time.Second); !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("Refresh: err = %v, want ErrNoQuorum", err)
	}
	if d := l.Deadline(); d.After(start.Add(time.Second)) {
		t.Fatalf("deadline %v after a 1s refresh whose outcome is unknown on two of three nodes", d.Sub(start))
	}
	waitDone(t, l, 5*time.Second)
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost", l.Err())
	}
	// The lock runs out on the servers too, just after: another takes it.
	var other *redlock.Lock
	r2 := newLocker(t, srvs)
	eventually(t, 2*time.Second, "another Locker takes the lock", func() bool {
		other, err = r2.TryLock(ctx, "unsure")
		return err == nil
	})
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// lateCleanup is node 1's driver in TestALateCleanupOfATakeCannotFreeTheNext:
// acquires fail unsent while down; with lose, the next acquire runs but its
// reply is lost, and the clean-up release its caller then sends is held
// back, to run late.
type lateCleanup struct {
	dlock.Driver
	mu      sync.Mutex
	down    bool
	lose    bool
	holding bool
	held    []*dlock.Call
}

func (d *lateCleanup) Eval(ctx context.Context, calls ...*dlock.Call) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range calls {
		switch {
		case c.Script.Name == "acquire" && d.down:
			c.Err = errors.New("connection refused")
			return
		case c.Script.Name == "release" && len(c.Args) > 1 && c.Args[1] == "" && d.holding:
			d.held = append(d.held, &dlock.Call{Script: c.Script, Keys: c.Keys, Args: c.Args})
			c.Err = errors.New("i/o timeout (reply lost)")
			return
		}
	}
	d.Driver.Eval(ctx, calls...)
	for _, c := range calls {
		if c.Script.Name == "acquire" && d.lose {
			c.Val, c.Err = nil, errors.New("i/o timeout (reply lost)")
			d.lose, d.holding = false, true
		}
	}
}

// runHeld runs the clean-ups held back.
func (d *lateCleanup) runHeld(ctx context.Context) {
	d.mu.Lock()
	held := d.held
	d.held, d.holding = nil, false
	d.mu.Unlock()
	d.Driver.Eval(ctx, held...)
}

// A node that Refresh takes again is taken with a token of its own each
// time: the clean-up of an attempt whose reply was lost, running late, must
// not free the hold a later attempt made, which the Lock counts.
func TestALateCleanupOfATakeCannotFreeTheNext(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	var d1 *lateCleanup
	r := newWrappedLocker(t, srvs, func(i int, d dlock.Driver) dlock.Driver {
		if i != 1 {
			return d
		}
		d1 = &lateCleanup{Driver: d, down: true}
		return d1
	})
	ctx := context.Background()
	l, err := r.TryLock(ctx, "late", redlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if n := len(l.Nodes()); n != 2 {
		t.Fatalf("obtained on %d nodes, want 2", n)
	}
	d1.mu.Lock()
	d1.down, d1.lose = false, true
	d1.mu.Unlock()
	// Node 1 is taken, but the reply is lost; its clean-up is held back.
	if err := l.Refresh(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// Node 1 again, then the first attempt's clean-up, late.
	if err := l.Refresh(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	d1.runHeld(ctx)
	for _, addr := range l.Nodes() {
		for _, srv := range srvs {
			if srv.Addr() == addr && !holds(t, srv, "late") {
				t.Errorf("the Lock counts node %s, which no longer holds the lock", addr)
			}
		}
	}
}

// gateDriver holds every call of script back until its gate is opened,
// and tells entered of each one it holds. If honour is set, a call whose
// context ended meanwhile is not sent, and fails with the context's error,
// as with rueidis; otherwise the context's end is ignored, as go-redis
// does on an open connection.
type gateDriver struct {
	dlock.Driver
	script  string
	honour  bool
	gate    chan struct{}
	entered chan struct{}
	ended   atomic.Bool // a call held back found its context ended at the gate
}

func (d *gateDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if slices.ContainsFunc(calls, func(c *dlock.Call) bool { return c.Script.Name == d.script }) {
		select {
		case d.entered <- struct{}{}:
		default:
		}
		<-d.gate
	}
	if !d.honour {
		ctx = context.WithoutCancel(ctx)
	} else if err := ctx.Err(); err != nil {
		d.ended.Store(true)
		for _, c := range calls {
			c.Err = err
		}
		return
	}
	d.Driver.Eval(ctx, calls...)
}

// A Refresh whose replies come after the lock's deadline passed (the lock
// ended meanwhile) fails: it does not bring the lock back.
func TestARefreshThatComesBackAfterTheDeadlineFails(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	gate, entered := make(chan struct{}), make(chan struct{}, 3)
	r := newWrappedLocker(t, srvs, func(_ int, d dlock.Driver) dlock.Driver {
		return &gateDriver{Driver: d, script: "refresh", gate: gate, entered: entered}
	})
	ctx := context.Background()
	// Sent shortly before the deadline; held back until the lock ended,
	// and answered within the node timeout. On a machine so loaded that
	// the Refresh is not sent before the deadline, the lock is taken again.
	var l *redlock.Lock
	var got chan error
	for try := 0; ; try++ {
		var err error
		l, err = r.TryLock(ctx, "too-late", redlock.WithTTL(400*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(l.Deadline()) - 100*time.Millisecond)
		got = make(chan error, 1)
		go func() { got <- l.Refresh(ctx, 5*time.Second) }()
		select {
		case <-entered:
		case err := <-got: // it failed before it reached a node
			if try == 4 {
				t.Fatalf("the Refresh never reached a node before the lock's deadline: %v", err)
			}
			t.Logf("the Refresh came after the deadline (%v); again", err)
			_ = l.Release(ctx)
			continue
		}
		break
	}
	defer l.Release(ctx)
	waitDone(t, l, 5*time.Second)
	close(gate)
	if err := <-got; err == nil {
		t.Fatalf("Refresh returned nil after the lock ended: %v", l.Err())
	}
}

// releaseBreaker fails the releases sent while broken, unsent, as a reset
// connection would.
type releaseBreaker struct {
	dlock.Driver
	broken atomic.Bool
}

func (d *releaseBreaker) Eval(ctx context.Context, calls ...*dlock.Call) {
	if d.broken.Load() && slices.ContainsFunc(calls, func(c *dlock.Call) bool { return c.Script.Name == "release" }) {
		for _, c := range calls {
			c.Err = errors.New("connection reset by peer")
		}
		return
	}
	d.Driver.Eval(ctx, calls...)
}

// newReleaseBreakingLocker returns a Locker over srvs whose releases on
// every node but the first fail, while the function it returns is last
// called with true.
func newReleaseBreakingLocker(t *testing.T, srvs []*redistest.Server) (*redlock.Locker, func(bool)) {
	var breakers []*releaseBreaker
	r := newWrappedLocker(t, srvs, func(i int, d dlock.Driver) dlock.Driver {
		if i == 0 {
			return d
		}
		b := &releaseBreaker{Driver: d}
		breakers = append(breakers, b)
		return b
	})
	return r, func(on bool) {
		for _, b := range breakers {
			b.broken.Store(on)
		}
	}
}

// TestReleaseCountsANodeWhoseLockEndedOnlyByTheLocalClock: a node whose
// refresh ran there but whose reply was lost (a timeout) ends at its old
// deadline by the node Lock's clock while the node still holds the lock.
// Release frees it there and counts it as freed: with another node found
// empty (restarted), the nodes that held the lock, a quorum, released it,
// and Release returns nil. It reported the lock lost when a node's dlock
// Lock returned its local loss from Release. The reply is lost by a
// driver, not by pausing the node: a refresh that waited out the node
// timeout on a paused node, then a key that had to outlive the pause on
// it, left the test to a loaded machine's timing.
func TestReleaseCountsANodeWhoseLockEndedOnlyByTheLocalClock(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	loser := &refreshLoser{}
	r := lockerWithNode0(t, srvs, func(d dlock.Driver) dlock.Driver { loser.Driver = d; return loser })
	ctx := context.Background()
	l, err := r.TryLock(ctx, "stale", redlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	loser.on.Store(true)
	if err := l.Refresh(ctx, 5*time.Second); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	// Node 0's old deadline passes.
	eventually(t, 5*time.Second, "node 0's lock ends by the local clock", func() bool {
		return !slices.Contains(l.Nodes(), srvs[0].Addr())
	})
	select {
	case <-l.Done():
		t.Fatalf("lost: %v", l.Err())
	default:
	}
	if !holds(t, srvs[0], "stale") || !holds(t, srvs[1], "stale") {
		t.Fatal("nodes 0 and 1 do not hold the lock")
	}
	srvs[2].Do(t, "DEL", "dlock:{stale}") // node 2 restarted empty
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release: %v; want nil: nodes 0 and 1, a quorum, held the lock and released it", err)
	}
	if n := heldOn(t, srvs, "stale"); n != 0 {
		t.Errorf("%d nodes hold the lock after Release", n)
	}
}

// A Release that fewer than a quorum of nodes answered is of unknown
// outcome, not "not held": it says so, and a second Release retries the
// nodes that did not answer.
func TestAReleaseThatFailsOnAQuorumCanBeRetried(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r, breakRelease := newReleaseBreakingLocker(t, srvs)
	ctx := context.Background()
	l, err := r.TryLock(ctx, "retried", redlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	breakRelease(true)
	err = l.Release(ctx)
	if !errors.Is(err, redlock.ErrNoQuorum) || errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release with two nodes failing: err = %v, want ErrNoQuorum and not ErrNotHeld", err)
	}
	if n := heldOn(t, srvs, "retried"); n != 2 {
		t.Fatalf("%d nodes hold the lock, want the two that failed", n)
	}
	// Given up, not lost.
	if err := l.Err(); !errors.Is(err, redlock.ErrNoQuorum) || errors.Is(err, dlock.ErrLost) {
		t.Errorf("Err after the failed Release = %v, want ErrNoQuorum and not ErrLost", err)
	}
	breakRelease(false)
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release again: %v", err)
	}
	if err := l.Err(); err != nil {
		t.Errorf("Err after a Release that reached a quorum = %v, want nil", err)
	}
	if n := heldOn(t, srvs, "retried"); n != 0 {
		t.Errorf("%d nodes hold the lock after the second Release", n)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("a third Release: err = %v, want ErrNotHeld", err)
	}
}

// A Release that one node answers "not held" and too few others answer is
// still of unknown outcome: its error matches ErrNoQuorum, not
// dlock.ErrNotHeld, and Release again finishes it.
func TestAReleaseOfUnknownOutcomeDoesNotSayNotHeld(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r, breakRelease := newReleaseBreakingLocker(t, srvs)
	ctx := context.Background()
	l, err := r.TryLock(ctx, "gone-on-one", redlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	srvs[0].Do(t, "DEL", "dlock:{gone-on-one}") // restarted without it, say
	breakRelease(true)
	err = l.Release(ctx)
	if !errors.Is(err, redlock.ErrNoQuorum) || errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release: err = %v, want ErrNoQuorum and not ErrNotHeld", err)
	}
	if err := l.Err(); errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Err = %v, want it not to match ErrNotHeld", err)
	}
	breakRelease(false)
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release again: %v", err)
	}
	if n := heldOn(t, srvs, "gone-on-one"); n != 0 {
		t.Errorf("%d nodes hold the lock after the second Release", n)
	}
}

// A Release that missed the quorum, followed by one that finds the lock
// gone from the nodes it missed (it expired there), leaves Err with the
// second Release's error: nothing is left to retry.
func TestAFailedReleaseThenExpiryEndsWithNothingToRetry(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r, breakRelease := newReleaseBreakingLocker(t, srvs)
	ctx := context.Background()
	l, err := r.TryLock(ctx, "expired-after", redlock.WithTTL(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	breakRelease(true)
	if err := l.Release(ctx); !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("Release with two nodes failing: err = %v, want ErrNoQuorum", err)
	}
	eventually(t, 5*time.Second, "the lock expired on the nodes that failed", func() bool { return heldOn(t, srvs, "expired-after") == 0 })
	breakRelease(false)
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release again: err = %v, want ErrNotHeld", err)
	}
	if err := l.Err(); !errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, redlock.ErrNoQuorum) || errors.Is(err, dlock.ErrLost) {
		t.Errorf("Err = %v, want the second Release's ErrNotHeld", err)
	}
}

// Releases that come back after the node timeout, having succeeded, count
// for the next Release: it returns nil, not "not held".
func TestALateReleaseCountsForTheNextRelease(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newWrappedLocker(t, srvs, func(i int, d dlock.Driver) dlock.Driver {
		if i == 0 {
			return d
		}
		return &slowDriver{Driver: d, script: "release", delay: 2 * testNodeTimeout}
	})
	ctx := context.Background()
	l, err := r.TryLock(ctx, "late-release", redlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("Release with two slow nodes: err = %v, want ErrNoQuorum", err)
	}
	eventually(t, 5*time.Second, "the slow releases ran", func() bool { return heldOn(t, srvs, "late-release") == 0 })
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release again, once the slow releases succeeded: %v", err)
	}
}

// TestALockPastItsDeadlineEndsWhenLookedAt: a holder that looks at the
// lock once its deadline has passed (a process that was paused, say)
// finds it ended, before the timers of its nodes have run, and Deadline
// does not move past the deadline it had.
func TestALockPastItsDeadlineEndsWhenLookedAt(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs, redlock.WithNodeTimeout(50*time.Millisecond))
	ctx := context.Background()
	for i := range 5 {
		l, err := r.TryLock(ctx, fmt.Sprintf("looked-at-%d", i), redlock.WithTTL(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		d := l.Deadline()
		for time.Now().Before(d) {
			time.Sleep(time.Until(d))
		}
		if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("try %d: Err past the deadline = %v, want ErrLost", i, err)
		}
		select {
		case <-l.Done():
		default:
			t.Fatalf("try %d: Done open past the deadline", i)
		}
		if got := l.Deadline(); got.After(d) {
			t.Errorf("try %d: Deadline moved from %v to %v when the lock ended", i, d, got)
		}
	}
}

// TestARefreshShorterThanTheAutoRefreshIntervalIsRefused: the automatic
// refresh goes on with a manual Refresh's TTL, so one that would run out
// before the next automatic refresh is refused, as a dlock lock does.
func TestARefreshShorterThanTheAutoRefreshIntervalIsRefused(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs)
	ctx := context.Background()
	l, err := r.TryLock(ctx, "short-refresh", redlock.WithTTL(3*time.Second), redlock.WithAutoRefresh(), redlock.WithRefreshInterval(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if err := l.Refresh(ctx, 600*time.Millisecond); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Errorf("Refresh(600ms) under a 1s auto-refresh: err = %v, want ErrInvalidTTL", err)
	}
	for _, ttl := range []time.Duration{redlock.DefaultNodeTimeout, dlock.MinTTL - 1} {
		if err := l.Refresh(ctx, ttl); !errors.Is(err, dlock.ErrInvalidTTL) {
			t.Errorf("Refresh(%v): err = %v, want ErrInvalidTTL", ttl, err)
		}
	}
	if err := l.Refresh(ctx, 2*time.Second); err != nil {
		t.Errorf("Refresh(2s) under a 1s auto-refresh: %v", err)
	}
	if err := l.Err(); err != nil {
		t.Errorf("lock ended: %v", err)
	}
	// Once the locker is closed nothing refreshes the lock: a short TTL is
	// the caller's to give, and a released lock says so first.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, 600*time.Millisecond); err != nil {
		t.Errorf("Refresh(600ms) after Close: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, 600*time.Millisecond); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh(600ms) after Release: err = %v, want ErrNotHeld", err)
	}
}

// TestAutoRefreshCountsFromTheRoundsStart: with a node paused, every round
// waits the node timeout for it; the next automatic refresh is due an
// interval after the round started, as the nodes count their deadlines
// from then, so the lock outlives a round that ran slow.
func TestAutoRefreshCountsFromTheRoundsStart(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	// Interval + node timeout > TTL less drift (988ms).
	r := newLocker(t, srvs, redlock.WithNodeTimeout(400*time.Millisecond))
	ctx := context.Background()
	warm, err := r.TryLock(ctx, "warm-up") // open a connection to every node
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	srvs[2].Pause(t)
	l, err := r.TryLock(ctx, "slow-rounds", redlock.WithTTL(time.Second), redlock.WithAutoRefresh(), redlock.WithRefreshInterval(650*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// Three deadlines' worth: the lock must still be held.
	select {
	case <-l.Done():
		t.Errorf("lost with 2 of 3 nodes up: %v", l.Err())
	case <-time.After(3 * time.Second):
	}
	srvs[2].Resume(t)
	if err := l.Release(ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		t.Error(err)
	}
}

// TestAnEndHookMayLookAtTheLock: a node client's End hook runs when the
// node's lock ends, and may call the Redlock lock (Nodes, Err) then.
func TestAnEndHookMayLookAtTheLock(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	var cur atomic.Pointer[redlock.Lock]
	var ended atomic.Int32
	r := newLockerOf(t, srvs, func(_ int, d dlock.Driver) *dlock.Client {
		return dlock.New(d, dlock.WithHooks(dlock.Hooks{End: func(dlock.HookInfo, time.Duration, error) {
			if l := cur.Load(); l != nil {
				_, _ = l.Nodes(), l.Err()
			}
			ended.Add(1)
		}}))
	})
	l, err := r.TryLock(context.Background(), "hooked", redlock.WithTTL(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cur.Store(l)
	defer cur.Store(nil)
	eventually(t, 5*time.Second, "every node's End hook returned", func() bool { return ended.Load() == 3 })
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Err = %v, want ErrLost", err)
	}
}

// TestANodeHookPanicIsLogged: the Locker calls its node clients on
// goroutines of its own, where nobody could recover a panic of their
// hooks: every hook's panic is logged through the node client's logger,
// and the node's lock goes on as if the hook had returned.
func TestANodeHookPanicIsLogged(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	var logs redistest.Buffer
	boom := func() { panic("boom") }
	r := newLockerOf(t, srvs, func(_ int, d dlock.Driver) *dlock.Client {
		return dlock.New(d, dlock.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), dlock.WithHooks(dlock.Hooks{
			AcquireStart: func(context.Context, dlock.HookInfo) context.Context { boom(); return nil },
			AcquireDone:  func(context.Context, dlock.HookInfo, dlock.AcquireResult) { boom() },
			Refresh:      func(context.Context, dlock.HookInfo, error) { boom() },
			ReleaseStart: func(context.Context, dlock.HookInfo) context.Context { boom(); return nil },
			ReleaseDone:  func(context.Context, dlock.HookInfo, time.Duration, error) { boom() },
			End:          func(dlock.HookInfo, time.Duration, error) { boom() },
		}))
	})
	ctx := context.Background()
	l, err := r.TryLock(ctx, "boom", redlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, hook := range []string{"AcquireStart", "AcquireDone", "Refresh", "ReleaseStart", "ReleaseDone", "End"} {
		if want := "hook=" + hook + " panic=boom"; strings.Count(logs.String(), want) != len(srvs) {
			t.Errorf("the log has %d records with %q, want one a node:\n%s", strings.Count(logs.String(), want), want, logs.String())
		}
	}
	if _, err := r.TryLock(ctx, "boom"); err != nil {
		t.Errorf("TryLock after the release: %v", err)
	}
}

// TestLockStopsAtClose: a Lock with WithAutoRefresh that is waiting when
// the Locker closes stops with ErrClosed at its next attempt, instead of
// taking and giving back the lock until its wait ends.
func TestLockStopsAtClose(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs)
	other := newLocker(t, srvs)
	ctx := context.Background()
	h, err := other.TryLock(ctx, "closing", redlock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	retry, refused := retryAfterRefusal()
	got := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := r.Lock(lctx, "closing", redlock.WithAutoRefresh(), redlock.WithRetry(retry))
		got <- err
	}()
	<-refused
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-got
	if !errors.Is(err, dlock.ErrClosed) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Lock across Close: err = %v, want ErrClosed, not the end of its wait", err)
	}
	if n := heldOn(t, srvs, "closing"); n != 0 {
		t.Errorf("%d nodes hold the lock", n)
	}
}

// lostRefreshReply is a driver that runs the refresh script, and then,
// while armed, reports its reply lost: the outcome is unknown to the
// client.
type lostRefreshReply struct {
	dlock.Driver
	armed *atomic.Bool
}

func (d lostRefreshReply) Eval(ctx context.Context, calls ...*dlock.Call) {
	d.Driver.Eval(ctx, calls...)
	if d.armed.Load() && len(calls) == 1 && calls[0].Script.Name == "refresh" {
		calls[0].Err = errors.New("reply lost")
	}
}

// TestTheClockCheckFollowsAShorterRefreshOfUnknownOutcome: a refresh to a
// shorter TTL whose outcome is unknown on a quorum of nodes moves their
// deadlines earlier; the deadline the clock check trusts follows, so a
// holder paused past it finds the lock ended when it looks.
func TestTheClockCheckFollowsAShorterRefreshOfUnknownOutcome(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	var armed atomic.Bool
	r := newWrappedLocker(t, srvs, func(i int, d dlock.Driver) dlock.Driver {
		if i == 2 {
			return d
		}
		return lostRefreshReply{d, &armed}
	})
	ctx := context.Background()
	l, err := r.TryLock(ctx, "shorter", redlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	armed.Store(true)
	err = l.Refresh(ctx, time.Second)
	armed.Store(false)
	if err == nil {
		t.Fatal("Refresh with 2 of 3 replies lost succeeded")
	}
	if due, dl := redlock.DueOf(l), l.Deadline(); due.After(dl) {
		t.Errorf("the clock check trusts %v, past the deadline %v", due, dl)
	}
}

// TestALossFoundByReleaseSaysDlockOnce: a Release that finds the lock gone
// on every node ends it as lost, with a first line that says "dlock: "
// once, and its error says the loss too (it matched ErrNotHeld only).
func TestALossFoundByReleaseSaysDlockOnce(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	ctx := context.Background()
	l, err := newLocker(t, srvs).TryLock(ctx, "gone", redlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, srv := range srvs {
		srv.Do(t, "DEL", "dlock:{gone}")
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Release: %v, want ErrNotHeld and ErrLost", err)
	}
	err = l.Err()
	first, _, _ := strings.Cut(fmt.Sprint(err), "\n")
	if !errors.Is(err, dlock.ErrLost) || !errors.Is(err, dlock.ErrNotHeld) || !strings.HasPrefix(first, "dlock: lock lost: not held: ") || strings.Count(first, "dlock: ") != 1 {
		t.Errorf("Err = %v; want ErrLost and ErrNotHeld, its first line saying \"dlock: \" once", err)
	}
}

// A Release of a lock lost before it (its deadline passed without a
// refresh) reports the loss, whether its nodes still held it (their TTL
// outlasted the local deadline: the release frees them all the same) or
// had let it go; and a second Release says so again. It returned nil in
// the first case and ErrNotHeld without ErrLost in the second.
func TestAReleaseOfALockLostBeforeReportsTheLoss(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs)
	ctx := context.Background()
	for _, stillHeld := range []bool{true, false} {
		t.Run(fmt.Sprintf("still held %v", stillHeld), func(t *testing.T) {
			name := fmt.Sprintf("lost-%v", stillHeld)
			l, err := r.TryLock(ctx, name, redlock.WithTTL(300*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			if stillHeld {
				for _, srv := range srvs {
					srv.Do(t, "PEXPIRE", "dlock:{"+name+"}", "60000") // a slower clock there, say
				}
			}
			waitDone(t, l, 5*time.Second)
			if !stillHeld {
				eventually(t, 5*time.Second, "the lock expired on the nodes", func() bool { return heldOn(t, srvs, name) == 0 })
			}
			for _, call := range []string{"Release", "Release again"} {
				err := l.Release(ctx)
				first, _, _ := strings.Cut(fmt.Sprint(err), "\n")
				if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) || strings.Count(first, "dlock: ") != 1 {
					t.Errorf("%s: %v; want ErrNotHeld and ErrLost, its first line saying \"dlock: \" once", call, err)
				}
			}
			if n := heldOn(t, srvs, name); n != 0 {
				t.Errorf("%d nodes hold the lock after Release", n)
			}
			if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
				t.Errorf("Err = %v, want the loss", err)
			}
		})
	}
}

// A Release called just past the lock's deadline, before anything has
// seen it pass (the nodes' ends are still being told to their hooks),
// reports the loss, as one called after Err does: it returned nil, the
// nodes still holding the lock.
func TestAReleaseJustPastTheDeadlineReportsTheLoss(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLockerOf(t, srvs, func(_ int, d dlock.Driver) *dlock.Client {
		return dlock.New(d, dlock.WithHooks(dlock.Hooks{End: func(dlock.HookInfo, time.Duration, error) {
			time.Sleep(300 * time.Millisecond) // the node's end is told late
		}}))
	})
	ctx := context.Background()
	l, err := r.TryLock(ctx, "just-past", redlock.WithTTL(400*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for _, srv := range srvs {
		srv.Do(t, "PEXPIRE", "dlock:{just-past}", "60000") // a slower clock there, say
	}
	time.Sleep(time.Until(l.Deadline()) + 5*time.Millisecond)
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Release past the deadline: %v; want the loss", err)
	}
	if n := heldOn(t, srvs, "just-past"); n != 0 {
		t.Errorf("%d nodes hold the lock after Release", n)
	}
}

// A Release of a lock lost before it joins a *NodeError for each node that
// did not release it then: one that had let it go, one that did not
// answer in time (ErrNodeTimeout). It had none.
func TestAReleaseOfALostLockSaysWhichNodesDidNotRelease(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := lockerWithNode0(t, srvs, func(d dlock.Driver) dlock.Driver {
		return &slowDriver{Driver: d, script: "release", delay: 4 * testNodeTimeout, honour: true}
	})
	ctx := context.Background()
	l, err := r.TryLock(ctx, "which-nodes", redlock.WithTTL(400*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	srvs[0].Do(t, "PEXPIRE", "dlock:{which-nodes}", "60000")
	waitDone(t, l, 5*time.Second)
	eventually(t, 5*time.Second, "the lock expired on nodes 1 and 2", func() bool { return heldOn(t, srvs, "which-nodes") == 1 })
	err = l.Release(ctx)
	var ne *redlock.NodeError
	if !errors.Is(err, dlock.ErrLost) || !errors.As(err, &ne) || !errors.Is(err, redlock.ErrNodeTimeout) {
		t.Errorf("Release: %v; want the loss, with a *NodeError for each node, node 0's matching ErrNodeTimeout", err)
	}
}

// A node whose request ends at the node timeout with the driver's own
// context error (a client that honours its context) says so as a node that
// did not answer in time does: both match ErrNodeTimeout, in an acquisition
// and in a release.
func TestANodeTimeoutMatchesErrNodeTimeoutHoweverItEnds(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	ctx := context.Background()
	for _, script := range []string{"acquire", "release"} {
		for _, honour := range []bool{false, true} {
			r := newWrappedLocker(t, srvs, func(i int, d dlock.Driver) dlock.Driver {
				if i == 0 {
					return d
				}
				return &slowDriver{Driver: d, script: script, delay: 10 * testNodeTimeout, honour: honour}
			})
			name := fmt.Sprintf("slow-%s-%v", script, honour)
			var err error
			if script == "acquire" {
				_, err = r.TryLock(ctx, name)
			} else {
				l, lerr := r.TryLock(ctx, name)
				if lerr != nil {
					t.Fatal(lerr)
				}
				err = l.Release(ctx)
			}
			if !errors.Is(err, redlock.ErrNoQuorum) {
				t.Fatalf("%s, honour %v: err = %v, want ErrNoQuorum", script, honour, err)
			}
			var timedOut []int
			for _, ne := range nodeErrors(err) {
				if errors.Is(ne, redlock.ErrNodeTimeout) {
					timedOut = append(timedOut, ne.Node)
				}
			}
			slices.Sort(timedOut)
			if !slices.Equal(timedOut, []int{1, 2}) {
				t.Errorf("%s, honour %v: nodes timed out %v, want [1 2]: %v", script, honour, timedOut, err)
			}
		}
	}
}

// nodeErrors returns every *NodeError in the tree of err.
func nodeErrors(err error) []*redlock.NodeError {
	if ne, ok := err.(*redlock.NodeError); ok {
		return []*redlock.NodeError{ne}
	}
	var out []*redlock.NodeError
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			out = append(out, nodeErrors(e)...)
		}
	case interface{ Unwrap() error }:
		out = nodeErrors(u.Unwrap())
	}
	return out
}

// Nodes that stop answering (SIGSTOP), reached by go-redis with
// ContextTimeoutEnabled, fail at the node timeout with go-redis's own "i/o
// timeout", often before the context says it ended: their errors match
// ErrNodeTimeout all the same, in acquisitions and in releases.
func TestAGoRedisReadTimeoutIsANodeTimeout(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	nodes := make([]redlock.Node, len(srvs))
	for i, srv := range srvs {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		c := dlock.New(goredis.New(rdb))
		t.Cleanup(func() { _ = c.Close() })
		nodes[i] = redlock.Node{Addr: srv.Addr(), Client: c}
	}
	rl, err := redlock.New(nodes, redlock.WithNodeTimeout(testNodeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rl.Close() })
	ctx := context.Background()
	var held []*redlock.Lock
	for i := range 8 {
		l, err := rl.TryLock(ctx, fmt.Sprintf("read-timeout-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	srvs[1].Pause(t)
	srvs[2].Pause(t)
	defer srvs[2].Resume(t)
	defer srvs[1].Resume(t)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, redlock.ErrNoQuorum) {
			t.Fatalf("%s: err = %v, want ErrNoQuorum", what, err)
		}
		for _, ne := range nodeErrors(err) {
			if (ne.Node == 1 || ne.Node == 2) && !errors.Is(ne, redlock.ErrNodeTimeout) {
				t.Errorf("%s: node %d: %v, want ErrNodeTimeout", what, ne.Node, ne.Err)
			}
		}
	}
	for _, l := range held {
		check("Release", l.Release(ctx))
	}
	for i := range 4 {
		_, err := rl.TryLock(ctx, fmt.Sprintf("read-timeout-new-%d", i))
		check("TryLock", err)
	}
}

// The lock is gone from a quorum of its nodes before its holder releases
// it, and the release on the last node fails: no Release can reach a
// quorum now, so Release does not offer a retry, and the lock ends as lost
// (Err matches dlock.ErrLost), as it does when no node fails.
func TestAReleaseThatNoRetryCanCompleteEndsTheLockAsLost(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	ctx := context.Background()
	for _, failing := range []bool{false, true} {
		last := &releaseBreaker{}
		r := newWrappedLocker(t, srvs, func(i int, d dlock.Driver) dlock.Driver {
			if i != 2 {
				return d
			}
			last.Driver = d
			return last
		})
		name := fmt.Sprintf("gone-%v", failing)
		l, err := r.TryLock(ctx, name, redlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		// Gone from nodes 0 and 1, a quorum; with failing, the release on
		// node 2, which still holds it, fails.
		srvs[0].Do(t, "DEL", "dlock:{"+name+"}")
		srvs[1].Do(t, "DEL", "dlock:{"+name+"}")
		last.broken.Store(failing)
		err = l.Release(ctx)
		last.broken.Store(false)
		if errors.Is(err, redlock.ErrNoQuorum) || !errors.Is(err, dlock.ErrNotHeld) {
			t.Errorf("failing %v: Release = %v, want ErrNotHeld, not ErrNoQuorum (no retry can reach a quorum)", failing, err)
		}
		if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
			t.Errorf("failing %v: Err = %v, want ErrLost", failing, err)
		}
	}
}

// TestANodeWhoseClientClosedIsANodeThatFails: a node whose dlock Client
// was closed refuses every acquire (ErrClosed), as a node that is down
// fails them: a Lock waits on, and obtains the lock on the quorum of the
// others once its holder lets it go. With more such nodes than the quorum
// can spare, no wait helps: Lock ends at once with ErrClosed.
func TestANodeWhoseClientClosedIsANodeThatFails(t *testing.T) {
	t.Run("a quorum closed", func(t *testing.T) {
		r, nodes := newLockerNodes(t, redistest.StartMasters(t, 3))
		for _, n := range nodes[:2] {
			if err := n.Client.Close(); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		retried := false
		_, err := r.Lock(ctx, "quorum-closed", redlock.WithRetry(dlock.RetryFunc(func(int) (time.Duration, bool) {
			retried = true
			cancel() // the wait would go on
			return time.Millisecond, true
		})))
		if retried || !errors.Is(err, dlock.ErrClosed) || errors.Is(err, context.Canceled) {
			t.Errorf("Lock with 2 of 3 node Clients closed: retried %v, err = %v; want ErrClosed at once", retried, err)
		}
	})

	srvs := redistest.StartMasters(t, 3)
	r, nodes := newLockerNodes(t, srvs)
	ctx := context.Background()
	h, err := newLocker(t, srvs).TryLock(ctx, "closed-node", redlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := nodes[0].Client.Close(); err != nil {
		t.Fatal(err)
	}
	retry, refused := retryAfterRefusal()
	got := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		l, err := r.Lock(lctx, "closed-node", redlock.WithRetry(retry))
		if err == nil {
			if n := len(l.Nodes()); n != 2 {
				err = fmt.Errorf("held on %d nodes, want the 2 whose Clients are open", n)
			}
			_ = l.Release(ctx)
		}
		got <- err
	}()
	select {
	case <-refused:
	case err := <-got:
		t.Fatalf("Lock with a node's Client closed ended before the holder let go: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Errorf("Lock with a node's Client closed: %v", err)
	}
}

// While a Release runs (here two of three nodes hold their releases back,
// for up to the node timeout), Deadline is when it began: not the zero
// time of a lock fewer than a quorum still hold, and never later once Done
// is closed.
func TestDeadlineWhileReleasing(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	gate, entered := make(chan struct{}), make(chan struct{}, 3)
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open)
	r := newWrappedLocker(t, srvs, func(i int, d dlock.Driver) dlock.Driver {
		if i == 0 {
			return d
		}
		return &gateDriver{Driver: d, script: "release", gate: gate, entered: entered}
	})
	ctx := context.Background()
	l, err := r.TryLock(ctx, "releasing", redlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	released := make(chan error, 1)
	go func() { released <- l.Release(ctx) }()
	for range 2 {
		<-entered
	}
	d := l.Deadline()
	if d.IsZero() || d.Before(before) || d.After(time.Now()) {
		t.Errorf("Deadline while releasing = %v, want when the Release began (after %v)", d, before)
	}
	open()
	<-released
	<-l.Done()
	if got := l.Deadline(); got.After(d) {
		t.Errorf("Deadline after the release = %v, later than while releasing (%v)", got, d)
	}
}

// lateAcquire loses the reply of every acquire while armed, without
// running it, and keeps the request, to run late (runHeld): as a request
// left in a pipeline that its caller gave up on, or one sent again by the
// client library, reaches the server after the caller's clean-up.
type lateAcquire struct {
	dlock.Driver
	armed atomic.Bool
	mu    sync.Mutex
	held  []*dlock.Call
}

func (d *lateAcquire) Eval(ctx context.Context, calls ...*dlock.Call) {
	if d.armed.Load() {
		for _, c := range calls {
			if c.Script.Name == "acquire" {
				d.mu.Lock()
				d.held = append(d.held, &dlock.Call{Script: c.Script, Keys: c.Keys, Args: c.Args})
				d.mu.Unlock()
				c.Err = errors.New("i/o timeout (reply lost)")
			}
		}
		if !slices.ContainsFunc(calls, func(c *dlock.Call) bool { return c.Err == nil }) {
			return
		}
	}
	d.Driver.Eval(ctx, calls...)
}

// runHeld runs the acquires held back.
func (d *lateAcquire) runHeld(ctx context.Context) {
	d.mu.Lock()
	held := d.held
	d.held = nil
	d.mu.Unlock()
	d.Driver.Eval(ctx, held...)
}

// TestALateCopyOfANodesAcquireTakesNothing: the nodes' acquires of an
// attempt whose replies were lost reach the servers after the attempt
// gave its nodes back. Each node's token is the attempt's alone, so its
// clean-up records the end there, and the late copies take nothing: the
// name stays free, where it was held, for nobody, until the TTL.
func TestALateCopyOfANodesAcquireTakesNothing(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	drivers := make([]*lateAcquire, len(srvs))
	r := newWrappedLocker(t, srvs, func(i int, d dlock.Driver) dlock.Driver {
		drivers[i] = &lateAcquire{Driver: d}
		drivers[i].armed.Store(true)
		return drivers[i]
	})
	ctx := context.Background()
	if _, err := r.TryLock(ctx, "late-copy", redlock.WithTTL(time.Minute)); !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("TryLock with every reply lost: %v, want ErrNoQuorum", err)
	}
	if err := r.Close(); err != nil { // waits for the clean-ups
		t.Fatal(err)
	}
	for _, d := range drivers {
		d.armed.Store(false)
		d.runHeld(ctx)
	}
	if n := heldOn(t, srvs, "late-copy"); n != 0 {
		t.Errorf("late copies of the attempt's acquires hold the name on %d of 3 nodes", n)
	}
}

// TestTheErrorsOfAnObtainedLockNeverSayNotObtained: node 0 is held by
// another, and the lock obtained on nodes 1 and 2. Node 0's refusal, in the
// error of a refresh, of Do or of the loss, must not make it match
// dlock.ErrNotObtained: code that skips its work when the lock is held by
// another would take work done for work skipped.
func TestTheErrorsOfAnObtainedLockNeverSayNotObtained(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	var loser *refreshLoser
	r := newWrappedLocker(t, srvs, func(i int, d dlock.Driver) dlock.Driver {
		if i != 2 {
			return d
		}
		loser = &refreshLoser{Driver: d}
		return loser
	})
	ctx := context.Background()
	other, err := newClient(t, srvs[0]).TryLock(ctx, "split", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release(ctx)
	notObtained := func(what string, err error) {
		t.Helper()
		if errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("%s matches ErrNotObtained: %v", what, err)
		}
	}

	l, err := r.TryLock(ctx, "split", redlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	loser.on.Store(true) // node 2's refresh fails: a quorum holds it, fewer refresh it
	err = l.Refresh(ctx, time.Minute)
	if !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("Refresh = %v, want ErrNoQuorum", err)
	}
	notObtained("a Refresh without a quorum", err)
	loser.on.Store(false)
	srvs[1].Do(t, "DEL", "dlock:{split}")
	err = l.Refresh(ctx, time.Minute)
	if !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh of a lock gone from node 1 = %v, want ErrNotHeld", err)
	}
	notObtained("the Refresh that found it lost", err)
	notObtained("Err", l.Err())
	_ = l.Release(ctx) // gives node 2 back

	err = r.Do(ctx, "split", func(context.Context) error {
		srvs[1].Do(t, "DEL", "dlock:{split}")
		return nil
	}, redlock.WithTTL(time.Minute))
	if !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Do whose Release found the lock lost = %v, want ErrLost", err)
	}
	notObtained("Do's", err)
}

// TestDoReleasesWhenTheFunctionPanics: the panic goes on, and the lock is
// released, where a caller that recovers it (as net/http does) would have
// left it held, and refreshed, until Close.
func TestDoReleasesWhenTheFunctionPanics(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs)
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the function's panic", p)
			}
		}()
		_ = r.Do(context.Background(), "panicky", func(context.Context) error { panic("boom") })
	}()
	if n := heldOn(t, srvs, "panicky"); n != 0 {
		t.Errorf("held on %d nodes after Do's function panicked", n)
	}
}

// refreshCounter counts the refresh calls it passes on, and delays each by
// delay.
type refreshCounter struct {
	dlock.Driver
	delay time.Duration
	n     atomic.Int64
}

func (d *refreshCounter) Eval(ctx context.Context, calls ...*dlock.Call) {
	if slices.ContainsFunc(calls, func(c *dlock.Call) bool { return c.Script.Name == "refresh" }) {
		time.Sleep(d.delay)
		d.n.Add(1)
	}
	d.Driver.Eval(ctx, calls...)
}

// TestAnAutomaticRefreshGoesOnWithTheTTLOfARefreshItWaitedFor: a Refresh
// to a longer TTL is slow on a node, and an automatic refresh falls due
// meanwhile. It waits for the Refresh, and then goes on with its TTL; before,
// it sent the TTL it had read before waiting, cutting the deadline the
// Refresh had just given back to the old TTL.
func TestAnAutomaticRefreshGoesOnWithTheTTLOfARefreshItWaitedFor(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	var slow *refreshCounter
	r := newWrappedLocker(t, srvs, func(i int, d dlock.Driver) dlock.Driver {
		if i != 0 {
			return d
		}
		slow = &refreshCounter{Driver: d, delay: 100 * time.Millisecond}
		return slow
	})
	ctx := context.Background()
	l, err := r.TryLock(ctx, "longer", redlock.WithTTL(time.Second), redlock.WithAutoRefresh(), redlock.WithRefreshInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	// Two more refreshes: the one that waited, and the next.
	n := slow.n.Load()
	eventually(t, 5*time.Second, "two automatic refreshes", func() bool { return slow.n.Load() >= n+2 })
	if left := time.Until(l.Deadline()); left < 30*time.Second {
		t.Errorf("the deadline is %v away after a Refresh to a minute and automatic refreshes, want the minute's", left)
	}
}

// releaseStaller fails the next stalls calls of the release script, unsent,
// with a timeout, as a node that stalls fails a request that needs a new
// connection.
type releaseStaller struct {
	dlock.Driver
	stalls atomic.Int32
}

func (d *releaseStaller) Eval(ctx context.Context, calls ...*dlock.Call) {
	if slices.ContainsFunc(calls, func(c *dlock.Call) bool { return c.Script.Name == "release" }) && d.stalls.Add(-1) >= 0 {
		for _, c := range calls {
			c.Val, c.Err = nil, context.DeadlineExceeded
		}
		return
	}
	d.Driver.Eval(ctx, calls...)
}

// TestANodeThatDoesNotAnswerItsReleaseIsGivenBackLater: a node whose
// release gets no answer in time is given back in the background once it
// answers, not left holding the lock until its TTL.
func TestANodeThatDoesNotAnswerItsReleaseIsGivenBackLater(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	staller := &releaseStaller{}
	r := lockerWithNode0(t, srvs, func(d dlock.Driver) dlock.Driver { staller.Driver = d; return staller })
	ctx := context.Background()
	l, err := r.TryLock(ctx, "stalled-release", redlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	staller.stalls.Store(3)
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release on a quorum: %v", err)
	}
	eventually(t, 5*time.Second, "the node whose release got no answer given back", func() bool {
		return heldOn(t, srvs, "stalled-release") == 0
	})
}

// TestANodeThatRefusesItsReleaseForAWhileIsGivenBackLater: a node that
// refuses a release before running it (BUSY with another client's script,
// NOREPLICAS) for longer than the node timeout is given the lock back in
// the background once it takes requests again, as one that did not answer
// is: it kept the lock for its whole TTL, and with two of three such
// nodes nobody could take the name for that long.
func TestANodeThatRefusesItsReleaseForAWhileIsGivenBackLater(t *testing.T) {
	for _, refusal := range []string{"BUSY", "NOREPLICAS"} {
		t.Run(refusal, func(t *testing.T) {
			srvs := redistest.StartMasters(t, 3)
			r := newLocker(t, srvs)
			ctx := context.Background()
			name := "refused-release-" + refusal
			l, err := r.TryLock(ctx, name, redlock.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			var ends []func()
			for _, srv := range srvs[:2] {
				if refusal == "BUSY" {
					ends = append(ends, srv.Busy(t))
				} else {
					srv.Do(t, "CONFIG", "SET", "min-replicas-to-write", "1")
					ends = append(ends, func() { srv.Do(t, "CONFIG", "SET", "min-replicas-to-write", "0") })
				}
			}
			if err := l.Release(ctx); !errors.Is(err, redlock.ErrNoQuorum) {
				t.Errorf("Release refused by two of three nodes: %v, want ErrNoQuorum", err)
			}
			for _, end := range ends {
				end()
			}
			eventually(t, 5*time.Second, "the nodes that refused the release given back", func() bool {
				return heldOn(t, srvs, name) == 0
			})
			// Release again, as its error says to: the nodes were given
			// back, by this Lock.
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release again once the nodes were given back: %v", err)
			}
		})
	}
}

// TestAReleaseCalledAgainOnceTheNodesAnswerReleases: a Release called
// again, as its error says to, once the nodes that refused the first
// (BUSY) answer again, releases there at once, while their background
// clean-up sleeps between two tries: it waited for the clean-up's next
// try, past the node timeout, and failed again.
func TestAReleaseCalledAgainOnceTheNodesAnswerReleases(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs, redlock.WithNodeTimeout(50*time.Millisecond))
	ctx := context.Background()
	l, err := r.TryLock(ctx, "again", redlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var ends []func()
	for _, srv := range srvs[:2] {
		ends = append(ends, srv.Busy(t))
	}
	if err := l.Release(ctx); !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("Release refused by two of three nodes: %v, want ErrNoQuorum", err)
	}
	// The clean-up's tries, refused, come further apart (up to 200ms).
	time.Sleep(600 * time.Millisecond)
	for _, end := range ends {
		end()
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release called again once the nodes answer: %v", err)
	}
	if n := heldOn(t, srvs, "again"); n != 0 {
		t.Errorf("held on %d nodes after the Release", n)
	}
}

// TestAReleaseCalledAgainOfALockGoneFromEveryNodeIsNotHeld: the clean-ups
// that follow a Release refused by two of three nodes (BUSY) find nothing
// there, where the lock is gone (deleted here, as a force release or a
// lost write would): a Release called again says the lock was not held,
// as one without the refusal does. It said nil: a clean-up answered
// without an error counted as given back, whatever it found.
func TestAReleaseCalledAgainOfALockGoneFromEveryNodeIsNotHeld(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs, redlock.WithNodeTimeout(50*time.Millisecond))
	ctx := context.Background()
	l, err := r.TryLock(ctx, "gone", redlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, srv := range srvs {
		srv.Do(t, "DEL", "dlock:{gone}")
	}
	var ends []func()
	for _, srv := range srvs[:2] {
		ends = append(ends, srv.Busy(t))
	}
	if err := l.Release(ctx); err == nil {
		t.Fatal("Release refused by two of three nodes: nil")
	}
	for _, end := range ends {
		end()
	}
	// The clean-ups ran: each leaves its record in a free lock hash.
	eventually(t, 5*time.Second, "the clean-ups run", func() bool {
		return srvs[0].Do(t, "EXISTS", "dlock:{gone}") == "1" && srvs[1].Do(t, "EXISTS", "dlock:{gone}") == "1"
	})
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release called again of a lock held on no node: %v, want ErrNotHeld", err)
	}
}

// TestAMajorityOfNodesRefusingForGoodEndsTheWait: when a majority of the
// nodes refuse for a reason no retry changes (an ACL user without EVALSHA,
// NOPERM), Lock ends at once with that refusal, which matches ErrDenied, as
// a dlock Client's Lock does, rather than trying until its max wait.
func TestAMajorityOfNodesRefusingForGoodEndsTheWait(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	for _, srv := range srvs[:2] {
		srv.Do(t, "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "&*", "+@all", "-evalsha", "-eval")
	}
	r := newLockerOfOptions(t, srvs, func(i int, o *redis.Options) {
		if i < 2 {
			o.Username, o.Password = "noscripts", "pw"
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.Lock(ctx, "refused-for-good", redlock.WithMaxWait(time.Minute)); err == nil || !strings.Contains(err.Error(), "NOPERM") ||
		!errors.Is(err, dlock.ErrDenied) {
		t.Errorf("Lock refused by two of three nodes for good: %v, want their NOPERM, matching ErrDenied", err)
	}
	if ctx.Err() != nil {
		t.Error("the wait went on to its max wait")
	}
}

// A Locker not made by New has no nodes: with a quorum of zero it counted
// a lock none of them held as held, so two callers held one name at once.
// Its methods panic instead, with a message that says so, as a nil
// *Locker's do.
func TestALockerNotMadeByNewPanics(t *testing.T) {
	ctx := context.Background()
	var zero redlock.Locker
	var nilLocker *redlock.Locker
	for _, tc := range []struct {
		name string
		call func()
		want string
	}{
		{"TryLock", func() { _, _ = zero.TryLock(ctx, "x") }, "Locker used without New"},
		{"Lock", func() { _, _ = zero.Lock(ctx, "x") }, "Locker used without New"},
		{"Do", func() { _ = zero.Do(ctx, "x", func(context.Context) error { return nil }) }, "Locker used without New"},
		{"Quorum", func() { zero.Quorum() }, "Locker used without New"},
		{"Nodes", func() { zero.Nodes() }, "Locker used without New"},
		{"Close", func() { _ = zero.Close() }, "Locker used without New"},
		{"TryLock of a nil *Locker", func() { _, _ = nilLocker.TryLock(ctx, "x") }, "nil *Locker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := func() (p any) {
				defer func() { p = recover() }()
				tc.call()
				return nil
			}()
			msg, _ := p.(string)
			if !strings.HasPrefix(msg, "redlock: ") || !strings.Contains(msg, tc.want) {
				t.Errorf("panic = %v, want a \"redlock: \" message saying %q", p, tc.want)
			}
		})
	}
}

// TestTheZeroLockPanics: a Lock that no Locker made has no nodes; its
// Release and Refresh waited for ever for their turn, and its Done
// returned a channel that never closes. Every method panics instead, with
// a message that says so.
func TestTheZeroLockPanics(t *testing.T) {
	ctx := context.Background()
	var l redlock.Lock
	for _, tc := range []struct {
		name string
		call func()
	}{
		{"Release", func() { _ = l.Release(ctx) }},
		{"Refresh", func() { _ = l.Refresh(ctx, time.Second) }},
		{"Done", func() { l.Done() }},
		{"Err", func() { _ = l.Err() }},
		{"Deadline", func() { l.Deadline() }},
		{"Context", func() { l.Context(ctx) }},
		{"Name", func() { l.Name() }},
		{"Token", func() { l.Token() }},
		{"Metadata", func() { l.Metadata() }},
		{"Nodes", func() { l.Nodes() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// On a goroutine, bounded: the call may block instead.
			got := make(chan any, 1)
			go func() {
				defer func() { got <- recover() }()
				tc.call()
			}()
			select {
			case p := <-got:
				if msg, _ := p.(string); !strings.HasPrefix(msg, "redlock: ") || !strings.Contains(msg, "zero Lock") {
					t.Errorf("panic = %v, want a \"redlock: \" message about the zero Lock", p)
				}
			case <-time.After(5 * time.Second):
				t.Error("blocked instead of panicking")
			}
		})
	}
}

// TestAReleaseCalledAgainDoesNotBlameANodeItFreed: node 0 gets its
// requests late, so that its lock runs out by the local clock (its
// deadline counts from before the request) while its server still has it;
// the first Release frees it there, and gets no answer from the two
// others (paused). A Release called again, again unanswered by them, is of
// unknown outcome, as the first: it matched dlock.ErrLost, through a
// *NodeError that blamed node 0, which it did not ask again, for the loss
// of its lock there by the local clock, and it said the lock was released
// on 0 nodes (node 0 had released it).
func TestAReleaseCalledAgainDoesNotBlameANodeItFreed(t *testing.T) {
	// The grant reaches node 0 300ms late (within the node timeout), the
	// refresh 1.8s late.
	r, srvs := lockerWithNode0Late(t, map[string]time.Duration{"acquire": 300 * time.Millisecond, "refresh": 1800 * time.Millisecond})
	ctx := context.Background()
	l, err := r.TryLock(ctx, "freed", redlock.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// Nodes 1 and 2 hold it for 5s; node 0's refresh is under way.
	if err := l.Refresh(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Second, "node 0's lock runs out here", func() bool { return !slices.Contains(l.Nodes(), srvs[0].Addr()) })
	eventually(t, 3*time.Second, "node 0's late refresh runs there", func() bool {
		ms, _ := strconv.Atoi(srvs[0].Do(t, "PTTL", "dlock:{freed}"))
		return ms > 2500
	})
	if err := l.Err(); err != nil {
		t.Fatalf("held on nodes 1 and 2, but: %v", err)
	}
	srvs[1].PauseAWhile(t)
	srvs[2].PauseAWhile(t)
	if err := l.Release(ctx); !errors.Is(err, redlock.ErrNoQuorum) || errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Release unanswered by two of three nodes: %v, want ErrNoQuorum and not ErrLost", err)
	}
	if holds(t, srvs[0], "freed") {
		t.Fatal("node 0 not released")
	}
	err = l.Release(ctx)
	if !errors.Is(err, redlock.ErrNoQuorum) || errors.Is(err, dlock.ErrLost) || errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release called again, unanswered by two of three nodes: %v\nwant ErrNoQuorum, neither ErrLost nor ErrNotHeld", err)
	}
	if err != nil && strings.Contains(err.Error(), "node 0 (") {
		t.Errorf("the error blames node 0, which released it: %v", err)
	}
	if err != nil && !strings.Contains(err.Error(), "released on 1 of 3 nodes, quorum 2") {
		t.Errorf("the error does not say node 0 released it: %v", err)
	}
}

// TestARefreshWaitsForAReleaseUnderWayOnlyWithinItsContext: a Release
// waits for two paused nodes up to the node timeout; a Refresh called
// meanwhile with a shorter context returns at its context's end, not once
// the Release is done.
func TestARefreshWaitsForAReleaseUnderWayOnlyWithinItsContext(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs, redlock.WithNodeTimeout(3*time.Second))
	ctx := context.Background()
	l, err := r.TryLock(ctx, "op", redlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srvs[1].PauseAWhile(t)
	srvs[2].PauseAWhile(t)
	released := make(chan error, 1)
	go func() { released <- l.Release(ctx) }()
	// The Release has its turn once node 0 has freed the name.
	eventually(t, 3*time.Second, "node 0 released", func() bool { return !holds(t, srvs[0], "op") })
	rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	err = l.Refresh(rctx, 10*time.Second)
	select {
	case rerr := <-released:
		t.Fatalf("the Release (%v) ended before the Refresh returned (%v)", rerr, err)
	default:
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Refresh = %v, want its context's deadline", err)
	}
	<-released
}

// dialRefusedDriver fails the next calls of script, refuse of them, with
// a refused dial, as a driver does while its server is down, or replaced
// in a failover that the client library has yet to learn of.
type dialRefusedDriver struct {
	dlock.Driver
	script string
	refuse atomic.Int32
}

func (d *dialRefusedDriver) Eval(ctx context.Context, calls ...*dlock.Call) {
	if calls[0].Script.Name == d.script && d.refuse.Add(-1) >= 0 {
		for _, c := range calls {
			c.Val, c.Err = nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		}
		return
	}
	d.Driver.Eval(ctx, calls...)
}

// TestAReleaseGivesANodeThatRefusesConnectionsItsLockBackLater: a Release
// whose request to a node cannot connect (the node restarting with its
// data, or failing over) gives that node its lock back in the background
// once it connects, as a Do gives back its lock on a dlock Client (see
// dlock's TestADoWhoseReleaseCannotConnectGivesItBackLater), rather than
// leaving the name held there, by nobody, until its TTL.
func TestAReleaseGivesANodeThatRefusesConnectionsItsLockBackLater(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	var d0 *dialRefusedDriver
	r := newLockerOf(t, srvs, func(i int, d dlock.Driver) *dlock.Client {
		if i == 0 {
			d0 = &dialRefusedDriver{Driver: d, script: "release"}
			d = d0
		}
		return dlock.New(d)
	})
	ctx := context.Background()
	l, err := r.TryLock(ctx, "dial-later", redlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	d0.refuse.Store(2) // the release, and its copy sent at once
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release = %v, want nil: nodes 1 and 2 released it", err)
	}
	eventually(t, 5*time.Second, "node 0 given its lock back", func() bool { return !holds(t, srvs[0], "dial-later") })
}

// TestARefreshCutShortWaitingForTheReleaseSaysItsContextsEnd: a Refresh
// whose context ends while it waits for the Release under way returns an
// error that matches the context's error (context.DeadlineExceeded), as
// every error of a call whose context ended does, also when the context
// has a cause of its own.
func TestARefreshCutShortWaitingForTheReleaseSaysItsContextsEnd(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs, redlock.WithNodeTimeout(3*time.Second))
	ctx := context.Background()
	l, err := r.TryLock(ctx, "op-cause", redlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srvs[1].PauseAWhile(t)
	srvs[2].PauseAWhile(t)
	released := make(chan error, 1)
	go func() { released <- l.Release(ctx) }()
	eventually(t, 3*time.Second, "node 0 released", func() bool { return !holds(t, srvs[0], "op-cause") })
	why := errors.New("the request's budget ran out")
	rctx, cancel := context.WithTimeoutCause(ctx, 100*time.Millisecond, why)
	defer cancel()
	err = l.Refresh(rctx, 10*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Refresh = %v, want it to match context.DeadlineExceeded", err)
	}
	if !errors.Is(err, why) {
		t.Errorf("Refresh = %v, want it to say the context's cause", err)
	}
	<-released
}

// TestARefreshWithAnEndedContextWaitsForNothingUnderWay: with no Release
// or refresh under way, a Refresh whose context had ended does not report
// having waited for one: it takes its turn, as it does once one ends.
func TestARefreshWithAnEndedContextWaitsForNothingUnderWay(t *testing.T) {
	srvs := redistest.StartMasters(t, 3)
	r := newLocker(t, srvs)
	ctx := context.Background()
	l, err := r.TryLock(ctx, "op-ended", redlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	waited := 0
	for range 20 {
		err := l.Refresh(ended, 10*time.Second)
		if err != nil && strings.Contains(err.Error(), "waited for the Release or refresh under way") {
			waited++
		}
	}
	if waited > 0 {
		t.Errorf("%d of 20 Refreshes with an ended context, and nothing under way, say they waited for a Release or refresh", waited)
	}
}

// lockerWithNode0Late returns a Locker over three masters, with a node
// timeout of 500ms, whose requests to node 0 reach it late by the delay of
// their script (see delayedDriver), and the masters.
func lockerWithNode0Late(t *testing.T, delay map[string]time.Duration) (*redlock.Locker, []*redistest.Server) {
	srvs := redistest.StartMasters(t, 3)
	nodes := make([]redlock.Node, len(srvs))
	for i, srv := range srvs {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		var d dlock.Driver = goredis.New(rdb)
		if i == 0 {
			d = &delayedDriver{Driver: d, delay: delay}
		}
		c := dlock.New(d)
		t.Cleanup(func() { _ = c.Close() })
		nodes[i] = redlock.Node{Addr: srv.Addr(), Client: c}
	}
	r, err := redlock.New(nodes, redlock.WithNodeTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r, srvs
}

// lockerAsUser returns a Locker over three masters, whose node clients
// log in as the ACL user "locker", and the masters.
func lockerAsUser(t *testing.T) (*redlock.Locker, []*redistest.Server) {
	srvs := redistest.StartMasters(t, 3)
	for _, srv := range srvs {
		srv.Do(t, "ACL", "SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all")
	}
	return newLockerOfOptions(t, srvs, func(_ int, o *redis.Options) { o.Username, o.Password = "locker", "pw" }), srvs
}

// revokeScripts takes the script commands from the user "locker" on srvs
// (see lockerAsUser): its requests there are refused (NOPERM).
func revokeScripts(t *testing.T, srvs []*redistest.Server) {
	for _, srv := range srvs {
		srv.Do(t, "ACL", "SETUSER", "locker", "-evalsha", "-eval")
	}
}
