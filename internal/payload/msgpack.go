package payload

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/jobkey/jobkey/internal/msgpk"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// MaxDepth bounds the nesting of a msgpack value that is rendered: the
// depth DecodeArgs accepts, so every payload a handler can decode shows.
const MaxDepth = 64

// MaxInput bounds the bytes read as msgpack: the largest job value jobkey
// writes.
const MaxInput = 64 << 20

// maxKey bounds the rendering of a map key that is not a string.
const maxKey = 256

// ErrNotMsgpack says bytes are not exactly one whole msgpack value within
// MaxDepth and MaxInput.
var ErrNotMsgpack = errors.New("payload: not one whole msgpack value")

// errCut stops a rendering that reached its limit; every open container
// closes itself on the way out, so what was written stays valid JSON.
var errCut = errors.New("payload: rendering reached its limit")

// field names the bytes in msgpk's errors, which never leave this package.
const field = "payload"

// wholeMsgpack reports whether b decodes as exactly one msgpack value,
// nested at most MaxDepth deep, with nothing left over. Every length is
// checked against the bytes present before it is believed (msgpk), so
// this costs one pass over b and allocates nothing.
func wholeMsgpack(b []byte) bool {
	if len(b) == 0 || len(b) > MaxInput {
		return false
	}
	d := &msgpk.Decoder{B: b, MaxLen: MaxInput}
	return d.SkipDepth(field, 0, MaxDepth) == nil && d.Off == len(b)
}

// container says whether the msgpack value starting with code c is a map
// or an array.
func container(c byte) bool {
	return msgpcode.IsFixedMap(c) || msgpcode.IsFixedArray(c) ||
		c == msgpcode.Map16 || c == msgpcode.Map32 || c == msgpcode.Array16 || c == msgpcode.Array32
}

// MsgpackJSON renders b, exactly one whole msgpack value, as JSON: compact
// when indent is "", else indented by it. Past about limit bytes it stops
// and closes what is open, so the output is always valid JSON, and says
// it was cut. The same bytes always render the same way:
//
//   - nil, booleans and strings are themselves; a string that is not
//     valid UTF-8 has each bad byte replaced by U+FFFD;
//   - integers are exact decimal numbers, however large (a JavaScript
//     reader rounds those past 2^53; the raw bytes stay exact);
//   - floats are numbers as encoding/json writes them; NaN, +Inf and -Inf,
//     which JSON lacks, are the strings "NaN", "Infinity", "-Infinity";
//   - maps keep their order and any duplicate keys; a key that is not a
//     string becomes the string of its own compact JSON (1 is "1"), cut
//     at 256 bytes;
//   - bin is {"$bin": "<base64>"}; the msgpack timestamp (ext -1, what
//     msgpack writes for a time.Time) is its RFC 3339 string in UTC; any
//     other ext is {"$ext": <type>, "$data": "<base64>"};
//   - every rune that is not printable is escaped (\u001b), so the output
//     is inert in a terminal.
//
// It returns ErrNotMsgpack for bytes that are not one whole value.
func MsgpackJSON(b []byte, indent string, limit int) (out []byte, cutShort bool, err error) {
	if !wholeMsgpack(b) {
		return nil, false, ErrNotMsgpack
	}
	r := &renderer{d: &msgpk.Decoder{B: b, MaxLen: MaxInput}, limit: limit, indent: indent}
	err = r.value(0)
	switch {
	case errors.Is(err, errCut):
		return r.out, true, nil
	case err != nil:
		return nil, false, err // checked whole above: cannot happen
	}
	return r.out, false, nil
}

// renderer writes one msgpack value as JSON into out, up to about limit
// bytes.
type renderer struct {
	d      *msgpk.Decoder
	out    []byte
	limit  int
	indent string
}

// full says the output reached its limit: no further element starts.
func (r *renderer) full() bool { return len(r.out) >= r.limit }

