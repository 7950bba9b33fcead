package jobkeyui

import (
	"errors"
	"fmt"
	"html/template"
	"image/color"
	"net/http"
	"strings"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/svgchart"
)

// The history page charts a queue's Throughput: counted from its indexes
// when the page is asked for, so there is no counter to drift and nothing
// to keep up to date between visits. The charts are SVG drawn on the
// server, inline in the page: no script, within the page's CSP.

// maxHistoryHours bounds the long chart (Queue.Throughput counts at most
// MaxThroughputBuckets buckets).
const maxHistoryHours = jobkey.MaxThroughputBuckets

var (
	okColor       = color.RGBA{R: 0x2e, G: 0x7d, B: 0x32, A: 0xff}
	failedColor   = color.RGBA{R: 0xc6, G: 0x28, B: 0x28, A: 0xff}
	canceledColor = color.RGBA{R: 0x75, G: 0x75, B: 0x75, A: 0xff}
	aheadColor    = color.RGBA{R: 0x15, G: 0x65, B: 0xc0, A: 0xff}
)

// historyChart is one chart of the page and the numbers it draws.
type historyChart struct {
	ID    string // the figure's id, for links and tests
	Title string
	Note  string
	SVG   template.HTML
	Rows  []historyRow
	Err   string // why this chart could not be counted
}

// historyRow is one bucket, as the chart's table shows it.
type historyRow struct {
	Start                                  string
	Succeeded, Failed, Canceled, Scheduled int64
}

type historyData struct {
	counts
	// Depth is the queue's depth now (Stats), drawn as a stacked bar: a
	// past depth cannot be counted from the indexes, and no counter of it
	// is kept.
	Depth   template.HTML
	Charts  []historyChart
	Missing string
	Exact   string
}

func (h *Handler) historyPage(w http.ResponseWriter, r *http.Request) {
	if !h.onlyGET(w, r) {
		return
	}
	ctx, name := r.Context(), r.URL.Query().Get("name")
	q, err := h.queue(ctx, name)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	p := h.newPage(w, r, name+" · history")
	p.self("history", "name", name)
	d := historyData{counts: countsOf(ctx, q)}
	now := time.Now()
	cfg := q.Config()
	// An hour less than the bound: a span that does not start on the hour
	// takes one bucket more.
	keep := min(max(cfg.Retention, cfg.FailedRetention), (maxHistoryHours-1)*time.Hour)
	var missing *jobkey.ShardsError
	add := func(id, title, note string, from, to time.Time, step time.Duration, unit time.Duration, unitName string, ahead bool) {
		c := historyChart{ID: id, Title: title, Note: note}
		th, err := q.Throughput(ctx, from, to, step)
		var m *jobkey.ShardsError
		switch {
		case errors.As(err, &m):
			missing = m
		case err != nil:
			c.Err = oneLine(err)
			d.Charts = append(d.Charts, c)
			return
		}
		c.SVG, c.Rows = throughputChart(th, title, unit, unitName, ahead)
		if d.Exact == "" {
			d.Exact = fmt.Sprintf("Counts are exact from %s for succeeded and canceled jobs, and from %s for failed ones, "+
				"for workers that keep finished jobs %v and failed ones %v (their Config.Retention and FailedRetention: this UI's Options, as Redis does not store them); "+
				"a finished job deleted, or one with a Retention of its own, is not counted where it finished.",
				th.SucceededExactSince.UTC().Format(time.DateTime), th.FailedExactSince.UTC().Format(time.DateTime), cfg.Retention, cfg.FailedRetention)
		}
		d.Charts = append(d.Charts, c)
	}
	if d.counts.Err == "" {
		d.Depth = depthChart(d.Stats)
	}
	add("last-hour", "Finished per minute, the last hour", "", now.Add(-time.Hour), now, time.Minute, time.Minute, "minutes", false)
	add("retention", "Finished per hour, over the retention", "", now.Add(-keep), now, time.Hour, time.Hour, "hours", false)
	add("ahead", "Scheduled per hour, the next day",
		fmt.Sprintf("Pending jobs by the hour their run-at falls in; %d are due now and %d active.", d.Stats.Due, d.Stats.Active),
		now, now.Add(24*time.Hour), time.Hour, time.Hour, "hours", true)
	if missing != nil {
		d.Missing = fmt.Sprintf("These charts leave out %d of %d shards, which could not be read (%v): %s",
			len(missing.Shards), missing.Of, missing.Shards, oneLine(missing))
	}
	p.Data = d
	h.render(w, r, h.pages.history, http.StatusOK, p)
}

