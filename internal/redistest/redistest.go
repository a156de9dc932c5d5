package redistest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// readyTimeout bounds the wait for a started server to answer PING.
	readyTimeout = 10 * time.Second
	// stopTimeout bounds the wait after SIGTERM before Stop sends SIGKILL.
	stopTimeout = 10 * time.Second
	// exitTimeout bounds the wait for a process to exit after SIGKILL.
	exitTimeout = 10 * time.Second
	// restartBindTimeout bounds Restart's retries while its port is busy.
	restartBindTimeout = 5 * time.Second
	// doTimeout bounds one command sent by Do.
	doTimeout = 10 * time.Second
	// startAttempts is how many fresh ports Start tries when the port it
	// picked was taken by another process before the server could bind it.
	startAttempts = 5
	// clusterBusOffset is the distance from a cluster node's port to its
	// cluster bus port.
	clusterBusOffset = 10000
)

// installHint is appended to the message when a binary is missing.
const installHint = "install it with `apt-get install redis-server redis-tools redis-sentinel` (or run `make test`, which does)"

// lookBinary returns the path of the named binary, failing tb with an
// installation hint when it is not on PATH.
func lookBinary(tb starter, name string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		tb.Fatalf("%s not found: %s", name, installHint)
	}
	return path
}

// Server is one redis-server process started by this package.
type Server struct {
	bin     string // path of redis-server or redis-sentinel
	port    int
	dir     string
	logPath string // the server's --logfile
	outPath string // stdout and stderr of the process (early errors)
	args    []string

	tls *tls.Config // set for a TLS-only server: how to reach it

	tlsPort int // the TLS port of a server started WithTLSPort

	mu   sync.Mutex
	cmd  *exec.Cmd
	pid  int
	done chan struct{} // closed when the current process has exited
}

// config is the configuration assembled from Options.
type config struct {
	tls     *TLS
	tlsPort bool
	args    []string
}

// Option configures a server started by Start.
type Option func(*config)

// WithArgs appends extra redis-server command-line arguments, for example
// WithArgs("--appendonly", "yes", "--appendfsync", "always"). They come after
// the defaults, so they override them.
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// WithTLSPort has the server listen with TLS on a second port, besides
// its plain-text one, which Do keeps using. The port is picked as the
// server's own is, and picked anew with it should another process take it
// first; TLSPort returns it. The certificates are for the caller to give,
// with WithArgs("--tls-cert-file", …).
func WithTLSPort() Option {
	return func(c *config) { c.tlsPort = true }
}

// Start starts a redis-server on a free 127.0.0.1 port in a temporary
// directory, with --save "", --appendonly no and --repl-diskless-sync-delay 0
// (so replicas sync at once) unless overridden by WithArgs, and waits until it answers PING (at most 10s). It registers a
// cleanup on tb that kills the server. Start fails tb, including the tail of
// the server's log in the message, if the server does not come up.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	return start(tb, opts...)
}

func start(tb starter, opts ...Option) *Server {
	tb.Helper()
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	return startServer(tb, false, func(s *Server) ([]string, error) {
		port := []string{"--port", strconv.Itoa(s.port)}
		if cfg.tls != nil {
			port = append([]string{"--port", "0", "--tls-port", strconv.Itoa(s.port)}, cfg.tls.serverArgs()...)
			s.tls = cfg.tls.ClientConfig()
		}
		if cfg.tlsPort {
			p, err := allocPort(false)
			if err != nil {
				return nil, err
			}
			s.tlsPort = p
			port = append(port, "--tls-port", strconv.Itoa(p))
		}
		args := []string{
			"--bind", "127.0.0.1",
			"--dir", s.dir,
			"--logfile", s.logPath,
			"--daemonize", "no",
			"--save", "",
			"--appendonly", "no",
			// Start a replica's full sync at once instead of after 5s.
			"--repl-diskless-sync-delay", "0",
		}
		return append(append(port, args...), cfg.args...), nil
	})
}

// startServer starts a redis-server (clusterBus: whose port+10000 is also
// free). makeArgs builds the command line once s.port, s.dir and s.logPath
// are set; it is called again with a new port if the first one was taken.
func startServer(tb starter, clusterBus bool, makeArgs func(s *Server) ([]string, error)) *Server {
	tb.Helper()
	bin := lookBinary(tb, "redis-server")
	return startProcess(tb, bin, "redis.log", clusterBus, makeArgs)
}

