package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) { VerifyNoLeaks(m) }

func TestStartDo(t *testing.T) {
	t.Parallel()
	s := Start(t)

	if want := "127.0.0.1:" + strconv.Itoa(s.Port()); s.Addr() != want {
		t.Errorf("Addr() = %q, want %q", s.Addr(), want)
	}
	if s.PID() <= 0 {
		t.Errorf("PID() = %d", s.PID())
	}
	if fi, err := os.Stat(s.Dir()); err != nil || !fi.IsDir() {
		t.Errorf("Dir() %q: %v", s.Dir(), err)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"PING"}, "PONG"},
		{[]string{"SET", "k", "v"}, "OK"},
		{[]string{"GET", "k"}, "v"},
		{[]string{"GET", "missing"}, "(nil)"},
		{[]string{"INCR", "n"}, "1"},
		{[]string{"RPUSH", "l", "a", "b c", ""}, "3"},
		{[]string{"LRANGE", "l", "0", "-1"}, "a\nb c\n"},
		{[]string{"LRANGE", "missing", "0", "-1"}, ""},
		{[]string{"CONFIG", "GET", "save"}, "save\n"},
		{[]string{"CONFIG", "GET", "appendonly"}, "appendonly\nno"},
		{[]string{"CONFIG", "GET", "bind"}, "bind\n127.0.0.1"},
	} {
		if got := s.Do(t, c.args...); got != c.want {
			t.Errorf("Do(%q) = %q, want %q", c.args, got, c.want)
		}
	}

	// Error replies come back as errors (Do turns them into t.Fatal).
	_, err := command(s.Addr(), nil, time.Second, "NOSUCHCOMMAND")
	var er errorReply
	if !errors.As(err, &er) || !strings.HasPrefix(string(er), "ERR") {
		t.Errorf("NOSUCHCOMMAND: err = %v, want an ERR reply", err)
	}
}

func TestWithArgsOverrideDefaults(t *testing.T) {
	t.Parallel()
	s := Start(t, WithArgs("--appendonly", "yes", "--maxmemory", "10mb"))
	if got := s.Do(t, "CONFIG", "GET", "appendonly"); got != "appendonly\nyes" {
		t.Errorf("appendonly = %q", got)
	}
	if got := s.Do(t, "CONFIG", "GET", "maxmemory"); got != "maxmemory\n10485760" {
		t.Errorf("maxmemory = %q", got)
	}
}

func TestRestartWithoutPersistence(t *testing.T) {
	t.Parallel()
	s := Start(t)
	port, pid := s.Port(), s.PID()
	s.Do(t, "SET", "k", "v")

	s.Restart(t)
	if s.Port() != port {
		t.Errorf("port changed: %d -> %d", port, s.Port())
	}
	if s.PID() == pid {
		t.Errorf("PID unchanged after Restart: %d", pid)
	}
	if processAlive(pid) {
		t.Errorf("old process %d still alive", pid)
	}
	if got := s.Do(t, "GET", "k"); got != "(nil)" {
		t.Errorf("GET k after Restart without persistence = %q, want (nil)", got)
	}
}

func TestRestartWithAOF(t *testing.T) {
	t.Parallel()
	s := Start(t, WithArgs("--appendonly", "yes", "--appendfsync", "always"))
	port := s.Port()
	s.Do(t, "SET", "k", "v")

	s.Restart(t)
	if s.Port() != port {
		t.Errorf("port changed: %d -> %d", port, s.Port())
	}
	if got := s.Do(t, "GET", "k"); got != "v" {
		t.Errorf("GET k after Restart with AOF = %q, want v", got)
	}
	// Twice, to be sure Restart works on a restarted server.
	s.Restart(t)
	if got := s.Do(t, "GET", "k"); got != "v" {
		t.Errorf("GET k after second Restart = %q, want v", got)
	}
}

