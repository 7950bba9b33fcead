package jobkeyui

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/jobkey/jobkey"
)

// queue returns the open Queue of name, opened with the shard count stored
// in Redis. The count is read again on every call (one GET): a queue
// deleted and created again with another count is opened anew, never read
// with the count it had. A queue that does not exist is ErrNotFound.
func (h *Handler) queue(ctx context.Context, name string) (*jobkey.Queue, error) {
	shards, err := jobkey.LookupShards(ctx, h.rdb, h.prefix, name)
	if err != nil {
		if errors.Is(err, jobkey.ErrNotFound) {
			h.mu.Lock()
			delete(h.queues, name)
			h.mu.Unlock()
		}
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if o, ok := h.queues[name]; ok && o.shards == shards {
		return o.q, nil
	}
	q, err := jobkey.NewQueue(h.rdb, name, h.config(shards))
	if err != nil {
		return nil, err
	}
	h.queues[name] = openQueue{q: q, shards: shards}
	return q, nil
}

// config is the Config the handler opens a queue of shards with.
func (h *Handler) config(shards int) *jobkey.Config {
	return &jobkey.Config{Prefix: h.prefix, Shards: shards, MinReplicas: h.minReplicas, ReplicaTimeout: h.replicaTimeout,
		Retention: h.retention, FailedRetention: h.failedRetention}
}

// openQueue is a Queue the handler opened, with the shard count it was
// opened with.
type openQueue struct {
	q      *jobkey.Queue
	shards int
}

// status maps an error of jobkey to the HTTP status that answers it.
func status(err error) int {
	var se *jobkey.StateError
	switch {
	case errors.Is(err, jobkey.ErrNotReplicated):
		// Applied on the master, which answered; the replicas did not
		// confirm it.
		return http.StatusServiceUnavailable
	case errors.Is(err, jobkey.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, jobkey.ErrUnreachable):
		return http.StatusServiceUnavailable
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
