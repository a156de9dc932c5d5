package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// server is one redis-server process that this program started, on a free
// loopback port in a directory of its own. It is only ever signalled by the
// PID this program got when starting it.
type server struct {
	dir  string
	port int
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the current process has exited
}

// startServer starts redis-server with persistence off, then the extra
// arguments (which may turn it on), and waits until it answers.
func startServer(extra ...string) (*server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found: install it with `apt-get install redis-server` (%w)", err)
	}
	dir, err := os.MkdirTemp("", "dlockfault-redis-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &server{dir: dir, port: port}
	s.args = append([]string{bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no",
		"--save", "", "--appendonly", "no",
	}, extra...)
	if err := s.launch(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *server) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// launch starts the process and waits until it answers PING with its own
// process ID, so that another server on the same port is not taken for it.
func (s *server) launch() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.launchOnce()
		if err == nil {
			return nil
		}
		// The port can stay busy for a moment after a kill.
		if !strings.Contains(s.logTail(), "Address already in use") || time.Now().After(deadline) {
			return fmt.Errorf("starting redis-server on %s: %w\n%s", s.addr(), err, s.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *server) launchOnce() error {
	cmd := exec.Command(s.args[0], s.args[1:]...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = serverProcAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	rdb := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	want := strconv.Itoa(cmd.Process.Pid)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-done:
			return errors.New("redis-server exited before answering")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		info, err := rdb.Info(ctx, "server").Result()
		cancel()
		if err == nil && strings.Contains(info, "process_id:"+want+"\r\n") {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = s.kill()
	return errors.New("redis-server did not answer within 10s")
}

// kill sends SIGKILL to the server (and its fork children, in its own
// process group) and waits for it to exit.
func (s *server) kill() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	select {
	case <-done:
		return nil
	default:
	}
	killGroup(cmd.Process.Pid)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("redis-server pid %d did not exit after SIGKILL", cmd.Process.Pid)
	}
}

// restart kills the server and starts it again with the same arguments and
// directory, so that an AOF survives.
func (s *server) restart(down time.Duration) error {
	if err := s.kill(); err != nil {
		return err
	}
	time.Sleep(down)
	return s.launch()
}

// stop kills the server and removes its directory.
func (s *server) stop() {
	if err := s.kill(); err != nil {
		fmt.Fprintln(os.Stderr, "dlockfault:", err)
	}
	_ = os.RemoveAll(s.dir)
}

func (s *server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return strings.Join(lines, "\n")
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
