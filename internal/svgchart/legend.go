package svgchart

import (
	"fmt"
	"image/color"
	"strings"
)

// legendEntry is one name of a legend with its color, and the marker of
// its series (marker < 0: a filled swatch, as for a bar).
type legendEntry struct {
	name   string
	color  color.RGBA
	marker int
}

const (
	legendRow    = 18 // pixels between two rows of the legend
	legendSwatch = 26 // width of an entry's swatch, its gap included
	legendGap    = 18 // between two entries of a row
)

// legendRows lays the entries out in rows no wider than width, in order:
// the index of each row's first entry.
func legendRows(entries []legendEntry, width float64) []int {
	var rows []int
	used := 0.0
	for i, e := range entries {
		w := legendSwatch + textWidth(e.name, labelSize)
		if i == 0 || used+legendGap+w > width {
			rows, used = append(rows, i), w
			continue
		}
		used += legendGap + w
	}
	return rows
}

// legend draws the entries from (x, y), y being the first row's middle,
// in the rows of legendRows; it returns the height it took.
func (d *doc) legend(entries []legendEntry, x, y, width float64) float64 {
	rows := legendRows(entries, width)
	for r, first := range rows {
		last := len(entries)
		if r+1 < len(rows) {
			last = rows[r+1]
		}
		cx, cy := x, y+float64(r*legendRow)
		for _, e := range entries[first:last] {
			fill := hex(e.color)
			if e.marker < 0 {
				d.rect("legend", cx, cy-5, 16, 10, fill, "")
			} else {
				d.line("legend", cx, cy, cx+18, cy, fill, 2)
				d.marker("legend", e.marker, cx+9, cy, fill, "")
			}
			d.text("legend", cx+legendSwatch, cy+4, labelSize, "start", 0, false, e.name)
			cx += legendSwatch + textWidth(e.name, labelSize) + legendGap
		}
	}
	return float64(len(rows) * legendRow)
}

// marker draws the marker of series i at (x, y): a circle, a square, a
// triangle, a diamond or an inverted triangle, in turn, so series stay
// apart without their colors.
func (d *doc) marker(class string, i int, x, y float64, fill, title string) {
	const r = 4
	attrs := fmt.Sprintf(`class="%s" fill="%s" stroke="#ffffff" stroke-width="0.5"`, class, fill)
	var corners [][2]float64
	switch i % 5 {
	case 0:
		d.elem("circle", fmt.Sprintf(`%s cx="%s" cy="%s" r="%s"`, attrs, num(x), num(y), num(r)), title)
		return
	case 1:
		corners = [][2]float64{{-r, -r}, {r, -r}, {r, r}, {-r, r}}
	case 2:
		corners = [][2]float64{{0, -r * 1.2}, {r * 1.1, r * 0.8}, {-r * 1.1, r * 0.8}}
	case 3:
		corners = [][2]float64{{0, -r * 1.3}, {r * 1.3, 0}, {0, r * 1.3}, {-r * 1.3, 0}}
	default:
		corners = [][2]float64{{-r * 1.1, -r * 0.8}, {r * 1.1, -r * 0.8}, {0, r * 1.2}}
	}
	pts := make([]string, len(corners))
	for k, c := range corners {
		pts[k] = num(x+c[0]) + "," + num(y+c[1])
	}
	d.elem("polygon", fmt.Sprintf(`%s points="%s"`, attrs, strings.Join(pts, " ")), title)
}
