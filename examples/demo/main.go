// Command demo shows dlock keeping a fleet of processes to one holder at a
// time. It starts a Redis server of its own on a free loopback port, then
// several worker processes (this same program, run again) that all try to
// run the same "nightly-report" job. Each run reads a counter in Redis and
// writes it back incremented, a read-modify-write that would lose updates if
// two runs ever overlapped. The demo prints the merged timeline of all
// workers, checks that no two runs overlapped and that the counter equals
// the number of runs, and stops the server.
//
//	go run ./examples/demo            (make demo runs ./examples/cli-demo)
//	go run ./examples/demo -workers 8 -runs 5
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/examples/internal/interrupt"
	"github.com/dlockio/dlock/goredis"
	"github.com/redis/go-redis/v9"
)

const job = "nightly-report"

func main() {
	workers := flag.Int("workers", 5, "worker processes")
	runs := flag.Int("runs", 4, "runs of the job per worker")
	worker := flag.Int("worker", 0, "internal: run as worker number N")
	addr := flag.String("redis", "", "internal: the Redis address, for workers")
	start := flag.Int64("start", 0, "internal: the demo's start time, ns since the epoch")
	flag.Parse()

	var err error
	if *worker > 0 {
		err = runWorker(*addr, *worker, *runs, time.Unix(0, *start))
	} else {
		err = runDemo(*workers, *runs)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// event is one line of a worker's timeline.
type event struct {
	at     time.Duration
	worker int
	what   string // "acquired", "released", or "waiting"
	detail string
}

func runDemo(workers, runs int) error {
	srv, err := startRedis()
	if err != nil {
		return err
	}
	var (
		mu      sync.Mutex
		started []*exec.Cmd
	)
	// Watched until the server is stopped (defers run last first).
	defer interrupt.OnInterrupt("the workers and Redis", func() {
		mu.Lock()
		for _, cmd := range started {
			_ = cmd.Process.Kill()
		}
		mu.Unlock()
		srv.stop()
	})()
	defer srv.stop()
	fmt.Printf("Redis %s started (pid %d); %d workers will each run %q %d times.\n\n",
		srv.addr, srv.cmd.Process.Pid, workers, job, runs)

	start := time.Now()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var (
		events []event
		wg     sync.WaitGroup
		errs   = make(chan error, workers)
	)
	for w := 1; w <= workers; w++ {
		cmd := exec.Command(self, "-worker", strconv.Itoa(w), "-runs", strconv.Itoa(runs),
			"-redis", srv.addr, "-start", strconv.FormatInt(start.UnixNano(), 10))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		mu.Lock()
		err = cmd.Start()
		if err == nil {
			started = append(started, cmd)
		}
		mu.Unlock()
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if ev, ok := parseEvent(sc.Text()); ok {
					mu.Lock()
					events = append(events, ev)
					mu.Unlock()
				}
			}
			if err := cmd.Wait(); err != nil {
				errs <- fmt.Errorf("worker %d: %w", w, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}

	sort.Slice(events, func(i, j int) bool { return events[i].at < events[j].at })
	fmt.Println("   time  worker  event")
	holder, overlaps := 0, 0
	for _, ev := range events {
		switch ev.what {
		case "acquired":
			if holder != 0 {
				overlaps++
			}
			holder = ev.worker
		case "released":
			holder = 0
		}
		fmt.Printf("%5dms  %s%-8s %s\n", ev.at.Milliseconds(), strings.Repeat("  ", ev.worker-1), fmt.Sprintf("w%d %s", ev.worker, ev.what), ev.detail)
	}

	rdb := redis.NewClient(&redis.Options{Addr: srv.addr})
	defer rdb.Close()
	counter, err := rdb.Get(context.Background(), "demo:counter").Int()
	if err != nil {
		return err
	}
	want := workers * runs
	fmt.Printf("\n%d runs, counter = %d, overlapping holders = %d\n", want, counter, overlaps)
	if counter != want || overlaps != 0 {
		return errors.New("mutual exclusion was broken")
	}
	fmt.Println("OK: exactly one worker held the lock at a time, and no update was lost.")
	return nil
}

func parseEvent(line string) (event, bool) {
	f := strings.SplitN(line, " ", 4)
	if len(f) < 3 {
		return event{}, false
	}
	ns, err1 := strconv.ParseInt(f[0], 10, 64)
	w, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return event{}, false
	}
	ev := event{at: time.Duration(ns), worker: w, what: f[2]}
	if len(f) == 4 {
		ev.detail = f[3]
	}
	return ev, true
}

// runWorker is one process of the fleet.
func runWorker(addr string, id, runs int, start time.Time) error {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	locks := dlock.New(goredis.New(rdb))
	defer locks.Close()
	emit := func(what, detail string) {
		fmt.Printf("%d %d %s %s\n", time.Since(start).Nanoseconds(), id, what, detail)
	}
	for range runs {
		l, err := locks.Lock(ctx, job,
			dlock.WithTTL(5*time.Second),
			dlock.WithMetadata(fmt.Sprintf("worker=%d pid=%d", id, os.Getpid())))
		if err != nil {
			return err
		}
		// The job: a read-modify-write that only the lock keeps correct.
		n, err := rdb.Get(ctx, "demo:counter").Int()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		emit("acquired", fmt.Sprintf("fence %d, counter %d -> %d", l.Fence(), n, n+1))
		time.Sleep(15 * time.Millisecond)
		if err := rdb.Set(ctx, "demo:counter", n+1, 0).Err(); err != nil {
			return err
		}
		emit("released", "")
		if err := l.Release(ctx); err != nil {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// server is the demo's own redis-server process.
type server struct {
	addr string
	cmd  *exec.Cmd
	dir  string
	once sync.Once
}

func startRedis() (*server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server not found: install it with `apt-get install redis-server` (or run `make demo`, which does)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir, err := os.MkdirTemp("", "dlock-demo-")
	if err != nil {
		return nil, err
	}
	s := &server{addr: fmt.Sprintf("127.0.0.1:%d", port), dir: dir}
	s.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.addr})
	defer rdb.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if rdb.Ping(context.Background()).Err() == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, errors.New("redis-server did not start; see " + filepath.Join(dir, "redis.log"))
		}
	}
}

func (s *server) stop() {
	s.once.Do(func() {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		_ = os.RemoveAll(s.dir)
	})
}
