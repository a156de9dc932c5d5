package redistest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	// replicaLinkTimeout bounds the wait for replicas to link to the primary.
	replicaLinkTimeout = 10 * time.Second
	// sentinelDiscoveryTimeout bounds the wait for sentinels to discover the
	// replicas and each other.
	sentinelDiscoveryTimeout = 20 * time.Second
)

// Replicated is a primary with replicas, optionally watched by sentinels,
// started by StartReplicated.
type Replicated struct {
	// Primary is the server started as the primary. After a failover it may
	// no longer be the primary; ask CurrentPrimary.
	Primary *Server
	// Replicas are the servers started as replicas of Primary.
	Replicas []*Server
	// Sentinels are the redis-sentinel processes monitoring Primary.
	Sentinels []*Server
	// MasterName is the name the sentinels monitor the primary under,
	// "mymaster".
	MasterName string
}

// StartReplicated starts a primary, the given number of replicas (started
// with --replicaof) and sentinels. It waits until every replica reports
// master_link_status:up and receives the primary's replication stream (so a
// write on the primary reaches the replicas at once), and, if there are sentinels, until every sentinel
// sees the primary, all replicas and all other sentinels (at most 20s). The
// sentinels monitor the primary as "mymaster" with quorum sentinels/2+1,
// down-after-milliseconds 1000 and failover-timeout 5000.
func StartReplicated(tb testing.TB, replicas, sentinels int) *Replicated {
	tb.Helper()
	if replicas < 0 || sentinels < 0 {
		tb.Fatalf("redistest: StartReplicated(%d, %d): negative count", replicas, sentinels)
	}
	r := &Replicated{MasterName: "mymaster"}
	r.Primary = Start(tb)
	for range replicas {
		r.Replicas = append(r.Replicas, Start(tb,
			WithArgs("--replicaof", "127.0.0.1", strconv.Itoa(r.Primary.Port()))))
	}
	waitReplicasLinked(tb, r.Primary, r.Replicas, replicaLinkTimeout)

	if sentinels == 0 {
		return r
	}
	bin := lookBinary(tb, "redis-sentinel")
	quorum := sentinels/2 + 1
	for range sentinels {
		r.Sentinels = append(r.Sentinels, startSentinel(tb, bin, r.MasterName, r.Primary.Addr(), quorum))
	}
	r.waitSentinels(tb, replicas, sentinels)
	return r
}

// startSentinel starts a redis-sentinel with a generated, writable
// configuration that monitors primary as name.
func startSentinel(tb testing.TB, bin, name, primary string, quorum int) *Server {
	tb.Helper()
	host, port, err := net.SplitHostPort(primary)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return startProcess(tb, bin, "sentinel.log", false, func(s *Server) ([]string, error) {
		conf := filepath.Join(s.dir, "sentinel.conf")
		text := strings.Join([]string{
			"port " + strconv.Itoa(s.port),
			"bind 127.0.0.1",
			"daemonize no",
			"dir " + s.dir,
			"logfile " + s.logPath,
			fmt.Sprintf("sentinel monitor %s %s %s %d", name, host, port, quorum),
			fmt.Sprintf("sentinel down-after-milliseconds %s 1000", name),
			fmt.Sprintf("sentinel failover-timeout %s 5000", name),
			fmt.Sprintf("sentinel parallel-syncs %s 1", name),
			"",
		}, "\n")
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return nil, err
		}
		return []string{conf}, nil
	})
}

// waitReplicasLinked waits until every replica reports
// master_link_status:up and then, with waitStreaming, until the primary's
// replication stream reaches it.
func waitReplicasLinked(tb testing.TB, primary *Server, replicas []*Server, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	waitLinkUp(tb, replicas, deadline)
	waitStreaming(tb, primary, replicas, deadline)
}

