// Package payload decides how the operator's tools (the jobkey command and
// jobkeyui) show a job's payload or result, and renders it: JSON as JSON,
// msgpack (what EnqueueArgs writes) as JSON, printable UTF-8 as text, and
// anything else as a hex dump. Every rendering is bounded, never panics on
// any input, and holds no rune that is not printable (other than newline,
// tab and carriage return in text), so a hostile payload can send no escape
// sequence to a terminal; a page must still HTML-escape it.
package payload

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Format says how bytes are read, by the name the tools print.
type Format string

// The formats, in the order Classify tries them.
const (
	JSON    Format = "json"    // valid JSON text
	Msgpack Format = "msgpack" // exactly one whole msgpack value, shown as JSON
	Text    Format = "text"    // UTF-8 without control characters but newline, tab and carriage return
	Binary  Format = "binary"  // anything else, shown as a hex dump
)

// MaxRendered bounds what Show and Value render of one payload, whatever
// limit they are given: a 64 MiB value of tiny msgpack elements would
// otherwise render to gigabytes of JSON.
const MaxRendered = 16 << 20

// minRendered is the least limit Show and Value take, so a rendering cut
// short still shows something.
const minRendered = 64

// Classify returns how b is shown; "" for no bytes. JSON text wins over
// msgpack when bytes are both (the digit "7" is also the msgpack integer
// 55). Bytes are msgpack only when they decode as exactly one whole value,
// nested at most MaxDepth deep, with nothing left over; and text that also
// decodes as one msgpack scalar stays text (a lone "a" is also the msgpack
// integer 97), while a map or an array, what EnqueueArgs writes for a
// struct or a slice, is msgpack.
func Classify(b []byte) Format {
	clean := isText(b)
	switch {
	case len(b) == 0:
		return ""
	case clean && json.Valid(b):
		return JSON
	case wholeMsgpack(b) && (!clean || container(b[0])):
		return Msgpack
	case clean:
		return Text
	}
	return Binary
}

// isText reports whether b is valid UTF-8 holding no control character but
// newline, tab and carriage return: no terminal escape (ESC, or a C1
// control such as CSI) can be in it.
func isText(b []byte) bool {
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

// View is bytes as a person reads them.
type View struct {
	Format Format // "" for no bytes
	// Text is indented JSON (of the JSON, or of the msgpack value), the
	// text, or a hex dump. Every rune in it is printable, but newline, tab
	// and carriage return; in JSON and text any other is escaped (\u200b).
	Text string
	// Cut says Text shows only the first part: about limit bytes of JSON
	// or text, or the dump of the first limit bytes.
	Cut bool
}

// Show renders b for a page or a terminal, within about limit bytes (at
// most MaxRendered).
func Show(b []byte, limit int) View {
	limit = min(max(limit, minRendered), MaxRendered)
	v := View{Format: Classify(b)}
	switch v.Format {
	case "":
	case JSON:
		var out bytes.Buffer
		_ = json.Indent(&out, bytes.TrimSpace(b), "", "  ") // Classify checked it is valid
		v.Text, v.Cut = cut(escapeJSON(out.Bytes()), limit)
	case Msgpack:
		out, c, err := MsgpackJSON(b, "  ", limit)
		if err == nil {
			v.Text, v.Cut = string(out), c
			break
		}
		v.Format = Binary // Classify decoded it: never, but never lose the bytes
		fallthrough
	case Binary:
		v.Text, v.Cut = hex.Dump(b[:min(len(b), limit)]), len(b) > limit
	case Text:
		v.Text, v.Cut = cut(escapeText(b), limit)
	}
	return v
}

// Value renders b as one JSON value for a machine: the JSON itself
// (compacted), the msgpack value as JSON (cut, and cut set, past limit,
// at most MaxRendered), the text as a JSON string, or a binary payload as
// a base64 string. Runes that are not printable are escaped as in Show.
// The format is "" and the value nil for no bytes.
func Value(b []byte, limit int) (f Format, v json.RawMessage, cutShort bool) {
	limit = min(max(limit, minRendered), MaxRendered)
	switch f = Classify(b); f {
	case "":
		return "", nil, false
	case JSON:
		var out bytes.Buffer
		if json.Compact(&out, b) == nil { // Classify checked it is valid
			return f, escapeJSON(out.Bytes()), false
		}
	case Msgpack:
		if out, c, err := MsgpackJSON(b, "", limit); err == nil {
			return f, out, c
		}
	case Text:
		if s, err := json.Marshal(string(b)); err == nil {
			return f, escapeJSON(s), false
		}
	}
	s, _ := json.Marshal(base64.StdEncoding.EncodeToString(b)) // a string always marshals
	return Binary, s, false
}

// escapeJSON returns valid JSON text with every rune that is not
// printable escaped as \uXXXX. Outside its strings JSON holds only ASCII,
// and raw control characters inside a string are not valid JSON, so every
// such rune from U+0080 up sits in a string, where the escape means the
// same rune.
func escapeJSON(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r < utf8.RuneSelf || unicode.IsPrint(r) {
			out = append(out, b[i:i+size]...)
		} else {
			out = appendUEscape(out, r)
		}
		i += size
	}
	return out
}

// escapeText returns text with every rune that is not printable, other
// than newline, tab and carriage return, written as Go escapes it.
func escapeText(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if unicode.IsPrint(r) || r == '\n' || r == '\t' || r == '\r' {
			out = append(out, b[i:i+size]...)
		} else {
			q := strconv.QuoteRune(r)
			out = append(out, q[1:len(q)-1]...)
		}
		i += size
	}
	return out
}

// cut cuts b to at most n bytes without splitting a rune, and says whether
// it did.
func cut(b []byte, n int) (string, bool) {
	if len(b) <= n {
		return string(b), false
	}
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return string(b[:n]), true
}
