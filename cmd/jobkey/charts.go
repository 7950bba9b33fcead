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
	"jobkey":   color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	"multikey": color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
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

// drawCharts writes the report's PNG charts and returns their names.
func drawCharts(dir string, results []bench.Result) ([]string, error) {
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
