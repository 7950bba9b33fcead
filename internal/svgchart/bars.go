package svgchart

import (
	"image/color"
	"math"
	"strings"
)

// Segment is one part of a stacked bar.
type Segment struct {
	Name  string // what it measures, in the bar's tooltip ("client")
	Value float64
	Color color.RGBA
}

// Bar is one bar of a group, its segments stacked from zero in order. A
// segment that is negative or not finite is left out.
type Bar struct {
	Name     string // its series ("jobkey"), in its tooltip
	Segments []Segment
}

// Group is a labelled row of bars, one per series that has a value there.
type Group struct {
	Label string
	Bars  []Bar
}

// LegendItem names a color of a bar chart.
type LegendItem struct {
	Name  string
	Color color.RGBA
}

// Bars is a horizontal bar chart: a row per group, top to bottom in order,
// each with its bars, and the values written at each bar's end. The
// chart is as tall as its groups need.
type Bars struct {
	Title  string
	XLabel string // the value axis's name and unit
	Unit   string // after each value in the bars' tooltips ("µs")
	Groups []Group
	Legend []LegendItem
	// Width is the document's width in pixels (default 700); it grows
	// when the group labels need it.
	Width float64
}

// Sizes of a bar chart, in pixels.
const (
	barHeight   = 12
	barGap      = 2
	groupPad    = 8
	barsRight   = 90 // room for the value written after the longest bar
	barsBottom  = 52
	barsMinPlot = 420
)

// SVG returns the chart as an SVG document.
func (c *Bars) SVG() []byte {
	left := 90.0
	for _, g := range c.Groups {
		left = math.Max(left, 16+textWidth(g.Label, tickSize))
	}
	width := c.Width
	if width <= 0 {
		width = 700
	}
	width = math.Max(width, left+barsMinPlot+barsRight)
	right := width - barsRight

	entries := make([]legendEntry, len(c.Legend))
	for i, l := range c.Legend {
		entries[i] = legendEntry{name: l.Name, color: l.Color, marker: -1}
	}
	top := 38 + float64(len(legendRows(entries, width-left-24))*legendRow) + 8
	bottom := top
	for _, g := range c.Groups {
		bottom += groupHeight(g)
	}
	height := bottom + barsBottom

	var d doc
	d.open(width, height)
	d.text("title", width/2, 22, titleSize, "middle", 0, true, c.Title)
	d.legend(entries, left, 42, width-left-24)

	widest := 0.0
	for _, g := range c.Groups {
		for _, b := range g.Bars {
			widest = math.Max(widest, total(b))
		}
	}
	_, xmax, xticks := valueAxis(0, widest)
	xs := scale{min: 0, max: xmax, from: left, to: right}
	for _, t := range xticks {
		x := xs.at(t.Value)
		d.line("grid", x, top, x, bottom, "#e5e5e5", 1)
		d.text("tick", x, bottom+17, tickSize, "middle", 0, false, t.Label)
	}

	y := top
	for gi, g := range c.Groups {
		h := groupHeight(g)
		if gi > 0 {
			d.line("separator", left-6, y, right, y, "#cccccc", 0.5)
		}
		d.text("group", left-8, y+h/2+4, tickSize, "end", 0, false, g.Label)
		by := y + groupPad
		for _, b := range g.Bars {
			x := left
			var parts []string
			for _, s := range b.Segments {
				if !finite(s.Value) || s.Value < 0 {
					continue
				}
				w := xs.at(s.Value) - left
				d.rect("bar", x, by, w, barHeight, hex(s.Color), c.barTitle(g, b, s))
				x += w
				parts = append(parts, Value(s.Value))
			}
			d.text("value", x+4, by+barHeight-2, tickSize-1, "start", 0, false, strings.Join(parts, " + "))
			by += barHeight + barGap
		}
		y += h
	}
	d.line("axis", left, bottom, right, bottom, "#333333", 1)
	d.line("axis", left, top, left, bottom, "#333333", 1)
	d.text("label", (left+right)/2, height-12, labelSize, "middle", 0, false, c.XLabel)
	d.close()
	return d.b.Bytes()
}

// groupHeight is the height of a group's row: its bars and some room.
func groupHeight(g Group) float64 {
	n := max(len(g.Bars), 1)
	return float64(n*(barHeight+barGap)-barGap) + 2*groupPad
}

// total is how long a bar is drawn: its segments that are drawn.
func total(b Bar) float64 {
	t := 0.0
	for _, s := range b.Segments {
		if finite(s.Value) && s.Value >= 0 {
			t += s.Value
		}
	}
	return t
}

// barTitle is a segment's tooltip: "enqueue 1KiB c=8, jobkey: client 100 µs".
func (c *Bars) barTitle(g Group, b Bar, s Segment) string {
	v := Value(s.Value)
	if c.Unit != "" {
		v += " " + c.Unit
	}
	return g.Label + ", " + b.Name + ": " + s.Name + " " + v
}
