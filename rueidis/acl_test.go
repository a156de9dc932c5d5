package dlockrueidis_test

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/redistest"
	dlockrueidis "github.com/dlockio/dlock/rueidis"
	"github.com/redis/rueidis"
)

// readmeACL returns the rules of the ACL user the core's README shows, and
// those it adds on a Redis Cluster.
func readmeACL(t *testing.T) (rules, cluster []string) {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile("(?m)^ACL SETUSER locker (.*)$").FindSubmatch(readme)
	more := regexp.MustCompile("`(\\+cluster\\|slots [^`]*)`").FindSubmatch(readme)
	if line == nil || more == nil {
		t.Fatal("the README shows no ACL user, or no additions for a cluster")
	}
	return strings.Fields(string(line[1])), strings.Fields(string(more[1]))
}

// TestTheREADMEsACLUser: over rueidis too, the README's ACL user takes,
// waits for (woken by a notice) and releases locks on a single server
// (ForceSingleClient: rueidis would ask CLUSTER SLOTS there) and, with the
// README's additions, on a cluster, with no command refused.
func TestTheREADMEsACLUser(t *testing.T) {
	rules, clusterRules := readmeACL(t)
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		srv.Do(t, append([]string{"ACL", "SETUSER", "locker"}, rules...)...)
		lockAsTheACLUser(t, rueidis.ClientOption{InitAddress: []string{srv.Addr()}, ForceSingleClient: true}, []*redistest.Server{srv})
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3, 0)
		for _, n := range c.Nodes {
			n.Do(t, append(append([]string{"ACL", "SETUSER", "locker"}, rules...), clusterRules...)...)
		}
		lockAsTheACLUser(t, rueidis.ClientOption{InitAddress: c.Addrs()[:1]}, c.Nodes)
	})
}

// lockAsTheACLUser takes and waits for locks as the user locker, over a
// client with options opt and those the README says the user needs (no
// client-side cache, whose CLIENT TRACKING it may not run), and checks that
// no node's ACL LOG has an entry.
func lockAsTheACLUser(t *testing.T, opt rueidis.ClientOption, nodes []*redistest.Server) {
	opt.Username, opt.Password, opt.DisableCache = "locker", "s3cret", true
	client, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	c := dlock.New(dlockrueidis.New(client))
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, name := range []string{"job-a", "job-b", "job-c", "job-d"} {
		l, err := c.TryLock(ctx, name)
		if err != nil {
			t.Fatalf("TryLock(%q): %v", name, err)
		}
		refused := make(chan struct{})
		got := make(chan error, 1)
		go func() {
			w, err := c.Lock(ctx, name, dlock.WithOnRetry(func(n int, _ error) {
				if n == 1 {
					close(refused)
				}
			}))
			if err == nil {
				err = w.Release(ctx)
			}
			got <- err
		}()
		select {
		case <-refused:
		case err := <-got:
			t.Fatalf("Lock(%q) returned before it waited: %v", name, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release(%q): %v", name, err)
		}
		if err := <-got; err != nil {
			t.Errorf("the waiter for %q: %v", name, err)
		}
	}
	if infos, err := c.List(ctx, "job-*"); err != nil {
		t.Errorf("List = %v, %v", infos, err)
	}
	for _, n := range nodes {
		if log := n.Do(t, "ACL", "LOG"); log != "" {
			t.Errorf("ACL LOG of %s:\n%s", n.Addr(), log)
		}
	}
}
