// Command dlockcost counts the instructions a Redis server runs for one
// uncontended acquire and release, for dlock and for the libraries that
// dlockbench compares it with, under valgrind's cachegrind: a count, not a
// time, so that it comes out the same from run to run, whatever else the
// machine is doing, and tells what a change of dlock's scripts costs the
// server.
//
//	cd bench && go run ./cmd/dlockcost                       # floor, dlock, dlock-fn
//	cd bench && go run ./cmd/dlockcost -libs floor,dlock,redislock
//
// For each library it starts a redis-server under cachegrind twice, runs
// -warm pairs, or -warm plus -pairs, of TryLock and Release on fresh names
// from one goroutine, stops the server, and divides the difference of the
// two counts by -pairs: what the server runs for a pair, its requests'
// reading and writing included, its start and stop left out.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/dlockio/dlock/bench/internal/harness"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dlockcost:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		libs     = flag.String("libs", "floor,dlock,dlock-fn", "comma-separated libraries, by their dlockbench names")
		pairs    = flag.Int("pairs", 2000, "pairs counted")
		warm     = flag.Int("warm", 500, "pairs run first in both counts, so that what a library does once is left out")
		redisBin = flag.String("redis-server", "redis-server", "redis-server binary")
	)
	flag.Parse()
	// go-redis would log every refused dial while a server starts under
	// valgrind, which takes a second or two.
	redis.SetLogger(&logging.VoidLogger{})
	if _, err := exec.LookPath("valgrind"); err != nil {
		return fmt.Errorf("valgrind not found (apt-get install valgrind): %w", err)
	}
	if *pairs < 1 || *warm < 0 {
		return fmt.Errorf("-pairs must be at least 1 and -warm at least 0")
	}
	known := map[string]harness.Library{}
	for _, l := range append(harness.Libraries(), harness.Variants()...) {
		known[l.Name] = l
	}
	var chosen []harness.Library
	for _, name := range strings.Split(*libs, ",") {
		l, ok := known[strings.TrimSpace(name)]
		if !ok {
			return fmt.Errorf("unknown library %q", name)
		}
		chosen = append(chosen, l)
	}
	fmt.Printf("| library | server instructions per pair | ratio to %s |\n|---|---:|---:|\n", chosen[0].Name)
	var first float64
	for i, l := range chosen {
		fmt.Fprintf(os.Stderr, "%s: counting %d pairs...\n", l.Name, *pairs)
		short, err := count(l, *warm, *redisBin)
		if err != nil {
			return fmt.Errorf("%s: %w", l.Name, err)
		}
		long, err := count(l, *warm+*pairs, *redisBin)
		if err != nil {
			return fmt.Errorf("%s: %w", l.Name, err)
		}
		per := float64(long-short) / float64(*pairs)
		if i == 0 {
			first = per
		}
		fmt.Printf("| %s | %.0f | %.2f× |\n", l.Name, per, per/first)
	}
	return nil
}

// refs is cachegrind's summary line of the instructions it counted.
var refs = regexp.MustCompile(`I\s+refs:\s+([\d,]+)`)

// count runs n pairs of library l on a server under cachegrind and returns
// the instructions the server ran in all.
func count(l harness.Library, n int, bin string) (int64, error) {
	dir, err := os.MkdirTemp("", "dlockcost-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	logFile := filepath.Join(dir, "cachegrind.log")
	srv, err := harness.StartServer(harness.ServerOptions{Bin: bin, CPU: -1, Under: []string{
		"valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", "--log-file=" + logFile}})
	if err != nil {
		return 0, err
	}
	defer srv.Stop() // at once on an error; Stop may be called again
	locker, err := l.New(harness.ClientConfig{Addr: srv.Addr, TTL: 10 * time.Second, PoolSize: 4, Counters: &harness.Counters{}})
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	err = pairsOf(ctx, locker, n)
	if cerr := locker.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	srv.Stop() // cachegrind writes its count as the server exits
	log, err := os.ReadFile(logFile)
	if err != nil {
		return 0, err
	}
	m := refs.FindSubmatch(log)
	if m == nil {
		return 0, fmt.Errorf("no instruction count in cachegrind's log: %.300s", log)
	}
	return strconv.ParseInt(strings.ReplaceAll(string(m[1]), ",", ""), 10, 64)
}

// pairsOf runs n TryLock and Release pairs of locker on fresh names.
func pairsOf(ctx context.Context, locker harness.Locker, n int) error {
	for i := range n {
		h, err := locker.TryLock(ctx, "cost:"+strconv.Itoa(i))
		if err != nil {
			return err
		}
		if err := h.Release(ctx); err != nil {
			return err
		}
	}
	return nil
}
