package dlockrueidis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/keyslot"
	"github.com/redis/rueidis"
)

var _ dlock.Replicator = (*Driver)(nil)

// EvalWait runs the calls as Eval does and then WAIT replicas timeout on
// the connection that carried them, and returns the fewest replicas that
// acknowledged the writes. The calls and their WAIT go out as one pipeline
// on a connection of rueidis's blocking pool, so that a WAIT never holds
// up the commands that other goroutines pipeline on the shared
// connections.
//
// On a cluster the calls are grouped by the primary that serves their
// first key's slot, with one WAIT for each primary, and the primaries are
// asked at once. The slot map comes from CLUSTER SLOTS, asked once and
// again whenever a primary answers MOVED or ASK, or cannot be reached.
func (d *Driver) EvalWait(ctx context.Context, replicas int, timeout time.Duration, calls ...*dlock.Call) (int, error) {
	if d.client.Mode() != rueidis.ClientModeCluster {
		acked, err := evalWait(ctx, d.client, replicas, timeout, calls)
		d.settle(ctx, calls)
		return acked, err
	}
	groups, err := d.byPrimary(ctx, calls)
	if err != nil {
		failAll(calls, err)
		return 0, err
	}
	type result struct {
		acked int
		err   error
	}
	results := make(chan result, len(groups))
	for _, g := range groups {
		go func() {
			acked, err := evalWait(ctx, g.node, replicas, timeout, g.calls)
			results <- result{acked, err}
		}()
	}
	least := -1
	for range groups {
		r := <-results
		if r.err != nil {
			err = cmp.Or(err, r.err)
		} else if least < 0 || r.acked < least {
			least = r.acked
		}
	}
	stale := err != nil // a primary could not be reached: it may have failed over
	for _, c := range calls {
		if c.Err != nil && (strings.HasPrefix(c.Err.Error(), "MOVED ") || strings.HasPrefix(c.Err.Error(), "ASK ")) {
			stale = true
		}
	}
	if stale {
		d.slots.Store(nil) // the map may be out of date: ask again next time
	}
	if err != nil {
		return 0, err
	}
	return max(least, 0), nil
}

// evalWait runs calls and WAIT as one pipeline on c, by EVALSHA (or FCALL),
// then once more, with WAIT again, the calls the server answered without
// knowing their script: the first of each script by EVAL and the others by
// EVALSHA behind it (see dlock.EvalAgain), or by FCALL once the library is
// loaded; and as scripts those whose server could not load the library
// (see dlock.Loaded).
func evalWait(ctx context.Context, c rueidis.Client, replicas int, timeout time.Duration, calls []*dlock.Call) (int, error) {
	// pass sends the calls and WAIT in one pipeline, and returns WAIT's
	// reply. The passes all wait within timeout: the WAIT of a first pass
	// the server answered with NOSCRIPT confirms nothing, but waits all the
	// same while a replica lags, and the next pass's WAIT has what is left.
	end := time.Now().Add(timeout)
	pass := func(calls []*dlock.Call, byEval []bool) (int, error) {
		wait := timeout
		if byEval != nil { // a second round
			wait = max(time.Until(end), time.Millisecond)
		}
		pipeline := func() rueidis.Commands {
			cmds := make(rueidis.Commands, 0, len(calls)+1)
			for i, call := range calls {
				cmds = append(cmds, command(c, call, byEval != nil && byEval[i]))
			}
			// WAIT is a blocking command: the whole pipeline goes out on
			// one connection of the blocking pool, in order.
			return append(cmds, c.B().Wait().Numreplicas(int64(replicas)).Timeout(wait.Milliseconds()).Build())
		}
		rs := c.DoMulti(ctx, pipeline()...)
		// A pipeline whose every request found the connection closed goes
		// again, whole, as Eval's calls do: WAIT alone on another
		// connection would wait for nothing.
		for range closedRetries {
			if ctx.Err() != nil || slices.ContainsFunc(rs, func(r rueidis.RedisResult) bool { return !dlock.ConnectionClosed(r.Error()) }) {
				break
			}
			rs = c.DoMulti(ctx, pipeline()...)
		}
		for i, call := range calls {
			store(call, rs[i])
		}
		acked, err := rs[len(calls)].AsInt64()
		return int(acked), err
	}
	least, err := pass(calls, nil)
	if err != nil {
		return 0, err
	}
	if again, lib := dlock.Unknown(calls); len(again) > 0 {
		least, err = dlock.ResendWait(again, lib, least, func(lib *dlock.Library, calls []*dlock.Call) ([]*dlock.Call, []*dlock.Call) {
			return dlock.Loaded(calls, loadError(c.Do(ctx, c.B().FunctionLoad().FunctionCode(lib.Src).Build())))
		}, pass)
		if err != nil {
			return 0, err
		}
	}
	return max(least, 0), nil
}

// group is the calls bound for one primary.
type group struct {
	node  rueidis.Client
	calls []*dlock.Call
}

