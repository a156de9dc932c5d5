package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// Report is the outcome of a run.
type Report struct {
	Preset    string
	Started   time.Time
	Elapsed   time.Duration
	Machine   Machine
	Config    Config
	Libraries []Library
	Results   []*Result
	// OtherCPU is the CPU time that processes other than this one and its
	// redis-server used during the run, in CPUs (0.5 is half a CPU all the
	// time); negative when unknown.
	OtherCPU float64
}

// Result is one scenario's table.
type Result struct {
	Scenario *Scenario
	Rows     []*Row // in the order of Report.Libraries
}

// Row is one library's outcome in one scenario.
type Row struct {
	Library string
	// Values holds the median over rounds of each metric.
	Values map[string]float64
	// Samples holds every round's value of each metric.
	Samples map[string][]float64
	Rounds  int
	Errors  int64
	// Mix is the server's calls of each command, summed over rounds, and
	// MixOps the operations they served.
	Mix         map[string]int64
	MixOps      float64
	Notes       []string
	Unsupported bool
}

// Row returns the row of the named library, or nil.
func (r *Result) Row(lib string) *Row {
	for _, row := range r.Rows {
		if row.Library == lib {
			return row
		}
	}
	return nil
}

// Machine describes where a run ran.
type Machine struct {
	NProc        int
	GOMAXPROCS   int
	GoVersion    string
	OSArch       string
	CPU          string
	RedisVersion string
	Pinning      string
	Versions     []string // module versions of the libraries
	// LoadBefore is the 1-minute load average before the run: other work
	// on the machine shows there.
	LoadBefore string
}

// LoadAverage returns the 1-minute load average from /proc/loadavg.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// DescribeMachine collects what is known of this machine; pinning says how
// the processes were placed on CPUs.
func DescribeMachine(srv *Server, pinning string) Machine {
	m := Machine{
		NProc: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		GoVersion: runtime.Version(), OSArch: runtime.GOOS + "/" + runtime.GOARCH,
		CPU: cpuModel(), RedisVersion: srv.Version, Pinning: pinning,
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/dlockio/dlock", "github.com/dlockio/dlock/rueidis", "github.com/dlockio/dlock/redigo",
				"github.com/bsm/redislock", "github.com/go-redsync/redsync/v4",
				"github.com/redis/rueidis", "github.com/redis/go-redis/v9", "github.com/gomodule/redigo":
				v := d.Version
				if d.Replace != nil {
					v = "this tree (" + d.Replace.Path + ")"
				}
				m.Versions = append(m.Versions, d.Path+" "+v)
			}
		}
	}
	return m
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// Run runs every scenario in scenarios with every library in libs against
// srv. Within a scenario it runs rounds; each round gives every library one
// slice, starting with a different library each round, so that slow drift
// of the machine spreads over all of them. Progress goes to progress.
func Run(ctx context.Context, cfg Config, srv *Server, libs []Library, scenarios []*Scenario, progress io.Writer) (*Report, error) {
	rep := &Report{Started: time.Now(), Config: cfg, Libraries: libs, OtherCPU: -1}
	r := newRunner(cfg, srv)
	busy0, busyOK := machineBusy()
	self0 := processCPU()
	srv0, srvErr := srv.CPU(ctx)
	defer func() {
		busy1, ok := machineBusy()
		srv1, err := srv.CPU(context.Background())
		if busyOK && ok && srvErr == nil && err == nil && rep.Elapsed > 0 {
			other := (busy1 - busy0) - (processCPU() - self0) - (srv1 - srv0)
			rep.OtherCPU = max(float64(other)/float64(rep.Elapsed), 0)
		}
	}()
	for _, sc := range scenarios {
		res := &Result{Scenario: sc}
		for _, lib := range libs {
			res.Rows = append(res.Rows, &Row{Library: lib.Name, Values: map[string]float64{}, Samples: map[string][]float64{}})
		}
		rounds := sc.rounds(cfg)
		for round := range rounds {
			for i := range libs {
				k := (i + round) % len(libs)
				lib, row := libs[k], res.Rows[k]
				if row.Unsupported {
					continue
				}
				if err := ctx.Err(); err != nil {
					return rep, err
				}
				if err := srv.Flush(ctx); err != nil {
					return rep, fmt.Errorf("FLUSHALL: %w", err)
				}
				s, err := sc.slice(r, lib)
				row.Errors += s.errors
				if s.note != "" {
					row.Notes = append(row.Notes, fmt.Sprintf("round %d: %s", round+1, strings.TrimSuffix(strings.TrimSpace(s.note), ";")))
				}
				switch {
				case errors.Is(err, ErrUnsupported):
					row.Unsupported = true
					fmt.Fprintf(progress, "[%d %s] %-12s not supported\n", sc.ID, sc.Title, lib.Name)
					continue
				case err != nil:
					row.Notes = append(row.Notes, fmt.Sprintf("round %d failed: %v", round+1, err))
					fmt.Fprintf(progress, "[%d %s] %-12s round %d/%d failed: %v\n", sc.ID, sc.Title, lib.Name, round+1, rounds, err)
					continue
				}
				row.Rounds++
				if s.ops > 0 {
					if row.Mix == nil {
						row.Mix = map[string]int64{}
					}
					for k, v := range s.mix {
						row.Mix[k] += v
					}
					row.MixOps += s.ops
				}
				for key, v := range s.values {
					row.Samples[key] = append(row.Samples[key], v)
				}
				fmt.Fprintf(progress, "[%d %s] %-12s round %d/%d: %s\n", sc.ID, sc.Title, lib.Name, round+1, rounds, brief(sc, s.values))
			}
		}
		for _, row := range res.Rows {
			for key, vs := range row.Samples {
				row.Values[key] = median(vs)
			}
		}
		rep.Results = append(rep.Results, res)
	}
	rep.Elapsed = time.Since(rep.Started)
	return rep, nil
}

func brief(sc *Scenario, vs map[string]float64) string {
	var parts []string
	for _, m := range sc.Metrics {
		if v, ok := vs[m.Key]; ok {
			parts = append(parts, m.Label+" "+formatNum(v))
		}
	}
	return strings.Join(parts, ", ")
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
