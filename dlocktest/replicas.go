package dlocktest

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/dlockio/dlock"
)

var replicaTests = []test{
	{name: "EvalWait", run: testEvalWait},
	{name: "WithReplicas", run: testWithReplicas},
}

// replicas is how many replicas each primary has.
func (e *env) replicas() int { return len(e.nodes)/len(e.primaries) - 1 }

// testEvalWait: the calls run as Eval runs them (after SCRIPT FLUSH:
// EVALSHA, then EVAL), spread over every primary, and WAIT reports the
// replicas that have them, within two WAIT timeouts however many primaries
// and slots the calls touch.
func testEvalWait(t *testing.T, e *env) {
	rep, ok := e.driver(t).(dlock.Replicator)
	if !ok {
		t.Skip("the driver has no Replicator")
	}
	ctx := timeout(t)
	e.onPrimaries(t, "SCRIPT", "FLUSH")
	set := dlock.NewScript("set", "redis.call('SET', KEYS[1], ARGV[1]) return ARGV[1]")
	refuse := dlock.NewScript("refuse", "return redis.error_reply('DLOCK_NO 1')")
	calls := make([]*dlock.Call, 20)
	for i := range calls {
		calls[i] = &dlock.Call{Script: set, Keys: []string{fmt.Sprintf("%s{%d}", prefix(t), i)}, Args: []any{i}}
	}
	calls = append(calls, &dlock.Call{Script: refuse, Keys: []string{prefix(t) + "{refused}"}})
	const wait = 200 * time.Millisecond
	start := time.Now()
	acked, err := rep.EvalWait(ctx, 1, wait, calls...)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("EvalWait: %v", err)
	}
	if want := min(e.replicas(), 1); acked != want {
		t.Errorf("EvalWait acknowledged by %d replicas, want %d", acked, want)
	}
	for i, call := range calls[:20] {
		checkReply(t, fmt.Sprintf("call %d", i), call, strconv.Itoa(i))
		if e.replicas() == 0 || e.dep.Topology == Cluster { // a cluster's replicas answer MOVED
			continue
		}
		for _, r := range e.nodes[len(e.primaries):] { // WAIT returned: the replica has the write
			if got := r.Do(t, "GET", call.Keys[0]); got != strconv.Itoa(i) {
				t.Errorf("replica %s: %s = %q after WAIT", r.Addr(), call.Keys[0], got)
			}
		}
	}
	checkError(t, "the refused call", calls[20], "DLOCK_NO 1", "", "")
	// One WAIT timeout, and one more after the fallback to EVAL, whatever
	// the number of primaries and slots.
	if limit := 4 * wait; took > limit {
		t.Errorf("EvalWait took %v, more than %v: primaries or slots waited for one after the other?", took, limit)
	}
	if e.replicas() == 0 {
		return
	}

	// Replicas that stopped: the writes are not confirmed, and the WAITs
	// of the primaries time out at once, not one after the other.
	for _, r := range e.nodes[len(e.primaries):] {
		r.Pause(t)
		defer r.Resume(t)
	}
	for i, call := range calls[:20] {
		calls[i] = &dlock.Call{Script: set, Keys: call.Keys, Args: []any{"again"}}
	}
	e.onPrimaries(t, "SCRIPT", "FLUSH")
	start = time.Now()
	acked, err = rep.EvalWait(ctx, 1, wait, calls[:20]...)
	took = time.Since(start)
	if err != nil || acked != 0 {
		t.Errorf("EvalWait with the replicas stopped: %d acknowledged, err %v; want 0", acked, err)
	}
	for i, call := range calls[:20] {
		checkReply(t, fmt.Sprintf("with the replicas stopped, call %d", i), call, "again")
	}
	if limit := 4 * wait; took > limit {
		t.Errorf("EvalWait with the replicas stopped took %v, more than %v: primaries or slots waited for one after the other?", took, limit)
	}
}

// testWithReplicas: dlock confirms acquires on replicas with the driver's
// EvalWait, and refuses them when too few replicas acknowledge.
func testWithReplicas(t *testing.T, e *env) {
	drv := e.driver(t)
	_, ok := drv.(dlock.Replicator)
	c := dlock.New(drv, dlock.WithPrefix(prefix(t)))
	defer c.Close()
	ctx := timeout(t)
	if !ok {
		if _, err := c.TryLock(ctx, "r", dlock.WithReplicas(1, time.Second)); !errors.Is(err, dlock.ErrUnsupported) {
			t.Errorf("WithReplicas with a driver that cannot WAIT: err = %v, want ErrUnsupported", err)
		}
		return
	}
	n := e.replicas()
	if n > 0 {
		l, err := c.TryLock(ctx, "confirmed", dlock.WithReplicas(n, time.Second))
		if err != nil {
			t.Fatal(err)
		}
		key := c.RedisKey("confirmed")
		for _, r := range e.nodes[len(e.primaries):] {
			if e.dep.Topology != Cluster && r.Do(t, "EXISTS", key) != "1" {
				t.Errorf("replica %s lacks the lock", r.Addr())
			}
		}
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.TryLock(ctx, "unconfirmed", dlock.WithReplicas(n+1, 50*time.Millisecond))
	if !errors.Is(err, dlock.ErrNotReplicated) {
		t.Fatalf("TryLock needing %d replicas: err = %v, want ErrNotReplicated", n+1, err)
	}
	key := c.RedisKey("unconfirmed")
	if got := e.do(t, key, "HGET", key, "token"); got != "" && got != "(nil)" {
		t.Error("an unconfirmed acquire was left behind")
	}
}
