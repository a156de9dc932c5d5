package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
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

// PrimaryOf returns the node that serves the slot of key: the running node
// whose own line of CLUSTER NODES names it a primary of that slot. It fails
// tb if no running node does.
func (c *Cluster) PrimaryOf(tb testing.TB, key string) *Server {
	tb.Helper()
	slot := c.keySlot(tb, key)
	for _, n := range c.running(nil) {
		r, err := n.do("CLUSTER", "NODES")
		if err != nil {
			continue
		}
		for _, f := range nodeLines(r.text()) {
			if strings.Contains(f[2], "myself") && strings.Contains(f[2], "master") && servesSlot(f, slot) {
				return n
			}
		}
	}
	tb.Fatalf("redistest: no running node serves slot %d (key %q)", slot, key)
	return nil
}

// ChannelOn returns a shard channel, "dlock:{" + base + a number +
// "}:w:test", whose slot srv serves. It fails tb if none of the first
// thousand does.
func (c *Cluster) ChannelOn(tb testing.TB, srv *Server, base string) string {
	tb.Helper()
	for i := range 1000 {
		ch := "dlock:{" + base + strconv.Itoa(i) + "}:w:test"
		if c.PrimaryOf(tb, ch) == srv {
			return ch
		}
	}
	tb.Fatalf("redistest: no channel on %s", srv.Addr())
	return ""
}

// MoveEmptySlot moves the slot of key, which must hold no key, from its
// primary to the primary to (IMPORTING, MIGRATING, then NODE on every
// node), as a resharding does without MIGRATE. It returns the old primary.
func (c *Cluster) MoveEmptySlot(tb testing.TB, key string, to *Server) *Server {
	tb.Helper()
	from := c.PrimaryOf(tb, key)
	slot := from.Do(tb, "CLUSTER", "KEYSLOT", key)
	fromID, toID := from.Do(tb, "CLUSTER", "MYID"), to.Do(tb, "CLUSTER", "MYID")
	to.Do(tb, "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID)
	from.Do(tb, "CLUSTER", "SETSLOT", slot, "MIGRATING", toID)
	for _, n := range append([]*Server{to, from}, c.Nodes...) {
		n.Do(tb, "CLUSTER", "SETSLOT", slot, "NODE", toID)
	}
	return from
}

// PublishUntilReceived publishes payload on shard channel ch of srv
// (SPUBLISH) until got yields it, as a subscriber may still be subscribing,
// for at most 15s; other payloads on got are skipped.
func PublishUntilReceived(tb testing.TB, srv *Server, ch, payload string, got <-chan string) {
	tb.Helper()
	publishUntilReceived(tb, srv, "SPUBLISH", ch, payload, got)
}

// PlainPublishUntilReceived is PublishUntilReceived for a channel of
// SUBSCRIBE: it PUBLISHes.
func PlainPublishUntilReceived(tb testing.TB, srv *Server, ch, payload string, got <-chan string) {
	tb.Helper()
	publishUntilReceived(tb, srv, "PUBLISH", ch, payload, got)
}

func publishUntilReceived(tb testing.TB, srv *Server, cmd, ch, payload string, got <-chan string) {
	tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		srv.Do(tb, cmd, ch, payload)
		select {
		case p := <-got:
			if p == payload {
				return
			}
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: %q published on %s not received within 15s", payload, srv.Addr())
		}
	}
}

// ReplicasOf returns the running nodes that report, in INFO replication,
// that they replicate primary.
func (c *Cluster) ReplicasOf(tb testing.TB, primary *Server) []*Server {
	tb.Helper()
	var replicas []*Server
	for _, n := range c.running(primary) {
		r, err := n.do("INFO", "replication")
		if err != nil {
			tb.Fatalf("redistest: %s: INFO replication: %v", n.Addr(), err)
		}
		info := r.text()
		if role, _ := infoField(info, "role"); role != "slave" {
			continue
		}
		if port, _ := infoField(info, "master_port"); port == strconv.Itoa(primary.Port()) {
			replicas = append(replicas, n)
		}
	}
	return replicas
}

