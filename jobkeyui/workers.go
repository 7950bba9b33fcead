package jobkeyui

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jobkey/jobkey"
)

// The workers page lists the Works running on a queue, from the reports
// each keeps in one value with a TTL (Queue.Workers), and the periodic
// schedules they keep, with each last tick's job.

type workersData struct {
	counts
	Workers   []workerRow
	Schedules []scheduleRow
}

type workerRow struct {
	jobkey.WorkerInfo
	Anchor  string // the row's id: "worker-" and the name, escaped by the template
	Err     string
	Running []runRow
	More    int // runs the report counts but does not list
}

type runRow struct {
	jobkey.RunInfo
	Link string
}

type scheduleRow struct {
	jobkey.ScheduleInfo
	KeptBy  []string
	JobLink string
	State   string // of the last tick's job; "" when it has none
}

func (h *Handler) workersPage(w http.ResponseWriter, r *http.Request) {
	if !h.onlyGET(w, r) {
		return
	}
	ctx, name := r.Context(), r.URL.Query().Get("name")
	q, err := h.queue(ctx, name)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	ws, err := q.Workers(ctx)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	p := h.newPage(w, r, name+" · workers")
	p.self("workers", "name", name)
	d := workersData{counts: countsOf(ctx, q)}
	for _, wi := range ws {
		row := workerRow{WorkerInfo: wi, Anchor: workerAnchor(wi.Name)}
		if wi.Err != nil {
			row.Err = oneLine(wi.Err)
		}
		for _, run := range wi.Running {
			row.Running = append(row.Running, runRow{RunInfo: run, Link: p.Link("job", "queue", name, "id", run.ID)})
		}
		row.More = max(0, wi.Busy-len(wi.Running)) // a forged report may count fewer than it lists
		d.Workers = append(d.Workers, row)
		for _, s := range wi.Schedules {
			i := slices.IndexFunc(d.Schedules, func(v scheduleRow) bool {
				return v.Name == s.Name && v.Spec == s.Spec && v.Type == s.Type
			})
			if i < 0 {
				d.Schedules = append(d.Schedules, scheduleRow{ScheduleInfo: s})
				i = len(d.Schedules) - 1
			} else if s.LastTick.After(d.Schedules[i].LastTick) {
				d.Schedules[i].ScheduleInfo = s
			}
			d.Schedules[i].KeptBy = append(d.Schedules[i].KeptBy, wi.Name)
		}
	}
	slices.SortFunc(d.Schedules, func(a, b scheduleRow) int { return strings.Compare(a.Name, b.Name) })
	for i := range d.Schedules {
		s := &d.Schedules[i]
		if s.LastJobID == "" {
			continue
		}
		j, err := q.Get(ctx, s.LastJobID)
		switch {
		case errors.Is(err, jobkey.ErrNotFound):
			continue
		case err != nil:
			s.State = "unreadable"
		default:
			s.State = j.State.String()
		}
		s.JobLink = p.Link("job", "queue", name, "id", s.LastJobID)
	}
	p.Data = d
	h.render(w, r, h.pages.workers, http.StatusOK, p)
}

// workerAnchor is the id of a worker's row, which a running job's page
// links to: the name with anything but letters, digits, '-' and '_'
// written as '_' and its byte in hex, so it is a valid, unique fragment.
func workerAnchor(name string) string {
	var b strings.Builder
	b.WriteString("worker-")
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-':
			b.WriteByte(c)
		default:
			const hex = "0123456789abcdef"
			b.WriteByte('_')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}

// sinceNow is how long ago t was, to the second, for the templates.
func sinceNow(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return time.Since(t).Round(time.Second).String()
}
