package dlocktest

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/keyslot"
	"github.com/dlockio/dlock/internal/redistest"
)

const (
	// waitFor bounds every wait for something the suite expects to happen.
	waitFor = 10 * time.Second
	// poll is how often a wait on the servers' state looks again.
	poll = 2 * time.Millisecond
	// wakeBeat is dlock's periodic wake of a waiter, documented as "at
	// least twice a second": a waiter that gets in before it was woken by
	// a notice.
	wakeBeat = 500 * time.Millisecond
)

// env is one topology's servers and what the suite knows of them.
type env struct {
	dep       Deployment
	newDriver NewDriver

	primaries []*redistest.Server // the servers that hold the keys
	nodes     []*redistest.Server // primaries and replicas: where a subscriber may be
	sentinels []*redistest.Server

	owner []slotRange // cluster: every primary's slots

	functions bool // clients run their scripts by FCALL (dlock.WithFunctions)
}

// slotRange is a range of cluster slots served by one primary.
type slotRange struct {
	lo, hi int
	srv    *redistest.Server
}

// deploy starts the servers of a topology for the life of t.
func deploy(t *testing.T, top Topology, newDriver NewDriver) *env {
	t.Helper()
	e := &env{dep: Deployment{Topology: top}, newDriver: newDriver}
	switch top {
	case Standalone:
		s := redistest.Start(t)
		e.primaries, e.nodes = []*redistest.Server{s}, []*redistest.Server{s}
		e.dep.Addrs = []string{s.Addr()}
	case Cluster:
		c := redistest.StartCluster(t, 3, 1)
		e.primaries, e.nodes = c.Nodes[:3], c.Nodes // created so: primaries first
		e.dep.Addrs = c.Addrs()
		e.readSlots(t)
	case Sentinel:
		r := redistest.StartReplicated(t, 1, 3)
		e.primaries = []*redistest.Server{r.Primary}
		e.nodes = append([]*redistest.Server{r.Primary}, r.Replicas...)
		e.sentinels = r.Sentinels
		e.dep.Addrs, e.dep.MasterName = r.SentinelAddrs(), r.MasterName
	case Replicated:
		r := redistest.StartReplicated(t, 1, 0)
		e.primaries = []*redistest.Server{r.Primary}
		e.nodes = append([]*redistest.Server{r.Primary}, r.Replicas...)
		e.dep.Addrs = []string{r.Primary.Addr()}
	default:
		t.Fatalf("dlocktest: unknown topology %d", top)
	}
	return e
}

// readSlots learns which primary serves which slots, from each node's own
// line of CLUSTER NODES.
func (e *env) readSlots(t *testing.T) {
	t.Helper()
	for _, n := range e.primaries {
		for _, line := range strings.Split(n.Do(t, "CLUSTER", "NODES"), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 || !strings.Contains(f[2], "myself") {
				continue
			}
			for _, r := range f[8:] {
				lo, hi, ok := strings.Cut(r, "-")
				if !ok {
					hi = lo
				}
				l, err1 := strconv.Atoi(lo)
				h, err2 := strconv.Atoi(hi)
				if err1 != nil || err2 != nil {
					continue // a slot being migrated: not in a fresh cluster
				}
				e.owner = append(e.owner, slotRange{l, h, n})
			}
		}
	}
	for _, key := range []string{"a", "dlock:{orders:42}", "{}x", "x{}{y}", "\xff"} {
		if got := e.primaries[0].Do(t, "CLUSTER", "KEYSLOT", key); got != strconv.Itoa(keyslot.Of(key)) {
			t.Fatalf("dlocktest: slot of %q is %s, computed %d", key, got, keyslot.Of(key))
		}
	}
}

// driver returns a new driver on a client of its own.
func (e *env) driver(t testing.TB) dlock.Driver {
	t.Helper()
	d := e.newDriver(t, e.dep)
	if d == nil {
		t.Fatal("dlocktest: NewDriver returned nil")
	}
	return d
}

// prefix is the key prefix of one test: keys and channels of different
// tests never meet.
func prefix(t testing.TB) string {
	return "dlocktest:" + t.Name() + ":"
}

