package jobkeyui

import (
	"encoding/hex"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jobkey/jobkey/internal/payload"
)

// shown is bytes as the page shows them: how they were read, the text, and
// whether it was cut.
type shown struct {
	Kind  string // "JSON", "msgpack", "text", "hex" or "empty"
	Text  string
	Bytes int
	Cut   bool // Text shows only the first showLimit bytes
}

// showLimit bounds what a page shows of a payload, a result or a raw value.
const showLimit = 64 << 10

// kinds names each payload format as a page does.
var kinds = map[payload.Format]string{
	"": "empty", payload.JSON: "JSON", payload.Msgpack: "msgpack", payload.Text: "text", payload.Binary: "hex",
}

// show renders b as the jobkey command's show does (payload.Show):
// indented JSON when it is JSON, a msgpack value (what EnqueueArgs
// writes) as indented JSON, text when it is printable UTF-8, else a hex
// dump. Runes that are not printable are escaped; the page escapes the
// HTML.
func show(b []byte) shown {
	v := payload.Show(b, showLimit)
	return shown{Kind: kinds[v.Format], Text: v.Text, Bytes: len(b), Cut: v.Cut}
}

// hexDump dumps at most the first showLimit bytes of b, and says whether
// it left some out.
func hexDump(b []byte) (string, bool) {
	if len(b) > showLimit {
		return hex.Dump(b[:showLimit]), true
	}
	return hex.Dump(b), false
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
