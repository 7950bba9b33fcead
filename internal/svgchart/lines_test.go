package svgchart

import (
	"fmt"
	"image/color"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	blue = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	red  = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
)

// center is where a marker is drawn: a circle's center, or the middle of
// a polygon's corners' bounding box.
func center(t *testing.T, e element) (x, y float64) {
	t.Helper()
	if e.name == "circle" {
		return attr(t, e, "cx"), attr(t, e, "cy")
	}
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, p := range strings.Fields(e.attrs["points"]) {
		var px, py float64
		_, err := fmt.Sscanf(p, "%f,%f", &px, &py)
		require.NoError(t, err)
		minX, maxX, minY, maxY = math.Min(minX, px), math.Max(maxX, px), math.Min(minY, py), math.Max(maxY, py)
	}
	return (minX + maxX) / 2, (minY + maxY) / 2
}

// Every point is drawn with its value and unit in its tooltip, higher
// values higher up, and on a logarithmic axis sizes 16 times apart are
// equally far apart. Each series is in the legend, in its color.
func TestLinesDrawEveryPointWithItsValue(t *testing.T) {
	t.Parallel()
	c := &Lines{Title: "Lifecycle throughput", XLabel: "payload", YLabel: "jobs/s", LogX: true,
		XTicks: []Tick{{64, "64B"}, {1024, "1KiB"}, {16384, "16KiB"}},
		Series: []Series{
			{Name: "jobkey", Color: blue, Points: []Point{{16384, 9000}, {64, 20000}, {1024, 18000}}},
			{Name: "multikey", Color: red, Points: []Point{{64, 30000}, {1024, 26000}, {16384, 12500.5}}},
		}}
	elems := parse(t, c.SVG())
	require.Equal(t, []string{"Lifecycle throughput"}, texts(elems, "title"))
	require.Equal(t, []string{"payload", "jobs/s"}, texts(elems, "label"))
	require.Equal(t, []string{"jobkey", "multikey"}, texts(elems, "legend"))
	for _, tick := range []string{"64B", "1KiB", "16KiB", "0", "10k", "20k", "30k"} {
		require.Contains(t, texts(elems, "tick"), tick)
	}

	points := withClass(elems, "point")
	require.Len(t, points, 6)
	byTitle := map[string]element{}
	for _, p := range points {
		byTitle[p.title] = p
	}
	for _, want := range []string{
		"jobkey: 20000 jobs/s at payload 64B", "jobkey: 18000 jobs/s at payload 1KiB", "jobkey: 9000 jobs/s at payload 16KiB",
		"multikey: 30000 jobs/s at payload 64B", "multikey: 26000 jobs/s at payload 1KiB", "multikey: 12501 jobs/s at payload 16KiB",
	} {
		require.Contains(t, byTitle, want)
	}
	x64, y64 := center(t, byTitle["multikey: 30000 jobs/s at payload 64B"])
	x1k, y1k := center(t, byTitle["multikey: 26000 jobs/s at payload 1KiB"])
	x16k, y16k := center(t, byTitle["multikey: 12501 jobs/s at payload 16KiB"])
	require.Less(t, y64, y1k, "more jobs/s is higher up")
	require.Less(t, y1k, y16k)
	require.InDelta(t, x1k-x64, x16k-x1k, 0.02, "16× apart, equally far apart")
	// Heights are linear in the value, and the X axis is at zero.
	_, y9k := center(t, byTitle["jobkey: 9000 jobs/s at payload 16KiB"])
	perJob := (y9k - y64) / (30000 - 9000)
	require.InDelta(t, y64+perJob*(30000-26000), y1k, 0.05)
	xAxis := withClass(elems, "axis")[len(withClass(elems, "axis"))-2]
	require.Equal(t, xAxis.attrs["y1"], xAxis.attrs["y2"], "the horizontal axis")
	require.InDelta(t, y64+perJob*30000, attr(t, xAxis, "y1"), 0.05)

	lines := withClass(elems, "line")
	require.Len(t, lines, 2)
	require.Equal(t, "#1f77b4", lines[0].attrs["stroke"])
	require.Equal(t, "#d62728", lines[1].attrs["stroke"])
	require.Len(t, strings.Fields(lines[0].attrs["points"]), 3, "a vertex per point")
	require.Equal(t, "polygon", points[3].name, "the second series has its own marker")
}

// A point that cannot be placed (NaN, ±Inf, X <= 0 on a logarithmic
// axis) is left out, a series left empty is not in the legend, and a
// chart with nothing to draw, or a single point, is still a whole document
// with finite coordinates.
func TestLinesLeaveOutPointsThatCannotBePlaced(t *testing.T) {
	t.Parallel()
	c := &Lines{Title: "t", XLabel: "payload", YLabel: "jobs/s", LogX: true, Series: []Series{
		{Name: "a", Points: []Point{{math.NaN(), 1}, {64, math.Inf(1)}, {0, 5}, {-1, 5}, {1024, 7}}},
		{Name: "b", Points: []Point{{math.NaN(), math.NaN()}}},
	}}
	doc := c.SVG()
	require.NotContains(t, string(doc), "NaN")
	require.NotContains(t, string(doc), "Inf")
	elems := parse(t, doc)
	require.Equal(t, []string{"a"}, texts(elems, "legend"))
	points := withClass(elems, "point")
	require.Len(t, points, 1)
	require.Equal(t, "a: 7 jobs/s at payload 1024", points[0].title)
	x, y := center(t, points[0])
	require.False(t, math.IsNaN(x) || math.IsNaN(y))
	require.Empty(t, withClass(elems, "line"), "one point: no line")

	for _, empty := range []*Lines{{}, {Series: []Series{{Name: "x"}}}, {LogX: true}} {
		elems := parse(t, empty.SVG())
		require.Empty(t, withClass(elems, "point"))
		require.NotContains(t, string(empty.SVG()), "NaN")
	}
}
