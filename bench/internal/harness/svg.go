package harness

import (
	"fmt"
	"math"
	"strings"
)

// libColors are the bar colours, by position in Report.Libraries.
var libColors = []string{"#8c8c8c", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#e377c2"}

// chartPanel is one chart of grouped bars: a group per scenario, a bar per
// library.
type chartPanel struct {
	title string
	log   bool // log10 scale; otherwise linear from 0
	ratio bool // values are ratios: a dashed line at 1
	// value returns the bar's value; ok false draws no bar, with "n/s"
	// under it when the library does not support the scenario.
	value func(res *Result, lib string) (v float64, ok bool)
	// groups are the scenarios shown, with their labels.
	groups []chartGroup
}

type chartGroup struct {
	res   *Result
	label string
}

// SVG renders the chart of the report: throughput ratios to the floor, and
// commands per acquisition as the server counts them and as the client
// sends them, per scenario and library.
func (rep *Report) SVG() string {
	var thr, cost []chartGroup
	for _, res := range rep.Results {
		sc := res.Scenario
		label := fmt.Sprintf("%d %s", sc.ID, sc.Short)
		if sc.Headline != "" {
			thr = append(thr, chartGroup{res, label})
		}
		if sc.ID == 6 {
			label = "6 per lock refresh"
		}
		cost = append(cost, chartGroup{res, label})
	}
	perAcq := func(key6, key string) func(res *Result, lib string) (float64, bool) {
		return func(res *Result, lib string) (float64, bool) {
			row := res.Row(lib)
			if row == nil || row.Unsupported || row.Rounds == 0 {
				return 0, false
			}
			k := key
			if res.Scenario.ID == 6 {
				k = key6
			}
			v, ok := row.Values[k]
			return v, ok && v > 0
		}
	}
	panels := []chartPanel{
		{
			title: "Throughput ÷ floor (log scale, higher is better)", groups: thr, log: true, ratio: true,
			value: func(res *Result, lib string) (float64, bool) {
				row, floor := res.Row(lib), res.Row(FloorName)
				if row == nil || floor == nil || row.Unsupported || row.Rounds == 0 || floor.Rounds == 0 {
					return 0, false
				}
				k := res.Scenario.Headline
				f := floor.Values[k]
				if f == 0 {
					return 0, false
				}
				return row.Values[k] / f, true
			},
		},
		{
			title: "Server commands per acquisition, INFO commandstats incl. commands run by scripts (log scale, lower is better)",
			log:   true, groups: cost, value: perAcq("cmds_per_lock", "cmds"),
		},
		{
			title: "Requests per acquisition, top-level commands sent, EVALSHA = 1 (log scale, lower is better)",
			log:   true, groups: cost, value: perAcq("reqs_per_lock", "reqs"),
		},
	}

	const width, panelH, top = 980, 270, 64
	var b strings.Builder
	height := top + len(panels)*panelH + 10
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="12" y="22" font-size="15" font-weight="bold">%s</text>`+"\n",
		esc(fmt.Sprintf("dlock benchmark, %s: medians of %s (%s preset)", rep.Started.UTC().Format("2006-01-02"), rep.roundsText(), rep.Preset)))
	fmt.Fprintf(&b, `<text x="12" y="38" fill="#555">%s</text>`+"\n",
		esc(fmt.Sprintf("%d CPUs, %s, redis-server %s, %s", rep.Machine.NProc, rep.Machine.GoVersion, rep.Machine.RedisVersion, rep.Machine.Pinning)))
	// Legend.
	x := 12
	for i, lib := range rep.Libraries {
		fmt.Fprintf(&b, `<rect x="%d" y="48" width="12" height="10" fill="%s"/><text x="%d" y="57">%s</text>`+"\n",
			x, libColors[i%len(libColors)], x+16, esc(lib.Name))
		x += 24 + 7*len(lib.Name)
	}
	for i, p := range panels {
		rep.drawPanel(&b, p, 0, top+i*panelH, width, panelH)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func (rep *Report) drawPanel(b *strings.Builder, p chartPanel, x0, y0, w, h int) {
	const left, right, titleH, labelH = 58, 12, 22, 34
	px0, px1 := x0+left, x0+w-right
	py0, py1 := y0+titleH, y0+h-labelH // plot area, top to bottom
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="12" font-weight="bold">%s</text>`+"\n", x0+12, y0+14, esc(p.title))
	if len(p.groups) == 0 {
		return
	}
	// Scale.
	lo, hi := math.Inf(1), 0.0
	for _, g := range p.groups {
		for _, lib := range rep.Libraries {
			if v, ok := p.value(g.res, lib.Name); ok {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if hi == 0 {
		return
	}
	var ymap func(v float64) float64
	var ticks []float64
	if p.log {
		// The smallest bar keeps a visible height: at least 0.15 of a
		// decade above the axis.
		dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if math.Log10(lo)-dlo < 0.15 {
			dlo--
		}
		if p.ratio {
			dlo, dhi = math.Min(dlo, -1), math.Max(dhi, 1)
		}
		if dhi == dlo {
			dhi++
		}
		ymap = func(v float64) float64 {
			return float64(py1) - (math.Log10(v)-dlo)/(dhi-dlo)*float64(py1-py0)
		}
		for d := dlo; d <= dhi; d++ {
			ticks = append(ticks, math.Pow(10, d))
		}
	} else {
		top := math.Max(1.2, hi*1.1)
		step := niceStep(top / 5)
		top = math.Ceil(top/step) * step
		ymap = func(v float64) float64 { return float64(py1) - v/top*float64(py1-py0) }
		for t := 0.0; t <= top+step/2; t += step {
			ticks = append(ticks, t)
		}
	}
	for _, t := range ticks {
		y := ymap(t)
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e4e4e4"/>`+"\n", px0, px1, y, y)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", px0-4, y+4, esc(tickLabel(t, p.log, p.ratio)))
	}
	if p.ratio {
		y := ymap(1)
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#333" stroke-dasharray="4 3"/>`+"\n", px0, px1, y, y)
	}
	fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#333"/>`+"\n", px0, px1, py1, py1)
	// Bars.
	gw := float64(px1-px0) / float64(len(p.groups))
	n := len(rep.Libraries)
	bw := gw * 0.84 / float64(n)
	for gi, g := range p.groups {
		gx := float64(px0) + float64(gi)*gw + gw*0.08
		for li, lib := range rep.Libraries {
			bx := gx + float64(li)*bw
			v, ok := p.value(g.res, lib.Name)
			if !ok {
				if row := g.res.Row(lib.Name); row != nil && row.Unsupported {
					fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle" font-size="8" fill="#999">n/s</text>`+"\n", bx+bw/2, py1-3)
				}
				continue
			}
			base := float64(py1)
			y := math.Min(ymap(v), base-1)
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>`+"\n",
				bx+0.5, y, bw-1, base-y, libColors[li%len(libColors)], esc(fmt.Sprintf("%s, %s: %s", lib.Name, g.label, formatNum(v))))
			label := formatNum(v)
			if p.ratio {
				label = formatRatio(v)
			}
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="8">%s</text>`+"\n", bx+bw/2, y-2, esc(label))
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", float64(px0)+(float64(gi)+0.5)*gw, py1+15, esc(g.label))
	}
}

func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func tickLabel(t float64, log, ratio bool) string {
	s := fmt.Sprintf("%g", math.Round(t*100)/100)
	if log && t >= 1 {
		s = groupThousands(fmt.Sprintf("%.0f", t))
	} else if log {
		s = fmt.Sprintf("%g", t)
	}
	if ratio {
		s += "×"
	}
	return s
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
