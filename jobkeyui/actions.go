package jobkeyui

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/jobkey/jobkey"
)

// action is one POST endpoint: it does its work on the queue named by the
// form's "queue" and returns the flash message and the page to go back to.
// An action that did part of its work before its error returns the
// message that says what it did with the error, and the page to go back to.
type action func(ctx context.Context, q *jobkey.Queue, f form) (msg, back string, err error)

// form is a posted form's fields.
type form struct {
	base  string
	queue string
	id    string
	state string
	typ   string
	// confirm is the ticked confirmation box of a bulk action's form.
	confirm bool
}

func (f form) queuePage(state string) string {
	return link(f.base, "queue", "name", f.queue, "state", state, "type", f.typ)
}

func (f form) jobPage() string { return link(f.base, "job", "queue", f.queue, "id", f.id) }

// typeNote says which jobs a bulk action took: every one, or one type's.
func typeNote(typ string) string {
	if typ == "" {
		return ""
	}
	return fmt.Sprintf(" of type %q", short(typ, 80))
}

func bulkNote(verb string, n jobkey.BulkResult) string {
	s := fmt.Sprintf("%s %d", verb, n.Done)
	if n.Unconfirmed > 0 {
		s += fmt.Sprintf("; %d of them on the master only", n.Unconfirmed)
	}
	if n.Skipped > 0 {
		s += fmt.Sprintf("; %d skipped (changed state in between, or unreadable)", n.Skipped)
	}
	if n.Unreadable > 0 {
		s += fmt.Sprintf("; %d listed but unreadable, left as they are", n.Unreadable)
	}
	return s
}

// shardsDone says on how many shards a Pause or Resume that failed on
// some (a *ShardsError) did its work, and on how many of them only on the
// master (the replicas did not confirm it); "" when err names no shard.
func shardsDone(what string, err error) string {
	var se *jobkey.ShardsError
	if !errors.As(err, &se) {
		return ""
	}
	masterOnly := 0
	for _, e := range se.Errs {
		if errors.Is(e, jobkey.ErrNotReplicated) {
			masterOnly++
		}
	}
	done := se.Of - len(se.Shards) + masterOnly
	if masterOnly == 0 {
		return fmt.Sprintf("%s on %d of %d shards.", what, done, se.Of)
	}
	return fmt.Sprintf("%s on %d of %d shards; %d of them on the master only.", what, done, se.Of, masterOnly)
}

// masterOnly is what an action on one job that ended in err did: done
// (such as "Job x canceled") when the replicas did not confirm it, so that
// the answer says it was applied on the master only; else "", nothing.
func masterOnly(done string, err error) string {
	if errors.Is(err, jobkey.ErrNotReplicated) {
		return done
	}
	return ""
}

// notConfirmed says why a write the replicas did not confirm (err matches
// ErrNotReplicated) is not safe.
func notConfirmed(err error) string {
	var re *jobkey.ReplicationError
	if !errors.As(err, &re) {
		return oneLine(err)
	}
	s := fmt.Sprintf("%d of %d replicas confirmed the write within %v, so a failover now may undo it.", re.Acked, re.Want, re.Timeout)
	if re.Err != nil {
		s += " " + oneLine(re.Err)
	}
	return s
}

