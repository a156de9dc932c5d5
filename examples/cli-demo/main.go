// Command cli-demo shows the dlock command keeping a job to one run at a
// time. It builds dlock, starts a Redis server of its own on a free
// loopback port, and starts several workers at once, each of which runs
//
//	dlock run nightly -- JOB
//
// a few times in a row. The job (this same program, run with -job) reads a
// counter in Redis and writes it back incremented: a read-modify-write that
// would lose updates if two runs ever overlapped. The demo then shows
// `dlock status` and `dlock run --no-wait` against a held lock, prints the
// merged timeline of all runs, checks that no two overlapped, that their
// fences grew, and that the counter equals the number of runs, and stops the
// server.
//
//	go run ./examples/cli-demo            (or: make demo)
//	go run ./examples/cli-demo -workers 8 -runs 5
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlockio/dlock/examples/internal/interrupt"
	"github.com/dlockio/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

const (
	lockName   = "nightly"
	counterKey = "demo:counter"
)

func main() {
	workers := flag.Int("workers", 5, "worker processes started at once")
	runs := flag.Int("runs", 3, "runs of the job per worker")
	job := flag.Duration("job", 0, "internal: run as the job, taking this long")
	flag.Parse()

	var err error
	if *job > 0 {
		err = runJob(*job)
	} else {
		err = demo(*workers, *runs)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cli-demo:", err)
		os.Exit(1)
	}
}

// runJob is the job that dlock runs: it reads the counter, works a little,
// and writes it back incremented, printing a start and an end event with
// the fence dlock gave it.
func runJob(work time.Duration) error {
	opt, err := redis.ParseURL(os.Getenv("DLOCK_REDIS"))
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx := context.Background()
	start, _ := strconv.ParseInt(os.Getenv("DEMO_START"), 10, 64)
	emit := func(what, detail string) {
		fmt.Printf("%d %s %s %s\n", time.Since(time.Unix(0, start)).Nanoseconds(), os.Getenv("DEMO_WORKER"), what, detail)
	}
	n, err := rdb.Get(ctx, counterKey).Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	emit("start", fmt.Sprintf("fence=%s counter %d -> %d", os.Getenv("DLOCK_FENCE"), n, n+1))
	time.Sleep(work)
	if err := rdb.Set(ctx, counterKey, n+1, 0).Err(); err != nil {
		return err
	}
	emit("end", "")
	return nil
}

// event is one line of the timeline.
type event struct {
	at     time.Duration
	worker string
	what   string // start, end
	detail string
}

