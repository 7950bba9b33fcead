package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"strconv"
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
// client's (the design's color): a design's dark and light bars are as
// long as its client and Redis CPU per job.
func TestCPUChartStacksRedisOnClientPerDesign(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	groups := []cpuGroup{
		{label: "enqueue 1KiB c=8", bars: []cpuBar{{"jobkey", 100, 50}, {"multikey", 60, 60}}},
		{label: "lifecycle 1KiB c=8", bars: []cpuBar{{"jobkey", 200, 100}, {"multikey", 120, 120}}},
	}
	path, err := drawCPUChart(dir, groups, true)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, cpuChartFile), path)
	width := barWidths(t, path)
	jk, mk := designColor["jobkey"], designColor["multikey"]
	require.Positive(t, width[lighter(jk)])
	require.Positive(t, width[lighter(mk)])
	require.InDelta(t, 2.0, width[jk]/width[lighter(jk)], 0.01, "jobkey: client 2× Redis")
	require.InDelta(t, 1.0, width[mk]/width[lighter(mk)], 0.01, "multikey: client = Redis")
	require.InDelta(t, 300.0/180, width[jk]/width[mk], 0.01, "jobkey's client CPU against multikey's")
	elems := svgElements(t, path)
	require.Contains(t, titlesOf(elems), "enqueue 1KiB c=8, jobkey: Redis 50 µs", "the numbers are in the chart")
	require.Contains(t, textsOf(elems), "CPU per job by design")
}

// Without Redis's CPU the chart draws the client's alone.
func TestCPUChartWithoutRedisCPUDrawsTheClientsAlone(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path, err := drawCPUChart(dir, []cpuGroup{{label: "enqueue 1KiB c=8", bars: []cpuBar{{"jobkey", 100, 0}, {"asynq", 80, 0}}}}, false)
	require.NoError(t, err)
	width := barWidths(t, path)
	require.Positive(t, width[designColor["jobkey"]])
	require.Positive(t, width[designColor["asynq"]])
	require.Zero(t, width[lighter(designColor["jobkey"])])
	require.Zero(t, width[lighter(designColor["asynq"])])
	require.Contains(t, textsOf(svgElements(t, path)), "CPU per job by design (Redis CPU n/a: the server does not report it)")

	path, err = drawCPUChart(t.TempDir(), nil, true)
	require.NoError(t, err)
	require.Empty(t, path, "no runs, no chart")
}