// startProcess starts bin as described in startServer.
func startProcess(tb starter, bin, logName string, clusterBus bool, makeArgs func(s *Server) ([]string, error)) *Server {
	tb.Helper()
	s := &Server{bin: bin, dir: tb.TempDir()}
	s.logPath = filepath.Join(s.dir, logName)
	s.outPath = filepath.Join(s.dir, "stdout.log")
	// Registered after TempDir, so it runs before the directory is removed.
	tb.Cleanup(func() {
		if err := s.kill(); err != nil {
			tb.Errorf("redistest: stopping %s: %v", s.describe(), err)
		}
	})

	var lastErr error
	for range startAttempts {
		port, err := allocPort(clusterBus)
		if err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		s.port = port
		args, err := makeArgs(s)
		if err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		s.args = args
		mark := s.logMark()
		err = s.launchAndWait()
		if err == nil {
			return s
		}
		lastErr = err
		if !errors.Is(err, errExited) || !s.bindFailedSince(mark) {
			break
		}
		// Another process took the port between allocPort and the bind:
		// try again with a new one.
	}
	tb.Fatalf("redistest: starting %s: %v\n%s", s.describe(), lastErr, s.logTail())
	return nil
}

// errExited reports that the server process exited before answering PING.
var errExited = errors.New("process exited before answering PING")

// launchAndWait starts the process and waits until it answers PING. On
// failure the process is killed.
func (s *Server) launchAndWait() error {
	if err := s.launch(); err != nil {
		return err
	}
	if err := s.waitReady(readyTimeout); err != nil {
		_ = s.kill()
		return err
	}
	return nil
}

// launch starts the process and a goroutine that waits for it to exit.
func (s *Server) launch() error {
	out, err := os.OpenFile(s.outPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close() // the child has its own copy

	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()

	s.mu.Lock()
	s.cmd = cmd
	s.pid = cmd.Process.Pid
	s.done = done
	s.mu.Unlock()
	return nil
}

// current returns the running process and its exit channel (nil if none was
// started).
func (s *Server) current() (*exec.Cmd, chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd, s.done
}

// waitReady polls PING until the server answers PONG, the process exits
// (errExited) or timeout passes. The answering server must report our
// process ID, so that a server another test binary started on the same port
// is not taken for ours.
func (s *Server) waitReady(timeout time.Duration) error {
	_, done := s.current()
	pid := strconv.Itoa(s.PID())
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		select {
		case <-done:
			return errExited
		default:
		}
		r, err := s.command(500*time.Millisecond, "PING")
		if err == nil && r.text() == "PONG" {
			r, err = s.command(500*time.Millisecond, "INFO", "server")
			if err == nil {
				if got, _ := infoField(r.text(), "process_id"); got == pid {
					return nil
				}
				err = fmt.Errorf("a process other than pid %s answers on %s", pid, s.Addr())
			}
		} else if err == nil {
			err = fmt.Errorf("unexpected PING reply %q", r.text())
		}
		lastErr = err
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %v: %v", timeout, lastErr)
		}
		select {
		case <-done:
			return errExited
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill sends SIGKILL to the process, if it is running, and waits for it to
// exit. It is idempotent.
func (s *Server) kill() error {
	cmd, done := s.current()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	// The server's own process group also holds any fork child it has
	// (BGSAVE, replication sync); kill it while the server is unreaped, so
	// the group ID is still ours. Process.Signal signals our child by PID
	// and refuses once it was reaped.
	killGroup(cmd.Process.Pid)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("SIGKILL: %w", err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(exitTimeout):
		return fmt.Errorf("process %d did not exit within %v of SIGKILL", cmd.Process.Pid, exitTimeout)
	}
}

// running reports whether the server's process has been started and has
// not exited (a paused one is running).
func (s *Server) running() bool {
	cmd, done := s.current()
	if cmd == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// signal sends sig to the running process.
func (s *Server) signal(sig os.Signal) error {
	cmd, done := s.current()
	if cmd == nil {
		return errors.New("no process")
	}
	select {
	case <-done:
		return errors.New("process has exited")
	default:
	}
	return cmd.Process.Signal(sig)
}

// Addr returns the server's address, "127.0.0.1:PORT".
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Port returns the server's TCP port. It does not change across Restart.
func (s *Server) Port() int { return s.port }

// TLSPort returns the TLS port of a server started WithTLSPort, or 0. It
// does not change across Restart.
func (s *Server) TLSPort() int { return s.tlsPort }

// PID returns the process ID of the current (or last) server process. It
// changes on Restart.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

// Dir returns the server's working directory, a temporary directory that
// holds its log and any RDB/AOF files. It is removed after the test.
func (s *Server) Dir() string { return s.dir }

// Kill sends SIGKILL to the server and waits for the process to exit. It
// does nothing if the server is not running.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	if err := s.kill(); err != nil {
		tb.Fatalf("redistest: killing %s: %v", s.describe(), err)
	}
}

// Stop sends SIGTERM to the server and waits for it to exit; after 10s it
// sends SIGKILL. A paused server is resumed so that it can handle SIGTERM.
// It does nothing if the server is not running.
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	cmd, done := s.current()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	// The fork children the server may have (BGSAVE, replication sync)
	// are in its process group: they get the signals too, sent while the
	// server is unreaped, so that the group ID is still ours.
	signalGroup(cmd.Process.Pid, syscall.SIGTERM)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		tb.Fatalf("redistest: stopping %s: SIGTERM: %v", s.describe(), err)
	}
	signalGroup(cmd.Process.Pid, syscall.SIGCONT)
	_ = cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-done:
		return
	case <-time.After(stopTimeout):
	}
	tb.Logf("redistest: %s did not exit within %v of SIGTERM; sending SIGKILL", s.describe(), stopTimeout)
	s.Kill(tb)
}

