package jobkeyui

import (
	"net/http"

	"github.com/jobkey/jobkey"
)

// batchesData is the batches page's: a queue's newest batches, each with
// its progress, and the error of any that could not be read.
type batchesData struct {
	Queue, QueueLink string
	Batches          []batchRow
	Err              string // some batches could not be read: the others are listed
}

// batchRow is one batch as the page shows it.
type batchRow struct {
	*jobkey.Batch
	Finished     int    // jobs finished, of Total
	Condition    string // "finished" or "succeeded"
	Fired        string
	CallbackLink string // the link to the callback's job page, once written
}

// batchesPage lists a queue's newest batches (Queue.Batches) with their
// progress: jobs finished of all, the counts, what the callback waits
// for, and whether it was written.
func (h *Handler) batchesPage(w http.ResponseWriter, r *http.Request) {
	if !h.onlyGET(w, r) {
		return
	}
	ctx, name := r.Context(), r.URL.Query().Get("queue")
	q, err := h.queue(ctx, name)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	bs, err := q.Batches(ctx, h.pageSize)
	if err != nil && len(bs) == 0 {
		h.failErr(w, r, err)
		return
	}
	p := h.newPage(w, r, name+" · batches")
	p.self("batches", "queue", name)
	d := batchesData{Queue: name, QueueLink: p.Link("queue", "name", name)}
	if err != nil {
		d.Err = "Some batches could not be read and are not listed: " + oneLine(err)
	}
	for _, b := range bs {
		row := batchRow{Batch: b, Finished: b.Total - b.Pending, Condition: "finished", Fired: b.Fired.String()}
		if b.Condition == jobkey.BatchAllSucceeded {
			row.Condition = "succeeded"
		}
		if b.Fired == jobkey.BatchFiredEnqueued || b.Fired == jobkey.BatchFiredCanceled {
			row.CallbackLink = p.Link("job", "queue", name, "id", b.ID)
		}
		d.Batches = append(d.Batches, row)
	}
	p.Data = d
	h.render(w, r, h.pages.batches, http.StatusOK, p)
}