// actions are the handler's POST endpoints, by path under "action/".
func (h *Handler) actions() map[string]http.Handler {
	byPath := map[string]action{
		"retry": func(ctx context.Context, q *jobkey.Queue, f form) (string, string, error) {
			j, err := q.Retry(ctx, f.id)
			if err != nil {
				return masterOnly(fmt.Sprintf("Job %s retried", short(f.id, 80)), err), f.jobPage(), err
			}
			return fmt.Sprintf("Job %s retried: it is %s.", short(f.id, 80), j.State), f.jobPage(), nil
		},
		"cancel": func(ctx context.Context, q *jobkey.Queue, f form) (string, string, error) {
			j, err := q.Cancel(ctx, f.id)
			if err != nil {
				return masterOnly(fmt.Sprintf("Job %s canceled", short(f.id, 80)), err), f.jobPage(), err
			}
			return fmt.Sprintf("Job %s canceled: it is %s.", short(f.id, 80), j.State), f.jobPage(), nil
		},
		"delete": func(ctx context.Context, q *jobkey.Queue, f form) (string, string, error) {
			back := f.state
			if _, ok := parseState(back); !ok {
				back = ""
			}
			if err := q.Delete(ctx, f.id); err != nil {
				return masterOnly(fmt.Sprintf("Job %s deleted", short(f.id, 80)), err), f.queuePage(back), err
			}
			return fmt.Sprintf("Job %s deleted.", short(f.id, 80)), f.queuePage(back), nil
		},
		"pause": func(ctx context.Context, q *jobkey.Queue, f form) (string, string, error) {
			if err := q.Pause(ctx); err != nil {
				return shardsDone("Queue paused", err), f.queuePage(f.state), err
			}
			return "Queue paused: workers take no new jobs; enqueues still land.", f.queuePage(f.state), nil
		},
		"resume": func(ctx context.Context, q *jobkey.Queue, f form) (string, string, error) {
			if err := q.Resume(ctx); err != nil {
				return shardsDone("Queue resumed", err), f.queuePage(f.state), err
			}
			return "Queue resumed.", f.queuePage(f.state), nil
		},
		"retry-failed": bulk(func(ctx context.Context, q *jobkey.Queue, f form) (string, string, error) {
			n, err := q.RetryFailed(ctx, f.typ)
			return bulkNote("Retried failed jobs"+typeNote(f.typ)+":", n) + ".", f.queuePage("failed"), err
		}),
		"delete-finished": bulk(func(ctx context.Context, q *jobkey.Queue, f form) (string, string, error) {
			s, ok := parseState(f.state)
			if !ok || !s.Finished() {
				return "", "", fmt.Errorf("%w: delete-finished needs state succeeded, failed or canceled, not %q", jobkey.ErrInvalid, f.state)
			}
			n, err := q.DeleteFinished(ctx, s, f.typ)
			return bulkNote("Deleted "+s.String()+" jobs"+typeNote(f.typ)+":", n) + ".", f.queuePage(s.String()), err
		}),
		"cancel-pending": bulk(func(ctx context.Context, q *jobkey.Queue, f form) (string, string, error) {
			n, err := q.CancelPending(ctx, f.typ)
			return bulkNote("Canceled pending jobs"+typeNote(f.typ)+":", n) + ".", f.queuePage("pending"), err
		}),
	}
	out := make(map[string]http.Handler, len(byPath))
	for path, a := range byPath {
		out[path] = h.post(a)
	}
	return out
}

// errUnconfirmed refuses a bulk action whose form was not confirmed.
var errUnconfirmed = fmt.Errorf("%w: a bulk action needs its confirmation box ticked", jobkey.ErrInvalid)

// bulk marks an action that must be confirmed in its form.
func bulk(a action) action {
	return func(ctx context.Context, q *jobkey.Queue, f form) (string, string, error) {
		if !f.confirm {
			return "", "", errUnconfirmed
		}
		return a(ctx, q, f)
	}
}

// post wraps an action: POST only, refused when read-only, refused without
// the session's CSRF token; then 303 back with a flash message.
func (h *Handler) post(a action) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			h.fail(w, r, http.StatusMethodNotAllowed, errors.New("actions are POST requests from the UI's forms"))
			return
		}
		if h.readOnly {
			h.fail(w, r, http.StatusForbidden, errors.New("this UI is read-only: actions are disabled"))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			h.fail(w, r, http.StatusBadRequest, fmt.Errorf("unreadable form: %w", err))
			return
		}
		if !h.checkCSRF(r) {
			h.fail(w, r, http.StatusForbidden, errors.New("missing or wrong CSRF token: reload the page and try again"))
			return
		}
		f := form{
			base: h.base, queue: r.PostForm.Get("queue"), id: r.PostForm.Get("id"),
			state: r.PostForm.Get("state"), typ: r.PostForm.Get("type"),
			confirm: r.PostForm.Get("confirm") == "yes",
		}
		q, err := h.queue(r.Context(), f.queue)
		if err != nil {
			h.failErr(w, r, err)
			return
		}
		msg, back, err := a(r.Context(), q, f)
		switch {
		case err != nil && msg != "":
			h.failPartial(w, r, err, msg, back)
			return
		case err != nil:
			h.failErr(w, r, err)
			return
		}
		h.setFlash(w, r, msg)
		http.Redirect(w, r, back, http.StatusSeeOther)
	})
}
