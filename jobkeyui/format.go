package jobkeyui

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"
)

// shown is bytes as the page shows them: how they were read, the text, and
// whether it was cut.
type shown struct {
	Kind  string // "JSON", "text", "hex" or "empty"
	Text  string
	Bytes int
	Cut   bool // Text shows only the first showLimit bytes
}

// showLimit bounds what a page shows of a payload, a result or a raw value.
const showLimit = 64 << 10

// show renders b as indented JSON when it is JSON, as text when it is
// printable UTF-8, else as a hex dump. The page escapes the text.
func show(b []byte) shown {
	s := shown{Bytes: len(b)}
	switch {
	case len(b) == 0:
		s.Kind = "empty"
		return s
	case json.Valid(b):
		var out bytes.Buffer
		if err := json.Indent(&out, b, "", "  "); err == nil {
			s.Kind, s.Text = "JSON", out.String()
			if len(s.Text) > showLimit {
				s.Text, s.Cut = cutUTF8(s.Text, showLimit), true
			}
			return s
		}
	case printable(b):
		s.Kind, s.Text = "text", string(b)
		if len(b) > showLimit {
			s.Text, s.Cut = cutUTF8(s.Text, showLimit), true
		}
		return s
	}
	s.Kind = "hex"
	s.Text, s.Cut = hexDump(b)
	return s
}

// hexDump dumps at most the first showLimit bytes of b, and says whether
// it left some out.
func hexDump(b []byte) (string, bool) {
	if len(b) > showLimit {
		return hex.Dump(b[:showLimit]), true
	}
	return hex.Dump(b), false
}

// printable reports whether b is valid UTF-8 holding no control
// characters other than tab, newline and carriage return.
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\n' && r != '\t' && r != '\r' {
			return false
		}
	}
	return true
}

// cutUTF8 cuts s to at most n bytes without splitting a character.
func cutUTF8(s string, n int) string {
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// when formats a time for a page: UTC to the millisecond, with how far it
// is from now.
func when(t, now time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000 UTC") + " (" + ago(t, now) + ")"
}

// ago says how far t is from now, roughly: "3m ago", "in 12s".
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := now.Sub(t)
	suffix := " ago"
	if d < 0 {
		d, suffix = -d, ""
	}
	var s string
	switch {
	case d < time.Second:
		return "now"
	case d < time.Minute:
		s = fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		s = fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		s = fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		s = fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
	if suffix == "" {
		return "in " + s
	}
	return s + suffix
}

// short is a string cut to n characters for a table cell.
func short(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}