// waitLinkUp waits until every replica reports master_link_status:up.
func waitLinkUp(tb testing.TB, replicas []*Server, deadline time.Time) {
	tb.Helper()
	for _, s := range replicas {
		var status string
		for {
			r, err := s.do("INFO", "replication")
			if err == nil {
				status, _ = infoField(r.text(), "master_link_status")
				if status == "up" {
					break
				}
			} else {
				status = err.Error()
			}
			if time.Now().After(deadline) {
				tb.Fatalf("redistest: replica %s not linked to its primary in time (master_link_status: %s)\n%s",
					s.Addr(), status, s.logTail())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// waitStreaming makes sure the replication stream of primary reaches every
// replica. A replica reports master_link_status:up once it has loaded the
// primary's snapshot, but after a diskless sync the primary only starts
// streaming writes to it after the replica's next REPLCONF ACK, which can
// take up to a second; a write made before that reaches the replica late. So
// this sends a write that always propagates (FLUSHALL, on the still empty
// dataset) and waits until every replica has processed the primary's
// replication offset.
func waitStreaming(tb testing.TB, primary *Server, replicas []*Server, deadline time.Time) {
	tb.Helper()
	if len(replicas) == 0 {
		return
	}
	if _, err := primary.do("FLUSHALL"); err != nil {
		tb.Fatalf("redistest: %s: FLUSHALL: %v", primary.Addr(), err)
	}
	r, err := primary.do("INFO", "replication")
	if err != nil {
		tb.Fatalf("redistest: %s: INFO replication: %v", primary.Addr(), err)
	}
	v, _ := infoField(r.text(), "master_repl_offset")
	want, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		tb.Fatalf("redistest: %s: bad master_repl_offset %q", primary.Addr(), v)
	}
	for _, s := range replicas {
		var got string
		for {
			r, err := s.do("INFO", "replication")
			if err == nil {
				got, _ = infoField(r.text(), "slave_repl_offset")
				if n, err := strconv.ParseInt(got, 10, 64); err == nil && n >= want {
					break
				}
			} else {
				got = err.Error()
			}
			if time.Now().After(deadline) {
				tb.Fatalf("redistest: replica %s did not reach the replication offset %d of %s in time (slave_repl_offset: %s)\n%s",
					s.Addr(), want, primary.Addr(), got, s.logTail())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// waitSentinels waits until every sentinel sees the primary up, the given
// number of replicas and the other sentinels.
func (r *Replicated) waitSentinels(tb testing.TB, replicas, sentinels int) {
	tb.Helper()
	deadline := time.Now().Add(sentinelDiscoveryTimeout)
	for _, s := range r.Sentinels {
		for {
			problem := r.sentinelProblem(s, replicas, sentinels-1)
			if problem == "" {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("redistest: sentinel %s not ready within %v: %s\n%s",
					s.Addr(), sentinelDiscoveryTimeout, problem, s.logTail())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// sentinelProblem returns what sentinel s does not see yet, or "" if it
// sees everything.
func (r *Replicated) sentinelProblem(s *Server, replicas, others int) string {
	m, err := s.do("SENTINEL", "MASTER", r.MasterName)
	if err != nil {
		return "SENTINEL MASTER: " + err.Error()
	}
	f := m.fields()
	if f["flags"] != "master" {
		return "master flags " + f["flags"]
	}
	if f["num-slaves"] != strconv.Itoa(replicas) {
		return fmt.Sprintf("sees %s replicas, want %d", f["num-slaves"], replicas)
	}
	if f["num-other-sentinels"] != strconv.Itoa(others) {
		return fmt.Sprintf("sees %s other sentinels, want %d", f["num-other-sentinels"], others)
	}
	for _, q := range []struct {
		sub  string
		want int
		flag string
	}{
		{"REPLICAS", replicas, "slave"},
		{"SENTINELS", others, "sentinel"},
	} {
		l, err := s.do("SENTINEL", q.sub, r.MasterName)
		if err != nil {
			return "SENTINEL " + q.sub + ": " + err.Error()
		}
		if len(l.elems) != q.want {
			return fmt.Sprintf("SENTINEL %s lists %d, want %d", q.sub, len(l.elems), q.want)
		}
		for _, e := range l.elems {
			ef := e.fields()
			if ef["flags"] != q.flag {
				return fmt.Sprintf("SENTINEL %s: %s has flags %s", q.sub, ef["name"], ef["flags"])
			}
			if q.sub == "REPLICAS" && ef["master-link-status"] != "ok" {
				return fmt.Sprintf("SENTINEL REPLICAS: %s has master-link-status %s", ef["name"], ef["master-link-status"])
			}
		}
	}
	return ""
}

// SentinelAddrs returns the addresses of the sentinels.
func (r *Replicated) SentinelAddrs() []string {
	addrs := make([]string, 0, len(r.Sentinels))
	for _, s := range r.Sentinels {
		addrs = append(addrs, s.Addr())
	}
	return addrs
}

// CurrentPrimary returns the address of the current primary as the
// sentinels report it (SENTINEL GET-MASTER-ADDR-BY-NAME), asking each
// sentinel in turn until one answers. It fails tb if there are no sentinels
// or none answers.
func (r *Replicated) CurrentPrimary(tb testing.TB) string {
	tb.Helper()
	if len(r.Sentinels) == 0 {
		tb.Fatalf("redistest: CurrentPrimary needs sentinels; StartReplicated was called with none")
	}
	var errs []string
	for _, s := range r.Sentinels {
		rep, err := s.do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", r.MasterName)
		if err != nil {
			errs = append(errs, s.Addr()+": "+err.Error())
			continue
		}
		if rep.null || len(rep.elems) != 2 {
			errs = append(errs, fmt.Sprintf("%s: unexpected reply %q", s.Addr(), rep.text()))
			continue
		}
		return net.JoinHostPort(rep.elems[0].text(), rep.elems[1].text())
	}
	tb.Fatalf("redistest: no sentinel reports the primary of %s: %s", r.MasterName, strings.Join(errs, "; "))
	return ""
}