func demo(workers, runs int) error {
	dir, err := os.MkdirTemp("", "dlock-cli-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	dlockBin := filepath.Join(dir, "dlock")
	fmt.Println("$ go build -o", dlockBin, "./cmd/dlock")
	if out, err := exec.Command(goTool(), "build", "-o", dlockBin, "github.com/dlockio/dlock/cmd/dlock").CombinedOutput(); err != nil {
		return fmt.Errorf("building dlock: %v\n%s", err, out)
	}
	srv, stop, err := redistest.StartForMain()
	if err != nil {
		return err
	}
	// Watched until the server is stopped (defers run last first).
	defer interrupt.OnInterrupt("Redis", func() {
		stop()
		_ = os.RemoveAll(dir)
	})()
	defer stop() // kills the server by its PID
	self, err := os.Executable()
	if err != nil {
		return err
	}
	start := time.Now()
	env := append(os.Environ(), "DLOCK_REDIS=redis://"+srv.Addr(), "DEMO_START="+strconv.FormatInt(start.UnixNano(), 10))
	d := &demoRun{dlock: dlockBin, self: self, env: env}

	fmt.Printf("Redis %s started (pid %d).\n", srv.Addr(), srv.PID())
	times := fmt.Sprintf("%d times", runs)
	if runs == 1 {
		times = "once"
	}
	fmt.Printf("%d workers start at once; each runs this %s:\n\n", workers, times)
	fmt.Printf("  DLOCK_REDIS=redis://%s dlock run --metadata worker=wN %s -- cli-demo -job 40ms\n\n", srv.Addr(), lockName)

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 1; w <= workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range runs {
				if code, stderr, err := d.run(fmt.Sprintf("w%d", w), "--metadata", fmt.Sprintf("worker=w%d", w), lockName, "--", self, "-job", "40ms"); err != nil || code != 0 {
					errs <- fmt.Errorf("worker %d: dlock run exited %d (%v): %s", w, code, err, stderr)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	d.timeline()
	if err := d.heldLock(fmt.Sprintf("w%d", workers+1)); err != nil {
		return err
	}
	return d.check(srv.Addr(), workers*runs+1)
}

// demoRun runs dlock processes and collects the job's events.
type demoRun struct {
	dlock, self string
	env         []string

	mu     sync.Mutex
	events []event
}

// run runs dlock with args as worker, adding the job's events to the
// timeline, and returns dlock's exit code and stderr.
func (d *demoRun) run(worker string, args ...string) (int, string, error) {
	cmd := exec.Command(d.dlock, append([]string{"run"}, args...)...)
	cmd.Env = append(d.env, "DEMO_WORKER="+worker)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, "", err
	}
	if err := cmd.Start(); err != nil {
		return 0, "", err
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if ev, ok := parseEvent(sc.Text()); ok {
			d.mu.Lock()
			d.events = append(d.events, ev)
			d.mu.Unlock()
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), stderr.String(), nil
	}
	return 0, stderr.String(), err
}

// heldLock shows dlock status and dlock run --no-wait while a slow run,
// as worker, holds the lock.
func (d *demoRun) heldLock(worker string) error {
	fmt.Printf("Then, while one more run (%s) holds the lock for a second:\n\n", worker)
	done := make(chan error, 1)
	go func() {
		code, stderr, err := d.run(worker, "--metadata", "worker="+worker, lockName, "--", d.self, "-job", "1s")
		if err == nil && code != 0 {
			err = fmt.Errorf("dlock run exited %d: %s", code, stderr)
		}
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		status := exec.Command(d.dlock, "status", "--json", lockName)
		status.Env = d.env
		out, _ := status.Output()
		if strings.Contains(string(out), `"worker": "`+worker+`"`) {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the slow run did not obtain the lock within 10s")
		}
	}
	fmt.Printf("$ dlock status %s\n", lockName)
	status := exec.Command(d.dlock, "status", lockName)
	status.Env, status.Stdout, status.Stderr = d.env, os.Stdout, os.Stderr
	if err := status.Run(); err != nil {
		return err
	}
	fmt.Printf("\n$ dlock run --no-wait %s -- cli-demo -job 40ms\n", lockName)
	code, stderr, err := d.run(worker, "--no-wait", lockName, "--", d.self, "-job", "40ms")
	if err != nil {
		return err
	}
	fmt.Printf("%s(exit code %d: not obtained)\n\n", stderr, code)
	if code != 73 {
		return fmt.Errorf("dlock run --no-wait exited %d, want 73", code)
	}
	return <-done
}

// timeline prints the events so far in time order.
func (d *demoRun) timeline() {
	d.mu.Lock()
	defer d.mu.Unlock()
	sort.Slice(d.events, func(i, j int) bool { return d.events[i].at < d.events[j].at })
	fmt.Println("   time  worker  event")
	for _, ev := range d.events {
		n, _ := strconv.Atoi(strings.TrimPrefix(ev.worker, "w"))
		fmt.Printf("%5dms  %s%-9s %s\n", ev.at.Milliseconds(), strings.Repeat("  ", n-1), ev.worker+" "+ev.what, ev.detail)
	}
	fmt.Println()
}

// check proves mutual exclusion over every run: no run started before the
// one before it ended, fences grew, and the counter saw every run.
func (d *demoRun) check(addr string, wantRuns int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	sort.Slice(d.events, func(i, j int) bool { return d.events[i].at < d.events[j].at })
	holder, overlaps, runs := "", 0, 0
	var lastFence uint64
	fencesUp := true
	for _, ev := range d.events {
		switch ev.what {
		case "start":
			runs++
			if holder != "" {
				overlaps++
			}
			holder = ev.worker
			f, _ := strconv.ParseUint(strings.TrimPrefix(strings.Fields(ev.detail)[0], "fence="), 10, 64)
			if f <= lastFence {
				fencesUp = false
			}
			lastFence = f
		case "end":
			holder = ""
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	counter, err := rdb.Get(context.Background(), counterKey).Int()
	if err != nil {
		return err
	}
	fmt.Printf("%d runs in all (want %d), counter = %d, overlapping runs = %d, fences increasing: %v\n", runs, wantRuns, counter, overlaps, fencesUp)
	if runs != wantRuns || counter != runs || overlaps != 0 || !fencesUp {
		return errors.New("mutual exclusion was broken")
	}
	fmt.Println("OK: exactly one `dlock run` ran the job at a time, and no update was lost.")
	return nil
}

func parseEvent(line string) (event, bool) {
	f := strings.SplitN(line, " ", 4)
	if len(f) < 3 {
		return event{}, false
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return event{}, false
	}
	ev := event{at: time.Duration(ns), worker: f[1], what: f[2]}
	if len(f) == 4 {
		ev.detail = f[3]
	}
	return ev, true
}

// goTool returns the go command of the toolchain that built the demo.
func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
