// Command dlockfault runs dlock's fault suite: workers contend for locks on
// real Redis servers while the network between them fails (a toxiproxy
// fault proxy, in this process), while their processes are stopped and
// continued, and while Redis crashes and restarts; a last scenario checks
// histories of lock operations under network faults for linearizability
// with porcupine. Each scenario counts overlaps (two holders acting at
// once), stale writes that a fenced resource accepted, locks left behind
// after their TTL, and operations that returned no error although they
// failed. With -out it writes the report that docs/reliability.md is.
//
//	go run ./cmd/dlockfault -out ../docs/reliability.md   (about 8 minutes)
//	go run ./cmd/dlockfault -quick -only pause,crash
//
// It exits with status 1 if any scenario broke a guarantee. It needs
// redis-server on PATH and runs on Linux; it only listens and connects on
// 127.0.0.1, and it only ever signals the processes it started, by PID.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// config is how a run is set up.
type config struct {
	quick  bool
	seed   uint64
	outDir string // where failing histories go
	pauses int    // the pause scenario's number of pauses, when not 0
}

// pick returns full, or quick in a -quick run.
func (c config) pick(full, quick time.Duration) time.Duration {
	if c.quick {
		return quick
	}
	return full
}

func (c config) pickInt(full, quick int) int {
	if c.quick {
		return quick
	}
	return full
}

// scenario is one entry of the suite.
type scenario struct {
	key string
	run func(config) *result
}

func scenarios() []scenario {
	var s []scenario
	for _, f := range networkFaults(netTTL) {
		s = append(s, scenario{"network/" + f.name, func(c config) *result { return runNetwork(c, f) }})
	}
	return append(s,
		scenario{"pause", runPause},
		scenario{"crash/volatile", func(c config) *result { return runCrash(c, false) }},
		scenario{"crash/aof", func(c config) *result { return runCrash(c, true) }},
		scenario{"linearizability", runLinearizability},
	)
}

// selected returns the scenarios whose keys start with one of the
// comma-separated prefixes in only ("" for all).
func selected(only string) []scenario {
	var out []scenario
	for _, s := range scenarios() {
		if only == "" {
			out = append(out, s)
			continue
		}
		for _, p := range strings.Split(only, ",") {
			if p = strings.TrimSpace(p); p != "" && strings.HasPrefix(s.key, p) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

func main() {
	redis.SetLogger(quietLogger{})
	isWorker()
	quick := flag.Bool("quick", false, "run every scenario briefly (under a minute in all)")
	out := flag.String("out", "", "write the report to this file (docs/reliability.md)")
	outDir := flag.String("outdir", "out", "where failing linearizability histories are saved")
	only := flag.String("only", "", "run only the scenarios whose names start with one of these, comma-separated: "+keys())
	seed := flag.Uint64("seed", 0, "random seed; 0 takes one from the clock")
	functions := flag.Bool("functions", false, "every client runs dlock's scripts as Redis Functions (WithFunctions), workers included")
	flag.Parse()
	if *functions {
		// The workers, started by this process, inherit it.
		_ = os.Setenv(functionsEnv, "1")
	}
	cfg := config{quick: *quick, seed: *seed, outDir: *outDir}
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano())
	}
	run := selected(*only)
	if len(run) == 0 {
		fmt.Fprintf(os.Stderr, "dlockfault: no scenario matches %q; there are %s\n", *only, keys())
		os.Exit(2)
	}
	start := time.Now()
	results := runScenarios(cfg, run, os.Stderr)
	failed := false
	for _, r := range results {
		for _, p := range r.problems() {
			fmt.Fprintf(os.Stderr, "dlockfault: %s: %s\n", r.key, p)
			failed = true
		}
	}
	if *out != "" {
		env := runEnv{took: time.Since(start), seed: cfg.seed, quick: cfg.quick, functions: *functions, goVersion: runtime.Version(), cpus: runtime.NumCPU()}
		if err := writeReport(*out, results, env); err != nil {
			fmt.Fprintln(os.Stderr, "dlockfault:", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "dlockfault: wrote %s\n", *out)
	}
	if failed {
		os.Exit(1)
	}
}

// runScenarios runs each scenario in turn, saying on progress how each went.
func runScenarios(cfg config, run []scenario, progress io.Writer) []*result {
	var results []*result
	for _, s := range run {
		fmt.Fprintf(progress, "dlockfault: %s …\n", s.key)
		r := s.run(cfg)
		verdict := "ok"
		if n := len(r.problems()); n > 0 {
			verdict = fmt.Sprintf("%d problems", n)
		}
		fmt.Fprintf(progress, "dlockfault: %s: %v, %s\n", s.key, r.took.Round(100*time.Millisecond), verdict)
		results = append(results, r)
	}
	return results
}

func keys() string {
	var k []string
	for _, s := range scenarios() {
		k = append(k, s.key)
	}
	return strings.Join(k, ", ")
}

func itoa(n int) string { return fmt.Sprint(n) }

// quietLogger keeps go-redis from logging the connection losses that the
// scenarios cause on purpose.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
