package jobkeyui

import (
	"net/http"

	"github.com/jobkey/jobkey"
)

// The keys page lists a queue's concurrency keys that Redis holds a value
// for (Queue.ConcurrencyKeys): each one's limit, active leases, waiting
// jobs and rate limit with its starts in the last period.

type keysData struct {
	counts
	Keys []keyRow
	More bool
}

type keyRow struct {
	jobkey.ConcurrencyInfo
	ErrText string
}

func (h *Handler) keysPage(w http.ResponseWriter, r *http.Request) {
	if !h.onlyGET(w, r) {
		return
	}
	ctx, name := r.Context(), r.URL.Query().Get("name")
	q, err := h.queue(ctx, name)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	keys, more, err := q.ConcurrencyKeys(ctx)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	p := h.newPage(w, r, name+" · keys")
	p.self("keys", "name", name)
	d := keysData{counts: countsOf(ctx, q), More: more}
	for _, k := range keys {
		row := keyRow{ConcurrencyInfo: k}
		if k.Err != nil {
			row.ErrText = oneLine(k.Err)
		}
		d.Keys = append(d.Keys, row)
	}
	p.Data = d
	h.render(w, r, h.pages.keys, http.StatusOK, p)
}
