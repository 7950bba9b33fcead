package jobkeyui

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jobkey/jobkey"
)

//go:embed templates/*.html static/*
var assets embed.FS

// pages are the parsed templates, one set per page.
type pages struct {
	queues, queue, job, errPage *template.Template
	history, workers, keys      *template.Template
	batches                     *template.Template // batches.go
	events                      *template.Template // eventspage.go
}

var funcs = template.FuncMap{
	"short": short,
	"since": sinceNow,
}

func parsePages() (*pages, error) {
	parse := func(name string) (*template.Template, error) {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name)
		if err != nil {
			return nil, fmt.Errorf("jobkeyui: parse %s: %w", name, err)
		}
		return t, nil
	}
	var p pages
	var err error
	for _, s := range []struct {
		t    **template.Template
		name string
	}{{&p.queues, "queues.html"}, {&p.queue, "queue.html"}, {&p.job, "job.html"}, {&p.errPage, "error.html"}, {&p.history, "history.html"},
		{&p.workers, "workers.html"}, {&p.keys, "keys.html"}, {&p.batches, "batches.html"}, {&p.events, "events.html"}} {
		if *s.t, err = parse(s.name); err != nil {
			return nil, err
		}
	}
	return &p, nil
}

// page is what every page's template gets.
type page struct {
	Title    string
	Base     string // BasePath, ending in "/"
	Prefix   string
	Flash    string
	Token    string // the CSRF token; "" when read-only
	ReadOnly bool
	Refresh  int // seconds between reloads; 0: none
	Now      time.Time
	// Refreshes are the links that reload this page every few seconds,
	// or stop it.
	Refreshes []refreshLink
	Data      any
}

// Link builds a URL of the UI: path under BasePath, then key/value pairs
// as the query. Every value is query-escaped.
func (p *page) Link(path string, kv ...string) string { return link(p.Base, path, kv...) }

func link(base, path string, kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			v.Set(kv[i], kv[i+1])
		}
	}
	u := base + path
	if len(v) > 0 {
		u += "?" + v.Encode()
	}
	return u
}

type refreshLink struct {
	Label string
	Link  string
	On    bool
}

// self names this page (path and query) for its auto-refresh links.
func (p *page) self(path string, kv ...string) {
	for _, n := range []int{0, 2, 5, 10, 30} {
		l := refreshLink{Label: "off", On: n == p.Refresh}
		r := ""
		if n > 0 {
			l.Label, r = strconv.Itoa(n)+"s", strconv.Itoa(n)
		}
		l.Link = p.Link(path, append(kv, "refresh", r)...)
		p.Refreshes = append(p.Refreshes, l)
	}
}

// When formats a time with how far it is from the page's now.
func (p *page) When(t time.Time) string { return when(t, p.Now) }

// Ago says how far t is from the page's now.
func (p *page) Ago(t time.Time) string { return ago(t, p.Now) }

// newPage starts a page: the session cookie, its token, the flash message.
func (h *Handler) newPage(w http.ResponseWriter, r *http.Request, title string) *page {
	p := &page{Title: title, Base: h.base, Prefix: h.prefix, ReadOnly: h.readOnly, Now: time.Now()}
	if !h.readOnly {
		p.Token = h.token(h.session(w, r))
	}
	p.Flash = h.takeFlash(w, r)
	if n, err := strconv.Atoi(r.URL.Query().Get("refresh")); err == nil && n >= 1 && n <= 3600 {
		p.Refresh = n
	}
	return p
}

