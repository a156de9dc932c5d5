// Command dlockbench compares dlock with a raw go-redis floor and with other
// Go lock libraries on a Redis server it starts, and reports every metric as
// a ratio to the floor: a Markdown table on stdout and in results/latest.md,
// and a chart in results/latest.svg.
//
//	cd bench && go run ./cmd/dlockbench          # full run, a few minutes
//	cd bench && go run ./cmd/dlockbench -quick   # smoke run, under a minute
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/dlockio/dlock/bench/internal/harness"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dlockbench:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		quick     = flag.Bool("quick", false, "smoke run of under a minute: fewer rounds, shorter slices")
		libs      = flag.String("libs", "", "comma-separated libraries to run (default floor,dlock,dlock-rueidis,dlock-redigo,redislock,redsync,rueidislock; also, on request, dlock-poll, dlock-fn and dlock-nocounter)")
		scenarios = flag.String("scenarios", "", "comma-separated scenario numbers to run (default all: 1,2,3,4,5,6)")
		rounds    = flag.Int("rounds", 0, "rounds of scenarios 1–4 (default: 7, or 2 with -quick)")
		out       = flag.String("out", "results", `directory for latest.md and latest.svg ("" writes nothing)`)
		redisBin  = flag.String("redis-server", "redis-server", "redis-server binary")
		pin       = flag.Bool("pin", true, "with 2 CPUs or more, pin redis-server to CPU 0 and this process to CPU 1 (taskset)")
		cpuProf   = flag.String("cpuprofile", "", "write a CPU profile of the benchmark process to this file")
	)
	flag.Parse()
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	cfg, preset := harness.Full(), "full"
	if *quick {
		cfg, preset = harness.Quick(), "quick"
	}
	if *rounds > 0 {
		cfg.Rounds = *rounds
	}
	selLibs, err := selectLibraries(*libs)
	if err != nil {
		return err
	}
	selScenarios, err := selectScenarios(*scenarios)
	if err != nil {
		return err
	}

	pinning := "processes not pinned"
	serverCPU := -1
	if *pin && runtime.NumCPU() >= 2 {
		if err := exec.Command("taskset", "-a", "-cp", "1", strconv.Itoa(os.Getpid())).Run(); err != nil {
			fmt.Fprintf(os.Stderr, "dlockbench: not pinned, taskset failed: %v\n", err)
		} else {
			runtime.GOMAXPROCS(1)
			serverCPU = 0
			pinning = "redis-server pinned to CPU 0, the benchmark to CPU 1"
		}
	}

	srv, err := harness.StartServer(harness.ServerOptions{Bin: *redisBin, CPU: serverCPU})
	if err != nil {
		return err
	}
	defer srv.Stop()
	// On an interrupt, stop the server (by its PID) before exiting.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "dlockbench: interrupted; stopping redis-server")
		srv.Stop()
		os.Exit(130)
	}()
	fmt.Fprintf(os.Stderr, "dlockbench: %s run, redis-server %s at %s (pid %d); %s\n", preset, srv.Version, srv.Addr, srv.PID, pinning)

	loadBefore := harness.LoadAverage()
	rep, err := harness.Run(context.Background(), cfg, srv, selLibs, selScenarios, os.Stderr)
	if err != nil {
		return err
	}
	rep.Preset = preset
	rep.Machine = harness.DescribeMachine(srv, pinning)
	rep.Machine.LoadBefore = loadBefore
	if rep.OtherCPU > 0.2 {
		fmt.Fprintf(os.Stderr, "dlockbench: other processes used %.2f CPUs on average during the run: rates are disturbed, run again on a quiet machine\n", rep.OtherCPU)
	}
	md := rep.Markdown()
	fmt.Print(md)
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(*out, "latest.md"), []byte(md), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(*out, "latest.svg"), []byte(rep.SVG()), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "dlockbench: wrote %s and %s in %s\n",
			filepath.Join(*out, "latest.md"), filepath.Join(*out, "latest.svg"), rep.Elapsed.Round(1e9))
	}
	return nil
}

func selectLibraries(list string) ([]harness.Library, error) {
	if list == "" {
		return harness.Libraries(), nil
	}
	all := append(harness.Libraries(), harness.Variants()...)
	var sel []harness.Library
	for _, name := range strings.Split(list, ",") {
		i := slices.IndexFunc(all, func(l harness.Library) bool { return l.Name == strings.TrimSpace(name) })
		if i < 0 {
			return nil, fmt.Errorf("unknown library %q", name)
		}
		sel = append(sel, all[i])
	}
	return sel, nil
}

func selectScenarios(list string) ([]*harness.Scenario, error) {
	all := harness.Scenarios()
	if list == "" {
		return all, nil
	}
	var sel []*harness.Scenario
	for _, f := range strings.Split(list, ",") {
		id, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || id < 1 || id > len(all) {
			return nil, fmt.Errorf("unknown scenario %q (1–%d)", f, len(all))
		}
		sel = append(sel, all[id-1])
	}
	return sel, nil
}