// client returns a dlock client with the test's prefix on a new driver,
// closed with the test.
func (e *env) client(t testing.TB, opts ...dlock.ClientOption) *dlock.Client {
	t.Helper()
	opts = append([]dlock.ClientOption{dlock.WithPrefix(prefix(t))}, opts...)
	if e.functions {
		opts = append(opts, dlock.WithFunctions())
	}
	c := dlock.New(e.driver(t), opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// primaryOf returns the primary that holds key.
func (e *env) primaryOf(t testing.TB, key string) *redistest.Server {
	t.Helper()
	if e.owner == nil {
		return e.primaries[0]
	}
	slot := keyslot.Of(key)
	for _, r := range e.owner {
		if r.lo <= slot && slot <= r.hi {
			return r.srv
		}
	}
	t.Fatalf("dlocktest: no primary serves slot %d", slot)
	return nil
}

// tagOn returns a hash tag whose slot srv serves.
func (e *env) tagOn(t testing.TB, srv *redistest.Server) string {
	t.Helper()
	for i := 0; i < 1000; i++ {
		tag := "t" + strconv.Itoa(i)
		if e.primaryOf(t, "{"+tag+"}") == srv {
			return tag
		}
	}
	t.Fatalf("dlocktest: no hash tag found for %s", srv.Addr())
	return ""
}

// do runs a command about key on the primary that holds it.
func (e *env) do(t testing.TB, key string, args ...string) string {
	t.Helper()
	return e.primaryOf(t, key).Do(t, args...)
}

// onPrimaries runs a command on every primary.
func (e *env) onPrimaries(t testing.TB, args ...string) {
	t.Helper()
	for _, p := range e.primaries {
		p.Do(t, args...)
	}
}

// allowOnlyChannels lets the default user listen only on the channels
// under prefix(t)+"allowed:", on every node, until the test ends.
func (e *env) allowOnlyChannels(t testing.TB) {
	t.Helper()
	for _, n := range e.nodes {
		n.Do(t, "ACL", "SETUSER", "default", "resetchannels", "&"+prefix(t)+"allowed:*")
	}
	t.Cleanup(func() {
		for _, n := range e.nodes {
			n.Do(t, "ACL", "SETUSER", "default", "allchannels")
		}
	})
}

// calls returns how many times the primaries ran cmd since the last CONFIG
// RESETSTAT.
func (e *env) calls(t testing.TB, cmd string) int {
	t.Helper()
	return e.cmdstat(t, cmd, "calls")
}

// cmdstat returns field (calls, failed_calls, ...) of the INFO
// commandstats of command cmd, summed over the primaries.
func (e *env) cmdstat(t testing.TB, cmd, field string) int {
	t.Helper()
	total := 0
	for _, p := range e.primaries {
		total += p.CommandStat(t, cmd, field)
	}
	return total
}

// numsub returns how many connections are subscribed to channel, over all
// the nodes.
func (e *env) numsub(t testing.TB, channel string) int {
	t.Helper()
	total := 0
	for _, n := range e.nodes {
		r := strings.Split(n.Do(t, "PUBSUB", "NUMSUB", channel), "\n")
		if len(r) == 2 {
			k, _ := strconv.Atoi(r[1])
			total += k
		}
	}
	return total
}

// awaitNumsub waits until want connections are subscribed to channel.
func (e *env) awaitNumsub(t testing.TB, channel string, want int) {
	t.Helper()
	await(t, fmt.Sprintf("%d subscribers of %q", want, channel), func() bool {
		return e.numsub(t, channel) == want
	})
}

// publish publishes payload on channel; in a cluster PUBLISH reaches every
// node, through the cluster bus.
func (e *env) publish(t testing.TB, channel, payload string) {
	t.Helper()
	e.primaries[0].Do(t, "PUBLISH", channel, payload)
}

// subscriber is a pub/sub connection on one node.
type subscriber struct {
	srv *redistest.Server
	id  string
}

// subscribers returns the connections in pub/sub mode on every node, but
// those of the sentinels (named sentinel-…), which the suite leaves alone.
func (e *env) subscribers(t testing.TB) []subscriber {
	t.Helper()
	var out []subscriber
	for _, n := range e.nodes {
		for _, line := range strings.Split(n.Do(t, "CLIENT", "LIST", "TYPE", "pubsub"), "\n") {
			var id, name string
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, "id="); ok {
					id = v
				}
				if v, ok := strings.CutPrefix(f, "name="); ok {
					name = v
				}
			}
			if id != "" && !strings.HasPrefix(name, "sentinel-") {
				out = append(out, subscriber{n, id})
			}
		}
	}
	return out
}

// await polls cond until it holds, or fails t after waitFor.
func await(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(waitFor); !cond(); time.Sleep(poll) {
		if time.Now().After(deadline) {
			t.Fatalf("dlocktest: no %s within %v", what, waitFor)
		}
	}
}

// receive waits for a value on ch, or fails t after waitFor.
func receive[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		t.Fatalf("dlocktest: no %s within %v", what, waitFor)
	}
	var zero T
	return zero
}

// timeout returns a context that ends after waitFor, cancelled with the
// test.
func timeout(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	t.Cleanup(cancel)
	return ctx
}

// opening returns a context for opening a subscription, or subscribing
// channels, and its cancel, which the caller calls as soon as the call
// returns, as dlock does: the context bounds the call only, and the
// subscription lives on, reconnecting too, once it has ended (see
// dlock.Driver.Subscribe).
func opening() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), waitFor)
}

// goroutineID returns the id of the calling goroutine.
func goroutineID() uint64 {
	var buf [64]byte
	s := strings.TrimPrefix(string(buf[:runtime.Stack(buf[:], false)]), "goroutine ")
	id, _ := strconv.ParseUint(s[:strings.IndexByte(s, ' ')], 10, 64)
	return id
}

// goroutineAlive reports whether the goroutine with that id still runs.
func goroutineAlive(id uint64) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Contains("\n\n"+string(buf), fmt.Sprintf("\n\ngoroutine %d [", id))
}