// render writes a page, whole or not at all.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, t *template.Template, code int, p *page) {
	var buf bytes.Buffer
	if err := t.Execute(&buf, p); err != nil {
		h.log.Error("jobkeyui: render", "path", r.URL.Path, "err", err)
		http.Error(w, "jobkeyui: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// errorData is the error page's.
type errorData struct {
	Code    int
	Status  string
	Message string
	// Done says what an action did before its error; Missing names the
	// shards it could not read; MasterOnly says what it applied on the
	// master only, which the replicas did not confirm; Back is the page to
	// go back to.
	Done, Missing, MasterOnly, Back string
}

// fail answers with the error page: code and one line saying why.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, code int, err error) {
	if code >= 500 {
		h.log.Error("jobkeyui: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	p := &page{Title: http.StatusText(code), Base: h.base, Prefix: h.prefix, ReadOnly: h.readOnly, Now: time.Now()}
	p.Data = errorData{Code: code, Status: http.StatusText(code), Message: oneLine(err)}
	h.render(w, r, h.pages.errPage, code, p)
}

// failPartial answers an action that did part of its work: what it did
// (done), the shards it could not read, why it did not do the rest, and
// the way back, with the status err maps to.
func (h *Handler) failPartial(w http.ResponseWriter, r *http.Request, err error, done, back string) {
	code := status(err)
	h.log.Error("jobkeyui: action done in part", "method", r.Method, "path", r.URL.Path, "done", done, "err", err)
	p := &page{Title: "Done in part", Base: h.base, Prefix: h.prefix, ReadOnly: h.readOnly, Now: time.Now()}
	d := errorData{Code: code, Status: http.StatusText(code), Message: oneLine(err), Done: done, Back: back}
	var missing *jobkey.ShardsError
	if errors.As(err, &missing) {
		d.Missing = missingNote(missing)
	}
	var bulk *jobkey.BulkError
	switch {
	case !errors.Is(err, jobkey.ErrNotReplicated):
	case errors.As(err, &bulk):
		// done counts them; the earlier ones were confirmed.
		d.MasterOnly = fmt.Sprintf("%d of them were applied on the master only: %s", bulk.Result.Unconfirmed, notConfirmed(err))
	default:
		p.Title, d.Done = "Applied on the master only", ""
		d.MasterOnly = done + " on the master only: " + notConfirmed(err)
	}
	p.Data = d
	h.render(w, r, h.pages.errPage, code, p)
}

// missingNote names the shards a call could not read, or write.
func missingNote(e *jobkey.ShardsError) string {
	if e.Write {
		return fmt.Sprintf("%d of %d shards could not be written: %v.", len(e.Shards), e.Of, e.Shards)
	}
	return fmt.Sprintf("%d of %d shards could not be read: %v. Their jobs were left out, as they are.", len(e.Shards), e.Of, e.Shards)
}

// failErr answers with the status err maps to.
func (h *Handler) failErr(w http.ResponseWriter, r *http.Request, err error) {
	h.fail(w, r, status(err), err)
}

// onlyGET refuses methods other than GET and HEAD.
func (h *Handler) onlyGET(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	h.fail(w, r, http.StatusMethodNotAllowed, fmt.Errorf("%s is not allowed here", r.Method))
	return false
}

// counts is one queue's line of counts.
type counts struct {
	Name    string
	Stats   jobkey.Stats
	Partial string // the shards Stats could not read, when some
	Err     string // why there are no counts
}

func (h *Handler) counts(ctx context.Context, name string) counts {
	q, err := h.queue(ctx, name)
	if err != nil {
		return counts{Name: name, Err: oneLine(err)}
	}
	return countsOf(ctx, q)
}

// countsOf reads the counts of q.
func countsOf(ctx context.Context, q *jobkey.Queue) counts {
	c := counts{Name: q.Name()}
	st, err := q.Stats(ctx)
	var partial *jobkey.ShardsError
	switch {
	case errors.As(err, &partial):
		c.Stats, c.Partial = st, oneLine(err)
	case err != nil:
		c.Err = oneLine(err)
	default:
		c.Stats = st
	}
	return c
}

// queuesData is the queues page's.
type queuesData struct {
	Queues []counts
}

func (h *Handler) queuesPage(w http.ResponseWriter, r *http.Request) {
	if !h.onlyGET(w, r) {
		return
	}
	names, err := jobkey.Queues(r.Context(), h.rdb, h.prefix)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	p := h.newPage(w, r, "Queues")
	p.self("")
	d := queuesData{Queues: make([]counts, 0, len(names))}
	for _, n := range names {
		d.Queues = append(d.Queues, h.counts(r.Context(), n))
	}
	p.Data = d
	h.render(w, r, h.pages.queues, http.StatusOK, p)
}

// queueData is the queue page's: counts, then one page of one state.
type queueData struct {
	counts
	State      string
	States     []stateTab
	Type       string
	Cursor     string
	Jobs       []jobRow
	Unreadable []unreadableRow
	Next       string // the next page's link; "" on the last page
	First      string // the first page's link, when this is not it
	// Missing names the shards the listing could not read, whose jobs
	// the page leaves out.
	Missing string
	// Stopped says the page stopped at its bound of entries read with
	// fewer jobs than a page holds: it is not the last.
	Stopped string
	// Types counts the queue's jobs by type (Queue.CountByType), each
	// linked to its filter; TypesNote says what the count left out.
	Types     []typeRow
	TypesNote string
}

type typeRow struct {
	jobkey.TypeCount
	Link string
}

type stateTab struct {
	Name   string
	Count  int64
	Link   string
	Active bool
}

type jobRow struct {
	ID, Type, Link string
	Attempt, Max   int
	RunAt          time.Time
	LeaseUntil     time.Time
	UpdatedAt      time.Time
	LastError      string
	Progress       string // as text, for an active job
	Acts           acts
}

type unreadableRow struct {
	ID, Link, Err string
}

// acts are the actions a job's state allows.
type acts struct {
	Retry, Cancel, Delete bool
}

func actsOf(s jobkey.State) acts {
	return acts{
		Retry:  s == jobkey.StateFailed || s == jobkey.StateCanceled,
		Cancel: s == jobkey.StatePending || s == jobkey.StateActive,
		Delete: s != jobkey.StateActive,
	}
}

func (h *Handler) queuePage(w http.ResponseWriter, r *http.Request) {
	if !h.onlyGET(w, r) {
		return
	}
	ctx, qv := r.Context(), r.URL.Query()
	name := qv.Get("name")
	st, stName := jobkey.StatePending, "pending"
	if s := qv.Get("state"); s != "" && s != corruptTab {
		var ok bool
		if st, ok = parseState(s); !ok {
			h.fail(w, r, http.StatusBadRequest, fmt.Errorf("state %q is not one of pending, active, succeeded, failed, canceled, corrupt", s))
			return
		}
		stName = s
	} else if s == corruptTab {
		st, stName = 0, corruptTab
	}
	q, err := h.queue(ctx, name)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	typ, cursor := qv.Get("type"), qv.Get("cursor")
	jp, err := q.List(ctx, jobkey.ListOpts{State: st, Corrupt: stName == corruptTab, Type: typ, Limit: h.pageSize, Cursor: cursor})
	var missing *jobkey.ShardsError
	if err != nil && !errors.As(err, &missing) {
		h.failErr(w, r, err)
		return
	}
	p := h.newPage(w, r, name+" · "+stName)
	refresh := ""
	if p.Refresh > 0 {
		refresh = strconv.Itoa(p.Refresh)
	}
	d := queueData{counts: countsOf(ctx, q), State: stName, Type: typ, Cursor: cursor}
	if missing != nil {
		d.Missing = fmt.Sprintf("This page leaves out the jobs of %d of %d shards, which could not be read (%v): %s",
			len(missing.Shards), missing.Of, missing.Shards, oneLine(missing))
	}
	p.self("queue", "name", name, "state", d.State, "type", typ, "cursor", cursor)
	for _, s := range listStates {
		d.States = append(d.States, stateTab{Name: s.String(), Active: s.String() == stName, Count: stateCount(d.Stats, s),
			Link: p.Link("queue", "name", name, "state", s.String(), "type", typ, "refresh", refresh)})
	}
	d.States = append(d.States, stateTab{Name: corruptTab, Active: stName == corruptTab, Count: d.Stats.Corrupt,
		Link: p.Link("queue", "name", name, "state", corruptTab, "refresh", refresh)})
	for _, j := range jp.Jobs {
		if j == nil {
			continue
		}
		d.Jobs = append(d.Jobs, jobRow{
			ID: j.ID, Type: j.Type, Link: p.Link("job", "queue", name, "id", j.ID),
			Attempt: j.Attempt, Max: j.MaxAttempts, RunAt: j.RunAt, LeaseUntil: j.LeaseUntil, UpdatedAt: j.UpdatedAt,
			LastError: j.LastError, Progress: show(j.Progress).Text, Acts: actsOf(j.State),
		})
	}
	for _, u := range jp.Unreadable {
		d.Unreadable = append(d.Unreadable, unreadableRow{
			ID: u.ID, Link: p.Link("job", "queue", name, "id", u.ID), Err: errText(u.Err),
		})
	}
	if jp.Next != "" {
		d.Next = p.Link("queue", "name", name, "state", d.State, "type", typ, "cursor", jp.Next)
	}
	if jp.ScanStopped {
		d.Stopped = fmt.Sprintf("This page stopped after reading %d entries, with %d of the %d jobs a page holds: it is not the last page, and the next may hold more.",
			jp.Scanned, len(jp.Jobs)+len(jp.Unreadable), h.pageSize)
	}
	if cursor != "" {
		d.First = p.Link("queue", "name", name, "state", d.State, "type", typ)
	}
	tc, terr := q.CountByType(ctx, typeScan)
	var tmissing *jobkey.ShardsError
	switch {
	case errors.As(terr, &tmissing):
		d.TypesNote = fmt.Sprintf("Counted without %d of %d shards, which could not be read (%v).", len(tmissing.Shards), tmissing.Of, tmissing.Shards)
	case terr != nil:
		d.TypesNote = "Types could not be counted: " + oneLine(terr)
	}
	if terr == nil || tmissing != nil {
		if !tc.Complete {
			d.TypesNote += fmt.Sprintf(" Counted from the first %d entries of each state's index on each shard (%d jobs read): the queue holds more.", typeScan, tc.Read)
		}
		switch tc.Unreadable {
		case 0:
		case 1:
			d.TypesNote += " 1 job value could not be read, and no type counts it."
		default:
			d.TypesNote += fmt.Sprintf(" %d job values could not be read, and no type counts them.", tc.Unreadable)
		}
		d.TypesNote = strings.TrimSpace(d.TypesNote)
		for _, t := range tc.Types {
			d.Types = append(d.Types, typeRow{TypeCount: t, Link: p.Link("queue", "name", name, "state", d.State, "type", t.Type)})
		}
	}
	p.Data = d
	h.render(w, r, h.pages.queue, http.StatusOK, p)
}

// typeScan bounds the entries the queue page's per-type table reads of
// each index of each shard.
const typeScan = 500

// corruptTab names the listing of the jobs claimers set aside because
// their value could not be read.
const corruptTab = "corrupt"

func errText(err error) string {
	if err == nil {
		return "unreadable"
	}
	return oneLine(err)
}

func stateCount(st jobkey.Stats, s jobkey.State) int64 {
	switch s {
	case jobkey.StatePending:
		return st.Pending
	case jobkey.StateActive:
		return st.Active
	case jobkey.StateSucceeded:
		return st.Succeeded
	case jobkey.StateFailed:
		return st.Failed
	case jobkey.StateCanceled:
		return st.Canceled
	}
	return 0
}

// jobData is the job page's.
type jobData struct {
	Queue     string
	QueueLink string
	ID        string
	Job       *jobkey.Job // nil when the value cannot be read
	State     string
	StateLink string
	Payload   shown
	Result    shown
	Progress  shown
	Acts      acts
	// WorkerLink leads to the worker row of the Work that runs an active
	// job, named by its lease owner.
	WorkerLink string
	Keys       jobkey.JobKeys
	ReadErr    string // why the value cannot be read
	Raw        *shown // the stored bytes of an unreadable value, when Redis gives them
	RawErr     string // why they could not be read
}

func (h *Handler) jobPage(w http.ResponseWriter, r *http.Request) {
	if !h.onlyGET(w, r) {
		return
	}
	ctx, qv := r.Context(), r.URL.Query()
	name, id := qv.Get("queue"), qv.Get("id")
	q, err := h.queue(ctx, name)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	j, err := q.Get(ctx, id)
	var (
		corrupt *jobkey.CorruptError
		wrong   *jobkey.WrongTypeError
	)
	unreadable := errors.As(err, &corrupt) || errors.As(err, &wrong) || errors.Is(err, jobkey.ErrUnsupportedFormat)
	if err != nil && !unreadable {
		h.failErr(w, r, err)
		return
	}
	p := h.newPage(w, r, "Job "+id)
	d := jobData{Queue: name, QueueLink: p.Link("queue", "name", name), ID: id, Keys: q.Keys(id)}
	p.self("job", "queue", name, "id", id)
	if unreadable {
		d.ReadErr = oneLine(err)
		raw, rerr := h.rdb.Get(ctx, d.Keys.Job).Bytes()
		if rerr != nil {
			d.RawErr = oneLine(rerr)
		} else {
			s := shown{Kind: "hex", Bytes: len(raw)}
			s.Text, s.Cut = hexDump(raw)
			d.Raw = &s
		}
	} else {
		d.Job, d.State = j, j.State.String()
		d.StateLink = p.Link("queue", "name", name, "state", d.State)
		d.Payload, d.Result, d.Progress, d.Acts = show(j.Payload), show(j.Result), show(j.Progress), actsOf(j.State)
		if j.State == jobkey.StateActive && j.LeaseOwner != "" {
			d.WorkerLink = p.Link("workers", "name", name) + "#" + workerAnchor(jobkey.WorkerOf(j.LeaseOwner))
		}
	}
	p.Data = d
	h.render(w, r, h.pages.job, http.StatusOK, p)
}

// static serves the embedded stylesheet.
func (h *Handler) static(w http.ResponseWriter, r *http.Request) {
	if !h.onlyGET(w, r) {
		return
	}
	sub, err := fs.Sub(assets, "static")
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "public, max-age=3600")
	http.StripPrefix("/static", http.FileServerFS(sub)).ServeHTTP(w, r)
}
