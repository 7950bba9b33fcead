package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/payload"
)

// How the inspection commands (ls, show, retry, cancel, delete, pause,
// resume, queues) print jobs: markdown-like tables as stats prints, or JSON
// with -json. Everything here is pure, so it is tested without Redis.

// stateNames are the states a command accepts, by the names State.String
// gives them.
var stateNames = []jobkey.State{
	jobkey.StatePending, jobkey.StateActive, jobkey.StateSucceeded, jobkey.StateFailed, jobkey.StateCanceled,
}

// parseState returns the state named s, one of allowed (every state when
// allowed is empty).
func parseState(s string, allowed ...jobkey.State) (jobkey.State, error) {
	if len(allowed) == 0 {
		allowed = stateNames
	}
	names := make([]string, len(allowed))
	for i, st := range allowed {
		if s == st.String() {
			return st, nil
		}
		names[i] = st.String()
	}
	if s == "" {
		return 0, fmt.Errorf("-state is required: one of %s", strings.Join(names, ", "))
	}
	return 0, fmt.Errorf("-state %q: want one of %s", s, strings.Join(names, ", "))
}

// showLimit bounds what show prints of a payload or a result, and what
// -json renders of a msgpack one; -json's payload_base64 and
// result_base64 hold every byte.
const showLimit = payload.MaxRendered

// printable reports whether s is valid UTF-8 holding only printable runes
// (and, with lines, newlines, carriage returns and tabs).
func printable(s string, lines bool) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsPrint(r) || lines && (r == '\n' || r == '\t' || r == '\r') {
			continue
		}
		return false
	}
	return true
}

// bytesJSON is how -json carries a payload or result (payload.Value): the
// JSON value itself when it is JSON, the value as JSON when it is msgpack
// (cut says past showLimit), a string when it is text, base64 when binary.
func bytesJSON(b []byte) (format string, v json.RawMessage, cut bool) {
	f, v, cut := payload.Value(b, showLimit)
	return string(f), v, cut
}

