// Package dlocktest is the conformance suite of dlock's drivers: every
// implementation of dlock.Driver runs it, against real redis-server
// processes, and so shows that dlock behaves the same over it as over any
// other driver.
//
//	func TestConformance(t *testing.T) {
//		dlocktest.Run(t, func(t testing.TB, d dlocktest.Deployment) dlock.Driver {
//			rdb := redis.NewClient(&redis.Options{Addr: d.Addrs[0], ContextTimeoutEnabled: true})
//			t.Cleanup(func() { _ = rdb.Close() })
//			return goredis.New(rdb)
//		}, dlocktest.Standalone)
//	}
//
// The suite checks the driver's side of the contract directly (script
// replies of every shape, error replies and the server's refusals with its
// own text, the EVALSHA fallback after SCRIPT FLUSH (each script's text
// sent once per server for a pipeline of many calls), pipelined batches,
// ended contexts, pub/sub delivery, reconnection after the opening's
// context has ended (and the notify("", "") that says so; see
// dlock.Subscription) and Close, SCAN, scripts and WAIT on one connection
// (the least acknowledgement of several primaries), a failed connection
// and a deadline that passes during a call) and then dlock's
// primitives through dlock.New(driver): locks on one and several names,
// refusal of foreign data, waiting woken by a release, auto-refresh and
// loss notification, inspection, fenced writes, and acquires confirmed on
// replicas; and all of those again with dlock.WithFunctions, by FCALL.
//
// A driver with shard channels (dlock.ShardedSubscriber) is checked on a
// cluster too for a channel let go and subscribed again at once (the reply
// to its SUNSUBSCRIBE is no slot move), and also runs
// RunShardedResilience, which fails over, moves slots and pauses primaries
// under its subscriptions, and checks that the driver says when it has
// subscribed a channel anew.
//
// A driver for Sentinel also runs RunSentinelFailover, which fails
// primaries over under auto-refreshed locks and waiting callers.
//
// Run starts the servers itself (see Topology) and needs redis-server,
// redis-cli and, for Sentinel, redis-sentinel on PATH; without them the
// tests fail with a message saying how to install them.
package dlocktest

import (
	"testing"

	"github.com/dlockio/dlock"
)

// Topology is a kind of Redis deployment that Run tests a driver on.
type Topology int

// The topologies. Each is started once per Run, on free loopback ports.
const (
	// Standalone is a single redis-server.
	Standalone Topology = iota
	// Cluster is a Redis Cluster of three primaries with a replica each.
	Cluster
	// Sentinel is a primary with one replica, watched by three sentinels
	// that know it as "mymaster".
	Sentinel
	// Replicated is a primary with one replica and no sentinels, for
	// drivers that talk to one server and can confirm writes on replicas
	// (dlock.Replicator).
	Replicated
)

// String returns the topology's name, as its subtests are named.
func (t Topology) String() string {
	switch t {
	case Standalone:
		return "standalone"
	case Cluster:
		return "cluster"
	case Sentinel:
		return "sentinel"
	case Replicated:
		return "replicated"
	}
	return "unknown"
}

// Deployment tells a driver factory where the Redis deployment under test
// is.
type Deployment struct {
	// Topology is the kind of deployment.
	Topology Topology
	// Addrs are host:port addresses: the server (Standalone), every node
	// (Cluster), the sentinels (Sentinel), or the primary (Replicated).
	Addrs []string
	// MasterName is the name the sentinels know the primary by (Sentinel
	// only).
	MasterName string
}

// NewDriver returns a driver over a Redis client of its own for the
// deployment d: its own connections, as another process would have. The
// suite calls it many times, also to stand for several processes in one
// test. It must close its client in a cleanup registered on t, after which
// the suite no longer uses the driver, and it may fail t.
type NewDriver func(t testing.TB, d Deployment) dlock.Driver

// Run runs the conformance suite for the drivers newDriver makes, once on
// each of the topologies (Standalone if none are given), each in a subtest
// named after it, the topologies in parallel (so Run returns before they
// do: put nothing after it that expects them done). Within a topology the
// tests run one after the other on servers of their own, in about four
// seconds; starting the servers takes a fraction of a second for
// Standalone and a few seconds for Cluster and Sentinel.
//
// Without dlock.Scanner, dlock's List fails with dlock.ErrUnsupported, and
// without dlock.Replicator, WithReplicas does: the suite checks that. A
// driver whose Subscribe returns dlock.ErrUnsupported skips the pub/sub
// tests, and its waiters are let in by polling; one that ignores Call.Lib
// skips the test that counts FCALLs. One without dlock.Partitioned skips
// the tests that hold up one primary's requests on a cluster.
func Run(t *testing.T, newDriver NewDriver, topologies ...Topology) {
	t.Helper()
	if newDriver == nil {
		t.Fatal("dlocktest: Run with a nil NewDriver")
	}
	if len(topologies) == 0 {
		topologies = []Topology{Standalone}
	}
	for _, top := range topologies {
		t.Run(top.String(), func(t *testing.T) {
			t.Parallel()
			e := deploy(t, top, newDriver)
			for _, g := range groups {
				e.functions = g.functions
				t.Run(g.name, func(t *testing.T) {
					for _, tc := range g.tests {
						if tc.only != nil && !tc.only(e) {
							continue
						}
						t.Run(tc.name, func(t *testing.T) { tc.run(t, e) })
					}
				})
			}
		})
	}
}

// test is one conformance test.
type test struct {
	name string
	run  func(t *testing.T, e *env)
	only func(e *env) bool // when it applies; nil for always
}

// group is a named set of tests, run as one subtest.
type group struct {
	name      string
	tests     []test
	functions bool // the clients use dlock.WithFunctions
}

// groups is the whole suite, in the order it runs.
var groups = []group{
	{"Eval", evalTests, false},
	{"Subscribe", subscribeTests, false},
	{"SubscribeSharded", shardedTests, false},
	{"Scan", scanTests, false},
	{"Lock", lockTests, false},
	{"Replicas", replicaTests, false},
	{"Functions", functionTests, true},
}

// onCluster limits a test to the Cluster topology.
func onCluster(e *env) bool { return e.dep.Topology == Cluster }

// onStandalone limits a test to the Standalone topology.
func onStandalone(e *env) bool { return e.dep.Topology == Standalone }
