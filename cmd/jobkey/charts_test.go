package main

import (
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jobkey/jobkey/bench"
	"github.com/stretchr/testify/require"
)

// cpuGroups has one group per measured point, in report order, a bar per
// design in it, and CPU per job in µs.
func TestCPUGroupsOnePerMeasuredPoint(t *testing.T) {
	run := func(design, scenario string, clients int, clientCPU time.Duration) bench.Result {
		return bench.Result{Design: design, Scenario: scenario, Payload: 1 << 10, Clients: clients,
			Tally: bench.Tally{Jobs: 10, Elapsed: time.Second}, CPU: bench.CPU{Client: clientCPU, Redis: time.Millisecond}}
	}
	results := []bench.Result{
		run("jobkey", bench.Enqueue, 8, time.Millisecond), run("multikey", bench.Enqueue, 8, 2*time.Millisecond),
		run("asynq", bench.Enqueue, 8, 3*time.Millisecond), run("jobkey", bench.Contended, 16, time.Millisecond),
	}
	work := []bench.WorkResult{{Design: "asynq-fast", Scenario: bench.BurnDown, Payload: 1 << 10, Slots: 8,
		Tally: bench.Tally{Jobs: 10}, CPU: bench.CPU{Client: time.Millisecond, Redis: -time.Millisecond}}}
	got := cpuGroups(results, work)
	require.Equal(t, []cpuGroup{
		{label: "enqueue 1KiB c=8", bars: []cpuBar{{"jobkey", 100, 100}, {"multikey", 200, 100}, {"asynq", 300, 100}}},
		{label: "update-contended 1KiB c=16", bars: []cpuBar{{"jobkey", 100, 100}}},
		{label: "burn-down 1KiB 8 slots", bars: []cpuBar{{"asynq-fast", 100, 0}}}, // a negative reading draws nothing
	}, got)
}

// The CPU chart stacks Redis's CPU (the design's color, lighter) on the
// client's (the design's color): a design's dark and light areas are as
// long as its client and Redis CPU per job.
func TestCPUChartStacksRedisOnClientPerDesign(t *testing.T) {
	dir := t.TempDir()
	groups := []cpuGroup{
		{label: "enqueue 1KiB c=8", bars: []cpuBar{{"jobkey", 100, 50}, {"multikey", 60, 60}}},
		{label: "lifecycle 1KiB c=8", bars: []cpuBar{{"jobkey", 200, 100}, {"multikey", 120, 120}}},
	}
	path, err := drawCPUChart(dir, groups, true)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, cpuChartFile), path)
	px := colorCounts(t, path)
	jk, mk := designColor["jobkey"], designColor["multikey"]
	require.Positive(t, px[lighter(jk)])
	require.Positive(t, px[lighter(mk)])
	// The legend adds a small patch of each client color.
	require.InDelta(t, 2.0, float64(px[jk])/float64(px[lighter(jk)]), 0.2, "jobkey: client 2× Redis")
	require.InDelta(t, 1.0, float64(px[mk])/float64(px[lighter(mk)]), 0.2, "multikey: client = Redis")
	require.InDelta(t, 300.0/180, float64(px[jk])/float64(px[mk]), 0.2, "jobkey's client CPU against multikey's")
}

// Without Redis's CPU the chart draws the client's alone.
func TestCPUChartWithoutRedisCPUDrawsTheClientsAlone(t *testing.T) {
	dir := t.TempDir()
	path, err := drawCPUChart(dir, []cpuGroup{{label: "enqueue 1KiB c=8", bars: []cpuBar{{"jobkey", 100, 0}, {"asynq", 80, 0}}}}, false)
	require.NoError(t, err)
	px := colorCounts(t, path)
	require.Positive(t, px[designColor["jobkey"]])
	require.Positive(t, px[designColor["asynq"]])
	require.Zero(t, px[lighter(designColor["jobkey"])])
	require.Zero(t, px[lighter(designColor["asynq"])])

	path, err = drawCPUChart(t.TempDir(), nil, true)
	require.NoError(t, err)
	require.Empty(t, path, "no runs, no chart")
}

// colorCounts decodes the PNG at path and counts its pixels by color.
func colorCounts(t *testing.T, path string) map[color.Color]int {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	out := map[color.Color]int{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			out[rgba(img, x, y)]++
		}
	}
	return out
}

func rgba(img image.Image, x, y int) color.Color {
	r, g, b, a := img.At(x, y).RGBA()
	return color.RGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: uint8(a >> 8)}
}

// The CPU chart draws the bounded-rate worker runs too, labelled with
// their rate.
func TestCPUGroupsIncludeBoundedRateRuns(t *testing.T) {
	work := []bench.WorkResult{
		{Design: "jobkey", Scenario: bench.ProduceAndWork, Payload: 1 << 10, Slots: 8, Tally: bench.Tally{Jobs: 10}, CPU: bench.CPU{Client: time.Millisecond}},
		{Design: "jobkey", Scenario: bench.BoundedRate, Payload: 1 << 10, Slots: 8, Tally: bench.Tally{Jobs: 10},
			CPU: bench.CPU{Client: 2 * time.Millisecond, Redis: time.Millisecond}, Pacing: &bench.Pacing{Rate: 5000, Kept: true}},
	}
	got := cpuGroups(nil, work)
	require.Equal(t, []string{"produce-and-work 1KiB 8 slots", "bounded-rate 1KiB 8 slots 5000/s"}, cpuGroupLabels(got))
	require.Equal(t, []cpuBar{{"jobkey", 200, 100}}, got[1].bars)
}

func cpuGroupLabels(groups []cpuGroup) []string {
	var out []string
	for _, g := range groups {
		out = append(out, g.label)
	}
	return out
}
