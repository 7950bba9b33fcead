package main

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
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

// Payload formats, as show and -json name them.
const (
	formatJSON   = "json"   // valid JSON, printed indented
	formatText   = "text"   // printable UTF-8, printed as is
	formatBinary = "binary" // anything else, printed as a hex dump
)

// bytesFormat says how b is shown: JSON when it is valid JSON, text when
// it is printable UTF-8 (newlines and tabs allowed), binary otherwise.
// JSON must be printable too (a JSON string may hold C1 controls raw): no
// escape sequence in a payload reaches the operator's terminal.
func bytesFormat(b []byte) string {
	if !printable(string(b), true) {
		return formatBinary
	}
	if len(b) > 0 && json.Valid(b) {
		return formatJSON
	}
	return formatText
}

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

// renderBytes returns b as show prints it: indented JSON, text, or a hex
// dump, each ending in a newline; "" for no bytes.
func renderBytes(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	switch bytesFormat(b) {
	case formatJSON:
		var out bytes.Buffer
		if err := json.Indent(&out, bytes.TrimSpace(b), "", "  "); err == nil {
			return out.String() + "\n"
		}
		// json.Valid said yes: Indent cannot disagree, but never lose bytes.
		return hex.Dump(b)
	case formatText:
		return strings.TrimSuffix(string(b), "\n") + "\n"
	}
	return hex.Dump(b)
}

// bytesJSON is how -json carries a payload or result: the JSON value
// itself when it is JSON, a string when it is text, base64 when binary.
func bytesJSON(b []byte) (format string, v json.RawMessage) {
	if len(b) == 0 {
		return "", nil
	}
	var err error
	switch format = bytesFormat(b); format {
	case formatJSON:
		var c bytes.Buffer
		if err = json.Compact(&c, b); err == nil {
			return format, c.Bytes()
		}
	case formatText:
		if v, err = json.Marshal(string(b)); err == nil {
			return format, v
		}
	}
	v, _ = json.Marshal(base64.StdEncoding.EncodeToString(b)) // a string always marshals
	return formatBinary, v
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
// (omitted when unset), payload and result as bytesJSON gives them.
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
	PayloadBytes   int               `json:"payload_bytes"`
	ResultFormat   string            `json:"result_format,omitempty"`
	Result         json.RawMessage   `json:"result,omitempty"`
	ResultBytes    int               `json:"result_bytes"`
	CreatedAt      *time.Time        `json:"created_at,omitempty"`
	UpdatedAt      *time.Time        `json:"updated_at,omitempty"`
	Rev            uint64            `json:"rev"`
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
	v.PayloadFormat, v.Payload = bytesJSON(j.Payload)
	v.ResultFormat, v.Result = bytesJSON(j.Result)
	return v
}

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
	if j.Timeout > 0 {
		field("timeout", j.Timeout.String())
	}
	field("run at", when(j.RunAt))
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
	if j.LastError == "" {
		field("last error", "-")
	} else {
		fmt.Fprintf(w, "last error:\n%s", indent(renderText(j.LastError)))
	}
	printBytes(w, "payload", j.Payload)
	printBytes(w, "result", j.Result)
}

// printBytes prints a payload or result under a heading naming its format
// and size.
func printBytes(w io.Writer, name string, b []byte) {
	if len(b) == 0 {
		fmt.Fprintf(w, "%s: (empty)\n", name)
		return
	}
	fmt.Fprintf(w, "%s (%s, %d bytes):\n%s", name, bytesFormat(b), len(b), indent(renderBytes(b)))
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
