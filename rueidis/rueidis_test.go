package dlockrueidis_test

import (
	"testing"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/dlocktest"
	"github.com/dlockio/dlock/internal/redistest"
	dlockrueidis "github.com/dlockio/dlock/rueidis"
	"github.com/redis/rueidis"
)

func TestMain(m *testing.M) { redistest.VerifyNoLeaks(m) }

// TestConformance runs the driver conformance suite over a rueidis client
// on a single node, a cluster, and a primary found through the sentinels.
func TestConformance(t *testing.T) {
	dlocktest.Run(t, newDriver(rueidis.ClientOption{}),
		dlocktest.Standalone, dlocktest.Cluster, dlocktest.Sentinel)
}

// TestConformanceRESP2 runs it over a client that speaks RESP2, as rueidis
// does with Redis 5 or AlwaysRESP2: replies and pub/sub take other paths.
func TestConformanceRESP2(t *testing.T) {
	dlocktest.Run(t, newDriver(rueidis.ClientOption{AlwaysRESP2: true, DisableCache: true}),
		dlocktest.Standalone)
}

// newDriver makes drivers over clients with the options opt, on the
// deployment's addresses.
func newDriver(opt rueidis.ClientOption) dlocktest.NewDriver {
	return func(t testing.TB, d dlocktest.Deployment) dlock.Driver {
		opt := opt
		opt.InitAddress = d.Addrs
		switch d.Topology {
		case dlocktest.Cluster:
			// One seed: with several, rueidis may refresh the topology
			// while it still dials the other seeds, and then closes the
			// extra connections 5s later from a goroutine of its own,
			// which would outlive the tests.
			opt.InitAddress = d.Addrs[:1]
		case dlocktest.Sentinel:
			opt.Sentinel = rueidis.SentinelOption{MasterSet: d.MasterName}
		}
		client, err := rueidis.NewClient(opt)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(client.Close)
		return dlockrueidis.New(client)
	}
}
