package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
)

var replicaTests = []test{
	{name: "EvalWait", run: testEvalWait},
	{name: "EvalWaitKilledConnections", run: testEvalWaitKilledConnections},
	{name: "EvalWaitSendsScriptsOnce", run: testEvalWaitSendsScriptsOnce},
	{name: "WithReplicas", run: testWithReplicas},
}

// replicas is how many replicas each primary has.
func (e *env) replicas() int { return len(e.nodes)/len(e.primaries) - 1 }

// testEvalWait: the calls run as Eval runs them (after SCRIPT FLUSH:
// EVALSHA, then EVAL), spread over every primary, and WAIT reports the
// replicas that have them; a WAIT that no replica can answer waits on
// every primary at once, not on one after the other.
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
	var acked int
	var err error
	if e.replicas() == 0 { // nothing can answer the WAIT
		acked, err = e.evalWaitUnanswered(t, rep, calls)
	} else { // the replicas answer it at once; the timeout is only a bound
		acked, err = rep.EvalWait(ctx, 1, waitFor/2, calls...)
	}
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
	if e.replicas() == 0 {
		return
	}

	// One primary's replica stopped: the least acknowledgement counts, as
	// dlock must not take writes that one primary's replica lacks for
	// confirmed.
	if len(e.primaries) > 1 {
		r := e.nodes[len(e.primaries)]
		r.Pause(t)
		one := e.callPerPrimary(t, dlock.NewScript("incr", "return redis.call('INCR', KEYS[1])"))
		acked, err := rep.EvalWait(ctx, 1, 300*time.Millisecond, one...)
		r.Resume(t)
		if err != nil || acked != 0 {
			t.Errorf("EvalWait with one primary's replica stopped: %d acknowledged, err %v; want 0, the least", acked, err)
		}
		for i, call := range one {
			checkReply(t, fmt.Sprintf("with one replica stopped, call %d", i), call, int64(1))
		}
	}

	// Replicas that stopped: the writes are not confirmed, and the
	// primaries wait at once, not one after the other.
	for _, r := range e.nodes[len(e.primaries):] {
		r.Pause(t)
		defer r.Resume(t)
	}
	for i, call := range calls[:20] {
		calls[i] = &dlock.Call{Script: set, Keys: call.Keys, Args: []any{"again"}}
	}
	e.onPrimaries(t, "SCRIPT", "FLUSH")
	acked, err = e.evalWaitUnanswered(t, rep, calls[:20])
	if err != nil || acked != 0 {
		t.Errorf("EvalWait with the replicas stopped: %d acknowledged, err %v; want 0", acked, err)
	}
	for i, call := range calls[:20] {
		checkReply(t, fmt.Sprintf("with the replicas stopped, call %d", i), call, "again")
	}
}

// testEvalWaitSendsScriptsOnce: as testScriptSentOnce, for EvalWait: a
// pipeline of many calls on servers that know none of their scripts sends
// each script's text once to each primary, and the replicas that WAIT
// reports have the writes of the calls that went again.
func testEvalWaitSendsScriptsOnce(t *testing.T, e *env) {
	rep, ok := e.driver(t).(dlock.Replicator)
	if !ok {
		t.Skip("the driver has no Replicator")
	}
	if e.replicas() == 0 {
		t.Skip("no replicas to WAIT for")
	}
	calls, check := manyCallsOfTwoScripts(t)
	e.onPrimaries(t, "SCRIPT", "FLUSH")
	e.onPrimaries(t, "CONFIG", "RESETSTAT")
	acked, err := rep.EvalWait(timeout(t), e.replicas(), waitFor/2, calls...)
	if err != nil || acked != e.replicas() {
		t.Fatalf("EvalWait acknowledged by %d replicas, err %v; want %d", acked, err, e.replicas())
	}
	check("EvalWait", calls)
	e.checkEvalsPerPrimary(t, "EvalWait of 300 calls of 2 scripts", 2)
	if e.dep.Topology == Cluster { // a cluster's replicas answer MOVED
		return
	}
	for i, call := range calls {
		if i%2 != 0 {
			continue
		}
		for _, r := range e.nodes[len(e.primaries):] { // WAIT returned: the replica has the write
			if got := r.Do(t, "GET", call.Keys[0]); got != "1" {
				t.Fatalf("replica %s: %s = %q after WAIT, want 1", r.Addr(), call.Keys[0], got)
			}
		}
	}
}

// testEvalWaitKilledConnections: as testKilledConnections, for EvalWait.
func testEvalWaitKilledConnections(t *testing.T, e *env) {
	rep, ok := e.driver(t).(dlock.Replicator)
	if !ok {
		t.Skip("the driver has no Replicator")
	}
	s := dlock.NewScript("incr", "return redis.call('INCR', KEYS[1])")
	calls := e.callPerPrimary(t, s)
	for round := 1; round <= 5; round++ {
		acked, err := rep.EvalWait(timeout(t), e.replicas(), waitFor/2, calls...)
		if err != nil || acked != e.replicas() {
			t.Errorf("round %d: EvalWait acknowledged by %d replicas, err %v; want %d", round, acked, err, e.replicas())
		}
		for i, call := range calls {
			checkReply(t, fmt.Sprintf("round %d, call %d", round, i), call, int64(round))
			call.Val, call.Err = nil, nil
		}
		e.killClients(t)
	}
}

// evalWaitUnanswered runs EvalWait for one replica, with calls on every
// primary, where no replica can answer (there are none, or they are
// paused), and a WAIT timeout longer than the test waits: EvalWait returns
// only once the test has unblocked its WAITs. It waits, within waitFor,
// until every primary has a connection blocked in WAIT at the same time,
// as when the primaries are asked at once; then it unblocks every WAIT it
// finds (CLIENT UNBLOCK, as if timed out) until EvalWait returns, within
// waitFor again.
func (e *env) evalWaitUnanswered(t *testing.T, rep dlock.Replicator, calls []*dlock.Call) (int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitFor)
	defer cancel()
	type result struct {
		acked int
		err   error
	}
	done := make(chan result, 1)
	go func() {
		acked, err := rep.EvalWait(ctx, 1, 3*waitFor, calls...)
		done <- result{acked, err}
	}()
	var failure string
	unblocking := false
	start := time.Now()
	for ; ; time.Sleep(poll) {
		select {
		case r := <-done:
			if failure != "" {
				t.Fatal(failure)
			}
			if !unblocking {
				t.Fatalf("EvalWait returned (%d, %v) before its WAITs were unblocked", r.acked, r.err)
			}
			return r.acked, r.err
		default:
		}
		waiting := make([][]string, len(e.primaries))
		all := true
		for i, p := range e.primaries {
			waiting[i] = waitingClients(t, p)
			all = all && len(waiting[i]) > 0
		}
		if !unblocking && (all || time.Since(start) > waitFor) {
			unblocking = true
			if !all {
				failure = fmt.Sprintf("EvalWait: the primaries never all waited at once within %v: asked one after the other?", waitFor)
			}
			start = time.Now()
		}
		if !unblocking {
			continue
		}
		for i, ids := range waiting {
			for _, id := range ids {
				e.primaries[i].Do(t, "CLIENT", "UNBLOCK", id, "TIMEOUT")
			}
		}
		if time.Since(start) > waitFor {
			t.Fatalf("EvalWait did not return within %v of its WAITs being unblocked", waitFor)
		}
	}
}

// waitingClients returns the ids of the connections to srv blocked in WAIT.
func waitingClients(t testing.TB, srv *redistest.Server) []string {
	t.Helper()
	var ids []string
	for _, line := range strings.Split(srv.Do(t, "CLIENT", "LIST"), "\n") {
		var id string
		var blocked, wait bool
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			}
			if v, ok := strings.CutPrefix(f, "flags="); ok {
				blocked = strings.Contains(v, "b")
			}
			wait = wait || f == "cmd=wait"
		}
		if id != "" && blocked && wait {
			ids = append(ids, id)
		}
	}
	return ids
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