func TestBusy(t *testing.T) {
	t.Parallel()
	s := Start(t)
	end := s.Busy(t, "SET", "before", "1")
	if _, err := s.do("PING"); err == nil || !strings.HasPrefix(err.Error(), "BUSY") {
		t.Errorf("PING while busy: err = %v, want BUSY", err)
	}
	end()
	end()
	if got := s.Do(t, "GET", "before"); got != "1" {
		t.Errorf("the command sent first: GET = %q", got)
	}
	if got := s.Do(t, "PING"); got != "PONG" {
		t.Errorf("PING after the script ended = %q", got)
	}
	if got := s.Do(t, "CONFIG", "GET", "busy-reply-threshold"); got != "busy-reply-threshold\n5000" {
		t.Errorf("busy-reply-threshold after the script ended: %q", got)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := Start(t)
	s.Pause(t)
	_, err := command(s.Addr(), nil, 300*time.Millisecond, "PING")
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("PING while paused: err = %v, want a timeout", err)
	}
	s.Resume(t)
	if got := s.Do(t, "PING"); got != "PONG" {
		t.Errorf("PING after Resume = %q", got)
	}

	// Stop resumes a paused server so that SIGTERM takes effect.
	s.Pause(t)
	start := time.Now()
	s.Stop(t)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Stop of a paused server took %v", d)
	}
}

func TestStopKillIdempotent(t *testing.T) {
	t.Parallel()
	s := Start(t)
	pid := s.PID()
	s.Stop(t)
	s.Stop(t)
	s.Kill(t)
	if processAlive(pid) {
		t.Errorf("process %d alive after Stop", pid)
	}
	if _, err := command(s.Addr(), nil, 300*time.Millisecond, "PING"); err == nil {
		t.Errorf("PING answered after Stop")
	}

	s.Restart(t) // a stopped server can be started again
	if got := s.Do(t, "PING"); got != "PONG" {
		t.Errorf("PING after Restart = %q", got)
	}
	pid = s.PID()
	s.Kill(t)
	s.Kill(t)
	if processAlive(pid) {
		t.Errorf("process %d alive after Kill", pid)
	}
}

func TestStartMasters(t *testing.T) {
	t.Parallel()
	ms := StartMasters(t, 5)
	if len(ms) != 5 {
		t.Fatalf("got %d servers", len(ms))
	}
	seen := map[int]bool{}
	for _, m := range ms {
		if seen[m.Port()] {
			t.Errorf("port %d handed out twice", m.Port())
		}
		seen[m.Port()] = true
		if got := m.Do(t, "PING"); got != "PONG" {
			t.Errorf("%s PING = %q", m.Addr(), got)
		}
	}
	ms[0].Do(t, "SET", "k", "v")
	for _, m := range ms[1:] {
		if got := m.Do(t, "GET", "k"); got != "(nil)" {
			t.Errorf("%s shares data with %s: GET k = %q", m.Addr(), ms[0].Addr(), got)
		}
	}
}

func TestStartReplicated(t *testing.T) {
	t.Parallel()
	r := StartReplicated(t, 2, 3)
	if len(r.Replicas) != 2 || len(r.Sentinels) != 3 || r.MasterName != "mymaster" {
		t.Fatalf("got %d replicas, %d sentinels, master name %q", len(r.Replicas), len(r.Sentinels), r.MasterName)
	}
	if got := r.SentinelAddrs(); len(got) != 3 || got[0] != r.Sentinels[0].Addr() {
		t.Errorf("SentinelAddrs() = %q", got)
	}

	r.Primary.Do(t, "SET", "k", "v")
	for _, s := range r.Replicas {
		// StartReplicated waited for the replication stream to flow, so the
		// write arrives at once; poll briefly all the same.
		if got := eventually(t, s, "v", "GET", "k"); got != "v" {
			t.Errorf("replica %s: GET k = %q, want v", s.Addr(), got)
		}
		if info := s.Do(t, "INFO", "replication"); !strings.Contains(info, "role:slave") {
			t.Errorf("replica %s is not a replica:\n%s", s.Addr(), info)
		}
	}
	if got := r.CurrentPrimary(t); got != r.Primary.Addr() {
		t.Errorf("CurrentPrimary = %q, want %q", got, r.Primary.Addr())
	}
	// The quorum is sentinels/2+1.
	m := r.Sentinels[0].Do(t, "SENTINEL", "MASTER", r.MasterName)
	if !strings.Contains(m, "quorum\n2\n") {
		t.Errorf("SENTINEL MASTER does not show quorum 2:\n%s", m)
	}
}

func TestStartReplicatedNoSentinels(t *testing.T) {
	t.Parallel()
	r := StartReplicated(t, 1, 0)
	if len(r.Sentinels) != 0 || len(r.SentinelAddrs()) != 0 {
		t.Errorf("got sentinels %q", r.SentinelAddrs())
	}
	r.Primary.Do(t, "SET", "k", "v")
	if got := eventually(t, r.Replicas[0], "v", "GET", "k"); got != "v" {
		t.Errorf("replica GET k = %q", got)
	}
}

