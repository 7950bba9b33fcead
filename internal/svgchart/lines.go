package svgchart

import (
	"fmt"
	"image/color"
	"math"
	"slices"
	"strings"
)

// Point is one measurement of a series.
type Point struct{ X, Y float64 }

// Series is one line of a line chart, drawn in Color with a marker on each
// point.
type Series struct {
	Name   string
	Color  color.RGBA
	Points []Point
}

// Lines is a line chart: a line per series over a shared X axis, with a
// legend of the series above the plot. The Y axis starts at zero (or at
// the lowest value when one is negative) and ends on a round number.
type Lines struct {
	Title  string
	XLabel string // the X axis's name and unit, also in the points' tooltips
	YLabel string // the Y axis's name and unit, also in the points' tooltips
	// LogX puts X on a logarithmic scale; points at X <= 0 are then left
	// out.
	LogX bool
	// XTicks are the X axis's ticks (the measured payload sizes, say);
	// nil chooses round values. A point whose X is a tick's is named by
	// the tick's label in its tooltip.
	XTicks []Tick
	Series []Series
	// Width and Height are the document's size in pixels (default 700 and
	// 450).
	Width, Height float64
}

// Margins of the plot area of a line chart, in pixels.
const (
	linesLeft   = 72
	linesRight  = 24
	linesBottom = 52
	linesInset  = 12
)

// SVG returns the chart as an SVG document.
func (c *Lines) SVG() []byte {
	width, height := c.Width, c.Height
	if width <= 0 {
		width = 700
	}
	if height <= 0 {
		height = 450
	}
	series := c.drawable()

	var d doc
	d.open(width, height)
	d.text("title", width/2, 22, titleSize, "middle", 0, true, c.Title)
	entries := make([]legendEntry, len(series))
	for i, s := range series {
		entries[i] = legendEntry{name: s.Name, color: s.Color, marker: i}
	}
	top := 38 + d.legend(entries, linesLeft, 42, width-linesLeft-linesRight) + 8
	left, right, bottom := float64(linesLeft), width-linesRight, height-linesBottom

	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), 0.0, 0.0
	for _, s := range series {
		for _, p := range s.Points {
			xmin, xmax = math.Min(xmin, p.X), math.Max(xmax, p.X)
			ymin, ymax = math.Min(ymin, p.Y), math.Max(ymax, p.Y)
		}
	}
	if math.IsInf(xmin, 0) { // nothing to draw: an empty frame
		xmin, xmax = 1, 1
	}
	xmin, xmax = domain(xmin, xmax, c.LogX)
	ymin, ymax, yticks := valueAxis(ymin, ymax)
	// The first and last points sit a little inside the frame, off the
	// Y axis.
	xs := scale{min: xmin, max: xmax, from: left + linesInset, to: right - linesInset, log: c.LogX}
	ys := scale{min: ymin, max: ymax, from: bottom, to: top}
	xticks := c.XTicks
	if xticks == nil {
		xticks = autoTicks(xmin, xmax, c.LogX)
	}

	// The grid and the Y axis's ticks.
	for _, t := range yticks {
		y := ys.at(t.Value)
		d.line("grid", left, y, right, y, "#e5e5e5", 1)
		d.text("tick", left-6, y+4, tickSize, "end", 0, false, t.Label)
	}
	lastEnd := math.Inf(-1)
	for _, t := range xticks {
		if !finite(t.Value) || t.Value < xmin || t.Value > xmax || (c.LogX && t.Value <= 0) {
			continue
		}
		x := xs.at(t.Value)
		d.line("grid", x, top, x, bottom, "#e5e5e5", 1)
		d.line("axis", x, bottom, x, bottom+4, "#333333", 1)
		// A label that would run into the one before is left out; its
		// grid line stays.
		if w := textWidth(t.Label, tickSize); x-w/2 > lastEnd+4 {
			d.text("tick", x, bottom+17, tickSize, "middle", 0, false, t.Label)
			lastEnd = x + w/2
		}
	}
	d.line("axis", left, bottom, right, bottom, "#333333", 1)
	d.line("axis", left, top, left, bottom, "#333333", 1)
	d.text("label", (left+right)/2, height-12, labelSize, "middle", 0, false, c.XLabel)
	d.text("label", 16, (top+bottom)/2, labelSize, "middle", -90, false, c.YLabel)

	for i, s := range series {
		fill := hex(s.Color)
		if len(s.Points) > 1 {
			pts := make([]string, len(s.Points))
			for k, p := range s.Points {
				pts[k] = num(xs.at(p.X)) + "," + num(ys.at(p.Y))
			}
			fmt.Fprintf(&d.b, `<polyline class="line" fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", fill, strings.Join(pts, " "))
		}
		for _, p := range s.Points {
			d.marker("point", i, xs.at(p.X), ys.at(p.Y), fill, c.pointTitle(s.Name, p))
		}
	}
	d.close()
	return d.b.Bytes()
}

// drawable returns the series with their points sorted by X, without the
// points that cannot be placed (a value that is not finite, an X at or
// below zero on a logarithmic axis), and without the series left empty.
func (c *Lines) drawable() []Series {
	var out []Series
	for _, s := range c.Series {
		var pts []Point
		for _, p := range s.Points {
			if finite(p.X) && finite(p.Y) && (!c.LogX || p.X > 0) {
				pts = append(pts, p)
			}
		}
		if len(pts) == 0 {
			continue
		}
		slices.SortStableFunc(pts, func(a, b Point) int {
			switch {
			case a.X < b.X:
				return -1
			case a.X > b.X:
				return 1
			}
			return 0
		})
		s.Points = pts
		out = append(out, s)
	}
	return out
}

// pointTitle is a point's tooltip: "jobkey: 1234 jobs/s at payload 1KiB".
func (c *Lines) pointTitle(series string, p Point) string {
	x := Value(p.X)
	for _, t := range c.XTicks {
		if t.Value == p.X {
			x = t.Label
			break
		}
	}
	return fmt.Sprintf("%s: %s %s at %s %s", series, Value(p.Y), c.YLabel, c.XLabel, x)
}