// value renders the next value, at nesting depth.
func (r *renderer) value(depth int) error {
	c, err := r.d.Code(field)
	if err != nil {
		return err
	}
	switch {
	case c <= msgpcode.PosFixedNumHigh:
		r.out = strconv.AppendUint(r.out, uint64(c), 10)
		return nil
	case c >= msgpcode.NegFixedNumLow:
		r.out = strconv.AppendInt(r.out, int64(int8(c)), 10)
		return nil
	case msgpcode.IsFixedMap(c):
		return r.mapOf(int(c&msgpcode.FixedMapMask), depth)
	case msgpcode.IsFixedArray(c):
		return r.array(int(c&msgpcode.FixedArrayMask), depth)
	case msgpcode.IsFixedString(c):
		return r.strOf(uint64(c & msgpcode.FixedStrMask))
	}
	switch c {
	case msgpcode.Nil:
		r.out = append(r.out, "null"...)
	case msgpcode.False:
		r.out = append(r.out, "false"...)
	case msgpcode.True:
		r.out = append(r.out, "true"...)
	case msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64:
		u, err := r.d.Sized(field, 1<<(c-msgpcode.Uint8))
		if err != nil {
			return err
		}
		r.out = strconv.AppendUint(r.out, u, 10)
	case msgpcode.Int8, msgpcode.Int16, msgpcode.Int32, msgpcode.Int64:
		w := 1 << (c - msgpcode.Int8)
		u, err := r.d.Sized(field, w)
		if err != nil {
			return err
		}
		shift := 64 - 8*w // sign-extend from the encoded width
		r.out = strconv.AppendInt(r.out, int64(u<<shift)>>shift, 10)
	case msgpcode.Float:
		u, err := r.d.Sized(field, 4)
		if err != nil {
			return err
		}
		r.out = appendFloat(r.out, float64(math.Float32frombits(uint32(u))), 32)
	case msgpcode.Double:
		u, err := r.d.Sized(field, 8)
		if err != nil {
			return err
		}
		r.out = appendFloat(r.out, math.Float64frombits(u), 64)
	case msgpcode.Str8, msgpcode.Str16, msgpcode.Str32:
		n, err := r.d.Sized(field, 1<<(c-msgpcode.Str8))
		if err != nil {
			return err
		}
		return r.strOf(n)
	case msgpcode.Bin8, msgpcode.Bin16, msgpcode.Bin32:
		n, err := r.d.Sized(field, 1<<(c-msgpcode.Bin8))
		if err != nil {
			return err
		}
		p, err := r.bytes(n)
		if err != nil {
			return err
		}
		return r.tagged("$bin", "", p)
	case msgpcode.FixExt1, msgpcode.FixExt2, msgpcode.FixExt4, msgpcode.FixExt8, msgpcode.FixExt16:
		return r.ext(uint64(1) << (c - msgpcode.FixExt1))
	case msgpcode.Ext8, msgpcode.Ext16, msgpcode.Ext32:
		n, err := r.d.Sized(field, 1<<(c-msgpcode.Ext8))
		if err != nil {
			return err
		}
		return r.ext(n)
	case msgpcode.Array16, msgpcode.Array32:
		n, err := r.d.Sized(field, 2<<(c-msgpcode.Array16))
		if err != nil {
			return err
		}
		return r.array(int(n), depth)
	case msgpcode.Map16, msgpcode.Map32:
		n, err := r.d.Sized(field, 2<<(c-msgpcode.Map16))
		if err != nil {
			return err
		}
		return r.mapOf(int(n), depth)
	default:
		return r.d.Corrupt(field, fmt.Sprintf("unknown code 0x%02x", c))
	}
	return nil
}

// bytes reads n bytes, n checked against what remains first.
func (r *renderer) bytes(n uint64) ([]byte, error) {
	ln, err := r.d.Length(field, r.d.Off, n, 1)
	if err != nil {
		return nil, err
	}
	return r.d.Need(field, ln)
}

// strOf renders a string of n bytes.
func (r *renderer) strOf(n uint64) error {
	p, err := r.bytes(n)
	if err != nil {
		return err
	}
	return r.str(p)
}

// newline starts a line at depth, when indenting.
func (r *renderer) newline(depth int) {
	if r.indent == "" {
		return
	}
	r.out = append(r.out, '\n')
	for range depth {
		r.out = append(r.out, r.indent...)
	}
}

// array renders n elements, closing early when the output is full.
func (r *renderer) array(n, depth int) error {
	r.out = append(r.out, '[')
	var err error
	for i := 0; i < n && err == nil; i++ {
		if r.full() {
			err = errCut
			break
		}
		if i > 0 {
			r.out = append(r.out, ',')
		}
		r.newline(depth + 1)
		err = r.value(depth + 1)
	}
	return r.close(']', n, depth, err)
}

// mapOf renders n entries, closing early when the output is full.
func (r *renderer) mapOf(n, depth int) error {
	r.out = append(r.out, '{')
	var err error
	for i := 0; i < n && err == nil; i++ {
		if r.full() {
			err = errCut
			break
		}
		mark := len(r.out)
		if i > 0 {
			r.out = append(r.out, ',')
		}
		r.newline(depth + 1)
		if err = r.key(); err != nil {
			// A key cut short has no value: the entry goes whole.
			r.out = r.out[:mark]
			break
		}
		r.colon()
		err = r.value(depth + 1)
	}
	return r.close('}', n, depth, err)
}

// close ends a container of n elements, also when err stopped it
// (a child closed its own), and passes err on.
func (r *renderer) close(bracket byte, n, depth int, err error) error {
	if n > 0 {
		r.newline(depth)
	}
	r.out = append(r.out, bracket)
	return err
}

func (r *renderer) colon() {
	r.out = append(r.out, ':')
	if r.indent != "" {
		r.out = append(r.out, ' ')
	}
}

