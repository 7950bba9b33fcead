package jobkeyui

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/jobkey/jobkey"
)

// The keys page lists a queue's concurrency keys that Redis holds a value
// for (Queue.ConcurrencyKeys): each one's limit, active leases, waiting
// jobs and rate limit with its starts in the last period.

type keysData struct {
	counts
	Keys    []keyRow
	More    bool
	Missing string // the shards left out, when some could not be read
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
	var missing *jobkey.ShardsError
	if err != nil && !errors.As(err, &missing) {
		h.failErr(w, r, err)
		return
	}
	p := h.newPage(w, r, name+" · keys")
	p.self("keys", "name", name)
	d := keysData{counts: countsOf(ctx, q), More: more}
	if missing != nil {
		d.Missing = fmt.Sprintf("This list leaves out %d of %d shards, which could not be read (%v): %s",
			len(missing.Shards), missing.Of, missing.Shards, oneLine(missing))
	}
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