// throughputChart draws th as lines, one per outcome (or the scheduled
// jobs ahead), X in units before (or after) its end, and returns the
// chart as inline SVG with the rows it draws.
func throughputChart(th jobkey.Throughput, title string, unit time.Duration, unitName string, ahead bool) (template.HTML, []historyRow) {
	var ok, failed, canceled, sched []svgchart.Point
	var rows []historyRow
	ref := th.To
	if ahead {
		ref = th.From
	}
	for _, b := range th.Buckets {
		x := float64(b.Start.Sub(ref)) / float64(unit)
		if ahead {
			sched = append(sched, svgchart.Point{X: x, Y: float64(b.Scheduled)})
		} else {
			ok = append(ok, svgchart.Point{X: x, Y: float64(b.Succeeded)})
			failed = append(failed, svgchart.Point{X: x, Y: float64(b.Failed)})
			canceled = append(canceled, svgchart.Point{X: x, Y: float64(b.Canceled)})
		}
		rows = append(rows, historyRow{Start: b.Start.UTC().Format(time.DateTime),
			Succeeded: b.Succeeded, Failed: b.Failed, Canceled: b.Canceled, Scheduled: b.Scheduled})
	}
	c := svgchart.Lines{Title: title, YLabel: "jobs", Width: 760, Height: 300}
	if ahead {
		c.XLabel = unitName + " from now"
		c.Series = []svgchart.Series{{Name: "scheduled", Color: aheadColor, Points: sched}}
	} else {
		c.XLabel = unitName + " from now"
		c.Series = []svgchart.Series{
			{Name: "succeeded", Color: okColor, Points: ok},
			{Name: "failed", Color: failedColor, Points: failed},
			{Name: "canceled", Color: canceledColor, Points: canceled},
		}
	}
	svg := string(c.SVG())
	// Inline in HTML, the document's XML declaration has no place.
	if i := strings.Index(svg, "<svg"); i > 0 {
		svg = svg[i:]
	}
	return template.HTML(svg), rows // svgchart writes every caller string as escaped text
}

// depthChart draws the queue's depth now: due, scheduled and active jobs
// (expired leases among the active), one stacked bar.
func depthChart(st jobkey.Stats) template.HTML {
	// Stats reads the active jobs and their expired leases apart: a lease
	// added between the two reads may make the second the larger.
	expired := min(st.ExpiredLeases, st.Active)
	c := svgchart.Bars{Title: "Depth now", XLabel: "jobs", Width: 760,
		Groups: []svgchart.Group{{Label: "now", Bars: []svgchart.Bar{{Name: "jobs", Segments: []svgchart.Segment{
			{Name: "due", Value: float64(st.Due), Color: aheadColor},
			{Name: "scheduled", Value: float64(st.Scheduled), Color: canceledColor},
			{Name: "active", Value: float64(st.Active - expired), Color: okColor},
			{Name: "expired leases", Value: float64(expired), Color: failedColor},
		}}}}},
		Legend: []svgchart.LegendItem{{Name: "due", Color: aheadColor}, {Name: "scheduled", Color: canceledColor},
			{Name: "active", Color: okColor}, {Name: "expired leases", Color: failedColor}}}
	svg := string(c.SVG())
	if i := strings.Index(svg, "<svg"); i > 0 {
		svg = svg[i:]
	}
	return template.HTML(svg) // svgchart writes every caller string as escaped text
}
