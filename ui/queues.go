package jobkeyui

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/jobkey/jobkey"
)

// queue returns the open Queue of name, opening it with the shard count
// stored in Redis on first use. A queue that does not exist is
// ErrNotFound, and is not cached.
func (h *Handler) queue(ctx context.Context, name string) (*jobkey.Queue, error) {
	h.mu.Lock()
	q, ok := h.queues[name]
	h.mu.Unlock()
	if ok {
		return q, nil
	}
	shards, err := jobkey.LookupShards(ctx, h.rdb, h.prefix, name)
	if err != nil {
		return nil, err
	}
	q, err = jobkey.NewQueue(h.rdb, name, &jobkey.Config{Prefix: h.prefix, Shards: shards})
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if prev, ok := h.queues[name]; ok {
		return prev, nil // another request opened it first
	}
	h.queues[name] = q
	return q, nil
}

// status maps an error of jobkey to the HTTP status that answers it.
func status(err error) int {
	var se *jobkey.StateError
	switch {
	case errors.Is(err, jobkey.ErrNotFound):
		return http.StatusNotFound
	case errors.As(err, &se):
		return http.StatusConflict
	case errors.Is(err, jobkey.ErrInvalid):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// oneLine is an error's text on one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// parseState reads a listable state's name.
func parseState(s string) (jobkey.State, bool) {
	for _, st := range listStates {
		if st.String() == s {
			return st, true
		}
	}
	return 0, false
}

// listStates are the states List can page through, in the order the UI
// shows them.
var listStates = []jobkey.State{
	jobkey.StatePending, jobkey.StateActive, jobkey.StateSucceeded, jobkey.StateFailed, jobkey.StateCanceled,
}