// drawCharts writes a chart per scenario measured, each an SVG document
// holding every measured point's value, and the CPU chart.
func TestDrawChartsWritesEveryChartWithItsNumbers(t *testing.T) {
	t.Parallel()
	run := func(design, scenario string, payload, clients int, jobs, conflicts, bytes int64) bench.Result {
		r := bench.Result{Design: design, Scenario: scenario, Payload: payload, Clients: clients,
			Tally: bench.Tally{Jobs: jobs, Elapsed: time.Second}, Conflicts: conflicts, CPU: bench.CPU{Client: time.Duration(jobs) * time.Microsecond}}
		r.Wire.BytesOut, r.Wire.BytesIn = bytes/2, bytes/2
		return r
	}
	rep := report{RedisCPU: false, Results: []bench.Result{
		run("jobkey", bench.Lifecycle, 64, 8, 12000, 0, 12000*900), run("multikey", bench.Lifecycle, 64, 8, 21000, 0, 21000*700),
		run("jobkey", bench.Lifecycle, 16<<10, 8, 5000, 0, 5000*33000), run("multikey", bench.Lifecycle, 16<<10, 8, 11000, 0, 11000*34000),
		run("jobkey", bench.LifecycleBatch, 1<<10, 8, 40000, 0, 0),
		run("jobkey", bench.Contended, 1<<10, 16, 1000, 2500, 0), run("multikey", bench.Contended, 1<<10, 16, 2000, 0, 0),
		run("jobkey", bench.Drain, 1<<10, 16, 500, 125, 0),
	}}
	dir := t.TempDir()
	written, err := drawCharts(dir, rep)
	require.NoError(t, err)
	var names []string
	for _, p := range written {
		names = append(names, filepath.Base(p))
	}
	require.Equal(t, []string{"throughput-vs-payload.svg", "throughput-vs-payload-batched.svg", "bytes-per-lifecycle.svg",
		"conflicts-vs-contention.svg", "conflicts-vs-claimers.svg", cpuChartFile}, names)
	want := map[string][]string{
		"throughput-vs-payload.svg": {"jobkey: 12000 jobs/s at payload 64B", "multikey: 21000 jobs/s at payload 64B",
			"jobkey: 5000 jobs/s at payload 16KiB", "multikey: 11000 jobs/s at payload 16KiB"},
		"throughput-vs-payload-batched.svg": {"jobkey: 40000 jobs/s at payload 1KiB"},
		"bytes-per-lifecycle.svg":           {"jobkey: 900 bytes sent + received per job at payload 64B", "multikey: 34000 bytes sent + received per job at payload 16KiB"},
		"conflicts-vs-contention.svg":       {"jobkey: 2.5 aborted EXECs per op at writers 16", "multikey: 0 aborted EXECs per op at writers 16"},
		"conflicts-vs-claimers.svg":         {"jobkey: 0.25 aborted EXECs per job at claimers 16"},
		cpuChartFile:                        {"update-contended 1KiB c=16, jobkey: client 1 µs"},
	}
	for file, titles := range want {
		elems := svgElements(t, filepath.Join(dir, file))
		for _, title := range titles {
			require.Contains(t, titlesOf(elems), title, file)
		}
	}
	ticks := textsOf(svgElements(t, filepath.Join(dir, "throughput-vs-payload.svg")))
	require.Contains(t, ticks, "64B", "the measured sizes label the X axis")
	require.Contains(t, ticks, "16KiB")
	require.Contains(t, ticks, "jobs/s", "the Y axis says its unit")
}

// svgElement is an element of a chart: its attributes, its text and the
// text of its <title> child.
type svgElement struct {
	name        string
	attrs       map[string]string
	text, title string
}

// svgElements parses the SVG document at path strictly, failing the test
// when it is not well-formed XML.
func svgElements(t *testing.T, path string) []svgElement {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := xml.NewDecoder(bytes.NewReader(b))
	dec.Strict = true
	var out []svgElement
	var open []int // -1 for a <title>
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "%s is well-formed", path)
		switch tok := tok.(type) {
		case xml.StartElement:
			if tok.Name.Local == "title" {
				open = append(open, -1)
				continue
			}
			e := svgElement{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			out = append(out, e)
			open = append(open, len(out)-1)
		case xml.EndElement:
			open = open[:len(open)-1]
		case xml.CharData:
			switch {
			case len(open) == 0:
			case open[len(open)-1] >= 0:
				out[open[len(open)-1]].text += string(tok)
			default:
				out[open[len(open)-2]].title += string(tok)
			}
		}
	}
	require.NotEmpty(t, out)
	require.Equal(t, "svg", out[0].name)
	return out
}

func titlesOf(elems []svgElement) []string {
	var out []string
	for _, e := range elems {
		if e.title != "" {
			out = append(out, e.title)
		}
	}
	return out
}

func textsOf(elems []svgElement) []string {
	var out []string
	for _, e := range elems {
		if e.name == "text" {
			out = append(out, e.text)
		}
	}
	return out
}

// barWidths sums the widths of the chart's bars by fill color.
func barWidths(t *testing.T, path string) map[color.RGBA]float64 {
	t.Helper()
	out := map[color.RGBA]float64{}
	for _, e := range svgElements(t, path) {
		if e.name != "rect" || e.attrs["class"] != "bar" {
			continue
		}
		var c color.RGBA
		_, err := fmt.Sscanf(e.attrs["fill"], "#%02x%02x%02x", &c.R, &c.G, &c.B)
		require.NoError(t, err)
		c.A = 0xff
		w, err := strconv.ParseFloat(e.attrs["width"], 64)
		require.NoError(t, err)
		out[c] += w
	}
	return out
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