// cell makes s safe for one cell of a markdown-like table: one line, no
// "|" that would split the cell, and any rune that is not printable shown
// escaped, so a job's type or error can neither break the table nor send
// escape sequences to the terminal. max > 0 cuts it to max runes, marked
// with "…".
func cell(s string, max int) string {
	var b strings.Builder
	n := 0
	for _, r := range strings.Join(strings.Fields(s), " ") {
		if max > 0 && n == max {
			b.WriteString("…")
			break
		}
		n++
		switch {
		case r == '|':
			b.WriteString(`\|`)
		case !unicode.IsPrint(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// line is cell for a value printed alone on a line (show's fields): not
// cut, but still one line with nothing unprintable.
func line(s string) string {
	if printable(s, false) {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// when formats t for a table: UTC to the second, or "-" when unset.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// stateTime is the time ls shows for j: when a pending job
// may run, when an active job's lease ends, when a finished job finished.
func stateTime(j *jobkey.Job) time.Time {
	switch j.State {
	case jobkey.StatePending:
		return j.RunAt
	case jobkey.StateActive:
		return j.LeaseUntil
	}
	return j.UpdatedAt
}

// stateTimeHeader names the column stateTime fills for jobs in state s.
func stateTimeHeader(s jobkey.State) string {
	switch s {
	case jobkey.StatePending:
		return "run at"
	case jobkey.StateActive:
		return "lease until"
	}
	return "finished at"
}

// jobView is a job as -json prints it: every field, times in RFC 3339
// (omitted when unset), payload and result as bytesJSON gives them, and
// their exact bytes in base64, since a value rendered from msgpack, or
// compacted JSON, is not them byte for byte.
type jobView struct {
	ID             string            `json:"id"`
	Queue          string            `json:"queue"`
	Type           string            `json:"type"`
	State          string            `json:"state"`
	Attempt        int               `json:"attempt"`
	MaxAttempts    int               `json:"max_attempts"`
	Priority       int               `json:"priority"`
	ConcurrencyKey string            `json:"concurrency_key,omitempty"`
	TimeoutMS      int64             `json:"timeout_ms,omitempty"`
	RunAt          *time.Time        `json:"run_at,omitempty"`
	LeaseOwner     string            `json:"lease_owner,omitempty"`
	LeaseUntil     *time.Time        `json:"lease_until,omitempty"`
	LeaseToken     uint64            `json:"lease_token,omitempty"`
	LastError      string            `json:"last_error,omitempty"`
	Meta           map[string]string `json:"meta,omitempty"`
	PayloadFormat  string            `json:"payload_format,omitempty"`
	Payload        json.RawMessage   `json:"payload,omitempty"`
	PayloadCut     bool              `json:"payload_cut,omitempty"`
	PayloadBase64  string            `json:"payload_base64,omitempty"`
	PayloadBytes   int               `json:"payload_bytes"`
	ResultFormat   string            `json:"result_format,omitempty"`
	Result         json.RawMessage   `json:"result,omitempty"`
	ResultCut      bool              `json:"result_cut,omitempty"`
	ResultBase64   string            `json:"result_base64,omitempty"`
	ResultBytes    int               `json:"result_bytes"`
	CreatedAt      *time.Time        `json:"created_at,omitempty"`
	UpdatedAt      *time.Time        `json:"updated_at,omitempty"`
	Rev            uint64            `json:"rev"`
	Snoozes        int               `json:"snoozes,omitempty"`
	StartedAt      *time.Time        `json:"started_at,omitempty"`
	ProgressFormat string            `json:"progress_format,omitempty"`
	Progress       json.RawMessage   `json:"progress,omitempty"`
	ProgressBase64 string            `json:"progress_base64,omitempty"`
	History        []attemptView     `json:"history,omitempty"`
	HistoryDropped int               `json:"history_dropped,omitempty"`
	Batch          string            `json:"batch,omitempty"`
}

// attemptView is one record of a job's History as -json prints it.
type attemptView struct {
	Attempt    int        `json:"attempt"`
	Started    *time.Time `json:"started,omitempty"`
	DurationMS int64      `json:"duration_ms"`
	Worker     string     `json:"worker,omitempty"`
	Outcome    string     `json:"outcome"`
	Error      string     `json:"error,omitempty"`
}

// viewOf returns j as -json prints it.
func viewOf(j *jobkey.Job) jobView {
	v := jobView{
		ID: j.ID, Queue: j.Queue, Type: j.Type, State: j.State.String(), Attempt: j.Attempt, MaxAttempts: j.MaxAttempts,
		Priority: j.Priority, ConcurrencyKey: j.ConcurrencyKey, TimeoutMS: j.Timeout.Milliseconds(),
		RunAt: timePtr(j.RunAt), LeaseOwner: j.LeaseOwner, LeaseUntil: timePtr(j.LeaseUntil), LeaseToken: j.LeaseToken,
		LastError: j.LastError, Meta: j.Meta, PayloadBytes: len(j.Payload), ResultBytes: len(j.Result),
		CreatedAt: timePtr(j.CreatedAt), UpdatedAt: timePtr(j.UpdatedAt), Rev: j.Rev,
	}
	v.PayloadFormat, v.Payload, v.PayloadCut = bytesJSON(j.Payload)
	v.ResultFormat, v.Result, v.ResultCut = bytesJSON(j.Result)
	v.PayloadBase64, v.ResultBase64 = base64Of(j.Payload), base64Of(j.Result)
	v.Snoozes, v.StartedAt, v.HistoryDropped = j.Snoozes, timePtr(j.StartedAt), j.HistoryDropped
	v.ProgressFormat, v.Progress, _ = bytesJSON(j.Progress)
	v.ProgressBase64 = base64Of(j.Progress)
	v.Batch = j.Batch
	for _, r := range j.History {
		v.History = append(v.History, attemptView{Attempt: r.Attempt, Started: timePtr(r.Started), DurationMS: r.Duration.Milliseconds(),
			Worker: r.Worker, Outcome: r.Outcome.String(), Error: r.Error})
	}
	return v
}

// base64Of is b in standard base64, "" for no bytes.
func base64Of(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// writeJSON prints v as one indented JSON document.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printJob prints every field of j, then its payload and result, as show
// does without -json.
func printJob(w io.Writer, j *jobkey.Job) {
	field := func(name, v string) { fmt.Fprintf(w, "%-13s %s\n", name+":", v) }
	field("id", line(j.ID))
	field("queue", line(j.Queue))
	field("type", line(j.Type))
	field("state", j.State.String())
	field("attempt", fmt.Sprintf("%d of %d", j.Attempt, j.MaxAttempts))
	field("priority", strconv.Itoa(j.Priority))
	if j.ConcurrencyKey != "" {
		field("concurrency", line(j.ConcurrencyKey))
	}
	if j.Batch != "" {
		id := shellWord(j.Batch)
		if strings.HasPrefix(j.Batch, "-") {
			id = "-- " + id // an operand, not a flag
		}
		field("batch", line(j.Batch)+" (jobkey batch -queue "+shellWord(j.Queue)+" "+id+")")
	}
	if j.Timeout > 0 {
		field("timeout", j.Timeout.String())
	}
	if j.Snoozes > 0 {
		field("snoozes", strconv.Itoa(j.Snoozes))
	}
	field("run at", when(j.RunAt))
	field("started at", when(j.StartedAt))
	field("lease owner", orDash(line(j.LeaseOwner)))
	field("lease until", when(j.LeaseUntil))
	field("lease token", strconv.FormatUint(j.LeaseToken, 10))
	field("created at", when(j.CreatedAt))
	field("updated at", when(j.UpdatedAt))
	field("rev", strconv.FormatUint(j.Rev, 10))
	if len(j.Meta) == 0 {
		field("meta", "-")
	} else {
		fmt.Fprintf(w, "meta:\n")
		for _, k := range slices.Sorted(maps.Keys(j.Meta)) {
			fmt.Fprintf(w, "  %s: %s\n", line(k), line(j.Meta[k]))
		}
	}
	switch {
	case j.LastError == "":
		field("last error", "-")
	case j.State == jobkey.StateSucceeded:
		// The job's outcome is its success; the error is history.
		fmt.Fprintf(w, "earlier error (of an attempt before the one that succeeded):\n%s", indent(renderText(j.LastError)))
	default:
		fmt.Fprintf(w, "last error:\n%s", indent(renderText(j.LastError)))
	}
	printHistory(w, j)
	if len(j.Progress) > 0 {
		printBytes(w, "progress", j.Progress)
	}
	printBytes(w, "payload", j.Payload)
	printBytes(w, "result", j.Result)
}

// printHistory prints the job's runs, oldest first, one a line, with how
// many older ones were dropped.
func printHistory(w io.Writer, j *jobkey.Job) {
	if len(j.History) == 0 && j.HistoryDropped == 0 {
		fmt.Fprintf(w, "%-13s -\n", "history:")
		return
	}
	fmt.Fprintf(w, "history (%d runs", len(j.History))
	if j.HistoryDropped > 0 {
		fmt.Fprintf(w, "; %d older dropped", j.HistoryDropped)
	}
	fmt.Fprintf(w, "):\n")
	for _, r := range j.History {
		fmt.Fprintf(w, "  #%d  %s  %s  %-9s  %s", r.Attempt, when(r.Started), r.Duration, r.Outcome, orDash(line(r.Worker)))
		if r.Error != "" {
			fmt.Fprintf(w, "  %s", line(strings.ReplaceAll(r.Error, "\n", " ")))
		}
		fmt.Fprintln(w)
	}
}

// printBytes prints a payload or result under a heading naming its format
// and size: indented JSON (of JSON, or of msgpack), text, or a hex dump.
func printBytes(w io.Writer, name string, b []byte) {
	if len(b) == 0 {
		fmt.Fprintf(w, "%s: (empty)\n", name)
		return
	}
	v := payload.Show(b, showLimit)
	note := ""
	if v.Format == payload.Msgpack {
		note = ", shown as JSON"
	}
	if v.Cut {
		note += fmt.Sprintf(", cut at %d MiB: -json has every byte", showLimit>>20)
	}
	fmt.Fprintf(w, "%s (%s, %d bytes%s):\n%s", name, v.Format, len(b), note, indent(strings.TrimSuffix(v.Text, "\n")+"\n"))
}

// renderText is a string (the last error) as text when it is printable,
// else quoted: never raw control characters.
func renderText(s string) string {
	if printable(s, true) {
		return strings.TrimSuffix(s, "\n") + "\n"
	}
	return strconv.Quote(s) + "\n"
}

// indent indents every line of s by two spaces.
func indent(s string) string {
	lines := strings.SplitAfter(s, "\n")
	var b strings.Builder
	for _, l := range lines {
		if l != "" {
			b.WriteString("  " + l)
		}
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// shellWord is s as one word a POSIX shell reads back as s: as it is when
// it holds only characters no shell treats specially, else in single
// quotes, with what line escapes (it stays one line, and inert).
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,:/@%+=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(line(s), "'", `'"'"'`) + "'"
}