func TestStartCluster(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3, 1)
	if len(c.Nodes) != 6 || len(c.Addrs()) != 6 {
		t.Fatalf("got %d nodes, %d addrs", len(c.Nodes), len(c.Addrs()))
	}
	for _, n := range c.Nodes {
		if n.Port()+clusterBusOffset > 65535 {
			t.Errorf("node port %d leaves no room for its bus port", n.Port())
		}
		info := n.Do(t, "CLUSTER", "INFO")
		if v, _ := infoField(info, "cluster_state"); v != "ok" {
			t.Errorf("%s: cluster_state:%s", n.Addr(), v)
		}
	}
	var primaries []string
	for _, n := range c.Nodes {
		if role, _ := infoField(n.Do(t, "INFO", "replication"), "role"); role == "master" {
			primaries = append(primaries, n.Addr())
		}
	}
	if len(primaries) != 3 {
		t.Errorf("got %d primaries: %q", len(primaries), primaries)
	}
	// A key is served by exactly one primary; the others redirect.
	served := 0
	for _, addr := range primaries {
		_, err := command(addr, nil, time.Second, "SET", "k", "v")
		if err == nil {
			served++
		} else if !strings.HasPrefix(err.Error(), "MOVED") {
			t.Errorf("%s: SET k: %v", addr, err)
		}
	}
	if served != 1 {
		t.Errorf("SET k accepted by %d primaries, want 1", served)
	}
}

// TestClusterFailover kills the primary of a key, waits for its replica to
// take over, restarts the killed node and waits for it to rejoin as the
// new primary's replica.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3, 1)
	old := c.PrimaryOf(t, "k")
	if got := old.Do(t, "SET", "k", "v"); got != "OK" {
		t.Fatalf("SET k on its primary %s: %q", old.Addr(), got)
	}
	replicas := c.ReplicasOf(t, old)
	if len(replicas) != 1 {
		t.Fatalf("%s has %d replicas, want 1", old.Addr(), len(replicas))
	}
	start := time.Now()
	old.Kill(t)
	next := c.AwaitFailover(t, "k", old, 20*time.Second)
	t.Logf("failed over in %v", time.Since(start).Round(time.Millisecond))
	if next != replicas[0] {
		t.Errorf("new primary %s, want the replica %s", next.Addr(), replicas[0].Addr())
	}
	if got := c.PrimaryOf(t, "k"); got != next {
		t.Errorf("PrimaryOf after the failover = %s, want %s", got.Addr(), next.Addr())
	}
	if got := next.Do(t, "GET", "k"); got != "v" {
		t.Errorf("GET k on the new primary = %q, want v", got)
	}

	old.Restart(t)
	c.AwaitReplica(t, old, next, 20*time.Second)
	if got := c.ReplicasOf(t, next); len(got) != 1 || got[0] != old {
		t.Errorf("the new primary has %d replicas, want only the restarted node", len(got))
	}
	msg := runFatal(t, func(tb testing.TB) { c.AwaitReplica(tb, next, old, 100*time.Millisecond) })
	if !strings.Contains(msg, "not a replica") {
		t.Errorf("AwaitReplica of the primary: %q", msg)
	}
}

func TestAllocPortUnique(t *testing.T) {
	t.Parallel()
	seen := map[int]bool{}
	for i := range 20 {
		p, err := allocPort(i%2 == 0)
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if i%2 == 0 {
			if p+clusterBusOffset > 65535 {
				t.Errorf("cluster port %d: bus port out of range", p)
			}
			seen[p+clusterBusOffset] = true
		}
	}
}

func TestReplyText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"+OK\r\n", "OK"},
		{":-42\r\n", "-42"},
		{"$5\r\nhe\r\no\r\n", "he\r\no"},
		{"$-1\r\n", "(nil)"},
		{"*-1\r\n", "(nil)"},
		{"*0\r\n", ""},
		{"*3\r\n$1\r\na\r\n:1\r\n$-1\r\n", "a\n1\n(nil)"},
		{"*2\r\n*2\r\n+x\r\n+y\r\n+z\r\n", "x\ny\nz"},
		{"%1\r\n+k\r\n+v\r\n", "k\nv"},
		{"_\r\n", "(nil)"},
		{"#t\r\n", "true"},
		{",1.5\r\n", "1.5"},
		{"=7\r\ntxt:abc\r\n", "abc"},
		{"|1\r\n+a\r\n+b\r\n+real\r\n", "real"},
	} {
		r, err := readReply(newReader(c.in))
		if err != nil {
			t.Errorf("readReply(%q): %v", c.in, err)
			continue
		}
		if got := r.text(); got != c.want {
			t.Errorf("readReply(%q).text() = %q, want %q", c.in, got, c.want)
		}
	}
	if got := string(encodeCommand([]string{"SET", "k", ""})); got != "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n" {
		t.Errorf("encodeCommand = %q", got)
	}
}