// slotMap is which primary serves each slot.
type slotMap struct {
	ranges []slotRange // sorted by first slot
	nodes  map[string]rueidis.Client
	read   time.Time // when it was read
}

const (
	// serverMapAge is how old a slot map Server reads again: rueidis
	// follows a slot that moved (MOVED) without telling.
	serverMapAge = 5 * time.Second
	// serverMapRetry is how long Server waits after reading the slot map
	// before it tries again, when that failed.
	serverMapRetry = time.Second
	// readSlotsHedge is how long readSlots waits for a node's answer
	// before it asks another as well.
	readSlotsHedge = 50 * time.Millisecond
)

// epoch is the start of the monotonic clock serverMap counts by.
var epoch = time.Now()

// serverMap returns the slot map for Server, read again when there is none
// or it is older than serverMapAge: within refreshNudge, and at most once
// every serverMapRetry. So it holds up a caller (a request of a
// dlock.Client, or its watchdog grouping refreshes by primary) for a
// round trip to a node that answers (see readSlots), and at most
// refreshNudge in serverMapRetry. Where the map was reset, or could not be read again, the
// last one read stays in use.
func (d *Driver) serverMap(ctx context.Context) *slotMap {
	m := d.lastSlots.Load() // every map read, the one in slots too
	if m != nil && time.Since(m.read) < serverMapAge {
		return m
	}
	if ctx.Err() != nil {
		return m
	}
	now, last := int64(time.Since(epoch)), d.tried.Load()
	if last != 0 && now-last < int64(serverMapRetry) || !d.tried.CompareAndSwap(last, now) {
		return m
	}
	rctx, cancel := context.WithTimeout(ctx, refreshNudge)
	defer cancel()
	fresh, err := d.readSlots(rctx)
	if err != nil {
		return m
	}
	d.slots.Store(fresh)
	return fresh
}

type slotRange struct {
	first, last int
	addr        string
}

// byPrimary groups calls by the primary that serves their first key; calls
// without keys join any group.
func (d *Driver) byPrimary(ctx context.Context, calls []*dlock.Call) ([]group, error) {
	m, err := d.currentSlots(ctx)
	if err != nil {
		return nil, err
	}
	var groups []group
	index := map[string]int{}
	var keyless []*dlock.Call
	for _, call := range calls {
		if len(call.Keys) == 0 {
			keyless = append(keyless, call)
			continue
		}
		addr := m.owner(keyslot.Of(call.Keys[0]))
		node, ok := m.nodes[addr]
		if !ok {
			return nil, d.unconnected(ctx, addr, call.Keys[0], fmt.Sprintf("which serves the slot of %q", call.Keys[0]))
		}
		i, ok := index[addr]
		if !ok {
			i = len(groups)
			index[addr] = i
			groups = append(groups, group{node: node})
		}
		groups[i].calls = append(groups[i].calls, call)
	}
	if len(keyless) > 0 {
		if len(groups) == 0 {
			groups = append(groups, group{node: d.client})
		}
		groups[0].calls = append(groups[0].calls, keyless...)
	}
	return groups, nil
}

// refreshNudge bounds the request that makes the cluster client read the
// cluster's topology again (see unconnected).
const refreshNudge = 200 * time.Millisecond

// unconnected returns the error of a slot whose primary, at addr, the
// cluster client has no connection to (a replica promoted since the client
// last read the cluster's topology), and resets the slot map. So that the
// next attempt finds a connection, it also makes the client read the
// topology again, which rueidis does only after a request routed by slot
// fails or is redirected (or every ShardsRefreshInterval, off by default):
// it sends one, EXISTS of key, a key in that slot (a read that changes
// nothing), bounded by refreshNudge (see nudgeCommand). Without it a shard
// subscription could wait for good for a primary that took over in a
// failover, and List fail for good.
func (d *Driver) unconnected(ctx context.Context, addr, key, what string) error {
	d.slots.Store(nil)
	nctx, cancel := context.WithTimeout(ctx, refreshNudge)
	defer cancel()
	_ = d.client.Do(nctx, nudgeCommand(d.client, key)).Error()
	return fmt.Errorf("dlockrueidis: no connection to %q, %s", addr, what)
}

// nudgeCommand builds the EXISTS of key that unconnected sends, not
// flagged read-only, though it is, as scanCommand's SCAN: a client that
// sends read-only commands to replicas (SendToReplicas: cmd.IsReadOnly())
// would send it to a replica of the slot that it knows, which answers
// when it copies the new primary, and the client would not read the
// topology again; the slot's primary as the client knows it fails or
// redirects it (MOVED), and that makes the client read it. Like rueidis's
// own EXISTS, it is sent again after a connection failure.
func nudgeCommand(c rueidis.Client, key string) rueidis.Completed {
	return c.B().Arbitrary("EXISTS").Keys(key).Build().ToRetryable()
}

