package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	// clusterReadyTimeout bounds the wait for a created cluster to settle.
	clusterReadyTimeout = 30 * time.Second
	// clusterCreateTimeout bounds `redis-cli --cluster create`.
	clusterCreateTimeout = 30 * time.Second
)

// Cluster is a Redis Cluster started by StartCluster.
type Cluster struct {
	// Nodes are all nodes in the order they were started and passed to
	// `redis-cli --cluster create`, which makes the first ones primaries and
	// the rest replicas. Roles change after a failover; ask the nodes.
	Nodes []*Server
}

// StartCluster starts primaries*(1+replicasPerPrimary) cluster nodes
// (--cluster-enabled yes, --cluster-node-timeout 2000, the cluster config
// file in each node's directory) on ports p whose bus port p+10000 is also
// free, creates the cluster with `redis-cli --cluster create` and waits
// until every node reports cluster_state:ok, knows every node, and every
// replica is linked to its primary and receives its replication stream (at
// most 30s). Redis Cluster needs at
// least 3 primaries.
func StartCluster(tb testing.TB, primaries, replicasPerPrimary int) *Cluster {
	tb.Helper()
	if primaries < 3 || replicasPerPrimary < 0 {
		tb.Fatalf("redistest: StartCluster(%d, %d): need at least 3 primaries and no negative replicas",
			primaries, replicasPerPrimary)
	}
	cli := lookBinary(tb, "redis-cli")
	c := &Cluster{}
	total := primaries * (1 + replicasPerPrimary)
	for range total {
		c.Nodes = append(c.Nodes, startServer(tb, true, func(s *Server) ([]string, error) {
			return []string{
				"--port", strconv.Itoa(s.port),
				"--bind", "127.0.0.1",
				"--dir", s.dir,
				"--logfile", s.logPath,
				"--daemonize", "no",
				"--save", "",
				"--appendonly", "no",
				"--repl-diskless-sync-delay", "0",
				"--cluster-enabled", "yes",
				"--cluster-node-timeout", "2000",
				"--cluster-config-file", "nodes.conf", // relative to --dir
			}, nil
		}))
	}

	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerPrimary), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), clusterCreateTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}

	c.wait(tb, primaries, primaries*replicasPerPrimary)
	return c
}

// wait waits until every node reports the cluster ok with all nodes known
// and healthy and all replicas linked.
func (c *Cluster) wait(tb testing.TB, primaries, replicas int) {
	tb.Helper()
	deadline := time.Now().Add(clusterReadyTimeout)
	for {
		problem := c.problem(primaries, replicas)
		if problem == "" {
			c.waitStreaming(tb, deadline)
			return
		}
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, n := range c.Nodes {
				logs.WriteString(n.logTail())
			}
			tb.Fatalf("redistest: cluster not ready within %v: %s\n%s", clusterReadyTimeout, problem, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// problem returns what is not ready in the cluster yet, or "".
func (c *Cluster) problem(primaries, replicas int) string {
	linked := 0
	for _, n := range c.Nodes {
		r, err := n.do("CLUSTER", "INFO")
		if err != nil {
			return fmt.Sprintf("%s: CLUSTER INFO: %v", n.Addr(), err)
		}
		info := r.text()
		if v, _ := infoField(info, "cluster_state"); v != "ok" {
			return fmt.Sprintf("%s: cluster_state:%s", n.Addr(), v)
		}
		if v, _ := infoField(info, "cluster_known_nodes"); v != strconv.Itoa(len(c.Nodes)) {
			return fmt.Sprintf("%s: cluster_known_nodes:%s, want %d", n.Addr(), v, len(c.Nodes))
		}
		if v, _ := infoField(info, "cluster_size"); v != strconv.Itoa(primaries) {
			return fmt.Sprintf("%s: cluster_size:%s, want %d", n.Addr(), v, primaries)
		}

		r, err = n.do("CLUSTER", "NODES")
		if err != nil {
			return fmt.Sprintf("%s: CLUSTER NODES: %v", n.Addr(), err)
		}
		seenReplicas := 0
		for _, line := range strings.Split(strings.TrimSpace(r.text()), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 {
				return fmt.Sprintf("%s: malformed CLUSTER NODES line %q", n.Addr(), line)
			}
			flags := f[2]
			for _, bad := range []string{"handshake", "fail", "noaddr"} {
				if strings.Contains(flags, bad) {
					return fmt.Sprintf("%s: node %s has flags %s", n.Addr(), f[1], flags)
				}
			}
			if strings.Contains(flags, "slave") {
				seenReplicas++
			}
			if f[7] != "connected" {
				return fmt.Sprintf("%s: node %s link is %s", n.Addr(), f[1], f[7])
			}
		}
		if seenReplicas != replicas {
			return fmt.Sprintf("%s: sees %d replicas, want %d", n.Addr(), seenReplicas, replicas)
		}

		r, err = n.do("INFO", "replication")
		if err != nil {
			return fmt.Sprintf("%s: INFO replication: %v", n.Addr(), err)
		}
		if role, _ := infoField(r.text(), "role"); role == "slave" {
			if v, _ := infoField(r.text(), "master_link_status"); v != "up" {
				return fmt.Sprintf("%s: master_link_status:%s", n.Addr(), v)
			}
			linked++
		}
	}
	if linked != replicas {
		return fmt.Sprintf("%d replicas linked, want %d", linked, replicas)
	}
	return ""
}

// Addrs returns the addresses of all nodes, in the order of Nodes.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, 0, len(c.Nodes))
	for _, n := range c.Nodes {
		addrs = append(addrs, n.Addr())
	}
	return addrs
}

// waitStreaming makes sure every primary's replication stream reaches its
// replicas; see the function waitStreaming.
func (c *Cluster) waitStreaming(tb testing.TB, deadline time.Time) {
	tb.Helper()
	byAddr := map[string]*Server{}
	for _, n := range c.Nodes {
		byAddr[n.Addr()] = n
	}
	replicasOf := map[*Server][]*Server{}
	var order []*Server
	for _, n := range c.Nodes {
		r, err := n.do("INFO", "replication")
		if err != nil {
			tb.Fatalf("redistest: %s: INFO replication: %v", n.Addr(), err)
		}
		if role, _ := infoField(r.text(), "role"); role != "slave" {
			continue
		}
		host, _ := infoField(r.text(), "master_host")
		port, _ := infoField(r.text(), "master_port")
		p := byAddr[net.JoinHostPort(host, port)]
		if p == nil {
			tb.Fatalf("redistest: replica %s replicates %s:%s, which is not a node of the cluster", n.Addr(), host, port)
		}
		if replicasOf[p] == nil {
			order = append(order, p)
		}
		replicasOf[p] = append(replicasOf[p], n)
	}
	for _, p := range order {
		waitStreaming(tb, p, replicasOf[p], deadline)
	}
}
