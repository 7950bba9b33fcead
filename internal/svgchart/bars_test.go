package svgchart

import (
	"image/color"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// A bar's segments are stacked from the axis in order, each as long as its
// value, with the values written at the bar's end and in each segment's
// tooltip; the groups run top to bottom in order.
func TestBarsStackSegmentsInProportion(t *testing.T) {
	t.Parallel()
	light := color.RGBA{R: 0x8f, G: 0xbb, B: 0xd9, A: 0xff}
	c := &Bars{Title: "CPU per job", XLabel: "µs of CPU per job", Unit: "µs",
		Legend: []LegendItem{{"jobkey", blue}, {"multikey", red}},
		Groups: []Group{
			{Label: "enqueue 1KiB c=8", Bars: []Bar{
				{Name: "jobkey", Segments: []Segment{{"client", 100, blue}, {"Redis", 50, light}}},
				{Name: "multikey", Segments: []Segment{{"client", 60, red}}},
			}},
			{Label: "lifecycle 1KiB c=8", Bars: []Bar{{Name: "jobkey", Segments: []Segment{{"client", 200, blue}, {"Redis", 100, light}}}}},
		}}
	elems := parse(t, c.SVG())
	require.Equal(t, []string{"jobkey", "multikey"}, texts(elems, "legend"))
	require.Equal(t, []string{"enqueue 1KiB c=8", "lifecycle 1KiB c=8"}, texts(elems, "group"))
	require.Equal(t, []string{"100 + 50", "60", "200 + 100"}, texts(elems, "value"))
	bars := withClass(elems, "bar")
	require.Len(t, bars, 5)
	titles := make([]string, len(bars))
	for i, b := range bars {
		titles[i] = b.title
	}
	require.Equal(t, []string{
		"enqueue 1KiB c=8, jobkey: client 100 µs", "enqueue 1KiB c=8, jobkey: Redis 50 µs",
		"enqueue 1KiB c=8, multikey: client 60 µs",
		"lifecycle 1KiB c=8, jobkey: client 200 µs", "lifecycle 1KiB c=8, jobkey: Redis 100 µs",
	}, titles)
	perUnit := attr(t, bars[0], "width") / 100
	for i, want := range []float64{100, 50, 60, 200, 100} {
		require.InDelta(t, want*perUnit, attr(t, bars[i], "width"), 0.02, titles[i])
	}
	require.Equal(t, attr(t, bars[0], "x"), attr(t, bars[2], "x"), "every bar starts at the axis")
	require.InDelta(t, attr(t, bars[0], "x")+attr(t, bars[0], "width"), attr(t, bars[1], "x"), 0.01, "Redis's on the client's")
	require.Equal(t, attr(t, bars[0], "y"), attr(t, bars[1], "y"), "one bar")
	require.Less(t, attr(t, bars[0], "y"), attr(t, bars[2], "y"))
	require.Less(t, attr(t, bars[2], "y"), attr(t, bars[3], "y"), "the second group below the first")
	require.Equal(t, "#1f77b4", bars[0].attrs["fill"])
	require.Equal(t, "#8fbbd9", bars[1].attrs["fill"])
}

// The chart grows with its groups, and so does its left margin with the
// longest label, so that neither is cut off. A segment that is negative or
// not finite is not drawn.
func TestBarsGrowWithTheirGroupsAndLabels(t *testing.T) {
	t.Parallel()
	group := Group{Label: "g", Bars: []Bar{{Name: "a", Segments: []Segment{{"client", 1, blue}}}}}
	one := parse(t, (&Bars{Groups: []Group{group}}).SVG())
	many := parse(t, (&Bars{Groups: []Group{group, group, group, group, group, group, group, group, group, group, group, group, group, group, group, group, group, group, group, group, group, group, group, group, group}}).SVG())
	require.Greater(t, attr(t, many[0], "height"), attr(t, one[0], "height")+25*20)
	long := group
	long.Label = "bounded-rate 256KiB 64 slots 5000/s and then some more words"
	wide := parse(t, (&Bars{Groups: []Group{long}}).SVG())
	x := attr(t, withClass(wide, "bar")[0], "x")
	require.Greater(t, x, textWidth(long.Label, tickSize), "the label fits left of the bars")
	require.Greater(t, attr(t, wide[0], "width"), x+barsMinPlot)

	odd := parse(t, (&Bars{Groups: []Group{{Label: "g", Bars: []Bar{{Name: "a", Segments: []Segment{
		{"client", 2, blue}, {"Redis", -1, red}, {"x", math.NaN(), red}, {"y", math.Inf(1), red}}}}}}}).SVG())
	require.Len(t, withClass(odd, "bar"), 1)
	require.Equal(t, []string{"2"}, texts(odd, "value"))
	require.NotEmpty(t, parse(t, (&Bars{}).SVG()), "no groups: an empty frame")
}