// keyIn returns a key in slot (every slot has one among the first few
// hundred thousand numbers).
func keyIn(slot int) string {
	for i := range 1 << 22 {
		if k := "{" + strconv.Itoa(i) + "}"; keyslot.Of(k) == slot {
			return k
		}
	}
	return ""
}

// currentSlots returns the slot map, read again if it was reset (set to
// nil) since it was last read.
func (d *Driver) currentSlots(ctx context.Context) (*slotMap, error) {
	if m := d.slots.Load(); m != nil {
		return m, nil
	}
	m, err := d.readSlots(ctx)
	if err != nil {
		return nil, err
	}
	d.slots.Store(m)
	return m, nil
}

// readSlots asks a node of the cluster for the slot map (CLUSTER SLOTS),
// and matches its primaries with the client's connections to the nodes.
func (d *Driver) readSlots(ctx context.Context) (*slotMap, error) {
	nodes := d.client.Nodes()
	addrs := make([]string, 0, len(nodes))
	for addr := range nodes {
		addrs = append(addrs, addr)
	}
	sort.Strings(addrs)
	if len(addrs) == 0 {
		return nil, fmt.Errorf("dlockrueidis: the cluster client knows no node")
	}
	// Any node will do: ask one, and another each readSlotsHedge that
	// none answered (at once when one fails), as one may be down or
	// stalled; take the first answer. The others are not waited for:
	// rueidis may wait out ctx's deadline for a stalled node, and their
	// goroutines end by then, writing only their own answers, which
	// nobody reads once one answered; when none did, all have ended. Nor
	// are they cancelled, with ctx, once it returns: a request that dials
	// a node's first connection would fail that dial, and with it the
	// requests that wait for the connection: each has a context of its
	// own, with ctx's deadline but not its cancellation.
	type answer struct {
		entries []rueidis.RedisMessage
		err     error
	}
	answers := make([]answer, len(addrs))
	answered := make(chan int, len(addrs))
	deadline, bounded := ctx.Deadline()
	asked := 0
	ask := func() {
		i := asked
		asked++
		go func() {
			ctx := context.WithoutCancel(ctx)
			if bounded {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, deadline)
				defer cancel()
			}
			node := nodes[addrs[i]]
			answers[i].entries, answers[i].err = node.Do(ctx, node.B().ClusterSlots().Build()).ToArray()
			if dlock.ConnectionClosed(answers[i].err) && ctx.Err() == nil {
				// The connection the server had closed (CLIENT KILL, its
				// idle timeout), which rueidis learns of only from a
				// request that fails there, and does not send CLUSTER
				// SLOTS again: once more, on the connection it dials anew.
				answers[i].entries, answers[i].err = node.Do(ctx, node.B().ClusterSlots().Build()).ToArray()
			}
			answered <- i
		}()
	}
	ask()
	hedge := time.NewTimer(readSlotsHedge)
	defer hedge.Stop()
	var entries []rueidis.RedisMessage
	var from string
	for pending := 1; pending > 0 && from == ""; {
		select {
		case i := <-answered:
			pending--
			if answers[i].err == nil {
				entries, from = answers[i].entries, addrs[i]
			} else if asked < len(addrs) {
				ask()
				pending++
			}
		case <-hedge.C:
			if asked < len(addrs) {
				ask()
				pending++
				hedge.Reset(readSlotsHedge)
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("dlockrueidis: CLUSTER SLOTS: no node answered: %w", ctx.Err())
		}
	}
	if from == "" {
		errs := make([]error, len(addrs))
		for i, addr := range addrs {
			errs[i] = fmt.Errorf("CLUSTER SLOTS on %s: %w", addr, answers[i].err)
		}
		return nil, errors.Join(errs...)
	}
	m := &slotMap{nodes: nodes, read: time.Now()}
	defer d.lastSlots.Store(m)
	for _, e := range entries {
		v, err := e.ToArray()
		if err != nil || len(v) < 3 {
			continue
		}
		first, err1 := v[0].AsInt64()
		last, err2 := v[1].AsInt64()
		primary, err3 := v[2].ToArray()
		if err1 != nil || err2 != nil || err3 != nil || len(primary) < 2 {
			continue
		}
		host, _ := primary[0].ToString()
		port, _ := primary[1].AsInt64()
		switch host {
		case "": // the node does not know its address: the one asked does
			host, _, _ = net.SplitHostPort(from)
		case "?":
			continue
		}
		addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
		m.ranges = append(m.ranges, slotRange{int(first), int(last), addr})
	}
	sort.Slice(m.ranges, func(i, j int) bool { return m.ranges[i].first < m.ranges[j].first })
	return m, nil
}

// owner returns the address of the primary that serves slot, or "".
func (m *slotMap) owner(slot int) string {
	i := sort.Search(len(m.ranges), func(i int) bool { return m.ranges[i].last >= slot })
	if i < len(m.ranges) && m.ranges[i].first <= slot {
		return m.ranges[i].addr
	}
	return ""
}

func failAll(calls []*dlock.Call, err error) {
	for _, c := range calls {
		c.Val, c.Err = nil, err
	}
}
