package jobkeyui

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jobkey/jobkey"
)

// The events page is a live tail of a queue's event stream
// (jobkey.Queue.Events): it opens at the end of every shard's stream,
// and reloads itself (no script runs on these pages) to show every event
// since, newest first. Its URL carries the cursor it started from.

// eventsTail bounds the events one page shows; past it, the page moves
// its start on.
const eventsTail = 500

// eventsData is the events page's.
type eventsData struct {
	Queue     string
	QueueLink string
	Rows      []eventRow
	Missing   string // shards that could not be read
	Moved     string // the link to the page started after these events, when the tail is full
	Restart   string // the link that starts the tail at the end of the streams again
}

// eventRow is one event as the page shows it.
type eventRow struct {
	At      time.Time
	Shard   int
	Kind    string
	Job     string
	JobLink string
	Type    string
	From    string
	To      string
	Attempt int
	Worker  string
	Note    string // a gap, a rewind, a malformed entry: what it means
}

func (h *Handler) eventsPage(w http.ResponseWriter, r *http.Request) {
	if !h.onlyGET(w, r) {
		return
	}
	ctx, qv := r.Context(), r.URL.Query()
	name := qv.Get("queue")
	q, err := h.queue(ctx, name)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	from, ok := qv["from"]
	if !ok {
		// Start at the end of every stream, live.
		c, err := q.EventsCursorNow(ctx)
		if err != nil {
			h.failErr(w, r, err)
			return
		}
		http.Redirect(w, r, link(h.base, "events", "queue", name, "from", c, "refresh", cmpOr(qv.Get("refresh"), "2")), http.StatusSeeOther)
		return
	}
	page, err := q.Events(ctx, from[0], eventsTail)
	var missing *jobkey.ShardsError
	if err != nil && !errors.As(err, &missing) {
		if errors.Is(err, jobkey.ErrInvalid) {
			h.fail(w, r, http.StatusBadRequest, err)
			return
		}
		h.failErr(w, r, err)
		return
	}
	p := h.newPage(w, r, name+" · events")
	p.self("events", "queue", name, "from", from[0])
	d := eventsData{Queue: name, QueueLink: p.Link("queue", "name", name), Restart: p.Link("events", "queue", name)}
	if missing != nil {
		d.Missing = fmt.Sprintf("This page leaves out the events of %d of %d shards, which could not be read (%v): %s",
			len(missing.Shards), missing.Of, missing.Shards, oneLine(missing))
	}
	for _, e := range slices.Backward(page.Events) {
		d.Rows = append(d.Rows, rowOf(p, name, e))
	}
	if len(page.Events) >= eventsTail {
		refresh := ""
		if p.Refresh > 0 {
			refresh = strconv.Itoa(p.Refresh)
		}
		d.Moved = p.Link("events", "queue", name, "from", page.Cursor, "refresh", refresh)
	}
	p.Data = d
	h.render(w, r, h.pages.events, http.StatusOK, p)
}

func rowOf(p *page, queue string, e jobkey.Event) eventRow {
	row := eventRow{At: e.At, Shard: e.Shard, Kind: e.Kind.String(), Job: e.Job, Type: e.Type,
		From: stateWord(e.From), To: stateWord(e.To), Attempt: e.Attempt, Worker: e.Worker}
	if e.Job != "" && e.Kind == jobkey.EventTransition {
		row.JobLink = p.Link("job", "queue", queue, "id", e.Job)
	}
	switch e.Kind {
	case jobkey.EventEnabled:
		row.Note = "events on"
	case jobkey.EventDisabled:
		row.Note = "events off: the shard's transitions from here on have no event"
	case jobkey.EventGap:
		row.Note = "events after the cursor were trimmed (Config.EventsMaxLen) or deleted before this page read them"
	case jobkey.EventRewound:
		row.Note = "the stream lost events read before (a failover?): read again from its start"
	case jobkey.EventMalformed:
		row.Note = fmt.Sprintf("not an entry jobkey writes (%s): %q", e.Problem, e.Fields)
	}
	return row
}

// stateWord names a state in an event: "none" before an enqueue and
// after a deletion.
func stateWord(s jobkey.State) string {
	if s == 0 {
		return "none"
	}
	return s.String()
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
