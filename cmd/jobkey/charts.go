package main

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/jobkey/jobkey/bench"
	"github.com/jobkey/jobkey/internal/svgchart"
)

var designColor = map[string]color.RGBA{
	"jobkey":     {R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	"multikey":   {R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	"asynq":      {R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	"asynq-fast": {R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
}

// series collects one line per design from the results of a scenario, in
// the order of bench.Designs.
func series(results []bench.Result, scenario string, x func(bench.Result) float64, y func(bench.Result) float64) []svgchart.Series {
	points := map[string][]svgchart.Point{}
	for _, r := range results {
		if r.Scenario == scenario {
			points[r.Design] = append(points[r.Design], svgchart.Point{X: x(r), Y: y(r)})
		}
	}
	var out []svgchart.Series
	for _, d := range bench.Designs {
		if pts, ok := points[d]; ok {
			out = append(out, svgchart.Series{Name: d, Color: colorOf(d), Points: pts})
		}
	}
	return out
}

// drawCharts writes the report's SVG charts and returns their paths: the
// line charts of the scenarios, then the CPU per job of every run
// (drawCPUChart).
func drawCharts(dir string, rep report) ([]string, error) {
	results := rep.Results
	size := func(r bench.Result) float64 { return float64(r.Payload) }
	clients := func(r bench.Result) float64 { return float64(r.Clients) }
	charts := []struct {
		file, title, x, y, scenario string
		xf, yf                      func(bench.Result) float64
	}{
		{"throughput-vs-payload.svg", "Lifecycle throughput against payload", "payload", "jobs/s",
			bench.Lifecycle, size, bench.Result.Throughput},
		{"throughput-vs-payload-batched.svg", "Batched lifecycle throughput against payload", "payload", "jobs/s",
			bench.LifecycleBatch, size, bench.Result.Throughput},
		{"bytes-per-lifecycle.svg", "Wire bytes per job lifecycle", "payload", "bytes sent + received per job",
			bench.Lifecycle, size, func(r bench.Result) float64 { return r.Per(r.Wire.BytesIn + r.Wire.BytesOut) }},
		{"conflicts-vs-contention.svg", "Conflicts per op: N writers on one job", "writers", "aborted EXECs per op",
			bench.Contended, clients, func(r bench.Result) float64 { return r.Per(r.Conflicts) }},
		{"conflicts-vs-claimers.svg", "Conflicts per job: N claimers draining one queue", "claimers", "aborted EXECs per job",
			bench.Drain, clients, func(r bench.Result) float64 { return r.Per(r.Conflicts) }},
	}
	var written []string
	for _, c := range charts {
		lines := series(results, c.scenario, c.xf, c.yf)
		if len(lines) == 0 {
			continue
		}
		chart := svgchart.Lines{Title: c.title, XLabel: c.x, YLabel: c.y, Series: lines}
		if c.x == "payload" {
			chart.LogX, chart.XTicks = true, measuredTicks(lines, func(v float64) string { return sizeName(int(v)) })
		} else {
			chart.XTicks = measuredTicks(lines, func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) })
		}
		path := filepath.Join(dir, c.file)
		if err := os.WriteFile(path, chart.SVG(), 0o644); err != nil {
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

// measuredTicks labels the X values that were measured (the payload
// sizes, the numbers of clients), in order.
func measuredTicks(lines []svgchart.Series, label func(float64) string) []svgchart.Tick {
	var xs []float64
	for _, s := range lines {
		for _, p := range s.Points {
			xs = append(xs, p.X)
		}
	}
	slices.Sort(xs)
	ticks := make([]svgchart.Tick, 0, len(xs))
	for _, x := range slices.Compact(xs) {
		ticks = append(ticks, svgchart.Tick{Value: x, Label: label(x)})
	}
	return ticks
}

// cpuChartFile is the chart of CPU per job by design.
const cpuChartFile = "cpu-per-job.svg"

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
	chart := svgchart.Bars{
		Title:  "CPU per job by design",
		XLabel: "µs of CPU per job: the client's (dark) and Redis's (light) stacked",
		Unit:   "µs",
	}
	if !redisCPU {
		chart.Title += " (Redis CPU n/a: the server does not report it)"
		chart.XLabel = "µs of client CPU per job"
	}
	legend := map[string]bool{}
	for _, g := range groups {
		group := svgchart.Group{Label: g.label}
		for _, b := range g.bars {
			bar := svgchart.Bar{Name: b.design, Segments: []svgchart.Segment{{Name: "client", Value: b.client, Color: colorOf(b.design)}}}
			if redisCPU {
				bar.Segments = append(bar.Segments, svgchart.Segment{Name: "Redis", Value: b.redis, Color: lighter(colorOf(b.design))})
			}
			group.Bars = append(group.Bars, bar)
			if !legend[b.design] {
				legend[b.design] = true
				chart.Legend = append(chart.Legend, svgchart.LegendItem{Name: b.design, Color: colorOf(b.design)})
			}
		}
		chart.Groups = append(chart.Groups, group)
	}
	path := filepath.Join(dir, cpuChartFile)
	if err := os.WriteFile(path, chart.SVG(), 0o644); err != nil {
		return "", fmt.Errorf("chart %s: %w", cpuChartFile, err)
	}
	return path, nil
}

// colorOf is a design's color, gray for a design without one.
func colorOf(design string) color.RGBA {
	if c, ok := designColor[design]; ok {
		return c
	}
	return color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}
}

// lighter blends c halfway to white: Redis's share of a design's bar.
func lighter(c color.RGBA) color.RGBA {
	mix := func(v uint8) uint8 { return uint8((uint16(v) + 0xff) / 2) }
	return color.RGBA{R: mix(c.R), G: mix(c.G), B: mix(c.B), A: 0xff}
}