// AwaitFailover waits until the cluster has replaced old, the primary of
// key's slot, which the test killed or paused: until every running node
// but old reports cluster_state:ok and names the same node, a running node
// other than old, the primary of that slot, and that node reports
// role:master. It returns the new primary, and fails tb with what was
// still missing if that does not happen within timeout. With the
// --cluster-node-timeout of StartCluster (2s) it takes about 3 to 5s.
func (c *Cluster) AwaitFailover(tb testing.TB, key string, old *Server, timeout time.Duration) *Server {
	tb.Helper()
	slot := c.keySlot(tb, key, old)
	deadline := time.Now().Add(timeout)
	for {
		next, problem := c.failoverProblem(slot, old)
		if problem == "" {
			return next
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: slot %d not failed over from %s within %v: %s", slot, old.Addr(), timeout, problem)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// failoverProblem returns the new primary of slot, or what stops the
// cluster from agreeing on one other than old.
func (c *Cluster) failoverProblem(slot int, old *Server) (*Server, string) {
	byAddr := map[string]*Server{}
	for _, n := range c.Nodes {
		byAddr[n.Addr()] = n
	}
	var next *Server
	for _, n := range c.running(old) {
		r, err := n.do("CLUSTER", "INFO")
		if err != nil {
			return nil, fmt.Sprintf("%s: CLUSTER INFO: %v", n.Addr(), err)
		}
		if v, _ := infoField(r.text(), "cluster_state"); v != "ok" {
			return nil, fmt.Sprintf("%s: cluster_state:%s", n.Addr(), v)
		}
		r, err = n.do("CLUSTER", "NODES")
		if err != nil {
			return nil, fmt.Sprintf("%s: CLUSTER NODES: %v", n.Addr(), err)
		}
		var serving *Server
		for _, f := range nodeLines(r.text()) {
			if servesSlot(f, slot) && strings.Contains(f[2], "master") && !strings.Contains(f[2], "fail") {
				addr, _, _ := strings.Cut(f[1], "@")
				serving = byAddr[addr]
			}
		}
		switch {
		case serving == nil:
			return nil, fmt.Sprintf("%s: no healthy node of the cluster serves slot %d", n.Addr(), slot)
		case serving == old:
			return nil, fmt.Sprintf("%s: %s still serves slot %d", n.Addr(), old.Addr(), slot)
		case next != nil && serving != next:
			return nil, fmt.Sprintf("%s: %s serves slot %d, not %s", n.Addr(), serving.Addr(), slot, next.Addr())
		}
		next = serving
	}
	if next == nil {
		return nil, "no running node"
	}
	r, err := next.do("INFO", "replication")
	if err != nil {
		return nil, fmt.Sprintf("%s: INFO replication: %v", next.Addr(), err)
	}
	if role, _ := infoField(r.text(), "role"); role != "master" {
		return nil, fmt.Sprintf("%s: role:%s", next.Addr(), role)
	}
	return next, ""
}

// AwaitReplica waits until replica replicates primary and receives its
// stream (the primary lists it as online, so WAIT counts it), for example
// after a primary that was replaced by a failover was restarted and
// rejoined the cluster. It fails tb with what was still missing if that
// does not happen within timeout. Unlike StartCluster, it writes nothing.
func (c *Cluster) AwaitReplica(tb testing.TB, replica, primary *Server, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		problem := replicaProblem(replica, primary)
		if problem == "" {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: %s not a replica of %s within %v: %s\n%s",
				replica.Addr(), primary.Addr(), timeout, problem, replica.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// replicaProblem returns what stops replica from being an online replica
// of primary, or "".
func replicaProblem(replica, primary *Server) string {
	r, err := replica.do("INFO", "replication")
	if err != nil {
		return fmt.Sprintf("%s: INFO replication: %v", replica.Addr(), err)
	}
	info := r.text()
	if role, _ := infoField(info, "role"); role != "slave" {
		return fmt.Sprintf("%s: role:%s", replica.Addr(), role)
	}
	if port, _ := infoField(info, "master_port"); port != strconv.Itoa(primary.Port()) {
		return fmt.Sprintf("%s: master_port:%s", replica.Addr(), port)
	}
	if v, _ := infoField(info, "master_link_status"); v != "up" {
		return fmt.Sprintf("%s: master_link_status:%s", replica.Addr(), v)
	}
	r, err = primary.do("INFO", "replication")
	if err != nil {
		return fmt.Sprintf("%s: INFO replication: %v", primary.Addr(), err)
	}
	// Lines such as slave0:ip=127.0.0.1,port=7001,state=online,offset=...
	for _, line := range strings.Split(r.text(), "\n") {
		_, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(line, "slave") || !strings.Contains(v, ",port="+strconv.Itoa(replica.Port())+",") {
			continue
		}
		if !strings.Contains(v, ",state=online,") {
			return fmt.Sprintf("%s: replica %s", primary.Addr(), v)
		}
		return ""
	}
	return fmt.Sprintf("%s does not list %s as a replica", primary.Addr(), replica.Addr())
}

// keySlot returns the slot of key, asking a running node but skip.
func (c *Cluster) keySlot(tb testing.TB, key string, skip ...*Server) int {
	tb.Helper()
	var errs []string
	for _, n := range c.running(skip...) {
		r, err := n.do("CLUSTER", "KEYSLOT", key)
		if err != nil {
			errs = append(errs, n.Addr()+": "+err.Error())
			continue
		}
		slot, err := strconv.Atoi(r.text())
		if err != nil {
			tb.Fatalf("redistest: %s: CLUSTER KEYSLOT %q = %q", n.Addr(), key, r.text())
		}
		return slot
	}
	tb.Fatalf("redistest: no running node answers CLUSTER KEYSLOT: %s", strings.Join(errs, "; "))
	return 0
}

// running returns the nodes whose process is running, but skip.
func (c *Cluster) running(skip ...*Server) []*Server {
	var nodes []*Server
	for _, n := range c.Nodes {
		if !slices.Contains(skip, n) && n.running() {
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// nodeLines splits a CLUSTER NODES reply into the fields of each line,
// leaving out malformed lines.
func nodeLines(text string) [][]string {
	var lines [][]string
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		if f := strings.Fields(line); len(f) >= 8 {
			lines = append(lines, f)
		}
	}
	return lines
}

// servesSlot reports whether the CLUSTER NODES line f lists slot among its
// slots ("5461-10922" or "42"; slots being migrated, in brackets, do not
// count).
func servesSlot(f []string, slot int) bool {
	for _, r := range f[8:] {
		lo, hi, ok := strings.Cut(r, "-")
		if !ok {
			hi = lo
		}
		l, err1 := strconv.Atoi(lo)
		h, err2 := strconv.Atoi(hi)
		if err1 == nil && err2 == nil && l <= slot && slot <= h {
			return true
		}
	}
	return false
}