// TestMissingBinary must not be parallel: it changes PATH.
func TestMissingBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for _, c := range []struct {
		name  string
		start func(tb testing.TB)
	}{
		{"redis-server", func(tb testing.TB) { Start(tb) }},
		{"redis-server", func(tb testing.TB) { StartMasters(tb, 1) }},
		{"redis-cli", func(tb testing.TB) { StartCluster(tb, 3, 0) }},
	} {
		msg := runFatal(t, c.start)
		want := c.name + " not found: install it with `apt-get install redis-server redis-tools redis-sentinel` (or run `make test`, which does)"
		if msg != want {
			t.Errorf("failure message = %q, want %q", msg, want)
		}
	}
}

func TestStartFailureShowsLog(t *testing.T) {
	t.Parallel()
	msg := runFatal(t, func(tb testing.TB) { Start(tb, WithArgs("--no-such-directive", "x")) })
	if !strings.Contains(msg, "process exited before answering PING") ||
		!strings.Contains(msg, "no-such-directive") ||
		!strings.Contains(msg, "--- last lines of") {
		t.Errorf("failure message lacks the cause or the log tail:\n%s", msg)
	}
}

func TestRestartWaitsForBusyPort(t *testing.T) {
	t.Parallel()
	s := Start(t)
	port := s.Port()
	s.Kill(t)
	l, err := net.Listen("tcp", s.Addr())
	if err != nil {
		t.Fatalf("occupying the port: %v", err)
	}
	released := make(chan struct{}) // closed before the port is freed
	go func() {
		time.Sleep(700 * time.Millisecond) // another process keeps the port a while
		close(released)
		l.Close()
	}()
	s.Restart(t)
	select {
	case <-released:
	default:
		t.Error("Restart returned while the port was still occupied")
	}
	if s.Port() != port || s.Do(t, "PING") != "PONG" {
		t.Errorf("after Restart: port %d (want %d)", s.Port(), port)
	}
}

func TestIgnoredGoroutine(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		stack string
		want  bool
	}{
		{"goroutine 5 [running]:\nruntime.goexit({})\n\t/x/asm.s:1", true},
		{"goroutine 6 [syscall]:\nos/signal.signal_recv()\n\t/x\nos/signal.loop()\n\t/y\ncreated by os/signal.Notify.func1.1 in goroutine 1\n\t/z", true},
		{"goroutine 7 [chan receive]:\nmain.worker()\n\t/x.go:1\ncreated by main.TestX in goroutine 6\n\t/x.go:2", false},
	} {
		if got := ignoredGoroutine(c.stack); got != c.want {
			t.Errorf("ignoredGoroutine(%q) = %v, want %v", c.stack, got, c.want)
		}
	}
	// A goroutine started here shows up as leaked until it ends.
	before := map[int]bool{}
	for _, g := range goroutines() {
		before[g.id] = true
	}
	stop := make(chan struct{})
	ended := make(chan struct{})
	go func() { <-stop; close(ended) }()
	found := false
	for _, g := range leakedGoroutines(before) {
		if strings.Contains(g.stack, "TestIgnoredGoroutine") {
			found = true
		}
	}
	close(stop)
	<-ended
	if !found {
		t.Errorf("a running goroutine was not reported")
	}
}

// eventually runs a command on s until it returns want, for at most 5s
// (replication is asynchronous: fast on loopback, slower on a busy
// machine), and returns the last reply.
func eventually(t *testing.T, s *Server, want string, args ...string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := s.Do(t, args...)
		if got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// processAlive reports whether a process with pid exists (our servers are
// reaped by Wait, so an exited one does not linger as a zombie).
func processAlive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

// fatalTB records the first Fatal message and ends the goroutine, like
// testing.T does; other methods go to the real test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fatalTB) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

// runFatal runs fn with a fatalTB in its own goroutine and returns the
// message it failed with.
func runFatal(t *testing.T, fn func(tb testing.TB)) string {
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(tb)
	}()
	<-done
	return tb.msg
}

func newReader(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }
