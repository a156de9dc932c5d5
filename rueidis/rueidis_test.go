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
	dlocktest.Run(t, newDriver, dlocktest.Standalone, dlocktest.Cluster, dlocktest.Sentinel)
}

func newDriver(t testing.TB, d dlocktest.Deployment) dlock.Driver {
	opt := rueidis.ClientOption{InitAddress: d.Addrs}
	if d.Topology == dlocktest.Sentinel {
		opt.Sentinel = rueidis.SentinelOption{MasterSet: d.MasterName}
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return dlockrueidis.New(client)
}