// Restart kills the server and starts it again on the same port with the
// same arguments and directory, so AOF or RDB files persist if enabled, and
// waits until it answers PING. If the port is briefly busy it retries for up
// to 5s.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Kill(tb)
	deadline := time.Now().Add(restartBindTimeout)
	for {
		mark := s.logMark()
		err := s.launchAndWait()
		if err == nil {
			return
		}
		if errors.Is(err, errExited) && s.bindFailedSince(mark) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		tb.Fatalf("redistest: restarting %s: %v\n%s", s.describe(), err, s.logTail())
	}
}

// Pause stops the server process with SIGSTOP: it keeps its port and
// connections but answers nothing until Resume.
func (s *Server) Pause(tb testing.TB) {
	tb.Helper()
	if err := s.signal(syscall.SIGSTOP); err != nil {
		tb.Fatalf("redistest: pausing %s: %v", s.describe(), err)
	}
}

// PauseAWhile pauses the server as Pause does, and returns a function that
// resumes it, once however often it is called; the test's end calls it too.
func (s *Server) PauseAWhile(tb testing.TB) (resume func()) {
	tb.Helper()
	s.Pause(tb)
	var once sync.Once
	resume = func() { once.Do(func() { s.Resume(tb) }) }
	tb.Cleanup(resume)
	return resume
}

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume(tb testing.TB) {
	tb.Helper()
	if err := s.signal(syscall.SIGCONT); err != nil {
		tb.Fatalf("redistest: resuming %s: %v", s.describe(), err)
	}
}

// Busy has the server run an endless script, on a connection of its own,
// until it answers every other request with BUSY (at once: Busy sets
// busy-reply-threshold to 10ms), and returns the function that ends it
// (SCRIPT KILL), waits for its connection's answer and sets the threshold
// back, once however often it is called; the test's end calls it too. The command first, if any,
// goes just before the script, with nothing of another client's in
// between: "CLIENT", "KILL", "TYPE", "pubsub" has the subscribers connect
// again to a busy server.
func (s *Server) Busy(tb testing.TB, first ...string) (end func()) {
	tb.Helper()
	was := strings.TrimPrefix(s.Do(tb, "CONFIG", "GET", "busy-reply-threshold"), "busy-reply-threshold\n")
	s.Do(tb, "CONFIG", "SET", "busy-reply-threshold", "10")
	cmds := [][]string{{"EVAL", "while true do end", "0"}}
	if len(first) > 0 {
		cmds = append([][]string{first}, cmds...)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = pipeline(s.Addr(), s.tls, time.Hour, cmds...) // answered once killed
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := s.do("PING")
		if err != nil && strings.HasPrefix(err.Error(), "BUSY") {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: %s not busy with a script after 10s: %v", s.Addr(), err)
		}
		time.Sleep(time.Millisecond)
	}
	var once sync.Once
	end = func() {
		once.Do(func() {
			// NOTBUSY: ended already (a sentinel kills a script that
			// keeps its primary busy).
			if _, err := s.command(doTimeout, "SCRIPT", "KILL"); err != nil && !strings.HasPrefix(err.Error(), "NOTBUSY") {
				tb.Errorf("redistest: SCRIPT KILL on %s: %v", s.Addr(), err)
			}
			<-done
			s.Do(tb, "CONFIG", "SET", "busy-reply-threshold", was)
		})
	}
	tb.Cleanup(end)
	return end
}

// CommandStat returns field (calls, failed_calls, rejected_calls, ...)
// of command cmd ("evalsha", "function|load") in the server's INFO
// commandstats, counted since it started or its last CONFIG RESETSTAT; 0
// when the command has not run.
func (s *Server) CommandStat(tb testing.TB, cmd, field string) int {
	tb.Helper()
	for _, line := range strings.Split(s.Do(tb, "INFO", "commandstats"), "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, field+"="); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
	}
	return 0
}

