package harness

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// FloorName is the library every ratio is taken against.
const FloorName = "floor"

// summaryColumns are the headline metrics of the summary table.
var summaryColumns = []struct {
	scenario int
	key      string
	label    string
}{
	{1, "pairs_s", "1 pairs/s"}, {1, "p50_us", "1 p50"}, {1, "allocs", "1 allocs"},
	{2, "pairs_s", "2 pairs/s"},
	{3, "acq_s", "3 acq/s"}, {3, "wake_p50_us", "3 wake p50"}, {3, "reqs", "3 reqs/acq"},
	{4, "acq_s", "4 acq/s"}, {4, "wake_p50_us", "4 wake p50"},
	{5, "acq_s", "5 handoffs/s"}, {5, "reqs", "5 reqs/handoff"}, {5, "cmds", "5 cmds/handoff"},
	{6, "reqs", "6 reqs/interval"}, {6, "reads", "6 reads/interval"},
}

// Markdown renders the report.
func (rep *Report) Markdown() string {
	var b strings.Builder
	m := rep.Machine
	fmt.Fprintf(&b, "# dlock benchmark, %s\n\n", rep.Started.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "- preset: **%s**; %s; run time %s\n", rep.Preset, rep.roundsText(), rep.Elapsed.Round(time.Second))
	fmt.Fprintf(&b, "- machine: %d CPUs (%s), %s, %s, GOMAXPROCS %d; redis-server %s on 127.0.0.1; %s\n",
		m.NProc, m.CPU, m.GoVersion, m.OSArch, m.GOMAXPROCS, m.RedisVersion, m.Pinning)
	if rep.OtherCPU >= 0 {
		fmt.Fprintf(&b, "- other work on the machine during the run: %.2f CPUs on average (CPU time of other processes, from /proc/stat); 1-minute load average %s before the run\n",
			rep.OtherCPU, m.LoadBefore)
	}
	if len(m.Versions) > 0 {
		fmt.Fprintf(&b, "- modules: %s\n", strings.Join(m.Versions, ", "))
	}
	b.WriteString("\nEvery cell is the median over rounds; a ratio is the library's value divided by the floor's. " +
		"Above 1 is better for rates (pairs/s, acq/s, handoffs/s); below 1 is better for latencies, allocations, commands and round trips. " +
		"**cmds** is what the server counted in `INFO commandstats`, which counts every command a script runs as well as the EVALSHA that ran it; " +
		"**reqs** is the commands the client sent (an EVALSHA is one), counted by a hook in the client.\n\n")

	b.WriteString("## Summary: ratio to the floor\n\n")
	b.WriteString("| library |")
	for _, c := range summaryColumns {
		if rep.result(c.scenario) != nil {
			fmt.Fprintf(&b, " %s |", c.label)
		}
	}
	b.WriteString("\n|---|")
	for _, c := range summaryColumns {
		if rep.result(c.scenario) != nil {
			b.WriteString("---:|")
		}
	}
	b.WriteString("\n")
	for _, lib := range rep.Libraries {
		fmt.Fprintf(&b, "| %s |", lib.Name)
		for _, c := range summaryColumns {
			res := rep.result(c.scenario)
			if res == nil {
				continue
			}
			fmt.Fprintf(&b, " %s |", ratioCell(res, lib.Name, c.key))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")

	for _, res := range rep.Results {
		rep.writeScenario(&b, res)
	}

	b.WriteString("## Libraries\n\n")
	for _, lib := range rep.Libraries {
		fmt.Fprintf(&b, "- **%s**: %s\n", lib.Name, lib.Setup)
	}
	b.WriteString("\n")
	return b.String()
}

func (rep *Report) roundsText() string {
	c := rep.Config
	rounds := "rounds"
	if c.Rounds == 1 {
		rounds = "round"
	}
	return fmt.Sprintf("%d %s of scenarios 1–4, %d of 5, %d of 6", c.Rounds, rounds, c.RoundsMany, c.RoundsRefresh)
}

func (rep *Report) result(id int) *Result {
	for _, r := range rep.Results {
		if r.Scenario.ID == id {
			return r
		}
	}
	return nil
}

func ratioCell(res *Result, lib, key string) string {
	row, floor := res.Row(lib), res.Row(FloorName)
	if row == nil || row.Unsupported {
		return "n/s"
	}
	v, ok := row.Values[key]
	if !ok {
		return "–"
	}
	if floor == nil {
		return formatNum(v)
	}
	f, ok := floor.Values[key]
	if !ok || f == 0 {
		return "–"
	}
	return formatRatio(v / f)
}

func (rep *Report) writeScenario(b *strings.Builder, res *Result) {
	sc := res.Scenario
	fmt.Fprintf(b, "## %d. %s\n\n%s.\n\n", sc.ID, sc.Title, upperFirst(sc.What))
	type column struct {
		label string
		cell  func(row, floor *Row) string
	}
	var cols []column
	for _, m := range sc.Metrics {
		switch {
		case m.Key == "worker_min":
			cols = append(cols, column{"acq/worker min–max", func(row, _ *Row) string {
				return formatNum(row.Values["worker_min"]) + "–" + formatNum(row.Values["worker_max"])
			}})
		case m.Key == "worker_max":
		default:
			cols = append(cols, column{m.Label, func(row, floor *Row) string {
				v, ok := row.Values[m.Key]
				if !ok {
					return "–"
				}
				s := formatNum(v)
				if !m.NoRatio && floor != nil && row != floor && !floor.Unsupported {
					if f := floor.Values[m.Key]; f != 0 {
						s += " (" + formatRatio(v/f) + ")"
					}
				}
				return s
			}})
		}
	}
	b.WriteString("| library |")
	for _, c := range cols {
		fmt.Fprintf(b, " %s |", c.label)
	}
	b.WriteString(" rounds | errors |\n|---|")
	for range cols {
		b.WriteString("---:|")
	}
	b.WriteString("---:|---:|\n")
	floor := res.Row(FloorName)
	var notes []string
	for _, row := range res.Rows {
		fmt.Fprintf(b, "| %s |", row.Library)
		if row.Unsupported {
			for range cols {
				b.WriteString(" n/s |")
			}
			b.WriteString(" – | – |\n")
			notes = append(notes, row.Library+": not supported by the library")
			continue
		}
		for _, c := range cols {
			if row.Rounds == 0 {
				b.WriteString(" – |")
				continue
			}
			fmt.Fprintf(b, " %s |", c.cell(row, floor))
		}
		fmt.Fprintf(b, " %d | %d |\n", row.Rounds, row.Errors)
		for _, n := range row.Notes {
			notes = append(notes, row.Library+", "+n)
		}
	}
	if len(notes) > 0 {
		b.WriteString("\n")
		for _, n := range notes {
			fmt.Fprintf(b, "- %s\n", n)
		}
	}
	fmt.Fprintf(b, "\n<details><summary>Server commands per %s, by name (INFO commandstats, all rounds)</summary>\n\n", sc.Unit)
	for _, row := range res.Rows {
		if row.MixOps == 0 {
			continue
		}
		fmt.Fprintf(b, "- %s: %s\n", row.Library, mixText(row.Mix, row.MixOps))
	}
	b.WriteString("\n</details>\n\n")
}

// mixText lists the commands of a mix per operation, most frequent first.
func mixText(mix map[string]int64, ops float64) string {
	names := make([]string, 0, len(mix))
	for k, v := range mix {
		if v > 0 {
			names = append(names, k)
		}
	}
	sort.Slice(names, func(i, j int) bool {
		if mix[names[i]] != mix[names[j]] {
			return mix[names[i]] > mix[names[j]]
		}
		return names[i] < names[j]
	})
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s %s", strings.ToUpper(k), formatNum(float64(mix[k])/ops))
	}
	return strings.Join(parts, ", ")
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// formatNum prints a value with about three significant digits.
func formatNum(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1000:
		return groupThousands(fmt.Sprintf("%.0f", v))
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a == 0:
		return "0"
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func formatRatio(r float64) string {
	if r >= 100 {
		return fmt.Sprintf("%.0f×", r)
	}
	if r >= 10 {
		return fmt.Sprintf("%.1f×", r)
	}
	return fmt.Sprintf("%.2f×", r)
}

func groupThousands(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
