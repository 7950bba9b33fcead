package main

import (
	"cmp"
	"fmt"
	"image/color"
	"path/filepath"
	"slices"

	"github.com/jobkey/jobkey/bench"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

var designColor = map[string]color.Color{
	"jobkey":     color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	"multikey":   color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	"asynq":      color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	"asynq-fast": color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
}

// series collects one line per design from the results of a scenario.
func series(results []bench.Result, scenario string, x func(bench.Result) float64, y func(bench.Result) float64) map[string]plotter.XYs {
	out := map[string]plotter.XYs{}
	for _, r := range results {
		if r.Scenario == scenario {
			out[r.Design] = append(out[r.Design], plotter.XY{X: x(r), Y: y(r)})
		}
	}
	for _, xys := range out {
		slices.SortFunc(xys, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
	}
	return out
}

// drawCharts writes the report's PNG charts and returns their names: the
// line charts of the scenarios, then the CPU per job of every run
// (drawCPUChart).
func drawCharts(dir string, rep report) ([]string, error) {
	results := rep.Results
	size := func(r bench.Result) float64 { return float64(r.Payload) }
	charts := []struct {
		file, title, x, y, scenario string
		xf, yf                      func(bench.Result) float64
	}{
		{"throughput-vs-payload.png", "Lifecycle throughput against payload", "payload", "jobs/s",
			bench.Lifecycle, size, bench.Result.Throughput},
		{"throughput-vs-payload-batched.png", "Batched lifecycle throughput against payload", "payload", "jobs/s",
			bench.LifecycleBatch, size, bench.Result.Throughput},
		{"bytes-per-lifecycle.png", "Wire bytes per job lifecycle", "payload", "bytes sent + received per job",
			bench.Lifecycle, size, func(r bench.Result) float64 { return r.Per(r.Wire.BytesIn + r.Wire.BytesOut) }},
		{"conflicts-vs-contention.png", "Conflicts per op: N writers on one job", "writers", "aborted EXECs per op",
			bench.Contended, func(r bench.Result) float64 { return float64(r.Clients) }, func(r bench.Result) float64 { return r.Per(r.Conflicts) }},
		{"conflicts-vs-claimers.png", "Conflicts per job: N claimers draining one queue", "claimers", "aborted EXECs per job",
			bench.Drain, func(r bench.Result) float64 { return float64(r.Clients) }, func(r bench.Result) float64 { return r.Per(r.Conflicts) }},
	}
	var written []string
	for _, c := range charts {
		lines := series(results, c.scenario, c.xf, c.yf)
		if len(lines) == 0 {
			continue
		}
		p := plot.New()
		p.Title.Text, p.X.Label.Text, p.Y.Label.Text = c.title, c.x, c.y
		p.Add(plotter.NewGrid())
		for i, d := range bench.Designs {
			xys, ok := lines[d]
			if !ok {
				continue
			}
			l, pts, err := plotter.NewLinePoints(xys)
			if err != nil {
				return nil, fmt.Errorf("chart %s: %w", c.file, err)
			}
			l.Color, pts.Color = designColor[d], designColor[d]
			pts.Shape = plotutil.Shape(i)
			p.Add(l, pts)
			p.Legend.Add(d, l, pts)
		}
		if c.xf != nil && c.x == "payload" {
			p.X.Scale = plot.LogScale{}
			p.X.Tick.Marker = sizeTicks(lines)
		}
		p.Legend.Top = true
		path := filepath.Join(dir, c.file)
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
			return nil, fmt.Errorf("chart %s: %w", c.file, err)
		}
		written = append(written, path)
	}
	cpu, err := drawCPUChart(dir, cpuGroups(results, rep.Work), rep.RedisCPU)
	if err != nil {
		return nil, err
	}
	if cpu != "" {
		written = append(written, cpu)
	}
	return written, nil
}

// sizeTicks labels the payload sizes that were measured.
func sizeTicks(lines map[string]plotter.XYs) plot.ConstantTicks {
	seen := map[float64]bool{}
	var ticks plot.ConstantTicks
	for _, xys := range lines {
		for _, xy := range xys {
			if !seen[xy.X] {
				seen[xy.X] = true
				ticks = append(ticks, plot.Tick{Value: xy.X, Label: sizeName(int(xy.X))})
			}
		}
	}
	slices.SortFunc(ticks, func(a, b plot.Tick) int { return cmp.Compare(a.Value, b.Value) })
	return ticks
}

// cpuChartFile is the chart of CPU per job by design.
const cpuChartFile = "cpu-per-job.png"

// cpuBar is one design's CPU per job at one measured point, in µs.
type cpuBar struct {
	design        string
	client, redis float64
}

// cpuGroup is one measured point of the CPU chart (a scenario at a payload
// and a concurrency), with a bar per design that ran it.
type cpuGroup struct {
	label string
	bars  []cpuBar
}

// cpuGroups collects the CPU per job of every run, one group per measured
// point, in report order: the scenarios, then the worker runs.
func cpuGroups(results []bench.Result, work []bench.WorkResult) []cpuGroup {
	var groups []cpuGroup
	index := map[string]int{}
	add := func(label, design string, client, redis float64) {
		i, ok := index[label]
		if !ok {
			i = len(groups)
			index[label] = i
			groups = append(groups, cpuGroup{label: label})
		}
		groups[i].bars = append(groups[i].bars, cpuBar{design: design, client: max(client, 0), redis: max(redis, 0)})
	}
	for _, r := range results {
		client, redis, _, _ := r.CPU.PerJob(r.Jobs)
		add(fmt.Sprintf("%s %s c=%d", r.Scenario, sizeName(r.Payload), r.Clients), r.Design, client, redis)
	}
	for _, r := range work {
		client, redis, _, _ := r.CPU.PerJob(r.Jobs)
		label := fmt.Sprintf("%s %s %d slots", r.Scenario, sizeName(r.Payload), r.Slots)
		if r.Pacing != nil {
			label += fmt.Sprintf(" %.0f/s", r.Pacing.Rate)
		}
		add(label, r.Design, client, redis)
	}
	return groups
}

// drawCPUChart writes cpuChartFile into dir: for every measured point a bar
// per design, the client's CPU per job with Redis's stacked on it. When
// the server does not report its CPU (redisCPU false), the bars are the
// client's alone and the title says so. It returns the file's path, or ""
// when there is nothing to draw.
func drawCPUChart(dir string, groups []cpuGroup, redisCPU bool) (string, error) {
	if len(groups) == 0 {
		return "", nil
	}
	const barWidth = 0.16 * vg.Inch
	p := plot.New()
	p.Title.Text = "CPU per job by design"
	p.X.Label.Text = "µs of CPU per job: the client's (dark) and Redis's (light) stacked"
	if !redisCPU {
		p.Title.Text += " (Redis CPU n/a: the server does not report it)"
		p.X.Label.Text = "µs of client CPU per job"
	}
	grid := plotter.NewGrid()
	grid.Horizontal.Color = nil
	p.Add(grid)
	labels := make([]string, len(groups))
	legend := map[string]bool{}
	widest, most := 0.0, 1
	for gi, g := range groups {
		y := float64(len(groups) - 1 - gi) // the first group on top
		labels[len(groups)-1-gi] = g.label
		most = max(most, len(g.bars))
		for bi, b := range g.bars {
			client, err := hbar(b.client, y, vg.Length(float64(len(g.bars)-1)/2-float64(bi))*barWidth, barWidth, colorOf(b.design))
			if err != nil {
				return "", fmt.Errorf("chart %s: %w", cpuChartFile, err)
			}
			p.Add(client)
			top := b.client
			if redisCPU {
				redis, err := hbar(b.redis, y, 0, barWidth, lighter(colorOf(b.design)))
				if err != nil {
					return "", fmt.Errorf("chart %s: %w", cpuChartFile, err)
				}
				redis.StackOn(client)
				p.Add(redis)
				top += b.redis
			}
			widest = max(widest, top)
			if !legend[b.design] {
				legend[b.design] = true
				p.Legend.Add(b.design, client)
			}
		}
	}
	p.NominalY(labels...)
	// Each group gets one unit of the Y axis, tall enough for its bars.
	p.Y.Min, p.Y.Max = -0.5, float64(len(groups))-0.5
	p.X.Min, p.X.Max = 0, max(widest, 1)*1.3 // room on the right for the legend
	p.Legend.Top = true
	height := max(4.5*vg.Inch, 1.2*vg.Inch+vg.Length(len(groups))*(vg.Length(most)*barWidth+0.25*vg.Inch))
	path := filepath.Join(dir, cpuChartFile)
	if err := p.Save(7*vg.Inch, height, path); err != nil {
		return "", fmt.Errorf("chart %s: %w", cpuChartFile, err)
	}
	return path, nil
}

// hbar is a horizontal bar of length v at category y, moved by offset
// within its group, with no outline.
func hbar(v, y float64, offset, width vg.Length, c color.Color) (*plotter.BarChart, error) {
	b, err := plotter.NewBarChart(plotter.Values{v}, width)
	if err != nil {
		return nil, err
	}
	b.Horizontal, b.XMin, b.Offset, b.Color = true, y, offset, c
	b.LineStyle.Width = 0
	return b, nil
}

// colorOf is a design's color, gray for a design without one.
func colorOf(design string) color.Color {
	if c, ok := designColor[design]; ok {
		return c
	}
	return color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}
}

// lighter blends c halfway to white: Redis's share of a design's bar.
func lighter(c color.Color) color.Color {
	r, g, b, _ := c.RGBA()
	mix := func(v uint32) uint8 { return uint8((v>>8 + 0xff) / 2) }
	return color.RGBA{R: mix(r), G: mix(g), B: mix(b), A: 0xff}
}