// Do sends one command to the server over a new connection and returns the
// reply as text: a simple or bulk string as is, an integer in decimal, a nil
// reply as "(nil)", and an array as its elements one per line. It fails tb on
// an error reply or a network error. Use it for test setup, for example
// s.Do(t, "SET", "k", "v") or s.Do(t, "CONFIG", "SET", "maxmemory", "1mb").
func (s *Server) Do(tb testing.TB, args ...string) string {
	tb.Helper()
	r, err := s.command(doTimeout, args...)
	if err != nil {
		tb.Fatalf("redistest: %s %q: %v", s.Addr(), args, err)
	}
	return r.text()
}

// PubSubConnections counts the connections in pub/sub mode on s (CLIENT
// LIST TYPE pubsub).
func (s *Server) PubSubConnections(tb testing.TB) int {
	tb.Helper()
	n := 0
	for _, line := range strings.Split(s.Do(tb, "CLIENT", "LIST", "TYPE", "pubsub"), "\n") {
		if strings.TrimSpace(line) != "" {
			n++
		}
	}
	return n
}

// do sends one command with a short timeout, for polling.
func (s *Server) do(args ...string) (reply, error) {
	return s.command(2*time.Second, args...)
}

// command sends one command to the server, over TLS for a TLS-only one.
func (s *Server) command(timeout time.Duration, args ...string) (reply, error) {
	return command(s.Addr(), s.tls, timeout, args...)
}

// describe names the server in messages.
func (s *Server) describe() string {
	return fmt.Sprintf("%s on %s (pid %d, dir %s)", filepath.Base(s.bin), s.Addr(), s.PID(), s.dir)
}

// logMark records the sizes of the log files, to look at what a launch
// attempt added to them.
type logMark struct{ log, out int64 }

func (s *Server) logMark() logMark {
	return logMark{log: fileSize(s.logPath), out: fileSize(s.outPath)}
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// bindFailedSince reports whether the logs written since mark say that the
// server could not bind its port.
func (s *Server) bindFailedSince(mark logMark) bool {
	text := readFrom(s.logPath, mark.log) + readFrom(s.outPath, mark.out)
	return strings.Contains(text, "Address already in use") ||
		strings.Contains(text, "Failed listening on port")
}

func readFrom(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil || offset > int64(len(b)) {
		return ""
	}
	return string(b[offset:])
}

// logTail returns the last lines of the server's log and output, for failure
// messages.
func (s *Server) logTail() string {
	var b strings.Builder
	for _, p := range []string{s.logPath, s.outPath} {
		data, err := os.ReadFile(p)
		if err != nil || len(data) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		fmt.Fprintf(&b, "--- last lines of %s ---\n%s\n", p, strings.Join(lines, "\n"))
	}
	if b.Len() == 0 {
		return "(the server wrote no log)"
	}
	return b.String()
}

// ports handed out in this process, so two servers never get the same one.
var (
	portsMu sync.Mutex
	ports   = map[int]bool{}
)

// allocPort returns a free 127.0.0.1 port not handed out before in this
// process. With clusterBus, port+10000 is also free and at most 65535, and
// is reserved too.
func allocPort(clusterBus bool) (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	if !clusterBus {
		for range 100 {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return 0, fmt.Errorf("finding a free port: %w", err)
			}
			port := l.Addr().(*net.TCPAddr).Port
			l.Close()
			if ports[port] {
				continue
			}
			ports[port] = true
			return port, nil
		}
		return 0, errors.New("no free port found")
	}
	lo, hi := clusterPortRange()
	for range 1000 {
		port := lo + rand.IntN(hi-lo+1)
		bus := port + clusterBusOffset
		if ports[port] || ports[bus] || !portFree(port) || !portFree(bus) {
			continue
		}
		ports[port] = true
		ports[bus] = true
		return port, nil
	}
	return 0, fmt.Errorf("no free port pair (p, p+%d) found in [%d, %d]", clusterBusOffset, lo, hi)
}

// clusterPortRange returns the range to pick cluster node ports from: below
// the kernel's ephemeral range if it leaves room, so that outgoing
// connections do not take them, and always with port+10000 <= 65535.
func clusterPortRange() (lo, hi int) {
	lo, hi = 10000, 65535-clusterBusOffset
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(data))
	if len(f) < 1 {
		return lo, hi
	}
	ephLow, err := strconv.Atoi(f[0])
	if err != nil {
		return lo, hi
	}
	if h := ephLow - 1 - clusterBusOffset; h-lo >= 1000 && h < hi {
		hi = h
	}
	return lo, hi
}

// portFree reports whether 127.0.0.1:port can be listened on now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// StartMasters starts n independent servers, as Start does, for Redlock.
func StartMasters(tb testing.TB, n int) []*Server {
	tb.Helper()
	servers := make([]*Server, 0, n)
	for range n {
		servers = append(servers, Start(tb))
	}
	return servers
}