// key renders a map key: a string as itself; any other value as the
// string of its compact JSON, cut at maxKey bytes.
func (r *renderer) key() error {
	start := r.d.Off
	end := &msgpk.Decoder{B: r.d.B, Off: start, MaxLen: MaxInput}
	if err := end.SkipDepth(field, 0, MaxDepth); err != nil {
		return err
	}
	if c := r.d.B[start]; msgpcode.IsString(c) {
		return r.value(0)
	}
	sub := &renderer{d: &msgpk.Decoder{B: r.d.B[:end.Off], Off: start, MaxLen: MaxInput}, limit: maxKey}
	switch err := sub.value(0); {
	case errors.Is(err, errCut):
		sub.out = append(sub.out, "…"...)
	case err != nil:
		return err
	}
	r.d.Off = end.Off
	return r.str(sub.out)
}

// tagged renders {"<tag>": "<base64 of p>"}, preceded by "$ext": typ
// when typ is set.
func (r *renderer) tagged(tag, typ string, p []byte) error {
	r.out = append(r.out, '{')
	if typ != "" {
		r.out = append(r.out, `"$ext"`...)
		r.colon()
		r.out = append(r.out, typ...)
		r.out = append(r.out, ',')
		if r.indent != "" {
			r.out = append(r.out, ' ')
		}
	}
	r.out = strconv.AppendQuote(r.out, tag)
	r.colon()
	// Encode no more than could be shown before the limit.
	room := max(r.limit-len(r.out), 0)/4*3 + 3
	err := r.str([]byte(base64.StdEncoding.EncodeToString(p[:min(len(p), room)])))
	if err == nil && len(p) > room {
		err = errCut // cannot happen: the base64 of room bytes reaches the limit
	}
	r.out = append(r.out, '}')
	return err
}

// ext renders an ext value of n data bytes: the msgpack timestamp (type
// -1) as an RFC 3339 string in UTC, any other as its type and data.
func (r *renderer) ext(n uint64) error {
	t, err := r.d.Sized(field, 1)
	if err != nil {
		return err
	}
	p, err := r.bytes(n)
	if err != nil {
		return err
	}
	typ := int8(t)
	if ts, ok := timestamp(typ, p); ok {
		return r.str([]byte(ts.UTC().Format(time.RFC3339Nano)))
	}
	return r.tagged("$data", strconv.Itoa(int(typ)), p)
}

// timestamp decodes the msgpack timestamp extension: type -1 with 4, 8 or
// 12 bytes, nanoseconds below a second.
func timestamp(typ int8, p []byte) (time.Time, bool) {
	if typ != -1 {
		return time.Time{}, false
	}
	var sec, nsec int64
	switch len(p) {
	case 4:
		sec = int64(binary.BigEndian.Uint32(p))
	case 8:
		v := binary.BigEndian.Uint64(p)
		sec, nsec = int64(v&(1<<34-1)), int64(v>>34)
	case 12:
		nsec, sec = int64(binary.BigEndian.Uint32(p)), int64(binary.BigEndian.Uint64(p[4:]))
	default:
		return time.Time{}, false
	}
	if nsec > 999_999_999 {
		return time.Time{}, false
	}
	return time.Unix(sec, nsec), true
}

// str renders p as a JSON string, each rune that is not printable escaped
// and each byte that is not UTF-8 as U+FFFD; cut, with "…", past the limit.
func (r *renderer) str(p []byte) error {
	r.out = append(r.out, '"')
	for len(p) > 0 {
		if r.full() {
			r.out = append(r.out, "…\""...)
			return errCut
		}
		c, size := utf8.DecodeRune(p)
		r.out = appendRune(r.out, c)
		p = p[size:]
	}
	r.out = append(r.out, '"')
	return nil
}

// appendRune appends c as it stands in a JSON string: printable runes as
// themselves, others escaped.
func appendRune(out []byte, c rune) []byte {
	switch c {
	case '"':
		return append(out, `\"`...)
	case '\\':
		return append(out, `\\`...)
	case '\n':
		return append(out, `\n`...)
	case '\r':
		return append(out, `\r`...)
	case '\t':
		return append(out, `\t`...)
	}
	if c >= ' ' && c < utf8.RuneSelf && c != 0x7f || c >= utf8.RuneSelf && unicode.IsPrint(c) {
		return utf8.AppendRune(out, c)
	}
	return appendUEscape(out, c)
}

// appendUEscape appends c as \uXXXX, or a surrogate pair of them.
func appendUEscape(out []byte, c rune) []byte {
	const hexDigits = "0123456789abcdef"
	u := func(v rune) {
		out = append(out, '\\', 'u', hexDigits[v>>12&0xf], hexDigits[v>>8&0xf], hexDigits[v>>4&0xf], hexDigits[v&0xf])
	}
	if c > 0xffff {
		hi, lo := utf16.EncodeRune(c)
		u(hi)
		u(lo)
		return out
	}
	u(c)
	return out
}

// appendFloat appends f as encoding/json writes a float of its size; NaN
// and the infinities, which JSON lacks, as strings.
func appendFloat(out []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(out, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(out, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(out, `"-Infinity"`...)
	}
	var b []byte
	if bits == 32 {
		b, _ = json.Marshal(float32(f)) // finite: always marshals
	} else {
		b, _ = json.Marshal(f)
	}
	return append(out, b...)
}
