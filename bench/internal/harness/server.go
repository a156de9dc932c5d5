package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// ServerOptions says how to start the benchmark's redis-server.
type ServerOptions struct {
	// Bin is the redis-server binary; "" means redis-server from PATH.
	Bin string
	// CPU pins the server to one CPU with taskset; -1 leaves it unpinned.
	CPU int
	// Under is a command and its arguments that run the server, such as
	// valgrind with its options, in the server's own process; none for
	// none.
	Under []string
}

// Server is a redis-server this process started, on a loopback port, with
// no persistence.
type Server struct {
	Addr    string
	Version string
	PID     int

	cmd   *exec.Cmd
	done  chan struct{}
	dir   string
	admin *redis.Client

	cpuAtReset float64 // server CPU seconds when the stats were last reset
}

// StartServer starts a redis-server on a free 127.0.0.1 port and waits
// until it answers. Stop it with Stop.
func StartServer(opts ServerOptions) (*Server, error) {
	bin := opts.Bin
	if bin == "" {
		bin = "redis-server"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (apt-get install redis-server): %w", err)
	}
	var lastErr error
	for range 5 {
		s, err := startServer(path, opts.CPU, opts.Under)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func startServer(bin string, cpu int, under []string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "dlockbench-redis-")
	if err != nil {
		return nil, err
	}
	args := []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no",
		"--daemonize", "no", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"),
	}
	name := bin
	if len(under) > 0 {
		args = append(append(under[1:len(under):len(under)], bin), args...)
		name = under[0]
	}
	if cpu >= 0 {
		// taskset execs redis-server, so the PID is the server's own.
		if ts, err := exec.LookPath("taskset"); err == nil {
			args = append([]string{"-c", strconv.Itoa(cpu), name}, args...)
			name = ts
		}
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	// Die with this process if it is killed before Stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), PID: cmd.Process.Pid, cmd: cmd, done: make(chan struct{}), dir: dir}
	go func() {
		_ = cmd.Wait()
		close(s.done)
	}()
	s.admin = redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true, MaxRetries: -1})
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := s.admin.Info(ctx, "server").Result()
		cancel()
		if err == nil {
			fields := parseInfo(info)
			if fields["process_id"] != strconv.Itoa(s.PID) {
				s.Stop()
				return nil, fmt.Errorf("port %d answered by another server", port)
			}
			s.Version = fields["redis_version"]
			return s, nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			s.Stop()
			return nil, fmt.Errorf("redis-server exited: %s", tail(string(log), 400))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, errors.New("redis-server did not answer within 10s")
		}
	}
}

// Stop stops the server by its PID: SIGTERM, then SIGKILL after 5s. It
// may be called again, which does nothing.
func (s *Server) Stop() {
	if s.admin != nil {
		_ = s.admin.Close()
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	_ = os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// parseInfo turns an INFO reply into its fields.
func parseInfo(info string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if ok && !strings.HasPrefix(k, "#") {
			m[k] = v
		}
	}
	return m
}

// ServerStats is what the server counted since the last Reset.
type ServerStats struct {
	// Commands is the sum of calls over INFO commandstats, less the
	// harness's own commands and connection set-up. Redis counts the
	// commands a script runs as well as the EVALSHA that ran it.
	Commands int64
	// Scripts is the EVAL and EVALSHA calls among them.
	Scripts int64
	// Reads is total_reads_processed: read events on client sockets, the
	// server's view of round trips (a pipeline read at once is one).
	Reads int64
	// ByCommand is the calls of each command counted in Commands.
	ByCommand map[string]int64
	// CPU is the CPU time the server process used (user and system,
	// networking included).
	CPU time.Duration
}

// uncounted are the commands that the harness sends or that only set up a
// connection; they are left out of ServerStats.Commands.
func uncounted(cmd string) bool {
	switch {
	case cmd == "info", cmd == "flushall", cmd == "dbsize", cmd == "hello", cmd == "ping", cmd == "select", cmd == "auth":
		return true
	case strings.HasPrefix(cmd, "config|"), strings.HasPrefix(cmd, "client|"), strings.HasPrefix(cmd, "command|"):
		return true
	}
	return false
}

// Flush deletes every key.
func (s *Server) Flush(ctx context.Context) error {
	return s.admin.FlushAll(ctx).Err()
}

// ResetStats zeroes the server's counters (CONFIG RESETSTAT) and notes its
// CPU time, which RESETSTAT leaves alone.
func (s *Server) ResetStats(ctx context.Context) error {
	if err := s.admin.ConfigResetStat(ctx).Err(); err != nil {
		return err
	}
	info, err := s.admin.Info(ctx, "cpu").Result()
	if err != nil {
		return err
	}
	s.cpuAtReset = cpuSeconds(parseInfo(info))
	return nil
}

// cpuSeconds is used_cpu_user + used_cpu_sys of an INFO cpu reply.
func cpuSeconds(fields map[string]string) float64 {
	u, _ := strconv.ParseFloat(fields["used_cpu_user"], 64)
	y, _ := strconv.ParseFloat(fields["used_cpu_sys"], 64)
	return u + y
}

// CPU returns the CPU time the server process has used since it started.
func (s *Server) CPU(ctx context.Context) (time.Duration, error) {
	info, err := s.admin.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	return time.Duration(cpuSeconds(parseInfo(info)) * float64(time.Second)), nil
}

// Keys returns the number of keys (DBSIZE).
func (s *Server) Keys(ctx context.Context) (int64, error) {
	return s.admin.DBSize(ctx).Result()
}

// Stats reads the server's counters since ResetStats (INFO commandstats
// stats cpu).
func (s *Server) Stats(ctx context.Context) (ServerStats, error) {
	info, err := s.admin.Info(ctx, "commandstats", "stats", "cpu").Result()
	if err != nil {
		return ServerStats{}, err
	}
	fields := parseInfo(info)
	st := ServerStats{ByCommand: map[string]int64{}}
	st.CPU = time.Duration((cpuSeconds(fields) - s.cpuAtReset) * float64(time.Second))
	for k, v := range fields {
		switch {
		case strings.HasPrefix(k, "cmdstat_"):
			name := strings.TrimPrefix(k, "cmdstat_")
			calls := statField(v, "calls")
			if uncounted(name) {
				continue
			}
			st.ByCommand[name] = calls
			st.Commands += calls
			if name == "eval" || name == "evalsha" {
				st.Scripts += calls
			}
		case k == "total_reads_processed":
			st.Reads, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	// Less the reads of the harness: INFO cpu after the reset, and this INFO.
	st.Reads = max(st.Reads-2, 0)
	return st, nil
}

// statField reads name=value from a commandstats line.
func statField(v, name string) int64 {
	for _, f := range strings.Split(v, ",") {
		if k, val, ok := strings.Cut(f, "="); ok && k == name {
			n, _ := strconv.ParseInt(val, 10, 64)
			return n
		}
	}
	return 0
}
